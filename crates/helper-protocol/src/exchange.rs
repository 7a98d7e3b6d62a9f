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
    let text = String::from_utf8_lossy(out);
    // Read by the fast decoder (sonic-rs); what it refuses is read again by serde_json, whose
    // verdict and words decide.
    sonic_rs::from_str(&text)
        .or_else(|_| serde_json::from_str(&text))
        .map_err(|source| HelperError::InvalidJson {
            helper: helper.to_string(),
            source,
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// What serde_json alone makes of a reply: the reference the fast read must agree with.
    fn reference(out: &[u8]) -> Result<HelperReply, String> {
        serde_json::from_str(&String::from_utf8_lossy(out)).map_err(|e| e.to_string())
    }

    #[test]
    fn replies_read_as_serde_json_reads_them_values_and_errors_alike() {
        let mut bad_utf8 = br#"{"msg":"a"#.to_vec();
        bad_utf8.extend_from_slice(b"\xff\xfe\",\"configuration\":{\"k\":\"v\"}}");
        let deep = format!(r#"{{"x":{}1{}}}"#, "[".repeat(100_000), "]".repeat(100_000));
        let cases: Vec<Vec<u8>> = [
            r#"{"defer":false,"msg":"ok","configuration":{"plugin.a":"1","b":"x \"y\" <z>"}}"#,
            r#"{"Defer":true,"MSG":"case","Configuration":{"k":"v"},"configuration":{"k":"w"}}"#,
            r#"{"msg":"first","msg":"last","shutdown":null,"certificate":null}"#,
            r#"{"server_claims":{"identity":"n1","collectives":["c"],"exp":1.5e9,"nbf":1}}"#,
            r#"{"server_claims":{"identity":"n1","exp":1e400}}"#,
            r#"{"server_claims":{"identity":"n1","exp":-0.0,"iat":18446744073709551616}}"#,
            r#"{"msg":"\u0000\ud83d\ude00\n\/","upgrade":"1.2.3"}"#,
            r#"{"msg":"\ud800"}"#,
            r#"{"defer":"yes"}"#,
            r#"{"configuration":{"k":1}}"#,
            r#"{"msg":"a"} trailing"#,
            r#"{"msg":"a",}"#,
            "{\"msg\":\"a\u{1}\"}",
            "",
            "null",
            "[]",
            &deep,
        ]
        .iter()
        .map(|c| c.as_bytes().to_vec())
        .chain([bad_utf8])
        .collect();
        for out in &cases {
            let got = decode_reply(out, "helper").map_err(|e| match e {
                HelperError::InvalidJson { source, .. } => source.to_string(),
                other => panic!("not a JSON error: {other}"),
            });
            assert_eq!(got, reference(out), "{}", String::from_utf8_lossy(out));
        }
    }
}
