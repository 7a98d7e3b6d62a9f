//! A small JWT implementation covering what Choria uses: RS256/RS384/RS512 and EdDSA (ed25519),
//! compact serialisation only.
//!
//! It is written directly on `rsa`, `ed25519-dalek` and `sha2` rather than on a JWT crate because
//! the usual choice, `jwt-simple`, builds BoringSSL by default, which would drag a C toolchain
//! into every build of the provisioner. Verification is strict: the algorithm must be one of the
//! four above *and* fit the key it is checked with, so `alg: none` and algorithm confusion (an
//! HMAC token "signed" with a public key) are refused before any signature is looked at.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signer as _, Verifier as _};
use rsa::pkcs1::{DecodeRsaPrivateKey, DecodeRsaPublicKey};
use rsa::pkcs8::{DecodePrivateKey, DecodePublicKey};
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
            // Armour first, DER second: der's streaming PEM reader spins on truncated DER.
            let (label, der) = der::pem::decode_vec(text.trim().as_bytes())
                .map_err(|e| JwtError::Key(format!("could not parse certificate: {e}")))?;
            if label != "CERTIFICATE" {
                return Err(JwtError::Key(format!(
                    "could not parse certificate: PEM type label {label:?}"
                )));
            }
            let cert = <x509_cert::Certificate as der::Decode>::from_der(&der)
                .map_err(|e| JwtError::Key(format!("could not parse certificate: {e}")))?;
            let spki = der::Encode::to_der(&cert.tbs_certificate.subject_public_key_info)
                .map_err(|e| JwtError::Key(e.to_string()))?;
            let key = RsaPublicKey::from_public_key_der(&spki)
                .map_err(|e| JwtError::Key(format!("certificate does not hold an RSA key: {e}")))?;
            return Ok(VerifyingKey::Rsa(Box::new(key)));
        }
        if data.starts_with(b"-----BEGIN PUBLIC KEY") {
            let text = std::str::from_utf8(data).map_err(|_| JwtError::Key("not UTF-8".into()))?;
            let key = RsaPublicKey::from_public_key_pem(text).or_else(|_| {
                // Some tools write PKCS#1 under the generic label.
                let p = pem::parse(text).map_err(|e| JwtError::Key(e.to_string()))?;
                RsaPublicKey::from_pkcs1_der(p.contents())
                    .map_err(|e| JwtError::Key(format!("not an RSA public key: {e}")))
            })?;
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

/// A key that signs tokens.
#[derive(Clone, Debug)]
pub enum SigningKey {
    /// Signs RS256.
    Rsa(Box<RsaPrivateKey>),
    /// Signs EdDSA.
    Ed25519(Box<ed25519_dalek::SigningKey>),
}

impl SigningKey {
    /// Reads a signing key file's content as the tokens package does: `-----BEGIN RSA PRIVATE
    /// KEY` (PKCS#1) or `-----BEGIN PRIVATE KEY` (PKCS#8) is RSA, exactly 64 bytes of hex is an
    /// ed25519 seed; anything else is refused.
    pub fn from_key_data(data: &[u8]) -> Result<Self, JwtError> {
        if data.starts_with(b"-----BEGIN RSA PRIVATE KEY") {
            let text = std::str::from_utf8(data).map_err(|_| JwtError::Key("not UTF-8".into()))?;
            let k = RsaPrivateKey::from_pkcs1_pem(text)
                .map_err(|e| JwtError::Key(format!("could not parse RSA private key: {e}")))?;
            return Ok(SigningKey::Rsa(Box::new(k)));
        }
        if data.starts_with(b"-----BEGIN PRIVATE KEY") {
            let text = std::str::from_utf8(data).map_err(|_| JwtError::Key("not UTF-8".into()))?;
            let k = RsaPrivateKey::from_pkcs8_pem(text)
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

    /// The algorithm this key signs with.
    pub fn algorithm(&self) -> &'static str {
        match self {
            SigningKey::Rsa(_) => "RS256",
            SigningKey::Ed25519(_) => "EdDSA",
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
    let header = serde_json::to_vec(&Header {
        alg: key.algorithm().to_string(),
        typ: Some("JWT".to_string()),
    })
    .map_err(|e| JwtError::Malformed(e.to_string()))?;
    let body = serde_json::to_vec(claims).map_err(|e| JwtError::Malformed(e.to_string()))?;
    let mut out = URL_SAFE_NO_PAD.encode(header);
    out.push('.');
    out.push_str(&URL_SAFE_NO_PAD.encode(body));
    let sig = match key {
        SigningKey::Rsa(k) => k
            .sign(
                Pkcs1v15Sign::new::<Sha256>(),
                &Sha256::digest(out.as_bytes()),
            )
            .map_err(|e| JwtError::Key(e.to_string()))?,
        SigningKey::Ed25519(k) => k.sign(out.as_bytes()).to_bytes().to_vec(),
    };
    out.push('.');
    out.push_str(&URL_SAFE_NO_PAD.encode(sig));
    Ok(out)
}

/// Registered time claims, read for validation.
#[derive(Deserialize)]
struct TimeClaims {
    #[serde(default)]
    exp: Option<f64>,
    #[serde(default)]
    nbf: Option<f64>,
}

fn b64(part: &str) -> Result<Vec<u8>, JwtError> {
    URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .map_err(|e| JwtError::Malformed(format!("invalid base64: {e}")))
}

/// Verifies `token` with `key`, checks `exp` and `nbf` against `now` (Unix seconds, no leeway, as
/// golang-jwt v5) and decodes the claims.
pub fn verify<C: DeserializeOwned>(
    token: &str,
    key: &VerifyingKey,
    now: i64,
) -> Result<C, JwtError> {
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
    let sig = b64(s)?;
    match (header.alg.as_str(), key) {
        ("RS256", VerifyingKey::Rsa(k)) => rsa_verify::<Sha256>(k, signed, &sig)?,
        ("RS384", VerifyingKey::Rsa(k)) => rsa_verify::<Sha384>(k, signed, &sig)?,
        ("RS512", VerifyingKey::Rsa(k)) => rsa_verify::<Sha512>(k, signed, &sig)?,
        ("EdDSA", VerifyingKey::Ed25519(k)) => {
            let sig =
                ed25519_dalek::Signature::from_slice(&sig).map_err(|_| JwtError::BadSignature)?;
            k.verify(signed.as_bytes(), &sig)
                .map_err(|_| JwtError::BadSignature)?;
        }
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
    let body = b64(c)?;
    let times: TimeClaims = serde_json::from_slice(&body)
        .map_err(|e| JwtError::Malformed(format!("invalid claims: {e}")))?;
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
    serde_json::from_slice(&body).map_err(|e| JwtError::Malformed(format!("invalid claims: {e}")))
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

/// A new KSUID (as the tokens package uses for `jti`) whose embedded time is `unix_secs`.
pub fn ksuid(unix_secs: i64) -> String {
    const EPOCH: i64 = 1_400_000_000;
    const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut bytes = [0u8; 20];
    let ts = u32::try_from(unix_secs - EPOCH).unwrap_or(0);
    bytes[..4].copy_from_slice(&ts.to_be_bytes());
    rand::Rng::fill(&mut rand::thread_rng(), &mut bytes[4..]);
    // Base62 of the 160-bit big-endian number, left padded with '0' to 27 characters.
    let mut num = bytes.to_vec();
    let mut out = Vec::with_capacity(27);
    while num.iter().any(|&b| b != 0) {
        let mut rem = 0u32;
        for b in num.iter_mut() {
            let acc = (rem << 8) | u32::from(*b);
            *b = (acc / 62) as u8;
            rem = acc % 62;
        }
        out.push(ALPHABET[rem as usize]);
    }
    while out.len() < 27 {
        out.push(b'0');
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// The Unix time embedded in a KSUID, if it is one.
pub fn ksuid_time(id: &str) -> Option<i64> {
    if id.len() != 27 {
        return None;
    }
    let mut num = [0u8; 20];
    for c in id.bytes() {
        let v = match c {
            b'0'..=b'9' => c - b'0',
            b'A'..=b'Z' => c - b'A' + 10,
            b'a'..=b'z' => c - b'a' + 36,
            _ => return None,
        };
        let mut carry = u32::from(v);
        for b in num.iter_mut().rev() {
            let acc = u32::from(*b) * 62 + carry;
            *b = (acc & 0xff) as u8;
            carry = acc >> 8;
        }
        if carry != 0 {
            return None;
        }
    }
    let ts = u32::from_be_bytes([num[0], num[1], num[2], num[3]]);
    Some(i64::from(ts) + 1_400_000_000)
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
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims),
            URL_SAFE_NO_PAD.encode(sig)
        )
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
            URL_SAFE_NO_PAD.encode(r#"{"alg":"RS256"}"#),
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
            URL_SAFE_NO_PAD.encode(r#"{"a":2}"#),
            parts[2]
        );
        assert_eq!(
            verify::<serde_json::Value>(&t, &vk, 0).unwrap_err(),
            JwtError::BadSignature
        );
    }

    #[test]
    fn ksuid_embeds_the_time() {
        let id = ksuid(1_718_000_000);
        assert_eq!(id.len(), 27);
        assert_eq!(ksuid_time(&id), Some(1_718_000_000));
        // A known KSUID from the reference implementation's documentation.
        assert_eq!(
            ksuid_time("0ujtsYcgvSTl8PAuAdqWYSMnLOv"),
            Some(1_507_608_047)
        );
    }
}
