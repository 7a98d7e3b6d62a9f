//! The webhook's signatures, version 2: what is signed, how it is framed, and how a signature
//! is checked. The webhook client ([`crate::WebhookClient`]) signs every request with these and
//! checks the helper's signed replies; a receiver written in Rust can use them too.
//!
//! A signature is `sha256=` and the lower-case hex HMAC-SHA256, keyed with the shared secret,
//! of a canonical message. The message starts with a fixed line naming the version and what is
//! signed, and every field after it is framed by its length:
//!
//! ```text
//! request:  "v2 request\n" F(timestamp) F(request id) F(body)
//! reply:    "v2 reply\n"   F(request id) F(body)
//! F(x)   =  the byte length of x in decimal (no sign, no leading zero), ":", x, "\n"
//! ```
//!
//! so the request with timestamp `1700000000`, request id `0123abcd` and body
//! `{"identity":"n1"}` signs the 57 bytes
//! `v2 request\n10:1700000000\n8:0123abcd\n17:{"identity":"n1"}\n`.
//!
//! The framing is what version 1 lacked: `timestamp.request_id.body` gives the same bytes for a
//! request id `a.b` with body `c` as for id `a` with body `b.c`, so a receiver that remembered
//! request ids to refuse replays could be passed a recorded request again under another id. With
//! lengths, no choice of bytes in one field can move the boundary to the next, and the first line
//! keeps a request's signature from ever being taken for a reply's, or for version 1's (whose
//! messages begin with the timestamp's digits).

use std::str::FromStr;

/// The header carrying a request's version 2 signature.
pub const REQUEST_SIGNATURE_HEADER: &str = "X-Choria-Provisioner-Signature-V2";
/// The header a helper's reply carries its signature in.
pub const REPLY_SIGNATURE_HEADER: &str = "X-Choria-Provisioner-Reply-Signature";
/// How far, in seconds, a receiver lets a request's timestamp be from its own clock, either way.
pub const MAX_SKEW_SECS: u64 = 300;

/// The first line of a signed request's message.
const REQUEST_PREFIX: &[u8] = b"v2 request\n";
/// The first line of a signed reply's message.
const REPLY_PREFIX: &[u8] = b"v2 reply\n";
/// `sha256=` and the 64 hex digits of an HMAC-SHA256.
const SIGNATURE_LEN: usize = 7 + 64;

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No signature came, where one is required.
    #[error("it is not signed")]
    Missing,
    /// The header was given more than once: which one would count is not defined.
    #[error("the signature header is given {0} times")]
    Repeated(usize),
    /// The value is not `sha256=` and 64 hex digits.
    #[error("the signature is not sha256= and 64 hexadecimal digits")]
    Malformed,
    /// The signature is well formed but not the one the shared secret gives.
    #[error("the signature does not match (another secret, or altered in transit)")]
    Mismatch,
}

/// Feeds one framed field to `out`: its length in decimal, `:`, the bytes and `\n`.
fn frame(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(field.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(field);
    out.push(b'\n');
}

/// The message a request's signature covers (see the module's documentation).
pub fn request_message(timestamp: &[u8], request_id: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        REQUEST_PREFIX.len() + timestamp.len() + request_id.len() + body.len() + 32,
    );
    out.extend_from_slice(REQUEST_PREFIX);
    frame(&mut out, timestamp);
    frame(&mut out, request_id);
    frame(&mut out, body);
    out
}

/// The message a reply's signature covers: the request id it answers and its body.
pub fn reply_message(request_id: &[u8], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(REPLY_PREFIX.len() + request_id.len() + body.len() + 24);
    out.extend_from_slice(REPLY_PREFIX);
    frame(&mut out, request_id);
    frame(&mut out, body);
    out
}

fn sign(secret: &[u8], message: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    format!(
        "sha256={}",
        hex::encode(ring::hmac::sign(&key, message).as_ref())
    )
}

/// Checks `header` (`sha256=<hex>`) against the HMAC of `message`, in constant time.
fn verify(secret: &[u8], message: &[u8], header: &[u8]) -> Result<(), SignatureError> {
    // A fixed length first: hex decoding then cannot be asked to allocate for a huge header.
    if header.len() != SIGNATURE_LEN {
        return Err(SignatureError::Malformed);
    }
    let tag = header
        .strip_prefix(b"sha256=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or(SignatureError::Malformed)?;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    ring::hmac::verify(&key, message, &tag).map_err(|_| SignatureError::Mismatch)
}

/// The version 2 signature of a request: the value of [`REQUEST_SIGNATURE_HEADER`].
pub fn sign_request(secret: &[u8], timestamp: &[u8], request_id: &[u8], body: &[u8]) -> String {
    sign(secret, &request_message(timestamp, request_id, body))
}

/// The signature of a reply to request `request_id`: the value of [`REPLY_SIGNATURE_HEADER`].
pub fn sign_reply(secret: &[u8], request_id: &[u8], body: &[u8]) -> String {
    sign(secret, &reply_message(request_id, body))
}

/// Checks a request's version 2 signature (the header's value as received). This is the
/// signature alone: a receiver also refuses a timestamp more than [`MAX_SKEW_SECS`] away and a
/// request id it has already seen within that window.
pub fn verify_request(
    secret: &[u8],
    timestamp: &[u8],
    request_id: &[u8],
    body: &[u8],
    header: &[u8],
) -> Result<(), SignatureError> {
    verify(
        secret,
        &request_message(timestamp, request_id, body),
        header,
    )
}

/// Checks a reply's signature (the header's value as received) for request `request_id`.
pub fn verify_reply(
    secret: &[u8],
    request_id: &[u8],
    body: &[u8],
    header: &[u8],
) -> Result<(), SignatureError> {
    verify(secret, &reply_message(request_id, body), header)
}

/// Whether a webhook's replies must be signed (the provisioner's `helper_reply_signature`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReplySignature {
    /// A signed reply is checked and refused when the signature does not match; an unsigned
    /// reply is accepted, as from a helper written before replies were signed.
    #[default]
    Optional,
    /// Every reply used must be signed with the shared secret: an unsigned or wrongly signed
    /// reply is refused. Needs a secret.
    Required,
}

impl ReplySignature {
    /// The setting's value: `optional` or `required`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplySignature::Optional => "optional",
            ReplySignature::Required => "required",
        }
    }
}

impl std::fmt::Display for ReplySignature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `helper_reply_signature` value that is neither `optional` nor `required`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not optional or required")]
pub struct ReplySignatureParseError(pub String);

impl FromStr for ReplySignature {
    type Err = ReplySignatureParseError;

    /// `optional` or `required`, in any case, around white space; empty is `optional`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "optional" => Ok(ReplySignature::Optional),
            "required" => Ok(ReplySignature::Required),
            _ => Err(ReplySignatureParseError(s.to_string())),
        }
    }
}

/// What the signature of a reply that was accepted showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyCheck {
    /// It was signed with the shared secret.
    Signed,
    /// It was not signed, which [`ReplySignature::Optional`] allows.
    Unsigned,
    /// There is no secret to check it with (so it cannot be required either).
    NoSecret,
}

/// Decides whether a reply may be used: `signatures` are the values of every
/// [`REPLY_SIGNATURE_HEADER`] it came with, `request_id` the id the request was sent with.
/// A signature that is given is always checked, so a wrong one is refused in either mode; an
/// absent one is refused when `mode` is [`ReplySignature::Required`].
pub fn check_reply(
    mode: ReplySignature,
    secret: Option<&[u8]>,
    request_id: &[u8],
    signatures: &[&[u8]],
    body: &[u8],
) -> Result<ReplyCheck, SignatureError> {
    let Some(secret) = secret else {
        return match mode {
            ReplySignature::Optional => Ok(ReplyCheck::NoSecret),
            ReplySignature::Required => Err(SignatureError::Missing),
        };
    };
    match signatures {
        [] if mode == ReplySignature::Required => Err(SignatureError::Missing),
        [] => Ok(ReplyCheck::Unsigned),
        [one] => verify_reply(secret, request_id, body, one).map(|()| ReplyCheck::Signed),
        many => Err(SignatureError::Repeated(many.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The vectors below were computed independently with Python's hmac module:
    //   hmac.new(b"Jefe", msg, hashlib.sha256).hexdigest()

    #[test]
    fn the_request_message_is_framed_by_length() {
        assert_eq!(
            request_message(b"1700000000", b"0123abcd", br#"{"identity":"n1"}"#),
            b"v2 request\n10:1700000000\n8:0123abcd\n17:{\"identity\":\"n1\"}\n".to_vec()
        );
        assert_eq!(
            sign_request(b"Jefe", b"1700000000", b"0123abcd", br#"{"identity":"n1"}"#),
            "sha256=b4066d6cc5e7bd342b5815a195e06be93e29edc76bbfb8058157f8e94786f0ce"
        );
    }

    #[test]
    fn the_reply_message_is_framed_by_length() {
        assert_eq!(
            reply_message(b"0123abcd", b"{}"),
            b"v2 reply\n8:0123abcd\n2:{}\n".to_vec()
        );
        assert_eq!(reply_message(b"", b""), b"v2 reply\n0:\n0:\n".to_vec());
        assert_eq!(
            sign_reply(b"Jefe", b"0123abcd", br#"{"identity":"n1"}"#),
            "sha256=deed4cd2182eae716e5eda295bb105840bbffd04e8c42681ee955ecbef4428a8"
        );
    }

    #[test]
    fn dots_and_newlines_in_fields_no_longer_move_the_boundaries() {
        // Version 1 signed `ts.rid.body`: these two requests gave the same bytes.
        let v1 = |ts: &str, id: &str, body: &str| format!("{ts}.{id}.{body}");
        assert_eq!(v1("1", "a.b", "c"), v1("1", "a", "b.c"));
        assert_ne!(
            request_message(b"1", b"a.b", b"c"),
            request_message(b"1", b"a", b"b.c")
        );
        // A field that holds what framing looks like still cannot pass for two fields.
        assert_ne!(
            request_message(b"1", b"a\n1:b", b"c"),
            request_message(b"1", b"a", b"b\n1:c")
        );
        assert_ne!(
            request_message(b"1\n1:a", b"", b""),
            request_message(b"1", b"a", b"")
        );
        let secret = b"s";
        let signed = sign_request(secret, b"1", b"a", b"b.c");
        assert_eq!(
            verify_request(secret, b"1", b"a.b", b"c", signed.as_bytes()),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify_request(secret, b"1", b"a", b"b.c", signed.as_bytes()),
            Ok(())
        );
    }

    #[test]
    fn a_request_signature_is_not_a_reply_signature() {
        // Same secret, same id and body: the first line keeps the two apart.
        let request = sign_request(b"k", b"", b"id", b"{}");
        assert_eq!(
            verify_reply(b"k", b"id", b"{}", request.as_bytes()),
            Err(SignatureError::Mismatch)
        );
        let reply = sign_reply(b"k", b"id", b"{}");
        assert_eq!(verify_reply(b"k", b"id", b"{}", reply.as_bytes()), Ok(()));
        // Bound to its request: another id does not verify.
        assert_eq!(
            verify_reply(b"k", b"id2", b"{}", reply.as_bytes()),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn malformed_signatures_are_refused_before_any_work() {
        let ok = sign_reply(b"k", b"id", b"{}");
        for bad in [
            "".to_string(),
            "sha256=".to_string(),
            ok.replace("sha256=", "sha512="),
            ok.to_uppercase(),
            format!("{ok}0"),
            ok[..ok.len() - 1].to_string(),
            ok.replace('a', "g"),
            "x".repeat(1 << 20),
        ] {
            let got = verify_reply(b"k", b"id", b"{}", bad.as_bytes());
            assert!(
                matches!(
                    got,
                    Err(SignatureError::Malformed | SignatureError::Mismatch)
                ),
                "{bad:.80}: {got:?}"
            );
        }
    }

    #[test]
    fn the_reply_check_follows_the_mode() {
        let good = sign_reply(b"k", b"id", b"{}");
        let wrong = sign_reply(b"other", b"id", b"{}");
        let (g, w) = (good.as_bytes(), wrong.as_bytes());
        use ReplySignature::{Optional, Required};
        let check = |mode, secret: Option<&[u8]>, sigs: &[&[u8]]| {
            check_reply(mode, secret, b"id", sigs, b"{}")
        };
        assert_eq!(check(Optional, Some(b"k"), &[g]), Ok(ReplyCheck::Signed));
        assert_eq!(check(Required, Some(b"k"), &[g]), Ok(ReplyCheck::Signed));
        assert_eq!(check(Optional, Some(b"k"), &[]), Ok(ReplyCheck::Unsigned));
        assert_eq!(
            check(Required, Some(b"k"), &[]),
            Err(SignatureError::Missing)
        );
        // A wrong signature is refused whatever the mode.
        for mode in [Optional, Required] {
            assert_eq!(check(mode, Some(b"k"), &[w]), Err(SignatureError::Mismatch));
            assert_eq!(
                check(mode, Some(b"k"), &[g, g]),
                Err(SignatureError::Repeated(2))
            );
        }
        assert_eq!(check(Optional, None, &[w]), Ok(ReplyCheck::NoSecret));
        assert_eq!(check(Required, None, &[g]), Err(SignatureError::Missing));
    }

    #[test]
    fn the_mode_reads_from_its_setting() {
        assert_eq!("".parse(), Ok(ReplySignature::Optional));
        assert_eq!(" Optional ".parse(), Ok(ReplySignature::Optional));
        assert_eq!("REQUIRED".parse(), Ok(ReplySignature::Required));
        let e = "yes".parse::<ReplySignature>().unwrap_err();
        assert_eq!(e.to_string(), "\"yes\" is not optional or required");
        assert_eq!(ReplySignature::Required.to_string(), "required");
    }
}
