//! Go test peers: a go-choria build (broker, server, CLI) and the Go provisioner, built once and
//! cached under `target/peers/`.

use anyhow::{bail, Result};

/// `cargo xtask peers ...`
pub fn main(_args: &[String]) -> Result<()> {
    bail!("peers: not built yet")
}
