//! What the process-helper tests share: the node they ask a helper about, and one helper run.
#![allow(clippy::unwrap_used, dead_code)]

use helper_protocol::{HelperError, HelperInput, HelperReply, HelperRunner};

/// The node every helper is asked about: `n1.example.net` with an empty inventory.
pub fn input() -> HelperInput {
    HelperInput {
        identity: "n1.example.net".into(),
        inventory: "{}".into(),
        ..Default::default()
    }
}

/// What the helper `command` answers for [`input`].
pub async fn run(command: &str) -> Result<HelperReply, HelperError> {
    HelperRunner::new(command).unwrap().run(&input()).await
}
