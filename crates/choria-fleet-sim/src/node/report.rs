//! The per-node report (`--report`): what `configure` delivered, the `choria_provision` actions
//! seen with the statuscode answered, restarts and problems.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{Node, Phase, PROVISION_ACTIONS};
use crate::crypto::TrustPath;

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

    /// The node's report record.
    pub fn report(&self, identity: &str, fleet_version: &str) -> NodeReport {
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
        }
    }
}
