//! The running fleet: one NATS connection, one wildcard subscription for directed requests and
//! one per broadcast agent in each collective (`provisioning`, and with `stay_online` each
//! main collective provisioned nodes joined), requests dispatched to nodes by identity
//! (broadcasts fanned out in-process), replies and lifecycle events published by a bounded set
//! of tasks.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use choria_rpc_client::lifecycle::LifecycleEvent;
use choria_rpc_client::protocol::{
    self, Matcher, NodeInfo, ProtocolVersion, Request, ServerRequest,
};
use futures::StreamExt as _;
use serde::Serialize;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{is_affected, FaultKind, FleetConfig, Mode, ProvisioningJwt};
use crate::crypto::{self, CryptoError, NodeKeys, PoolKey};
use crate::node::{
    Call, Effect, Enrollment, EnrollmentSource, IssuerCheck, Node, NodeEnv, NodeOutcome,
    NodeReport, Phase, AGENTS,
};

const COLLECTIVE: &str = "provisioning";
const DIRECTED: &str = "provisioning.node.";

/// Most distinct collectives the fleet subscribes for its provisioned nodes (each costs five
/// subscriptions); a configuration naming more leaves its node broken.
pub const MAX_FLEET_COLLECTIVES: usize = 64;

/// Most distinct collective sets (a main collective and the others) nodes may be in.
pub const MAX_COLLECTIVE_SETS: usize = 256;

/// Why a provisioned node could not go online on its collectives.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Its configuration names a collective that cannot be a subject token.
    #[error("{identity}: {action}: invalid collective {collective:?} in the configuration")]
    InvalidCollective {
        /// Node identity.
        identity: String,
        /// What the node was doing.
        action: &'static str,
        /// The collective, cut to 80 characters.
        collective: String,
    },
    /// Its configuration names more collectives than the simulator takes.
    #[error("{identity}: {action}: {count} collectives in the configuration, at most {max}")]
    TooManyCollectives {
        /// Node identity.
        identity: String,
        /// What the node was doing.
        action: &'static str,
        /// Collectives named.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The fleet's limit of collectives or collective sets is reached.
    #[error(
        "{identity}: {action}: the fleet already serves the most collectives it takes ({max})"
    )]
    FleetCollectives {
        /// Node identity.
        identity: String,
        /// What the node was doing.
        action: &'static str,
        /// The limit.
        max: usize,
    },
    /// Subscribing to a collective's subjects failed.
    #[error("{identity}: {action}: cannot subscribe to {subject}: {source}")]
    Subscribe {
        /// Node identity.
        identity: String,
        /// What the node was doing.
        action: &'static str,
        /// Subject.
        subject: String,
        /// The client's error.
        #[source]
        source: async_nats::SubscribeError,
    },
}

/// Which nodes a request can reach: those in provisioning mode, or provisioned nodes online
/// in a collective (`member[set]`: the collective is in that collective set).
#[derive(Clone)]
enum Scope {
    Provisioning,
    Main(Arc<[bool]>),
}

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
    events_skipped: AtomicU64,
    configured: AtomicUsize,
    provisioned: AtomicUsize,
    broken: AtomicUsize,
    shut_down: AtomicUsize,
    provisions: AtomicU64,
    reprovision_requests: AtomicU64,
    reprovisioned: AtomicU64,
    unverified: AtomicU64,
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
    /// Startup events not published because discovery had provisioned their node first.
    pub events_skipped: u64,
    /// Successful `configure` calls.
    pub configured: usize,
    /// Nodes out of provisioning mode with a usable configuration.
    pub provisioned: usize,
    /// Nodes out of provisioning mode with an unusable configuration.
    pub broken: usize,
    /// Nodes stopped by `shutdown`.
    pub shut_down: usize,
    /// Nodes started already provisioned.
    pub preprovisioned: usize,
    /// Times any node restarted out of provisioning mode with a usable configuration (a node
    /// provisioned twice counts twice; nodes started provisioned are not counted).
    pub provisions: u64,
    /// `reprovision` requests that started a provisioned node's return to provisioning mode
    /// (a repeat while one is pending is answered but not counted).
    pub reprovision_requests: u64,
    /// Times a provisioned node went back into provisioning mode after `reprovision`.
    pub reprovisioned: u64,
    /// Requests on a main collective dropped because their signature does not verify.
    pub unverified: u64,
}

struct Inner {
    cfg: FleetConfig,
    /// When the fleet started, Unix seconds: the start of every node not restarted since.
    started: i64,
    identities: Vec<Arc<str>>,
    index: HashMap<Arc<str>, u32>,
    nodes: Vec<Mutex<Node>>,
    jwt: String,
    config_dir: String,
    agents: Vec<String>,
    facts: serde_json::Value,
    pool: OnceLock<Vec<PoolKey>>,
    /// CSRs being made at once, at most `workers`.
    csr_permits: Arc<Semaphore>,
    /// Key pairs made at start ([`NodeKeys`]).
    keys: Vec<NodeKeys>,
    pool_ready: Notify,
    pool_started: std::sync::Once,
    client: async_nats::Client,
    /// Collective sets provisioned nodes are online in, main collective first; a node holds
    /// the index of its set.
    collective_sets: RwLock<Vec<Arc<[String]>>>,
    /// Collectives whose subjects the fleet subscribes to (besides `provisioning`).
    subscribed: tokio::sync::Mutex<HashSet<String>>,
    /// New subscriptions for the receive loop.
    new_subs: mpsc::Sender<async_nats::Subscriber>,
    counters: Counters,
    /// Server JWTs received, for `issuer_check_every`.
    issuer_seen: std::sync::atomic::AtomicU64,
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
        if cfg.preprovisioned > ids.len() {
            return Err(FleetError::Config(format!(
                "{} nodes cannot start provisioned in a fleet of {}",
                cfg.preprovisioned,
                ids.len()
            )));
        }
        if cfg.preprovisioned > 0 && !cfg.stay_online {
            return Err(FleetError::Config(
                "nodes started provisioned need stay_online".into(),
            ));
        }
        let pre_collective = cfg.preprovisioned_collective();
        if cfg.preprovisioned > 0 && !crate::config::valid_collective(&pre_collective) {
            return Err(FleetError::Config(format!(
                "invalid main collective {pre_collective:?}"
            )));
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
        let now = unix_now();
        let expires = now.saturating_add(
            i64::try_from(cfg.preprovisioned_expires_in.as_secs()).unwrap_or(i64::MAX),
        );
        let mode = cfg.mode;
        let nodes = (0..identities.len())
            .map(|i| {
                Mutex::new(if i < cfg.preprovisioned {
                    Node::preprovisioned(0, preprovisioned_enrollment(mode, now, expires))
                } else {
                    Node::default()
                })
            })
            .collect();
        let mut sets: Vec<Arc<[String]>> = Vec::new();
        if cfg.preprovisioned > 0 {
            sets.push(Arc::from(vec![pre_collective.clone()]));
        }
        let (new_subs, new_subs_rx) = mpsc::channel(64);
        let keys = NodeKeys::pool(
            identities.len().min(crypto::NODE_KEY_POOL),
            mode == Mode::Ed25519,
        );
        let inner = Arc::new(Inner {
            csr_permits: Arc::new(Semaphore::new(cfg.workers.max(1))),
            started: now,
            keys,
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
            collective_sets: RwLock::new(sets),
            subscribed: tokio::sync::Mutex::new(HashSet::new()),
            new_subs,
            counters: Counters::default(),
            issuer_seen: AtomicU64::new(0),
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
        if inner.cfg.preprovisioned > 0 {
            subs.extend(
                inner
                    .collective_subscriptions(&pre_collective)
                    .await
                    .map_err(|(subject, source)| FleetError::Subscribe { subject, source })?,
            );
            inner.subscribed.lock().await.insert(pre_collective.clone());
            inner
                .counters
                .provisioned
                .fetch_add(inner.cfg.preprovisioned, Ordering::Relaxed);
        }
        // Make sure the broker has the subscriptions before anyone is told we are up.
        let _ = inner.client.flush().await;

        if inner.cfg.mode == crate::config::Mode::Pki {
            inner.start_pool();
        }

        let rx = inner.clone();
        inner
            .tracker
            .spawn(async move { rx.receive(subs, new_subs_rx).await });
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
            events_skipped: c.events_skipped.load(Ordering::Relaxed),
            configured: c.configured.load(Ordering::Relaxed),
            provisioned: c.provisioned.load(Ordering::Relaxed),
            broken: c.broken.load(Ordering::Relaxed),
            shut_down: c.shut_down.load(Ordering::Relaxed),
            preprovisioned: self.inner.cfg.preprovisioned,
            provisions: c.provisions.load(Ordering::Relaxed),
            reprovision_requests: c.reprovision_requests.load(Ordering::Relaxed),
            reprovisioned: c.reprovisioned.load(Ordering::Relaxed),
            unverified: c.unverified.load(Ordering::Relaxed),
        }
    }

    /// Wait until the counters satisfy `done`, or `timeout` passes; true if they did.
    pub async fn wait_for(&self, mut done: impl FnMut(&Stats) -> bool, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.inner.changed.notified();
            if done(&self.stats()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return done(&self.stats());
            }
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
        let set = node.online().and_then(|s| self.collective_set(s));
        Some(node.report(id, &self.cfg.version, set.as_deref()))
    }

    fn collective_set(&self, set: u16) -> Option<Arc<[String]>> {
        self.collective_sets
            .read()
            .ok()?
            .get(usize::from(set))
            .cloned()
    }

    fn env<'a>(
        &'a self,
        idx: usize,
        key_generation: usize,
        collectives: Option<&'a [String]>,
    ) -> NodeEnv<'a> {
        let rsa_key = self
            .pool
            .get()
            .filter(|p| !p.is_empty())
            .and_then(|p| p.get(idx.wrapping_add(key_generation) % p.len()));
        let keys = (!self.keys.is_empty())
            .then(|| &self.keys[idx.wrapping_add(key_generation) % self.keys.len()]);
        NodeEnv {
            token: &self.cfg.token,
            jwt: &self.jwt,
            version: &self.cfg.version,
            upgradable: self.cfg.upgradable,
            config_file: &self.cfg.config_file,
            config_dir: &self.config_dir,
            issuer: self.cfg.issuer_public.as_ref().map(|key| IssuerCheck {
                key,
                every: self.cfg.issuer_check_every,
                seen: &self.issuer_seen,
            }),
            mode: self.cfg.mode,
            lock_window: self.cfg.lock_window,
            rsa_key,
            keys,
            faults: &self.cfg.faults,
            now: Instant::now(),
            unix_now: unix_now(),
            fleet_started: self.started,
            collectives,
            reprovision_delay: self.cfg.reprovision_delay,
            stay_online: self.cfg.stay_online,
        }
    }

    /// Subscribe to a collective's directed subject (a wildcard, as for `provisioning`) and
    /// its broadcast agent subjects; the caller hands them to the receive loop.
    async fn collective_subscriptions(
        &self,
        collective: &str,
    ) -> Result<Vec<async_nats::Subscriber>, (String, async_nats::SubscribeError)> {
        let mut subjects = vec![if self.generated_names() {
            format!("{collective}.node.*.{}", self.cfg.domain)
        } else {
            format!("{collective}.node.>")
        }];
        subjects.extend(
            AGENTS
                .iter()
                .map(|a| protocol::broadcast_subject(collective, a)),
        );
        let mut subs = Vec::with_capacity(subjects.len());
        for subject in subjects {
            match self.client.subscribe(subject.clone()).await {
                Ok(s) => subs.push(s),
                Err(e) => return Err((subject, e)),
            }
        }
        Ok(subs)
    }

    /// Whether every identity is `<prefix>-<n>.<domain>`, so one wildcard per collective
    /// covers the fleet's directed subjects and no more.
    fn generated_names(&self) -> bool {
        self.cfg.identities.is_none()
            && !self.cfg.identity_prefix.contains(['.', '*', '>', ' '])
            && !self.cfg.domain.is_empty()
            && !self.cfg.domain.contains(['*', '>', ' '])
    }

    /// Put a node just restarted out of provisioning mode online on the collectives of its
    /// configuration: intern the set, subscribe to collectives not yet served.
    async fn go_online(&self, idx: usize, identity: &str) -> Result<(), NodeError> {
        const ACTION: &str = "restart";
        let Some(collectives) = self
            .nodes
            .get(idx)
            .and_then(|n| n.lock().ok())
            .and_then(|n| n.configured_collectives())
        else {
            return Ok(());
        };
        if collectives.len() > crate::config::MAX_COLLECTIVES {
            return Err(NodeError::TooManyCollectives {
                identity: identity.to_string(),
                action: ACTION,
                count: collectives.len(),
                max: crate::config::MAX_COLLECTIVES,
            });
        }
        if let Some(bad) = collectives
            .iter()
            .find(|c| !crate::config::valid_collective(c))
        {
            return Err(NodeError::InvalidCollective {
                identity: identity.to_string(),
                action: ACTION,
                collective: bad.chars().take(80).collect(),
            });
        }
        {
            let mut subscribed = self.subscribed.lock().await;
            for c in &collectives {
                if subscribed.contains(c) {
                    continue;
                }
                if subscribed.len() >= MAX_FLEET_COLLECTIVES {
                    return Err(NodeError::FleetCollectives {
                        identity: identity.to_string(),
                        action: ACTION,
                        max: MAX_FLEET_COLLECTIVES,
                    });
                }
                let subs =
                    self.collective_subscriptions(c)
                        .await
                        .map_err(|(subject, source)| NodeError::Subscribe {
                            identity: identity.to_string(),
                            action: ACTION,
                            subject,
                            source,
                        })?;
                for sub in subs {
                    if self.new_subs.send(sub).await.is_err() {
                        // The receive loop is gone: the fleet is shutting down.
                        return Ok(());
                    }
                }
                let _ = self.client.flush().await;
                subscribed.insert(c.clone());
            }
        }
        let set = {
            let Ok(mut sets) = self.collective_sets.write() else {
                return Ok(());
            };
            match sets.iter().position(|s| **s == *collectives) {
                Some(i) => i,
                None if sets.len() >= MAX_COLLECTIVE_SETS => {
                    return Err(NodeError::FleetCollectives {
                        identity: identity.to_string(),
                        action: ACTION,
                        max: MAX_COLLECTIVE_SETS,
                    })
                }
                None => {
                    sets.push(Arc::from(collectives));
                    sets.len() - 1
                }
            }
        };
        if let (Ok(set), Some(Ok(mut node))) =
            (u16::try_from(set), self.nodes.get(idx).map(|n| n.lock()))
        {
            node.set_online(set);
        }
        Ok(())
    }

    /// Keep the phase gauges (`provisioned`, `broken`, `shut_down`) in step with a node
    /// moving from `before` to `after`.
    fn count_phase(&self, before: Phase, after: Phase) {
        if before == after {
            return;
        }
        let gauge = |p: Phase| match p {
            Phase::Provisioned => Some(&self.counters.provisioned),
            Phase::Broken => Some(&self.counters.broken),
            Phase::ShutDown => Some(&self.counters.shut_down),
            Phase::Provisioning => None,
        };
        if let Some(g) = gauge(before) {
            let _ = g.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
        }
        if let Some(g) = gauge(after) {
            g.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn receive(
        self: Arc<Self>,
        subs: Vec<async_nats::Subscriber>,
        mut new_subs: mpsc::Receiver<async_nats::Subscriber>,
    ) {
        let mut all = futures::stream::select_all(subs);
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => break,
                Some(sub) = new_subs.recv() => {
                    all.push(sub);
                    continue;
                }
                m = all.next() => match m { Some(m) => m, None => break },
            };
            // Answered here rather than in a task of its own: a request is tens of
            // microseconds of work, and the replies of the requests read in a row go out in
            // one write to the broker instead of a write and a task switch each. The one
            // slow answer, a CSR, runs on a blocking thread (`answer`).
            self.handle(msg.subject.as_str(), &msg.payload).await;
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
        let (scope, directed) = if let Some(identity) = subject.strip_prefix(DIRECTED) {
            (Scope::Provisioning, Some(identity))
        } else if subject.starts_with("provisioning.") {
            (Scope::Provisioning, None)
        } else {
            // A main collective: `<collective>.node.<identity>` or a broadcast.
            let Some((collective, rest)) = subject.split_once('.') else {
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                return;
            };
            // A provisioned server verifies the request's signature (see the crate docs for
            // what the simulator does not check).
            if let Err(e) = req.verify() {
                tracing::debug!("dropping request on {subject}: {e}");
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                self.counters.unverified.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let member: Arc<[bool]> = match self.collective_sets.read() {
                Ok(sets) => sets
                    .iter()
                    .map(|s| s.iter().any(|c| c == collective))
                    .collect(),
                Err(_) => return,
            };
            (Scope::Main(member), rest.strip_prefix("node."))
        };
        // Compiled once: a broadcast is matched against every node.
        let matcher = req.filter.matcher();
        if let Some(identity) = directed {
            match self.index.get(identity) {
                Some(&i) => self.answer(i as usize, &req, &matcher, &scope).await,
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
            self.answer(i, &req, &matcher, &scope).await;
        }
    }

    async fn answer(
        self: &Arc<Self>,
        idx: usize,
        req: &Arc<Request>,
        matcher: &Matcher<'_>,
        scope: &Scope,
    ) {
        let Some(identity) = self.identities.get(idx).cloned() else {
            return;
        };
        let info = NodeInfo {
            identity: &identity,
            agents: &self.agents,
            classes: &[],
            facts: &self.facts,
        };
        if !matcher.matches(&info) {
            return;
        }
        let is_gencsr = req.agent == "choria_provision"
            && memchr::memmem::find(&req.payload, b"gencsr").is_some();
        if is_gencsr {
            // CSRs need the key pool, and RSA signing is slow: at most `workers` at once, each
            // in a task of its own that signs on a blocking thread, while other requests are
            // answered.
            let Ok(permit) = self.csr_permits.clone().acquire_owned().await else {
                return;
            };
            let me = self.clone();
            let r = req.clone();
            let sc = scope.clone();
            self.tracker.spawn(async move {
                me.wait_pool().await;
                let signer = me.clone();
                let (id, req) = (identity.clone(), r.clone());
                let out =
                    tokio::task::spawn_blocking(move || signer.run_node(idx, &id, &req, &sc)).await;
                if let Ok(Some(out)) = out {
                    me.deliver(idx, &identity, &r, out).await;
                }
                drop(permit);
            });
            return;
        }
        if let Some(out) = self.run_node(idx, &identity, req, scope) {
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

    fn run_node(
        &self,
        idx: usize,
        identity: &str,
        req: &Request,
        scope: &Scope,
    ) -> Option<NodeOutcome> {
        let mut node = self.nodes.get(idx)?.lock().ok()?;
        let set = match scope {
            Scope::Provisioning if node.answers() => None,
            Scope::Provisioning => return None,
            Scope::Main(member) => {
                let set = node.online()?;
                if !member.get(usize::from(set)).copied().unwrap_or(false) {
                    return None;
                }
                Some(self.collective_set(set)?)
            }
        };
        if req.agent == "discovery" {
            return Some(node.discovery(&req.payload));
        }
        let before = node.phase;
        let env = self.env(idx, node.key_generation(), set.as_deref());
        let out = node.rpc(
            &env,
            &req.agent,
            &Call {
                identity,
                sender: &req.sender,
                caller: &req.caller,
                payload: &req.payload,
            },
        );
        let after = node.phase;
        drop(node);
        self.count_phase(before, after);
        Some(out)
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
                Effect::Reprovision { after } => {
                    self.counters
                        .reprovision_requests
                        .fetch_add(1, Ordering::Relaxed);
                    let me = self.clone();
                    let id = identity.clone();
                    self.tracker.spawn(async move {
                        tokio::select! {
                            _ = me.cancel.cancelled() => return,
                            _ = tokio::time::sleep(after) => {},
                        }
                        me.finish_reprovision(idx, &id).await;
                    });
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
        let (component, before, mut phase, version) = {
            let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) else {
                return;
            };
            let before = node.phase;
            let env = self.env(idx, node.key_generation(), None);
            let c = node.finish_restart(&env, identity);
            (
                c,
                before,
                node.phase,
                node.version(&self.cfg.version).to_string(),
            )
        };
        if phase == Phase::Provisioned && before != Phase::Provisioned {
            self.counters.provisions.fetch_add(1, Ordering::Relaxed);
        }
        if phase == Phase::Provisioned && self.cfg.stay_online {
            if let Err(e) = self.go_online(idx, identity).await {
                tracing::warn!("{e}");
                if let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) {
                    node.break_with(e.to_string());
                    phase = node.phase;
                }
            }
        }
        self.count_phase(before, phase);
        if phase == Phase::Broken {
            tracing::warn!("{identity}: restarted with an unusable configuration");
        }
        self.changed.notify_waiters();
        if let Some(component) = component {
            self.event(LifecycleEvent::startup(identity, component, &version))
                .await;
        }
    }

    async fn finish_shutdown(&self, idx: usize, identity: &str) {
        let mut component = "provision_mode_server";
        if let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) {
            let before = node.phase;
            if before == Phase::Provisioned {
                component = "server";
            }
            node.finish_shutdown();
            drop(node);
            self.count_phase(before, Phase::ShutDown);
        }
        self.changed.notify_waiters();
        self.event(LifecycleEvent::new("shutdown", identity, component))
            .await;
    }

    /// A node's `reprovision` delay is over: it is back in provisioning mode and announces
    /// itself as it does at start.
    async fn finish_reprovision(&self, idx: usize, identity: &str) {
        let version = {
            let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) else {
                return;
            };
            let before = node.phase;
            node.finish_reprovision(unix_now());
            let after = node.phase;
            let v = node.version(&self.cfg.version).to_string();
            drop(node);
            self.count_phase(before, after);
            v
        };
        self.counters.reprovisioned.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
        self.event(LifecycleEvent::startup(
            identity,
            "provision_mode_server",
            &version,
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
        // A thousand at a time, all handed to the connection before any is awaited, so that
        // they leave in large writes: a flood costs its sender little, as an attacker's would.
        let mut start = 0;
        while start < self.cfg.bogus_events {
            if self.cancel.is_cancelled() {
                return;
            }
            let end = (start + 1000).min(self.cfg.bogus_events);
            futures::future::join_all((start..end).map(|n| {
                let id = crate::config::bogus_identity(n, &self.cfg.domain);
                self.event(LifecycleEvent::startup(
                    &id,
                    "provision_mode_server",
                    &self.cfg.version,
                ))
            }))
            .await;
            // Let the broker keep up rather than dropping the connection as a slow one.
            let _ = self.client.flush().await;
            start = end;
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
        for (c, chunk) in self.identities.chunks(per_tick).enumerate() {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = interval.tick() => {},
            }
            for (i, id) in chunk.iter().enumerate() {
                let idx = c * per_tick + i;
                // Nodes started provisioned come up as normal servers.
                let component = if idx < self.cfg.preprovisioned {
                    "server"
                } else {
                    // A node discovery has already provisioned is past its boot in
                    // provisioning mode: a real server announces that boot before anything
                    // can provision it, so an announcement now would be a stale one.
                    let waiting = self
                        .nodes
                        .get(idx)
                        .and_then(|n| n.lock().ok().map(|n| n.answers()))
                        .unwrap_or(false);
                    if !waiting {
                        self.counters.events_skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    "provision_mode_server"
                };
                self.event(LifecycleEvent::startup(id, component, &self.cfg.version))
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

/// The enrollment record of a node started provisioned: identifiers of the credential its
/// mode needs (a certificate serial in [`Mode::Pki`], a server JWT id in [`Mode::Ed25519`]),
/// random and unique, with no credential behind them.
fn preprovisioned_enrollment(mode: Mode, now: i64, expires: i64) -> Enrollment {
    let mut e = Enrollment {
        source: EnrollmentSource::Preprovisioned,
        at: now,
        certificate_serial: None,
        certificate_sha256: None,
        server_jwt_id: None,
        server_jwt_sha256: None,
        expires: Some(expires),
    };
    match mode {
        Mode::Pki => {
            e.certificate_serial = Some(hex::encode(rand::random::<[u8; 16]>()));
        }
        Mode::Ed25519 => e.server_jwt_id = Some(crypto::ksuid(now)),
        Mode::Plain => {}
    }
    e
}
