//! The running provisioner: connect, elect, discover, provision, serve metrics, drain.
//!
//! Start-up follows the Go provisioner's `cmd/provisioner.go` and `hosts.Process`: both
//! configurations are loaded and validated before anything binds, then the broker connection,
//! the provisioner's own startup event, the election (paused until won), the lifecycle listener,
//! discovery at start and every `interval`, and the workers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use choria_rpc_client::config::{ChoriaConfig, ProvisionerOverrides};
use choria_rpc_client::election::{self, Election, ElectionError, ElectionEvent};
use choria_rpc_client::rpc::RpcClient;
use provision_core::helper_protocol::HelperRunner;
use provision_core::{Config, Fleet, Observer, PauseState, Provisioner, Source};
use provisioner_metrics::{Metrics, Role};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::cli::{RunArgs, VERSION};
use crate::logging;
use crate::node_rpc::{ChoriaNodeRpc, Timeouts};

/// The shortest time between two discoveries started early because announced nodes pile up.
const EARLY_DISCOVERY_EVERY: Duration = Duration::from_secs(20);

/// How long in-flight nodes may take to finish after a shutdown signal before they are abandoned
/// (an abandoned node is found again by the next discovery of whichever provisioner runs).
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Both configurations, loaded, validated and with the provisioner's overrides applied.
pub struct Settings {
    /// The provisioner YAML.
    pub config: Config,
    /// Warnings found while loading it.
    pub warnings: Vec<provision_core::ConfigWarning>,
    /// The Choria client configuration.
    pub choria: ChoriaConfig,
}

/// Load and validate both files; nothing is opened or bound yet.
pub fn load(args: &RunArgs, debug: bool) -> Result<Settings> {
    let path = args.config.as_deref().context("--config is required")?;
    let loaded = Config::load(path).map_err(anyhow::Error::new)?;
    let config = loaded.config;
    let choria_path: PathBuf = args
        .choria_config
        .clone()
        .unwrap_or_else(choria_rpc_client::config::user_config_path);
    let mut choria = ChoriaConfig::load(&choria_path).with_context(|| {
        format!(
            "cannot load the Choria configuration {}",
            choria_path.display()
        )
    })?;
    choria.apply_provisioner_overrides(&ProvisionerOverrides {
        insecure: config.choria_insecure,
        broker_provisioning_password: Some(config.broker_provisioning_password.clone())
            .filter(|p| !p.is_empty()),
        loglevel: Some(config.loglevel.clone()).filter(|l| !l.is_empty()),
        logfile: Some(config.logfile.clone()).filter(|l| !l.is_empty()),
        debug,
    });
    Ok(Settings {
        config,
        warnings: loaded.warnings,
        choria,
    })
}

/// Run the daemon until SIGINT or SIGTERM.
pub fn main(debug: bool, args: RunArgs) -> Result<()> {
    let settings = load(&args, debug)?;
    logging::init(&settings.choria.loglevel, &settings.choria.logfile, debug)?;
    info!(
        "Choria Provisioner version {VERSION} starting with configuration {}",
        settings.config.file.display()
    );
    for w in &settings.warnings {
        warn!("{w}");
    }
    warn_readable_secrets(&settings);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("provisioner")
        .build()
        .context("cannot start the async runtime")?;
    // The handlers are in place before the pid file exists, so whoever reads it can always
    // stop the process cleanly.
    let signals = {
        let _rt = runtime.enter();
        Signals::install()?
    };
    let _pid = match &args.pid {
        Some(p) => Some(PidFile::create(p)?),
        None => None,
    };
    let result = runtime.block_on(run(settings, signals));
    runtime.shutdown_timeout(Duration::from_secs(2));
    if let Err(e) = &result {
        error!("{}", crate::one_line(e));
    }
    result
}

/// Warns about every secret file someone other than the service can read (the signing key, the
/// Choria client's private key or seed, the provisioner YAML holding the token or broker
/// password, the Choria configuration holding the NATS password), as `check` does: a
/// provisioner holds the keys to a fleet.
fn warn_readable_secrets(settings: &Settings) {
    for w in crate::check::readable_secrets(Some(&settings.config), Some(&settings.choria)) {
        warn!("{w}");
    }
}

/// The PID file, removed when dropped.
struct PidFile(PathBuf);

impl PidFile {
    fn create(path: &Path) -> Result<Self> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write pid file {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn run(settings: Settings, signals: Signals) -> Result<()> {
    let Settings { config, choria, .. } = settings;
    let config = Arc::new(config);
    let shutdown = CancellationToken::new();
    let force = CancellationToken::new();
    signals.spawn(shutdown.clone(), force.clone());

    let metrics = Metrics::new(config.site.clone());
    if config.monitor_port > 0 {
        // An empty monitor_address is every interface, IPv4 and IPv6 (`[::]` dual-stack, or
        // 0.0.0.0 on a host without IPv6), as Go's `:port`.
        let ip: std::net::IpAddr = if config.monitor_address.is_empty() {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        } else {
            config
                .monitor_address
                .parse()
                .with_context(|| format!("invalid monitor_address {:?}", config.monitor_address))?
        };
        let addr = SocketAddr::new(ip, config.monitor_port);
        let bound =
            provisioner_metrics::serve(addr, Arc::clone(&metrics), shutdown.clone()).await?;
        let scope = match bound.ip() {
            std::net::IpAddr::V6(a) if a.is_unspecified() => " (every interface, IPv4 and IPv6)",
            std::net::IpAddr::V4(a) if a.is_unspecified() => " (every interface, IPv4 only)",
            _ => "",
        };
        info!("serving /metrics, /healthz and /readyz on {bound}{scope}");
    }

    let helper = HelperRunner::new(&config.helper).map_err(anyhow::Error::new)?;
    let client = tokio::select! {
        c = RpcClient::connect(&choria) => c.map_err(anyhow::Error::new)?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    metrics.set_connected(true);
    spawn_connection_watch(client.clone(), Arc::clone(&metrics), shutdown.clone());
    info!(
        "connected to the broker as {} (caller {}), provisioning collective {}",
        choria.identity,
        client.caller_id(),
        client.options().collective
    );
    if let Err(e) = client.publish_startup("provisioner", VERSION).await {
        warn!("could not publish the startup event: {e}");
    }

    let pause = PauseState::new(config.leader_election);
    metrics.set_role(if config.leader_election {
        Role::Standby
    } else {
        Role::Active
    });
    let workers = config.workers;
    let queue_size = config.work_queue_size;
    let provisioner = Provisioner::new(
        Arc::clone(&config),
        pause.clone(),
        ChoriaNodeRpc::new(client.clone(), Timeouts::default()),
        helper,
        Arc::clone(&metrics),
    );
    let fleet = Fleet::with_capacity(provisioner, queue_size);
    let discover_now = Arc::new(Notify::new());

    let work_stop = CancellationToken::new();
    let workers_task = tokio::spawn(Arc::clone(&fleet).run(workers, work_stop.clone()));

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(listen(
        client.clone(),
        Arc::clone(&config),
        Arc::clone(&fleet),
        pause.clone(),
        Arc::clone(&discover_now),
        shutdown.clone(),
    ));
    tasks.spawn(discover(
        client.clone(),
        Arc::clone(&config),
        Arc::clone(&fleet),
        pause.clone(),
        Arc::clone(&metrics),
        Arc::clone(&discover_now),
        shutdown.clone(),
    ));
    if config.leader_election {
        tasks.spawn(elect(
            client.clone(),
            choria.identity.clone(),
            Arc::clone(&fleet),
            pause.clone(),
            Arc::clone(&metrics),
            Arc::clone(&discover_now),
            shutdown.clone(),
        ));
    }
    info!(
        "provisioning with {workers} workers, discovery every {:?}",
        config.interval
    );

    shutdown.cancelled().await;
    info!(
        "shutting down: discovery stopped, waiting up to {DRAIN_GRACE:?} for {} busy workers",
        metrics.busy_workers.get()
    );
    while tasks.join_next().await.is_some() {}
    // Let in-flight nodes finish, up to the grace period, then stop the workers. Emptying the
    // queue keeps idle workers from starting new nodes; pausing instead would make every
    // in-flight node fail at its next step, which is an abort rather than a drain.
    let deadline = tokio::time::Instant::now() + DRAIN_GRACE;
    fleet.clear();
    loop {
        // A worker that took a node just before the queue was emptied counts itself busy a
        // moment later, so look again after a short wait before calling the drain done.
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = force.cancelled() => break,
        }
        if metrics.busy_workers.get() == 0 || tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    let abandoned = metrics.busy_workers.get();
    if abandoned > 0 {
        warn!("abandoning {abandoned} nodes still being provisioned; they will be found again by discovery");
    }
    work_stop.cancel();
    let _ = workers_task.await;
    info!("stopped");
    Ok(())
}

/// SIGTERM and SIGINT, caught from start-up on.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Install the handlers; needs the runtime's context.
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
        })
    }

    /// The first signal cancels `shutdown`, a second one `force`.
    fn spawn(mut self, shutdown: CancellationToken, force: CancellationToken) {
        tokio::spawn(async move {
            tokio::select! {
                _ = self.term.recv() => info!("received SIGTERM"),
                _ = self.int.recv() => info!("received SIGINT"),
            }
            shutdown.cancel();
            // A second signal (an impatient Ctrl-C) ends the drain at once.
            tokio::select! {
                _ = self.term.recv() => {}
                _ = self.int.recv() => {}
            }
            warn!("received a second signal, not waiting for nodes in flight");
            force.cancel();
        });
    }
}

/// Keep `/readyz` in step with the broker connection.
fn spawn_connection_watch(client: RpcClient, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        loop {
            let up = matches!(
                client.nats().connection_state(),
                async_nats::connection::State::Connected
            );
            metrics.set_connected(up);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    });
}

/// Queue nodes announced by startup lifecycle events.
async fn listen<R, H, O, C>(
    client: RpcClient,
    config: Arc<Config>,
    fleet: Arc<Fleet<R, H, O, C>>,
    pause: PauseState,
    discover_now: Arc<Notify>,
    shutdown: CancellationToken,
) where
    R: provision_core::NodeRpc,
    H: provision_core::Helper,
    O: Observer,
    C: provision_core::Clock,
{
    let mut early_discovery: Option<tokio::time::Instant> = None;
    let mut sub = loop {
        match client
            .subscribe_lifecycle("startup", &config.lifecycle_component, None)
            .await
        {
            Ok(s) => break s,
            Err(e) => {
                error!("cannot subscribe to startup events, retrying: {e}");
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
        if pause.paused() {
            debug!(
                "ignoring startup event of \"{}\" while paused",
                provision_core::identity::escaped(&ev.event.identity)
            );
            continue;
        }
        // The identity is checked by the work queue: an invalid one is counted and refused.
        fleet.add(&ev.event.identity, Source::Event);
        // Announced nodes are waiting behind more than the workers can take at once (a burst of
        // restarts, or someone announcing nodes that do not exist): discover now rather than at
        // the next interval, so real nodes among them move to the discovery lane. At most once
        // per EARLY_DISCOVERY_EVERY.
        if fleet.announced_backlog() > config.workers
            && early_discovery.is_none_or(|t| t.elapsed() >= EARLY_DISCOVERY_EVERY)
        {
            early_discovery = Some(tokio::time::Instant::now());
            debug!(
                "{} announced nodes are waiting, discovering now",
                fleet.announced_backlog()
            );
            discover_now.notify_one();
        }
    }
}

/// Broadcast discovery at start, every interval, and when asked (after winning an election).
async fn discover<R, H, C>(
    client: RpcClient,
    config: Arc<Config>,
    fleet: Arc<Fleet<R, H, Arc<Metrics>, C>>,
    pause: PauseState,
    metrics: Arc<Metrics>,
    now: Arc<Notify>,
    shutdown: CancellationToken,
) where
    R: provision_core::NodeRpc,
    H: provision_core::Helper,
    C: provision_core::Clock,
{
    loop {
        if !pause.paused() {
            metrics.discover_cycle();
            match client.discover_provisionable().await {
                Ok(nodes) => {
                    info!("discovered {} nodes waiting for provisioning", nodes.len());
                    for id in &nodes {
                        fleet.add(id, Source::Discovery);
                    }
                }
                Err(e) => {
                    metrics.discovery_error();
                    error!("discovery failed: {e}");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(config.interval) => {}
            _ = now.notified() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Campaign for leadership: resume and discover on winning, pause and forget every queued node
/// on losing. A missing bucket is an error logged on every attempt, never a silent pause.
async fn elect<R, H, O, C>(
    client: RpcClient,
    identity: String,
    fleet: Arc<Fleet<R, H, O, C>>,
    pause: PauseState,
    metrics: Arc<Metrics>,
    discover_now: Arc<Notify>,
    shutdown: CancellationToken,
) where
    R: provision_core::NodeRpc,
    H: provision_core::Helper,
    O: Observer,
    C: provision_core::Clock,
{
    let Some(election) = choose_election(&client, identity, &shutdown).await else {
        return;
    };
    let mut events = election.subscribe();
    let follow = {
        let election = election.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let lead = |leader: bool| {
                if leader {
                    info!("became the leader, resuming provisioning");
                    metrics.set_role(Role::Leader);
                    pause.resume();
                    discover_now.notify_one();
                } else {
                    warn!(
                        "lost leadership, pausing and clearing {} queued nodes",
                        fleet.queued()
                    );
                    metrics.set_role(Role::Standby);
                    pause.pause();
                    fleet.clear();
                }
            };
            loop {
                let ev = tokio::select! {
                    // On shutdown the campaign's own stop event must not pause the workers:
                    // in-flight nodes are being drained.
                    biased;
                    _ = stop.cancelled() => return,
                    ev = events.recv() => ev,
                };
                match ev {
                    Ok(ElectionEvent::Won { .. }) => lead(true),
                    Ok(ElectionEvent::Lost { .. })
                    | Ok(ElectionEvent::Stopped { was_leader: true }) => lead(false),
                    Ok(ElectionEvent::Stopped { .. }) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Transitions were missed: follow the campaign's current state.
                        let leader = election.is_leader();
                        if leader != (metrics.role() == Role::Leader) {
                            lead(leader);
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                }
            }
        })
    };
    let policy = election::backoff::FIVE_SEC;
    let res = election
        .run_retrying(shutdown.clone(), &policy, |e| {
            error!("leader election: {e}; provisioning stays paused until this is fixed");
        })
        .await;
    if let Err(e) = res {
        error!("leader election stopped: {e}");
    }
    let _ = follow.await;
}

/// The election over whichever JetStream API answers. Behind a Choria broker the provisioning
/// account reaches JetStream only through the `choria.streams` import, as the Go provisioner
/// uses it; on a plain NATS server the account's own JetStream answers. The import is tried
/// first. Whichever API answers at all is kept even when the bucket is missing there, so a
/// bucket created later is found; while neither answers, both are asked again. `None` when
/// shut down first.
async fn choose_election(
    client: &RpcClient,
    identity: String,
    shutdown: &CancellationToken,
) -> Option<Election> {
    let built = Election::builder(
        client.nats().clone(),
        election::PROVISIONER_ELECTION,
        identity.clone(),
    )
    .api_prefix(election::PROVISIONING_API_PREFIX)
    .build()
    .and_then(|prefixed| {
        Election::builder(
            client.nats().clone(),
            election::PROVISIONER_ELECTION,
            identity,
        )
        .build()
        .map(|direct| (prefixed, direct))
    });
    let (prefixed, direct) = match built {
        Ok(both) => both,
        Err(e) => {
            error!("cannot set up leader election: {e}");
            return None;
        }
    };
    let unreachable = |e: &ElectionError| {
        matches!(
            e,
            ElectionError::StreamsUnavailable { .. } | ElectionError::Request { .. }
        )
    };
    let mut failures = 0usize;
    loop {
        let why = match prefixed.open().await {
            Ok(_) => return Some(prefixed),
            Err(e) if !unreachable(&e) => return Some(prefixed),
            Err(e) => e,
        };
        match direct.open().await {
            Err(e) if unreachable(&e) => {
                error!("leader election: {why}; the account's own JetStream does not answer either: {e}; provisioning stays paused until this is fixed");
            }
            _ => {
                info!(
                    "leader election uses the account's own JetStream (no choria.streams import)"
                );
                return Some(direct);
            }
        }
        failures = failures.saturating_add(1);
        if !election::backoff::FIVE_SEC.sleep(failures, shutdown).await {
            return None;
        }
    }
}
