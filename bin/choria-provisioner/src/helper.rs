//! The cycle's [`Helper`] implemented with the subprocess runner of `helper-protocol`: the site
//! helper runs as a child process with the node's data on stdin (see
//! [`HelperRunner`] for the time and output limits).

use helper_protocol::HelperRunner;
use provision_core::helper_protocol::{HelperError, HelperInput, HelperReply};
use provision_core::Helper;

/// [`Helper`] over a configured [`HelperRunner`].
#[derive(Debug, Clone)]
pub struct SubprocessHelper(HelperRunner);

impl SubprocessHelper {
    /// The helper command of the `helper` setting, split shell-style (no shell is involved).
    pub fn new(command: &str) -> Result<Self, HelperError> {
        HelperRunner::new(command).map(SubprocessHelper)
    }
}

impl Helper for SubprocessHelper {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        self.0.run(input).await
    }
}
