//! The cryptography a provisioning-mode server needs: JWT signing and verification (RS256 and
//! EdDSA, issuer chains), KSUIDs, X25519, legacy PEM decryption and CSRs from a reusable RSA
//! key pool.

use std::str::FromStr as _;

use aes::cipher::{block_padding::Pkcs7, BlockDecryptMut as _, KeyIvInit as _};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use base64::Engine as _;
use der::asn1::{Any, SetOfVec};
use der::{Encode as _, Tag};
use ed25519_dalek::{Signer as _, Verifier as _};
use md5::{Digest as _, Md5};
use rsa::pkcs1::{DecodeRsaPrivateKey as _, EncodeRsaPublicKey as _};
use rsa::pkcs8::{DecodePrivateKey as _, DecodePublicKey as _, EncodePublicKey as _};
use rsa::signature::SignatureEncoding as _;
use serde::Serialize;
use sha2::{Sha256, Sha384, Sha512};
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::builder::Builder as _;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::name::{RdnSequence, RelativeDistinguishedName};

/// Why key material could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum CryptoError {
    /// The key or certificate data is not in a supported form.
    #[error("unsupported key data: {0}")]
    Unsupported(String),
    /// Signing or encoding failed.
    #[error("signing failed: {0}")]
    Signing(String),
}

/// A key that signs JWTs the way the Choria tokens library does.
#[derive(Clone)]
pub enum JwtSigner {
    /// An RSA key: RS256.
    Rsa(Box<rsa::pkcs1v15::SigningKey<Sha256>>),
    /// An ed25519 seed: EdDSA.
    Ed25519(Box<ed25519_dalek::SigningKey>),
}

impl JwtSigner {
    /// Load a signer from key file content: an RSA PEM (`RSA PRIVATE KEY` or `PRIVATE KEY`) or a
    /// 64-character hex ed25519 seed.
    pub fn from_key_data(data: &[u8]) -> Result<Self, CryptoError> {
        let text = std::str::from_utf8(data)
            .map_err(|_| CryptoError::Unsupported("key file is not text".into()))?;
        if text.starts_with("-----BEGIN") {
            let key = rsa::RsaPrivateKey::from_pkcs1_pem(text)
                .or_else(|_| rsa::RsaPrivateKey::from_pkcs8_pem(text))
                .map_err(|e| CryptoError::Unsupported(format!("rsa key: {e}")))?;
            return Ok(JwtSigner::Rsa(Box::new(rsa::pkcs1v15::SigningKey::new(
                key,
            ))));
        }
        let seed = decode_hex32(text.trim())
            .ok_or_else(|| CryptoError::Unsupported("neither an rsa pem nor a hex seed".into()))?;
        Ok(JwtSigner::Ed25519(Box::new(
            ed25519_dalek::SigningKey::from_bytes(&seed),
        )))
    }

    /// The JWT `alg` this key produces.
    pub fn algorithm(&self) -> &'static str {
        match self {
            JwtSigner::Rsa(_) => "RS256",
            JwtSigner::Ed25519(_) => "EdDSA",
        }
    }

    /// Sign `claims` into a compact JWT.
    pub fn sign<C: Serialize>(&self, claims: &C) -> Result<String, CryptoError> {
        let header = format!(r#"{{"alg":"{}","typ":"JWT"}}"#, self.algorithm());
        let body = serde_json::to_vec(claims).map_err(|e| CryptoError::Signing(e.to_string()))?;
        let mut input = B64URL.encode(header);
        input.push('.');
        input.push_str(&B64URL.encode(body));
        let sig = match self {
            JwtSigner::Rsa(k) => {
                use rsa::signature::Signer as _;
                k.sign(input.as_bytes()).to_vec()
            }
            JwtSigner::Ed25519(k) => k.sign(input.as_bytes()).to_bytes().to_vec(),
        };
        input.push('.');
        input.push_str(&B64URL.encode(sig));
        Ok(input)
    }
}

/// A public key that verifies JWTs.
#[derive(Clone, Debug)]
pub enum JwtVerifier {
    /// RSA public key (RS256/384/512).
    Rsa(Box<rsa::RsaPublicKey>),
    /// ed25519 public key (EdDSA).
    Ed25519(ed25519_dalek::VerifyingKey),
}

impl JwtVerifier {
    /// Parse public data as the tokens library does: a PEM certificate or public key (RSA),
    /// otherwise 64 hex characters of an ed25519 key. Surrounding whitespace is tolerated.
    pub fn from_public_data(data: &str) -> Result<Self, CryptoError> {
        let text = data.trim();
        if text.starts_with("-----BEGIN CERTIFICATE") {
            let cert = certificate_from_pem(text)
                .map_err(|e| CryptoError::Unsupported(format!("certificate: {e}")))?;
            let spki = cert
                .tbs_certificate
                .subject_public_key_info
                .to_der()
                .map_err(|e| CryptoError::Unsupported(e.to_string()))?;
            let key = rsa::RsaPublicKey::from_public_key_der(&spki)
                .map_err(|e| CryptoError::Unsupported(format!("certificate key: {e}")))?;
            return Ok(JwtVerifier::Rsa(Box::new(key)));
        }
        if text.starts_with("-----BEGIN") {
            use rsa::pkcs1::DecodeRsaPublicKey as _;
            let key = rsa::RsaPublicKey::from_public_key_pem(text)
                .or_else(|_| rsa::RsaPublicKey::from_pkcs1_pem(text))
                .map_err(|e| CryptoError::Unsupported(format!("public key: {e}")))?;
            return Ok(JwtVerifier::Rsa(Box::new(key)));
        }
        let key = decode_hex32(text)
            .ok_or_else(|| CryptoError::Unsupported("not a pem nor 64 hex characters".into()))?;
        ed25519_dalek::VerifyingKey::from_bytes(&key)
            .map(JwtVerifier::Ed25519)
            .map_err(|e| CryptoError::Unsupported(format!("ed25519 key: {e}")))
    }

    /// `value` is a hex key, or the name of a file holding one of the forms
    /// [`JwtVerifier::from_public_data`] accepts.
    pub fn from_hex_or_file(value: &str) -> Result<Self, CryptoError> {
        match std::fs::read_to_string(value) {
            Ok(text) => Self::from_public_data(&text),
            Err(_) => Self::from_public_data(value),
        }
    }

    fn verify_signature(&self, alg: &str, input: &[u8], sig: &[u8]) -> Result<(), String> {
        match (self, alg) {
            (JwtVerifier::Ed25519(k), "EdDSA") => {
                let sig = ed25519_dalek::Signature::from_slice(sig).map_err(|e| e.to_string())?;
                k.verify(input, &sig)
                    .map_err(|_| "signature is invalid".into())
            }
            (JwtVerifier::Rsa(k), "RS256" | "RS384" | "RS512") => {
                let sig = rsa::pkcs1v15::Signature::try_from(sig).map_err(|e| e.to_string())?;
                let key = (**k).clone();
                let ok = match alg {
                    "RS256" => rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key).verify(input, &sig),
                    "RS384" => rsa::pkcs1v15::VerifyingKey::<Sha384>::new(key).verify(input, &sig),
                    _ => rsa::pkcs1v15::VerifyingKey::<Sha512>::new(key).verify(input, &sig),
                };
                ok.map_err(|_| "signature is invalid".into())
            }
            (_, alg) => Err(format!("signing method {alg} is invalid for this key")),
        }
    }
}

fn decode_hex32(text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(text).ok()?;
    bytes.try_into().ok()
}

/// Claims of a compact JWT without verifying anything.
pub fn jwt_claims_unverified(token: &str) -> Result<serde_json::Value, String> {
    let mut parts = token.trim().split('.');
    let _header = parts.next();
    let body = parts.next().ok_or("token has no claims part")?;
    let bytes = B64URL
        .decode(body.trim_end_matches('='))
        .map_err(|e| format!("claims are not base64url: {e}"))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("claims are not json: {e}"))
}

/// Verify a compact JWT's signature with `key` and its `exp`/`nbf` against `now` (Unix
/// seconds), returning its claims.
pub fn verify_jwt(token: &str, key: &JwtVerifier, now: i64) -> Result<serde_json::Value, String> {
    let token = token.trim();
    let (input, sig_b64) = token.rsplit_once('.').ok_or("token is not a compact jwt")?;
    let header_b64 = input.split('.').next().ok_or("token has no header")?;
    let header: serde_json::Value = B64URL
        .decode(header_b64)
        .ok()
        .and_then(|h| serde_json::from_slice(&h).ok())
        .ok_or("token header is not base64url json")?;
    let alg = header.get("alg").and_then(|a| a.as_str()).unwrap_or("");
    let sig = B64URL
        .decode(sig_b64)
        .map_err(|_| "signature is not base64url")?;
    key.verify_signature(alg, input.as_bytes(), &sig)?;
    let claims = jwt_claims_unverified(token)?;
    if let Some(exp) = claims.get("exp").and_then(|v| v.as_i64()) {
        if now >= exp {
            return Err("token has expired".into());
        }
    }
    if let Some(nbf) = claims.get("nbf").and_then(|v| v.as_i64()) {
        if now < nbf {
            return Err("token is not valid yet".into());
        }
    }
    Ok(claims)
}

/// How a server JWT was found to be trustworthy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrustPath {
    /// Issued by a chain issuer (`C-…`) whose credentials the organization issuer signed.
    Chain,
    /// Signed directly by the given key.
    Direct,
}

/// Verify a server JWT against an organization issuer: the chain of a `C-` issuer as the tokens
/// library checks it (issuer signature over the chain credentials, chain signature over the
/// token id, the JWT signed by the chain key, `iat` equal to the KSUID time, `issexp` not
/// passed); any other token must be signed by `issuer` itself.
pub fn verify_server_jwt(
    token: &str,
    issuer: &JwtVerifier,
    now: i64,
) -> Result<(serde_json::Value, TrustPath), String> {
    let claims = jwt_claims_unverified(token)?;
    let iss = claims.get("iss").and_then(|v| v.as_str()).unwrap_or("");
    let Some(chain) = iss.strip_prefix("C-") else {
        return verify_jwt(token, issuer, now).map(|c| (c, TrustPath::Direct));
    };
    let JwtVerifier::Ed25519(org) = issuer else {
        return Err("a chain issued token needs an ed25519 issuer key".into());
    };
    let str_claim = |name: &str| claims.get(name).and_then(|v| v.as_str()).unwrap_or("");
    let (chain_id, chain_pub_hex) = chain
        .split_once('.')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains('.'))
        .ok_or("invalid issuer content")?;
    let chain_pub = decode_hex32(chain_pub_hex).ok_or("invalid public key in issuer data")?;
    let tcs = str_claim("tcs");
    let (org_tcs, chain_sig_hex) = tcs
        .split_once('.')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty() && !b.contains('.'))
        .ok_or("invalid trust chain signature")?;
    let org_sig = hex::decode(org_tcs).map_err(|_| "invalid trust chain signature encoding")?;
    let org_sig = ed25519_dalek::Signature::from_slice(&org_sig).map_err(|e| e.to_string())?;
    org.verify(format!("{chain_id}.{chain_pub_hex}").as_bytes(), &org_sig)
        .map_err(|_| "chain issuer credentials not signed by org issuer")?;
    let chain_key =
        ed25519_dalek::VerifyingKey::from_bytes(&chain_pub).map_err(|e| e.to_string())?;
    let jti = str_claim("jti");
    let chain_sig =
        hex::decode(chain_sig_hex).map_err(|_| "invalid signature in chain signature")?;
    let chain_sig = ed25519_dalek::Signature::from_slice(&chain_sig).map_err(|e| e.to_string())?;
    chain_key
        .verify(format!("{jti}.{org_tcs}").as_bytes(), &chain_sig)
        .map_err(|_| "invalid chain signature")?;
    let issexp = claims
        .get("issexp")
        .and_then(|v| v.as_i64())
        .ok_or("no issuer expires set")?;
    if now >= issexp {
        return Err("issuer has expired".into());
    }
    let iat = claims.get("iat").and_then(|v| v.as_i64());
    if iat.is_none() || iat != ksuid_time(jti) {
        return Err("id is not based on issued time".into());
    }
    let claims = verify_jwt(token, &JwtVerifier::Ed25519(chain_key), now)?;
    Ok((claims, TrustPath::Chain))
}

const KSUID_EPOCH: i64 = 1_400_000_000;
const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A KSUID (27 base62 characters) whose embedded time is `unix_secs`.
pub fn ksuid(unix_secs: i64) -> String {
    let mut raw = [0u8; 20];
    let ts = u32::try_from(unix_secs - KSUID_EPOCH).unwrap_or(0);
    raw[..4].copy_from_slice(&ts.to_be_bytes());
    rand::Rng::fill(&mut rand::thread_rng(), &mut raw[4..]);
    // Repeated division of the 160-bit big-endian number by 62.
    let mut digits = [b'0'; 27];
    let mut num = raw;
    for slot in digits.iter_mut().rev() {
        let mut rem: u32 = 0;
        for byte in num.iter_mut() {
            let acc = (rem << 8) | u32::from(*byte);
            *byte = u8::try_from(acc / 62).unwrap_or(0);
            rem = acc % 62;
        }
        *slot = BASE62[rem as usize % 62];
    }
    String::from_utf8_lossy(&digits).into_owned()
}

/// The Unix time embedded in a KSUID, if it is one.
pub fn ksuid_time(id: &str) -> Option<i64> {
    if id.len() != 27 {
        return None;
    }
    let mut num = [0u8; 20];
    for c in id.bytes() {
        let d = BASE62.iter().position(|&b| b == c)?;
        let mut carry = u32::try_from(d).ok()?;
        for byte in num.iter_mut().rev() {
            let acc = u32::from(*byte) * 62 + carry;
            *byte = (acc & 0xff) as u8;
            carry = acc >> 8;
        }
        if carry != 0 {
            return None;
        }
    }
    let ts = u32::from_be_bytes([num[0], num[1], num[2], num[3]]);
    Some(i64::from(ts) + KSUID_EPOCH)
}

/// A fresh X25519 key pair: (private, public).
pub fn x25519_pair() -> ([u8; 32], [u8; 32]) {
    let secret = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
    let public = x25519_dalek::PublicKey::from(&secret);
    (secret.to_bytes(), public.to_bytes())
}

/// X25519 shared secret of our private key and the peer's hex public key. As go-choria's
/// X25519 (Go's `crypto/ecdh`, whose wording the errors use), a key that is not 32 bytes and a
/// low-order key (all-zero shared secret, not contributory) are refused.
pub fn x25519_shared(private: &[u8; 32], peer_hex: &str) -> Result<[u8; 32], String> {
    let peer = hex::decode(peer_hex).map_err(|e| format!("encoding/hex: {e}"))?;
    let peer: [u8; 32] = peer
        .try_into()
        .map_err(|_| "crypto/ecdh: invalid public key".to_string())?;
    let shared = x25519_dalek::StaticSecret::from(*private)
        .diffie_hellman(&x25519_dalek::PublicKey::from(peer));
    if !shared.was_contributory() {
        return Err("crypto/ecdh: bad X25519 remote ECDH input: low order point".to_string());
    }
    Ok(shared.to_bytes())
}

/// Decrypt a legacy (RFC 1423) encrypted PEM block with `password`, as Go's
/// `x509.DecryptPEMBlock` does, and return it re-wrapped as an unencrypted `RSA PRIVATE KEY`
/// PEM. Errors use Go's wording where a Go server's would be seen.
pub fn decrypt_legacy_pem(text: &str, password: &[u8]) -> Result<String, String> {
    let block = pem::parse(text).map_err(|_| "bad key received".to_string())?;
    let dek = block
        .headers()
        .get("DEK-Info")
        .ok_or_else(|| "key is not encrypted".to_string())?;
    let (cipher, iv_hex) = dek
        .split_once(',')
        .ok_or_else(|| "x509: malformed DEK-Info header".to_string())?;
    let key_len = match cipher {
        "AES-128-CBC" => 16,
        "AES-192-CBC" => 24,
        "AES-256-CBC" => 32,
        _ => return Err("x509: unknown encryption mode".into()),
    };
    let iv = hex::decode(iv_hex).map_err(|e| format!("encoding/hex: {e}"))?;
    let iv: [u8; 16] = iv
        .try_into()
        .map_err(|_| "x509: incorrect IV size".to_string())?;
    // OpenSSL EVP_BytesToKey with MD5, one round, salt = first 8 bytes of the IV.
    let mut key = Vec::with_capacity(32);
    let mut prev: Vec<u8> = Vec::new();
    while key.len() < key_len {
        let mut h = Md5::new();
        h.update(&prev);
        h.update(password);
        h.update(&iv[..8]);
        prev = h.finalize().to_vec();
        key.extend_from_slice(&prev);
    }
    key.truncate(key_len);
    let data = block.contents();
    if data.is_empty() || data.len() % 16 != 0 {
        return Err("x509: encrypted PEM data is not a multiple of the block size".into());
    }
    let incorrect = || "x509: decryption password incorrect".to_string();
    let plain = match key_len {
        16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(&key, &iv)
            .map_err(|_| incorrect())?
            .decrypt_padded_vec_mut::<Pkcs7>(data),
        24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(&key, &iv)
            .map_err(|_| incorrect())?
            .decrypt_padded_vec_mut::<Pkcs7>(data),
        _ => cbc::Decryptor::<aes::Aes256>::new_from_slices(&key, &iv)
            .map_err(|_| incorrect())?
            .decrypt_padded_vec_mut::<Pkcs7>(data),
    }
    .map_err(|_| incorrect())?;
    Ok(pem_lf(&pem::Pem::new("RSA PRIVATE KEY", plain)))
}

/// PEM with `\n` line endings and 64-column lines, as Go's `pem.Encode` writes.
pub fn pem_lf(block: &pem::Pem) -> String {
    pem::encode_config(
        block,
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// One pre-generated RSA key and what gencsr replies derive from it.
pub struct PoolKey {
    signing: rsa::pkcs1v15::SigningKey<Sha256>,
    /// PKCS#1 public key in a `PUBLIC KEY` PEM, as go-choria's gencsr replies.
    pub public_pem: String,
    /// DER SubjectPublicKeyInfo, to compare with a certificate's key.
    pub spki_der: Vec<u8>,
}

impl PoolKey {
    /// Wrap a private key.
    pub fn new(key: rsa::RsaPrivateKey) -> Result<Self, CryptoError> {
        let public = key.to_public_key();
        let pkcs1 = public
            .to_pkcs1_der()
            .map_err(|e| CryptoError::Signing(e.to_string()))?;
        let spki_der = public
            .to_public_key_der()
            .map_err(|e| CryptoError::Signing(e.to_string()))?
            .into_vec();
        Ok(PoolKey {
            signing: rsa::pkcs1v15::SigningKey::new(key),
            public_pem: pem_lf(&pem::Pem::new("PUBLIC KEY", pkcs1.as_bytes())),
            spki_der,
        })
    }

    /// Generate a fresh 2048-bit key (slow: seconds without optimisation).
    pub fn generate() -> Result<Self, CryptoError> {
        let key = rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048)
            .map_err(|e| CryptoError::Signing(e.to_string()))?;
        Self::new(key)
    }

    /// Keys from PEM text holding one or more `RSA PRIVATE KEY` / `PRIVATE KEY` blocks.
    pub fn from_pem_many(text: &str) -> Result<Vec<Self>, CryptoError> {
        let blocks = pem::parse_many(text).map_err(|e| CryptoError::Unsupported(e.to_string()))?;
        blocks
            .iter()
            .map(|b| {
                let key = match b.tag() {
                    "RSA PRIVATE KEY" => rsa::RsaPrivateKey::from_pkcs1_der(b.contents())
                        .map_err(|e| CryptoError::Unsupported(e.to_string()))?,
                    "PRIVATE KEY" => rsa::RsaPrivateKey::from_pkcs8_der(b.contents())
                        .map_err(|e| CryptoError::Unsupported(e.to_string()))?,
                    other => return Err(CryptoError::Unsupported(format!("pem block {other}"))),
                };
                Self::new(key)
            })
            .collect()
    }

    /// A PEM CSR signed SHA256-with-RSA whose subject is C, L, O, OU (when non-empty) and CN,
    /// in the order Go's `pkix.Name` writes them, with `dns_names` as a subject alternative
    /// name extension when there are any.
    pub fn csr(
        &self,
        cn: &str,
        c: &str,
        l: &str,
        o: &str,
        ou: &str,
        dns_names: &[String],
    ) -> Result<String, CryptoError> {
        let mut rdns = Vec::new();
        for (oid, value) in [
            ("2.5.4.6", c),
            ("2.5.4.7", l),
            ("2.5.4.10", o),
            ("2.5.4.11", ou),
            ("2.5.4.3", cn),
        ] {
            if value.is_empty() && oid != "2.5.4.3" {
                continue;
            }
            let printable = value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b));
            let tag = if printable {
                Tag::PrintableString
            } else {
                Tag::Utf8String
            };
            let atv = AttributeTypeAndValue {
                oid: ObjectIdentifier::from_str(oid)
                    .map_err(|e| CryptoError::Signing(e.to_string()))?,
                value: Any::new(tag, value.as_bytes())
                    .map_err(|e| CryptoError::Signing(e.to_string()))?,
            };
            let set =
                SetOfVec::try_from(vec![atv]).map_err(|e| CryptoError::Signing(e.to_string()))?;
            rdns.push(RelativeDistinguishedName(set));
        }
        let mut builder = x509_cert::builder::RequestBuilder::new(RdnSequence(rdns), &self.signing)
            .map_err(|e| CryptoError::Signing(e.to_string()))?;
        if !dns_names.is_empty() {
            let names = dns_names
                .iter()
                .map(|n| {
                    der::asn1::Ia5String::new(n)
                        .map(x509_cert::ext::pkix::name::GeneralName::DnsName)
                        .map_err(|e| CryptoError::Signing(e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            builder
                .add_extension(&x509_cert::ext::pkix::SubjectAltName(names))
                .map_err(|e| CryptoError::Signing(e.to_string()))?;
        }
        let req = builder
            .build::<rsa::pkcs1v15::Signature>()
            .map_err(|e| CryptoError::Signing(e.to_string()))?;
        let der = req
            .to_der()
            .map_err(|e| CryptoError::Signing(e.to_string()))?;
        Ok(pem_lf(&pem::Pem::new("CERTIFICATE REQUEST", der)))
    }
}

/// A PEM certificate, decoded armour first and DER second: `der`'s streaming PEM reader can
/// loop forever on DER that ends inside a header, and certificates reach the simulator from
/// the provisioner and its helper.
pub fn certificate_from_pem(text: &str) -> Result<x509_cert::Certificate, String> {
    use der::Decode as _;
    let (label, der) = der::pem::decode_vec(text.trim().as_bytes()).map_err(|e| e.to_string())?;
    if label != "CERTIFICATE" {
        return Err(format!("PEM type label {label:?} is not CERTIFICATE"));
    }
    x509_cert::Certificate::from_der(&der).map_err(|e| e.to_string())
}

/// The same PEM document with the last byte of its DER flipped: for a CSR or certificate that
/// is the end of the signature, so the document still parses but no longer verifies.
pub fn break_pem_signature(pem_text: &str) -> Option<String> {
    let (label, mut der) = der::pem::decode_vec(pem_text.as_bytes()).ok()?;
    let last = der.last_mut()?;
    *last ^= 0x01;
    der::pem::encode_string(label, der::pem::LineEnding::LF, &der).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ksuid_round_trips_its_time() {
        let id = ksuid(1_718_000_000);
        assert_eq!(id.len(), 27);
        assert_eq!(ksuid_time(&id), Some(1_718_000_000));
        assert_eq!(ksuid_time("short"), None);
    }

    #[test]
    fn go_choria_x25519_vector_gives_the_shared_secret() {
        let server: [u8; 32] =
            hex::decode("67e4a9b3934a3030470ed7a30f89eeaf7dab7b492aa9ee02fb864d690b7e6eeb")
                .unwrap()
                .try_into()
                .unwrap();
        let shared = x25519_shared(
            &server,
            "c25fab933b16b2a4589e2c2d297669b818c82881f2f9bfd08cb8fd298924a41b",
        )
        .unwrap();
        assert_eq!(
            hex::encode(shared),
            "53a4887b448755a3f0a0618b289eb2369ec4b2461d44890abdfa3084ef080c55"
        );
    }

    #[test]
    fn low_order_and_malformed_peer_keys_are_refused() {
        let private = [0x5a; 32];
        // 0, 1, the two order-8 points, p - 1, p, p + 1, each also with the ignored top bit set.
        let low_order = [
            "0000000000000000000000000000000000000000000000000000000000000000",
            "0000000000000000000000000000000000000000000000000000000000000080",
            "0100000000000000000000000000000000000000000000000000000000000000",
            "0100000000000000000000000000000000000000000000000000000000000080",
            "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
            "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b880",
            "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
            "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f11d7",
            "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        ];
        for point in low_order {
            assert_eq!(
                x25519_shared(&private, point).unwrap_err(),
                "crypto/ecdh: bad X25519 remote ECDH input: low order point",
                "{point}"
            );
        }
        let good = "c25fab933b16b2a4589e2c2d297669b818c82881f2f9bfd08cb8fd298924a41b";
        assert!(x25519_shared(&private, good).is_ok());
        assert_eq!(
            x25519_shared(&private, &good[..62]).unwrap_err(),
            "crypto/ecdh: invalid public key"
        );
        assert!(x25519_shared(&private, "zz")
            .unwrap_err()
            .starts_with("encoding/hex: "));
    }

    #[test]
    fn eddsa_tokens_verify_and_tampering_is_caught() {
        let seed = [7u8; 32];
        let signer = JwtSigner::from_key_data(hex::encode(seed).as_bytes()).unwrap();
        let claims = serde_json::json!({"purpose": "x", "exp": 4_000_000_000i64});
        let token = signer.sign(&claims).unwrap();
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
        let key = JwtVerifier::from_public_data(&hex::encode(public.as_bytes())).unwrap();
        assert_eq!(verify_jwt(&token, &key, 1).unwrap()["purpose"], "x");
        let mut bad = token.clone();
        bad.push('A');
        assert!(verify_jwt(&bad, &key, 1).is_err());
        assert!(verify_jwt(&token, &key, 4_000_000_000).is_err());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod csr_tests {
    use super::*;

    /// The CSR verifies under its own key and carries the subject in Go's RDN order.
    #[test]
    fn a_broken_csr_signature_parses_but_does_not_verify() {
        use der::Decode as _;
        use rsa::signature::Verifier as _;
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/rsa-pool.pem"
        ))
        .unwrap();
        let keys = PoolKey::from_pem_many(&text).unwrap();
        let good = keys[0].csr("n1.example.net", "", "", "", "", &[]).unwrap();
        let bad = break_pem_signature(&good).unwrap();
        let verifies = |pem_text: &str| {
            let (_, der) = der::pem::decode_vec(pem_text.as_bytes()).unwrap();
            let req = x509_cert::request::CertReq::from_der(&der).unwrap();
            let info = der::Encode::to_der(&req.info).unwrap();
            let spki = der::Encode::to_der(&req.info.public_key).unwrap();
            let key =
                <rsa::RsaPublicKey as rsa::pkcs8::DecodePublicKey>::from_public_key_der(&spki)
                    .unwrap();
            let sig = rsa::pkcs1v15::Signature::try_from(req.signature.raw_bytes()).unwrap();
            rsa::pkcs1v15::VerifyingKey::<sha2::Sha256>::new(key)
                .verify(&info, &sig)
                .is_ok()
        };
        assert!(verifies(&good));
        assert!(!verifies(&bad));
    }

    #[test]
    fn csr_is_self_signed_with_the_pool_key() {
        use der::Decode as _;
        use rsa::signature::Verifier as _;
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/rsa-pool.pem"
        ))
        .unwrap();
        let keys = PoolKey::from_pem_many(&text).unwrap();
        assert_eq!(keys.len(), 2);
        let pem_text = keys[0]
            .csr("n1.example.net", "NL", "", "Org", "", &[])
            .unwrap();
        let block = pem::parse(&pem_text).unwrap();
        let req = x509_cert::request::CertReq::from_der(block.contents()).unwrap();
        assert_eq!(req.info.subject.to_string(), "CN=n1.example.net,O=Org,C=NL");
        let info = req.info.to_der().unwrap();
        let spki = req.info.public_key.to_der().unwrap();
        assert_eq!(spki, keys[0].spki_der);
        let key = rsa::RsaPublicKey::from_public_key_der(&spki).unwrap();
        let sig = rsa::pkcs1v15::Signature::try_from(req.signature.raw_bytes()).unwrap();
        rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key)
            .verify(&info, &sig)
            .unwrap();
        assert!(keys[0]
            .public_pem
            .starts_with("-----BEGIN PUBLIC KEY-----\n"));
    }

    #[test]
    fn a_truncated_certificate_is_an_error_not_a_hang() {
        // DER that stops inside its first header, the input that once made der's streaming PEM
        // reader spin; run on a thread so a regression fails instead of hanging the suite.
        let truncated =
            der::pem::encode_string("CERTIFICATE", der::pem::LineEnding::LF, &[0x30, 0x82])
                .unwrap();
        let refused = test_support::returns_within(
            "certificate_from_pem",
            std::time::Duration::from_secs(5),
            move || certificate_from_pem(&truncated).is_err(),
        );
        assert!(refused);
        assert!(certificate_from_pem(
            "-----BEGIN PUBLIC KEY-----\nAA==\n-----END PUBLIC KEY-----\n"
        )
        .is_err());
    }

    #[test]
    fn csr_carries_the_dns_names_asked_for_and_still_verifies() {
        use der::Decode as _;
        use rsa::signature::Verifier as _;
        use x509_cert::ext::pkix::name::GeneralName;
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/rsa-pool.pem"
        ))
        .unwrap();
        let keys = PoolKey::from_pem_many(&text).unwrap();
        let names = vec!["n1.privileged.choria".to_string(), "n1.web".to_string()];
        let pem_text = keys[0]
            .csr("n1.example.net", "", "", "", "", &names)
            .unwrap();
        let block = pem::parse(&pem_text).unwrap();
        let req = x509_cert::request::CertReq::from_der(block.contents()).unwrap();
        let info = req.info.to_der().unwrap();
        let key = rsa::RsaPublicKey::from_public_key_der(&keys[0].spki_der).unwrap();
        let sig = rsa::pkcs1v15::Signature::try_from(req.signature.raw_bytes()).unwrap();
        rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key)
            .verify(&info, &sig)
            .unwrap();
        // One extensionRequest attribute holding one subjectAltName extension.
        let attr = req.info.attributes.iter().next().unwrap();
        assert_eq!(attr.oid.to_string(), "1.2.840.113549.1.9.14");
        let exts: x509_cert::ext::Extensions =
            attr.values.iter().next().unwrap().decode_as().unwrap();
        assert_eq!(exts.len(), 1);
        assert_eq!(exts[0].extn_id.to_string(), "2.5.29.17");
        let san =
            x509_cert::ext::pkix::SubjectAltName::from_der(exts[0].extn_value.as_bytes()).unwrap();
        let got: Vec<String> = san
            .0
            .iter()
            .map(|g| match g {
                GeneralName::DnsName(n) => n.to_string(),
                other => panic!("unexpected name {other:?}"),
            })
            .collect();
        assert_eq!(got, names);
    }
}
