//! The key material of enrolment ([`KeyMaterial`]): the key provisioning JWTs are verified with,
//! and the key and chain-issuer token server JWTs are signed with. The cycle asks for it for
//! every node and never reads a file itself: the binary's implementation reads the files named
//! by `jwt_verify_cert`, `jwt_signing_key` and `jwt_signing_token` again when they change, so a
//! rotated key takes effect without a restart. [`StaticKeys`] holds material already loaded.

use crate::jwt::VerifyingKey;
use crate::policy::PolicyError;

/// Where the cycle gets its keys, asked again for every node.
pub trait KeyMaterial: Send + Sync + 'static {
    /// The key a node's provisioning JWT must be signed with (`jwt_verify_cert`).
    fn verify_key(&self) -> Result<VerifyingKey, PolicyError>;

    /// The server JWT signing key as text (`jwt_signing_key`: a hex ed25519 seed or an RSA
    /// PEM), empty when none is configured.
    fn signing_key(&self) -> Result<String, PolicyError>;

    /// The chain-issuer token server JWTs are linked to (`jwt_signing_token`), empty when none
    /// is configured.
    fn signing_token(&self) -> Result<String, PolicyError>;
}

/// Key material loaded once by the embedder; no rotation.
#[derive(Clone, Default)]
pub struct StaticKeys {
    verify_key: Option<VerifyingKey>,
    signing_key: String,
    signing_token: String,
}

impl std::fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The signing key is a secret.
        f.debug_struct("StaticKeys")
            .field("verify_key", &self.verify_key.is_some())
            .field("signing_key", &!self.signing_key.is_empty())
            .field("signing_token", &!self.signing_token.is_empty())
            .finish()
    }
}

impl StaticKeys {
    /// No keys: a cycle that needs one fails with the error a missing setting gives.
    pub fn new() -> Self {
        StaticKeys::default()
    }

    /// Provisioning JWTs are verified with `key`.
    pub fn with_verify_key(mut self, key: VerifyingKey) -> Self {
        self.verify_key = Some(key);
        self
    }

    /// Server JWTs are signed with `key` (a hex ed25519 seed or an RSA PEM).
    pub fn with_signing_key(mut self, key: impl Into<String>) -> Self {
        self.signing_key = key.into();
        self
    }

    /// Server JWTs are linked to the chain-issuer `token`.
    pub fn with_signing_token(mut self, token: impl Into<String>) -> Self {
        self.signing_token = token.into();
        self
    }
}

impl KeyMaterial for StaticKeys {
    fn verify_key(&self) -> Result<VerifyingKey, PolicyError> {
        self.verify_key.clone().ok_or(PolicyError::NoVerifyCert)
    }

    fn signing_key(&self) -> Result<String, PolicyError> {
        Ok(self.signing_key.clone())
    }

    fn signing_token(&self) -> Result<String, PolicyError> {
        Ok(self.signing_token.clone())
    }
}

/// A shared source is asked through its `Arc`.
impl<T: KeyMaterial + ?Sized> KeyMaterial for std::sync::Arc<T> {
    fn verify_key(&self) -> Result<VerifyingKey, PolicyError> {
        (**self).verify_key()
    }

    fn signing_key(&self) -> Result<String, PolicyError> {
        (**self).signing_key()
    }

    fn signing_token(&self) -> Result<String, PolicyError> {
        (**self).signing_token()
    }
}
