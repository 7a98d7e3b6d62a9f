//! `cargo xtask faults`: the fault-injection suite.

/// `cargo xtask faults`.
pub fn main(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("faults: not built yet")
}
