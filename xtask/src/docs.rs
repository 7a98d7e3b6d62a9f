//! `cargo xtask docs`.

/// `cargo xtask docs`.
pub fn main(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("docs: not built yet")
}
