//! The provisioning cycle of one node: fetch and check what the node presents, ask the helper,
//! then upgrade, configure and restart it, each step gated by its feature and by the pause state.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use helper_protocol::{
    CsrReply, Ed25519Reply, HelperError, HelperInput, HelperReply, ProvisioningClaims,
};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::admission::{Admission, Decision};
use crate::approval::{Approval, PendingNode};
use crate::claims::{ClaimError, ClaimOutcome, Claims};
use crate::clock::{Clock, Random, SystemClock, SystemRandom};
use crate::config::ProvisionConfig;
use crate::erased::{DynHelper, DynNodeRpc};
use crate::events::{CertificateId, Issued, NodeEvent, ServerJwtId};
use crate::fleet::Source;
use crate::identity::{escaped, IdentityError};
use crate::keys::{KeyMaterial, StaticKeys};
use crate::observer::{NoopObserver, Observer};
use crate::pacing::Pacer;
use crate::pause::PauseState;
use crate::policy::{self, PolicyError, ServerJwtRequest};
use crate::revocation::{key_fingerprints, Revocation};
use crate::rpc::{Action, ConfigureRequest, Helper, Inventory, NodeRpc, RpcError, RpcErrorKind};
use choria_crypto::keyenc::encrypt_private_key_with;

mod steps;

/// Delays between tries of an RPC: a table of steps, the last repeated, each jittered to between
/// half and one and a half times its value. The table is the caller's: the daemon passes
/// go-choria's `FiveSec` policy (`choria_rpc_client::election::backoff::FIVE_SEC`).
#[derive(Debug, Clone)]
pub struct Backoff {
    steps: Vec<Duration>,
    jitter: bool,
}

impl Default for Backoff {
    /// Half a second, then one, two and five seconds, jittered.
    fn default() -> Self {
        Backoff::from_millis(&[500, 1000, 2000, 5000], true)
    }
}

impl Backoff {
    /// Delays from `steps`, jittered when `jitter` is set.
    pub fn from_steps(steps: &[Duration], jitter: bool) -> Self {
        Backoff {
            steps: steps.to_vec(),
            jitter,
        }
    }

    /// Delays from a table in milliseconds (the form go-choria's tables are written in).
    pub fn from_millis(millis: &[u64], jitter: bool) -> Self {
        Backoff {
            steps: millis.iter().copied().map(Duration::from_millis).collect(),
            jitter,
        }
    }

    /// Fixed delays without jitter (for tests and embedders with their own pacing).
    pub fn fixed(steps: Vec<Duration>) -> Self {
        Backoff {
            steps,
            jitter: false,
        }
    }

    /// The delay after the failed try number `try_no` (1-based), jittered from `random`.
    pub fn delay(&self, try_no: u32, random: &dyn Random) -> Duration {
        let Some(last) = self.steps.len().checked_sub(1) else {
            return Duration::ZERO;
        };
        let base = self.steps[(try_no as usize).min(last)];
        if !self.jitter || base.is_zero() {
            return base;
        }
        let ms = base.as_millis() as u64;
        Duration::from_millis(random.in_range(ms / 2, ms + ms / 2))
    }
}

/// How long each try waits at most until a node has answered a request, whatever the action's
/// own timeout: a real server in provisioning mode answers in milliseconds, and a node that does
/// not answer (anyone can announce or answer discovery for names that do not exist) must not hold
/// a worker for a minute (three tries of 22 s).
pub const FIRST_CONTACT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a node's cycle ended without error.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Configured and restarted.
    Provisioned,
    /// Shut down on the helper's request.
    ShutDown,
    /// Asked to upgrade; it restarts and is provisioned again when it comes back.
    Upgraded {
        /// The version it had.
        from: String,
        /// The version requested.
        to: String,
    },
    /// Another provisioner holds the node's lock; it is left alone for the lock window.
    LockHeld {
        /// The action that found the lock.
        action: Action,
    },
    /// `dry_run`: checked, judged by the policy and the helper, and left as it was: nothing was
    /// signed, configured or restarted.
    DryRun {
        /// What the helper's answer would have done: `configure`, `shut down` or `upgrade to V`.
        would: String,
    },
    /// Waiting for an operator's approval (`approval: manual`, or the policy's `pending`):
    /// recorded as pending and left in provisioning mode; nothing was given to the helper.
    Pending {
        /// Why it waits.
        reason: String,
    },
    /// Active-active: another replica holds the node's claim; nothing was sent to the node.
    ClaimedElsewhere {
        /// The replica named in the claim.
        by: String,
        /// That replica finished the node (it is restarting).
        done: bool,
    },
}

/// Why a node's cycle failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProvisionErrorKind {
    /// The identity is not valid (see [`crate::identity`]); nothing was sent to the node.
    #[error("invalid identity: {0}")]
    Identity(#[source] IdentityError),
    /// A node that had never answered did not answer its first request: it is not tried again
    /// (a real node is found again by discovery).
    #[error("did not answer its first request: {0}")]
    FirstContact(#[source] RpcError),
    /// The node waited more than two intervals in the queue: decided by the work queue as the
    /// node leaves it ([`crate::Fleet`]), before anything is sent to it.
    #[error("skipping node that's been waiting {0:?}")]
    Stale(Duration),
    /// Provisioning was paused before a step.
    #[error("provisioning is paused, cannot perform {0}")]
    Paused(&'static str),
    /// An RPC failed after its tries; worded as the Go provisioner words the step that failed.
    #[error("{}", rpc_failure(.0))]
    Rpc(#[from] RpcError),
    /// The provisioning JWT did not validate.
    #[error("could not validate JWT: {0}")]
    Jwt(#[source] PolicyError),
    /// The ed25519 key proof failed.
    #[error("could not fetch ed25519 public key: {0}")]
    Ed25519(#[source] PolicyError),
    /// The CSR did not validate.
    #[error("invalid CSR: {0}")]
    Csr(#[source] PolicyError),
    /// The helper failed.
    #[error("could not invoke configure helper: {0}")]
    Helper(#[from] HelperError),
    /// The helper deferred the node. "defered" is the Go provisioner's spelling, kept so that
    /// what operators match in the log still matches.
    #[error("configuration defered: {0}")]
    Deferred(String),
    /// The admission policy refused the node: it never reached the helper.
    #[error("refused by policy: {0}")]
    Denied(String),
    /// The node's identity or key is on the operator's deny list ([`crate::Revocation`]): it
    /// never reached the policy or the helper, or was not configured.
    #[error("on the deny list: {0}")]
    Revoked(String),
    /// The server JWT could not be issued.
    #[error("could not issue server JWT: {0}")]
    ServerJwt(#[source] PolicyError),
    /// The private key could not be encrypted.
    #[error("could not encrypt private key: {0}")]
    KeyEncryption(#[source] PolicyError),
    /// The upgrade could not be done.
    #[error("update to {target} failed: {reason}")]
    Upgrade {
        /// The requested version.
        target: String,
        /// Why.
        reason: String,
    },
    /// The helper returned no configuration.
    #[error("configuration failed: empty configuration")]
    EmptyConfiguration,
    /// Active-active: the node's claim could not be taken or confirmed (the claims store is
    /// unreachable): the node is not started.
    #[error("not started: {0}")]
    Claim(#[source] ClaimError),
    /// Active-active: the claim could not be kept while the cycle ran, so the next step was
    /// not started (another replica may own the node now).
    #[error("claim lost before {0}, not going on")]
    ClaimLost(&'static str),
    /// The node waits for an operator's approval and could not be recorded as pending.
    #[error("could not record as pending approval: {0}")]
    Approval(String),
    /// Internal: another provisioner holds the lock (turned into [`Outcome::LockHeld`]).
    #[error("provisioning lock held by another provisioner during {0}")]
    LockHeld(Action),
}

/// A failed RPC in the Go provisioner's words: `choria_provision#jwt failed: ...`, inside
/// `could not fetch and validate JWT: NODE: `, `could not fetch ed25519 public key: `,
/// `rpc_util#inventory failed: `,
/// `configuration failed: ` or `restart failed: ` for those steps.
fn rpc_failure(e: &RpcError) -> String {
    let failed = format!("{} failed: {}", e.action, e.kind);
    match e.action {
        Action::Jwt => format!(
            "could not fetch and validate JWT: {}: {failed}",
            escaped(&e.identity)
        ),
        Action::Gen25519 => format!("could not fetch ed25519 public key: {failed}"),
        Action::Configure => format!("configuration failed: {failed}"),
        Action::Restart => format!("restart failed: {failed}"),
        // Go names the agent `rpc_util` here (and `rpcutil` in its per-try lines).
        Action::Inventory => format!("rpc_util#inventory failed: {}", e.kind),
        _ => failed,
    }
}

impl ProvisionErrorKind {
    /// Whether the node answered and its cycle failed for a reason that may pass on another
    /// try: an RPC that failed after the first contact, the helper failing or deferring, a
    /// server JWT or key that could not be made, an upgrade that did not happen. A refusal
    /// (identity, JWT, CSR, key proof, policy) or a node that never answered is not.
    pub fn may_pass(&self) -> bool {
        matches!(
            self,
            ProvisionErrorKind::Rpc(_)
                | ProvisionErrorKind::Helper(_)
                | ProvisionErrorKind::Deferred(_)
                | ProvisionErrorKind::ServerJwt(_)
                | ProvisionErrorKind::KeyEncryption(_)
                | ProvisionErrorKind::Upgrade { .. }
                | ProvisionErrorKind::EmptyConfiguration
        )
    }

    /// Whether the node never answered at all (its first request timed out or nobody serves
    /// its subject): typical of a bogus announcement.
    pub fn is_unanswered_first_contact(&self) -> bool {
        matches!(self, ProvisionErrorKind::FirstContact(_))
    }

    /// Whether nothing at all serves the node's subject (the broker's "no responders" to its
    /// first request): no server of that name is connected.
    pub fn is_unserved(&self) -> bool {
        matches!(self, ProvisionErrorKind::FirstContact(e) if e.kind == RpcErrorKind::NoResponders)
    }
}

/// A node's failed cycle.
#[derive(Debug, thiserror::Error)]
#[error("could not provision {identity}: {kind}")]
pub struct ProvisionError {
    /// The node.
    pub identity: Arc<str>,
    /// What failed.
    #[source]
    pub kind: ProvisionErrorKind,
}

/// What the cycle knows of a node's liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Contact {
    /// The node answered a request (any reply, even a refusal).
    answered: bool,
    /// Its first request may be tried again when nothing answers.
    retry_unanswered: bool,
}

impl Contact {
    const DISCOVERED: Contact = Contact {
        answered: false,
        retry_unanswered: true,
    };
    const ANNOUNCED: Contact = Contact {
        answered: false,
        retry_unanswered: false,
    };
}

/// One node being provisioned, with what has been fetched from it so far. A second round over
/// the same `Host` re-uses the JWT, ed25519 key and inventory already fetched.
#[derive(Debug, Clone)]
pub struct Host {
    identity: Arc<str>,
    discovered: Instant,
    source: Source,
    contact: Contact,
    raw_jwt: String,
    server_ecdh_public: String,
    claims: Option<ProvisioningClaims>,
    ed25519: Option<Ed25519Reply>,
    inventory: Option<Inventory>,
    csr: Option<CsrReply>,
    helper_msg: String,
    issued: Issued,
}

impl Host {
    /// A node discovered at `discovered`.
    pub fn new(identity: Arc<str>, discovered: Instant) -> Self {
        Host {
            identity,
            discovered,
            source: Source::Discovery,
            contact: Contact::DISCOVERED,
            raw_jwt: String::new(),
            server_ecdh_public: String::new(),
            claims: None,
            ed25519: None,
            inventory: None,
            csr: None,
            helper_msg: String::new(),
            issued: Issued::default(),
        }
    }

    /// The same node, found by `source` (discovery unless said otherwise). Until a node has
    /// answered a request, each try waits at most [`FIRST_CONTACT_TIMEOUT`]; a node found by
    /// discovery (it answered a ping) keeps the Go retry counts for its first request, a node
    /// known only from a startup event gets a single try.
    pub fn found_by(mut self, source: Source) -> Self {
        self.source = source;
        self.contact = match source {
            Source::Discovery => Contact::DISCOVERED,
            Source::Event => Contact::ANNOUNCED,
        };
        self
    }

    /// When the node was found (queued).
    pub fn discovered(&self) -> Instant {
        self.discovered
    }

    /// How the node was found.
    pub fn source(&self) -> Source {
        self.source
    }

    /// The node identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether the node answered any request (a refusal included): a node that never did may
    /// not exist at all (anyone can announce or answer discovery for any name).
    pub fn answered(&self) -> bool {
        self.contact.answered
    }

    /// The verified provisioning JWT claims, once fetched.
    pub fn claims(&self) -> Option<&ProvisioningClaims> {
        self.claims.as_ref()
    }

    /// The inventory, once fetched.
    pub fn inventory(&self) -> Option<&Inventory> {
        self.inventory.as_ref()
    }

    /// The helper's `msg` (escaped), once it ran.
    pub fn helper_msg(&self) -> &str {
        &self.helper_msg
    }

    /// What the node was given: the certificate's serial and fingerprint or the server JWT's id
    /// and expiry.
    pub fn issued(&self) -> &Issued {
        &self.issued
    }
}

/// What enrolment produced for the `configure` request: the signed server JWT and the helper's
/// private key encrypted for the node, each empty when not used.
#[derive(Debug, Default)]
struct Enrolment {
    server_jwt: String,
    key: String,
    ecdh_public: String,
    issued: Issued,
}

/// Runs the cycle for nodes; shared by every worker. It holds its collaborators behind trait
/// objects, so one type serves every transport, helper and observer: build one with
/// [`Provisioner::builder`].
pub struct Provisioner {
    config: Arc<ProvisionConfig>,
    pause: PauseState,
    rpc: Box<dyn DynNodeRpc>,
    helper: Box<dyn DynHelper>,
    observer: Box<dyn Observer>,
    clock: Box<dyn Clock>,
    keys: Box<dyn KeyMaterial>,
    random: Box<dyn Random>,
    backoff: Backoff,
    admission: Option<Box<dyn Admission>>,
    claims: Option<Box<dyn Claims>>,
    revocation: Option<Box<dyn Revocation>>,
    pacer: Option<Box<dyn Pacer>>,
    approval: Option<Box<dyn Approval>>,
    nonce_checks: crate::nonce_checks::NonceChecks,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner")
            .field("config", &self.config)
            .field("paused", &self.pause.paused())
            .field("backoff", &self.backoff)
            .field("admission", &self.admission.is_some())
            .field("claims", &self.claims.is_some())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Provisioner`]: the transport and the helper are required; everything else has a
/// default (see each method).
#[must_use]
pub struct ProvisionerBuilder {
    config: Arc<ProvisionConfig>,
    pause: PauseState,
    rpc: Box<dyn DynNodeRpc>,
    helper: Box<dyn DynHelper>,
    observer: Box<dyn Observer>,
    clock: Box<dyn Clock>,
    keys: Box<dyn KeyMaterial>,
    random: Box<dyn Random>,
    backoff: Backoff,
    admission: Option<Box<dyn Admission>>,
    claims: Option<Box<dyn Claims>>,
    revocation: Option<Box<dyn Revocation>>,
    pacer: Option<Box<dyn Pacer>>,
    approval: Option<Box<dyn Approval>>,
}

impl ProvisionerBuilder {
    /// The settings of the cycle (default: [`ProvisionConfig::default`]).
    pub fn config(mut self, config: impl Into<Arc<ProvisionConfig>>) -> Self {
        self.config = config.into();
        self
    }

    /// The pause state shared with whoever pauses provisioning (default: running).
    pub fn pause(mut self, pause: PauseState) -> Self {
        self.pause = pause;
        self
    }

    /// What is told of every step, error and finished node (default: [`NoopObserver`]).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = Box::new(observer);
        self
    }

    /// The keys of enrolment, asked for every node (default: none, [`StaticKeys::new`]).
    pub fn keys(mut self, keys: impl KeyMaterial) -> Self {
        self.keys = Box::new(keys);
        self
    }

    /// The wall clock (default: [`SystemClock`]).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Box::new(clock);
        self
    }

    /// The source of nonces and jitter (default: [`SystemRandom`]).
    pub fn random(mut self, random: impl Random) -> Self {
        self.random = Box::new(random);
        self
    }

    /// The delays between RPC tries (default: [`Backoff::default`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Asks `admission` whether each node may go on to the helper, after the built-in checks
    /// (default: every node goes on).
    pub fn admission(mut self, admission: impl Admission) -> Self {
        self.admission = Some(Box::new(admission));
        self
    }

    /// Checks every node against an operator's deny list before the admission policy and the
    /// helper, and again before it is configured (default: nothing is denied).
    pub fn revocation(mut self, revocation: impl Revocation) -> Self {
        self.revocation = Some(Box::new(revocation));
        self
    }

    /// Lets nodes reach the helper only as fast as `pacer` allows (`max_per_minute`; default:
    /// no limit).
    pub fn pacer(mut self, pacer: impl Pacer) -> Self {
        self.pacer = Some(Box::new(pacer));
        self
    }

    /// Holds the nodes that need an operator's approval (every node with `approval: manual`,
    /// else those the admission policy marks pending) until they have it (default: none; a
    /// policy's `pending` is then a defer).
    pub fn approval(mut self, approval: impl Approval) -> Self {
        self.approval = Some(Box::new(approval));
        self
    }

    /// Active-active: claims each node in `claims` before anything is sent to it, keeps the
    /// claim while the cycle runs, marks it done after success and releases it after failure
    /// (default: no claims).
    pub fn claims(mut self, claims: impl Claims) -> Self {
        self.claims = Some(Box::new(claims));
        self
    }

    /// The provisioner.
    pub fn build(self) -> Provisioner {
        Provisioner {
            config: self.config,
            pause: self.pause,
            rpc: self.rpc,
            helper: self.helper,
            observer: self.observer,
            clock: self.clock,
            keys: self.keys,
            random: self.random,
            backoff: self.backoff,
            admission: self.admission,
            claims: self.claims,
            revocation: self.revocation,
            pacer: self.pacer,
            approval: self.approval,
            nonce_checks: Default::default(),
        }
    }
}

impl Provisioner {
    /// A builder for a provisioner sending its RPCs through `rpc` and asking `helper` for each
    /// node's configuration.
    pub fn builder(rpc: impl NodeRpc, helper: impl Helper) -> ProvisionerBuilder {
        ProvisionerBuilder {
            config: Arc::new(ProvisionConfig::default()),
            pause: PauseState::default(),
            rpc: Box::new(rpc),
            helper: Box::new(helper),
            observer: Box::new(NoopObserver),
            clock: Box::new(SystemClock),
            keys: Box::new(StaticKeys::new()),
            random: Box::new(SystemRandom),
            backoff: Backoff::default(),
            admission: None,
            claims: None,
            revocation: None,
            pacer: None,
            approval: None,
        }
    }

    /// Whether nodes are claimed before they are provisioned (active-active).
    pub fn claims_nodes(&self) -> bool {
        self.claims.is_some()
    }

    /// The settings of the cycle.
    pub fn config(&self) -> &ProvisionConfig {
        &self.config
    }

    /// The pause state.
    pub fn pause_state(&self) -> &PauseState {
        &self.pause
    }

    /// The observer.
    pub fn observer(&self) -> &dyn Observer {
        &*self.observer
    }

    /// Runs the whole cycle for `host`.
    pub async fn provision(&self, host: &mut Host) -> Result<Outcome, ProvisionError> {
        let res = match &self.claims {
            None => self.cycle(host, None).await,
            Some(claims) => self.claimed_cycle(&**claims, host).await,
        };
        match res {
            Ok(o) => Ok(o),
            Err(ProvisionErrorKind::LockHeld(action)) => Ok(Outcome::LockHeld { action }),
            Err(kind) => Err(ProvisionError {
                identity: host.identity.clone(),
                kind,
            }),
        }
    }

    /// Refuses a node on the operator's deny list: its identity, or the fingerprint of a key it
    /// presented (`keys`, from [`key_fingerprints`]).
    fn check_revoked(&self, host: &Host, keys: &[String]) -> Result<(), ProvisionErrorKind> {
        let Some(revocation) = &self.revocation else {
            return Ok(());
        };
        match revocation.denied(&host.identity, keys) {
            None => Ok(()),
            Some(why) => {
                let why = escaped(&why).to_string();
                self.observer.node_event(
                    &host.identity,
                    &NodeEvent::Step {
                        step: "deny_list",
                        ok: false,
                        tries: 1,
                        elapsed: Duration::ZERO,
                        detail: &why,
                    },
                );
                Err(ProvisionErrorKind::Revoked(why))
            }
        }
    }

    /// A standby stops the cycle before its next step; an operator's hold lets it finish.
    fn check_paused(&self, what: &'static str) -> Result<(), ProvisionErrorKind> {
        if self.pause.stops_cycles() {
            Err(ProvisionErrorKind::Paused(what))
        } else {
            Ok(())
        }
    }

    /// One action with its retries: stops on pause, on success, on a held lock, or after the
    /// action's tries. Until the node has answered, each try waits at most
    /// [`FIRST_CONTACT_TIMEOUT`], and a node known only from a startup event gets one try: if
    /// nothing answers it the cycle ends at once. A first
    /// lock-held reply is asked again once after the first backoff step before the node is left
    /// to the other provisioner (one forged reply must not park a node for two minutes).
    async fn call<T, F, Fut>(
        &self,
        action: Action,
        identity: &str,
        contact: &mut Contact,
        mut f: F,
    ) -> Result<T, ProvisionErrorKind>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, RpcError>>,
    {
        let label = action.label();
        let tries = action.tries();
        let mut try_no = 1;
        let mut lock_retried = false;
        let began = Instant::now();
        let step = |ok: bool, try_no: u32, detail: &str| {
            self.observer.node_event(
                identity,
                &NodeEvent::Step {
                    step: label,
                    ok,
                    tries: try_no,
                    elapsed: began.elapsed(),
                    detail,
                },
            )
        };
        loop {
            self.check_paused(label)?;
            debug!(identity, "Trying action {label} try {try_no}/{tries}");
            let started = Instant::now();
            let res = if contact.answered {
                f().await
            } else {
                match tokio::time::timeout(FIRST_CONTACT_TIMEOUT, f()).await {
                    Ok(r) => r,
                    Err(_) => Err(RpcError::new(identity, action, RpcErrorKind::Timeout)),
                }
            };
            self.observer.rpc_time(label, started.elapsed());
            let delay = match res {
                Ok(v) => {
                    contact.answered = true;
                    step(true, try_no, "");
                    return Ok(v);
                }
                Err(e) if e.kind == RpcErrorKind::LockHeld => {
                    contact.answered = true;
                    if lock_retried {
                        step(false, try_no, &e.kind.to_string());
                        return Err(ProvisionErrorKind::LockHeld(action));
                    }
                    lock_retried = true;
                    let d = self.backoff.delay(1, &*self.random);
                    debug!(identity = %e.identity, action = label, "provisioning lock held, asking again once in {d:?}");
                    d
                }
                Err(e)
                    if !contact.answered && !contact.retry_unanswered && e.kind.is_unanswered() =>
                {
                    self.observer.rpc_error(label);
                    step(false, try_no, &e.kind.to_string());
                    return Err(ProvisionErrorKind::FirstContact(e));
                }
                Err(e) => {
                    if !e.kind.is_unanswered() {
                        contact.answered = true;
                    }
                    // Every failed try at error, as the Go provisioner logs it.
                    error!(
                        identity = %e.identity,
                        action = label,
                        try_no,
                        tries,
                        "rpc handler for {label} failed: {}",
                        e.kind
                    );
                    if try_no >= tries {
                        error!(identity, "Maximum {tries} tries reached for action {label}");
                        self.observer.rpc_error(label);
                        step(false, try_no, &e.kind.to_string());
                        return Err(ProvisionErrorKind::Rpc(e));
                    }
                    let d = self.backoff.delay(try_no, &*self.random);
                    try_no += 1;
                    d
                }
            };
            tokio::time::sleep(delay).await;
        }
    }

    /// A fresh `gen25519` nonce: 16 random bytes in the form of a version 4 UUID without
    /// dashes, as go-choria's `uuid.New()` nonce looks.
    fn nonce(&self) -> String {
        let mut bytes = [0u8; 16];
        self.random.fill_bytes(&mut bytes);
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .simple()
            .to_string()
    }

    /// The cycle under a claim: nothing is sent to the node unless this replica's claim went
    /// through; the claim is kept every [`Claims::keep_every`] while the cycle runs (a claim that
    /// cannot be kept stops the cycle before its next step), then marked done or released.
    async fn claimed_cycle(
        &self,
        claims: &dyn Claims,
        host: &mut Host,
    ) -> Result<Outcome, ProvisionErrorKind> {
        // The store's key is made from the identity: check it before the store sees it.
        self.config
            .identity_rule()
            .check(&host.identity)
            .map_err(ProvisionErrorKind::Identity)?;
        let mut ticket = match claims
            .claim(&host.identity)
            .await
            .map_err(ProvisionErrorKind::Claim)?
        {
            ClaimOutcome::Claimed(t) => t,
            ClaimOutcome::Taken { by, done } => {
                return Ok(Outcome::ClaimedElsewhere { by, done });
            }
        };
        let lost = AtomicBool::new(false);
        let res = {
            let cycle = self.cycle(host, Some(&lost));
            tokio::pin!(cycle);
            let every = claims.keep_every();
            let ticket = &mut ticket;
            // A failed keep is tried again every sixth of the period (a stream changing leader
            // answers within seconds); the claim is given up only when the last kept write is
            // two periods old, a third of its lifetime before it expires.
            let keep = async move {
                let mut kept = Instant::now();
                let mut wait = every;
                loop {
                    tokio::time::sleep(wait).await;
                    match claims.keep(ticket).await {
                        Ok(()) => {
                            kept = Instant::now();
                            wait = every;
                        }
                        Err(e) if kept.elapsed() + every / 6 >= every * 2 => return e,
                        Err(e) => {
                            debug!(identity = %escaped(&e.identity), "keeping the claim failed, trying again: {e}");
                            wait = every / 6;
                        }
                    }
                }
            };
            tokio::pin!(keep);
            let mut keeping = true;
            loop {
                tokio::select! {
                    r = &mut cycle => break r,
                    e = &mut keep, if keeping => {
                        keeping = false;
                        lost.store(true, Ordering::Release);
                        warn!(identity = %escaped(&e.identity), "Could not keep the claim, the cycle stops before its next step: {e}");
                    }
                }
            }
        };
        let id = host.identity.clone();
        // A finished node is left to restart; anything else is given back so any replica may
        // take it (an upgraded node comes back in provisioning mode).
        let finished = matches!(res, Ok(Outcome::Provisioned) | Ok(Outcome::ShutDown));
        let ended = if finished {
            claims.done(ticket).await
        } else {
            claims.release(ticket).await
        };
        if let Err(e) = ended {
            warn!(identity = %escaped(&id), "{e}");
        }
        res
    }

    /// The cycle's steps in order: identify the node, consult the helper, enrol, configure.
    /// `lost` (active-active) stops it before the helper or the configuration once set.
    async fn cycle(
        &self,
        host: &mut Host,
        lost: Option<&AtomicBool>,
    ) -> Result<Outcome, ProvisionErrorKind> {
        let claim_held = |step: &'static str| {
            if lost.is_some_and(|l| l.load(Ordering::Acquire)) {
                Err(ProvisionErrorKind::ClaimLost(step))
            } else {
                Ok(())
            }
        };
        // Checked again here (the work queue checked it before queueing) so that nothing is
        // sent, asked of the helper or signed for an invalid identity whoever built the host.
        self.config
            .identity_rule()
            .check(&host.identity)
            .map_err(ProvisionErrorKind::Identity)?;
        self.identify(host).await?;
        // The keys it presented this round, checked now and again before it is configured.
        let keys = if self.revocation.is_some() || self.approval.is_some() {
            key_fingerprints(host.csr.as_ref(), host.ed25519.as_ref())
        } else {
            Vec::new()
        };
        self.check_revoked(host, &keys)?;
        claim_held("the helper")?;
        let reply = match self.consult_helper(host, &keys).await? {
            ControlFlow::Continue(reply) => reply,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        if self.config.dry_run() {
            let would = if !reply.upgrade.is_empty() && self.config.features().upgrades {
                format!("upgrade to {}", escaped(&reply.upgrade))
            } else {
                "configure".to_string()
            };
            info!(
                identity = %host.identity,
                "Dry run: {} would be {}, leaving it as it is",
                host.identity,
                if would == "configure" { "configured and restarted" } else { &would }
            );
            return Ok(Outcome::DryRun { would });
        }
        // Denied while the helper ran: not configured.
        self.check_revoked(host, &keys)?;
        let mut enrolment = self.enroll(host, &reply)?;
        host.issued = std::mem::take(&mut enrolment.issued);
        claim_held("configuration")?;
        self.configure(host, reply, enrolment).await
    }
}
