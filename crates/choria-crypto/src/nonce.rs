//! The ed25519 proof of possession a node gives in its `gen25519` reply: the signature of the
//! provisioner's nonce (its ASCII text) with the key the node returns.

use ed25519_dalek::Signer as _;

/// Why a nonce proof was refused. The messages are the Go provisioner's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NonceError {
    /// No public key in the reply.
    #[error("no public key received")]
    NoPublicKey,
    /// No signature in the reply.
    #[error("no signature received")]
    NoSignature,
    /// The public key is not hexadecimal or not a valid ed25519 point.
    #[error("invalid public key received")]
    InvalidPublicKey,
    /// The public key is not 32 bytes.
    #[error("invalid public key received: wrong length")]
    PublicKeyLength,
    /// The signature is not hexadecimal.
    #[error("invalid signature")]
    InvalidSignature,
    /// The signature does not verify (strictly) over the nonce.
    #[error("invalid nonce signature")]
    BadSignature,
}

impl NonceError {
    /// The message, as a static string.
    pub fn message(self) -> &'static str {
        match self {
            NonceError::NoPublicKey => "no public key received",
            NonceError::NoSignature => "no signature received",
            NonceError::InvalidPublicKey => "invalid public key received",
            NonceError::PublicKeyLength => "invalid public key received: wrong length",
            NonceError::InvalidSignature => "invalid signature",
            NonceError::BadSignature => "invalid nonce signature",
        }
    }
}

/// Checks a `gen25519` reply: the signature (hex) over the nonce's text must verify strictly
/// with the returned public key (hex). Unlike the Go code a key of the wrong length is an
/// error, not a crash.
pub fn verify_nonce_signature(
    nonce: &str,
    public_key_hex: &str,
    signature_hex: &str,
) -> Result<(), NonceError> {
    if public_key_hex.is_empty() {
        return Err(NonceError::NoPublicKey);
    }
    if signature_hex.is_empty() {
        return Err(NonceError::NoSignature);
    }
    let pk = hex::decode(public_key_hex).map_err(|_| NonceError::InvalidPublicKey)?;
    let sig = hex::decode(signature_hex).map_err(|_| NonceError::InvalidSignature)?;
    let pk: [u8; 32] = pk.try_into().map_err(|_| NonceError::PublicKeyLength)?;
    let vk =
        ed25519_dalek::VerifyingKey::from_bytes(&pk).map_err(|_| NonceError::InvalidPublicKey)?;
    let sig = ed25519_dalek::Signature::from_slice(&sig).map_err(|_| NonceError::BadSignature)?;
    vk.verify_strict(nonce.as_bytes(), &sig)
        .map_err(|_| NonceError::BadSignature)
}

/// The node's side: `(public key, signature)` as hex for `nonce` signed with `key`.
pub fn sign_nonce(key: &ed25519_dalek::SigningKey, nonce: &[u8]) -> (String, String) {
    (
        hex::encode(key.verifying_key().to_bytes()),
        hex::encode(key.sign(nonce).to_bytes()),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_nonce_verifies_and_nothing_else_does() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
        let (pk, sig) = sign_nonce(&key, b"abc123");
        assert_eq!(verify_nonce_signature("abc123", &pk, &sig), Ok(()));
        assert_eq!(
            verify_nonce_signature("other", &pk, &sig),
            Err(NonceError::BadSignature)
        );
        assert_eq!(
            verify_nonce_signature("abc123", "", &sig),
            Err(NonceError::NoPublicKey)
        );
        assert_eq!(
            verify_nonce_signature("abc123", &pk, ""),
            Err(NonceError::NoSignature)
        );
        assert_eq!(
            verify_nonce_signature("abc123", &pk[..62], &sig),
            Err(NonceError::PublicKeyLength)
        );
        assert_eq!(
            verify_nonce_signature("abc123", "zz", &sig),
            Err(NonceError::InvalidPublicKey)
        );
        for e in [NonceError::NoPublicKey, NonceError::BadSignature] {
            assert_eq!(e.message(), e.to_string());
        }
    }
}
