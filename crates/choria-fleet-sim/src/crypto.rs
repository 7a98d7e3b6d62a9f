//! The cryptography a provisioning-mode server needs, as go-choria's server behaves: which
//! keys it loads, how it checks a server JWT and its issuer chain, what it says when a key
//! exchange or a decryption fails, and CSRs from a reusable RSA key pool. The primitives
//! (JWTs, KSUIDs, X25519, the legacy PEM decryption, PEM) are `choria-crypto`'s; this module
//! only imitates the server around them.

use std::str::FromStr as _;

use choria_crypto::jwt::{self, JwtError};
use choria_crypto::keyenc::{KeyEncError, LegacyPemError};
use choria_crypto::x25519::EcdhError;
use der::asn1::{Any, SetOfVec};
use der::{Encode as _, Tag};
use ed25519_dalek::Verifier as _;
use rsa::pkcs1::{DecodeRsaPrivateKey as _, EncodeRsaPublicKey as _};
use rsa::pkcs8::{DecodePrivateKey as _, EncodePublicKey as _};
use serde::Serialize;
use sha2::Sha256;
use x509_cert::attr::AttributeTypeAndValue;
use x509_cert::builder::Builder as _;
use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::name::{RdnSequence, RelativeDistinguishedName};

pub use choria_crypto::ksuid::{ksuid, ksuid_time};
pub use choria_crypto::x25519::generate as x25519_pair;

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

/// A key that signs JWTs the way the Choria tokens library does: RS256 or EdDSA.
#[derive(Clone, Debug)]
pub struct JwtSigner(pub jwt::SigningKey);

impl JwtSigner {
    /// Load a signer from key file content (surrounding whitespace ignored): an RSA PEM
    /// (`RSA PRIVATE KEY` or `PRIVATE KEY`) or a 64-character hex ed25519 seed.
    pub fn from_key_data(data: &[u8]) -> Result<Self, CryptoError> {
        jwt::SigningKey::from_key_data(data.trim_ascii())
            .map(JwtSigner)
            .map_err(|e| CryptoError::Unsupported(e.to_string()))
    }

    /// An EdDSA signer.
    pub fn ed25519(key: ed25519_dalek::SigningKey) -> Self {
        JwtSigner(jwt::SigningKey::Ed25519(Box::new(key)))
    }

    /// The JWT `alg` this key produces.
    pub fn algorithm(&self) -> &'static str {
        self.0.algorithm()
    }

    /// Sign `claims` into a compact JWT.
    pub fn sign<C: Serialize>(&self, claims: &C) -> Result<String, CryptoError> {
        jwt::sign(claims, &self.0).map_err(|e| CryptoError::Signing(e.to_string()))
    }
}

/// A public key that verifies JWTs: RSA (RS256/384/512) or ed25519 (EdDSA).
pub type JwtVerifier = jwt::VerifyingKey;

/// Parse public data as the tokens library does (surrounding whitespace ignored): a PEM
/// certificate or public key (RSA), otherwise 64 hex characters of an ed25519 key.
pub fn verifier_from_public_data(text: &str) -> Result<JwtVerifier, CryptoError> {
    jwt::VerifyingKey::from_public_data(text.trim().as_bytes())
        .map_err(|e| CryptoError::Unsupported(e.to_string()))
}

/// `value` is a hex key, or the name of a file holding one of the forms
/// [`verifier_from_public_data`] accepts.
pub fn verifier_from_hex_or_file(value: &str) -> Result<JwtVerifier, CryptoError> {
    match std::fs::read_to_string(value) {
        Ok(text) => verifier_from_public_data(&text),
        Err(_) => verifier_from_public_data(value),
    }
}

/// Claims of a compact JWT without verifying anything.
pub fn jwt_claims_unverified(token: &str) -> Result<serde_json::Value, String> {
    jwt::decode_unverified(token).map_err(|e: JwtError| e.to_string())
}

/// Verify a compact JWT's signature with `key` and its `exp`/`nbf` against `now` (Unix
/// seconds), returning its claims.
pub fn verify_jwt(token: &str, key: &JwtVerifier, now: i64) -> Result<serde_json::Value, String> {
    jwt::verify(token, key, now).map_err(|e| e.to_string())
}

fn decode_hex32(text: &str) -> Option<[u8; 32]> {
    hex::decode(text).ok()?.try_into().ok()
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

/// Chain issuer credentials as the org issuer signed them: its key, the signed text, the
/// signature.
type OrgSigned = ([u8; 32], String, Vec<u8>);

thread_local! {
    /// The chain issuer credentials (org key, signed text, signature) the org issuer's
    /// signature last verified for: every server JWT one provisioner signs carries the same
    /// ones, so each node does not check the same signature again (the JWT's own signature and
    /// the chain signature over its id are checked for every node), with the chain issuer's key
    /// they carry, decoded once.
    static ORG_VERIFIED: std::cell::RefCell<Option<(OrgSigned, ed25519_dalek::VerifyingKey)>> =
        const { std::cell::RefCell::new(None) };
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
    let org_sig_bytes =
        hex::decode(org_tcs).map_err(|_| "invalid trust chain signature encoding")?;
    let org_sig =
        ed25519_dalek::Signature::from_slice(&org_sig_bytes).map_err(|e| e.to_string())?;
    let signed = format!("{chain_id}.{chain_pub_hex}");
    let seen = (org.to_bytes(), signed, org_sig_bytes);
    let known = ORG_VERIFIED.with(|v| {
        v.borrow()
            .as_ref()
            .filter(|(s, _)| *s == seen)
            .map(|(_, key)| *key)
    });
    let chain_key = match known {
        Some(key) => key,
        None => {
            org.verify(seen.1.as_bytes(), &org_sig)
                .map_err(|_| "chain issuer credentials not signed by org issuer")?;
            let key =
                ed25519_dalek::VerifyingKey::from_bytes(&chain_pub).map_err(|e| e.to_string())?;
            ORG_VERIFIED.with(|v| *v.borrow_mut() = Some((seen, key)));
            key
        }
    };
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

/// The node's side of a key delivery, as go-choria's server does it: the encrypted PEM block
/// `key` decrypted with the X25519 secret of the node's private key and the provisioner's hex
/// `ecdh_public` ([`choria_crypto::keyenc::decrypt_private_key`]), returned re-wrapped as an
/// unencrypted `RSA PRIVATE KEY` PEM. A failure is worded as go-choria's server words it.
pub fn decrypt_delivered_key(
    key: &str,
    private: &[u8; 32],
    ecdh_public: &str,
) -> Result<String, String> {
    match choria_crypto::keyenc::decrypt_private_key(key, private, ecdh_public) {
        Ok(der) => Ok(choria_crypto::pem::encode("RSA PRIVATE KEY", der)),
        Err(e) => Err(go_words(&e)),
    }
}

/// What go-choria's server says of a key delivery that failed: Go's `crypto/ecdh` and
/// `encoding/hex` for the peer's key, `x509.DecryptPEMBlock` for the block.
fn go_words(e: &KeyEncError) -> String {
    match e {
        KeyEncError::Ecdh(EcdhError::LowOrder { .. }) => {
            "crypto/ecdh: bad X25519 remote ECDH input: low order point".into()
        }
        KeyEncError::Ecdh(EcdhError::Length { .. }) => "crypto/ecdh: invalid public key".into(),
        KeyEncError::Ecdh(EcdhError::NotHex { .. }) => "encoding/hex: invalid byte".into(),
        KeyEncError::Pem(LegacyPemError::NotPem) | KeyEncError::BadKey => "bad key received".into(),
        other => other.to_string(),
    }
}

/// The most node key pairs made when a fleet starts; a larger fleet shares them.
pub const NODE_KEY_POOL: usize = 16_384;

/// Key pairs made when the fleet starts, before any request, so that `jwt` and `gen25519`
/// answer with a key already made (the keys a real server makes at that moment are
/// random to the provisioner either way). Node `i` uses pair `i + reprovisions` of the pool,
/// so a node has a new pair after each `reprovision`.
pub struct NodeKeys {
    /// The `jwt` action's X25519 pair (private, public).
    pub ecdh: ([u8; 32], [u8; 32]),
    /// The `gen25519` action's key (ed25519 fleets only), with the commitment of its first
    /// signature made with it, so the node's reply costs no curve multiplication.
    pub ed25519: Option<choria_crypto::nonce::PreparedSigner>,
}

impl NodeKeys {
    /// `n` pairs, with ed25519 keys when `ed25519`.
    pub fn pool(n: usize, ed25519: bool) -> Vec<NodeKeys> {
        let mut rng = rand::thread_rng();
        (0..n)
            .map(|_| NodeKeys {
                ecdh: x25519_pair(),
                ed25519: ed25519.then(|| {
                    let key = ed25519_dalek::SigningKey::generate(&mut rng);
                    choria_crypto::nonce::PreparedSigner::new(key, &mut rng)
                }),
            })
            .collect()
    }
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
            public_pem: choria_crypto::pem::encode("PUBLIC KEY", pkcs1.as_bytes()),
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
        let blocks = choria_crypto::pem::decode_many(text)
            .map_err(|e| CryptoError::Unsupported(e.to_string()))?;
        blocks
            .iter()
            .map(|(label, der)| {
                let key = match label.as_str() {
                    "RSA PRIVATE KEY" => rsa::RsaPrivateKey::from_pkcs1_der(der)
                        .map_err(|e| CryptoError::Unsupported(e.to_string()))?,
                    "PRIVATE KEY" => rsa::RsaPrivateKey::from_pkcs8_der(der)
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
        Ok(choria_crypto::pem::encode("CERTIFICATE REQUEST", der))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The node's X25519 private key of these tests.
    const NODE_PRIVATE: [u8; 32] = [0x5a; 32];

    /// The provisioner's side of go-choria's scheme for the node of [`NODE_PRIVATE`], with a
    /// fixed key pair and IV so that every outcome is reproducible.
    fn delivered(der: &[u8]) -> choria_crypto::keyenc::EncryptedKey {
        let pem = choria_crypto::pem::encode("RSA PRIVATE KEY", der.to_vec());
        let node_public = hex::encode(choria_crypto::x25519::public_key(&NODE_PRIVATE));
        choria_crypto::keyenc::encrypt_private_key_with(&pem, &node_public, &[0x11; 32], &[4; 16])
            .unwrap()
    }

    #[test]
    fn a_delivered_key_is_decrypted_and_rewrapped() {
        let private = NODE_PRIVATE;
        let sent = delivered(&[1u8; 20]);
        let clear = decrypt_delivered_key(&sent.pem, &private, &sent.ecdh_public).unwrap();
        assert_eq!(
            clear,
            choria_crypto::pem::encode("RSA PRIVATE KEY", vec![1u8; 20])
        );
    }

    #[test]
    fn peer_keys_are_refused_in_go_choria_words() {
        let private = NODE_PRIVATE;
        let sent = delivered(&[1u8; 20]);
        for point in [
            "0000000000000000000000000000000000000000000000000000000000000000",
            "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
            "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        ] {
            assert_eq!(
                decrypt_delivered_key(&sent.pem, &private, point).unwrap_err(),
                "crypto/ecdh: bad X25519 remote ECDH input: low order point",
                "{point}"
            );
        }
        assert_eq!(
            decrypt_delivered_key(&sent.pem, &private, &sent.ecdh_public[..62]).unwrap_err(),
            "crypto/ecdh: invalid public key"
        );
        assert!(decrypt_delivered_key(&sent.pem, &private, "zz")
            .unwrap_err()
            .starts_with("encoding/hex: "));
    }

    #[test]
    fn legacy_pem_errors_are_go_choria_words() {
        let private = NODE_PRIVATE;
        let sent = delivered(&[1u8; 20]);
        let peer = &sent.ecdh_public;
        assert_eq!(
            decrypt_delivered_key("x", &private, peer).unwrap_err(),
            "bad key received"
        );
        let plain = choria_crypto::pem::encode("RSA PRIVATE KEY", vec![1u8; 16]);
        assert_eq!(
            decrypt_delivered_key(&plain, &private, peer).unwrap_err(),
            "key is not encrypted"
        );
        assert_eq!(
            decrypt_delivered_key(&sent.pem, &[0x33; 32], peer).unwrap_err(),
            "x509: decryption password incorrect"
        );
    }

    #[test]
    fn eddsa_tokens_verify_and_tampering_is_caught() {
        let seed = [7u8; 32];
        let signer =
            JwtSigner::from_key_data(format!("{}\n", hex::encode(seed)).as_bytes()).unwrap();
        let claims = serde_json::json!({"purpose": "x", "exp": 4_000_000_000i64});
        let token = signer.sign(&claims).unwrap();
        let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
        let key = verifier_from_public_data(&hex::encode(public.as_bytes())).unwrap();
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
    use rsa::pkcs8::DecodePublicKey as _;

    /// The CSR verifies under its own key and carries the subject in Go's RDN order.
    #[test]
    fn a_broken_csr_signature_parses_but_does_not_verify() {
        use rsa::signature::Verifier as _;
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/rsa-pool.pem"
        ))
        .unwrap();
        let keys = PoolKey::from_pem_many(&text).unwrap();
        let good = keys[0].csr("n1.example.net", "", "", "", "", &[]).unwrap();
        let bad = choria_crypto::pem::break_signature(&good).unwrap();
        let verifies = |pem_text: &str| {
            let req = choria_crypto::csr::from_pem(pem_text).unwrap();
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
        let req = choria_crypto::csr::from_pem(&pem_text).unwrap();
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
        let req = choria_crypto::csr::from_pem(&pem_text).unwrap();
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

    #[test]
    fn a_key_pool_holds_distinct_pairs_and_ed25519_keys_only_when_asked() {
        let pool = NodeKeys::pool(8, true);
        let publics: std::collections::HashSet<_> = pool.iter().map(|k| k.ecdh.1).collect();
        assert_eq!(publics.len(), 8);
        let eds: std::collections::HashSet<_> = pool
            .iter()
            .map(|k| k.ed25519.as_ref().unwrap().key().verifying_key().to_bytes())
            .collect();
        assert_eq!(eds.len(), 8);
        // Each private key belongs to its public key: both sides derive one secret.
        let (a, b) = (pool[0].ecdh, pool[1].ecdh);
        assert_eq!(
            choria_crypto::x25519::shared_secret(&a.0, &b.1),
            choria_crypto::x25519::shared_secret(&b.0, &a.1)
        );
        assert!(NodeKeys::pool(2, false).iter().all(|k| k.ed25519.is_none()));
    }
}
