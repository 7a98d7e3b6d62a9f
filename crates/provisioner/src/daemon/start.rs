//! The daemon's start-up steps, in the order [`super::run`] takes them: what outlives every
//! step ([`Running`]: the metrics, the node history, the tasks and how they stop), the monitor
//! listener, the broker connection, the active-active claims, the audit writer, the fleet of
//! workers over the provisioning core, the tasks that feed it, and the drain.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use choria_rpc_client::config::ChoriaConfig;
use choria_rpc_client::connection::{
    connect_with_retry_observed, ConnectionError, ConnectionSettings, ConnectorStats,
    EVENT_SUBSCRIPTION_CAPACITY,
};
use choria_rpc_client::election;
use choria_rpc_client::rpc::{RpcClient, RpcOptions};
use fleet_lifecycle::approval::ApprovalQueue;
use fleet_lifecycle::campaign::CampaignSlot;
use fleet_lifecycle::control::{ControlSlot, ControlView};
use provision_core::{Backoff, Fleet, Observer, PauseState, Provisioner};
use provisioner_metrics::{Metrics, Role};
use provisioner_status::{HistoryLimits, NodeTable, Serving};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::tasks::{discover, elect, follow_connection, follow_connector, listen};
use crate::aa;
use crate::claims::ClaimStore;
use crate::config::Config;
use crate::helper::SiteHelper;
use crate::keys::FileKeys;
use crate::node_rpc::{ChoriaNodeRpc, Timeouts};
use crate::rego::RegoPolicy;
use crate::{Error, VERSION};

/// How often the rego_policy's files are checked for changes.
const POLICY_POLL: Duration = Duration::from_secs(1);
/// How long fleet control waits before opening its bucket again after a failure.
const CONTROL_RETRY: Duration = Duration::from_secs(10);

/// The backoff of the helper's refused connections and of the cycle's RPC retries: go-choria's
/// five-second policy with jitter.
fn five_second_backoff() -> Backoff {
    Backoff::from_millis(election::backoff::FIVE_SEC.millis(), true)
}

/// What lives from the first step to the last: the metrics and the node history every part
/// reports to, and every task started, grouped by when each stops. Dropping a [`JoinSet`]
/// aborts its tasks, so an early return leaves nothing running either.
pub(super) struct Running {
    pub config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    pub nodes: Arc<NodeTable>,
    /// Cancelled by the caller, or by a task that found the daemon cannot work; the error it
    /// left is returned once everything has drained.
    pub shutdown: CancellationToken,
    fatal: Arc<std::sync::Mutex<Option<Error>>>,
    /// The listener, discovery, the election and the fleet control followers: stop on
    /// `shutdown`.
    tasks: JoinSet<()>,
    /// The workers, stopped after the drain.
    workers: JoinSet<()>,
    work_stop: CancellationToken,
    /// The audit writer, stopped once every decision is made.
    audit: JoinSet<()>,
    audit_stop: CancellationToken,
    /// The connection watch and the connector followers, stopped last.
    background: JoinSet<()>,
    stopped: CancellationToken,
    monitor: Option<Serving>,
}

impl Running {
    pub fn new(config: Arc<Config>, shutdown: CancellationToken) -> Self {
        let nodes = NodeTable::new(HistoryLimits {
            max_nodes: config.node_history_size,
            max_age: config.node_history_max_age,
        });
        Running {
            metrics: Metrics::new(config.site.clone()),
            nodes,
            config,
            shutdown,
            fatal: Arc::default(),
            tasks: JoinSet::new(),
            workers: JoinSet::new(),
            work_stop: CancellationToken::new(),
            audit: JoinSet::new(),
            audit_stop: CancellationToken::new(),
            background: JoinSet::new(),
            stopped: CancellationToken::new(),
            monitor: None,
        }
    }

    /// Starts a task that stops on `shutdown`; one that fails stops the daemon with its error.
    fn spawn_fatal(
        &mut self,
        task: impl std::future::Future<Output = Result<(), Error>> + Send + 'static,
    ) {
        let fatal = Arc::clone(&self.fatal);
        let stop = self.shutdown.clone();
        self.tasks.spawn(async move {
            if let Err(e) = task.await {
                fatal
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                stop.cancel();
            }
        });
    }

    /// Stops what was started before a shutdown that came while `waiting` for something.
    pub async fn stop_early(mut self, waiting: &str) -> Result<(), Error> {
        info!("shutting down before {waiting}");
        self.stopped.cancel();
        while self.background.join_next().await.is_some() {}
        if let Some(serving) = &self.monitor {
            serving.stopped().await;
        }
        info!("stopped");
        Ok(())
    }

    /// Waits for `shutdown`, then stops in order: the listener, discovery and election; the
    /// nodes in flight, for up to `grace` or until `force`; the workers; the audit writer; the
    /// connection watch; the monitor listener.
    pub async fn run_until_shutdown(
        mut self,
        fleet: &Fleet,
        grace: Duration,
        force: &CancellationToken,
    ) -> Result<(), Error> {
        self.shutdown.cancelled().await;
        info!(
            "shutting down: discovery stopped, waiting up to {grace:?} for {} busy workers",
            fleet.busy()
        );
        while self.tasks.join_next().await.is_some() {}
        // The fleet queues and starts nothing more from here on.
        let abandoned = fleet.drain(grace, force).await;
        if abandoned > 0 {
            warn!("abandoning {abandoned} nodes still being provisioned; they will be found again by discovery");
        }
        self.work_stop.cancel();
        while self.workers.join_next().await.is_some() {}
        // Every decision made is written before the process ends.
        self.audit_stop.cancel();
        while self.audit.join_next().await.is_some() {}
        self.stopped.cancel();
        while self.background.join_next().await.is_some() {}
        if let Some(serving) = &self.monitor {
            serving.stopped().await;
        }
        info!("stopped");
        let fatal = self.fatal.lock().unwrap_or_else(|p| p.into_inner()).take();
        fatal.map_or(Ok(()), Err)
    }
}

/// Fleet control, when `fleet_control` is on: the view the bucket is followed into (the
/// operator's pause, the deny list, the approvals), the slots the followers fill, and the
/// approval queue over them.
pub(super) struct FleetControl {
    pub view: Arc<ControlView>,
    pub control_slot: Arc<ControlSlot>,
    pub campaign_slot: Arc<CampaignSlot>,
    pub approvals: Arc<ApprovalQueue>,
}

impl FleetControl {
    pub fn of(config: &Config, identity: &str) -> Option<Self> {
        if !config.fleet_control {
            return None;
        }
        let view = ControlView::new();
        let control_slot = ControlSlot::new();
        let campaign_slot = CampaignSlot::new();
        let approvals = Arc::new(
            ApprovalQueue::new(
                Arc::clone(&view),
                Arc::clone(&control_slot),
                config.approval_manual,
                config.approval_expiry,
                config.provision.interval(),
                identity,
            )
            .with_campaign(Arc::clone(&campaign_slot)),
        );
        Some(FleetControl {
            view,
            control_slot,
            campaign_slot,
            approvals,
        })
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

/// Serve: binds the monitor listener (`/metrics`, `/healthz`, `/readyz`, the status page and
/// API) when `monitor_port` is set.
pub(super) async fn serve(
    run: &mut Running,
    identity: &str,
    control: Option<&FleetControl>,
) -> Result<(), Error> {
    let config = &run.config;
    if config.monitor_port == 0 {
        return Ok(());
    }
    // An empty monitor_address is every interface, IPv4 and IPv6 (`[::]` dual-stack, or
    // 0.0.0.0 on a host without IPv6), as Go's `:port`. The configuration checked it is an
    // address.
    let ip: std::net::IpAddr = config
        .monitor_address
        .parse()
        .unwrap_or(std::net::Ipv6Addr::UNSPECIFIED.into());
    let addr = SocketAddr::new(ip, config.monitor_port);
    let api = provisioner_status::Monitor {
        metrics: Arc::clone(&run.metrics),
        nodes: Some(Arc::clone(&run.nodes)),
        version: VERSION.to_string(),
        identity: identity.to_string(),
        workers: config.workers,
        token: crate::settings::read_token(&config.monitor_token_file)?,
        hostnames: config.monitor_hostnames.clone(),
        tls: monitor_tls(config)?,
        control: control.map(|c| provisioner_status::ControlPanel {
            view: Arc::clone(&c.approvals) as Arc<dyn provisioner_status::FleetControlView>,
            csrf: fleet_lifecycle::approval::csrf_token(),
        }),
    };
    let serving = provisioner_status::serve_monitor(&[addr], api, run.shutdown.clone()).await?;
    let bound = serving.local_addr();
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
        crate::preflight::api_access(config)
    );
    run.monitor = Some(serving);
    Ok(())
}

/// Connect: the broker connection, tried for ever as go-choria does while `/healthz` answers
/// 200 and `/readyz` 503, then the RPC client on it and the provisioner's own startup event.
/// `None` when a shutdown came first. Settings and security are checked before the network:
/// what can never work stops here.
pub(super) async fn connect(
    run: &mut Running,
    choria: &ChoriaConfig,
) -> Result<Option<(RpcClient, ConnectionSettings)>, Error> {
    let security = choria.security().map_err(Error::Security)?;
    let connection = ConnectionSettings::from_config(choria)?;
    connection.validate()?;
    run.metrics.set_connected(false);
    let connector = ConnectorStats::new();
    run.background.spawn(follow_connector(
        connector.watch(),
        Arc::clone(&run.metrics),
        true,
        run.stopped.clone(),
    ));
    info!(
        "connecting to the broker: {}",
        connection.describe_brokers()
    );
    let nats = match connect_with_retry_observed(&connection, &run.shutdown, &connector).await {
        Ok(nats) => nats,
        Err(ConnectionError::Cancelled { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let client = RpcClient::new(nats, security, RpcOptions::from_config(choria)).await?;
    run.background.spawn(follow_connection(
        client.clone(),
        Arc::clone(&run.metrics),
        run.stopped.clone(),
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
    Ok(Some((client, connection)))
}

/// Active-active: the claims bucket, opened (or created) before any node is taken; until it is
/// there every attempt is logged and nothing is provisioned. `Ok(None)` when a shutdown came
/// first.
pub(super) async fn open_claims(
    run: &Running,
    client: &RpcClient,
    identity: &str,
) -> Result<Option<ClaimStore>, Error> {
    let chosen = ClaimStore::choose(
        client.nats().clone(),
        identity,
        run.config.claim_lifetime,
        aa::seal(&run.config)?,
        &election::backoff::FIVE_SEC,
        &run.shutdown,
        |e| error!("active-active: {e}; provisioning waits until this is fixed"),
    )
    .await?;
    if let Some(store) = &chosen {
        info!(
            "active-active: claiming nodes in bucket {} through {} as replica {}, claim lifetime {:?}",
            store.bucket(),
            store.api(),
            store.replica(),
            store.lifetime()
        );
    }
    Ok(chosen)
}

/// The audit trail's writer (the file, opened before anything binds, and the stream, which
/// the writer opens itself and tries again while it cannot be reached), started; the sink
/// the cycle reports to.
pub(super) fn start_audit(
    run: &mut Running,
    client: &RpcClient,
    identity: &str,
    file: Option<crate::audit::AuditFile>,
) -> crate::audit::Audit {
    let config = &run.config;
    let stream = (!config.audit_stream.is_empty()).then(|| crate::audit::StreamTarget {
        name: config.audit_stream.clone(),
        client: client.clone(),
        limits: config.audit_stream_limits,
    });
    let (audit, writer) = crate::audit::channel(
        identity,
        &config.site,
        Arc::clone(&run.metrics),
        file,
        stream,
    );
    if let Some(w) = writer {
        run.audit.spawn(w.run(run.audit_stop.clone()));
    }
    audit
}

/// What the fleet is built from, beside [`Running`].
pub(super) struct FleetParts<'a> {
    pub client: &'a RpcClient,
    pub choria: &'a ChoriaConfig,
    pub helper: SiteHelper,
    pub audit: crate::audit::Audit,
    pub extra_observer: Option<Arc<dyn Observer>>,
    pub pause: PauseState,
    pub claims: Option<(&'a ClaimStore, &'a Arc<aa::Spreader>)>,
    pub control: Option<&'a FleetControl>,
}

/// The provisioning core over the real network, the helper and the key files, with every
/// collaborator the settings ask for (claims, deny list, rate limit, approvals, policy), and
/// its workers started. The policy's watch, when one is set, is for [`spawn_feeders`].
pub(super) fn start_fleet(
    run: &mut Running,
    parts: FleetParts<'_>,
) -> Result<(Arc<Fleet>, Option<Arc<RegoPolicy>>), Error> {
    let config = &run.config;
    let mut provisioner = Provisioner::builder(
        ChoriaNodeRpc::new(
            parts.client.clone(),
            Timeouts::from_discovery_timeout(parts.choria.discovery_timeout),
        ),
        parts.helper,
    )
    .config(config.provision.clone())
    .pause(parts.pause)
    // The metrics, the node history behind the API and the status page, the audit trail, and
    // the embedder's own observer.
    .observer((
        (
            Arc::clone(&run.metrics),
            (Arc::clone(&run.nodes), parts.audit),
        ),
        parts
            .extra_observer
            .unwrap_or_else(|| Arc::new(provision_core::NoopObserver)),
    ))
    .keys(FileKeys::new(Arc::clone(config)))
    .backoff(five_second_backoff());
    if let Some((store, spreader)) = parts.claims {
        provisioner =
            provisioner.claims(aa::ReplicaClaims::new(store.clone(), Arc::clone(spreader)));
    }
    if let Some(c) = parts.control {
        provisioner = provisioner
            .revocation(Arc::clone(&c.view))
            .approval(Arc::clone(&c.approvals));
    }
    // max_per_minute: shared by every replica through the fleet control bucket, else this
    // replica's own.
    if config.max_per_minute > 0 && config.fleet_control {
        info!(
            "max_per_minute: {} nodes a minute reach the helper, shared by every replica with fleet_control",
            config.max_per_minute
        );
        provisioner = provisioner.pacer(fleet_lifecycle::pacing::SharedBucket::new(
            parts.client.nats().clone(),
            &parts.choria.identity,
            aa::seal(config)?,
            config.max_per_minute,
        ));
    } else if config.max_per_minute > 0 {
        info!(
            "max_per_minute: {} nodes a minute reach the helper from this replica (set fleet_control: true to share the limit between replicas)",
            config.max_per_minute
        );
        provisioner = provisioner.pacer(provision_core::LocalBucket::new(config.max_per_minute));
    }
    let (admission, policy) = crate::rego::admission(config)?;
    if let Some(admission) = admission {
        provisioner = provisioner.admission(admission);
    }
    let fleet = Fleet::with_capacity(provisioner.build(), config.work_queue_size);
    run.workers
        .spawn(Arc::clone(&fleet).run(config.workers, run.work_stop.clone()));
    Ok((fleet, policy))
}

/// What feeds the fleet and follows the shared state, beside [`Running`].
pub(super) struct Feeders<'a> {
    pub client: &'a RpcClient,
    pub identity: &'a str,
    pub connection: &'a ConnectionSettings,
    pub fleet: &'a Arc<Fleet>,
    pub pause: &'a PauseState,
    pub claims: Option<(&'a ClaimStore, &'a Arc<aa::Spreader>)>,
    pub control: Option<&'a FleetControl>,
    pub policy: Option<Arc<RegoPolicy>>,
}

/// Listen, discover and elect: the lifecycle listener (on a connection of its own, its
/// subscription bounded by [`EVENT_SUBSCRIPTION_CAPACITY`]), the active-active spreader and
/// heartbeat, discovery, the policy's watch, the fleet control and campaign followers, and
/// the election.
pub(super) fn spawn_feeders(run: &mut Running, f: Feeders<'_>) -> Result<(), Error> {
    let config = Arc::clone(&run.config);
    let shutdown = run.shutdown.clone();
    let discover_now = Arc::new(Notify::new());
    let spreader = f.claims.map(|(_, s)| Arc::clone(s));
    let events_connector = ConnectorStats::new();
    run.background.spawn(follow_connector(
        events_connector.watch(),
        Arc::clone(&run.metrics),
        false,
        run.stopped.clone(),
    ));
    let mut events = f.connection.clone();
    events.subscription_capacity = EVENT_SUBSCRIPTION_CAPACITY;
    run.tasks.spawn(listen(
        f.client.clone(),
        events,
        events_connector,
        Arc::clone(&config),
        Arc::clone(f.fleet),
        spreader.clone(),
        shutdown.clone(),
    ));
    if let Some((store, spreader)) = f.claims {
        run.tasks
            .spawn(Arc::clone(spreader).run(Arc::clone(f.fleet), shutdown.clone()));
        run.tasks.spawn(aa::keep_alive(
            store.clone(),
            Arc::clone(&run.metrics),
            Arc::clone(&discover_now),
            shutdown.clone(),
        ));
    }
    run.tasks.spawn(discover(
        f.client.clone(),
        Arc::clone(&config),
        Arc::clone(f.fleet),
        spreader,
        Arc::clone(&run.metrics),
        Arc::clone(&discover_now),
        shutdown.clone(),
    ));
    if let Some(policy) = f.policy {
        run.tasks.spawn(policy.watch(POLICY_POLL, shutdown.clone()));
    }
    if let Some(c) = f.control {
        let follower = fleet_lifecycle::control::Follower {
            client: f.client.nats().clone(),
            by: f.identity.to_string(),
            seal: aa::seal(&config)?,
            view: Arc::clone(&c.view),
            pause: f.pause.clone(),
            resumed: Arc::clone(&discover_now),
            retry: CONTROL_RETRY,
            slot: Arc::clone(&c.control_slot),
        };
        run.tasks.spawn(follower.run(shutdown.clone()));
        // The rotation campaign, when its bucket is in this account, for the status API.
        let campaign = fleet_lifecycle::campaign::CampaignFollower {
            client: f.client.nats().clone(),
            by: f.identity.to_string(),
            seal: aa::seal(&config)?,
            slot: Arc::clone(&c.campaign_slot),
            metrics: Arc::clone(&run.metrics),
            retry: CONTROL_RETRY,
        };
        run.tasks.spawn(campaign.run(shutdown.clone()));
    }
    if config.leader_election {
        let election = elect(
            f.client.clone(),
            f.identity.to_string(),
            config.leader_election_wait,
            Arc::clone(f.fleet),
            f.pause.clone(),
            Arc::clone(&run.metrics),
            discover_now,
            shutdown,
        );
        run.spawn_fatal(election);
    }
    Ok(())
}

/// The helper as configured, with the RPC backoff for the webhook's refused connections.
pub(super) fn helper(config: &Config) -> Result<SiteHelper, Error> {
    Ok(SiteHelper::from_config(config, five_second_backoff())?)
}

/// The pause state and the role the daemon starts in: standing by until elected with
/// `leader_election`, else active.
pub(super) fn initial_pause(run: &Running) -> PauseState {
    let standby = run.config.leader_election;
    run.metrics
        .set_role(if standby { Role::Standby } else { Role::Active });
    PauseState::new(standby)
}
