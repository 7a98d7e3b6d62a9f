//! The two ends of one exchange with a helper, shared by every way of asking one: the bytes the
//! helper is sent (on stdin, or as the body of a webhook request) and the decoding of what it
//! answers. One function each, so the process helper and the webhook see the very same bytes and
//! fail the same way.

use crate::error::HelperError;
use crate::types::{HelperInput, HelperReply};

/// The bytes a helper is sent for `input`: the Go provisioner's JSON, byte for byte (key order,
/// `null` and absent values, Go's HTML escaping). The process helper reads them on stdin; the
/// webhook receives them as its request body.
pub fn input_bytes(input: &HelperInput) -> Result<Vec<u8>, HelperError> {
    crate::gojson::to_go_json(input).map_err(|source| HelperError::Encode {
        identity: input.identity.clone(),
        source,
    })
}

/// Decodes what `helper` answered as the Go provisioner decodes it: invalid UTF-8 becomes
/// U+FFFD (as Go's `encoding/json` does) rather than failing the reply, keys match in any case,
/// and the last of repeated keys counts.
pub fn decode_reply(out: &[u8], helper: &str) -> Result<HelperReply, HelperError> {
    serde_json::from_str(&String::from_utf8_lossy(out)).map_err(|source| HelperError::InvalidJson {
        helper: helper.to_string(),
        source,
    })
}
