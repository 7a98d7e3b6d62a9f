//! The operator's deny list as the cycle sees it ([`Revocation`]): a node whose identity or
//! key is denied never reaches the admission policy or the helper, and a node denied while its
//! helper runs is not configured. Where the list lives (the provisioner keeps it in a Choria
//! Streams bucket shared by every replica) is the implementer's business; the check itself must
//! be cheap and never block, since it runs on the async workers.

/// Whether a node is denied.
pub trait Revocation: Send + Sync + 'static {
    /// Why the node is denied (the entry and its reason), or `None`. `keys` are the
    /// fingerprints of the keys the node presented ([`key_fingerprints`]).
    fn denied(&self, identity: &str, keys: &[String]) -> Option<String>;
}

/// The fingerprints of the keys a node presented: its CSR's public key and its ed25519 key,
/// each `sha256:` and 64 hex digits ([`choria_crypto::csr::key_fingerprint`]). A key that does
/// not decode has no fingerprint (it was refused by the checks before this point anyway).
pub fn key_fingerprints(
    csr: Option<&helper_protocol::CsrReply>,
    ed25519: Option<&helper_protocol::Ed25519Reply>,
) -> Vec<String> {
    let mut keys = Vec::with_capacity(2);
    if let Some(csr) = csr {
        if let Ok(req) = choria_crypto::csr::from_pem(csr.csr.trim()) {
            if let Ok(f) = choria_crypto::csr::key_fingerprint(&req) {
                keys.push(f);
            }
        }
    }
    if let Some(ed) = ed25519 {
        if let Ok(raw) = hex::decode(ed.public_key.trim()) {
            keys.push(choria_crypto::csr::raw_key_fingerprint(&raw));
        }
    }
    keys
}

/// Nothing is denied.
#[derive(Debug, Clone, Copy, Default)]
pub struct DenyNone;

impl Revocation for DenyNone {
    fn denied(&self, _: &str, _: &[String]) -> Option<String> {
        None
    }
}

impl<T: Revocation + ?Sized> Revocation for std::sync::Arc<T> {
    fn denied(&self, identity: &str, keys: &[String]) -> Option<String> {
        (**self).denied(identity, keys)
    }
}
