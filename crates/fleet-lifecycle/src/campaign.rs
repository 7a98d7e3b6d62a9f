//! Rotation campaigns: send go-choria's `choria_provision#reprovision` to provisioned servers on
//! their main collective, in waves, and follow each back through provisioning until the
//! provisioner has provisioned it again.
//!
//! A campaign lives in the `CHORIA_PROVISIONER_CAMPAIGN` key-value bucket of the provisioning
//! account, next to the fleet control bucket:
//!
//! - `campaign` holds the one campaign: who started it, what it selected, its limits (nodes a
//!   minute, nodes in flight, the share of failures that stops it, how long a node may take),
//!   its state (`running`, `paused`, `stopped`, `aborted`, `completed`) and its progress, which
//!   the process driving it rewrites every two seconds with a heartbeat.
//! - `n.<hex of the identity>` holds one node: `pending`, `sent` (the node acknowledged the
//!   reprovision request and is on its way back), `done` or `failed` with why.
//!
//! Whoever drives a campaign holds a lease: the heartbeat. Another process can take over a
//! campaign whose heartbeat is older than [`LEASE`] (its driver was killed or lost the
//! broker), so `rotate resume` continues a campaign from any host, with every node where it
//! was. Writes of the campaign record are compare-and-set on the key's revision, so a pause or
//! an abort from another shell is never overwritten by a heartbeat.
//!
//! A node counts as done when the provisioner records it `provisioned` after it acknowledged
//! the reprovision: read from the audit stream (`audit_stream`), which is durable, so a driver
//! that resumes after a crash reads what it missed; and from the node's `startup` lifecycle
//! event of component `server` on the main collective, which a server publishes when it starts
//! with its new configuration. Records are sealed as fleet control's are (the claims secret):
//! a record that does not verify is ignored.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::kv;
use choria_rpc_client::protocol::{FactFilter, Filter};
use choria_rpc_client::rpc::RpcClient;
use choria_rpc_client::streams::{
    first_answering, open_bucket, route_errors, BucketError, Probe, StreamsApi,
};
use futures::StreamExt;
use provision_core::identity::{escaped, IdentityRule};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::control::REQUEST_TIMEOUT;
use crate::seal::Seal;
use crate::{bounded_to as bounded, now_unix};

/// The bucket campaigns live in.
pub const CAMPAIGN_BUCKET: &str = "CHORIA_PROVISIONER_CAMPAIGN";
/// The key of the campaign record.
pub const CAMPAIGN_KEY: &str = "campaign";
/// The prefix of node keys.
pub const NODE_PREFIX: &str = "n.";
/// A driver whose heartbeat is older than this may be replaced.
pub const LEASE: Duration = Duration::from_secs(30);
/// How often the driver writes its progress and heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a reprovision request waits for its reply (go-choria's agent timeout).
pub const REPROVISION_TIMEOUT: Duration = Duration::from_secs(20);
/// Tries of a reprovision request that gets no reply before the node is failed.
pub const SEND_TRIES: u32 = 3;
/// The wait before trying a node that did not answer again, times the tries so far (one
/// minute, then two): a node an earlier request reached is in provisioning mode, off the main
/// collective, until it is provisioned again, which may wait out go-choria's two-minute
/// provisioning lock of a killed provisioner and then the next discovery.
pub const RETRY_WAIT: Duration = Duration::from_secs(60);
/// How long after acknowledging a node with no news is asked, on its main collective, when
/// it last started (`rpcutil#daemon_stats`), and how long between such questions.
pub const CHECK_AFTER: Duration = Duration::from_secs(60);
/// How long that question waits for its answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// The most such questions on their way at once.
const MAX_CHECKS: usize = 64;
/// Failures kept in the campaign record for `rotate status`.
pub const RECENT_FAILURES: usize = 20;
/// The most nodes one campaign holds.
pub const MAX_TARGETS: usize = 2_000_000;
/// The failure share is judged only once this many nodes have finished.
pub const FAILING_MIN_FINISHED: u64 = 20;
/// The largest identities file read.
const MAX_IDENTITIES_FILE: u64 = 256 * 1024 * 1024;
/// The largest record kept (bytes).
const MAX_RECORD: usize = 64 * 1024;
/// The longest error text kept for a node.
const MAX_ERROR: usize = 512;
/// How many bucket writes run at once when a campaign is created or loaded.
const BULK: usize = 64;

/// Why a campaign could not be started, read or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CampaignError {
    /// Neither route to Choria Streams answered.
    #[error("rotation campaigns need Choria Streams (JetStream), and neither the choria.streams import nor the account's own JetStream answered: {detail}")]
    Unreachable {
        /// What each route said.
        detail: String,
    },
    /// A read or write of the bucket failed.
    #[error("could not {action} in campaign bucket {CAMPAIGN_BUCKET}: {detail}")]
    Request {
        /// What was being done.
        action: String,
        /// The server's answer.
        detail: String,
    },
    /// There is no campaign.
    #[error("there is no rotation campaign; start one with choria-provisioner rotate")]
    NoCampaign,
    /// A campaign is already under way.
    #[error("rotation campaign {id} is {state} ({progress}); abort it before starting another")]
    Exists {
        /// Its id.
        id: String,
        /// Its state.
        state: CampaignState,
        /// Its progress.
        progress: String,
    },
    /// Another process drives the campaign.
    #[error("rotation campaign {id} is driven by {driver} (heartbeat {age}s ago); it can be taken over once its heartbeat is {}s old", LEASE.as_secs())]
    Busy {
        /// Its id.
        id: String,
        /// The driver.
        driver: String,
        /// Seconds since its heartbeat.
        age: i64,
    },
    /// The campaign is not in a state the command applies to.
    #[error("rotation campaign {id} is {state}: {what}")]
    State {
        /// Its id.
        id: String,
        /// Its state.
        state: CampaignState,
        /// What cannot be done.
        what: String,
    },
    /// The selection or the limits are not usable.
    #[error("rotate: {0}")]
    Invalid(String),
    /// The nodes could not be selected.
    #[error("rotate: could not select nodes: {0}")]
    Select(String),
    /// The audit stream could not be read.
    #[error("rotate: could not read audit stream {stream}: {detail}")]
    Audit {
        /// The stream.
        stream: String,
        /// What failed.
        detail: String,
    },
}

fn request(action: impl Into<String>, e: impl std::fmt::Display) -> CampaignError {
    CampaignError::Request {
        action: action.into(),
        detail: e.to_string(),
    }
}

/// Where a campaign is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CampaignState {
    /// Nodes are being sent reprovision requests.
    Running,
    /// An operator paused it; `rotate resume` continues.
    Paused,
    /// It stopped itself: more than `--stop-if-failing` of the finished nodes failed.
    Stopped,
    /// An operator ended it.
    Aborted,
    /// Every node is done or failed.
    Completed,
}

impl CampaignState {
    /// The state's name.
    pub fn label(self) -> &'static str {
        match self {
            CampaignState::Running => "running",
            CampaignState::Paused => "paused",
            CampaignState::Stopped => "stopped",
            CampaignState::Aborted => "aborted",
            CampaignState::Completed => "completed",
        }
    }

    /// Whether the campaign is over.
    pub fn finished(self) -> bool {
        matches!(self, CampaignState::Aborted | CampaignState::Completed)
    }
}

impl std::fmt::Display for CampaignState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// One failed node, as the campaign record keeps the latest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFailure {
    /// The node.
    pub identity: String,
    /// Why.
    pub error: String,
    /// When (Unix seconds).
    pub at: i64,
}

/// The limits of a campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Reprovision requests sent a minute at most.
    pub rate_per_minute: u32,
    /// Nodes between the reprovision request and their new provisioning at most.
    pub max_in_flight: u32,
    /// The campaign stops itself when more than this share (percent) of finished nodes failed.
    pub stop_if_failing: f64,
    /// A node not provisioned again this long after it acknowledged is failed (seconds).
    pub node_timeout_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            rate_per_minute: 500,
            max_in_flight: 100,
            stop_if_failing: 5.0,
            node_timeout_secs: 900,
        }
    }
}

impl Limits {
    /// Checks the limits are usable.
    pub fn validate(&self) -> Result<(), CampaignError> {
        if self.rate_per_minute == 0 {
            return Err(CampaignError::Invalid(
                "--rate must be at least 1/min".into(),
            ));
        }
        if self.max_in_flight == 0 {
            return Err(CampaignError::Invalid(
                "--max-in-flight must be at least 1".into(),
            ));
        }
        if !(0.0..=100.0).contains(&self.stop_if_failing) {
            return Err(CampaignError::Invalid(
                "--stop-if-failing must be a share from 0% to 100%".into(),
            ));
        }
        if self.node_timeout_secs == 0 {
            return Err(CampaignError::Invalid(
                "--node-timeout must be longer than zero".into(),
            ));
        }
        Ok(())
    }
}

/// The campaign, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CampaignRecord {
    /// Its id (time and a random part).
    pub id: String,
    /// Who started it.
    pub by: String,
    /// What selected its nodes, as given.
    pub selector: String,
    /// When it was started (Unix seconds).
    pub created: i64,
    /// Its limits.
    pub limits: Limits,
    /// Its state.
    pub state: CampaignState,
    /// Why it is paused, stopped or aborted, and by whom.
    #[serde(default)]
    pub reason: String,
    /// Nodes in it.
    pub total: u64,
    /// Nodes not yet sent a request.
    pub pending: u64,
    /// Nodes sent a request and not yet provisioned again.
    pub in_flight: u64,
    /// Nodes provisioned again.
    pub done: u64,
    /// Nodes failed.
    pub failed: u64,
    /// Who drives it (empty when nobody does).
    #[serde(default)]
    pub driver: String,
    /// The driver's last heartbeat (Unix seconds).
    #[serde(default)]
    pub heartbeat: i64,
    /// When it is expected to finish at the current pace (Unix seconds).
    #[serde(default)]
    pub eta: Option<i64>,
    /// The latest failures.
    #[serde(default)]
    pub recent_failures: Vec<NodeFailure>,
    /// The first audit stream sequence that can be about this campaign.
    #[serde(default)]
    pub audit_from: Option<u64>,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

impl CampaignRecord {
    /// `done/total, failed, in flight` in a few words.
    pub fn progress(&self) -> String {
        format!(
            "{} of {} provisioned again, {} failed, {} in flight, {} waiting",
            self.done, self.total, self.failed, self.in_flight, self.pending
        )
    }

    /// Seconds since the driver's heartbeat at `now`.
    pub fn heartbeat_age(&self, now: i64) -> i64 {
        now.saturating_sub(self.heartbeat)
    }

    /// Whether a driver holds the lease at `now`.
    pub fn driven(&self, now: i64) -> bool {
        !self.driver.is_empty()
            && self.heartbeat_age(now) < i64::try_from(LEASE.as_secs()).unwrap_or(i64::MAX)
    }
}

/// Where one node of a campaign is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRotation {
    /// Not yet sent a request.
    Pending,
    /// Acknowledged the reprovision request.
    Sent,
    /// Provisioned again.
    Done,
    /// Failed.
    Failed,
}

/// One node of a campaign, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node.
    pub identity: String,
    /// Where it is.
    pub state: NodeRotation,
    /// When it acknowledged the request (Unix seconds).
    #[serde(default)]
    pub sent_at: Option<i64>,
    /// When it was provisioned again or failed (Unix seconds).
    #[serde(default)]
    pub finished_at: Option<i64>,
    /// Requests sent that got no reply.
    #[serde(default)]
    pub tries: u32,
    /// Why it failed.
    #[serde(default)]
    pub error: String,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// The bucket key of `identity`.
pub fn node_key(identity: &str) -> String {
    format!("{NODE_PREFIX}{}", hex::encode(identity.as_bytes()))
}

/// The campaign bucket over one route.
#[derive(Clone)]
pub struct Campaigns {
    store: kv::Store,
    js: jetstream::Context,
    seal: Seal,
    by: String,
    /// The provisioners' own connection, for the audit stream, when the bucket is elsewhere
    /// or here.
    provisioning: Option<async_nats::Client>,
}

impl std::fmt::Debug for Campaigns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Campaigns").field("by", &self.by).finish()
    }
}

impl Campaigns {
    /// Opens the bucket over whichever route answers, creating it when `create` and the
    /// account may. `by` names whoever writes.
    pub async fn open(
        client: async_nats::Client,
        by: &str,
        seal: Seal,
        create: bool,
    ) -> Result<Campaigns, CampaignError> {
        let config = kv::Config {
            bucket: CAMPAIGN_BUCKET.to_string(),
            description: "Choria provisioner rotation campaigns".to_string(),
            history: 1,
            max_value_size: MAX_RECORD as i32,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        let probe = first_answering(
            |api| {
                let config = &config;
                let js = api.context(client.clone(), REQUEST_TIMEOUT);
                async move { open_bucket(&js, config, create).await.map(|b| (js, b)) }
            },
            BucketError::unreachable,
        )
        .await;
        let (js, opened) = match probe {
            Probe::Opened(_, opened) => opened,
            Probe::Answered(_, BucketError::Missing) => return Err(CampaignError::NoCampaign),
            Probe::Answered(_, BucketError::Create(d)) => {
                return Err(request("create the bucket", d))
            }
            Probe::Answered(_, e) => return Err(request("open the bucket", e)),
            Probe::Unreachable(errors) => {
                return Err(CampaignError::Unreachable {
                    detail: route_errors(&errors),
                })
            }
        };
        if let Some(replicas) = opened.created {
            info!("created campaign bucket {CAMPAIGN_BUCKET} with {replicas} replicas");
        }
        Ok(Campaigns {
            store: opened.store,
            js,
            seal,
            by: by.to_string(),
            provisioning: None,
        })
    }

    /// The same bucket, with the provisioners' own connection for the audit stream (when the
    /// bucket was reached over another, the main collective's).
    pub fn with_provisioning(mut self, client: async_nats::Client) -> Self {
        self.provisioning = Some(client);
        self
    }

    /// The JetStream API the bucket was reached through (the audit stream is read through it).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// Who writes.
    pub fn by(&self) -> &str {
        &self.by
    }

    fn seal_bytes<T: Serialize + Clone>(
        &self,
        key: &str,
        rec: &T,
        set_tag: impl Fn(&mut T, String),
    ) -> Result<Vec<u8>, CampaignError> {
        let mut bare = rec.clone();
        set_tag(&mut bare, String::new());
        let unsigned = serde_json::to_vec(&bare).map_err(|e| request("encode a record", e))?;
        let tag = self.seal.tag_record(key, &unsigned).unwrap_or_default();
        set_tag(&mut bare, tag);
        serde_json::to_vec(&bare).map_err(|e| request("encode a record", e))
    }

    fn open_record<T: Serialize + serde::de::DeserializeOwned>(
        &self,
        key: &str,
        bytes: &[u8],
        tag: impl Fn(&mut T) -> &mut String,
    ) -> Option<T> {
        let opened = (bytes.len() <= MAX_RECORD)
            .then(|| serde_json::from_slice::<T>(bytes).ok())
            .flatten()
            .and_then(|mut rec| {
                let t = std::mem::take(tag(&mut rec));
                let unsigned = serde_json::to_vec(&rec).ok()?;
                self.seal.verify_record(key, &unsigned, &t).then(|| {
                    *tag(&mut rec) = t;
                    rec
                })
            });
        if opened.is_none() {
            warn!(
                "campaign: ignoring {}: malformed or not signed with the provisioners' secret",
                escaped(key)
            );
        }
        opened
    }

    /// The campaign and its revision, if there is one.
    pub async fn read(&self) -> Result<Option<(CampaignRecord, u64)>, CampaignError> {
        let entry = self
            .store
            .entry(CAMPAIGN_KEY)
            .await
            .map_err(|e| request("read the campaign", e))?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        Ok(self
            .open_record::<CampaignRecord>(CAMPAIGN_KEY, &entry.value, |r| &mut r.tag)
            .map(|r| (r, entry.revision)))
    }

    /// Writes the campaign: created when `revision` is `None`, else only over that revision.
    /// Returns the new revision, or `None` when someone wrote it since.
    async fn write(
        &self,
        rec: &CampaignRecord,
        revision: Option<u64>,
    ) -> Result<Option<u64>, CampaignError> {
        let bytes = self.seal_bytes(CAMPAIGN_KEY, rec, |r, t| r.tag = t)?;
        let done = match revision {
            None => self
                .store
                .create(CAMPAIGN_KEY, bytes.into())
                .await
                .map_err(|e| e.to_string()),
            Some(r) => self
                .store
                .update(CAMPAIGN_KEY, bytes.into(), r)
                .await
                .map_err(|e| e.to_string()),
        };
        match done {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.contains("wrong last sequence") || e.contains("key exists") => Ok(None),
            Err(e) => Err(request("write the campaign", e)),
        }
    }

    /// Writes a node's record; a put whose acknowledgement timed out is tried again (a put
    /// is idempotent, and a broker busy with a large campaign's fleet can be slow to answer).
    async fn put_node(&self, rec: &NodeRecord) -> Result<(), CampaignError> {
        let key = node_key(&rec.identity);
        let bytes = self.seal_bytes(&key, rec, |r, t| r.tag = t)?;
        let what = format!("record {}", escaped(&rec.identity));
        retry_timeouts(&what, || async {
            self.store
                .put(key.clone(), bytes.clone().into())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| request(what.clone(), e))
    }

    /// Every node of the campaign.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, CampaignError> {
        let keys = self
            .store
            .keys()
            .await
            .map_err(|e| request("list the nodes", e))?;
        let keys: Vec<String> = keys
            .filter_map(|k| async move { k.ok().filter(|k| k.starts_with(NODE_PREFIX)) })
            .collect()
            .await;
        let store = &self.store;
        let got: Vec<Result<Option<NodeRecord>, CampaignError>> = futures::stream::iter(keys)
            .map(|key| async move {
                let bytes = store
                    .get(&key)
                    .await
                    .map_err(|e| request("read a node", e))?;
                Ok(bytes.and_then(|b| {
                    self.open_record::<NodeRecord>(&key, &b, |r| &mut r.tag)
                        .filter(|r| node_key(&r.identity) == key)
                }))
            })
            .buffer_unordered(BULK)
            .collect()
            .await;
        let mut out = Vec::with_capacity(got.len());
        for g in got {
            if let Some(r) = g? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Starts a campaign over `targets` with `limits`; refused while another is not over.
    /// `on_stored` is told how many nodes are recorded so far.
    pub async fn start(
        &self,
        selector: &str,
        targets: Vec<String>,
        limits: Limits,
        audit_from: Option<u64>,
        mut on_stored: impl FnMut(usize),
    ) -> Result<CampaignRecord, CampaignError> {
        limits.validate()?;
        if targets.is_empty() {
            return Err(CampaignError::Select(format!(
                "{selector} selected no nodes"
            )));
        }
        if targets.len() > MAX_TARGETS {
            return Err(CampaignError::Invalid(format!(
                "{} nodes selected, more than the {MAX_TARGETS} one campaign holds",
                targets.len()
            )));
        }
        let previous = self.read().await?;
        if let Some((old, _)) = &previous {
            if !old.state.finished() {
                return Err(CampaignError::Exists {
                    id: old.id.clone(),
                    state: old.state,
                    progress: old.progress(),
                });
            }
        }
        self.purge_nodes().await?;
        let now = now_unix();
        let mut rec = CampaignRecord {
            id: format!(
                "{}-{}",
                chrono::Utc::now().format("%Y%m%dT%H%M%SZ"),
                &choria_rpc_client::protocol::new_request_id()[..8]
            ),
            by: self.by.clone(),
            selector: bounded(selector, MAX_ERROR),
            created: now,
            limits,
            // Written paused until every node is stored, so a driver never sees half of them.
            state: CampaignState::Paused,
            reason: "recording its nodes".into(),
            total: targets.len() as u64,
            pending: targets.len() as u64,
            in_flight: 0,
            done: 0,
            failed: 0,
            driver: String::new(),
            heartbeat: 0,
            eta: None,
            recent_failures: Vec::new(),
            audit_from,
            tag: String::new(),
        };
        let mut revision = match previous {
            Some((_, r)) => self.write(&rec, Some(r)).await?,
            None => self.write(&rec, None).await?,
        }
        .ok_or_else(|| {
            CampaignError::Invalid("another campaign was started at the same time".into())
        })?;
        let mut stored = 0usize;
        let mut puts = futures::stream::iter(targets)
            .map(|identity| async move {
                self.put_node(&NodeRecord {
                    identity,
                    state: NodeRotation::Pending,
                    sent_at: None,
                    finished_at: None,
                    tries: 0,
                    error: String::new(),
                    tag: String::new(),
                })
                .await
            })
            .buffer_unordered(BULK);
        while let Some(r) = puts.next().await {
            r?;
            stored += 1;
            if stored.is_multiple_of(1000) {
                on_stored(stored);
            }
        }
        on_stored(stored);
        rec.state = CampaignState::Running;
        rec.reason.clear();
        revision = self.write(&rec, Some(revision)).await?.ok_or_else(|| {
            CampaignError::Invalid("the campaign was changed while its nodes were recorded".into())
        })?;
        let _ = revision;
        info!(
            "rotation campaign {} started by {}: {} nodes ({})",
            rec.id,
            escaped(&rec.by),
            rec.total,
            escaped(&rec.selector)
        );
        Ok(rec)
    }

    async fn purge_nodes(&self) -> Result<(), CampaignError> {
        let stream = self
            .js
            .get_stream(format!("KV_{CAMPAIGN_BUCKET}"))
            .await
            .map_err(|e| request("open the bucket's stream", e))?;
        stream
            .purge()
            .filter(format!("$KV.{CAMPAIGN_BUCKET}.{NODE_PREFIX}>"))
            .await
            .map(|_| ())
            .map_err(|e| request("remove the previous campaign's nodes", e))
    }

    /// Sets the campaign's state as an operator: `paused`, `running` (resume) or `aborted`,
    /// with `reason`. Returns the record as written.
    pub async fn set_state(
        &self,
        want: CampaignState,
        reason: &str,
    ) -> Result<CampaignRecord, CampaignError> {
        for _ in 0..20 {
            let (mut rec, revision) = self.read().await?.ok_or(CampaignError::NoCampaign)?;
            let refuse = |what: &str| CampaignError::State {
                id: rec.id.clone(),
                state: rec.state,
                what: what.to_string(),
            };
            match (rec.state, want) {
                (s, _) if s.finished() => return Err(refuse("it is over")),
                (CampaignState::Running, CampaignState::Running) => return Ok(rec),
                (CampaignState::Paused, CampaignState::Paused) => return Ok(rec),
                _ => {}
            }
            rec.state = want;
            rec.reason = if reason.is_empty() {
                format!("{} by {}", want.label(), self.by)
            } else {
                bounded(
                    &format!("{} by {}: {reason}", want.label(), self.by),
                    MAX_ERROR,
                )
            };
            if want == CampaignState::Running {
                rec.reason.clear();
            }
            if self.write(&rec, Some(revision)).await?.is_some() {
                info!("rotation campaign {} {}", rec.id, want.label());
                return Ok(rec);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(request(
            "change the campaign's state",
            "the record kept changing under this write",
        ))
    }
}

/// Reads `path`: one identity a line, `#` comments and blank lines skipped, each checked against
/// `rule`, repeats dropped.
pub fn read_identities(path: &Path, rule: &IdentityRule) -> Result<Vec<String>, CampaignError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| CampaignError::Select(format!("{}: {e}", path.display())))?;
    if meta.len() > MAX_IDENTITIES_FILE {
        return Err(CampaignError::Select(format!(
            "{} is {} bytes, more than the {MAX_IDENTITIES_FILE} read",
            path.display(),
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| CampaignError::Select(format!("{}: {e}", path.display())))?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        rule.check(line).map_err(|e| {
            CampaignError::Select(format!(
                "{} line {}: {}: {e}",
                path.display(),
                n + 1,
                escaped(line)
            ))
        })?;
        if seen.insert(line.to_string()) {
            out.push(line.to_string());
        }
    }
    Ok(out)
}

/// Parses `--filter`: terms separated by spaces, each `identity=VALUE` (a name or `/REGEX/`),
/// `class=NAME`, `agent=NAME`, or a fact comparison `FACT OP VALUE` with OP one of `==`, `=`,
/// `!=`, `<=`, `>=`, `<`, `>`, `=~`. Only servers with the `choria_provision` agent can be
/// reprovisioned, so that agent is always required.
pub fn parse_filter(expr: &str) -> Result<Filter, CampaignError> {
    let mut f = Filter::with_agent("choria_provision");
    for term in expr.split_whitespace() {
        let invalid =
            |why: &str| CampaignError::Invalid(format!("--filter term {}: {why}", escaped(term)));
        let op = ["==", "!=", "<=", ">=", "=~", "=", "<", ">"]
            .into_iter()
            .filter_map(|op| term.find(op).map(|at| (at, op)))
            .min_by_key(|(at, op)| (*at, usize::MAX - op.len()))
            .ok_or_else(|| invalid("it is not NAME=VALUE or FACT OP VALUE"))?;
        let (name, value) = (&term[..op.0], &term[op.0 + op.1.len()..]);
        if name.is_empty() || value.is_empty() {
            return Err(invalid("both sides must be given"));
        }
        match (name, op.1) {
            ("identity", "=" | "==") => f.identity.push(value.to_string()),
            ("class", "=" | "==") => f.class.push(value.to_string()),
            ("agent", "=" | "==") => f.agent.push(value.to_string()),
            (fact, op) => f.fact.push(FactFilter {
                fact: fact.to_string(),
                operator: if op == "=" { "==".into() } else { op.into() },
                value: value.to_string(),
            }),
        }
    }
    Ok(f)
}

/// Broadcast discovery of the servers matching `filter` on the main collective.
pub async fn discover(rpc: &RpcClient, filter: &Filter) -> Result<Vec<String>, CampaignError> {
    rpc.discover(
        filter,
        Duration::from_secs(10),
        Some(Duration::from_secs(2)),
    )
    .await
    .map_err(|e| CampaignError::Select(e.to_string()))
}

/// One record of the audit trail that matters to campaigns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSeen {
    /// The node.
    pub identity: String,
    /// The decision (`provisioned`, `failed`, ...).
    pub decision: String,
    /// When (Unix seconds).
    pub at: i64,
    /// When what was issued expires (the certificate's `not_after` or the server JWT's `exp`).
    pub expires: Option<i64>,
}

fn parse_time(v: &serde_json::Value) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(v.as_str()?)
        .ok()
        .map(|t| t.timestamp())
}

/// Parses one audit record.
pub fn parse_audit(bytes: &[u8]) -> Option<AuditSeen> {
    if bytes.len() > MAX_RECORD {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let identity = v.get("identity")?.as_str()?.to_string();
    let decision = v.get("decision")?.as_str()?.to_string();
    let at = parse_time(v.get("time")?)?;
    let cert = v.pointer("/certificate/not_after").and_then(parse_time);
    let jwt = v.pointer("/server_jwt/expires").and_then(parse_time);
    let expires = match (cert, jwt) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Some(AuditSeen {
        identity,
        decision,
        at,
        expires,
    })
}

/// The sequence the next record of audit stream `stream` will have.
pub async fn audit_next_sequence(
    js: &jetstream::Context,
    stream: &str,
) -> Result<u64, CampaignError> {
    Ok(audit_bounds(js, stream).await?.1)
}

/// The sequence of the oldest record audit stream `stream` holds, and of the next it will have.
async fn audit_bounds(js: &jetstream::Context, stream: &str) -> Result<(u64, u64), CampaignError> {
    let fail = |detail: String| CampaignError::Audit {
        stream: stream.to_string(),
        detail,
    };
    let mut s = js
        .get_stream(stream)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let info = s.info().await.map_err(|e| fail(e.to_string()))?;
    let next = info.state.last_sequence.saturating_add(1);
    Ok((info.state.first_sequence.min(next), next))
}

/// Reads audit stream `stream` from sequence `from` to its end, calling `seen` for every record
/// that parses. Returns the sequence to read from next time.
pub async fn read_audit(
    js: &jetstream::Context,
    stream: &str,
    from: u64,
    mut seen: impl FnMut(AuditSeen),
) -> Result<u64, CampaignError> {
    let fail = |detail: String| CampaignError::Audit {
        stream: stream.to_string(),
        detail,
    };
    let (first, next) = audit_bounds(js, stream).await?;
    // Nothing new, or what was new was removed by the stream's limits since.
    if from >= next || first >= next || first == 0 {
        return Ok(next);
    }
    let s = js
        .get_stream(stream)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let consumer = s
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from.max(1),
            },
            ..Default::default()
        })
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut messages = consumer.messages().await.map_err(|e| fail(e.to_string()))?;
    let last = next - 1;
    let mut read_to = None;
    loop {
        let msg = match tokio::time::timeout(REQUEST_TIMEOUT, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(fail(e.to_string())),
            // A busy broker was slow to deliver: what was not read is read next time, from
            // where this read stopped (records the stream's limits remove meanwhile are
            // skipped then).
            Ok(None) | Err(_) => return Ok(read_to.map_or(from, |s: u64| s + 1)),
        };
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(last);
        read_to = Some(seq);
        if let Some(a) = parse_audit(&msg.payload) {
            seen(a);
        }
        if seq >= last {
            return Ok(seq + 1);
        }
    }
}

/// Tries of a campaign bucket write whose answer timed out.
const WRITE_TRIES: u32 = 5;
/// The pause before the first repeat of a write that timed out (then twice, three times...).
const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Whether an error text says a request timed out (async-nats: "timed out: didn't receive ack
/// in time", "request timed out").
fn timed_out(e: &str) -> bool {
    let e = e.to_ascii_lowercase();
    e.contains("timed out") || e.contains("timeout")
}

/// Runs `op` until it succeeds, fails otherwise than by a timeout, or has timed out
/// [`WRITE_TRIES`] times, pausing a little longer before each repeat.
async fn retry_timeouts<T, F, Fut>(what: &str, mut op: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if timed_out(&e) && tries < WRITE_TRIES => {
                warn!(
                    "campaign: {what} timed out (try {tries} of {WRITE_TRIES}): {e}; trying again"
                );
                tokio::time::sleep(RETRY_PAUSE * tries).await;
                tries += 1;
            }
            done => return done,
        }
    }
}

/// The nodes whose last `provisioned` record in the audit stream says what they were issued
/// expires before `now + within`.
pub async fn expiring(
    js: &jetstream::Context,
    stream: &str,
    within: Duration,
) -> Result<Vec<String>, CampaignError> {
    let mut last: HashMap<String, Option<i64>> = HashMap::new();
    read_audit(js, stream, 1, |a| {
        if a.decision == "provisioned" {
            last.insert(a.identity, a.expires);
        }
    })
    .await?;
    let limit = now_unix().saturating_add(i64::try_from(within.as_secs()).unwrap_or(i64::MAX));
    let mut out: Vec<String> = last
        .into_iter()
        .filter_map(|(id, exp)| exp.filter(|e| *e <= limit).map(|_| id))
        .collect();
    out.sort();
    Ok(out)
}

/// What the driver reports as it goes.
pub trait Progress: Send {
    /// The campaign as last written.
    fn update(&mut self, rec: &CampaignRecord);
}

impl<F: FnMut(&CampaignRecord) + Send> Progress for F {
    fn update(&mut self, rec: &CampaignRecord) {
        self(rec)
    }
}

/// What a driver needs.
pub struct Driver {
    /// The campaign bucket.
    pub campaigns: Campaigns,
    /// A client of the main collective.
    pub rpc: RpcClient,
    /// The provisioning token sent with each request.
    pub token: String,
    /// The audit stream (its context and name), when configured.
    pub audit: Option<(jetstream::Context, String)>,
}

struct Run {
    rec: CampaignRecord,
    revision: u64,
    nodes: HashMap<String, NodeRecord>,
    queue: VecDeque<String>,
    /// Requests on their way.
    sending: u64,
    /// Nodes acknowledged and not yet provisioned again.
    sent: u64,
    done: u64,
    failed: u64,
    done_times: VecDeque<Instant>,
    audit_next: Option<u64>,
    /// When nodes still `pending` here were seen provisioned (an audit record's time, or when
    /// their startup event arrived): a node is provisioned again within a moment of answering
    /// reprovision, and a busy driver may read that before it gets to the acknowledgement.
    early: HashMap<String, i64>,
    /// Nodes still `pending` here that the audit trail shows provisioned since the campaign
    /// began: credentials issued during the campaign. One that then does not answer was sent
    /// reprovision by an earlier driver whose record of the acknowledgement was lost.
    reissued: HashSet<String>,
    /// Nodes that did not answer, with when to try them again: the wait grows with each try,
    /// so a node restarting through provisioning mode has time to come back.
    retry: BinaryHeap<Reverse<(Instant, String)>>,
    /// Node records changed since the last flush, written together (every tick) so that a
    /// driver reading thousands of acknowledgements a minute does not wait on each write.
    unwritten: HashMap<String, NodeRecord>,
    /// Nodes `sent`, with when (Unix seconds) to ask them on their main collective when they
    /// last started. A provisioner killed between restarting a node and writing its audit
    /// record, while no driver listened for the node's startup event, leaves no other sign
    /// that the node is back: one that answers, restarted since it acknowledged, is done.
    /// Nodes that acknowledged before this driver took over are asked at once.
    next_check: HashMap<String, i64>,
    /// Nodes being asked.
    checking: HashSet<String>,
    /// Nodes found done by asking them, since the last heartbeat.
    checked_done: u64,
}

impl Run {
    fn new(rec: CampaignRecord, revision: u64, nodes: Vec<NodeRecord>) -> Run {
        let mut run = Run {
            queue: VecDeque::new(),
            nodes: HashMap::with_capacity(nodes.len()),
            audit_next: rec.audit_from,
            rec,
            revision,
            sending: 0,
            sent: 0,
            done: 0,
            failed: 0,
            done_times: VecDeque::new(),
            early: HashMap::new(),
            reissued: HashSet::new(),
            retry: BinaryHeap::new(),
            unwritten: HashMap::new(),
            next_check: HashMap::new(),
            checking: HashSet::new(),
            checked_done: 0,
        };
        for n in nodes {
            match n.state {
                NodeRotation::Pending => run.queue.push_back(n.identity.clone()),
                NodeRotation::Sent => {
                    run.sent += 1;
                    run.next_check.insert(n.identity.clone(), 0);
                }
                NodeRotation::Done => run.done += 1,
                NodeRotation::Failed => run.failed += 1,
            }
            run.nodes.insert(n.identity.clone(), n);
        }
        run.count();
        run
    }

    fn in_flight(&self) -> u64 {
        self.sent + self.sending
    }

    /// Keeps `n` for the next flush (its latest state only).
    fn write_later(&mut self, n: NodeRecord) {
        self.unwritten.insert(n.identity.clone(), n);
    }

    /// `identity` acknowledged the request sent at `sent_at`: the record to store, `sent`, or
    /// `done` when it was seen provisioned again since (before the acknowledgement was read).
    fn acked(&mut self, identity: &str, sent_at: i64) -> Option<NodeRecord> {
        let n = self.nodes.get_mut(identity)?;
        if n.state != NodeRotation::Pending {
            return None;
        }
        n.state = NodeRotation::Sent;
        n.sent_at = Some(sent_at);
        self.sent += 1;
        let sent = n.clone();
        self.next_check.insert(
            identity.to_string(),
            sent_at.saturating_add(CHECK_AFTER.as_secs() as i64),
        );
        match self.early.remove(identity) {
            Some(seen) => self.provisioned(identity, Some(seen)).or(Some(sent)),
            None => Some(sent),
        }
    }

    /// `identity` was seen provisioned at `at` (an audit record's time; `None`: now, by its
    /// startup event). Returns its record to store when that makes it done: it acknowledged a
    /// request sent no later than `at`. A node whose acknowledgement was not read yet keeps
    /// the sighting for when it is.
    fn provisioned(&mut self, identity: &str, at: Option<i64>) -> Option<NodeRecord> {
        let n = self.nodes.get_mut(identity)?;
        if n.state == NodeRotation::Pending {
            if at.is_some() {
                self.reissued.insert(identity.to_string());
            }
            let seen = at.unwrap_or_else(now_unix);
            let e = self.early.entry(identity.to_string()).or_insert(seen);
            *e = (*e).max(seen);
            return None;
        }
        if n.state != NodeRotation::Sent || at.is_some_and(|t| n.sent_at.is_some_and(|s| t < s)) {
            return None;
        }
        n.state = NodeRotation::Done;
        n.finished_at = Some(now_unix());
        self.sent -= 1;
        self.done += 1;
        self.done_times.push_back(Instant::now());
        Some(n.clone())
    }

    /// `identity`, still `pending`, did not answer a request: done when the audit trail showed
    /// it provisioned since the campaign began (an earlier driver's request reached it and
    /// it is on its way back), else `None` and it is tried again.
    fn unanswered_but_reissued(&mut self, identity: &str) -> Option<NodeRecord> {
        if !self.reissued.contains(identity) {
            return None;
        }
        let n = self.nodes.get_mut(identity)?;
        if n.state != NodeRotation::Pending {
            return None;
        }
        self.reissued.remove(identity);
        self.early.remove(identity);
        n.state = NodeRotation::Done;
        n.finished_at = Some(now_unix());
        self.done += 1;
        self.done_times.push_back(Instant::now());
        Some(n.clone())
    }

    /// The `sent` nodes to ask now whether they restarted since they acknowledged, at most
    /// `room`; each is asked again [`CHECK_AFTER`] later if still `sent` then.
    fn due_checks(&mut self, now: i64, room: usize) -> Vec<String> {
        let nodes = &self.nodes;
        self.next_check
            .retain(|id, _| nodes.get(id).is_some_and(|n| n.state == NodeRotation::Sent));
        let mut due = Vec::new();
        for (id, when) in self.next_check.iter_mut() {
            if due.len() >= room {
                break;
            }
            if *when > now || self.checking.contains(id) {
                continue;
            }
            *when = now.saturating_add(CHECK_AFTER.as_secs() as i64);
            self.checking.insert(id.clone());
            due.push(id.clone());
        }
        due
    }

    /// `identity` answered on its main collective that it started at `started` (`None`: no
    /// answer). Returns its record to store when that makes it done: it started no earlier
    /// than its acknowledged request was sent.
    fn checked(&mut self, identity: &str, started: Option<i64>) -> Option<NodeRecord> {
        self.checking.remove(identity);
        let n = self.provisioned(identity, Some(started?))?;
        self.checked_done += 1;
        Some(n)
    }

    /// Queues the nodes whose wait before another try is over.
    fn due_retries(&mut self, now: Instant) {
        while let Some(Reverse((due, _))) = self.retry.peek() {
            if *due > now {
                break;
            }
            if let Some(Reverse((_, identity))) = self.retry.pop() {
                self.queue.push_front(identity);
            }
        }
    }

    fn count(&mut self) {
        self.rec.total = self.nodes.len() as u64;
        self.rec.in_flight = self.in_flight();
        self.rec.done = self.done;
        self.rec.failed = self.failed;
        self.rec.pending = self
            .rec
            .total
            .saturating_sub(self.in_flight() + self.done + self.failed);
    }

    fn eta(&mut self, now: i64) {
        let cutoff = Instant::now().checked_sub(Duration::from_secs(60));
        while self
            .done_times
            .front()
            .is_some_and(|t| cutoff.is_some_and(|c| *t < c))
        {
            self.done_times.pop_front();
        }
        let left = self.rec.pending + self.rec.in_flight;
        let per_minute = (self.done_times.len() as u64)
            .max(1)
            .min(u64::from(self.rec.limits.rate_per_minute));
        self.rec.eta = (left > 0)
            .then(|| now.saturating_add(i64::try_from(left * 60 / per_minute).unwrap_or(0)));
    }

    fn failing(&self) -> bool {
        let finished = self.done + self.failed;
        finished >= FAILING_MIN_FINISHED
            && (self.failed as f64) * 100.0 > self.rec.limits.stop_if_failing * finished as f64
    }
}

enum Sent {
    /// Acknowledged; the Unix time the request was sent (a node may be provisioned again
    /// before a busy driver gets to the acknowledgement).
    Acked(String, i64),
    Refused(String, String),
    NoReply(String, String),
}

fn send_outcome(
    identity: String,
    sent_at: i64,
    r: Result<impl Sized, choria_rpc_client::rpc::RequestError>,
) -> Sent {
    use choria_rpc_client::rpc::RequestErrorKind as K;
    match r {
        Ok(_) => Sent::Acked(identity, sent_at),
        // Its first request was acknowledged but not recorded (the driver was killed): it is
        // on its way back already.
        Err(e) if e.to_string().contains("already in provisioning mode") => {
            Sent::Acked(identity, sent_at)
        }
        Err(e) => match e.kind() {
            K::Timeout | K::NoResponders | K::Transport | K::Closed => {
                Sent::NoReply(identity, e.to_string())
            }
            _ => Sent::Refused(identity, e.to_string()),
        },
    }
}

impl Driver {
    /// Drives the campaign until it completes, is paused, stopped or aborted, or `stop` is
    /// cancelled (the campaign stays `running` and another driver may resume it at once).
    /// Returns the campaign as last written.
    pub async fn drive(
        &self,
        stop: CancellationToken,
        progress: &mut dyn Progress,
    ) -> Result<CampaignRecord, CampaignError> {
        let c = &self.campaigns;
        let me = format!("{} pid {}", c.by, std::process::id());
        let now = now_unix();
        let (mut rec, revision) = c.read().await?.ok_or(CampaignError::NoCampaign)?;
        if rec.state != CampaignState::Running {
            return Err(CampaignError::State {
                id: rec.id,
                state: rec.state,
                what: "only a running campaign is driven; resume it first".into(),
            });
        }
        if rec.driven(now) && rec.driver != me {
            return Err(CampaignError::Busy {
                age: rec.heartbeat_age(now),
                id: rec.id,
                driver: rec.driver,
            });
        }
        rec.driver = me.clone();
        rec.heartbeat = now;
        let revision = c
            .write(&rec, Some(revision))
            .await?
            .ok_or_else(|| CampaignError::Busy {
                id: rec.id.clone(),
                driver: "another process".into(),
                age: 0,
            })?;
        let nodes = c.nodes().await?;
        let mut run = Run::new(rec, revision, nodes);
        info!(
            "rotation campaign {}: driving {} nodes ({} waiting, {} in flight)",
            run.rec.id,
            run.nodes.len(),
            run.queue.len(),
            run.sent
        );
        let mut events = self
            .rpc
            .subscribe_lifecycle("startup", "server", None)
            .await
            .map_err(|e| CampaignError::Select(e.to_string()))?;
        // What the audit trail says since the campaign began (a crash may have hidden it).
        self.poll_audit(&mut run).await?;
        let mut sends: JoinSet<Sent> = JoinSet::new();
        let mut checks: JoinSet<(String, Option<i64>)> = JoinSet::new();
        let per_second = f64::from(run.rec.limits.rate_per_minute) / 60.0;
        let burst = per_second.max(1.0);
        let mut tokens = 1.0_f64.min(burst);
        let mut last_refill = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut last_beat = Instant::now();
        let ended = loop {
            tokio::select! {
                _ = stop.cancelled() => break false,
                ev = events.next() => {
                    if let Some(ev) = ev {
                        self.finish_node(&mut run, &ev.event.identity, None).await?;
                    }
                }
                Some(done) = sends.join_next(), if !sends.is_empty() => {
                    run.sending = run.sending.saturating_sub(1);
                    if let Ok(done) = done {
                        self.sent(&mut run, done).await?;
                    }
                }
                Some(Ok((identity, started))) = checks.join_next(), if !checks.is_empty() => {
                    if let Some(n) = run.checked(&identity, started) {
                        run.write_later(n);
                    }
                }
                _ = tick.tick() => {
                    self.flush(&mut run).await?;
                    let elapsed = last_refill.elapsed().as_secs_f64();
                    last_refill = Instant::now();
                    tokens = (tokens + elapsed * per_second).min(burst);
                    run.due_retries(last_refill);
                    while run.rec.state == CampaignState::Running
                        && tokens >= 1.0
                        && run.in_flight() < u64::from(run.rec.limits.max_in_flight)
                    {
                        let Some(identity) = run.queue.pop_front() else { break };
                        match run.nodes.get(&identity) {
                            Some(n) if n.state == NodeRotation::Pending => {
                                // It did not answer before, and has been provisioned since.
                                if n.tries > 0 {
                                    if let Some(n) = run.unanswered_but_reissued(&identity) {
                                        run.write_later(n);
                                        continue;
                                    }
                                }
                            }
                            _ => continue,
                        }
                        tokens -= 1.0;
                        run.sending += 1;
                        let rpc = self.rpc.clone();
                        let token = self.token.clone();
                        sends.spawn(async move {
                            let sent_at = now_unix();
                            let r = rpc.provision_reprovision(&identity, &token, REPROVISION_TIMEOUT).await;
                            send_outcome(identity, sent_at, r)
                        });
                    }
                    if last_beat.elapsed() >= HEARTBEAT {
                        last_beat = Instant::now();
                        self.poll_audit(&mut run).await?;
                        self.time_out(&mut run).await?;
                        for identity in run.due_checks(now_unix(), MAX_CHECKS.saturating_sub(checks.len())) {
                            let rpc = self.rpc.clone();
                            checks.spawn(async move {
                                let started = rpc
                                    .daemon_stats(&identity, CHECK_TIMEOUT)
                                    .await
                                    .ok()
                                    .map(|s| s.starttime);
                                (identity, started)
                            });
                        }
                        if run.checked_done > 0 {
                            info!(
                                "rotation campaign {}: {} nodes done that were back on their main collective, restarted since they acknowledged, with no provisioning record or startup event seen",
                                run.rec.id,
                                std::mem::take(&mut run.checked_done)
                            );
                        }
                        let keep = self.beat(&mut run, &me).await?;
                        progress.update(&run.rec);
                        if !keep {
                            break true;
                        }
                        if run.rec.state != CampaignState::Running && run.sending == 0 {
                            break true;
                        }
                    }
                }
            }
        };
        if !ended {
            info!(
                "rotation campaign {}: this driver stops; the campaign stays {} for `rotate resume`",
                run.rec.id, run.rec.state
            );
        }
        // Release the lease and write where the campaign is.
        self.flush(&mut run).await?;
        run.count();
        run.rec.driver.clear();
        run.rec.heartbeat = 0;
        let last = self.save(&mut run).await?;
        progress.update(&last);
        Ok(last)
    }

    /// Writes progress and the heartbeat; adopts a pause or abort written by someone else.
    /// Returns false when the lease was lost or the campaign is over.
    async fn beat(&self, run: &mut Run, me: &str) -> Result<bool, CampaignError> {
        run.count();
        let now = now_unix();
        run.eta(now);
        if run.rec.state == CampaignState::Running {
            if run.failing() {
                run.rec.state = CampaignState::Stopped;
                run.rec.reason = format!(
                    "stopped itself: {} of {} finished nodes failed, more than {}%",
                    run.failed,
                    run.done + run.failed,
                    run.rec.limits.stop_if_failing
                );
                warn!("rotation campaign {}: {}", run.rec.id, run.rec.reason);
            } else if run.rec.pending == 0 && run.rec.in_flight == 0 {
                run.rec.state = CampaignState::Completed;
                run.rec.eta = None;
                info!(
                    "rotation campaign {} completed: {}",
                    run.rec.id,
                    run.rec.progress()
                );
            }
        }
        run.rec.heartbeat = now;
        let stored = self.save(run).await?;
        if stored.driver != me {
            warn!(
                "rotation campaign {}: taken over by {}",
                run.rec.id,
                escaped(&stored.driver)
            );
            return Ok(false);
        }
        Ok(!run.rec.state.finished())
    }

    /// Writes the campaign over its revision, adopting an operator's state change made since.
    /// Returns what is stored: another driver's record when the lease was taken.
    async fn save(&self, run: &mut Run) -> Result<CampaignRecord, CampaignError> {
        let c = &self.campaigns;
        for tries in 1..=20u64 {
            // A write or read that timed out is tried again: the write over the revision may
            // have been stored, which reading the record shows.
            match c.write(&run.rec, Some(run.revision)).await {
                Ok(Some(r)) => {
                    run.revision = r;
                    return Ok(run.rec.clone());
                }
                Ok(None) => {}
                Err(e) if timed_out(&e.to_string()) => {
                    warn!("rotation campaign {}: {e}; trying again", run.rec.id);
                    tokio::time::sleep(RETRY_PAUSE * tries.min(4) as u32).await;
                }
                Err(e) => return Err(e),
            }
            let (stored, r) = match c.read().await {
                Ok(Some(got)) => got,
                Ok(None) => return Err(CampaignError::NoCampaign),
                Err(e) if timed_out(&e.to_string()) => {
                    warn!("rotation campaign {}: {e}; trying again", run.rec.id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if stored.id != run.rec.id
                || (!stored.driver.is_empty() && stored.driver != run.rec.driver)
            {
                return Ok(stored);
            }
            run.revision = r;
            if stored.state != run.rec.state {
                info!(
                    "rotation campaign {}: {} ({})",
                    run.rec.id,
                    stored.state,
                    escaped(&stored.reason)
                );
                run.rec.state = stored.state;
                run.rec.reason = stored.reason;
            }
        }
        Err(request(
            "write the campaign",
            "the record kept changing under this write",
        ))
    }

    async fn sent(&self, run: &mut Run, done: Sent) -> Result<(), CampaignError> {
        match done {
            Sent::Acked(identity, sent_at) => {
                if let Some(n) = run.acked(&identity, sent_at) {
                    run.write_later(n);
                }
            }
            Sent::Refused(identity, why) => self.fail(run, &identity, &why).await?,
            Sent::NoReply(identity, why) => {
                if let Some(n) = run.unanswered_but_reissued(&identity) {
                    run.write_later(n);
                    return Ok(());
                }
                let tries = run.nodes.get_mut(&identity).map(|n| {
                    n.tries += 1;
                    n.tries
                });
                match tries {
                    Some(t) if t >= SEND_TRIES => self.fail(run, &identity, &why).await?,
                    Some(t) => {
                        let due = Instant::now() + RETRY_WAIT * t;
                        run.retry.push(Reverse((due, identity)));
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }

    async fn fail(&self, run: &mut Run, identity: &str, why: &str) -> Result<(), CampaignError> {
        let Some(n) = run.nodes.get_mut(identity) else {
            return Ok(());
        };
        match n.state {
            NodeRotation::Done | NodeRotation::Failed => return Ok(()),
            NodeRotation::Sent => run.sent -= 1,
            NodeRotation::Pending => {}
        }
        run.failed += 1;
        let now = now_unix();
        n.state = NodeRotation::Failed;
        n.finished_at = Some(now);
        n.error = bounded(why, MAX_ERROR);
        let n = n.clone();
        warn!(
            "rotation campaign {}: {} failed: {}",
            run.rec.id,
            escaped(identity),
            escaped(&n.error)
        );
        if run.rec.recent_failures.len() >= RECENT_FAILURES {
            run.rec.recent_failures.remove(0);
        }
        run.rec.recent_failures.push(NodeFailure {
            identity: n.identity.clone(),
            error: n.error.clone(),
            at: now,
        });
        run.write_later(n);
        Ok(())
    }

    /// Marks `identity` done when it acknowledged a request (and, with `at`, was provisioned
    /// no earlier than it acknowledged).
    async fn finish_node(
        &self,
        run: &mut Run,
        identity: &str,
        at: Option<i64>,
    ) -> Result<(), CampaignError> {
        if let Some(n) = run.provisioned(identity, at) {
            run.write_later(n);
        }
        Ok(())
    }

    /// Writes the node records changed since the last flush, [`BULK`] at a time.
    async fn flush(&self, run: &mut Run) -> Result<(), CampaignError> {
        if run.unwritten.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut run.unwritten);
        let c = &self.campaigns;
        let mut puts = futures::stream::iter(batch.into_values())
            .map(|n| async move { c.put_node(&n).await })
            .buffer_unordered(BULK);
        while let Some(r) = puts.next().await {
            r?;
        }
        Ok(())
    }

    async fn poll_audit(&self, run: &mut Run) -> Result<(), CampaignError> {
        let (Some((js, stream)), Some(from)) = (&self.audit, run.audit_next) else {
            return Ok(());
        };
        let mut provisioned = Vec::new();
        let read = read_audit(js, stream, from, |a| {
            if a.decision == "provisioned" {
                provisioned.push((a.identity, a.at));
            }
        })
        .await;
        // A read that timed out (a busy broker) is made again from the same place at the next
        // heartbeat; the stream is durable.
        let next = match read {
            Ok(next) => next,
            Err(e) if timed_out(&e.to_string()) => {
                warn!(
                    "rotation campaign {}: {e}; reading it again later",
                    run.rec.id
                );
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        run.audit_next = Some(next);
        for (identity, at) in provisioned {
            self.finish_node(run, &identity, Some(at)).await?;
        }
        Ok(())
    }

    async fn time_out(&self, run: &mut Run) -> Result<(), CampaignError> {
        if run.sent == 0 {
            return Ok(());
        }
        let limit = i64::try_from(run.rec.limits.node_timeout_secs).unwrap_or(i64::MAX);
        let now = now_unix();
        let late: Vec<String> = run
            .nodes
            .values()
            .filter(|n| {
                n.state == NodeRotation::Sent
                    && n.sent_at.is_some_and(|s| now.saturating_sub(s) > limit)
            })
            .map(|n| n.identity.clone())
            .collect();
        for identity in late {
            let why = format!("not provisioned again within {limit}s of acknowledging reprovision");
            self.fail(run, &identity, &why).await?;
        }
        Ok(())
    }
}

/// An operator's handle on campaigns: the bucket, and what of the provisioner's settings a
/// campaign reads (the provisioner crate's `operator::campaigns` makes one from its files).
#[derive(Debug)]
pub struct Operator {
    /// The campaign bucket.
    pub campaigns: Campaigns,
    /// The provisioners' identity rule: a selected name it refuses is left out.
    pub rule: IdentityRule,
    /// The audit stream (`audit_stream`), empty for none.
    pub audit_stream: String,
    /// The provisioning token the reprovision requests carry.
    pub token: String,
}

/// How a campaign's nodes are chosen.
#[derive(Debug, Clone, PartialEq)]
pub enum Selection {
    /// A file of identities.
    Identities(std::path::PathBuf),
    /// Broadcast discovery on the main collective with this filter.
    Filter(String),
    /// The nodes whose certificate or server JWT, as the audit stream recorded it, expires
    /// within this long.
    ExpiringWithin(Duration),
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selection::Identities(p) => write!(f, "--identities {}", p.display()),
            Selection::Filter(e) => write!(f, "--filter {e}"),
            Selection::ExpiringWithin(d) => write!(f, "--expiring-within {}s", d.as_secs()),
        }
    }
}

impl Operator {
    /// The nodes `selection` names. Discovery uses `rpc`, the main collective's client.
    pub async fn select(
        &self,
        selection: &Selection,
        rpc: &RpcClient,
    ) -> Result<Vec<String>, CampaignError> {
        let rule = &self.rule;
        let mut nodes = match selection {
            Selection::Identities(path) => read_identities(path, rule)?,
            Selection::Filter(expr) => discover(rpc, &parse_filter(expr)?).await?,
            Selection::ExpiringWithin(within) => {
                let stream = self.audit_stream().ok_or_else(|| {
                    CampaignError::Invalid(
                        "--expiring-within reads what was issued from the audit stream; set audit_stream in the provisioner configuration".into(),
                    )
                })?;
                expiring(&self.audit_context(stream).await?, stream, *within).await?
            }
        };
        nodes.retain(|n| rule.check(n).is_ok());
        Ok(nodes)
    }

    /// The audit stream's name, when one is configured.
    pub fn audit_stream(&self) -> Option<&str> {
        let s = self.audit_stream.as_str();
        (!s.is_empty()).then_some(s)
    }

    /// Starts a campaign over `nodes`.
    pub async fn start(
        &self,
        selection: &Selection,
        nodes: Vec<String>,
        limits: Limits,
        on_stored: impl FnMut(usize),
    ) -> Result<CampaignRecord, CampaignError> {
        let audit_from = match self.audit_stream() {
            Some(s) => Some(audit_next_sequence(&self.audit_context(s).await?, s).await?),
            None => None,
        };
        self.campaigns
            .start(&selection.to_string(), nodes, limits, audit_from, on_stored)
            .await
    }

    /// The JetStream API audit stream `stream` answers on, over the provisioners' connection.
    pub async fn audit_context(&self, stream: &str) -> Result<jetstream::Context, CampaignError> {
        let client = self
            .campaigns
            .provisioning
            .clone()
            .ok_or_else(|| CampaignError::Audit {
                stream: stream.to_string(),
                detail: "no connection with the provisioner's settings".into(),
            })?;
        let mut errors = Vec::new();
        for api in StreamsApi::ALL {
            let js = api.context(client.clone(), REQUEST_TIMEOUT);
            match js.get_stream(stream).await {
                Ok(_) => return Ok(js),
                Err(e) => errors.push(format!("{api}: {e}")),
            }
        }
        Err(CampaignError::Audit {
            stream: stream.to_string(),
            detail: errors.join("; "),
        })
    }

    /// A driver of the campaign over `rpc`, the main collective's client.
    pub async fn driver(&self, rpc: RpcClient) -> Result<Driver, CampaignError> {
        let audit = match self.audit_stream() {
            Some(s) => Some((self.audit_context(s).await?, s.to_string())),
            None => None,
        };
        Ok(Driver {
            campaigns: self.campaigns.clone(),
            rpc,
            token: self.token.clone(),
            audit,
        })
    }
}

/// Parses `--rate`: `500/min`, `10/s`, `30000/h` or a bare number a minute.
pub fn parse_rate(text: &str) -> Result<u32, CampaignError> {
    let invalid = || {
        CampaignError::Invalid(format!(
            "--rate {}: give nodes a minute as 500/min (or N/s, N/h)",
            escaped(text)
        ))
    };
    let (n, per) = text.split_once('/').unwrap_or((text, "min"));
    let n: u64 = n.trim().parse().map_err(|_| invalid())?;
    let per_minute = match per.trim() {
        "s" | "sec" | "second" => n.checked_mul(60),
        "m" | "min" | "minute" => Some(n),
        "h" | "hour" => Some(n / 60),
        _ => None,
    }
    .ok_or_else(invalid)?;
    u32::try_from(per_minute)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(invalid)
}

/// Parses `--stop-if-failing`: `5%` or `5`.
pub fn parse_share(text: &str) -> Result<f64, CampaignError> {
    text.trim()
        .trim_end_matches('%')
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| {
            CampaignError::Invalid(format!(
                "--stop-if-failing {}: give a share as 5%",
                escaped(text)
            ))
        })
}

/// One line of progress: a bar, the counts and the ETA.
pub fn progress_line(rec: &CampaignRecord, now: i64) -> String {
    const WIDTH: u64 = 30;
    let finished = rec.done + rec.failed;
    let filled = (finished * WIDTH).checked_div(rec.total).unwrap_or(0);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let eta = match rec.eta {
        Some(t) if t > now => format!(", ETA {}", human_duration(t - now)),
        _ => String::new(),
    };
    format!(
        "[{bar}] {}/{} done, {} failed, {} in flight, {} waiting{eta} ({})",
        rec.done, rec.total, rec.failed, rec.in_flight, rec.pending, rec.state
    )
}

fn human_duration(secs: i64) -> String {
    match secs {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// `rotate status`: the campaign in lines for people.
pub fn status_text(rec: &CampaignRecord, now: i64) -> String {
    let mut out = String::new();
    let driver = if rec.driven(now) {
        format!("{} (heartbeat {}s ago)", rec.driver, rec.heartbeat_age(now))
    } else {
        "nobody".to_string()
    };
    let lines = [
        ("Campaign", rec.id.clone()),
        ("State", rec.state.to_string()),
        ("Reason", rec.reason.clone()),
        (
            "Started",
            format!("{} by {}", crate::rfc3339(rec.created), rec.by),
        ),
        ("Selected by", rec.selector.clone()),
        (
            "Limits",
            format!(
                "{}/min, {} in flight, stop above {}% failing, {}s a node",
                rec.limits.rate_per_minute,
                rec.limits.max_in_flight,
                rec.limits.stop_if_failing,
                rec.limits.node_timeout_secs
            ),
        ),
        ("Driven by", driver),
        ("Progress", progress_line(rec, now)),
    ];
    for (k, v) in lines {
        if !v.is_empty() {
            out.push_str(&format!("{k:>12}: {v}\n"));
        }
    }
    if !rec.recent_failures.is_empty() {
        out.push_str("\nLatest failures:\n");
        for f in &rec.recent_failures {
            out.push_str(&format!(
                "  {} {}: {}\n",
                crate::rfc3339(f.at),
                f.identity,
                f.error
            ));
        }
    }
    out
}

/// The campaign as a provisioner follows it, for its status API, page and metrics.
#[derive(Debug, Default)]
pub struct CampaignSlot(std::sync::RwLock<Option<CampaignRecord>>);

impl CampaignSlot {
    /// An empty slot.
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::default()
    }

    /// The campaign last seen, if any.
    pub fn get(&self) -> Option<CampaignRecord> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, rec: Option<CampaignRecord>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = rec;
    }
}

impl CampaignRecord {
    /// What the status API and page show of it.
    pub fn info(&self) -> provisioner_status::CampaignInfo {
        provisioner_status::CampaignInfo {
            id: self.id.clone(),
            state: self.state.label().to_string(),
            reason: self.reason.clone(),
            by: self.by.clone(),
            total: self.total,
            done: self.done,
            failed: self.failed,
            in_flight: self.in_flight,
            pending: self.pending,
            eta: self.eta,
            driver: self.driver.clone(),
            recent_failures: self
                .recent_failures
                .iter()
                .map(|f| (f.identity.clone(), f.error.clone()))
                .collect(),
        }
    }
}

/// Follows the campaign record in the provisioning account's campaign bucket (when there is
/// one) into a [`CampaignSlot`] and the `choria_provisioner_campaign_nodes` gauges. The bucket
/// is looked for again every `retry` while it is missing or unreachable.
pub struct CampaignFollower {
    /// The daemon's connection.
    pub client: async_nats::Client,
    /// The replica's identity.
    pub by: String,
    /// The seal records are checked with.
    pub seal: Seal,
    /// Where the campaign is kept.
    pub slot: std::sync::Arc<CampaignSlot>,
    /// The gauges.
    pub metrics: std::sync::Arc<provisioner_metrics::Metrics>,
    /// How long to wait before looking for the bucket again.
    pub retry: Duration,
}

impl CampaignFollower {
    fn show(&self, rec: Option<CampaignRecord>) {
        let counts = rec
            .as_ref()
            .map(|r| [r.pending, r.in_flight, r.done, r.failed])
            .unwrap_or_default();
        for (g, n) in self.metrics.campaign_nodes.iter().zip(counts) {
            g.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.slot.set(rec);
    }

    /// Follows until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            if let Ok(c) =
                Campaigns::open(self.client.clone(), &self.by, self.seal.clone(), false).await
            {
                if let Ok(mut watch) = c.store.watch(CAMPAIGN_KEY).await {
                    if let Ok(now) = c.read().await {
                        self.show(now.map(|(r, _)| r));
                    }
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            e = watch.next() => match e {
                                Some(Ok(entry)) => {
                                    let rec = (entry.operation == kv::Operation::Put)
                                        .then(|| c.open_record::<CampaignRecord>(CAMPAIGN_KEY, &entry.value, |r| &mut r.tag))
                                        .flatten();
                                    self.show(rec);
                                }
                                _ => break,
                            }
                        }
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.retry) => {}
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(total: u64) -> CampaignRecord {
        CampaignRecord {
            id: "c1".into(),
            by: "ops@admin".into(),
            selector: "--identities x".into(),
            created: 1_000,
            limits: Limits::default(),
            state: CampaignState::Running,
            reason: String::new(),
            total,
            pending: total,
            in_flight: 0,
            done: 0,
            failed: 0,
            driver: String::new(),
            heartbeat: 0,
            eta: None,
            recent_failures: Vec::new(),
            audit_from: None,
            tag: String::new(),
        }
    }

    fn node(id: &str, state: NodeRotation) -> NodeRecord {
        NodeRecord {
            identity: id.into(),
            state,
            sent_at: None,
            finished_at: None,
            tries: 0,
            error: String::new(),
            tag: String::new(),
        }
    }

    #[test]
    fn filters_parse_into_fact_identity_class_and_agent_terms() {
        let f = parse_filter("os.family=RedHat identity=/^web/ class=apache mem>=4 agent=puppet")
            .unwrap();
        assert_eq!(f.agent, vec!["choria_provision", "puppet"]);
        assert_eq!(f.identity, vec!["/^web/"]);
        assert_eq!(f.class, vec!["apache"]);
        assert_eq!(f.fact.len(), 2);
        assert_eq!(
            (
                f.fact[0].fact.as_str(),
                f.fact[0].operator.as_str(),
                f.fact[0].value.as_str()
            ),
            ("os.family", "==", "RedHat")
        );
        assert_eq!(f.fact[1].operator, ">=");
        let re = parse_filter("country=~/^m/").unwrap();
        assert_eq!(re.fact[0].operator, "=~");
        assert!(parse_filter("justaword").is_err());
        assert!(parse_filter("=x").is_err());
        assert_eq!(parse_filter("").unwrap().agent, vec!["choria_provision"]);
    }

    #[test]
    fn rates_and_shares_parse_with_their_units() {
        assert_eq!(parse_rate("500/min").unwrap(), 500);
        assert_eq!(parse_rate("10/s").unwrap(), 600);
        assert_eq!(parse_rate("6000/h").unwrap(), 100);
        assert_eq!(parse_rate("42").unwrap(), 42);
        for bad in ["0/min", "x/min", "5/week", "10/h", "-1"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_share("5%").unwrap(), 5.0);
        assert_eq!(parse_share("0.5").unwrap(), 0.5);
        assert!(parse_share("101%").is_err());
        assert!(parse_share("lots").is_err());
    }

    #[test]
    fn limits_refuse_zero_rates_and_shares_out_of_range() {
        assert!(Limits::default().validate().is_ok());
        for bad in [
            Limits {
                rate_per_minute: 0,
                ..Limits::default()
            },
            Limits {
                max_in_flight: 0,
                ..Limits::default()
            },
            Limits {
                stop_if_failing: 150.0,
                ..Limits::default()
            },
            Limits {
                node_timeout_secs: 0,
                ..Limits::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn audit_records_give_the_earliest_expiry_of_what_was_issued() {
        let line = br#"{"time":"2026-12-03T10:00:00.000Z","identity":"n1.example.net","decision":"provisioned","certificate":{"serial":"01","sha256":"aa","not_after":"2027-01-01T00:00:00.000Z"},"server_jwt":{"id":"j","expires":"2026-12-10T00:00:00.000Z"}}"#;
        let a = parse_audit(line).unwrap();
        assert_eq!(a.identity, "n1.example.net");
        assert_eq!(a.decision, "provisioned");
        assert_eq!(a.at, 1_796_292_000);
        assert_eq!(a.expires, Some(1_796_860_800));
        let bare = br#"{"time":"2026-12-03T10:00:00Z","identity":"n2","decision":"failed"}"#;
        assert_eq!(parse_audit(bare).unwrap().expires, None);
        assert!(parse_audit(b"not json").is_none());
        assert!(parse_audit(br#"{"identity":"n3"}"#).is_none());
        let huge = vec![b' '; MAX_RECORD + 1];
        assert!(parse_audit(&huge).is_none());
    }

    #[test]
    fn identities_files_skip_comments_and_repeats_and_refuse_bad_names() {
        let dir = std::env::temp_dir().join(format!("rotate-ids-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(
            &good,
            "# web tier\nweb1.example.net\n\n web2.example.net \nweb1.example.net\n",
        )
        .unwrap();
        let rule = IdentityRule::builtin();
        assert_eq!(
            read_identities(&good, &rule).unwrap(),
            vec!["web1.example.net", "web2.example.net"]
        );
        let bad = dir.join("bad");
        std::fs::write(&bad, "web1.example.net\nweb*.example.net\n").unwrap();
        let e = read_identities(&bad, &rule).unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_run_counts_nodes_and_judges_the_failure_share() {
        let mut nodes: Vec<NodeRecord> = (0..30)
            .map(|i| node(&format!("n{i}"), NodeRotation::Done))
            .collect();
        nodes.push(node("p1", NodeRotation::Pending));
        nodes.push(node("s1", NodeRotation::Sent));
        nodes.push(node("f1", NodeRotation::Failed));
        let mut run = Run::new(record(33), 1, nodes);
        assert_eq!(run.queue, vec!["p1".to_string()]);
        assert_eq!(
            (
                run.rec.pending,
                run.rec.in_flight,
                run.rec.done,
                run.rec.failed
            ),
            (1, 1, 30, 1)
        );
        // 1 failed of 31 finished is above 2% and below 5%.
        assert!(!run.failing());
        run.rec.limits.stop_if_failing = 2.0;
        assert!(run.failing());
        run.sending = 1;
        run.count();
        assert_eq!((run.rec.pending, run.rec.in_flight), (0, 2));
        // Too few finished nodes to judge.
        let small = Run::new(
            record(2),
            1,
            vec![
                node("a", NodeRotation::Failed),
                node("b", NodeRotation::Done),
            ],
        );
        assert!(!small.failing());
    }

    #[test]
    fn progress_shows_a_bar_counts_and_eta() {
        let mut rec = record(10);
        rec.done = 5;
        rec.failed = 1;
        rec.in_flight = 2;
        rec.pending = 2;
        rec.eta = Some(1_000 + 125);
        let line = progress_line(&rec, 1_000);
        assert!(
            line.starts_with(&format!("[{}{}]", "#".repeat(18), ".".repeat(12))),
            "{line}"
        );
        assert!(
            line.contains("5/10 done, 1 failed, 2 in flight, 2 waiting, ETA 2m05s (running)"),
            "{line}"
        );
        let text = status_text(&rec, 1_000);
        assert!(text.contains("Driven by: nobody"), "{text}");
        assert!(progress_line(&record(0), 0).contains("0/0 done"));
    }

    #[test]
    fn a_lease_lapses_after_its_heartbeat_ages() {
        let mut rec = record(1);
        rec.driver = "ops pid 1".into();
        rec.heartbeat = 100;
        assert!(rec.driven(100 + 29));
        assert!(!rec.driven(100 + 30));
        rec.driver.clear();
        assert!(!rec.driven(100));
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_writes_that_time_out_are_tried_again_and_other_errors_are_not() {
        // Timed out twice, then stored: the write succeeds.
        let mut calls = 0;
        let r = retry_timeouts("record n1", || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err("ack error: timed out: didn't receive ack in time".to_string())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(r, Ok(3));
        // Always timing out: given up after WRITE_TRIES.
        let mut calls = 0;
        let r: Result<(), String> = retry_timeouts("record n2", || {
            calls += 1;
            async { Err("request timed out".to_string()) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls, WRITE_TRIES);
        // Any other error is returned at once.
        let mut calls = 0;
        let r: Result<(), String> = retry_timeouts("record n3", || {
            calls += 1;
            async { Err("wrong last sequence: 4".to_string()) }
        })
        .await;
        assert_eq!(r, Err("wrong last sequence: 4".to_string()));
        assert_eq!(calls, 1);
        assert!(timed_out(
            "ack error: Timed out: didn't receive ack in time"
        ));
        assert!(!timed_out("no responders"));
    }

    #[test]
    fn an_acknowledgement_keeps_the_time_its_request_was_sent() {
        let ok: Result<(), choria_rpc_client::rpc::RequestError> = Ok(());
        match send_outcome("n1".into(), 1_000, ok) {
            Sent::Acked(id, at) => assert_eq!((id.as_str(), at), ("n1", 1_000)),
            _ => panic!("not acknowledged"),
        }
    }

    #[test]
    fn a_node_provisioned_before_its_acknowledgement_is_read_is_done_when_it_is() {
        let nodes = ["n1", "n2", "n3", "n4"]
            .map(|id| node(id, NodeRotation::Pending))
            .to_vec();
        let mut run = Run::new(record(4), 1, nodes);
        // n1: the audit record (time 105) and the startup event of n2 arrive before the
        // acknowledgements of requests sent at 100.
        assert!(run.provisioned("n1", Some(105)).is_none());
        assert!(run.provisioned("n2", None).is_none());
        let n1 = run.acked("n1", 100).unwrap();
        assert_eq!(n1.state, NodeRotation::Done);
        let n2 = run.acked("n2", 100).unwrap();
        assert_eq!(n2.state, NodeRotation::Done);
        // n3 was provisioned (time 90) before its request was sent (100): on its way only.
        assert!(run.provisioned("n3", Some(90)).is_none());
        let n3 = run.acked("n3", 100).unwrap();
        assert_eq!((n3.state, n3.sent_at), (NodeRotation::Sent, Some(100)));
        assert!(run.provisioned("n3", Some(99)).is_none());
        assert_eq!(
            run.provisioned("n3", Some(101)).map(|n| n.state),
            Some(NodeRotation::Done)
        );
        // n4 in the usual order; a second sighting changes nothing.
        assert_eq!(
            run.acked("n4", 100).map(|n| n.state),
            Some(NodeRotation::Sent)
        );
        assert!(run.provisioned("n4", None).is_some());
        assert!(run.provisioned("n4", None).is_none());
        assert!(run.acked("n4", 100).is_none());
        assert_eq!((run.done, run.sent), (4, 0));
        assert!(run.early.is_empty());
    }

    #[test]
    fn a_sent_node_with_no_news_is_asked_and_done_only_when_it_restarted_since_it_acknowledged() {
        let mut inherited = node("n1", NodeRotation::Sent);
        inherited.sent_at = Some(100);
        let nodes = vec![inherited, node("n2", NodeRotation::Pending)];
        let mut run = Run::new(record(2), 1, nodes);
        let after = CHECK_AFTER.as_secs() as i64;
        // n1 acknowledged a request of an earlier driver: asked at once, once at a time.
        assert_eq!(run.due_checks(150, 8), vec!["n1".to_string()]);
        assert!(run.due_checks(150, 8).is_empty());
        // No answer (in provisioning mode, off its main collective): asked again later.
        assert!(run.checked("n1", None).is_none());
        assert!(run.due_checks(150 + after - 1, 8).is_empty());
        assert_eq!(run.due_checks(150 + after, 8), vec!["n1".to_string()]);
        // It answers with the start before its request: the reprovision has not restarted it.
        assert!(run.checked("n1", Some(99)).is_none());
        // n2 acknowledges at 200: asked only after CHECK_AFTER, and never while none is room.
        assert_eq!(
            run.acked("n2", 200).map(|n| n.state),
            Some(NodeRotation::Sent)
        );
        assert!(run.due_checks(200 + after - 1, 8).is_empty());
        assert!(run.due_checks(200 + after, 0).is_empty());
        let due = run.due_checks(150 + 2 * after, 8);
        assert_eq!(due.len(), 2, "{due:?}");
        // Restarted since: done, and no longer asked.
        assert_eq!(
            run.checked("n1", Some(160)).map(|n| n.state),
            Some(NodeRotation::Done)
        );
        assert_eq!(
            run.checked("n2", Some(200)).map(|n| n.state),
            Some(NodeRotation::Done)
        );
        assert_eq!((run.done, run.sent, run.checked_done), (2, 0, 2));
        assert!(run.due_checks(10_000, 8).is_empty());
        assert!(run.next_check.is_empty() && run.checking.is_empty());
    }

    #[test]
    fn a_node_that_does_not_answer_is_done_only_when_the_audit_trail_shows_it_provisioned() {
        let nodes = ["n1", "n2", "n3"]
            .map(|id| node(id, NodeRotation::Pending))
            .to_vec();
        let mut run = Run::new(record(3), 1, nodes);
        // n1: provisioned during the campaign by the audit trail (an earlier driver's request
        // reached it); n2: only a startup event, which any restart sends; n3: nothing.
        assert!(run.provisioned("n1", Some(105)).is_none());
        assert!(run.provisioned("n2", None).is_none());
        let n1 = run.unanswered_but_reissued("n1").unwrap();
        assert_eq!(n1.state, NodeRotation::Done);
        assert!(run.unanswered_but_reissued("n2").is_none());
        assert!(run.unanswered_but_reissued("n3").is_none());
        assert!(run.unanswered_but_reissued("n1").is_none());
        assert_eq!((run.done, run.sent, run.failed), (1, 0, 0));
    }

    #[test]
    fn nodes_that_did_not_answer_are_queued_again_when_their_wait_is_over() {
        let mut run = Run::new(record(0), 1, Vec::new());
        let now = Instant::now();
        run.retry
            .push(Reverse((now + Duration::from_secs(60), "late".into())));
        run.retry
            .push(Reverse((now + Duration::from_secs(30), "soon".into())));
        run.due_retries(now);
        assert!(run.queue.is_empty());
        run.due_retries(now + Duration::from_secs(31));
        assert_eq!(run.queue, ["soon"]);
        run.due_retries(now + Duration::from_secs(61));
        assert_eq!(run.queue, ["late", "soon"]);
        assert!(run.retry.is_empty());
    }
}
