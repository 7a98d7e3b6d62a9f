//! The running provisioner: connect, elect, discover, provision, serve metrics.

use anyhow::{bail, Result};

use crate::cli::RunArgs;

/// Run the daemon until SIGINT or SIGTERM.
pub fn main(_debug: bool, _args: RunArgs) -> Result<()> {
    bail!("run is not available in this build yet")
}
