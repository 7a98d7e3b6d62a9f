//! In-memory collaborators for tests and examples (the `testing` feature): a scripted node
//! ([`FakeNode`], a [`NodeRpc`] that answers as a go-choria server in provisioning mode would,
//! with real keys and signatures), a helper whose reply is set ([`FakeHelper`]), an observer that
//! counts ([`CountingObserver`]), a fixed clock ([`FixedClock`]) and fixed entropy
//! ([`FixedRandom`]). The node's provisioning JWT is signed by [`prov_signer`]; a provisioner
//! verifying it is given [`test_keys`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use choria_crypto::jwt::{self, SigningKey};
use ed25519_dalek::Signer as _;
use helper_protocol::{
    CsrReply, Ed25519Reply, HelperError, HelperInput, HelperReply, ProvisioningClaims,
    StandardClaims,
};

use crate::clock::{Clock, Random, SystemClock};
use crate::keys::StaticKeys;
use crate::observer::Observer;
use crate::pause::PauseState;
use crate::rpc::{
    Action, ActionMessage, ConfigureRequest, Helper, Inventory, JwtReply, NodeRpc, RpcError,
    RpcErrorKind,
};

/// The provisioning token the fake node's provisioning JWT carries and expects in requests.
pub const TOKEN: &str = "s3cret";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now() -> i64 {
    SystemClock.now_unix()
}

/// The key that signs the fake node's provisioning JWT (an ed25519 seed of 42s).
pub fn prov_signer() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[42u8; 32])
}

/// [`prov_signer`]'s public key as hex, as `jwt_verify_cert` may give it.
pub fn prov_signer_hex() -> String {
    hex::encode(prov_signer().verifying_key().to_bytes())
}

/// The seed (64 hex characters) [`test_keys`] signs server JWTs with.
pub fn server_signer_hex() -> String {
    hex::encode([3u8; 32])
}

/// Key material that verifies the fake node's provisioning JWT and signs server JWTs.
pub fn test_keys() -> StaticKeys {
    StaticKeys::new()
        .with_verify_key(jwt::VerifyingKey::Ed25519(prov_signer().verifying_key()))
        .with_signing_key(server_signer_hex())
}

/// A provisioning JWT for [`TOKEN`] signed by `key`, expiring at `exp` (Unix seconds), with
/// `purpose` (`choria_provisioning` for a real one).
pub fn provisioning_jwt(key: &ed25519_dalek::SigningKey, exp: i64, purpose: &str) -> String {
    let claims = ProvisioningClaims {
        token: TOKEN.into(),
        urls: "nats://127.0.0.1:4222".into(),
        prov_default: true,
        standard: StandardClaims {
            purpose: purpose.into(),
            subject: purpose.into(),
            issuer: "Choria Tokens Package".into(),
            expires_at: Some(exp),
            not_before: Some(now() - 10),
            issued_at: Some(now() - 10),
            id: choria_crypto::ksuid::ksuid(now() - 10),
            ..Default::default()
        },
        ..Default::default()
    };
    // Signing with an in-memory ed25519 key cannot fail; an empty token fails the check.
    jwt::sign(&claims, &SigningKey::Ed25519(Box::new(key.clone()))).unwrap_or_default()
}

/// What the fake node holds and what it was asked; tests set and read it through
/// [`FakeNode::state`].
#[derive(Debug, Default)]
pub struct NodeState {
    /// Every action asked, in order.
    pub calls: Vec<Action>,
    /// Errors returned by an action before it succeeds (front first), by action label.
    pub failures: HashMap<&'static str, VecDeque<RpcErrorKind>>,
    /// The provisioning JWT `jwt` returns.
    pub jwt: String,
    /// The node's X25519 secret (its public half goes with the JWT).
    pub ecdh_secret: [u8; 32],
    /// The node's ed25519 seed (`gen25519`).
    pub ed_seed: [u8; 32],
    /// `gen25519` signs something other than the nonce.
    pub bad_nonce: bool,
    /// The nonces `gen25519` was sent, in order.
    pub nonces: Vec<String>,
    /// `gen25519` returns a truncated public key.
    pub short_key: bool,
    /// What `inventory` returns.
    pub inventory: Inventory,
    /// What `gencsr` returns.
    pub csr: CsrReply,
    /// The last `configure` request.
    pub configured: Option<ConfigureRequest>,
    /// The repository and version of the last `release_update`.
    pub released: Option<(String, String)>,
    /// The splay of the last `restart`, `None` before one.
    pub restarted_with_splay: Option<u32>,
    /// `restart` was asked.
    pub restarted: bool,
    /// `shutdown` was asked.
    pub shut_down: bool,
    /// Pause this state when the named action is called.
    pub pause_on: Option<(Action, PauseState)>,
    /// After `release_update` the node comes back with the version asked for.
    pub upgrade_to_version: bool,
    /// Identities starting with this never answer anything (bogus announced nodes).
    pub silent_prefix: Option<String>,
    /// Identities starting with this are served by nothing: every request fails at once with
    /// [`RpcErrorKind::NoResponders`].
    pub unserved_prefix: Option<String>,
}

/// A node in provisioning mode, answering every node's RPCs from one scripted state. Requests
/// whose token is not [`TOKEN`], and `gencsr` for another common name, are refused as go-choria
/// refuses them.
#[derive(Debug, Clone, Default)]
pub struct FakeNode {
    /// The state, shared by clones.
    pub state: Arc<Mutex<NodeState>>,
}

impl FakeNode {
    /// A node with a valid provisioning JWT, an ed25519 key and an upgradable inventory of
    /// version 0.29.4.
    pub fn new() -> Self {
        let n = FakeNode::default();
        {
            let mut s = lock(&n.state);
            s.jwt = provisioning_jwt(&prov_signer(), now() + 3600, "choria_provisioning");
            s.ecdh_secret = [9u8; 32];
            s.ed_seed = [5u8; 32];
            s.inventory = Inventory {
                json: r#"{"agents":["choria_provision"],"upgradable":true,"version":"0.29.4"}"#
                    .into(),
                version: "0.29.4".into(),
                upgradable: true,
            };
        }
        n
    }

    /// The state, locked.
    pub fn lock(&self) -> MutexGuard<'_, NodeState> {
        lock(&self.state)
    }

    /// `action` fails with `kind` the next `times` times it is asked.
    pub fn fail(&self, action: Action, kind: RpcErrorKind, times: usize) {
        let mut s = lock(&self.state);
        let q = s.failures.entry(action.label()).or_default();
        for _ in 0..times {
            q.push_back(kind.clone());
        }
    }

    /// Every action asked so far, in order.
    pub fn calls(&self) -> Vec<Action> {
        lock(&self.state).calls.clone()
    }

    /// How often `a` was asked.
    pub fn count(&self, a: Action) -> usize {
        lock(&self.state).calls.iter().filter(|c| **c == a).count()
    }

    /// The last `configure` request.
    pub fn configured(&self) -> Option<ConfigureRequest> {
        lock(&self.state).configured.clone()
    }

    fn enter(&self, id: &str, action: Action, token: Option<&str>) -> Result<(), RpcError> {
        let mut s = lock(&self.state);
        s.calls.push(action);
        if s.unserved_prefix
            .as_deref()
            .is_some_and(|p| id.starts_with(p))
        {
            return Err(RpcError::new(id, action, RpcErrorKind::NoResponders));
        }
        if let Some((a, p)) = &s.pause_on {
            if *a == action {
                p.pause();
            }
        }
        if let Some(kind) = s
            .failures
            .get_mut(action.label())
            .and_then(|q| q.pop_front())
        {
            return Err(RpcError::new(id, action, kind));
        }
        if token.is_some_and(|t| t != TOKEN) {
            return Err(RpcError::new(
                id,
                action,
                RpcErrorKind::Aborted {
                    code: 1,
                    message: "Incorrect provision token supplied".into(),
                },
            ));
        }
        Ok(())
    }

    async fn silent(&self, id: &str) {
        let silent = lock(&self.state)
            .silent_prefix
            .as_deref()
            .is_some_and(|p| id.starts_with(p));
        if silent {
            std::future::pending::<()>().await;
        }
    }
}

impl NodeRpc for FakeNode {
    async fn inventory(&self, id: &str) -> Result<Inventory, RpcError> {
        self.enter(id, Action::Inventory, None)?;
        self.silent(id).await;
        Ok(lock(&self.state).inventory.clone())
    }

    async fn jwt(&self, id: &str, token: &str) -> Result<JwtReply, RpcError> {
        self.enter(id, Action::Jwt, Some(token))?;
        self.silent(id).await;
        let s = lock(&self.state);
        Ok(JwtReply {
            jwt: s.jwt.clone(),
            ecdh_public: hex::encode(choria_crypto::x25519::public_key(&s.ecdh_secret)),
        })
    }

    async fn gen25519(&self, id: &str, token: &str, nonce: &str) -> Result<Ed25519Reply, RpcError> {
        self.enter(id, Action::Gen25519, Some(token))?;
        let mut s = lock(&self.state);
        s.nonces.push(nonce.to_string());
        let key = ed25519_dalek::SigningKey::from_bytes(&s.ed_seed);
        let msg = if s.bad_nonce { "other" } else { nonce };
        let mut pk = hex::encode(key.verifying_key().to_bytes());
        if s.short_key {
            pk.truncate(62);
        }
        Ok(Ed25519Reply {
            public_key: pk,
            directory: "/etc/choria".into(),
            signature: hex::encode(key.sign(msg.as_bytes()).to_bytes()),
        })
    }

    async fn gencsr(&self, id: &str, token: &str, cn: &str) -> Result<CsrReply, RpcError> {
        self.enter(id, Action::Gencsr, Some(token))?;
        if cn != id {
            return Err(RpcError::new(
                id,
                Action::Gencsr,
                RpcErrorKind::Aborted {
                    code: 1,
                    message: format!("asked for a CSR of {cn}"),
                },
            ));
        }
        Ok(lock(&self.state).csr.clone())
    }

    async fn configure(
        &self,
        id: &str,
        request: &ConfigureRequest,
    ) -> Result<ActionMessage, RpcError> {
        self.enter(id, Action::Configure, Some(&request.token))?;
        lock(&self.state).configured = Some(request.clone());
        Ok(ActionMessage {
            message: "Wrote 3 lines".into(),
        })
    }

    async fn release_update(
        &self,
        id: &str,
        token: &str,
        repo: &str,
        version: &str,
    ) -> Result<ActionMessage, RpcError> {
        self.enter(id, Action::ReleaseUpdate, Some(token))?;
        let mut s = lock(&self.state);
        s.released = Some((repo.to_string(), version.to_string()));
        if s.upgrade_to_version {
            s.inventory.version = version.to_string();
        }
        Ok(ActionMessage {
            message: "Restarting Choria Server after 2s".into(),
        })
    }

    async fn restart(&self, id: &str, token: &str, splay: u32) -> Result<ActionMessage, RpcError> {
        self.enter(id, Action::Restart, Some(token))?;
        let mut s = lock(&self.state);
        s.restarted = true;
        s.restarted_with_splay = Some(splay);
        Ok(ActionMessage {
            message: format!("Restarting Choria Server after {}s", splay.max(1) + 1),
        })
    }

    async fn shutdown(&self, id: &str, token: &str) -> Result<ActionMessage, RpcError> {
        self.enter(id, Action::Shutdown, Some(token))?;
        lock(&self.state).shut_down = true;
        Ok(ActionMessage {
            message: "Shutting Choria Server down after 4s".into(),
        })
    }
}

/// A helper whose reply is set; with none set it fails as a helper that printed nothing.
#[derive(Debug, Clone, Default)]
pub struct FakeHelper {
    /// The reply given to every node.
    pub reply: Arc<Mutex<Option<HelperReply>>>,
    /// Every input it was given, in order.
    pub inputs: Arc<Mutex<Vec<HelperInput>>>,
}

impl FakeHelper {
    /// A helper giving `reply` to every node.
    pub fn replying(reply: HelperReply) -> Self {
        let h = FakeHelper::default();
        *lock(&h.reply) = Some(reply);
        h
    }

    /// A helper that fails for every node.
    pub fn failing() -> Self {
        FakeHelper::default()
    }

    /// How often it ran.
    pub fn runs(&self) -> usize {
        lock(&self.inputs).len()
    }

    /// The inputs it was given.
    pub fn inputs(&self) -> Vec<HelperInput> {
        lock(&self.inputs).clone()
    }
}

impl Helper for FakeHelper {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        lock(&self.inputs).push(input.clone());
        lock(&self.reply).clone().ok_or(HelperError::EmptyOutput {
            helper: "fake".into(),
        })
    }
}

/// A helper reply configuring `n1.example.net` out of provisioning mode.
pub fn good_reply() -> HelperReply {
    HelperReply {
        configuration: Some(BTreeMap::from([
            ("identity".to_string(), "n1.example.net".to_string()),
            (
                "plugin.choria.server.provision".to_string(),
                "false".to_string(),
            ),
        ])),
        ..Default::default()
    }
}

/// What a [`CountingObserver`] counted.
#[derive(Debug, Default)]
pub struct Counts {
    /// The actions whose RPC failed for good, in order.
    pub rpc_errors: Mutex<Vec<&'static str>>,
    /// RPC tries timed.
    pub rpc_times: AtomicUsize,
    /// Helper failures.
    pub helper_errors: AtomicUsize,
    /// Helper shutdown requests.
    pub helper_shutdowns: AtomicUsize,
    /// Helper runs timed.
    pub helper_times: AtomicUsize,
    /// Nodes provisioned.
    pub provisioned: AtomicUsize,
    /// Cycles failed.
    pub provision_errors: AtomicUsize,
    /// Nodes left to another provisioner's lock.
    pub lock_held: AtomicUsize,
    /// Nodes queued by discovery.
    pub discovered: AtomicUsize,
    /// Nodes queued by startup events.
    pub event_discovered: AtomicUsize,
    /// Identities refused.
    pub invalid_identities: AtomicUsize,
    /// The most workers busy at once.
    pub max_busy: AtomicUsize,
    /// Every pause state reported, in order.
    pub paused: Mutex<Vec<bool>>,
    /// Every node event: the identity and `queued`, `started`, `step` or `finished`.
    pub node_events: Mutex<Vec<(String, &'static str)>>,
}

impl Counts {
    /// The count of `field` now (`Counts::provisioned` and the like).
    pub fn get(field: &AtomicUsize) -> usize {
        field.load(Ordering::SeqCst)
    }
}

/// An observer counting what the cycle and the work queue report; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct CountingObserver(pub Arc<Counts>);

impl Observer for CountingObserver {
    fn node_event(&self, identity: &str, event: &crate::events::NodeEvent<'_>) {
        use crate::events::NodeEvent;
        let kind = match event {
            NodeEvent::Queued { .. } => "queued",
            NodeEvent::Started { .. } => "started",
            NodeEvent::Step { .. } => "step",
            NodeEvent::Finished(_) => "finished",
        };
        lock(&self.0.node_events).push((identity.to_string(), kind));
    }
    fn rpc_time(&self, _l: &'static str, _e: Duration) {
        self.0.rpc_times.fetch_add(1, Ordering::SeqCst);
    }
    fn rpc_error(&self, label: &'static str) {
        lock(&self.0.rpc_errors).push(label);
    }
    fn helper_time(&self, _e: Duration) {
        self.0.helper_times.fetch_add(1, Ordering::SeqCst);
    }
    fn helper_error(&self) {
        self.0.helper_errors.fetch_add(1, Ordering::SeqCst);
    }
    fn helper_shutdown(&self) {
        self.0.helper_shutdowns.fetch_add(1, Ordering::SeqCst);
    }
    fn provisioned(&self) {
        self.0.provisioned.fetch_add(1, Ordering::SeqCst);
    }
    fn provision_error(&self) {
        self.0.provision_errors.fetch_add(1, Ordering::SeqCst);
    }
    fn invalid_identity(&self) {
        self.0.invalid_identities.fetch_add(1, Ordering::SeqCst);
    }
    fn lock_held(&self) {
        self.0.lock_held.fetch_add(1, Ordering::SeqCst);
    }
    fn discovered(&self) {
        self.0.discovered.fetch_add(1, Ordering::SeqCst);
    }
    fn event_discovered(&self) {
        self.0.event_discovered.fetch_add(1, Ordering::SeqCst);
    }
    fn paused(&self, paused: bool) {
        lock(&self.0.paused).push(paused);
    }
    fn busy_workers(&self, n: usize) {
        self.0.max_busy.fetch_max(n, Ordering::SeqCst);
    }
}

/// Entropy that is always the same: every byte `self.0`, every range its low end.
#[derive(Debug, Clone, Copy)]
pub struct FixedRandom(pub u8);

impl Random for FixedRandom {
    fn fill_bytes(&self, buf: &mut [u8]) {
        buf.fill(self.0);
    }

    fn in_range(&self, low: u64, _high: u64) -> u64 {
        low
    }
}

/// A wall clock that says what it is set to; clones share the time.
#[derive(Debug, Clone, Default)]
pub struct FixedClock(Arc<AtomicI64>);

impl FixedClock {
    /// A clock at `unix` seconds.
    pub fn at(unix: i64) -> Self {
        FixedClock(Arc::new(AtomicI64::new(unix)))
    }

    /// Moves the clock to `unix` seconds.
    pub fn set(&self, unix: i64) {
        self.0.store(unix, Ordering::SeqCst);
    }
}

impl Clock for FixedClock {
    fn now_unix(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}
