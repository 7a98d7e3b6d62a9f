//! Encrypting a helper's private key for a node: [`choria_crypto::keyenc`] (X25519 with the
//! node's `ecdh_public`, then the legacy PEM encryption go-choria decrypts), its errors reported
//! as [`PolicyError::Key`].

pub use choria_crypto::keyenc::{
    decrypt_legacy_pem, decrypt_private_key, encrypt_private_key_with, EncryptedKey, KeyEncError,
};

use crate::policy::PolicyError;

impl From<KeyEncError> for PolicyError {
    fn from(e: KeyEncError) -> Self {
        PolicyError::Key(e.to_string())
    }
}

/// Encrypts the first PEM block of `key_pem` for the node whose `jwt` reply carried
/// `server_ecdh_public` (hex), with a fresh X25519 key pair and a fresh IV.
pub fn encrypt_private_key(
    key_pem: &str,
    server_ecdh_public: &str,
) -> Result<EncryptedKey, PolicyError> {
    Ok(choria_crypto::keyenc::encrypt_private_key(
        key_pem,
        server_ecdh_public,
    )?)
}
