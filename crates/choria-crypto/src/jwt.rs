//! Compact JWTs as Choria uses them: RS256/RS384/RS512 and EdDSA (ed25519).
//!
//! It is written directly on `rsa`, `ed25519-dalek` and `sha2` rather than on a JWT crate because
//! the usual choice, `jwt-simple`, builds BoringSSL by default, which would drag a C toolchain
//! into every build. Verification is strict: the algorithm must be one of the four above *and*
//! fit the key it is checked with, so `alg: none` and algorithm confusion (an HMAC token
//! "signed" with a public key) are refused before any signature is looked at.
//!
//! [`sign_with_alg`] writes tokens with any header algorithm (including `none` and `HS256`) for
//! the tests and fault scenarios that check such tokens are refused.

use ed25519_dalek::{Signer as _, Verifier as _};
use rsa::pkcs8::DecodePublicKey;
use rsa::{Pkcs1v15Sign, RsaPrivateKey, RsaPublicKey};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha384, Sha512};

/// Why a token or key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not three base64url sections, or undecodable JSON.
    #[error("malformed token: {0}")]
    Malformed(String),
    /// The header names an algorithm that is not accepted (including `none` and HMAC).
    #[error("unsupported signing algorithm {0:?}")]
    UnsupportedAlgorithm(String),
    /// The header's algorithm does not fit the verification key.
    #[error("signing algorithm {alg} does not match the {key} verification key")]
    AlgorithmMismatch {
        /// The header's algorithm.
        alg: String,
        /// The key type.
        key: &'static str,
    },
    /// The signature does not verify.
    #[error("invalid token signature")]
    BadSignature,
    /// `exp` has passed.
    #[error("token has expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("token is not valid yet")]
    NotYetValid,
    /// A key could not be read or parsed.
    #[error("invalid key: {0}")]
    Key(String),
}

/// A key that verifies signatures.
#[derive(Clone, Debug)]
pub enum VerifyingKey {
    /// For RS256, RS384 and RS512.
    Rsa(Box<RsaPublicKey>),
    /// For EdDSA.
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl VerifyingKey {
    /// Reads public data the way the Choria tokens package does: a PEM starting
    /// `-----BEGIN CERTIFICATE` or `-----BEGIN PUBLIC KEY` holds an RSA key, anything else must be
    /// exactly 64 hex characters of ed25519 public key.
    pub fn from_public_data(data: &[u8]) -> Result<Self, JwtError> {
        if data.starts_with(b"-----BEGIN CERTIFICATE") {
            let text = std::str::from_utf8(data).map_err(|_| JwtError::Key("not UTF-8".into()))?;
            let cert = crate::pem::certificate(text)
                .map_err(|e| JwtError::Key(format!("could not parse certificate: {e}")))?;
            let spki = crate::pem::certificate_spki_der(&cert)
                .map_err(|e| JwtError::Key(e.to_string()))?;
            let key = RsaPublicKey::from_public_key_der(&spki)
                .map_err(|e| JwtError::Key(format!("certificate does not hold an RSA key: {e}")))?;
            return Ok(VerifyingKey::Rsa(Box::new(key)));
        }
        if data.starts_with(b"-----BEGIN PUBLIC KEY") {
            let text = std::str::from_utf8(data).map_err(|_| JwtError::Key("not UTF-8".into()))?;
            // Some tools write PKCS#1 under the generic label: the reader takes both.
            let key = crate::pem::rsa_public_key(text).map_err(|e| JwtError::Key(e.to_string()))?;
            return Ok(VerifyingKey::Rsa(Box::new(key)));
        }
        Self::from_ed25519_hex(data)
    }

    /// An ed25519 public key from exactly 64 hex characters.
    pub fn from_ed25519_hex(hex_text: &[u8]) -> Result<Self, JwtError> {
        // Trailing whitespace, such as the newline an editor adds to a key file, is ignored.
        let raw = hex::decode(hex_text.trim_ascii())
            .map_err(|e| JwtError::Key(format!("invalid hex ed25519 public key: {e}")))?;
        let raw: [u8; 32] = raw
            .try_into()
            .map_err(|_| JwtError::Key("ed25519 public key must be 32 bytes".into()))?;
        ed25519_dalek::VerifyingKey::from_bytes(&raw)
            .map(VerifyingKey::Ed25519)
            .map_err(|e| JwtError::Key(format!("invalid ed25519 public key: {e}")))
    }
}

/// A key that signs tokens. Its `Debug` form names the kind of key only, never the key.
#[derive(Clone)]
pub enum SigningKey {
    /// Signs RS256.
    Rsa(Box<RsaPrivateKey>),
    /// Signs EdDSA.
    Ed25519(Box<ed25519_dalek::SigningKey>),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SigningKey::Rsa(_) => f.write_str("SigningKey::Rsa(<redacted>)"),
            SigningKey::Ed25519(_) => f.write_str("SigningKey::Ed25519(<redacted>)"),
        }
    }
}

impl SigningKey {
    /// Reads a signing key file's content as the tokens package does: `-----BEGIN RSA PRIVATE
    /// KEY` (PKCS#1) or `-----BEGIN PRIVATE KEY` (PKCS#8) is RSA, exactly 64 bytes of hex is an
    /// ed25519 seed; anything else is refused.
    pub fn from_key_data(data: &[u8]) -> Result<Self, JwtError> {
        if data.starts_with(b"-----BEGIN RSA PRIVATE KEY")
            || data.starts_with(b"-----BEGIN PRIVATE KEY")
        {
            let text = std::str::from_utf8(data).map_err(|_| JwtError::Key("not UTF-8".into()))?;
            let k = crate::pem::rsa_private_key(text)
                .map_err(|e| JwtError::Key(format!("could not parse RSA private key: {e}")))?;
            return Ok(SigningKey::Rsa(Box::new(k)));
        }
        if data.len() == 64 {
            return Self::from_ed25519_seed_hex(data);
        }
        Err(JwtError::Key(
            "unsupported signing key: expected an RSA PEM key or a 64 character hex ed25519 seed"
                .into(),
        ))
    }

    /// [`SigningKey::from_key_data`] for data that is read again and again (the provisioner
    /// reads `jwt_signing_key` for every node, so a rotated key takes effect at once): the key
    /// parsed from the very same bytes last time is returned without parsing it (and, for
    /// ed25519, deriving its public half) again. The bytes are recognised by their SHA-256
    /// digest; only the last key is kept.
    pub fn from_key_data_remembered(data: &[u8]) -> Result<Self, JwtError> {
        type Last = Option<([u8; 32], SigningKey)>;
        static LAST: std::sync::Mutex<Last> = std::sync::Mutex::new(None);
        let lock = || {
            LAST.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        let digest: [u8; 32] = Sha256::digest(data).into();
        if let Some((d, k)) = &*lock() {
            if *d == digest {
                return Ok(k.clone());
            }
        }
        let key = Self::from_key_data(data)?;
        *lock() = Some((digest, key.clone()));
        Ok(key)
    }

    /// An ed25519 key from 64 hex characters of seed.
    pub fn from_ed25519_seed_hex(data: &[u8]) -> Result<Self, JwtError> {
        let raw = hex::decode(data).map_err(|e| JwtError::Key(format!("invalid seed: {e}")))?;
        let seed: [u8; 32] = raw
            .try_into()
            .map_err(|_| JwtError::Key("ed25519 seed must be 32 bytes".into()))?;
        Ok(SigningKey::Ed25519(Box::new(
            ed25519_dalek::SigningKey::from_bytes(&seed),
        )))
    }

    /// An ed25519 key from its 32-byte seed.
    pub fn from_ed25519_seed(seed: &[u8; 32]) -> Self {
        SigningKey::Ed25519(Box::new(ed25519_dalek::SigningKey::from_bytes(seed)))
    }

    /// The algorithm this key signs with.
    pub fn algorithm(&self) -> &'static str {
        match self {
            SigningKey::Rsa(_) => "RS256",
            SigningKey::Ed25519(_) => "EdDSA",
        }
    }

    /// The raw signature of `data`: RSA PKCS#1 v1.5 over SHA-256, or ed25519. This is also the
    /// signature of a trust chain (`tcs`), made over `<id>.<public key>` text.
    pub fn sign_bytes(&self, data: &[u8]) -> Result<Vec<u8>, JwtError> {
        match self {
            SigningKey::Rsa(k) => k
                .sign(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(data))
                .map_err(|e| JwtError::Key(e.to_string())),
            SigningKey::Ed25519(k) => Ok(k.sign(data).to_bytes().to_vec()),
        }
    }

    /// The key that verifies this key's signatures.
    pub fn verifying_key(&self) -> VerifyingKey {
        match self {
            SigningKey::Rsa(k) => VerifyingKey::Rsa(Box::new(k.to_public_key())),
            SigningKey::Ed25519(k) => VerifyingKey::Ed25519(k.verifying_key()),
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    typ: Option<String>,
}

/// Signs `claims` as a compact JWT with header `{"alg":…,"typ":"JWT"}`.
pub fn sign<C: Serialize>(claims: &C, key: &SigningKey) -> Result<String, JwtError> {
    sign_with_alg(key.algorithm(), claims, TokenSignature::Key(key))
}

/// How [`sign_with_alg`] makes the third section of a token.
#[derive(Clone, Copy, Debug)]
pub enum TokenSignature<'a> {
    /// The key's own signature ([`SigningKey::sign_bytes`]), whatever the header says.
    Key(&'a SigningKey),
    /// No signature at all, as an `alg: none` token carries.
    Empty,
    /// HMAC-SHA256 with this secret, as an `HS256` token carries.
    HmacSha256(&'a [u8]),
}

/// A compact JWT with header `{"alg":<alg>,"typ":"JWT"}`, `claims`, and the signature `how`
/// asks for. With `alg` equal to the key's algorithm and [`TokenSignature::Key`] this is
/// [`sign`]; anything else forges a token that [`verify`] must refuse, for tests and fault
/// injection.
pub fn sign_with_alg<C: Serialize>(
    alg: &str,
    claims: &C,
    how: TokenSignature<'_>,
) -> Result<String, JwtError> {
    let header = serde_json::to_vec(&Header {
        alg: alg.to_string(),
        typ: Some("JWT".to_string()),
    })
    .map_err(|e| JwtError::Malformed(e.to_string()))?;
    let body = serde_json::to_vec(claims).map_err(|e| JwtError::Malformed(e.to_string()))?;
    let mut out = crate::base64url::encode(header);
    out.push('.');
    out.push_str(&crate::base64url::encode(body));
    let sig = match how {
        TokenSignature::Key(key) => key.sign_bytes(out.as_bytes())?,
        TokenSignature::Empty => Vec::new(),
        TokenSignature::HmacSha256(secret) => hmac_sha256(secret, out.as_bytes()).to_vec(),
    };
    out.push('.');
    out.push_str(&crate::base64url::encode(sig));
    Ok(out)
}

/// HMAC-SHA256 (RFC 2104): only ever used to forge `HS256` tokens that must be refused.
fn hmac_sha256(secret: &[u8], data: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut key = [0u8; BLOCK];
    if secret.len() > BLOCK {
        key[..32].copy_from_slice(&Sha256::digest(secret));
    } else {
        key[..secret.len()].copy_from_slice(secret);
    }
    let pad = |byte: u8| key.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(data)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Registered time claims, read for validation.
#[derive(Deserialize, Clone)]
struct TimeClaims {
    #[serde(default)]
    exp: Option<f64>,
    #[serde(default)]
    nbf: Option<f64>,
}

fn b64(part: &str) -> Result<Vec<u8>, JwtError> {
    crate::base64url::decode(part).map_err(|e| JwtError::Malformed(e.to_string()))
}

/// Verifies `token` with `key`, checks `exp` and `nbf` against `now` (Unix seconds, no leeway, as
/// golang-jwt v5) and decodes the claims.
pub fn verify<C: DeserializeOwned>(
    token: &str,
    key: &VerifyingKey,
    now: i64,
) -> Result<C, JwtError> {
    verify_inner(token, key, now, None).map(|(claims, _)| claims)
}

/// [`verify`], skipping the signature check of a token whose signature already verified with
/// the same key (the very same bytes) and is still in `memo`, and the decoding of one whose
/// claims were read as `C` since: the same bytes hold the same header and claims. `exp` and
/// `nbf` are checked against `now` on every call.
pub fn verify_remembered<C: DeserializeOwned + Clone + Send + Sync + 'static>(
    token: &str,
    key: &VerifyingKey,
    now: i64,
    memo: &VerifiedTokens,
) -> Result<C, JwtError> {
    let trimmed = token.trim();
    if let Some((times, claims)) = memo.recall(trimmed, key) {
        if let Some(c) = claims.downcast_ref::<C>() {
            check_times(&times, now)?;
            return Ok(c.clone());
        }
    }
    let (claims, times) = verify_inner::<C>(token, key, now, Some(memo))?;
    memo.attach(trimmed, key, times, std::sync::Arc::new(claims.clone()));
    Ok(claims)
}

/// How many tokens a [`VerifiedTokens`] holds.
pub const VERIFIED_TOKENS: usize = 16;

/// The longest token a [`VerifiedTokens`] keeps, in bytes.
pub const VERIFIED_TOKEN_MAX_LEN: usize = 8 * 1024;

/// The last few tokens whose signature verified, each with the key it verified with: a token
/// that many nodes present (a site's provisioning JWT is baked into its images) then costs one
/// signature check per key, not one per node. Bounded: [`VERIFIED_TOKENS`] tokens of at
/// most [`VERIFIED_TOKEN_MAX_LEN`] bytes, the oldest forgotten first.
#[derive(Default)]
pub struct VerifiedTokens {
    seen: std::sync::Mutex<std::collections::VecDeque<Remembered>>,
}

/// A token whose signature verified with `key`, and, once read as some type, its time claims
/// and what it was read as.
struct Remembered {
    token: Box<str>,
    key: VerifyingKey,
    read: Option<(TimeClaims, Claims)>,
}

/// Claims read as the caller's type.
type Claims = std::sync::Arc<dyn std::any::Any + Send + Sync>;

impl std::fmt::Debug for VerifiedTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedTokens")
            .field("tokens", &self.len())
            .finish()
    }
}

impl VerifiedTokens {
    /// An empty memory.
    pub fn new() -> Self {
        VerifiedTokens::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<Remembered>> {
        // Entries are pushed and popped whole: a panic elsewhere cannot leave one half made.
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many tokens it holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn contains(&self, token: &str, key: &VerifyingKey) -> bool {
        self.lock().iter().any(|r| r.is(token, key))
    }

    fn remember(&self, token: &str, key: &VerifyingKey) {
        if token.len() > VERIFIED_TOKEN_MAX_LEN {
            return;
        }
        let mut seen = self.lock();
        if seen.iter().any(|r| r.is(token, key)) {
            return;
        }
        if seen.len() >= VERIFIED_TOKENS {
            seen.pop_front();
        }
        seen.push_back(Remembered {
            token: token.into(),
            key: key.clone(),
            read: None,
        });
    }

    /// The time claims and the claims `token` was last read as, if its signature verified
    /// with `key` and it was read since.
    fn recall(&self, token: &str, key: &VerifyingKey) -> Option<(TimeClaims, Claims)> {
        self.lock()
            .iter()
            .find(|r| r.is(token, key))
            .and_then(|r| r.read.as_ref())
            .map(|(t, c)| (t.clone(), std::sync::Arc::clone(c)))
    }

    /// Keeps what a remembered `token` was read as.
    fn attach(&self, token: &str, key: &VerifyingKey, times: TimeClaims, claims: Claims) {
        if let Some(r) = self.lock().iter_mut().find(|r| r.is(token, key)) {
            r.read = Some((times, claims));
        }
    }
}

impl Remembered {
    fn is(&self, token: &str, key: &VerifyingKey) -> bool {
        &*self.token == token && same_key(&self.key, key)
    }
}

fn same_key(a: &VerifyingKey, b: &VerifyingKey) -> bool {
    match (a, b) {
        (VerifyingKey::Rsa(a), VerifyingKey::Rsa(b)) => a == b,
        (VerifyingKey::Ed25519(a), VerifyingKey::Ed25519(b)) => a == b,
        _ => false,
    }
}

/// The claims of a verified token, and its time claims.
fn verify_inner<C: DeserializeOwned>(
    token: &str,
    key: &VerifyingKey,
    now: i64,
    memo: Option<&VerifiedTokens>,
) -> Result<(C, TimeClaims), JwtError> {
    let token = token.trim();
    let mut parts = token.split('.');
    let (Some(h), Some(c), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::Malformed("expected three sections".into()));
    };
    let header: Header = serde_json::from_slice(&b64(h)?)
        .map_err(|e| JwtError::Malformed(format!("invalid header: {e}")))?;
    let signed = &token[..h.len() + 1 + c.len()];
    let known = memo.is_some_and(|m| m.contains(token, key));
    let sig = if known { Vec::new() } else { b64(s)? };
    match (header.alg.as_str(), key) {
        ("RS256", VerifyingKey::Rsa(k)) if !known => rsa_verify::<Sha256>(k, signed, &sig)?,
        ("RS384", VerifyingKey::Rsa(k)) if !known => rsa_verify::<Sha384>(k, signed, &sig)?,
        ("RS512", VerifyingKey::Rsa(k)) if !known => rsa_verify::<Sha512>(k, signed, &sig)?,
        ("EdDSA", VerifyingKey::Ed25519(k)) if !known => {
            let sig =
                ed25519_dalek::Signature::from_slice(&sig).map_err(|_| JwtError::BadSignature)?;
            k.verify(signed.as_bytes(), &sig)
                .map_err(|_| JwtError::BadSignature)?;
        }
        // A remembered token verified with this very key: its algorithm fits the key.
        ("RS256" | "RS384" | "RS512", VerifyingKey::Rsa(_))
        | ("EdDSA", VerifyingKey::Ed25519(_))
            if known => {}
        ("RS256" | "RS384" | "RS512" | "EdDSA", k) => {
            return Err(JwtError::AlgorithmMismatch {
                alg: header.alg,
                key: match k {
                    VerifyingKey::Rsa(_) => "RSA",
                    VerifyingKey::Ed25519(_) => "ed25519",
                },
            })
        }
        _ => return Err(JwtError::UnsupportedAlgorithm(header.alg)),
    }
    if let (false, Some(m)) = (known, memo) {
        m.remember(token, key);
    }
    let body = b64(c)?;
    let times: TimeClaims = serde_json::from_slice(&body)
        .map_err(|e| JwtError::Malformed(format!("invalid claims: {e}")))?;
    check_times(&times, now)?;
    let claims = serde_json::from_slice(&body)
        .map_err(|e| JwtError::Malformed(format!("invalid claims: {e}")))?;
    Ok((claims, times))
}

/// `exp` and `nbf` against `now` (Unix seconds, no leeway, as golang-jwt v5).
fn check_times(times: &TimeClaims, now: i64) -> Result<(), JwtError> {
    let now = now as f64;
    if let Some(exp) = times.exp {
        if now >= exp {
            return Err(JwtError::Expired);
        }
    }
    if let Some(nbf) = times.nbf {
        if now < nbf {
            return Err(JwtError::NotYetValid);
        }
    }
    Ok(())
}

/// Decodes the claims without checking the signature: only for the provisioner's own signing
/// token, which it reads from its own disk to copy chain data from.
pub fn decode_unverified<C: DeserializeOwned>(token: &str) -> Result<C, JwtError> {
    let c = token
        .trim()
        .split('.')
        .nth(1)
        .ok_or_else(|| JwtError::Malformed("expected three sections".into()))?;
    serde_json::from_slice(&b64(c)?)
        .map_err(|e| JwtError::Malformed(format!("invalid claims: {e}")))
}

fn rsa_verify<D: Digest + rsa::pkcs8::AssociatedOid>(
    key: &RsaPublicKey,
    signed: &str,
    sig: &[u8],
) -> Result<(), JwtError> {
    key.verify(Pkcs1v15Sign::new::<D>(), &D::digest(signed.as_bytes()), sig)
        .map_err(|_| JwtError::BadSignature)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ed_key() -> (SigningKey, VerifyingKey) {
        let sk = ed25519_dalek::SigningKey::from_bytes(&[7u8; 32]);
        let vk = VerifyingKey::Ed25519(sk.verifying_key());
        (SigningKey::Ed25519(Box::new(sk)), vk)
    }

    fn forge(header: &str, claims: &str, sig: &[u8]) -> String {
        format!(
            "{}.{}.{}",
            crate::base64url::encode(header),
            crate::base64url::encode(claims),
            crate::base64url::encode(sig)
        )
    }

    #[test]
    fn a_signing_key_never_shows_itself_in_debug() {
        let (sk, _) = ed_key();
        let shown = format!("{sk:?} {sk:#?}");
        assert!(shown.contains("<redacted>"), "{shown}");
        let seed_hex = hex::encode([7u8; 32]);
        assert!(
            !shown.contains(&seed_hex) && !shown.contains("[7, 7"),
            "{shown}"
        );
        assert!(format!("{:?}", TokenSignature::Key(&sk)).contains("<redacted>"));
    }

    /// A remembered token's claims are decoded once per type they are read as; its times are
    /// still checked on every call.
    #[test]
    fn a_remembered_token_is_decoded_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DECODED: AtomicUsize = AtomicUsize::new(0);
        #[derive(Clone, Debug, PartialEq)]
        struct Counted(i64);
        impl<'de> Deserialize<'de> for Counted {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                struct A {
                    a: i64,
                }
                DECODED.fetch_add(1, Ordering::Relaxed);
                A::deserialize(d).map(|a| Counted(a.a))
            }
        }
        let (sk, vk) = ed_key();
        let memo = VerifiedTokens::new();
        let t = sign(&serde_json::json!({"a": 5, "exp": 200}), &sk).unwrap();
        for _ in 0..3 {
            assert_eq!(
                verify_remembered::<Counted>(&t, &vk, 150, &memo).unwrap(),
                Counted(5)
            );
        }
        assert_eq!(DECODED.load(Ordering::Relaxed), 1);
        assert_eq!(
            verify_remembered::<Counted>(&t, &vk, 200, &memo).unwrap_err(),
            JwtError::Expired
        );
        // Read as another type: decoded as that type, then remembered as it.
        let v: serde_json::Value = verify_remembered(&t, &vk, 150, &memo).unwrap();
        assert_eq!(v["a"], 5);
        assert_eq!(
            verify_remembered::<Counted>(&t, &vk, 150, &memo).unwrap(),
            Counted(5)
        );
        assert_eq!(DECODED.load(Ordering::Relaxed), 2);
        // Surrounding whitespace is the same token.
        assert_eq!(
            verify_remembered::<Counted>(&format!(" {t}\n"), &vk, 150, &memo).unwrap(),
            Counted(5)
        );
        assert_eq!(DECODED.load(Ordering::Relaxed), 2);
        assert_eq!(memo.len(), 1);
    }

    #[test]
    fn a_remembered_token_skips_only_its_signature_check() {
        let (sk, vk) = ed_key();
        let other = VerifyingKey::Ed25519(
            ed25519_dalek::SigningKey::from_bytes(&[8u8; 32]).verifying_key(),
        );
        let memo = VerifiedTokens::new();
        let t = sign(&serde_json::json!({"a": 1, "exp": 200, "nbf": 100}), &sk).unwrap();
        // A bad signature is never remembered.
        assert_eq!(
            verify_remembered::<serde_json::Value>(&t, &other, 150, &memo).unwrap_err(),
            JwtError::BadSignature
        );
        assert!(memo.is_empty());
        let v: serde_json::Value = verify_remembered(&t, &vk, 150, &memo).unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(memo.len(), 1);
        // Remembered with its key only: another key still checks the signature and refuses.
        assert_eq!(
            verify_remembered::<serde_json::Value>(&t, &other, 150, &memo).unwrap_err(),
            JwtError::BadSignature
        );
        // The times are checked on every call.
        assert_eq!(
            verify_remembered::<serde_json::Value>(&t, &vk, 200, &memo).unwrap_err(),
            JwtError::Expired
        );
        assert_eq!(
            verify_remembered::<serde_json::Value>(&t, &vk, 99, &memo).unwrap_err(),
            JwtError::NotYetValid
        );
        // The same claims and header with another signature are other bytes: checked afresh.
        let (h, rest) = t.split_once('.').unwrap();
        let (c, _) = rest.split_once('.').unwrap();
        let forged = format!("{h}.{c}.{}", crate::base64url::encode([0u8; 64]));
        assert_eq!(
            verify_remembered::<serde_json::Value>(&forged, &vk, 150, &memo).unwrap_err(),
            JwtError::BadSignature
        );
        assert_eq!(memo.len(), 1);
        // Bounded: the oldest is forgotten first.
        for i in 0..VERIFIED_TOKENS + 3 {
            let t = sign(&serde_json::json!({ "n": i }), &sk).unwrap();
            verify_remembered::<serde_json::Value>(&t, &vk, 150, &memo).unwrap();
        }
        assert_eq!(memo.len(), VERIFIED_TOKENS);
        assert!(!memo.contains(&t, &vk));
        // A token longer than the limit verifies and is not kept.
        let long = sign(
            &serde_json::json!({ "pad": "x".repeat(VERIFIED_TOKEN_MAX_LEN) }),
            &sk,
        )
        .unwrap();
        verify_remembered::<serde_json::Value>(&long, &vk, 150, &memo).unwrap();
        assert!(!memo.contains(&long, &vk));
    }

    #[test]
    fn a_remembered_signing_key_follows_its_bytes() {
        let one = hex::encode([1u8; 32]);
        let two = hex::encode([2u8; 32]);
        let public = |k: &SigningKey| match k.verifying_key() {
            VerifyingKey::Ed25519(v) => v.to_bytes(),
            VerifyingKey::Rsa(_) => panic!("not ed25519"),
        };
        let a = SigningKey::from_key_data_remembered(one.as_bytes()).unwrap();
        let again = SigningKey::from_key_data_remembered(one.as_bytes()).unwrap();
        let b = SigningKey::from_key_data_remembered(two.as_bytes()).unwrap();
        let direct = |h: &str| public(&SigningKey::from_key_data(h.as_bytes()).unwrap());
        assert_eq!(public(&a), direct(&one));
        assert_eq!(public(&again), direct(&one));
        assert_eq!(public(&b), direct(&two));
        assert!(SigningKey::from_key_data_remembered(b"not a key").is_err());
        assert_eq!(
            public(&SigningKey::from_key_data_remembered(one.as_bytes()).unwrap()),
            direct(&one)
        );
    }

    #[test]
    fn eddsa_round_trip_and_time_checks() {
        let (sk, vk) = ed_key();
        let t = sign(&serde_json::json!({"a": 1, "exp": 200, "nbf": 100}), &sk).unwrap();
        let v: serde_json::Value = verify(&t, &vk, 150).unwrap();
        assert_eq!(v["a"], 1);
        assert_eq!(
            verify::<serde_json::Value>(&t, &vk, 200).unwrap_err(),
            JwtError::Expired
        );
        assert_eq!(
            verify::<serde_json::Value>(&t, &vk, 99).unwrap_err(),
            JwtError::NotYetValid
        );
    }

    #[test]
    fn alg_none_and_hmac_are_refused() {
        let (_, vk) = ed_key();
        let t = forge(r#"{"alg":"none"}"#, r#"{"a":1}"#, b"");
        assert_eq!(
            verify::<serde_json::Value>(&t, &vk, 0).unwrap_err(),
            JwtError::UnsupportedAlgorithm("none".into())
        );
        let t = forge(r#"{"alg":"HS256"}"#, r#"{"a":1}"#, b"xx");
        assert!(matches!(
            verify::<serde_json::Value>(&t, &vk, 0).unwrap_err(),
            JwtError::UnsupportedAlgorithm(_)
        ));
    }

    #[test]
    fn algorithm_must_fit_the_key() {
        let (sk, vk) = ed_key();
        let good = sign(&serde_json::json!({"a": 1}), &sk).unwrap();
        let mut parts = good.split('.');
        let _ = parts.next();
        let rest: Vec<&str> = parts.collect();
        let t = format!(
            "{}.{}",
            crate::base64url::encode(r#"{"alg":"RS256"}"#),
            rest.join(".")
        );
        assert!(matches!(
            verify::<serde_json::Value>(&t, &vk, 0).unwrap_err(),
            JwtError::AlgorithmMismatch { .. }
        ));
    }

    #[test]
    fn tampered_claims_fail() {
        let (sk, vk) = ed_key();
        let good = sign(&serde_json::json!({"a": 1}), &sk).unwrap();
        let parts: Vec<&str> = good.split('.').collect();
        let t = format!(
            "{}.{}.{}",
            parts[0],
            crate::base64url::encode(r#"{"a":2}"#),
            parts[2]
        );
        assert_eq!(
            verify::<serde_json::Value>(&t, &vk, 0).unwrap_err(),
            JwtError::BadSignature
        );
    }

    #[test]
    fn forged_tokens_are_refused_and_genuine_ones_accepted() {
        let (sk, vk) = ed_key();
        let claims = serde_json::json!({"a": 1});
        let genuine = sign_with_alg("EdDSA", &claims, TokenSignature::Key(&sk)).unwrap();
        assert_eq!(genuine, sign(&claims, &sk).unwrap());
        assert!(verify::<serde_json::Value>(&genuine, &vk, 0).is_ok());
        let none = sign_with_alg("none", &claims, TokenSignature::Empty).unwrap();
        assert!(none.ends_with('.'));
        assert_eq!(
            verify::<serde_json::Value>(&none, &vk, 0).unwrap_err(),
            JwtError::UnsupportedAlgorithm("none".into())
        );
        let hs = sign_with_alg("HS256", &claims, TokenSignature::HmacSha256(b"k")).unwrap();
        assert_eq!(
            verify::<serde_json::Value>(&hs, &vk, 0).unwrap_err(),
            JwtError::UnsupportedAlgorithm("HS256".into())
        );
        let confused = sign_with_alg("RS256", &claims, TokenSignature::Key(&sk)).unwrap();
        assert!(matches!(
            verify::<serde_json::Value>(&confused, &vk, 0).unwrap_err(),
            JwtError::AlgorithmMismatch { .. }
        ));
        let header = b64(genuine.split('.').next().unwrap()).unwrap();
        assert_eq!(header, br#"{"alg":"EdDSA","typ":"JWT"}"#);
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test cases 1, 2 and 6 (a key longer than the block).
        assert_eq!(
            hex::encode(hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert_eq!(
            hex::encode(hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex::encode(hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn rsa_keys_sign_rs256_and_certificates_verify() {
        let text = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/node-rsa.pem"
        ))
        .unwrap();
        let sk = SigningKey::from_key_data(&text).unwrap();
        assert_eq!(sk.algorithm(), "RS256");
        let t = sign(&serde_json::json!({"a": 1}), &sk).unwrap();
        let v: serde_json::Value = verify(&t, &sk.verifying_key(), 0).unwrap();
        assert_eq!(v["a"], 1);
        let (_, ed) = ed_key();
        assert!(matches!(
            verify::<serde_json::Value>(&t, &ed, 0).unwrap_err(),
            JwtError::AlgorithmMismatch { .. }
        ));
    }
}
