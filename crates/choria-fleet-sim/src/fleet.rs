//! The running fleet: one NATS connection, one wildcard subscription for directed requests and
//! one per broadcast agent, requests dispatched to nodes by identity (broadcasts fanned out
//! in-process), replies and lifecycle events published by a bounded set of tasks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use choria_rpc_client::lifecycle::LifecycleEvent;
use choria_rpc_client::protocol::{self, NodeInfo, ProtocolVersion, Request, ServerRequest};
use futures::StreamExt as _;
use serde::Serialize;
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{is_affected, FaultKind, FleetConfig, ProvisioningJwt};
use crate::crypto::{self, CryptoError, PoolKey};
use crate::node::{Call, Effect, Node, NodeEnv, NodeOutcome, NodeReport, Phase, AGENTS};

const COLLECTIVE: &str = "provisioning";
const DIRECTED: &str = "provisioning.node.";

/// Why a fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The configuration is unusable.
    #[error("invalid fleet configuration: {0}")]
    Config(String),
    /// Key material could not be loaded or used.
    #[error("fleet keys: {0}")]
    Crypto(#[from] CryptoError),
    /// The broker could not be reached.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// Broker URL.
        url: String,
        /// The client's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// A subscription failed.
    #[error("cannot subscribe to {subject}: {source}")]
    Subscribe {
        /// Subject.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::SubscribeError,
    },
}

/// Counters of a running fleet.
#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    replies: AtomicU64,
    discovery_replies: AtomicU64,
    ignored: AtomicU64,
    events: AtomicU64,
    configured: AtomicUsize,
    provisioned: AtomicUsize,
    broken: AtomicUsize,
    shut_down: AtomicUsize,
}

/// A snapshot of a fleet's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Nodes in the fleet.
    pub nodes: usize,
    /// Requests received (a broadcast counts once).
    pub requests: u64,
    /// Replies published.
    pub replies: u64,
    /// Discovery replies among them.
    pub discovery_replies: u64,
    /// Requests dropped: undecodable, other protocol version, outside the TTL, no reply subject.
    pub ignored: u64,
    /// Lifecycle events published.
    pub events: u64,
    /// Successful `configure` calls.
    pub configured: usize,
    /// Nodes out of provisioning mode with a usable configuration.
    pub provisioned: usize,
    /// Nodes out of provisioning mode with an unusable configuration.
    pub broken: usize,
    /// Nodes stopped by `shutdown`.
    pub shut_down: usize,
}

struct Inner {
    cfg: FleetConfig,
    identities: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
    nodes: Vec<Mutex<Node>>,
    jwt: String,
    config_dir: String,
    agents: Vec<String>,
    facts: serde_json::Value,
    pool: OnceLock<Vec<PoolKey>>,
    pool_ready: Notify,
    pool_started: std::sync::Once,
    client: async_nats::Client,
    counters: Counters,
    changed: Notify,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

/// A simulated fleet running in this process.
pub struct SimFleet {
    inner: Arc<Inner>,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The provisioning token claims as `choria jwt prov` makes them (field order of the tokens
/// library's struct).
#[derive(Serialize)]
struct ProvisioningClaims<'a> {
    cht: &'a str,
    chs: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    chu: &'a str,
    chpd: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    chusr: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    chpwd: Option<&'a str>,
    extensions: Option<()>,
    ou: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    v2: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    update: bool,
    purpose: &'a str,
    iss: &'a str,
    sub: &'a str,
    exp: i64,
    nbf: i64,
    iat: i64,
    jti: String,
}

/// Sign the provisioning JWT every node serves from `jwt`.
pub fn provisioning_jwt(cfg: &FleetConfig) -> Result<String, CryptoError> {
    match &cfg.provisioning_jwt {
        ProvisioningJwt::Verbatim(t) => Ok(t.clone()),
        ProvisioningJwt::Sign(signer) => {
            let now = unix_now();
            signer.sign(&ProvisioningClaims {
                cht: &cfg.token,
                chs: false,
                chu: &cfg.broker,
                chpd: true,
                chusr: cfg.nats_user.as_ref().map(|(u, _)| u.as_str()),
                chpwd: cfg.nats_user.as_ref().map(|(_, p)| p.as_str()),
                extensions: None,
                ou: "choria",
                v2: cfg.protocol == ProtocolVersion::V2,
                update: cfg.upgradable,
                purpose: "choria_provisioning",
                iss: "Choria Tokens Package",
                sub: "choria_provisioning",
                exp: now + 365 * 86_400,
                nbf: now,
                iat: now,
                jti: crypto::ksuid(now),
            })
        }
    }
}

mod insecure_tls {
    //! TLS without verifying the broker, as go-choria servers connect in provisioning mode.
    use async_nats::rustls;
    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};
    use std::sync::Arc;

    #[derive(Debug)]
    struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    /// A client configuration accepting any broker certificate.
    pub(super) fn config() -> Result<rustls::ClientConfig, rustls::Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(
            rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
                .with_no_client_auth(),
        )
    }
}

impl SimFleet {
    /// Connect, subscribe and bring the fleet up: every node publishes its startup event
    /// (staggered by `startup_rate`) and answers in the `provisioning` collective.
    pub async fn start(cfg: FleetConfig) -> Result<SimFleet, FleetError> {
        let ids = cfg.identity_list();
        if ids.is_empty() {
            return Err(FleetError::Config("the fleet has no nodes".into()));
        }
        if cfg.token.is_empty() {
            return Err(FleetError::Config("the provisioning token is empty".into()));
        }
        if let Some(bad) = ids.iter().find(|i| {
            i.is_empty() || i.contains(|c: char| c == '*' || c == '>' || c.is_whitespace())
        }) {
            return Err(FleetError::Config(format!("invalid identity {bad:?}")));
        }
        let jwt = provisioning_jwt(&cfg)?;
        let identities: Vec<Arc<str>> = ids.into_iter().map(Arc::from).collect();
        let mut index = HashMap::with_capacity(identities.len());
        for (i, id) in identities.iter().enumerate() {
            let n = u32::try_from(i).map_err(|_| FleetError::Config("too many nodes".into()))?;
            if index.insert(id.clone(), n).is_some() {
                return Err(FleetError::Config(format!("duplicate identity {id}")));
            }
        }
        let pool = OnceLock::new();
        if let Some(pem_text) = &cfg.rsa_keys_pem {
            let keys = PoolKey::from_pem_many(pem_text)?;
            if keys.is_empty() {
                return Err(FleetError::Config("no rsa keys in the key file".into()));
            }
            let _ = pool.set(keys);
        }

        let mut opts = async_nats::ConnectOptions::new()
            .name("choria-fleet-sim")
            .subscription_capacity(1 << 16);
        if cfg.token_auth {
            opts = opts.token(jwt.clone());
        }
        if let Some((u, p)) = &cfg.nats_user {
            opts = opts.user_and_password(u.clone(), p.clone());
        }
        if let Some(ca) = &cfg.tls_ca {
            opts = opts.add_root_certificates(ca.clone()).require_tls(true);
        } else if cfg.tls {
            let tls = insecure_tls::config().map_err(|e| FleetError::Config(e.to_string()))?;
            opts = opts.tls_client_config(tls).require_tls(true);
        }
        let addrs: Vec<async_nats::ServerAddr> = cfg
            .broker
            .split(',')
            .map(|u| u.trim().parse())
            .collect::<Result<_, _>>()
            .map_err(|e| FleetError::Config(format!("broker {}: {e}", cfg.broker)))?;
        let client = opts
            .connect(addrs)
            .await
            .map_err(|source| FleetError::Connect {
                url: cfg.broker.clone(),
                source,
            })?;

        let config_dir = std::path::Path::new(&cfg.config_file)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "/etc/choria".into());
        let nodes = (0..identities.len())
            .map(|_| Mutex::new(Node::default()))
            .collect();
        let inner = Arc::new(Inner {
            identities,
            index,
            nodes,
            jwt,
            config_dir,
            agents: AGENTS.iter().map(|a| a.to_string()).collect(),
            facts: serde_json::json!({}),
            pool,
            pool_ready: Notify::new(),
            pool_started: std::sync::Once::new(),
            client,
            counters: Counters::default(),
            changed: Notify::new(),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
            cfg,
        });

        let mut subs = Vec::new();
        // Only the fleet's own names: a name nobody simulates (an announcement for a node that
        // does not exist) then gets the broker's "no responders", as on a real network.
        let mut subjects = Vec::new();
        if inner.cfg.nodes > 0 {
            let generated = inner.cfg.identities.is_none()
                && !inner.cfg.identity_prefix.contains(['.', '*', '>', ' '])
                && !inner.cfg.domain.is_empty()
                && !inner.cfg.domain.contains(['*', '>', ' ']);
            subjects.push(if generated {
                format!("{DIRECTED}*.{}", inner.cfg.domain)
            } else {
                format!("{DIRECTED}>")
            });
        }
        subjects.extend(
            ["discovery", "rpcutil", "choria_provision", "choria_util"]
                .iter()
                .map(|a| protocol::broadcast_subject(COLLECTIVE, a)),
        );
        for subject in subjects {
            let sub = inner
                .client
                .subscribe(subject.clone())
                .await
                .map_err(|source| FleetError::Subscribe { subject, source })?;
            subs.push(sub);
        }
        // Make sure the broker has the subscriptions before anyone is told we are up.
        let _ = inner.client.flush().await;

        if inner.cfg.mode == crate::config::Mode::Pki {
            inner.start_pool();
        }

        let rx = inner.clone();
        inner.tracker.spawn(async move { rx.receive(subs).await });
        let ev = inner.clone();
        inner
            .tracker
            .spawn(async move { ev.startup_events().await });
        Ok(SimFleet { inner })
    }

    /// Identities of the fleet, in order.
    pub fn identities(&self) -> Vec<String> {
        self.inner
            .identities
            .iter()
            .map(|i| i.to_string())
            .collect()
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.inner.identities.len()
    }

    /// Always false: a fleet has at least one node.
    pub fn is_empty(&self) -> bool {
        self.inner.identities.is_empty()
    }

    /// Nodes provisioned so far.
    pub fn provisioned(&self) -> usize {
        self.inner.counters.provisioned.load(Ordering::Relaxed)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            nodes: self.len(),
            requests: c.requests.load(Ordering::Relaxed),
            replies: c.replies.load(Ordering::Relaxed),
            discovery_replies: c.discovery_replies.load(Ordering::Relaxed),
            ignored: c.ignored.load(Ordering::Relaxed),
            events: c.events.load(Ordering::Relaxed),
            configured: c.configured.load(Ordering::Relaxed),
            provisioned: c.provisioned.load(Ordering::Relaxed),
            broken: c.broken.load(Ordering::Relaxed),
            shut_down: c.shut_down.load(Ordering::Relaxed),
        }
    }

    /// The phase of one node.
    pub fn phase(&self, identity: &str) -> Option<Phase> {
        let i = *self.inner.index.get(identity)?;
        let node = self.inner.nodes.get(i as usize)?;
        Some(node.lock().map(|n| n.phase).unwrap_or(Phase::Broken))
    }

    /// The report record of one node.
    pub fn node_report(&self, identity: &str) -> Option<NodeReport> {
        let i = *self.inner.index.get(identity)?;
        self.inner.report_of(i as usize)
    }

    /// Report records of every node, in fleet order.
    pub fn report(&self) -> Vec<NodeReport> {
        (0..self.len())
            .filter_map(|i| self.inner.report_of(i))
            .collect()
    }

    /// Wait until at least `target` nodes are provisioned, or `timeout` passes; true if reached.
    pub async fn wait_provisioned(&self, target: usize, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.inner.changed.notified();
            if self.provisioned() >= target {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.provisioned() >= target;
            }
        }
    }

    /// A future that resolves when the state of any node changes (configure, restart, shutdown).
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }

    /// Stop answering, wait (bounded) for pending replies and events, and close the connection.
    pub async fn shutdown(self) {
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.inner.tracker.wait()).await;
        let _ = self.inner.client.flush().await;
    }
}

impl Inner {
    fn report_of(&self, i: usize) -> Option<NodeReport> {
        let id = self.identities.get(i)?;
        let node = self.nodes.get(i)?.lock().ok()?;
        Some(node.report(id, &self.cfg.version))
    }

    fn env(&self, idx: usize) -> NodeEnv<'_> {
        let rsa_key = self
            .pool
            .get()
            .filter(|p| !p.is_empty())
            .and_then(|p| p.get(idx % p.len()));
        NodeEnv {
            token: &self.cfg.token,
            jwt: &self.jwt,
            version: &self.cfg.version,
            upgradable: self.cfg.upgradable,
            config_file: &self.cfg.config_file,
            config_dir: &self.config_dir,
            issuer: self.cfg.issuer_public.as_ref(),
            mode: self.cfg.mode,
            lock_window: self.cfg.lock_window,
            rsa_key,
            faults: &self.cfg.faults,
            now: Instant::now(),
            unix_now: unix_now(),
        }
    }

    async fn receive(self: Arc<Self>, subs: Vec<async_nats::Subscriber>) {
        let permits = Arc::new(Semaphore::new(self.cfg.workers.max(1)));
        let mut all = futures::stream::select_all(subs);
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => break,
                m = all.next() => match m { Some(m) => m, None => break },
            };
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            let me = self.clone();
            self.tracker.spawn(async move {
                me.handle(msg.subject.as_str(), &msg.payload).await;
                drop(permit);
            });
        }
    }

    async fn handle(self: &Arc<Self>, subject: &str, payload: &[u8]) {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let req = match ServerRequest::parse(payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("dropping undecodable request on {subject}: {e}");
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // A v1 server drops v2 requests and vice versa; stale or future requests are dropped.
        if req.version != self.cfg.protocol
            || !req.is_fresh(SystemTime::now())
            || req.reply_to.is_none()
        {
            self.counters.ignored.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let req = Arc::new(req);
        if let Some(identity) = subject.strip_prefix(DIRECTED) {
            match self.index.get(identity) {
                Some(&i) => self.answer(i as usize, &req).await,
                None => {
                    self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        for i in 0..self.identities.len() {
            if self.cancel.is_cancelled() {
                return;
            }
            self.answer(i, &req).await;
        }
    }

    async fn answer(self: &Arc<Self>, idx: usize, req: &Arc<Request>) {
        let Some(identity) = self.identities.get(idx).cloned() else {
            return;
        };
        let info = NodeInfo {
            identity: &identity,
            agents: &self.agents,
            classes: &[],
            facts: &self.facts,
        };
        if !req.filter.matches(&info) {
            return;
        }
        let is_gencsr =
            req.agent == "choria_provision" && req.payload.windows(6).any(|w| w == b"gencsr");
        if is_gencsr {
            // CSRs need the key pool; RSA signing is slow, so keep it off the reactor.
            self.wait_pool().await;
            let me = self.clone();
            let r = req.clone();
            let id = identity.clone();
            let out = tokio::task::spawn_blocking(move || me.run_node(idx, &id, &r)).await;
            if let Ok(Some(out)) = out {
                self.deliver(idx, &identity, req, out).await;
            }
            return;
        }
        if let Some(out) = self.run_node(idx, &identity, req) {
            self.deliver(idx, &identity, req, out).await;
        }
    }

    /// Generate the RSA pool in the background unless it exists. A plain thread rather than a
    /// runtime task: key generation cannot be interrupted and must not hold up shutdown.
    fn start_pool(self: &Arc<Self>) {
        if self.pool.get().is_some() {
            return;
        }
        let me = self.clone();
        self.pool_started.call_once(move || {
            let spawned = std::thread::Builder::new()
                .name("rsa-pool".into())
                .spawn(move || {
                    let size = me.cfg.rsa_pool_size.max(1);
                    let keys: Vec<PoolKey> =
                        (0..size).filter_map(|_| PoolKey::generate().ok()).collect();
                    if keys.is_empty() {
                        tracing::error!("could not generate any rsa key for gencsr");
                    }
                    let _ = me.pool.set(keys);
                    me.pool_ready.notify_waiters();
                });
            if let Err(e) = spawned {
                tracing::error!("cannot start rsa key generation: {e}");
            }
        });
    }

    async fn wait_pool(self: &Arc<Self>) {
        self.start_pool();
        loop {
            let ready = self.pool_ready.notified();
            if self.pool.get().is_some() {
                return;
            }
            tokio::select! {
                _ = ready => {},
                _ = tokio::time::sleep(Duration::from_millis(200)) => {},
            }
        }
    }

    fn run_node(&self, idx: usize, identity: &str, req: &Request) -> Option<NodeOutcome> {
        let mut node = self.nodes.get(idx)?.lock().ok()?;
        if !node.answers() {
            return None;
        }
        if req.agent == "discovery" {
            return Some(node.discovery(&req.payload));
        }
        let env = self.env(idx);
        Some(node.rpc(
            &env,
            &req.agent,
            &Call {
                identity,
                sender: &req.sender,
                caller: &req.caller,
                payload: &req.payload,
            },
        ))
    }

    async fn deliver(
        self: &Arc<Self>,
        idx: usize,
        identity: &Arc<str>,
        req: &Request,
        out: NodeOutcome,
    ) {
        if let Some(body) = out.reply {
            let body = self.cfg.faults.reply_body(identity, &req.agent, body);
            let copies = self.cfg.faults.reply_copies(identity, &req.agent);
            let sender = if out.wrong_identity {
                format!("wrong-{identity}")
            } else {
                identity.to_string()
            };
            match protocol::build_reply(req, &sender, &body) {
                Ok(bytes) => {
                    let subject = req.reply_to.clone().unwrap_or_default();
                    if req.agent == "discovery" {
                        self.counters
                            .discovery_replies
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    match self.cfg.faults.slow_for(identity) {
                        Some(delay) => {
                            let me = self.clone();
                            self.tracker.spawn(async move {
                                tokio::select! {
                                    _ = me.cancel.cancelled() => {},
                                    _ = tokio::time::sleep(delay) => me.publish(subject, bytes).await,
                                }
                            });
                        }
                        None => {
                            for _ in 1..copies {
                                self.publish(subject.clone(), bytes.clone()).await;
                            }
                            self.publish(subject, bytes).await
                        }
                    }
                }
                Err(e) => tracing::warn!("{identity}: cannot build reply to {}: {e}", req.agent),
            }
        }
        for effect in out.effects {
            match effect {
                Effect::Event {
                    kind,
                    component,
                    new_version,
                } => {
                    if kind == "provisioned" {
                        self.counters.configured.fetch_add(1, Ordering::Relaxed);
                        self.changed.notify_waiters();
                    }
                    let mut e = LifecycleEvent::new(kind, identity, component);
                    if kind == "upgraded" {
                        e.version = Some(self.cfg.version.clone());
                        e.new_version = new_version;
                    }
                    self.event(e).await;
                }
                Effect::Restart | Effect::Shutdown => {
                    let me = self.clone();
                    let id = identity.clone();
                    self.tracker.spawn(async move {
                        tokio::select! {
                            _ = me.cancel.cancelled() => return,
                            _ = tokio::time::sleep(me.cfg.restart_delay) => {},
                        }
                        if effect == Effect::Restart {
                            me.finish_restart(idx, &id).await;
                        } else {
                            me.finish_shutdown(idx, &id).await;
                        }
                    });
                }
            }
        }
    }

    async fn finish_restart(&self, idx: usize, identity: &str) {
        let (component, phase, version) = {
            let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) else {
                return;
            };
            let env = self.env(idx);
            let c = node.finish_restart(&env, identity);
            (c, node.phase, node.version(&self.cfg.version).to_string())
        };
        match phase {
            Phase::Provisioned => {
                self.counters.provisioned.fetch_add(1, Ordering::Relaxed);
            }
            Phase::Broken => {
                self.counters.broken.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("{identity}: restarted with an unusable configuration");
            }
            _ => {}
        }
        self.changed.notify_waiters();
        if let Some(component) = component {
            self.event(LifecycleEvent::startup(identity, component, &version))
                .await;
        }
    }

    async fn finish_shutdown(&self, idx: usize, identity: &str) {
        if let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) {
            node.finish_shutdown();
        }
        self.counters.shut_down.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
        self.event(LifecycleEvent::new(
            "shutdown",
            identity,
            "provision_mode_server",
        ))
        .await;
    }

    async fn publish(&self, subject: String, bytes: Bytes) {
        match self.client.publish(subject, bytes).await {
            Ok(()) => {
                self.counters.replies.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!("cannot publish a reply: {e}"),
        }
    }

    async fn event(&self, e: LifecycleEvent) {
        let body = if self.cfg.legacy_lifecycle {
            e.to_choria_json()
        } else {
            e.to_cloudevent_json()
        };
        let Ok(body) = body else { return };
        match self.client.publish(e.subject(), Bytes::from(body)).await {
            Ok(()) => {
                self.counters.events.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => tracing::warn!(
                "{}: cannot publish {} event: {err}",
                e.identity,
                e.event_type()
            ),
        }
    }

    /// Every node announces itself, `startup_rate` per second, as servers coming up would;
    /// first come `bogus_events` announcements of nodes that do not exist.
    async fn startup_events(self: Arc<Self>) {
        for n in 0..self.cfg.bogus_events {
            if self.cancel.is_cancelled() {
                return;
            }
            let id = crate::config::bogus_identity(n, &self.cfg.domain);
            self.event(LifecycleEvent::startup(
                &id,
                "provision_mode_server",
                &self.cfg.version,
            ))
            .await;
            if n % 1000 == 999 {
                // Let the broker keep up rather than dropping the connection as a slow one.
                let _ = self.client.flush().await;
            }
        }
        if self.cfg.bogus_events > 0 {
            let _ = self.client.flush().await;
            tracing::warn!("published {} bogus startup events", self.cfg.bogus_events);
        }
        let rate = self.cfg.startup_rate;
        if rate == 0 {
            return;
        }
        // Ticks of 10 ms carrying rate/100 events (at least one).
        let per_tick = usize::try_from(rate / 100).unwrap_or(1).max(1);
        let tick = Duration::from_secs_f64(per_tick as f64 / f64::from(rate));
        let mut interval = tokio::time::interval(tick);
        for chunk in self.identities.chunks(per_tick) {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = interval.tick() => {},
            }
            for id in chunk {
                self.event(LifecycleEvent::startup(
                    id,
                    "provision_mode_server",
                    &self.cfg.version,
                ))
                .await;
            }
        }
    }
}

/// Whether `identity` is affected by a fault of `kind` in this configuration's fault set.
pub fn node_has_fault(cfg: &FleetConfig, kind: FaultKind, identity: &str) -> bool {
    let f = &cfg.faults;
    match kind {
        FaultKind::Slow => f.slow_for(identity).is_some(),
        FaultKind::Drop => is_affected(kind, identity, f.drop),
        FaultKind::DropOnce => is_affected(kind, identity, f.drop_once),
        FaultKind::BadNonce => is_affected(kind, identity, f.bad_nonce),
        FaultKind::WrongIdentity => is_affected(kind, identity, f.wrong_identity),
        FaultKind::BadCsr => is_affected(kind, identity, f.bad_csr),
        FaultKind::FailAction => f
            .fail_action
            .iter()
            .any(|(_, s)| is_affected(kind, identity, *s)),
        FaultKind::BadCsrSignature => is_affected(kind, identity, f.bad_csr_signature),
        FaultKind::Garbage => is_affected(kind, identity, f.garbage),
        FaultKind::Duplicate => is_affected(kind, identity, f.duplicate),
        FaultKind::Oversize => is_affected(kind, identity, f.oversize),
        FaultKind::DeniedSan => is_affected(kind, identity, f.denied_san),
    }
}
