//! The running fleet: one NATS connection, one wildcard subscription for directed requests and
//! one per broadcast agent in each collective (`provisioning`, and with `stay_online` each
//! main collective provisioned nodes joined), requests dispatched to nodes by identity
//! (broadcasts fanned out in-process), replies and lifecycle events published by a bounded set
//! of tasks.

mod serve;

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
