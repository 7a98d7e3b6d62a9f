//! Security modes: insecure, x509 (protocol v1: the `file` provider, and the `puppet` provider,
//! which is the same with the files of its ssldir) and the `choria` provider (ed25519 seed plus
//! JWT, protocol v2).
//!
//! Signing covers the exact request bytes that get embedded. Server-side verification
//! ([`verify_request`]) checks the signature only: for v1 with the public key of the embedded
//! certificate (the certificate's chain to a CA and its name are not checked), for v2 with the
//! `public_key` claim of the caller JWT (the JWT's own signature and issuer are not checked).
//! That is enough for a simulated fleet; it is not a substitute for a go-choria server's checks.

use std::path::{Path, PathBuf};

use super::b64;
use ed25519_dalek::{Signer as _, Verifier as _};
use rsa::pkcs8::DecodePublicKey as _;
use rsa::signature::SignatureEncoding as _;
use sha2::Sha256;

use super::{ProtocolError, ProtocolVersion, Request};

/// Why security material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its content is not usable.
    #[error("invalid {what} in {}: {reason}", path.display())]
    Invalid {
        /// What the file should hold (`certificate`, `rsa key`, `seed`, `jwt`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// How a client signs its requests, which also fixes the protocol version and caller id.
#[derive(Clone)]
pub enum Security {
    /// No signing: v1 with `insecure` placeholders (what `choria_insecure` selects).
    Insecure {
        /// The caller id, normally `choria=<certname>`.
        caller_id: String,
    },
    /// The x509 `file` and `puppet` providers: v1, RSA PKCS#1 v1.5 SHA-256 signatures.
    X509 {
        /// The caller id, `choria=<certname>`.
        caller_id: String,
        /// The certificate PEM exactly as read from disk (sent as `pubcert`).
        cert_pem: String,
        /// The signing key.
        key: Box<rsa::pkcs1v15::SigningKey<Sha256>>,
    },
    /// The `choria` provider: v2, ed25519 signatures and the client JWT as caller.
    Choria {
        /// The JWT's `callerid` claim.
        caller_id: String,
        /// The client JWT, compact form.
        jwt: String,
        /// The ed25519 key from the seed file.
        key: Box<ed25519_dalek::SigningKey>,
    },
}

impl std::fmt::Debug for Security {
    // Keys never appear in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (mode, caller) = match self {
            Security::Insecure { caller_id } => ("insecure", caller_id),
            Security::X509 { caller_id, .. } => ("x509", caller_id),
            Security::Choria { caller_id, .. } => ("choria", caller_id),
        };
        f.debug_struct("Security")
            .field("mode", &mode)
            .field("caller_id", caller)
            .finish_non_exhaustive()
    }
}

fn read(path: &Path) -> Result<String, SecurityError> {
    std::fs::read_to_string(path).map_err(|source| SecurityError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn invalid(what: &'static str, path: &Path, reason: impl ToString) -> SecurityError {
    SecurityError::Invalid {
        what,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Claims of a JWT, decoded without verifying its signature.
pub fn jwt_claims(jwt: &str) -> Option<serde_json::Value> {
    choria_crypto::jwt::decode_unverified(jwt).ok()
}

impl Security {
    /// Insecure mode with the given caller id.
    pub fn insecure(caller_id: impl Into<String>) -> Self {
        Security::Insecure {
            caller_id: caller_id.into(),
        }
    }

    /// x509 mode from a certificate PEM and an RSA key PEM (PKCS#1 or PKCS#8) given as text.
    pub fn x509_from_pem(
        caller_id: impl Into<String>,
        cert_pem: String,
        key_pem: &str,
    ) -> Result<Self, String> {
        let key = choria_crypto::pem::rsa_private_key(key_pem).map_err(|e| e.to_string())?;
        Ok(Security::X509 {
            caller_id: caller_id.into(),
            cert_pem,
            key: Box::new(rsa::pkcs1v15::SigningKey::<Sha256>::new(key)),
        })
    }

    /// x509 mode from a certificate and key file (the file provider's, or the puppet
    /// provider's in its ssldir). Errors name the file.
    pub fn x509_from_files(
        caller_id: impl Into<String>,
        cert: &Path,
        key: &Path,
    ) -> Result<Self, SecurityError> {
        let cert_pem = read(cert)?;
        choria_crypto::pem::certificate(&cert_pem).map_err(|e| invalid("certificate", cert, e))?;
        let key_pem = read(key)?;
        Self::x509_from_pem(caller_id, cert_pem, &key_pem).map_err(|e| invalid("rsa key", key, e))
    }

    /// Choria (v2) mode from a JWT and a 32-byte ed25519 seed. The caller id is the JWT's
    /// `callerid` claim.
    pub fn choria(jwt: String, seed: [u8; 32]) -> Result<Self, String> {
        let jwt = jwt.trim().to_string();
        let claims = jwt_claims(&jwt).ok_or("the token is not a decodable jwt")?;
        let caller_id = claims
            .get("callerid")
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .ok_or("the token has no callerid claim")?
            .to_string();
        Ok(Security::Choria {
            caller_id,
            jwt,
            key: Box::new(ed25519_dalek::SigningKey::from_bytes(&seed)),
        })
    }

    /// Choria (v2) mode from the `token_file` and the `seed_file` (64 hex characters).
    pub fn choria_from_files(token: &Path, seed: &Path) -> Result<Self, SecurityError> {
        let jwt = read(token)?;
        let seed_hex = read(seed)?;
        let seed_bytes = hex::decode(seed_hex.trim()).map_err(|e| invalid("seed", seed, e))?;
        let seed_arr: [u8; 32] = seed_bytes
            .try_into()
            .map_err(|_| invalid("seed", seed, "not 32 bytes"))?;
        Self::choria(jwt, seed_arr).map_err(|e| invalid("jwt", token, e))
    }

    /// Protocol version this mode sends.
    pub fn version(&self) -> ProtocolVersion {
        match self {
            Security::Insecure { .. } | Security::X509 { .. } => ProtocolVersion::V1,
            Security::Choria { .. } => ProtocolVersion::V2,
        }
    }

    /// The caller id placed in requests (and hashed into reply subjects).
    pub fn caller_id(&self) -> &str {
        match self {
            Security::Insecure { caller_id }
            | Security::X509 { caller_id, .. }
            | Security::Choria { caller_id, .. } => caller_id,
        }
    }

    /// v1 `signature` and `pubcert` for the exact request bytes.
    pub(crate) fn sign_v1(
        &self,
        agent: &str,
        request: &[u8],
    ) -> Result<(String, &str), ProtocolError> {
        match self {
            // go-choria never signs requests to the aaa_signer agent.
            Security::X509 { cert_pem, key, .. } if agent != "aaa_signer" => {
                let sig = key.sign(request);
                Ok((b64::encode(&sig.to_bytes()), cert_pem.as_str()))
            }
            Security::Choria { .. } => Err(ProtocolError::Security(
                "the choria security provider cannot send version 1 requests".into(),
            )),
            _ => Ok(("insecure".to_string(), "insecure")),
        }
    }

    /// v2 signature and caller JWT for the exact request bytes.
    pub(crate) fn sign_v2(&self, request: &[u8]) -> Result<([u8; 64], &str), ProtocolError> {
        match self {
            Security::Choria { key, jwt, .. } => Ok((key.sign(request).to_bytes(), jwt.as_str())),
            _ => Err(ProtocolError::Security(
                "version 2 requests need the choria security provider".into(),
            )),
        }
    }
}

/// Signature material of a parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestSecurity {
    /// v1: base64 RSA signature (or `insecure`) and the signer's certificate PEM (or `insecure`).
    V1 {
        /// `signature` field.
        signature: String,
        /// `pubcert` field.
        pubcert: String,
    },
    /// v2: raw signature bytes, the caller JWT and an optional delegated signer JWT.
    V2 {
        /// Decoded `signature`.
        signature: Vec<u8>,
        /// `caller` JWT.
        caller_jwt: String,
        /// `signer` JWT, when a remote signer was used.
        signer_jwt: Option<String>,
    },
}

/// Verify a parsed request's signature (see the module documentation for the limits).
pub fn verify_request(req: &Request) -> Result<(), ProtocolError> {
    let fail =
        |m: &str| ProtocolError::Security(format!("request {} from {}: {m}", req.id, req.caller));
    match &req.security {
        RequestSecurity::V1 { signature, pubcert } => {
            if signature == "insecure" || pubcert == "insecure" {
                return Err(fail("request is not signed"));
            }
            let cert = choria_crypto::pem::certificate(pubcert)
                .map_err(|e| fail(&format!("invalid certificate: {e}")))?;
            let spki = choria_crypto::pem::certificate_spki_der(&cert)
                .map_err(|e| fail(&format!("invalid certificate key: {e}")))?;
            let key = rsa::RsaPublicKey::from_public_key_der(&spki)
                .map_err(|e| fail(&format!("certificate key is not rsa: {e}")))?;
            let sig_bytes =
                b64::decode(signature.as_bytes()).ok_or_else(|| fail("signature is not base64"))?;
            let sig = rsa::pkcs1v15::Signature::try_from(sig_bytes.as_slice())
                .map_err(|_| fail("malformed signature"))?;
            rsa::pkcs1v15::VerifyingKey::<Sha256>::new(key)
                .verify(&req.signed_bytes, &sig)
                .map_err(|_| fail("signature does not verify"))
        }
        RequestSecurity::V2 {
            signature,
            caller_jwt,
            ..
        } => {
            let claims =
                jwt_claims(caller_jwt).ok_or_else(|| fail("caller jwt is not decodable"))?;
            let pk_hex = claims
                .get("public_key")
                .and_then(|v| v.as_str())
                .ok_or_else(|| fail("caller jwt has no public_key"))?;
            let pk: [u8; 32] = hex::decode(pk_hex)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| fail("caller jwt public_key is not 32 hex bytes"))?;
            let vk = ed25519_dalek::VerifyingKey::from_bytes(&pk)
                .map_err(|_| fail("caller jwt public_key is invalid"))?;
            let sig = ed25519_dalek::Signature::from_slice(signature)
                .map_err(|_| fail("malformed signature"))?;
            vk.verify(&req.signed_bytes, &sig)
                .map_err(|_| fail("signature does not verify"))
        }
    }
}
