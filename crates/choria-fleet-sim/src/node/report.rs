//! The per-node report (`--report`): what `configure` delivered, the `choria_provision` actions
//! seen with the statuscode answered, restarts, enrollments (the credential of each time the
//! node was provisioned) and problems.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{Node, Phase, PROVISION_ACTIONS};
use crate::crypto::TrustPath;
use sha2::Digest as _;

/// What `configure` delivered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Received {
    /// The configuration settings.
    pub configuration: BTreeMap<String, String>,
    /// Certificate PEM.
    pub certificate: String,
    /// CA PEM.
    pub ca: String,
    /// SSL directory.
    pub ssldir: String,
    /// Whether an encrypted private key was sent (and decrypted).
    pub key_received: bool,
    /// The decrypted key's public half matches the certificate, when both exist.
    pub certificate_matches_key: Option<bool>,
    /// Server JWT, compact form.
    pub server_jwt: String,
    /// Its claims (decoded; verified when an issuer key is configured).
    pub server_jwt_claims: Option<Value>,
    /// How the server JWT was verified, when it was.
    pub server_jwt_trust: Option<TrustPath>,
    /// Action policies by file name.
    pub action_policies: BTreeMap<String, String>,
    /// Open Policy Agent policies by file name.
    pub opa_policies: BTreeMap<String, String>,
}

/// Where an enrollment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EnrollmentSource {
    /// `configure` followed by a restart out of provisioning mode.
    Configure,
    /// The node started provisioned (`preprovisioned`): the credential is a record only
    /// (identifier and expiry), there is no certificate or JWT behind it.
    Preprovisioned,
}

/// The credential a node held after one enrollment; a test asserts "provisioned again with a
/// new certificate or JWT" by comparing the identifiers of two enrollments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Enrollment {
    /// Where it came from.
    pub source: EnrollmentSource,
    /// Unix seconds when the node restarted with it (or started, when preprovisioned).
    pub at: i64,
    /// Certificate serial number, lowercase hex.
    pub certificate_serial: Option<String>,
    /// SHA-256 of the certificate's DER, lowercase hex.
    pub certificate_sha256: Option<String>,
    /// The server JWT's `jti`.
    pub server_jwt_id: Option<String>,
    /// SHA-256 of the compact server JWT, lowercase hex.
    pub server_jwt_sha256: Option<String>,
    /// Unix seconds when the credential expires: the earlier of the certificate's `notAfter`
    /// and the JWT's `exp`, when known.
    pub expires: Option<i64>,
}

impl Enrollment {
    /// The enrollment `configure` delivered in `r`.
    pub fn of(r: &Received, now: i64) -> Enrollment {
        let mut e = Enrollment {
            source: EnrollmentSource::Configure,
            at: now,
            certificate_serial: None,
            certificate_sha256: None,
            server_jwt_id: None,
            server_jwt_sha256: None,
            expires: None,
        };
        if !r.certificate.is_empty() {
            if let Ok(cert) = choria_crypto::pem::certificate(&r.certificate) {
                use der::Encode as _;
                let tbs = &cert.tbs_certificate;
                e.certificate_serial = Some(hex::encode(tbs.serial_number.as_bytes()));
                e.certificate_sha256 = cert
                    .to_der()
                    .ok()
                    .map(|d| hex::encode(sha2::Sha256::digest(d)));
                let not_after = tbs.validity.not_after.to_unix_duration().as_secs();
                e.expires = i64::try_from(not_after).ok();
            }
        }
        if !r.server_jwt.is_empty() {
            e.server_jwt_sha256 = Some(hex::encode(sha2::Sha256::digest(r.server_jwt.as_bytes())));
            if let Some(claims) = &r.server_jwt_claims {
                e.server_jwt_id = claims
                    .get("jti")
                    .and_then(|v| v.as_str())
                    .map(|s| s.chars().take(128).collect());
                if let Some(exp) = claims.get("exp").and_then(|v| v.as_i64()) {
                    e.expires = Some(e.expires.map_or(exp, |c| c.min(exp)));
                }
            }
        }
        e
    }
}

/// A node's record for `--report`.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// Identity.
    pub identity: String,
    /// Phase at report time.
    pub phase: Phase,
    /// Configured and restarted out of provisioning mode with a usable configuration.
    pub provisioned: bool,
    /// Reported version.
    pub version: String,
    /// `choria_provision` actions seen, in order, with the statuscode answered.
    pub actions: Vec<ActionSeen>,
    /// How often the node restarted.
    pub restarts: u16,
    /// The common name of the last CSR made.
    pub csr_cn: Option<String>,
    /// Hex ed25519 public key made by `gen25519`.
    pub ed25519_public_key: Option<String>,
    /// What `configure` delivered (the last successful call).
    pub received: Option<Received>,
    /// Why the node is not usable, or looped back into provisioning.
    pub problems: Vec<String>,
    /// Times the node restarted out of provisioning mode with a usable configuration (a node
    /// started provisioned counts 0 until it is provisioned again).
    pub provisions: u16,
    /// Times `reprovision` brought the node back into provisioning mode.
    pub reprovisions: u16,
    /// The credential of each enrollment, oldest first (the last 32).
    pub enrollments: Vec<Enrollment>,
    /// When the current credential expires (Unix seconds), while provisioned.
    pub expires: Option<i64>,
    /// The collectives a provisioned node answers on, main collective first (empty when it
    /// is not online).
    pub collectives: Vec<String>,
}

/// One action in a report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ActionSeen {
    /// Action name.
    pub action: String,
    /// Statuscode answered.
    pub statuscode: u8,
}

impl Node {
    /// Notes a `choria_provision` action and the statuscode answered (`None`: no reply).
    pub(super) fn record(&mut self, action: &str, code: Option<u8>) {
        let idx = PROVISION_ACTIONS
            .iter()
            .position(|a| *a == action)
            .and_then(|i| u8::try_from(i).ok())
            .unwrap_or(255);
        self.actions.push((idx, code.unwrap_or(255)));
    }

    /// The node's report record; `collectives` are those of its online collective set.
    pub fn report(
        &self,
        identity: &str,
        fleet_version: &str,
        collectives: Option<&[String]>,
    ) -> NodeReport {
        NodeReport {
            identity: identity.to_string(),
            phase: self.phase,
            provisioned: self.phase == Phase::Provisioned,
            version: self.version(fleet_version).to_string(),
            actions: self
                .actions
                .iter()
                .map(|&(a, c)| ActionSeen {
                    action: PROVISION_ACTIONS
                        .get(usize::from(a))
                        .copied()
                        .unwrap_or("unknown")
                        .to_string(),
                    statuscode: c,
                })
                .collect(),
            restarts: self.restarts,
            csr_cn: self.csr_cn.as_deref().map(str::to_string),
            ed25519_public_key: self.ed25519_public.map(hex::encode),
            received: self.received.as_deref().cloned(),
            problems: self.problems.clone(),
            provisions: self.provisions,
            reprovisions: self.reprovisions,
            enrollments: self.enrollments.clone(),
            expires: self
                .enrollments
                .last()
                .filter(|_| self.phase == Phase::Provisioned)
                .and_then(|e| e.expires),
            collectives: match (self.online(), collectives) {
                (Some(_), Some(c)) => c.to_vec(),
                _ => Vec::new(),
            },
        }
    }
}
