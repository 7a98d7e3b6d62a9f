//! The running provisioner: connect, elect, discover, provision, serve metrics, drain.
//!
//! Start-up follows the Go provisioner's `cmd/provisioner.go` and `hosts.Process`: both
//! configurations are loaded and validated before anything binds, and the daemon refuses to
//! start on any problem `check` reports (the same [`preflight`]); then the broker connection,
//! the provisioner's own startup event, the election (paused until won), the lifecycle listener,
//! discovery at start and every `interval`, and the workers.
//!
//! Every task the daemon starts is owned by a [`JoinSet`] and waited for before it returns: the
//! signal handler and the connection watch, the listener, discovery and the election (whose
//! follower runs inside it), and the workers. Control follows the election's own state and the
//! fleet's own counts, never a metric.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::claims::ClaimStore;
use choria_rpc_client::connection::{
    connect_with_retry_observed, ConnectionError, ConnectionSettings, ConnectorSnapshot,
    ConnectorStats, EVENT_SUBSCRIPTION_CAPACITY,
};
use choria_rpc_client::election::{self, Election, ElectionEvent};
use choria_rpc_client::rpc::LifecycleSubscription;
use choria_rpc_client::rpc::{RpcClient, RpcOptions};
use provision_core::{AddResult, Backoff, Fleet, Observer, PauseState, Provisioner, Source};
use provisioner_metrics::{Metrics, Role};
use provisioner_status::{HistoryLimits, NodeTable};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::aa;
use crate::config::Config;
use crate::helper::SiteHelper;
use crate::keys::FileKeys;
use crate::node_rpc::{ChoriaNodeRpc, Timeouts};
use crate::preflight::Problem;
use crate::settings::Settings;
use crate::Error;
use crate::VERSION;

/// The shortest time between two discoveries started early because announced nodes wait.
const EARLY_DISCOVERY_EVERY: Duration = Duration::from_secs(20);
/// How long the oldest announced node may wait in its lane before a discovery is started early.
const EARLY_DISCOVERY_AFTER: Duration = Duration::from_secs(10);
/// How often the discovery loop looks at the announced lane.
const CONGESTION_CHECK_EVERY: Duration = Duration::from_secs(2);
/// A discovery that found more nodes than this is followed by discoveries in shards of about
/// this many ([`discovery_shards`]).
pub const DISCOVERY_SHARD_SIZE: usize = 100_000;
/// The most shards a discovery is split into (host names ending in digits spread over ten).
pub const MAX_DISCOVERY_SHARDS: usize = 10;

/// How many shards the next discovery is split into, from what the previous one found: one up
/// to [`DISCOVERY_SHARD_SIZE`] nodes, then one per that many, at most
/// [`MAX_DISCOVERY_SHARDS`]. A million nodes answering at once are a million replies waiting
/// to be read (about 300 MB); ten shards of a tenth each keep that a tenth as large. The first
/// discovery of a daemon knows nothing of the fleet: it asks the first of the most shards
/// alone, and sizes the rest from that (`RpcClient::discover_provisionable_probed`).
pub fn discovery_shards(previous: usize) -> usize {
    previous
        .div_ceil(DISCOVERY_SHARD_SIZE)
        .clamp(1, MAX_DISCOVERY_SHARDS)
}

/// The tokio runtime for `threads` threads (the `threads` setting, [`Config::threads`]): a
/// current-thread runtime for 0 or 1, the cheapest per node, since the tasks that wake each
/// other (a worker and the broker connection's writer above all) then run in turn on one core
/// and one write to the broker carries every message queued since the last; a multi-thread one
/// with that many workers otherwise. Tokio's blocking threads (policy evaluation, audit writes)
/// come with either; they and a multi-thread runtime's workers are named `provisioner` (a
/// current-thread runtime runs on the thread that calls `block_on`).
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all().thread_name("provisioner").build()
}

/// How long in-flight nodes may take to finish after a shutdown signal before they are abandoned
/// (an abandoned node is found again by the next discovery of whichever provisioner runs).
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// How often the rego_policy's files are checked for changes.
const POLICY_POLL: Duration = Duration::from_secs(1);
/// How long fleet control waits before opening its bucket again after a failure.
const CONTROL_RETRY: Duration = Duration::from_secs(10);

/// The daemon, ready to run: its settings passed the preflight. Built with
/// [`Daemon::builder`]; [`Daemon::run`] runs it until a shutdown token is cancelled.
///
/// ```no_run
/// # async fn demo() -> Result<(), provisioner::Error> {
/// use provisioner::settings::{Paths, Settings};
/// use provisioner::Daemon;
/// use tokio_util::sync::CancellationToken;
///
/// let settings = Settings::load(&Paths::new(
///     "/etc/choria-provisioner/choria-provisioner.yaml",
///     "/etc/choria-provisioner/choria.cfg",
/// ))?;
/// let shutdown = CancellationToken::new();
/// // Cancel `shutdown` (a signal, a test, the embedding tool's own stop) to drain and return.
/// Daemon::builder(settings).build()?.run(shutdown).await
/// # }
/// ```
pub struct Daemon {
    settings: Settings,
    observer: Option<Arc<dyn Observer>>,
    drain_grace: Duration,
    force: CancellationToken,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("config", &self.settings.config.file)
            .field("observer", &self.observer.is_some())
            .field("drain_grace", &self.drain_grace)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Daemon`].
#[must_use]
pub struct DaemonBuilder {
    settings: Settings,
    observer: Option<Arc<dyn Observer>>,
    drain_grace: Duration,
    force: CancellationToken,
}

impl DaemonBuilder {
    /// Also tell `observer` everything the cycle and the work queue report (besides the
    /// daemon's own metrics, node history and audit trail).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// How long nodes in flight may take to finish once shutdown begins (default
    /// [`DRAIN_GRACE`]).
    pub fn drain_grace(mut self, grace: Duration) -> Self {
        self.drain_grace = grace;
        self
    }

    /// A token that, once cancelled during the drain, stops waiting for nodes in flight (the
    /// binary cancels it on a second signal).
    pub fn force(mut self, force: CancellationToken) -> Self {
        self.force = force;
        self
    }

    /// Runs the preflight `check` runs: every finding is logged, and a fatal one refuses the
    /// start before anything binds or connects ([`Error::Refused`]).
    pub fn build(self) -> Result<Daemon, Error> {
        let problems = match crate::preflight::refuse(&self.settings) {
            Ok(p) => p,
            Err(e) => {
                if let Error::Refused { problems } = &e {
                    for p in problems {
                        error!("{p}");
                    }
                }
                return Err(e);
            }
        };
        for p in problems {
            if let Problem::Warning(w) = p {
                warn!("{w}");
            }
        }
        Ok(Daemon {
            settings: self.settings,
            observer: self.observer,
            drain_grace: self.drain_grace,
            force: self.force,
        })
    }
}

impl Daemon {
    /// A builder for the daemon of `settings`.
    pub fn builder(settings: Settings) -> DaemonBuilder {
        DaemonBuilder {
            settings,
            observer: None,
            drain_grace: DRAIN_GRACE,
            force: CancellationToken::new(),
        }
    }

    /// Runs until `shutdown` is cancelled, then drains: nodes in flight get the drain grace to
    /// finish. Returns once every task it started has stopped.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        run(self, shutdown).await
    }
}

/// The monitor listener's TLS configuration, when `monitor_tls_cert` and `monitor_tls_key` are
/// set.
fn monitor_tls(config: &Config) -> Result<Option<Arc<rustls::ServerConfig>>, Error> {
    if config.monitor_tls_cert.is_empty() {
        return Ok(None);
    }
    provisioner_status::tls::server_config(
        Path::new(&config.monitor_tls_cert),
        Path::new(&config.monitor_tls_key),
    )
    .map(Some)
    .map_err(Error::MonitorTls)
}

async fn run(daemon: Daemon, outer: CancellationToken) -> Result<(), Error> {
    let Daemon {
        settings,
        observer: extra_observer,
        drain_grace,
        force,
    } = daemon;
    // Cancelled by the caller, or by a task that found the daemon cannot work (an election
    // that cannot start); the error it left is returned once everything has drained.
    let shutdown = outer.child_token();
    let fatal: Arc<std::sync::Mutex<Option<Error>>> = Arc::default();
    info!(
        version = VERSION,
        "Choria Provisioner starting using configuration file {}. Discovery interval {} using {} workers",
        settings.config.file.display(),
        crate::text::duration(settings.config.provision.interval()),
        settings.config.workers
    );
    let Settings { config, choria, .. } = settings;
    let config = Arc::new(config);
    // Ends the connection watch once everything else has stopped.
    let stopped = CancellationToken::new();
    // Dropping a JoinSet aborts its tasks, so an early return leaves nothing running either.
    let mut background = JoinSet::new();

    let metrics = Metrics::new(config.site.clone());
    let nodes = NodeTable::new(HistoryLimits {
        max_nodes: config.node_history_size,
        max_age: config.node_history_max_age,
    });
    // The audit file is opened before anything binds: a file that cannot be written stops the
    // start, as check reports it.
    let audit_file = match config.audit_file.as_str() {
        "" => None,
        f => Some(crate::audit::AuditFile::open(Path::new(f))?),
    };
    // Fleet control: the operator's pause, the deny list and the approval queue, followed from
    // the bucket.
    let control_view = config
        .fleet_control
        .then(fleet_lifecycle::control::ControlView::new);
    let control_slot = fleet_lifecycle::approval::ControlSlot::new();
    let campaign_slot = fleet_lifecycle::campaign::CampaignSlot::new();
    let approvals = control_view.as_ref().map(|view| {
        Arc::new(
            fleet_lifecycle::approval::ApprovalQueue::new(
                Arc::clone(view),
                Arc::clone(&control_slot),
                config.approval_manual,
                config.approval_expiry,
                config.provision.interval(),
                &choria.identity,
            )
            .with_campaign(Arc::clone(&campaign_slot)),
        )
    });
    let mut monitor = None;
    if config.monitor_port > 0 {
        // An empty monitor_address is every interface, IPv4 and IPv6 (`[::]` dual-stack, or
        // 0.0.0.0 on a host without IPv6), as Go's `:port`.
        // The configuration checked it is an address.
        let ip: std::net::IpAddr = config
            .monitor_address
            .parse()
            .unwrap_or(std::net::Ipv6Addr::UNSPECIFIED.into());
        let addr = SocketAddr::new(ip, config.monitor_port);
        let token = crate::settings::read_token(&config.monitor_token_file)?;
        let api = provisioner_status::Monitor {
            metrics: Arc::clone(&metrics),
            nodes: Some(Arc::clone(&nodes)),
            version: VERSION.to_string(),
            identity: choria.identity.clone(),
            workers: config.workers,
            token,
            hostnames: config.monitor_hostnames.clone(),
            tls: monitor_tls(&config)?,
            control: approvals
                .as_ref()
                .map(|a| provisioner_status::ControlPanel {
                    view: Arc::clone(a) as Arc<dyn provisioner_status::FleetControlView>,
                    csrf: fleet_lifecycle::approval::csrf_token(),
                }),
        };
        let serving = provisioner_status::serve_monitor(&[addr], api, shutdown.clone()).await?;
        let bound = serving.local_addr();
        monitor = Some(serving);
        let scope = match bound.ip() {
            std::net::IpAddr::V6(a) if a.is_unspecified() => " (every interface, IPv4 and IPv6)",
            std::net::IpAddr::V4(a) if a.is_unspecified() => " (every interface, IPv4 only)",
            _ => "",
        };
        info!(
            component = "provisioner",
            "Listening for /metrics on {}: serving /metrics, /healthz and /readyz on {bound}{scope}",
            bound.port()
        );
        info!(
            "the status page (/), node pages (/nodes/) and the JSON API (/api/v1/) are served there too: {}",
            crate::preflight::api_access(&config)
        );
    }

    let helper = SiteHelper::from_config(
        &config,
        Backoff::from_millis(election::backoff::FIVE_SEC.millis(), true),
    )?;
    // Settings and security are checked before the network: what can never work stops here.
    let security = choria.security().map_err(Error::Security)?;
    let connection = ConnectionSettings::from_config(&choria)?;
    connection.validate()?;
    // The first connection is tried for ever, as go-choria does, while /healthz answers 200
    // and /readyz 503; a signal ends the wait.
    metrics.set_connected(false);
    let connector = ConnectorStats::new();
    background.spawn(follow_connector(
        connector.watch(),
        Arc::clone(&metrics),
        true,
        stopped.clone(),
    ));
    info!(
        "connecting to the broker: {}",
        connection.describe_brokers()
    );
    let nats = match connect_with_retry_observed(&connection, &shutdown, &connector).await {
        Ok(nats) => nats,
        Err(ConnectionError::Cancelled { .. }) => {
            info!("shutting down before the broker connection was made");
            stopped.cancel();
            while background.join_next().await.is_some() {}
            if let Some(serving) = &monitor {
                serving.stopped().await;
            }
            info!("stopped");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let client = RpcClient::new(nats, security, RpcOptions::from_config(&choria)).await?;
    background.spawn(follow_connection(
        client.clone(),
        Arc::clone(&metrics),
        stopped.clone(),
    ));
    info!(
        "connected to the broker as {} (caller {}), provisioning collective {}",
        choria.identity,
        client.caller_id(),
        client.options().collective
    );
    if let Err(e) = client.publish_startup("provisioner", VERSION).await {
        error!("Could not publish startup event: {e}");
    }

    let ha = HaMode::of(&config);
    info!("high availability: {}", ha.label());
    // Active-active: the claims bucket is opened (or created) before any node is taken; until
    // it is there every attempt is logged and nothing is provisioned.
    let claim_store = if ha == HaMode::ActiveActive {
        let chosen = ClaimStore::choose(
            client.nats().clone(),
            &choria.identity,
            config.claim_lifetime,
            crate::aa::seal(&config)?,
            &election::backoff::FIVE_SEC,
            &shutdown,
            |e| error!("active-active: {e}; provisioning waits until this is fixed"),
        )
        .await?;
        match chosen {
            Some(store) => {
                info!(
                    "active-active: claiming nodes in bucket {} through {} as replica {}, claim lifetime {:?}",
                    store.bucket(),
                    store.api(),
                    store.replica(),
                    store.lifetime()
                );
                Some(store)
            }
            None => {
                info!("shutting down before the claims bucket was opened");
                stopped.cancel();
                while background.join_next().await.is_some() {}
                if let Some(serving) = &monitor {
                    serving.stopped().await;
                }
                info!("stopped");
                return Ok(());
            }
        }
    } else {
        None
    };
    let spreader = claim_store
        .as_ref()
        .map(|store| Arc::new(aa::Spreader::new(store.clone(), Arc::clone(&config))));
    // The writer opens the stream, and tries again while it cannot be reached.
    let stream = (!config.audit_stream.is_empty()).then(|| crate::audit::StreamTarget {
        name: config.audit_stream.clone(),
        client: client.clone(),
        limits: config.audit_stream_limits,
    });
    let (audit, audit_writer) = crate::audit::channel(
        &choria.identity,
        &config.site,
        Arc::clone(&metrics),
        audit_file,
        stream,
    );
    let audit_stop = CancellationToken::new();
    let mut audit_task = JoinSet::new();
    if let Some(w) = audit_writer {
        audit_task.spawn(w.run(audit_stop.clone()));
    }

    let pause = PauseState::new(config.leader_election);
    metrics.set_role(if config.leader_election {
        Role::Standby
    } else {
        Role::Active
    });
    let workers = config.workers;
    let queue_size = config.work_queue_size;
    let mut provisioner = Provisioner::builder(
        ChoriaNodeRpc::new(
            client.clone(),
            Timeouts::from_discovery_timeout(choria.discovery_timeout),
        ),
        helper,
    )
    .config(config.provision.clone())
    .pause(pause.clone())
    // The metrics, the node history behind the API and the status page, the audit trail, and
    // the embedder's own observer.
    .observer((
        (Arc::clone(&metrics), (Arc::clone(&nodes), audit)),
        extra_observer.unwrap_or_else(|| Arc::new(provision_core::NoopObserver)),
    ))
    .keys(FileKeys::new(Arc::clone(&config)))
    .backoff(Backoff::from_millis(
        election::backoff::FIVE_SEC.millis(),
        true,
    ));
    if let (Some(store), Some(spreader)) = (&claim_store, &spreader) {
        provisioner =
            provisioner.claims(aa::ReplicaClaims::new(store.clone(), Arc::clone(spreader)));
    }
    if let Some(view) = &control_view {
        provisioner = provisioner.revocation(Arc::clone(view));
    }
    // max_per_minute: shared by every replica through the fleet control bucket, else this
    // replica's own.
    if config.max_per_minute > 0 {
        if config.fleet_control {
            info!(
                "max_per_minute: {} nodes a minute reach the helper, shared by every replica with fleet_control",
                config.max_per_minute
            );
            provisioner = provisioner.pacer(fleet_lifecycle::pacing::SharedBucket::new(
                client.nats().clone(),
                &choria.identity,
                crate::aa::seal(&config)?,
                config.max_per_minute,
            ));
        } else {
            info!(
                "max_per_minute: {} nodes a minute reach the helper from this replica (set fleet_control: true to share the limit between replicas)",
                config.max_per_minute
            );
            provisioner =
                provisioner.pacer(provision_core::LocalBucket::new(config.max_per_minute));
        }
    }
    if let Some(a) = &approvals {
        provisioner = provisioner.approval(Arc::clone(a));
    }
    let (admission, policy) = crate::rego::admission(&config)?;
    if let Some(admission) = admission {
        provisioner = provisioner.admission(admission);
    }
    let fleet = Fleet::with_capacity(provisioner.build(), queue_size);
    let discover_now = Arc::new(Notify::new());

    let work_stop = CancellationToken::new();
    let mut workers_task = JoinSet::new();
    workers_task.spawn(Arc::clone(&fleet).run(workers, work_stop.clone()));

    let mut tasks = JoinSet::new();
    let events_connector = ConnectorStats::new();
    background.spawn(follow_connector(
        events_connector.watch(),
        Arc::clone(&metrics),
        false,
        stopped.clone(),
    ));
    let mut events = connection.clone();
    events.subscription_capacity = EVENT_SUBSCRIPTION_CAPACITY;
    tasks.spawn(listen(
        client.clone(),
        events,
        events_connector,
        Arc::clone(&config),
        Arc::clone(&fleet),
        spreader.clone(),
        shutdown.clone(),
    ));
    if let (Some(store), Some(spreader)) = (&claim_store, &spreader) {
        tasks.spawn(Arc::clone(spreader).run(Arc::clone(&fleet), shutdown.clone()));
        tasks.spawn(aa::keep_alive(
            store.clone(),
            Arc::clone(&metrics),
            Arc::clone(&discover_now),
            shutdown.clone(),
        ));
    }
    tasks.spawn(discover(
        client.clone(),
        Arc::clone(&config),
        Arc::clone(&fleet),
        spreader.clone(),
        Arc::clone(&metrics),
        Arc::clone(&discover_now),
        shutdown.clone(),
    ));
    if let Some(policy) = policy {
        tasks.spawn(policy.watch(POLICY_POLL, shutdown.clone()));
    }
    if let Some(view) = control_view {
        let follower = fleet_lifecycle::control::Follower {
            client: client.nats().clone(),
            by: choria.identity.clone(),
            seal: crate::aa::seal(&config)?,
            view,
            pause: pause.clone(),
            resumed: Arc::clone(&discover_now),
            retry: CONTROL_RETRY,
            slot: Arc::clone(&control_slot),
        };
        tasks.spawn(follower.run(shutdown.clone()));
        // The rotation campaign, when its bucket is in this account, for the status API.
        let campaign = fleet_lifecycle::campaign::CampaignFollower {
            client: client.nats().clone(),
            by: choria.identity.clone(),
            seal: crate::aa::seal(&config)?,
            slot: Arc::clone(&campaign_slot),
            metrics: Arc::clone(&metrics),
            retry: CONTROL_RETRY,
        };
        tasks.spawn(campaign.run(shutdown.clone()));
    }
    if config.leader_election {
        let fatal = Arc::clone(&fatal);
        let stop = shutdown.clone();
        let election = elect(
            client.clone(),
            choria.identity.clone(),
            config.leader_election_wait,
            Arc::clone(&fleet),
            pause.clone(),
            Arc::clone(&metrics),
            Arc::clone(&discover_now),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            if let Err(e) = election.await {
                fatal
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                stop.cancel();
            }
        });
    }
    info!(
        "provisioning with {workers} workers, discovery every {:?}",
        config.provision.interval()
    );

    shutdown.cancelled().await;
    info!(
        "shutting down: discovery stopped, waiting up to {drain_grace:?} for {} busy workers",
        fleet.busy()
    );
    while tasks.join_next().await.is_some() {}
    // Let in-flight nodes finish, up to the grace period or a second signal, then stop the
    // workers. The fleet queues and starts nothing more from here on.
    let abandoned = fleet.drain(drain_grace, &force).await;
    if abandoned > 0 {
        warn!("abandoning {abandoned} nodes still being provisioned; they will be found again by discovery");
    }
    work_stop.cancel();
    while workers_task.join_next().await.is_some() {}
    // Every decision made is written before the process ends.
    audit_stop.cancel();
    while audit_task.join_next().await.is_some() {}
    stopped.cancel();
    while background.join_next().await.is_some() {}
    if let Some(serving) = &monitor {
        serving.stopped().await;
    }
    info!("stopped");
    let fatal = fatal.lock().unwrap_or_else(|p| p.into_inner()).take();
    match fatal {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Keep `/readyz` in step with the broker connection, until `stopped`.
async fn follow_connection(client: RpcClient, metrics: Arc<Metrics>, stopped: CancellationToken) {
    let mut up = client.connection_watch();
    loop {
        metrics.set_connected(*up.borrow_and_update());
        tokio::select! {
            changed = up.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stopped.cancelled() => return,
        }
    }
}

/// Copy the connector's counts into go-choria's `choria_connector_*` series as they change,
/// until `stopped`. `main` is the daemon's connection; the lifecycle event connection (not
/// `main`) adds its reconnections and errors, its drops go to `dropped_events`, and its first
/// connection is not counted as the daemon's.
async fn follow_connector(
    mut counts: tokio::sync::watch::Receiver<ConnectorSnapshot>,
    metrics: Arc<Metrics>,
    main: bool,
    stopped: CancellationToken,
) {
    let mut seen = ConnectorSnapshot::default();
    loop {
        let now = *counts.borrow_and_update();
        let c = &metrics.connector;
        if !main {
            // The lifecycle event connection's first connection is not the daemon's.
            seen.initial_connection_attempts = now.initial_connection_attempts;
            seen.initial_connect_time = now.initial_connect_time;
        }
        c.initial_connection_attempts.inc_by(
            now.initial_connection_attempts
                .saturating_sub(seen.initial_connection_attempts),
        );
        c.reconnections
            .inc_by(now.reconnections.saturating_sub(seen.reconnections));
        c.connection_closed
            .inc_by(now.connection_closed.saturating_sub(seen.connection_closed));
        c.errors.inc_by(now.errors.saturating_sub(seen.errors));
        // The main connection's drops may be discovery replies; the event connection's are
        // startup events (a flood of them is expected to overflow).
        let dropped = if main {
            &metrics.dropped_messages
        } else {
            &metrics.dropped_events
        };
        dropped.inc_by(now.slow_consumers.saturating_sub(seen.slow_consumers));
        if let (Some(took), None) = (now.initial_connect_time, seen.initial_connect_time) {
            c.initial_connect_time.observe(took);
        }
        seen = now;
        tokio::select! {
            changed = counts.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = stopped.cancelled() => return,
        }
    }
}

/// Queue nodes announced by startup lifecycle events (the fleet queues nothing while paused).
/// The events come on a connection of their own (`events`), whose subscription holds at most
/// [`EVENT_SUBSCRIPTION_CAPACITY`] unread messages: a flood of forged events is dropped and
/// counted there (`connector` feeds the metrics), never held in memory by the million nor
/// queued ahead of discovery replies.
#[allow(clippy::too_many_arguments)]
async fn listen(
    client: RpcClient,
    events: ConnectionSettings,
    connector: ConnectorStats,
    config: Arc<Config>,
    fleet: Arc<Fleet>,
    spreader: Option<Arc<aa::Spreader>>,
    shutdown: CancellationToken,
) {
    let nats = match connect_with_retry_observed(&events, &shutdown, &connector).await {
        Ok(nats) => nats,
        Err(ConnectionError::Cancelled { .. }) => return,
        Err(e) => {
            error!("Could not connect to listen for lifecycle events: {e}");
            return;
        }
    };
    let mut sub = loop {
        match LifecycleSubscription::subscribe(
            &nats,
            "startup",
            &config.lifecycle_component,
            None,
            client.max_reply_size(),
        )
        .await
        {
            Ok(s) => break s,
            Err(e) => {
                error!("Could not listen for lifecycle events: {e}; retrying in 5s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(5)) => continue,
                    _ = shutdown.cancelled() => return,
                }
            }
        }
    };
    info!(
        "listening for startup events of component {}",
        config.lifecycle_component
    );
    loop {
        let ev = tokio::select! {
            ev = sub.next() => ev,
            _ = shutdown.cancelled() => return,
        };
        let Some(ev) = ev else {
            warn!("the startup event subscription ended");
            return;
        };
        // The identity and the pause state are checked by the work queue: an invalid identity
        // is counted and refused, and nothing is queued while paused.
        if add_node(
            &fleet,
            spreader.as_deref(),
            &ev.event.identity,
            Source::Event,
        ) == AddResult::Queued
        {
            // At debug: anyone with a provisioning JWT can announce thousands of names.
            debug!(
                "Adding {} to the provision list after receiving an event",
                ev.event.identity
            );
        }
    }
}

/// Queue a found node: straight into the fleet, or (active-active) through the spreader, which
/// queues this replica's first choices at once and the others later.
fn add_node(
    fleet: &Fleet,
    spreader: Option<&aa::Spreader>,
    identity: &str,
    source: Source,
) -> AddResult {
    match spreader {
        Some(s) => s.offer(fleet, identity, source),
        None => fleet.add(identity, source),
    }
}

/// The high-availability mode the daemon runs in, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaMode {
    /// One provisioner, always active.
    Single,
    /// `leader_election`: the leader provisions, the others stand by.
    LeaderElection,
    /// `active_active`: every replica provisions, each node claimed in the claims bucket.
    ActiveActive,
}

impl HaMode {
    /// The mode `config` asks for (the two keys are exclusive, checked when it is loaded).
    pub fn of(config: &Config) -> Self {
        if config.active_active {
            HaMode::ActiveActive
        } else if config.leader_election {
            HaMode::LeaderElection
        } else {
            HaMode::Single
        }
    }

    /// How the mode is named in logs and `check`.
    pub fn label(self) -> &'static str {
        match self {
            HaMode::Single => "none (a single provisioner)",
            HaMode::LeaderElection => "leader election (active-standby)",
            HaMode::ActiveActive => {
                "active-active (every replica provisions, nodes claimed in Choria Streams)"
            }
        }
    }
}

/// Broadcast discovery at start, every interval, and when asked (after winning an election).
async fn discover(
    client: RpcClient,
    config: Arc<Config>,
    fleet: Arc<Fleet>,
    spreader: Option<Arc<aa::Spreader>>,
    metrics: Arc<Metrics>,
    now: Arc<Notify>,
    shutdown: CancellationToken,
) {
    // The pause state the provisioner checks (leader election pauses it).
    let pause = fleet.provisioner().pause_state().clone();
    let mut early: Option<tokio::time::Instant> = None;
    let mut late_seen = client.stats().late_discovery;
    let mut previous: Option<usize> = None;
    loop {
        if pause.paused() {
            warn!("Skipping discovery while paused");
        } else {
            metrics.discover_cycle();
            let shards = previous.map(discovery_shards);
            match (shards, previous) {
                (Some(shards), Some(previous)) if shards > 1 => info!(
                    "Looking for provisionable hosts in {shards} shards of their identities (the last discovery found {previous})"
                ),
                _ => info!("Looking for provisionable hosts"),
            }
            let found = match shards {
                Some(shards) => client.discover_provisionable_in(shards).await,
                None => {
                    client
                        .discover_provisionable_probed(DISCOVERY_SHARD_SIZE, MAX_DISCOVERY_SHARDS)
                        .await
                }
            };
            match found {
                Ok(nodes) => {
                    previous = Some(nodes.len());
                    info!("discovered {} nodes waiting for provisioning", nodes.len());
                    fleet.new_discovery();
                    // The identities are one buffer (29 MB for a million), freed at the end.
                    for id in nodes.iter() {
                        if add_node(&fleet, spreader.as_deref(), id, Source::Discovery)
                            == AddResult::Queued
                        {
                            info!("Adding {id} to the provision list after discovering it");
                        }
                    }
                }
                Err(e) => {
                    metrics.discovery_error();
                    error!("Could not discover nodes: {e}");
                }
            }
            // Answers that came after their discovery ended (or beyond what one discovery
            // keeps) are nodes it did not count: counted as dropped and said once a cycle.
            let late = client.stats().late_discovery;
            if late > late_seen {
                metrics.dropped_messages.inc_by(late - late_seen);
                warn!(
                    "{} discovery replies came after their discovery had ended; those nodes are found by the next discovery or their startup events",
                    late - late_seen
                );
                late_seen = late;
            }
        }
        let next = tokio::time::Instant::now() + config.provision.interval();
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => break,
                _ = now.notified() => break,
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(CONGESTION_CHECK_EVERY) => {
                    // Announced nodes have waited long in their lane (a flood of announcements
                    // for nodes that do not exist, or more restarts than the workers take):
                    // discover now rather than at the next interval, so the real nodes among
                    // them move to the discovery lane. At most once per EARLY_DISCOVERY_EVERY.
                    // Not while the latest discovery's backlog is still being queued: a new
                    // discovery would find those nodes again, and the backlog moves announced
                    // nodes it reaches to the discovery lane itself.
                    let waited = fleet.announced_oldest_wait();
                    if fleet.backlog() == 0
                        && waited.is_some_and(|w| w >= EARLY_DISCOVERY_AFTER)
                        && early.is_none_or(|t| t.elapsed() >= EARLY_DISCOVERY_EVERY)
                    {
                        early = Some(tokio::time::Instant::now());
                        info!(
                            "{} announced nodes are waiting, the oldest for {:.0?}: discovering now",
                            fleet.announced_backlog(),
                            waited.unwrap_or_default()
                        );
                        break;
                    }
                }
            }
        }
    }
}

/// Campaign for leadership: resume and discover on winning, pause and forget every queued node
/// on losing. An election that cannot start (Choria Streams unreachable, the bucket missing or
/// unusable) stops the daemon with an error, as the Go provisioner exits, unless
/// `leader_election_wait` keeps it trying; meanwhile `/readyz` says why it cannot campaign and
/// the election series say it does not lead. Failures after a start are logged and tried again.
#[allow(clippy::too_many_arguments)]
async fn elect(
    client: RpcClient,
    identity: String,
    wait: bool,
    fleet: Arc<Fleet>,
    pause: PauseState,
    metrics: Arc<Metrics>,
    discover_now: Arc<Notify>,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let name = election::PROVISIONER_ELECTION;
    info!(election = name, "Starting leader election against '{name}'");
    // The series exist from the start: a standby that never got to campaign is visibly not
    // the leader, so `sum(choria_election_leader) != 1` fires for a pair with no leader.
    metrics.set_election_source(name, identity.clone(), || {
        provisioner_metrics::ElectionSample {
            leader: Some(false),
            ..Default::default()
        }
    });
    metrics.set_election_blocked(Some("not started yet".into()));
    let started = if wait {
        Election::choose(
            client.nats().clone(),
            election::PROVISIONER_ELECTION,
            &identity,
            &election::backoff::FIVE_SEC,
            &shutdown,
        )
        .await
    } else {
        Election::choose_once(client.nats().clone(), name, &identity)
            .await
            .map(Some)
    };
    let election = match started {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(()),
        Err(e) => {
            error!(election = name, "Leader election failed to start: {e}");
            metrics.set_election_blocked(Some(e.to_string()));
            return Err(Error::Election(e));
        }
    };
    if !wait {
        // The bucket must be there and usable now: a campaign that could never win is an
        // error at start, not a standby for ever.
        if let Err(e) = election.open().await {
            error!(election = name, "Leader election failed to start: {e}");
            metrics.set_election_blocked(Some(e.to_string()));
            return Err(Error::Election(e));
        }
    }
    metrics.set_election_blocked(None);
    {
        // go-choria's choria_election_* series, read from the election at scrape time.
        let e = election.clone();
        metrics.set_election_source(election.key(), election.identity(), move || {
            let s = e.stats();
            provisioner_metrics::ElectionSample {
                campaigns_as_candidate: s.campaigns_as_candidate,
                campaigns_as_leader: s.campaigns_as_leader,
                // 0 until first won (go-choria creates it then), so a pair that never elected
                // a leader is visible as one.
                leader: s.leader_gauge.or(Some(false)),
                interval: s.interval_gauge,
            }
        });
    }
    let mut events = election.subscribe();
    // `leading`: whether this provisioner provisions as the leader, as the follower last set it.
    let lead = |leader: bool, leading: &mut bool| {
        *leading = leader;
        // It campaigns: whatever blocked it has cleared.
        metrics.set_election_blocked(None);
        if leader {
            warn!(election = name, "Became leader after winning election");
            metrics.set_role(Role::Leader);
            pause.resume();
            discover_now.notify_one();
            info!(
                election = name,
                "Triggered a discovery after becoming leader"
            );
        } else {
            warn!(
                election = name,
                "Lost leadership: pausing and clearing {} queued nodes",
                fleet.queued()
            );
            metrics.set_role(Role::Standby);
            pause.pause();
            fleet.clear();
        }
    };
    let follow = async {
        let mut leading = false;
        loop {
            let ev = tokio::select! {
                // On shutdown the campaign's own stop event must not pause the workers:
                // in-flight nodes are being drained.
                biased;
                _ = shutdown.cancelled() => return,
                ev = events.recv() => ev,
            };
            match ev {
                Ok(ElectionEvent::Won { .. }) => lead(true, &mut leading),
                Ok(ElectionEvent::Lost { .. })
                | Ok(ElectionEvent::Stopped { was_leader: true }) => lead(false, &mut leading),
                Ok(ElectionEvent::Stopped { .. }) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    // Transitions were missed: follow the campaign's current state.
                    let leader = election.is_leader();
                    if leader != leading {
                        lead(leader, &mut leading);
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    };
    let campaign = async {
        let res = election
            .run_retrying(shutdown.clone(), &election::backoff::FIVE_SEC, |e| {
                metrics.set_election_blocked(Some(e.to_string()));
                error!(
                    election = name,
                    "leader election: {e}; provisioning stays paused until this is fixed"
                );
            })
            .await;
        if let Err(e) = res {
            error!("leader election stopped: {e}");
        }
    };
    tokio::join!(campaign, follow);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{discovery_shards, runtime, DISCOVERY_SHARD_SIZE, MAX_DISCOVERY_SHARDS};
    use tokio::runtime::RuntimeFlavor;

    #[test]
    fn one_thread_is_a_current_thread_runtime_and_more_are_workers() {
        for threads in [0, 1] {
            let rt = runtime(threads).expect("a runtime");
            assert_eq!(rt.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        }
        let rt = runtime(3).expect("a runtime");
        assert_eq!(rt.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(rt.metrics().num_workers(), 3);
        let name = rt.block_on(async {
            tokio::spawn(async { std::thread::current().name().map(str::to_string) })
                .await
                .ok()
                .flatten()
        });
        assert_eq!(name.as_deref(), Some("provisioner"));
    }

    #[test]
    fn discovery_is_sharded_by_what_the_previous_one_found() {
        assert_eq!(discovery_shards(0), 1);
        assert_eq!(discovery_shards(DISCOVERY_SHARD_SIZE), 1);
        assert_eq!(discovery_shards(DISCOVERY_SHARD_SIZE + 1), 2);
        assert_eq!(discovery_shards(450_000), 5);
        assert_eq!(discovery_shards(1_000_000), 10);
        assert_eq!(
            discovery_shards(4_000_000),
            MAX_DISCOVERY_SHARDS,
            "never more than the most shards"
        );
    }
}
