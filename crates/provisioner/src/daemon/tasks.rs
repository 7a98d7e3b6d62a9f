//! The daemon's long-running tasks: the connection and connector followers behind `/readyz`
//! and the `choria_connector_*` series, the lifecycle listener, discovery (sharded for a large
//! fleet, started early when announced nodes wait) and the election.

use std::sync::Arc;
use std::time::Duration;

use choria_rpc_client::connection::{
    connect_with_retry_observed, ConnectionError, ConnectionSettings, ConnectorSnapshot,
    ConnectorStats,
};
use choria_rpc_client::election::{self, Election, ElectionEvent};
use choria_rpc_client::rpc::{LifecycleSubscription, RpcClient};
use provision_core::{AddResult, Fleet, Observer as _, PauseState, Source};
use provisioner_metrics::{Metrics, Role};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::aa;
use crate::config::Config;
use crate::Error;

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

/// Keep `/readyz` in step with the broker connection, until `stopped`.
pub(super) async fn follow_connection(
    client: RpcClient,
    metrics: Arc<Metrics>,
    stopped: CancellationToken,
) {
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
pub(super) async fn follow_connector(
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
/// [`choria_rpc_client::connection::EVENT_SUBSCRIPTION_CAPACITY`] unread messages: a flood of forged events is dropped and
/// counted there (`connector` feeds the metrics), never held in memory by the million nor
/// queued ahead of discovery replies.
#[allow(clippy::too_many_arguments)]
pub(super) async fn listen(
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

/// Broadcast discovery at start, every interval, and when asked (after winning an election).
pub(super) async fn discover(
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
pub(super) async fn elect(
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
    use super::{discovery_shards, DISCOVERY_SHARD_SIZE, MAX_DISCOVERY_SHARDS};
    use crate::daemon::runtime;
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
