//! The cryptography of Choria provisioning, written once for every crate of the workspace: the
//! provisioner's checks (`provision-core`), the RPC client's request signatures
//! (`choria-rpc-client`), the simulated go-choria servers (`choria-fleet-sim`), the demo helper
//! and the fault suite.
//!
//! * [`jwt`]: compact JWTs signed and verified with RS256/RS384/RS512 or EdDSA only, the
//!   algorithm matched to the key (`alg: none`, HMAC and algorithm confusion are refused), plus
//!   [`jwt::sign_with_alg`] to forge the tokens a verifier must refuse.
//! * [`ksuid`]: the KSUIDs the Choria tokens package uses as `jti`.
//! * [`x25519`]: key agreement, refusing a low-order (non-contributory) peer key.
//! * [`keyenc`]: the legacy PEM encryption (AES-CBC, key from OpenSSL's `EVP_BytesToKey` with
//!   MD5) go-choria decrypts, and the X25519-keyed private key delivery built on it.
//! * [`pem`]: PEM armour first, then DER from a slice, with the label checked.
//! * [`csr`]: certificate requests: decoding, self-signature verification and their names.
//! * [`nonce`]: the ed25519 proof a node gives for the provisioner's nonce.
//! * [`base64url`]: unpadded base64url, as JWTs use it.
//!
//! ```
//! use choria_crypto::jwt::{self, SigningKey, TokenSignature};
//!
//! let key = SigningKey::from_ed25519_seed(&[7; 32]);
//! let verifier = key.verifying_key();
//! let claims = serde_json::json!({"purpose": "choria_provisioning", "exp": 2_000_000_000});
//! let genuine = jwt::sign(&claims, &key)?;
//! assert!(jwt::verify::<serde_json::Value>(&genuine, &verifier, 1_700_000_000).is_ok());
//! // Forged tokens, as the fault suite serves them: refused before any signature is checked.
//! let none = jwt::sign_with_alg("none", &claims, TokenSignature::Empty)?;
//! let hs256 = jwt::sign_with_alg("HS256", &claims, TokenSignature::HmacSha256(b"public"))?;
//! for forged in [none, hs256] {
//!     assert!(jwt::verify::<serde_json::Value>(&forged, &verifier, 1_700_000_000).is_err());
//! }
//! // A raw signature, such as a trust chain signature over `<id>.<public key>`.
//! let tcs = hex::encode(key.sign_bytes(b"id.public")?);
//! assert_eq!(tcs.len(), 128);
//! # Ok::<(), jwt::JwtError>(())
//! ```
//!
//! Nothing here reads files, talks to a network or starts a runtime: callers pass bytes and
//! the time, and get typed errors back. Decisions (which names a CSR may carry, what a server
//! says when a check fails) belong to the callers.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod base64url;
pub mod csr;
pub mod jwt;
pub mod keyenc;
pub mod ksuid;
pub mod nonce;
pub mod pem;
pub mod x25519;

/// Runs `f` on a thread and fails the test if it has not returned within five seconds: for
/// inputs that once made a decoder spin.
#[cfg(test)]
pub(crate) fn returns_within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(5)) {
        Ok(v) => v,
        Err(e) => panic!("did not return within 5 s: {e}"),
    }
}
