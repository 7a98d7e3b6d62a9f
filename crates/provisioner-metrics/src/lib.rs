//! The provisioner's Prometheus metrics, named, typed and labelled exactly as the Go provisioner
//! exports them; `provisioner-status` serves them over HTTP with the status API and page.
//!
//! The fifteen metrics of the Go provisioner (plus `choria_provisioner_lock_held` and
//! `choria_provisioner_invalid_identities`) live in one
//! [`Metrics`] value (no global registry) made of atomics, so the
//! hot path never takes a lock except to look up a new `rpc` label once. [`encode`](Metrics::encode)
//! writes the Prometheus text exposition format.
//!
//! The two `_time` metrics are summaries without quantiles (what the Go client library exports
//! by default): a `_sum` in seconds and a `_count`. `prometheus-client` has no summary type, so
//! the encoding is done here; it is a few lines of text and keeps the names byte-identical.

#![deny(missing_docs)]
pub mod process;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::process::ProcessCollector;

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Add one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Add `n`.
    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Set the value.
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Add one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Subtract one.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    /// The current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A summary without quantiles: count and sum of observed durations.
#[derive(Debug, Default)]
pub struct Summary {
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Summary {
    /// Record one observation.
    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
    /// Sum of observations in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9
    }
}

/// Per `agent#action` statistics: the `rpc` label's two metrics.
#[derive(Debug, Default)]
pub struct ActionStats {
    /// `choria_provisioner_rpc_time{rpc=...}`
    pub time: Summary,
    /// `choria_provisioner_rpc_errors{rpc=...}`
    pub errors: Counter,
}

/// Leadership as shown by `/readyz` and `/api/v1/status`: `active` whenever this instance
/// provisions without being the one leader (no election, or a mode where every replica works).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Leader election is off: this instance always works.
    Active,
    /// Leader election is on and this instance leads.
    Leader,
    /// Leader election is on and another instance leads (or none yet).
    Standby,
}

/// Every metric the provisioner exports, plus the health state behind `/readyz`.
#[derive(Debug)]
pub struct Metrics {
    site: String,
    /// `choria_provisioner_paused`
    pub paused: Gauge,
    /// `choria_provisioner_discovered`
    pub discovered: Counter,
    /// `choria_provisioner_event_discovered`
    pub event_discovered: Counter,
    /// `choria_provisioner_discover_cycles`
    pub discover_cycles: Counter,
    /// `choria_provisioner_discovery_errors`
    pub discovery_errors: Counter,
    /// `choria_provisioner_provision_errors`
    pub provision_errors: Counter,
    /// `choria_provisioner_provisioned`
    pub provisioned: Counter,
    /// `choria_provisioner_busy_workers`
    pub busy_workers: Gauge,
    /// `choria_provisioner_work_queue_entries`
    pub work_queue_entries: Gauge,
    /// `choria_provisioner_waiting_nodes`
    pub waiting_nodes: Gauge,
    /// `choria_provisioner_helper_time`
    pub helper_time: Summary,
    /// `choria_provisioner_helper_errors`
    pub helper_errors: Counter,
    /// `choria_provisioner_helper_shutdown_requests`
    pub helper_shutdown_requests: Counter,
    /// `choria_provisioner_lock_held`: nodes left to another provisioner (not in the Go set).
    pub lock_held: Counter,
    /// `choria_provisioner_invalid_identities`: announced or discovered node identities refused
    /// before anything was done for them (not in the Go set).
    pub invalid_identities: Counter,
    /// `choria_provisioner_policy_denied`: nodes refused by the admission policy (`rego_policy`,
    /// not in the Go set).
    pub policy_denied: Counter,
    /// `choria_provisioner_claim_operations`: JetStream operations made to claim nodes
    /// (active-active, not in the Go set).
    pub claim_operations: Counter,
    /// `choria_provisioner_claims_taken`: nodes left to the replica holding their claim.
    pub claims_taken: Counter,
    /// `choria_provisioner_claim_errors`: nodes not started because their claim could not be
    /// taken, confirmed or kept.
    pub claim_errors: Counter,
    /// `choria_provisioner_active_replicas`: live active-active replicas seen in the claims
    /// bucket, this one included (0 outside active-active).
    pub active_replicas: Gauge,
    /// `choria_provisioner_audit_dropped`: audit records lost to a destination: the writer's
    /// queue was full, or the stream's backlog was full while the stream was unreachable (not
    /// in the Go set).
    pub audit_dropped: Counter,
    /// `choria_provisioner_audit_stream_errors`: failed attempts to open the audit stream or to
    /// store a record in it (not in the Go set).
    pub audit_stream_errors: Counter,
    /// `choria_provisioner_audit_write_errors`: batches of audit records the audit file could
    /// not take (a full disk, say), each cut back to its last whole line (not in the Go set).
    pub audit_write_errors: Counter,
    /// `choria_provisioner_dropped_messages`: messages the connection dropped because they were
    /// not read in time (slow consumer events), and discovery replies that came after their
    /// discovery had ended (not in the Go set). Zero means every discovery reply was read.
    pub dropped_messages: Counter,
    /// `choria_provisioner_dropped_events`: startup events the lifecycle event connection
    /// dropped because they were not read in time (more than 65,536 waiting: a flood of
    /// announcements); a node among them is found by discovery (not in the Go set).
    pub dropped_events: Counter,
    /// `choria_provisioner_campaign_nodes`: the nodes of the rotation campaign by state
    /// (`pending`, `in_flight`, `done`, `failed`, in [`CAMPAIGN_STATES`] order), as the campaign
    /// record last said; all 0 without a campaign (not in the Go set).
    pub campaign_nodes: [Gauge; 4],
    /// go-choria's `choria_connector_*` series of the broker connection.
    pub connector: ConnectorMetrics,
    rpc: RwLock<BTreeMap<String, Arc<ActionStats>>>,
    election: RwLock<Option<ElectionSource>>,
    /// Why the election cannot campaign (Choria Streams unreachable, the bucket missing), when
    /// it cannot.
    election_blocked: RwLock<Option<String>>,
    process: ProcessCollector,
    connected: AtomicBool,
    role: AtomicU8,
}

/// go-choria's connector series (`choria/connection.go`), unlabelled, as the Go provisioner
/// exports them for its broker connection.
///
/// Each field is updated where go-choria updates it:
///
/// - [`initial_connection_attempts`](Self::initial_connection_attempts): once per *failed*
///   initial connection attempt (go-choria counts in its retry loop after a failure, despite
///   the help text);
/// - [`initial_connect_time`](Self::initial_connect_time): once, when the initial connection
///   loop ends (connected, or given up), with the whole time it took, retries included;
/// - [`reconnections`](Self::reconnections): each time the client is connected again after a
///   disconnection (not for the first connection);
/// - [`connection_closed`](Self::connection_closed): each time the connection is closed for good;
/// - [`errors`](Self::errors): each asynchronous error the client reports (slow consumer, a
///   server `-ERR`, a permissions violation), not disconnections.
#[derive(Debug, Default)]
pub struct ConnectorMetrics {
    /// `choria_connector_initial_connection_attempts`
    pub initial_connection_attempts: Counter,
    /// `choria_connector_reconnections`
    pub reconnections: Counter,
    /// `choria_connector_connection_closed`
    pub connection_closed: Counter,
    /// `choria_connector_errors`
    pub errors: Counter,
    /// `choria_connector_initial_connect_time`
    pub initial_connect_time: Summary,
}

/// One reading of an election's statistics, for go-choria's `choria_election_*` series
/// (`providers/election/streams/stats.go`). A series go-choria has not created yet is `None` or
/// zero here and is left out of the exposition, as Go leaves out a vector's unused children.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ElectionSample {
    /// `choria_election_campaigns{state="candidate"}`: campaigns made as a candidate.
    pub campaigns_as_candidate: u64,
    /// `choria_election_campaigns{state="leader"}`: campaigns made as the leader.
    pub campaigns_as_leader: u64,
    /// `choria_election_leader`: `None` until the key was first won, then whether it is held.
    pub leader: Option<bool>,
    /// `choria_election_interval_seconds`: `None` until the campaign started, then the delay
    /// before the next campaign.
    pub interval: Option<Duration>,
}

type ElectionReader = Box<dyn Fn() -> ElectionSample + Send + Sync>;

struct ElectionSource {
    election: String,
    identity: String,
    read: ElectionReader,
}

impl std::fmt::Debug for ElectionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectionSource")
            .field("election", &self.election)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// The states of `choria_provisioner_campaign_nodes`, in the order of
/// [`Metrics::campaign_nodes`].
pub const CAMPAIGN_STATES: [&str; 4] = ["pending", "in_flight", "done", "failed"];

const HELP: &[(&str, &str, &str)] = &[
    (
        "choria_provisioner_active_replicas",
        "gauge",
        "How many active-active replicas are live in the claims bucket, this one included",
    ),
    (
        "choria_provisioner_audit_dropped",
        "counter",
        "How many audit records were dropped because the writer or the stream fell behind",
    ),
    (
        "choria_provisioner_audit_stream_errors",
        "counter",
        "How many attempts to open the audit stream or store a record in it failed",
    ),
    (
        "choria_provisioner_audit_write_errors",
        "counter",
        "How many batches of audit records the audit file could not take",
    ),
    (
        "choria_provisioner_busy_workers",
        "gauge",
        "How many workers are busy provisioning nodes",
    ),
    (
        "choria_provisioner_claim_errors",
        "counter",
        "How many nodes were not started because their claim could not be taken, confirmed or kept",
    ),
    (
        "choria_provisioner_campaign_nodes",
        "gauge",
        "How many nodes of the rotation campaign are in each state",
    ),
    (
        "choria_provisioner_claim_operations",
        "counter",
        "How many JetStream operations were made to claim nodes",
    ),
    (
        "choria_provisioner_claims_taken",
        "counter",
        "How many nodes were left to the active-active replica holding their claim",
    ),
    (
        "choria_provisioner_discover_cycles",
        "counter",
        "How many discovery cycles were ran",
    ),
    (
        "choria_provisioner_discovered",
        "counter",
        "How many nodes were found through discovery",
    ),
    (
        "choria_provisioner_discovery_errors",
        "counter",
        "How many discovery related errors were encountered",
    ),
    (
        "choria_provisioner_dropped_messages",
        "counter",
        "How many messages the broker connection dropped because the provisioner did not read them in time (slow consumer), and discovery replies that came after their discovery had ended",
    ),
    (
        "choria_provisioner_dropped_events",
        "counter",
        "How many startup events the lifecycle event connection dropped because the provisioner did not read them in time (slow consumer)",
    ),
    (
        "choria_provisioner_event_discovered",
        "counter",
        "How many nodes were found through receiving an event about them",
    ),
    (
        "choria_provisioner_helper_errors",
        "counter",
        "How many helper related errors were encountered",
    ),
    (
        "choria_provisioner_helper_shutdown_requests",
        "counter",
        "Host many times the helper asked for a node to be shutdown and it succeeded",
    ),
    (
        "choria_provisioner_helper_time",
        "summary",
        "How long it took to run the helper",
    ),
    (
        "choria_provisioner_invalid_identities",
        "counter",
        "How many node identities were refused as invalid before anything was done for them",
    ),
    (
        "choria_provisioner_lock_held",
        "counter",
        "How many times a node was left alone because another provisioner holds its provisioning lock",
    ),
    (
        "choria_provisioner_paused",
        "gauge",
        "Indicates if the provisioner is paused",
    ),
    (
        "choria_provisioner_policy_denied",
        "counter",
        "How many nodes the admission policy refused before the helper ran",
    ),
    (
        "choria_provisioner_provision_errors",
        "counter",
        "How many provision related errors were encountered",
    ),
    (
        "choria_provisioner_provisioned",
        "counter",
        "How many nodes were successfully provisioned",
    ),
    (
        "choria_provisioner_rpc_errors",
        "counter",
        "How many rpc related errors were encountered",
    ),
    (
        "choria_provisioner_rpc_time",
        "summary",
        "How long it took to perform RPC requests",
    ),
    (
        "choria_provisioner_waiting_nodes",
        "gauge",
        "The number of nodes currently waiting to be provisioned",
    ),
    (
        "choria_provisioner_work_queue_entries",
        "gauge",
        "Number of nodes on the work queue waiting to be provisioned",
    ),
];

impl Metrics {
    /// New metrics, all zero, labelled with `site`.
    pub fn new(site: impl Into<String>) -> Arc<Self> {
        Arc::new(Metrics {
            site: site.into(),
            paused: Gauge::default(),
            discovered: Counter::default(),
            event_discovered: Counter::default(),
            discover_cycles: Counter::default(),
            discovery_errors: Counter::default(),
            provision_errors: Counter::default(),
            provisioned: Counter::default(),
            busy_workers: Gauge::default(),
            work_queue_entries: Gauge::default(),
            waiting_nodes: Gauge::default(),
            helper_time: Summary::default(),
            helper_errors: Counter::default(),
            helper_shutdown_requests: Counter::default(),
            lock_held: Counter::default(),
            invalid_identities: Counter::default(),
            policy_denied: Counter::default(),
            claim_operations: Counter::default(),
            claims_taken: Counter::default(),
            claim_errors: Counter::default(),
            active_replicas: Gauge::default(),
            audit_dropped: Counter::default(),
            audit_stream_errors: Counter::default(),
            audit_write_errors: Counter::default(),
            dropped_messages: Counter::default(),
            dropped_events: Counter::default(),
            campaign_nodes: Default::default(),
            connector: ConnectorMetrics::default(),
            rpc: RwLock::new(BTreeMap::new()),
            election: RwLock::new(None),
            election_blocked: RwLock::new(None),
            process: ProcessCollector::new(),
            connected: AtomicBool::new(false),
            role: AtomicU8::new(Role::Active as u8),
        })
    }

    /// The `site` label value.
    pub fn site(&self) -> &str {
        &self.site
    }

    /// The statistics of one `agent#action`, created on first use.
    pub fn rpc(&self, label: &str) -> Arc<ActionStats> {
        if let Ok(map) = self.rpc.read() {
            if let Some(s) = map.get(label) {
                return Arc::clone(s);
            }
        }
        // A poisoned lock only means another thread panicked while inserting: the map is
        // still a valid map, so keep using it.
        let mut map = self.rpc.write().unwrap_or_else(|e| e.into_inner());
        Arc::clone(map.entry(label.to_string()).or_default())
    }

    /// Export go-choria's election series for `election` (the KV key, `provisioner`) and
    /// `identity` (the candidate, the Choria identity), read from `read` at every scrape.
    /// A later call replaces the source.
    pub fn set_election_source(
        &self,
        election: impl Into<String>,
        identity: impl Into<String>,
        read: impl Fn() -> ElectionSample + Send + Sync + 'static,
    ) {
        let source = ElectionSource {
            election: election.into(),
            identity: identity.into(),
            read: Box::new(read),
        };
        *self.election.write().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// Record why the election cannot campaign (`None` once it can): `/readyz` is then not
    /// ready, since this instance can never lead.
    pub fn set_election_blocked(&self, why: Option<String>) {
        *self
            .election_blocked
            .write()
            .unwrap_or_else(|e| e.into_inner()) = why;
    }

    /// Why the election cannot campaign, when it cannot.
    pub fn election_blocked(&self) -> Option<String> {
        self.election_blocked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record whether the broker connection is up (for `/readyz`).
    pub fn set_connected(&self, up: bool) {
        self.connected.store(up, Ordering::Relaxed);
    }

    /// Whether the broker connection is up.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Record the leadership role (for `/readyz`).
    pub fn set_role(&self, role: Role) {
        self.role.store(role as u8, Ordering::Relaxed);
    }

    /// The leadership role.
    pub fn role(&self) -> Role {
        match self.role.load(Ordering::Relaxed) {
            x if x == Role::Leader as u8 => Role::Leader,
            x if x == Role::Standby as u8 => Role::Standby,
            _ => Role::Active,
        }
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(4096);
        let site = escape_label(&self.site);
        let rpc: Vec<(String, Arc<ActionStats>)> = {
            let map = self.rpc.read().unwrap_or_else(|e| e.into_inner());
            map.iter()
                .map(|(k, v)| (escape_label(k), Arc::clone(v)))
                .collect()
        };
        self.encode_connector(&mut out);
        self.encode_election(&mut out);
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            let plain = |v: String, out: &mut String| {
                let _ = writeln!(out, "{name}{{site=\"{site}\"}} {v}");
            };
            match *name {
                "choria_provisioner_busy_workers" => {
                    plain(self.busy_workers.get().to_string(), &mut out)
                }
                "choria_provisioner_discover_cycles" => {
                    plain(self.discover_cycles.get().to_string(), &mut out)
                }
                "choria_provisioner_discovered" => {
                    plain(self.discovered.get().to_string(), &mut out)
                }
                "choria_provisioner_discovery_errors" => {
                    plain(self.discovery_errors.get().to_string(), &mut out)
                }
                "choria_provisioner_event_discovered" => {
                    plain(self.event_discovered.get().to_string(), &mut out)
                }
                "choria_provisioner_helper_errors" => {
                    plain(self.helper_errors.get().to_string(), &mut out)
                }
                "choria_provisioner_helper_shutdown_requests" => {
                    plain(self.helper_shutdown_requests.get().to_string(), &mut out)
                }
                "choria_provisioner_helper_time" => {
                    let _ = writeln!(
                        out,
                        "{name}_sum{{site=\"{site}\"}} {}",
                        fmt_f64(self.helper_time.sum_seconds())
                    );
                    let _ = writeln!(
                        out,
                        "{name}_count{{site=\"{site}\"}} {}",
                        self.helper_time.count()
                    );
                }
                "choria_provisioner_lock_held" => plain(self.lock_held.get().to_string(), &mut out),
                "choria_provisioner_claim_operations" => {
                    plain(self.claim_operations.get().to_string(), &mut out)
                }
                "choria_provisioner_claims_taken" => {
                    plain(self.claims_taken.get().to_string(), &mut out)
                }
                "choria_provisioner_claim_errors" => {
                    plain(self.claim_errors.get().to_string(), &mut out)
                }
                "choria_provisioner_active_replicas" => {
                    plain(self.active_replicas.get().to_string(), &mut out)
                }
                "choria_provisioner_invalid_identities" => {
                    plain(self.invalid_identities.get().to_string(), &mut out)
                }
                "choria_provisioner_audit_dropped" => {
                    plain(self.audit_dropped.get().to_string(), &mut out)
                }
                "choria_provisioner_audit_stream_errors" => {
                    plain(self.audit_stream_errors.get().to_string(), &mut out)
                }
                "choria_provisioner_audit_write_errors" => {
                    plain(self.audit_write_errors.get().to_string(), &mut out)
                }
                "choria_provisioner_dropped_messages" => {
                    plain(self.dropped_messages.get().to_string(), &mut out)
                }
                "choria_provisioner_dropped_events" => {
                    plain(self.dropped_events.get().to_string(), &mut out)
                }
                "choria_provisioner_campaign_nodes" => {
                    for (state, g) in CAMPAIGN_STATES.iter().zip(&self.campaign_nodes) {
                        let _ = writeln!(
                            out,
                            "{name}{{site=\"{site}\",state=\"{state}\"}} {}",
                            g.get()
                        );
                    }
                }
                "choria_provisioner_policy_denied" => {
                    plain(self.policy_denied.get().to_string(), &mut out)
                }
                "choria_provisioner_paused" => plain(self.paused.get().to_string(), &mut out),
                "choria_provisioner_provision_errors" => {
                    plain(self.provision_errors.get().to_string(), &mut out)
                }
                "choria_provisioner_provisioned" => {
                    plain(self.provisioned.get().to_string(), &mut out)
                }
                "choria_provisioner_rpc_errors" => {
                    for (label, s) in &rpc {
                        let _ = writeln!(
                            out,
                            "{name}{{rpc=\"{label}\",site=\"{site}\"}} {}",
                            s.errors.get()
                        );
                    }
                }
                "choria_provisioner_rpc_time" => {
                    for (label, s) in &rpc {
                        let _ = writeln!(
                            out,
                            "{name}_sum{{rpc=\"{label}\",site=\"{site}\"}} {}",
                            fmt_f64(s.time.sum_seconds())
                        );
                        let _ = writeln!(
                            out,
                            "{name}_count{{rpc=\"{label}\",site=\"{site}\"}} {}",
                            s.time.count()
                        );
                    }
                }
                "choria_provisioner_waiting_nodes" => {
                    plain(self.waiting_nodes.get().to_string(), &mut out)
                }
                "choria_provisioner_work_queue_entries" => {
                    plain(self.work_queue_entries.get().to_string(), &mut out)
                }
                _ => {}
            }
        }
        self.process.sample().encode(&mut out);
        out
    }

    fn encode_connector(&self, out: &mut String) {
        let c = &self.connector;
        for (name, help, value) in [
            (
                "choria_connector_connection_closed",
                "Number of times the connection was closed",
                c.connection_closed.get(),
            ),
            (
                "choria_connector_errors",
                "Number of times the connection encountered an error",
                c.errors.get(),
            ),
        ] {
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
        let name = "choria_connector_initial_connect_time";
        family(
            out,
            name,
            "summary",
            "How long it took to establish the initial connection",
        );
        let t = &c.initial_connect_time;
        let _ = writeln!(out, "{name}_sum {}", fmt_f64(t.sum_seconds()));
        let _ = writeln!(out, "{name}_count {}", t.count());
        for (name, help, value) in [
            (
                "choria_connector_initial_connection_attempts",
                "How many connection attempts were made before a connection was established",
                c.initial_connection_attempts.get(),
            ),
            (
                "choria_connector_reconnections",
                "Number of times the connector reconnected to the middleware",
                c.reconnections.get(),
            ),
        ] {
            family(out, name, "counter", help);
            let _ = writeln!(out, "{name} {value}");
        }
    }

    fn encode_election(&self, out: &mut String) {
        let guard = self.election.read().unwrap_or_else(|e| e.into_inner());
        let Some(source) = guard.as_ref() else {
            return;
        };
        let sample = (source.read)();
        let labels = format!(
            "election=\"{}\",identity=\"{}\"",
            escape_label(&source.election),
            escape_label(&source.identity)
        );
        let campaigns = [
            ("candidate", sample.campaigns_as_candidate),
            ("leader", sample.campaigns_as_leader),
        ];
        if campaigns.iter().any(|(_, n)| *n > 0) {
            let name = "choria_election_campaigns";
            family(
                out,
                name,
                "counter",
                "The number of campaigns a specific candidate voted in",
            );
            for (state, n) in campaigns {
                if n > 0 {
                    let _ = writeln!(out, "{name}{{{labels},state=\"{state}\"}} {n}");
                }
            }
        }
        if let Some(interval) = sample.interval {
            let name = "choria_election_interval_seconds";
            family(
                out,
                name,
                "gauge",
                "The number of seconds between campaigns",
            );
            let _ = writeln!(
                out,
                "{name}{{{labels}}} {}",
                fmt_f64(interval.as_secs_f64())
            );
        }
        if let Some(leader) = sample.leader {
            let name = "choria_election_leader";
            family(
                out,
                name,
                "gauge",
                "Indicates if a specific instance is the current leader",
            );
            let _ = writeln!(out, "{name}{{{labels}}} {}", u8::from(leader));
        }
    }
}

/// The `# HELP` and `# TYPE` lines of one metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)` for the values a duration sum takes.
fn fmt_f64(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else {
        format!("{v}")
    }
}

/// Escape a label value as the text format requires (backslash, quote, newline).
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// The provisioning cycle and the work queue report through this implementation.
impl provision_core::Observer for Metrics {
    fn rpc_time(&self, label: &'static str, elapsed: Duration) {
        self.rpc(label).time.observe(elapsed);
    }
    fn rpc_error(&self, label: &'static str) {
        self.rpc(label).errors.inc();
    }
    fn helper_time(&self, elapsed: Duration) {
        self.helper_time.observe(elapsed);
    }
    fn helper_error(&self) {
        self.helper_errors.inc();
    }
    fn helper_shutdown(&self) {
        self.helper_shutdown_requests.inc();
    }
    fn provisioned(&self) {
        self.provisioned.inc();
    }
    fn provision_error(&self) {
        self.provision_errors.inc();
    }
    fn invalid_identity(&self) {
        self.invalid_identities.inc();
    }
    fn admission(&self, _identity: &str, decision: &provision_core::Decision) {
        if matches!(decision, provision_core::Decision::Deny(_)) {
            self.policy_denied.inc();
        }
    }
    fn lock_held(&self) {
        self.lock_held.inc();
    }
    fn claim_taken(&self) {
        self.claims_taken.inc();
    }
    fn claim_error(&self) {
        self.claim_errors.inc();
    }
    fn discovered(&self) {
        self.discovered.inc();
    }
    fn event_discovered(&self) {
        self.event_discovered.inc();
    }
    fn discover_cycle(&self) {
        self.discover_cycles.inc();
    }
    fn discovery_error(&self) {
        self.discovery_errors.inc();
    }
    fn busy_workers(&self, n: usize) {
        self.busy_workers.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    fn work_queue_entries(&self, n: usize) {
        self.work_queue_entries
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    fn waiting_nodes(&self, n: usize) {
        self.waiting_nodes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    fn paused(&self, paused: bool) {
        self.paused.set(i64::from(paused));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Insists the exposition `text` holds each of `lines`.
    fn assert_exposes(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }

    #[test]
    fn every_metric_is_exported_with_its_type_and_site_label() {
        let m = Metrics::new("lon");
        m.rpc("choria_provision#configure")
            .time
            .observe(Duration::from_millis(1500));
        m.rpc("choria_provision#configure").errors.inc();
        m.provisioned.inc_by(3);
        m.helper_time.observe(Duration::from_millis(250));
        let text = m.encode();
        for (name, kind, _) in HELP {
            assert!(
                text.contains(&format!("# TYPE {name} {kind}\n")),
                "{name} missing"
            );
        }
        assert!(text.contains("choria_provisioner_provisioned{site=\"lon\"} 3\n"));
        assert!(text.contains("choria_provisioner_rpc_time_sum{rpc=\"choria_provision#configure\",site=\"lon\"} 1.5\n"));
        assert!(text.contains("choria_provisioner_rpc_time_count{rpc=\"choria_provision#configure\",site=\"lon\"} 1\n"));
        assert!(text.contains(
            "choria_provisioner_rpc_errors{rpc=\"choria_provision#configure\",site=\"lon\"} 1\n"
        ));
        assert!(text.contains("choria_provisioner_helper_time_sum{site=\"lon\"} 0.25\n"));
        assert!(text.contains("choria_provisioner_helper_time_count{site=\"lon\"} 1\n"));
        // The fifteen metrics of the Go provisioner, plus the lock-held, invalid-identity and
        // policy-denied counters, the audit trail's three, the four active-active series, the
        // dropped messages and the dropped events.
        assert_eq!(HELP.len(), 28);
        m.audit_dropped.inc_by(2);
        m.audit_stream_errors.inc();
        let text = m.encode();
        assert!(text.contains("choria_provisioner_audit_dropped{site=\"lon\"} 2\n"));
        assert!(text.contains("choria_provisioner_audit_stream_errors{site=\"lon\"} 1\n"));
        let m = Metrics::new("lon");
        provision_core::Observer::claim_taken(&m);
        provision_core::Observer::claim_error(&m);
        provision_core::Observer::claim_error(&m);
        m.claim_operations.inc_by(7);
        m.active_replicas.set(3);
        let text = m.encode();
        assert_exposes(
            &text,
            &[
                "choria_provisioner_claims_taken{site=\"lon\"} 1\n",
                "choria_provisioner_claim_errors{site=\"lon\"} 2\n",
                "choria_provisioner_claim_operations{site=\"lon\"} 7\n",
                "choria_provisioner_active_replicas{site=\"lon\"} 3\n",
            ],
        );
    }

    #[test]
    fn connector_series_are_always_exported_unlabelled() {
        let m = Metrics::new("lon");
        let text = m.encode();
        for (name, kind) in [
            ("choria_connector_connection_closed", "counter"),
            ("choria_connector_errors", "counter"),
            ("choria_connector_initial_connect_time", "summary"),
            ("choria_connector_initial_connection_attempts", "counter"),
            ("choria_connector_reconnections", "counter"),
        ] {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        assert!(text.contains("choria_connector_reconnections 0\n"));
        m.connector.reconnections.inc_by(2);
        m.connector.errors.inc();
        m.connector.connection_closed.inc();
        m.connector.initial_connection_attempts.inc_by(3);
        m.connector
            .initial_connect_time
            .observe(Duration::from_millis(1250));
        let text = m.encode();
        assert_exposes(
            &text,
            &[
                "choria_connector_reconnections 2\n",
                "choria_connector_errors 1\n",
                "choria_connector_connection_closed 1\n",
                "choria_connector_initial_connection_attempts 3\n",
                "choria_connector_initial_connect_time_sum 1.25\n",
                "choria_connector_initial_connect_time_count 1\n",
            ],
        );
    }

    #[test]
    fn election_series_appear_as_go_choria_creates_them() {
        let m = Metrics::new("lon");
        assert!(!m.encode().contains("choria_election"));
        let sample = Arc::new(RwLock::new(ElectionSample::default()));
        let read = Arc::clone(&sample);
        m.set_election_source("provisioner", "p1.example.net", move || {
            *read.read().unwrap_or_else(|e| e.into_inner())
        });
        // Nothing campaigned yet: no series at all, as Go's vectors have no children.
        assert!(!m.encode().contains("choria_election"));
        let labels = "election=\"provisioner\",identity=\"p1.example.net\"";
        *sample.write().unwrap_or_else(|e| e.into_inner()) = ElectionSample {
            campaigns_as_candidate: 2,
            campaigns_as_leader: 0,
            leader: None,
            interval: Some(Duration::from_millis(750)),
        };
        let text = m.encode();
        assert!(text.contains("# TYPE choria_election_campaigns counter\n"));
        assert!(text.contains(&format!(
            "choria_election_campaigns{{{labels},state=\"candidate\"}} 2\n"
        )));
        assert!(!text.contains("state=\"leader\""), "{text}");
        assert!(text.contains(&format!(
            "choria_election_interval_seconds{{{labels}}} 0.75\n"
        )));
        assert!(!text.contains("choria_election_leader"), "{text}");
        *sample.write().unwrap_or_else(|e| e.into_inner()) = ElectionSample {
            campaigns_as_candidate: 3,
            campaigns_as_leader: 5,
            leader: Some(true),
            interval: Some(Duration::from_millis(500)),
        };
        let text = m.encode();
        assert!(text.contains(&format!(
            "choria_election_campaigns{{{labels},state=\"leader\"}} 5\n"
        )));
        assert!(text.contains("# TYPE choria_election_leader gauge\n"));
        assert!(text.contains(&format!("choria_election_leader{{{labels}}} 1\n")));
        sample.write().unwrap_or_else(|e| e.into_inner()).leader = Some(false);
        assert!(m
            .encode()
            .contains(&format!("choria_election_leader{{{labels}}} 0\n")));
    }

    #[test]
    fn process_series_are_exported() {
        let text = Metrics::new("lon").encode();
        for (name, kind) in [
            ("process_cpu_seconds_total", "counter"),
            ("process_open_fds", "gauge"),
            ("process_max_fds", "gauge"),
            ("process_virtual_memory_bytes", "gauge"),
            ("process_virtual_memory_max_bytes", "gauge"),
            ("process_resident_memory_bytes", "gauge"),
            ("process_start_time_seconds", "gauge"),
            ("process_network_receive_bytes_total", "counter"),
            ("process_network_transmit_bytes_total", "counter"),
        ] {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        assert!(!text.contains("go_"), "no Go runtime series: {text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new("a\"b\\c\nd");
        assert!(m.encode().contains("site=\"a\\\"b\\\\c\\nd\""));
    }
}
