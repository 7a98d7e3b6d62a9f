//! The interfaces the cycle drives: RPCs to one node ([`NodeRpc`]), the helper ([`Helper`]),
//! metric hooks ([`Observer`]) and the wall clock ([`Clock`]). The binary implements them with a
//! Choria RPC client, a subprocess helper and Prometheus metrics; tests and embedders bring their
//! own.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use helper_protocol::{
    CsrReply, Ed25519Reply, HelperError, HelperInput, HelperReply, HelperRunner,
};
use serde::{Deserialize, Serialize};

/// The RPC actions of provisioning, with the Go provisioner's retry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// The status message of a node refusing a call because another provisioner holds its lock.
pub const LOCK_HELD_MESSAGE: &str = "Could not obtain provisioning lock";

/// How an RPC failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    #[error("aborted with status {code}: {message}")]
    Aborted {
        /// The status code.
        code: u8,
        /// The status message.
        message: String,
    },
    /// The reply could not be decoded.
    #[error("bad reply: {0}")]
    BadReply(String),
    /// The transport failed (disconnected, refused, no responders).
    #[error("transport: {0}")]
    Transport(String),
}

impl RpcErrorKind {
    /// Whether nothing answered at all (no reply in time, or nobody serves the node's subject).
    pub fn is_unanswered(&self) -> bool {
        matches!(self, RpcErrorKind::Timeout | RpcErrorKind::NoResponders)
    }

    /// Classifies a non-zero status reply, recognising the provisioning lock message.
    pub fn from_status(code: u8, message: &str) -> Self {
        if message.contains(LOCK_HELD_MESSAGE) {
            RpcErrorKind::LockHeld
        } else {
            RpcErrorKind::Aborted {
                code,
                message: message.to_string(),
            }
        }
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
/// expects exactly one reply, and maps a non-zero status code to [`RpcErrorKind::Aborted`] (or
/// [`RpcErrorKind::LockHeld`], see [`RpcErrorKind::from_status`]). Retries are the caller's.
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

impl Helper for HelperRunner {
    fn run(
        &self,
        input: &HelperInput,
    ) -> impl Future<Output = Result<HelperReply, HelperError>> + Send {
        HelperRunner::run(self, input)
    }
}

/// Metric hooks, called from the cycle and the work queue. Every method has an empty default,
/// so an implementation overrides only what it records. Names follow the Go provisioner's
/// metrics (`choria_provisioner_*`).
pub trait Observer: Send + Sync + 'static {
    /// One RPC try took `elapsed` (`rpc_time{rpc=label}`).
    fn rpc_time(&self, _label: &'static str, _elapsed: Duration) {}
    /// An RPC failed after its tries (`rpc_errors{rpc=label}`).
    fn rpc_error(&self, _label: &'static str) {}
    /// The helper ran for `elapsed` (`helper_time`).
    fn helper_time(&self, _elapsed: Duration) {}
    /// The helper failed (`helper_errors`).
    fn helper_error(&self) {}
    /// A node was shut down on the helper's request (`helper_shutdown_requests`).
    fn helper_shutdown(&self) {}
    /// A node finished successfully (`provisioned`).
    fn provisioned(&self) {}
    /// A node failed (`provision_errors`).
    fn provision_error(&self) {}
    /// A node's lock is held by another provisioner; not an error.
    fn lock_held(&self) {}
    /// A node identity was refused before anything was done for it
    /// (`invalid_identities`, not in the Go set).
    fn invalid_identity(&self) {}
    /// A node was queued by discovery (`discovered`).
    fn discovered(&self) {}
    /// A node was queued by a startup event (`event_discovered`).
    fn event_discovered(&self) {}
    /// A discovery round ran (`discover_cycles`).
    fn discover_cycle(&self) {}
    /// A discovery round failed (`discovery_errors`).
    fn discovery_error(&self) {}
    /// Workers provisioning right now (`busy_workers`).
    fn busy_workers(&self, _n: usize) {}
    /// Entries waiting in the work queue (`work_queue_entries`).
    fn work_queue_entries(&self, _n: usize) {}
    /// Nodes known to the host table (`waiting_nodes`).
    fn waiting_nodes(&self, _n: usize) {}
    /// Whether provisioning is paused (`paused`).
    fn paused(&self, _paused: bool) {}
}

/// A shared observer (for example metrics also served over HTTP) observes through its `Arc`.
impl<T: Observer + ?Sized> Observer for std::sync::Arc<T> {
    fn rpc_time(&self, label: &'static str, elapsed: Duration) {
        (**self).rpc_time(label, elapsed)
    }
    fn rpc_error(&self, label: &'static str) {
        (**self).rpc_error(label)
    }
    fn helper_time(&self, elapsed: Duration) {
        (**self).helper_time(elapsed)
    }
    fn helper_error(&self) {
        (**self).helper_error()
    }
    fn helper_shutdown(&self) {
        (**self).helper_shutdown()
    }
    fn provisioned(&self) {
        (**self).provisioned()
    }
    fn provision_error(&self) {
        (**self).provision_error()
    }
    fn lock_held(&self) {
        (**self).lock_held()
    }
    fn invalid_identity(&self) {
        (**self).invalid_identity()
    }
    fn discovered(&self) {
        (**self).discovered()
    }
    fn event_discovered(&self) {
        (**self).event_discovered()
    }
    fn discover_cycle(&self) {
        (**self).discover_cycle()
    }
    fn discovery_error(&self) {
        (**self).discovery_error()
    }
    fn busy_workers(&self, n: usize) {
        (**self).busy_workers(n)
    }
    fn work_queue_entries(&self, n: usize) {
        (**self).work_queue_entries(n)
    }
    fn waiting_nodes(&self, n: usize) {
        (**self).waiting_nodes(n)
    }
    fn paused(&self, paused: bool) {
        (**self).paused(paused)
    }
}

/// An observer that records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {}

/// Wall-clock time for token validity; monotonic time comes from tokio.
pub trait Clock: Send + Sync + 'static {
    /// Seconds since the Unix epoch.
    fn now_unix(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }
}
