//! `cargo xtask dist`.

/// `cargo xtask dist`.
pub fn main(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("dist: not built yet")
}
