//! Unpadded base64url (RFC 4648 section 5), the encoding of the three sections of a JWT.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// Why text is not base64url.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid base64: {0}")]
pub struct Base64Error(String);

/// `data` as unpadded base64url.
pub fn encode(data: impl AsRef<[u8]>) -> String {
    URL_SAFE_NO_PAD.encode(data)
}

/// Decodes base64url, with or without trailing `=` padding.
pub fn decode(text: &str) -> Result<Vec<u8>, Base64Error> {
    URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|e| Base64Error(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_without_padding() {
        for data in [&b""[..], b"f", b"fo", b"foo", b"\xfb\xff\xfe"] {
            let text = encode(data);
            assert!(!text.contains('='));
            assert_eq!(decode(&text).unwrap(), data);
        }
        assert_eq!(encode(b"\xfb\xff"), "-_8");
        assert_eq!(decode("Zm8=").unwrap(), b"fo");
        assert!(decode("Zm8*").is_err());
    }
}
