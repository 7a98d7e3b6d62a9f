//! `choria-provisioner check`: validate everything a rollout depends on, without connecting.

use anyhow::{bail, Result};

use crate::cli::RunArgs;

/// Run the checks.
pub fn main(_debug: bool, _args: RunArgs) -> Result<()> {
    bail!("check is not available in this build yet")
}
