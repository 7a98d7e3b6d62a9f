//! The interfaces the cycle drives: RPCs to one node ([`NodeRpc`], with the transport-free
//! request and reply types, the [`Action`]s and their Go retry counts) and the helper
//! ([`Helper`]). The binary implements them with a Choria RPC client and the subprocess runner;
//! tests and embedders bring their own. Metric hooks are in [`crate::observer`], the clock and
//! entropy in [`crate::clock`], the key material in [`crate::keys`].

use std::collections::BTreeMap;
use std::future::Future;

use helper_protocol::{CsrReply, Ed25519Reply, HelperError, HelperInput, HelperReply};
use serde::{Deserialize, Serialize};

/// The RPC actions of provisioning, with the Go provisioner's retry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Action {
    /// `rpcutil#inventory`.
    Inventory,
    /// `choria_provision#jwt`.
    Jwt,
    /// `choria_provision#gen25519`.
    Gen25519,
    /// `choria_provision#gencsr`.
    Gencsr,
    /// `choria_provision#configure`.
    Configure,
    /// `choria_provision#release_update`.
    ReleaseUpdate,
    /// `choria_provision#restart`.
    Restart,
    /// `choria_provision#shutdown`.
    Shutdown,
}

impl Action {
    /// The `agent#action` label used in metrics and messages.
    pub const fn label(self) -> &'static str {
        match self {
            Action::Inventory => "rpcutil#inventory",
            Action::Jwt => "choria_provision#jwt",
            Action::Gen25519 => "choria_provision#gen25519",
            Action::Gencsr => "choria_provision#gencsr",
            Action::Configure => "choria_provision#configure",
            Action::ReleaseUpdate => "choria_provision#release_update",
            Action::Restart => "choria_provision#restart",
            Action::Shutdown => "choria_provision#shutdown",
        }
    }

    /// How many times the action is tried.
    pub const fn tries(self) -> u32 {
        match self {
            Action::Inventory | Action::Gen25519 | Action::Configure => 5,
            Action::Jwt | Action::Restart | Action::Shutdown | Action::ReleaseUpdate => 3,
            Action::Gencsr => 1,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// How an RPC failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RpcErrorKind {
    /// No reply within the request timeout.
    #[error("timeout")]
    Timeout,
    /// The broker reported that nothing is subscribed to the node's subject: no server with
    /// this identity is connected. Reported at once, without waiting for the timeout.
    #[error("no server is subscribed for this node (no responders)")]
    NoResponders,
    /// A number of replies other than exactly one.
    #[error("received {0} replies while expecting one")]
    ReplyCount(usize),
    /// Another provisioner holds the node's provisioning lock.
    #[error("provisioning lock held by another provisioner")]
    LockHeld,
    /// The node answered with a non-zero status code.
    #[error("aborted with status {code}: {}", crate::identity::escaped(.message))]
    Aborted {
        /// The status code.
        code: u8,
        /// The status message.
        message: String,
    },
    /// The reply could not be decoded.
    #[error("bad reply: {}", crate::identity::escaped(.0))]
    BadReply(String),
    /// The transport failed (disconnected, refused, no responders).
    #[error("transport: {}", crate::identity::escaped(.0))]
    Transport(String),
}

impl RpcErrorKind {
    /// Whether nothing answered at all (no reply in time, or nobody serves the node's subject).
    pub fn is_unanswered(&self) -> bool {
        matches!(self, RpcErrorKind::Timeout | RpcErrorKind::NoResponders)
    }
}

/// A failed RPC to one node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action} on {identity} failed: {kind}")]
pub struct RpcError {
    /// The node.
    pub identity: String,
    /// The action.
    pub action: Action,
    /// What happened.
    #[source]
    pub kind: RpcErrorKind,
}

impl RpcError {
    /// A new error.
    pub fn new(identity: impl Into<String>, action: Action, kind: RpcErrorKind) -> Self {
        RpcError {
            identity: identity.into(),
            action,
            kind,
        }
    }
}

/// The useful part of an `rpcutil#inventory` reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The whole reply data as JSON with sorted keys (what the helper receives as `inventory`).
    pub json: String,
    /// The server version.
    pub version: String,
    /// Whether the server can upgrade itself.
    pub upgradable: bool,
}

/// The reply of `choria_provision#jwt`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JwtReply {
    /// The node's `provisioning.jwt`.
    #[serde(default)]
    pub jwt: String,
    /// The node's X25519 public key for this exchange (64 hex).
    #[serde(default)]
    pub ecdh_public: String,
}

/// The input of `choria_provision#configure`; every key is always sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigureRequest {
    /// The provisioning token.
    pub token: String,
    /// The configuration as a JSON object of strings.
    pub config: String,
    /// CA chain PEM.
    pub ca: String,
    /// Certificate PEM.
    pub certificate: String,
    /// SSL directory on the node.
    pub ssldir: String,
    /// Encrypted private key PEM.
    pub key: String,
    /// The provisioner's X25519 public key when `key` is set.
    pub ecdh_public: String,
    /// Action policy files by name.
    pub action_policies: BTreeMap<String, String>,
    /// Open Policy Agent files by name.
    pub opa_policies: BTreeMap<String, String>,
    /// The signed server JWT.
    pub server_jwt: String,
}

/// The `message` of replies that carry only a message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionMessage {
    /// The node's message.
    #[serde(default)]
    pub message: String,
}

/// Directed RPCs to exactly one node. An implementation sends each call to `identity` only,
/// expects exactly one reply, and maps a non-zero status code to [`RpcErrorKind::Aborted`], or
/// to [`RpcErrorKind::LockHeld`] when its transport recognises the node's refusal because another
/// provisioner holds the lock. Retries are the caller's.
pub trait NodeRpc: Send + Sync + 'static {
    /// `rpcutil#inventory`.
    fn inventory(&self, identity: &str)
        -> impl Future<Output = Result<Inventory, RpcError>> + Send;
    /// `choria_provision#jwt`.
    fn jwt(
        &self,
        identity: &str,
        token: &str,
    ) -> impl Future<Output = Result<JwtReply, RpcError>> + Send;
    /// `choria_provision#gen25519` with `nonce`.
    fn gen25519(
        &self,
        identity: &str,
        token: &str,
        nonce: &str,
    ) -> impl Future<Output = Result<Ed25519Reply, RpcError>> + Send;
    /// `choria_provision#gencsr` with common name `cn`.
    fn gencsr(
        &self,
        identity: &str,
        token: &str,
        cn: &str,
    ) -> impl Future<Output = Result<CsrReply, RpcError>> + Send;
    /// `choria_provision#configure`.
    fn configure(
        &self,
        identity: &str,
        request: &ConfigureRequest,
    ) -> impl Future<Output = Result<ActionMessage, RpcError>> + Send;
    /// `choria_provision#release_update`.
    fn release_update(
        &self,
        identity: &str,
        token: &str,
        repository: &str,
        version: &str,
    ) -> impl Future<Output = Result<ActionMessage, RpcError>> + Send;
    /// `choria_provision#restart` with `splay` seconds.
    fn restart(
        &self,
        identity: &str,
        token: &str,
        splay: u32,
    ) -> impl Future<Output = Result<ActionMessage, RpcError>> + Send;
    /// `choria_provision#shutdown`.
    fn shutdown(
        &self,
        identity: &str,
        token: &str,
    ) -> impl Future<Output = Result<ActionMessage, RpcError>> + Send;
}

/// The site helper that turns a node's data into its configuration.
pub trait Helper: Send + Sync + 'static {
    /// Runs the helper for one node.
    fn run(
        &self,
        input: &HelperInput,
    ) -> impl Future<Output = Result<HelperReply, HelperError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_a_node_sent_is_escaped_and_bounded_in_the_message() {
        let long = format!("line one\nERROR forged {}", "x".repeat(1 << 20));
        for kind in [
            RpcErrorKind::Aborted {
                code: 1,
                message: long.clone(),
            },
            RpcErrorKind::BadReply(long.clone()),
            RpcErrorKind::Transport(long.clone()),
        ] {
            let shown = RpcError::new("n1.example.net", Action::Configure, kind).to_string();
            assert!(!shown.contains('\n'), "{shown:.200}");
            assert!(shown.len() < 400, "{} bytes", shown.len());
        }
    }
}
