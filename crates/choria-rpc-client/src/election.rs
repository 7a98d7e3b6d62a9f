//! Leader election on Choria Streams (JetStream KV bucket `CHORIA_LEADER_ELECTION`).
//!
//! The algorithm is go-choria's streams election, kept step for step so that a Go provisioner and
//! this one can campaign for the same key and only one of them ever leads:
//!
//! 1. read the bucket's stream info, take its max age as the TTL and insist on 4 s ≤ TTL ≤ 1 h
//!    (go-choria's rule: TTL ≥ 1 s, interval = ¾ TTL ≥ 1 s, TTL − interval ≥ 1 s, TTL ≤ 1 h);
//! 2. sleep a random splay (0–5 s), then campaign at once and after every tick;
//! 3. a candidate publishes its identity to `$KV.<bucket>.<key>` with
//!    `Nats-Expected-Last-Subject-Sequence: 0` (a KV "create"); a PubAck makes it leader;
//! 4. a leader publishes again expecting its last revision (a KV "update"); the first successful
//!    update, 200 ms later, announces the win; a failed update loses leadership at once;
//! 5. the tick is the backoff policy's step for the number of failed campaigns (0 for a leader,
//!    so a leader rewrites the key every 250–750 ms with [`backoff::TWENTY_SEC`]).
//!
//! A stopping leader leaves the key to expire, as go-choria does, but tells local watchers that it
//! stopped. Opening errors are returned, never swallowed, so a caller can log and retry.
//!
//! In the provisioning account Choria Streams is reached through the JetStream API prefix
//! [`PROVISIONING_API_PREFIX`]; the KV writes then go to
//! `choria.streams.$KV.CHORIA_LEADER_ELECTION.<key>` exactly like nats.go builds them.
//!
//! ```no_run
//! use choria_rpc_client::election::{backoff, Election, ElectionEvent, PROVISIONING_API_PREFIX};
//! use tokio_util::sync::CancellationToken;
//!
//! # async fn example(client: async_nats::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let election = Election::builder(client, "provisioner", "provisioner1.example.net")
//!     .api_prefix(PROVISIONING_API_PREFIX)
//!     .build()?;
//! let mut events = election.subscribe();
//! let cancel = CancellationToken::new();
//! let campaign = tokio::spawn({
//!     let election = election.clone();
//!     let cancel = cancel.clone();
//!     async move {
//!         election
//!             .run_retrying(cancel, &backoff::FIVE_SEC, |err| tracing::error!("{err}"))
//!             .await
//!     }
//! });
//! while let Ok(event) = events.recv().await {
//!     match event {
//!         ElectionEvent::Won { .. } => { /* resume work */ }
//!         ElectionEvent::Lost { .. } => { /* pause and drop queued work */ }
//!         ElectionEvent::Stopped { .. } => break,
//!     }
//! }
//! cancel.cancel();
//! campaign.await??;
//! # Ok(())
//! # }
//! ```

pub mod backoff;
mod choose;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::header::{HeaderMap, HeaderValue, NATS_EXPECTED_LAST_SUBJECT_SEQUENCE};
use async_nats::jetstream;
use async_nats::jetstream::context::{
    GetStreamErrorKind, PublishErrorKind, RequestError, RequestErrorKind,
};
use async_nats::jetstream::ErrorCode;
use async_nats::Subject;
use bytes::Bytes;
use rand::Rng;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use self::backoff::Policy;

/// The bucket Choria Streams creates for elections.
pub const DEFAULT_BUCKET: &str = "CHORIA_LEADER_ELECTION";

/// The election name (KV key) the provisioner campaigns for.
pub const PROVISIONER_ELECTION: &str = "provisioner";

/// The JetStream API prefix through which the provisioning account reaches Choria Streams.
pub use crate::streams::PROVISIONING_API_PREFIX;

/// Upper bound of the random sleep before the first campaign, as in go-choria.
pub const DEFAULT_SPLAY: Duration = Duration::from_secs(5);

/// Pause between the first successful update and announcing the win.
pub const WON_NOTIFY_DELAY: Duration = Duration::from_millis(200);

/// Default bound on every JetStream request and publish acknowledgement.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

const DEFAULT_API_PREFIX: &str = "$JS.API";
const KV_OPERATION: &str = "KV-Operation";
const EVENT_CAPACITY: usize = 64;
const PUBLISH_RETRIES: u32 = 2;
const PUBLISH_RETRY_WAIT: Duration = Duration::from_millis(250);

/// Where this candidate stands, as seen by local watchers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeaderState {
    /// Not campaigning yet: the bucket is being opened or the start-up splay is running.
    Unknown,
    /// Campaigning without leading (this includes the one round between winning the key and
    /// announcing it).
    Candidate,
    /// Leading: the win was announced and the key is being kept.
    Leader,
    /// The campaign ended (cancelled or failed to open); nothing is being kept.
    Stopped,
}

impl fmt::Display for LeaderState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaderState::Unknown => "unknown",
            LeaderState::Candidate => "candidate",
            LeaderState::Leader => "leader",
            LeaderState::Stopped => "stopped",
        })
    }
}

/// Why a leader lost its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LossCause {
    /// The key moved on: another writer, an eviction (delete marker) or expiry.
    KeyChanged,
    /// The update could not be confirmed: timeout, no responders, broken connection.
    RequestFailed,
}

/// A transition reported to [`Election::subscribe`] receivers, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectionEvent {
    /// This candidate now leads (go-choria's won callback).
    Won {
        /// The KV revision of the update that confirmed the win.
        revision: u64,
    },
    /// This candidate stopped leading (go-choria's lost callback); it keeps campaigning.
    Lost {
        /// What made the update fail.
        cause: LossCause,
        /// The error, for logs.
        detail: String,
    },
    /// The campaign ended.
    Stopped {
        /// Whether it was leading when it stopped (the key is left to expire).
        was_leader: bool,
    },
}

/// The statistics behind go-choria's election series (`providers/election/streams/stats.go`),
/// updated at the moments go-choria updates them:
///
/// - `choria_election_campaigns{state="candidate"}` ([`Self::campaigns_as_candidate`]) and
///   `{state="leader"}` ([`Self::campaigns_as_leader`]): one at the start of every campaign,
///   by the state campaigned in (the round after a winning create is a leader campaign);
/// - `choria_election_leader` ([`Self::leader_gauge`]): set to 1 by a winning create (before
///   the win is announced), to 0 by a failed update; never set before the first win, and left
///   as it is when the campaign stops (the key is left to expire);
/// - `choria_election_interval_seconds` ([`Self::interval_gauge`]): the policy's first delay
///   when campaigning starts (after the start-up splay), then the delay drawn after every
///   campaign (the ¾-TTL interval without a backoff policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ElectionStats {
    /// Campaigns made as a candidate (creates attempted).
    pub campaigns_as_candidate: u64,
    /// Campaigns made as the leader (updates attempted).
    pub campaigns_as_leader: u64,
    /// Whether this candidate holds the key now (set on the winning create, cleared by a
    /// failed update and when the campaign stops).
    pub holds_key: bool,
    /// The delay before the next campaign (zero before campaigning).
    pub interval: Duration,
    /// go-choria's leader gauge: `None` until the key was first won.
    pub leader_gauge: Option<bool>,
    /// go-choria's interval gauge: `None` until campaigning started.
    pub interval_gauge: Option<Duration>,
}

/// Bucket facts read when the campaign starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketInfo {
    /// The bucket's max age: how long a silent leader's key survives.
    pub ttl: Duration,
    /// ¾ of the TTL: go-choria's campaign interval when no backoff policy is set.
    pub campaign_interval: Duration,
    /// Whether the stream allows direct gets (used to see eviction markers).
    pub allow_direct: bool,
}

/// Errors of an election; each names the election, the identity and the action.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The bucket's stream does not exist (Choria Streams off, or bucket not created yet).
    #[error("election {election} as {identity}: open bucket {bucket}: bucket does not exist")]
    BucketNotFound {
        /// Election name (KV key).
        election: String,
        /// Our identity.
        identity: String,
        /// Bucket name.
        bucket: String,
    },
    /// Choria Streams cannot be reached from this connection: nobody answered the stream info
    /// request, or JetStream is off for this account (e.g. the provisioning account without the
    /// `choria.streams` prefix or without the broker's import).
    #[error("election {election} as {identity}: open bucket {bucket}: choria streams unreachable on {subject}: {detail}")]
    StreamsUnavailable {
        /// Election name (KV key).
        election: String,
        /// Our identity.
        identity: String,
        /// Bucket name.
        bucket: String,
        /// The stream info subject that was asked.
        subject: String,
        /// What the server said.
        detail: String,
    },
    /// The stream exists but is not a usable KV bucket.
    #[error("election {election} as {identity}: open bucket {bucket}: not a key-value bucket (max messages per subject {max_per_subject})")]
    BadBucket {
        /// Election name (KV key).
        election: String,
        /// Our identity.
        identity: String,
        /// Bucket name.
        bucket: String,
        /// The stream's max messages per subject.
        max_per_subject: i64,
    },
    /// The bucket's TTL is outside what the algorithm accepts (4 s to 1 h).
    #[error("election {election} as {identity}: validate bucket {bucket}: ttl {ttl:?} {reason}")]
    InvalidTtl {
        /// Election name (KV key).
        election: String,
        /// Our identity.
        identity: String,
        /// Bucket name.
        bucket: String,
        /// The bucket's max age.
        ttl: Duration,
        /// Which rule failed.
        reason: &'static str,
    },
    /// The stream info request failed otherwise (timeout, JetStream error, bad reply).
    #[error("election {election} as {identity}: open bucket {bucket}: {detail}")]
    Request {
        /// Election name (KV key).
        election: String,
        /// Our identity.
        identity: String,
        /// Bucket name.
        bucket: String,
        /// Whether the request timed out.
        timed_out: bool,
        /// The underlying error.
        detail: String,
    },
    /// A name is not usable in a subject.
    #[error("election {election} as {identity}: configure: invalid {what} {value:?}")]
    InvalidName {
        /// Election name (KV key).
        election: String,
        /// Our identity.
        identity: String,
        /// Which setting (`key`, `bucket`, `api prefix`, `domain`, `identity`).
        what: &'static str,
        /// The offending value.
        value: String,
    },
    /// [`Election::run`] was called while another run of the same election was active.
    #[error("election {election} as {identity}: start: already running")]
    AlreadyRunning {
        /// Election name (KV key).
        election: String,
        /// Our identity.
        identity: String,
    },
}

/// Configures an [`Election`]; see [`Election::builder`].
#[derive(Debug, Clone)]
pub struct ElectionBuilder {
    client: async_nats::Client,
    key: String,
    identity: String,
    bucket: String,
    api: Api,
    backoff: Option<Policy>,
    splay: Duration,
    won_delay: Duration,
    request_timeout: Duration,
}

#[derive(Debug, Clone)]
enum Api {
    Default,
    Prefix(String),
    Domain(String),
}

impl ElectionBuilder {
    /// The bucket name (default [`DEFAULT_BUCKET`]).
    pub fn bucket(mut self, bucket: impl Into<String>) -> Self {
        self.bucket = bucket.into();
        self
    }

    /// Reach JetStream through an API prefix such as [`PROVISIONING_API_PREFIX`] (a trailing `.`
    /// is ignored); KV writes are then published under the same prefix. Replaces [`Self::domain`].
    pub fn api_prefix(mut self, prefix: impl Into<String>) -> Self {
        let prefix: String = prefix.into();
        let prefix = prefix.trim_end_matches('.').to_string();
        self.api = if prefix.is_empty() || prefix == DEFAULT_API_PREFIX {
            Api::Default
        } else {
            Api::Prefix(prefix)
        };
        self
    }

    /// Reach JetStream in another domain (`$JS.<domain>.API`). Replaces [`Self::api_prefix`].
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.api = Api::Domain(domain.into());
        self
    }

    /// The campaign backoff: `Some(policy)` ticks by the failure count (default
    /// [`backoff::TWENTY_SEC`], what the provisioner uses); `None` ticks every ¾ TTL like
    /// go-choria without a backoff option.
    pub fn backoff(mut self, policy: Option<Policy>) -> Self {
        self.backoff = policy;
        self
    }

    /// Upper bound of the random start-up sleep (default [`DEFAULT_SPLAY`]); zero disables it.
    pub fn splay(mut self, max: Duration) -> Self {
        self.splay = max;
        self
    }

    /// Pause before announcing a win (default [`WON_NOTIFY_DELAY`]).
    pub fn won_delay(mut self, delay: Duration) -> Self {
        self.won_delay = delay;
        self
    }

    /// Bound on each JetStream request and publish acknowledgement (default
    /// [`DEFAULT_REQUEST_TIMEOUT`]).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Validate the names and build the election; no I/O happens here.
    pub fn build(self) -> Result<Election, ElectionError> {
        let invalid = |what: &'static str, value: &str| ElectionError::InvalidName {
            election: self.key.clone(),
            identity: self.identity.clone(),
            what,
            value: value.to_string(),
        };
        if !valid_key(&self.key) {
            return Err(invalid("key", &self.key));
        }
        if !valid_token(&self.bucket) {
            return Err(invalid("bucket", &self.bucket));
        }
        if self.identity.is_empty() {
            return Err(invalid("identity", &self.identity));
        }
        let (js, put_prefix) = match &self.api {
            Api::Default => (
                jetstream::ContextBuilder::new()
                    .timeout(self.request_timeout)
                    .build(self.client.clone()),
                String::new(),
            ),
            Api::Prefix(p) => {
                if !valid_subject(p) {
                    return Err(invalid("api prefix", p));
                }
                (
                    jetstream::ContextBuilder::new()
                        .api_prefix(p.clone())
                        .timeout(self.request_timeout)
                        .build(self.client.clone()),
                    format!("{p}."),
                )
            }
            Api::Domain(d) => {
                if !valid_token(d) {
                    return Err(invalid("domain", d));
                }
                (
                    jetstream::ContextBuilder::new()
                        .domain(d.clone())
                        .timeout(self.request_timeout)
                        .build(self.client.clone()),
                    format!("$JS.{d}.API."),
                )
            }
        };
        let stream_name = format!("KV_{}", self.bucket);
        let key_subject = format!("$KV.{}.{}", self.bucket, self.key);
        // nats.go publishes KV writes under the API prefix whenever it is not the default one;
        // the Choria broker imports exactly that subject into the provisioning account.
        let put_subject = Subject::from(format!("{put_prefix}{key_subject}"));
        let (state, _) = watch::channel(LeaderState::Unknown);
        let (events, _) = broadcast::channel(EVENT_CAPACITY);
        Ok(Election {
            inner: Arc::new(Inner {
                js,
                value: Bytes::from(self.identity.clone().into_bytes()),
                key: self.key,
                identity: self.identity,
                bucket: self.bucket,
                stream_name,
                key_subject,
                put_subject,
                api_prefix: match &self.api {
                    Api::Default => DEFAULT_API_PREFIX.to_string(),
                    Api::Prefix(p) => p.clone(),
                    Api::Domain(d) => format!("$JS.{d}.API"),
                },
                backoff: self.backoff,
                splay: self.splay,
                won_delay: self.won_delay,
                state,
                events,
                running: AtomicBool::new(false),
                campaigns_candidate: AtomicU64::new(0),
                campaigns_leader: AtomicU64::new(0),
                holds_key: AtomicBool::new(false),
                leader_gauge: AtomicU8::new(GAUGE_UNSET),
                interval_nanos: AtomicU64::new(INTERVAL_UNSET),
            }),
        })
    }
}

/// One candidate in one election. Cheap to clone; clones share state and the running campaign.
#[derive(Debug, Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    js: jetstream::Context,
    value: Bytes,
    key: String,
    identity: String,
    bucket: String,
    stream_name: String,
    key_subject: String,
    put_subject: Subject,
    /// The JetStream API prefix in use, kept for error messages.
    api_prefix: String,
    backoff: Option<Policy>,
    splay: Duration,
    won_delay: Duration,
    state: watch::Sender<LeaderState>,
    events: broadcast::Sender<ElectionEvent>,
    running: AtomicBool,
    campaigns_candidate: AtomicU64,
    campaigns_leader: AtomicU64,
    holds_key: AtomicBool,
    /// go-choria's leader gauge: [`GAUGE_UNSET`], 0 or 1.
    leader_gauge: AtomicU8,
    /// go-choria's interval gauge in nanoseconds, or [`INTERVAL_UNSET`].
    interval_nanos: AtomicU64,
}

const GAUGE_UNSET: u8 = u8::MAX;
const INTERVAL_UNSET: u64 = u64::MAX;

impl Inner {
    fn set_leader_gauge(&self, leader: bool) {
        self.leader_gauge.store(u8::from(leader), Ordering::Relaxed);
    }

    fn set_interval_gauge(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(INTERVAL_UNSET - 1);
        self.interval_nanos
            .store(nanos.min(INTERVAL_UNSET - 1), Ordering::Relaxed);
    }
}

/// Why a create or update did not go through.
#[derive(Debug)]
struct WriteFailure {
    cause: LossCause,
    no_responders: bool,
    detail: String,
}

impl Election {
    /// Start configuring a candidate for election `key` (e.g. [`PROVISIONER_ELECTION`]) that
    /// writes `identity` as its value, over an existing NATS connection.
    pub fn builder(
        client: async_nats::Client,
        key: impl Into<String>,
        identity: impl Into<String>,
    ) -> ElectionBuilder {
        ElectionBuilder {
            client,
            key: key.into(),
            identity: identity.into(),
            bucket: DEFAULT_BUCKET.to_string(),
            api: Api::Default,
            backoff: Some(backoff::TWENTY_SEC),
            splay: DEFAULT_SPLAY,
            won_delay: WON_NOTIFY_DELAY,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// The election name (KV key).
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// Our identity (the value written to the key).
    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// The JetStream API prefix requests go to: `$JS.API`, [`PROVISIONING_API_PREFIX`] or
    /// `$JS.<domain>.API`.
    pub fn api_prefix(&self) -> &str {
        &self.inner.api_prefix
    }

    /// The subject KV writes are published to, e.g.
    /// `choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner`.
    pub fn put_subject(&self) -> &str {
        self.inner.put_subject.as_str()
    }

    /// A watcher of the current [`LeaderState`]; `Leader` only after the win was announced.
    pub fn state(&self) -> watch::Receiver<LeaderState> {
        self.inner.state.subscribe()
    }

    /// Whether this candidate currently leads (go-choria's `IsLeader`).
    pub fn is_leader(&self) -> bool {
        *self.inner.state.borrow() == LeaderState::Leader
    }

    /// Receive every transition from now on. Events are few (at most one per campaign); a
    /// receiver that falls more than 64 behind gets `Lagged` and should re-read [`Self::state`].
    pub fn subscribe(&self) -> broadcast::Receiver<ElectionEvent> {
        self.inner.events.subscribe()
    }

    /// Current counters.
    pub fn stats(&self) -> ElectionStats {
        let i = &self.inner;
        let interval_gauge = match i.interval_nanos.load(Ordering::Relaxed) {
            INTERVAL_UNSET => None,
            nanos => Some(Duration::from_nanos(nanos)),
        };
        ElectionStats {
            campaigns_as_candidate: i.campaigns_candidate.load(Ordering::Relaxed),
            campaigns_as_leader: i.campaigns_leader.load(Ordering::Relaxed),
            holds_key: i.holds_key.load(Ordering::Relaxed),
            interval: interval_gauge.unwrap_or_default(),
            leader_gauge: match i.leader_gauge.load(Ordering::Relaxed) {
                GAUGE_UNSET => None,
                v => Some(v == 1),
            },
            interval_gauge,
        }
    }

    /// Read the bucket's stream info and validate its TTL, without campaigning.
    pub async fn open(&self) -> Result<BucketInfo, ElectionError> {
        let i = &self.inner;
        let stream = match i.js.get_stream(&i.stream_name).await {
            Ok(s) => s,
            Err(err) => return Err(self.open_error(err)),
        };
        let config = &stream.cached_info().config;
        if config.max_messages_per_subject < 1 {
            return Err(ElectionError::BadBucket {
                election: i.key.clone(),
                identity: i.identity.clone(),
                bucket: i.bucket.clone(),
                max_per_subject: config.max_messages_per_subject,
            });
        }
        let ttl = config.max_age;
        let campaign_interval = validate_ttl(ttl).map_err(|reason| ElectionError::InvalidTtl {
            election: i.key.clone(),
            identity: i.identity.clone(),
            bucket: i.bucket.clone(),
            ttl,
            reason,
        })?;
        Ok(BucketInfo {
            ttl,
            campaign_interval,
            allow_direct: config.allow_direct,
        })
    }

    fn open_error(&self, err: jetstream::context::GetStreamError) -> ElectionError {
        let i = &self.inner;
        let request_kind = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<RequestError>())
            .map(|r| r.kind());
        match err.kind() {
            GetStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                ElectionError::BucketNotFound {
                    election: i.key.clone(),
                    identity: i.identity.clone(),
                    bucket: i.bucket.clone(),
                }
            }
            GetStreamErrorKind::JetStream(e)
                if e.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
                    || e.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED =>
            {
                ElectionError::StreamsUnavailable {
                    election: i.key.clone(),
                    identity: i.identity.clone(),
                    bucket: i.bucket.clone(),
                    subject: format!("{}.STREAM.INFO.{}", i.api_prefix, i.stream_name),
                    detail: e.to_string(),
                }
            }
            _ if request_kind == Some(RequestErrorKind::NoResponders) => {
                ElectionError::StreamsUnavailable {
                    election: i.key.clone(),
                    identity: i.identity.clone(),
                    bucket: i.bucket.clone(),
                    subject: format!("{}.STREAM.INFO.{}", i.api_prefix, i.stream_name),
                    detail: "no responders".to_string(),
                }
            }
            _ => ElectionError::Request {
                election: i.key.clone(),
                identity: i.identity.clone(),
                bucket: i.bucket.clone(),
                timed_out: request_kind == Some(RequestErrorKind::TimedOut),
                detail: err.to_string(),
            },
        }
    }

    /// [`Self::run`] until `cancel` fires, retrying after opening errors (bucket missing,
    /// streams unreachable, TTL refused...) with `retry`'s delays; each error is handed to
    /// `on_error` first so the caller can log it. Returns early only when another run of this
    /// election is already active.
    pub async fn run_retrying(
        &self,
        cancel: CancellationToken,
        retry: &Policy,
        mut on_error: impl FnMut(&ElectionError),
    ) -> Result<(), ElectionError> {
        let mut failures = 0usize;
        loop {
            match self.run(cancel.clone()).await {
                Ok(()) => return Ok(()),
                Err(err @ ElectionError::AlreadyRunning { .. }) => return Err(err),
                Err(err) => {
                    on_error(&err);
                    failures = failures.saturating_add(1);
                    if !retry.sleep(failures, &cancel).await {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Open the bucket, then campaign until `cancel` fires.
    ///
    /// Returns `Ok(())` after cancellation and an error when the bucket cannot be opened or its
    /// TTL is unusable; then the state is [`LeaderState::Stopped`] and the caller may log, wait
    /// and call `run` again. Only one `run` of an election (and its clones) may be active.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), ElectionError> {
        let i = &self.inner;
        if i.running.swap(true, Ordering::AcqRel) {
            return Err(ElectionError::AlreadyRunning {
                election: i.key.clone(),
                identity: i.identity.clone(),
            });
        }
        let _running = RunningGuard(i);
        i.state.send_replace(LeaderState::Unknown);
        let info = self.open().await?;
        tracing::debug!(election = %i.key, identity = %i.identity, ttl = ?info.ttl, "opened election bucket");
        self.campaign(info, &cancel).await;
        Ok(())
    }

    async fn campaign(&self, info: BucketInfo, cancel: &CancellationToken) {
        let i = &self.inner;
        i.state.send_replace(LeaderState::Candidate);

        // Spread out start-ups of many candidates, as go-choria does.
        let splay = random_below(i.splay);
        if !sleep_or_cancel(splay, cancel).await {
            return;
        }

        // go-choria sets the interval gauge when it starts ticking, before the first campaign.
        i.set_interval_gauge(match &i.backoff {
            Some(policy) => policy.duration(0),
            None => info.campaign_interval,
        });

        let mut tries: usize = 0;
        let mut revision: Option<u64> = None;
        let mut notify_next = false;
        loop {
            match revision {
                None => {
                    i.campaigns_candidate.fetch_add(1, Ordering::Relaxed);
                    let outcome = tokio::select! {
                        r = self.create(info.allow_direct) => r,
                        _ = cancel.cancelled() => break,
                    };
                    match outcome {
                        Ok(rev) => {
                            revision = Some(rev);
                            tries = 0;
                            notify_next = true;
                            i.holds_key.store(true, Ordering::Relaxed);
                            i.set_leader_gauge(true);
                            tracing::debug!(election = %i.key, identity = %i.identity, revision = rev, "created election key");
                        }
                        Err(_) => tries = tries.saturating_add(1),
                    }
                }
                Some(last) => {
                    i.campaigns_leader.fetch_add(1, Ordering::Relaxed);
                    let outcome = tokio::select! {
                        r = self.write(last) => r,
                        _ = cancel.cancelled() => break,
                    };
                    match outcome {
                        Ok(rev) => {
                            revision = Some(rev);
                            if notify_next {
                                notify_next = false;
                                // Give a candidate that raced us a round to stand down first.
                                if !sleep_or_cancel(i.won_delay, cancel).await {
                                    break;
                                }
                                i.state.send_replace(LeaderState::Leader);
                                let _ = i.events.send(ElectionEvent::Won { revision: rev });
                                tracing::info!(election = %i.key, identity = %i.identity, "became leader");
                            }
                        }
                        Err(failure) => {
                            revision = None;
                            notify_next = false;
                            i.holds_key.store(false, Ordering::Relaxed);
                            i.set_leader_gauge(false);
                            i.state.send_replace(LeaderState::Candidate);
                            tracing::warn!(election = %i.key, identity = %i.identity, error = %failure.detail, "lost leadership");
                            let _ = i.events.send(ElectionEvent::Lost {
                                cause: failure.cause,
                                detail: failure.detail,
                            });
                        }
                    }
                }
            }
            let delay = match &i.backoff {
                Some(policy) => policy.duration(tries),
                None => info.campaign_interval,
            };
            i.set_interval_gauge(delay);
            if !sleep_or_cancel(delay, cancel).await {
                break;
            }
        }
        // The key is left to expire, as go-choria does; the run guard reports the stop.
    }

    /// A KV create: expect no live entry; when the latest entry is a delete or purge marker
    /// (an eviction), retry expecting the marker's revision, as nats.go's create does.
    async fn create(&self, allow_direct: bool) -> Result<u64, WriteFailure> {
        let err = match self.write(0).await {
            Ok(rev) => return Ok(rev),
            Err(err) => err,
        };
        if err.cause == LossCause::KeyChanged && allow_direct {
            if let Some(marker) = self.deleted_revision().await {
                return self.write(marker).await;
            }
        }
        Err(err)
    }

    /// The revision of the key's latest entry when it is a delete or purge marker. Failures
    /// (e.g. no direct-get import in the provisioning account) count as "no marker".
    async fn deleted_revision(&self) -> Option<u64> {
        let i = &self.inner;
        let stream = i.js.get_stream_no_info(&i.stream_name).await.ok()?;
        let msg = stream
            .direct_get_last_for_subject(i.key_subject.clone())
            .await
            .ok()?;
        let op = msg.headers.get(KV_OPERATION)?.as_str();
        (op == "DEL" || op == "PURGE").then_some(msg.sequence)
    }

    /// Publish our identity expecting the key's last revision to be `expected` (0: no entry).
    async fn write(&self, expected: u64) -> Result<u64, WriteFailure> {
        let mut retries = 0;
        loop {
            match self.write_once(expected).await {
                // nats.go retries a JetStream publish that met no responders twice, 250 ms
                // apart, to ride over stream leader changes; a leader must not lose for less.
                Err(failure) if failure.no_responders && retries < PUBLISH_RETRIES => {
                    retries += 1;
                    tokio::time::sleep(PUBLISH_RETRY_WAIT).await;
                }
                other => return other,
            }
        }
    }

    async fn write_once(&self, expected: u64) -> Result<u64, WriteFailure> {
        let i = &self.inner;
        let mut headers = HeaderMap::new();
        headers.insert(
            NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            HeaderValue::from(expected),
        );
        let ack =
            i.js.publish_with_headers(i.put_subject.clone(), headers, i.value.clone())
                .await
                .map_err(|e| WriteFailure {
                    cause: LossCause::RequestFailed,
                    no_responders: false,
                    detail: format!("publish to {}: {e}", i.put_subject),
                })?;
        match ack.await {
            Ok(ack) => Ok(ack.sequence),
            Err(e) => {
                let cause = if is_wrong_last_sequence(&e) {
                    LossCause::KeyChanged
                } else {
                    LossCause::RequestFailed
                };
                Err(WriteFailure {
                    cause,
                    // async-nats reports a no-responders status on a publish as "stream not found".
                    no_responders: e.kind() == PublishErrorKind::StreamNotFound,
                    detail: format!("write {} expecting revision {expected}: {e}", i.put_subject),
                })
            }
        }
    }
}

/// Ends a run however it ends, including when its future is dropped mid-campaign: watchers must
/// never keep seeing `Leader` from a campaign that has stopped.
struct RunningGuard<'a>(&'a Inner);

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        let i = self.0;
        let previous = i.state.send_replace(LeaderState::Stopped);
        if previous != LeaderState::Stopped {
            let was_leader = previous == LeaderState::Leader;
            let _ = i.events.send(ElectionEvent::Stopped { was_leader });
            tracing::debug!(election = %i.key, identity = %i.identity, was_leader, "election stopped");
        }
        i.holds_key.store(false, Ordering::Relaxed);
        i.running.store(false, Ordering::Release);
    }
}

/// Replicated streams report a failed compare-and-set as 10164 rather than 10071, which
/// async-nats files under `Other`.
fn is_wrong_last_sequence(err: &jetstream::context::PublishError) -> bool {
    match err.kind() {
        PublishErrorKind::WrongLastSequence => true,
        PublishErrorKind::Other => std::error::Error::source(err)
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .is_some_and(|e| e.error_code() == ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT),
        _ => false,
    }
}

/// go-choria's TTL rules; returns the derived campaign interval (¾ TTL).
fn validate_ttl(ttl: Duration) -> Result<Duration, &'static str> {
    let interval = Duration::from_nanos((ttl.as_nanos() as f64 * 0.75) as u64);
    if ttl < Duration::from_secs(1) {
        return Err("is under 1 second");
    }
    if ttl > Duration::from_secs(3600) {
        return Err("is over 1 hour");
    }
    if interval.as_secs_f64() < 1.0 {
        return Err("gives a campaign interval under 1 second");
    }
    if ttl.as_secs_f64() - interval.as_secs_f64() < 1.0 {
        return Err(
            "leaves under 1 second between campaign interval and expiry (needs at least 4 seconds)",
        );
    }
    Ok(interval)
}

fn random_below(max: Duration) -> Duration {
    let ms = max.as_millis() as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(rand::thread_rng().gen_range(0..ms))
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    if d.is_zero() {
        return !cancel.is_cancelled();
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = cancel.cancelled() => false,
    }
}

/// A KV key or bucket token: non-empty, no spaces, dots or wildcards.
fn valid_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-' || c == b'=')
}

/// A KV key as nats.go accepts it: `[-/_=.a-zA-Z0-9]+`, not starting or ending with `.`.
fn valid_key(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && !s.ends_with('.')
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'=' | b'/' | b'.'))
}

/// A subject prefix: dot-separated non-empty tokens without wildcards or spaces.
fn valid_subject(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|t| {
            !t.is_empty()
                && t.bytes()
                    .all(|c| !c.is_ascii_whitespace() && c != b'*' && c != b'>')
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rules_match_go_choria() {
        let ok = [4u64, 5, 60, 3600];
        for s in ok {
            let interval = validate_ttl(Duration::from_secs(s)).unwrap();
            assert_eq!(interval, Duration::from_millis(s * 750));
        }
        for (ttl, reason) in [
            (Duration::ZERO, "is under 1 second"),
            (Duration::from_millis(999), "is under 1 second"),
            (
                Duration::from_secs(1),
                "gives a campaign interval under 1 second",
            ),
            (Duration::from_secs(3), "leaves under 1 second"),
            (Duration::from_millis(3999), "leaves under 1 second"),
            (Duration::from_secs(3601), "is over 1 hour"),
        ] {
            let err = validate_ttl(ttl).unwrap_err();
            assert!(err.starts_with(reason), "{ttl:?}: {err}");
        }
    }

    /// The statistics move when go-choria moves its series: the leader gauge is absent until a
    /// win, 1 from the winning create, 0 after a failed update; campaigns are counted by the
    /// state they were made in; the interval gauge is set once campaigning starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stats_follow_go_choria_series() {
        use async_nats::jetstream::kv;
        let server = test_support::NatsServer::start();
        let admin = async_nats::connect(server.url()).await.unwrap();
        let store = jetstream::new(admin)
            .create_key_value(kv::Config {
                bucket: DEFAULT_BUCKET.to_string(),
                history: 1,
                max_age: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .unwrap();
        let client = async_nats::connect(server.url()).await.unwrap();
        let election = Election::builder(client, PROVISIONER_ELECTION, "p1.example.net")
            .splay(Duration::ZERO)
            .won_delay(Duration::ZERO)
            .build()
            .unwrap();
        let before = election.stats();
        assert_eq!(before, ElectionStats::default());
        assert_eq!((before.leader_gauge, before.interval_gauge), (None, None));

        let cancel = CancellationToken::new();
        let task = tokio::spawn({
            let election = election.clone();
            let cancel = cancel.clone();
            async move { election.run(cancel).await }
        });
        let mut state = election.state();
        tokio::time::timeout(
            Duration::from_secs(10),
            state.wait_for(|s| *s == LeaderState::Leader),
        )
        .await
        .unwrap()
        .unwrap();
        let won = election.stats();
        assert_eq!(won.leader_gauge, Some(true), "{won:?}");
        assert_eq!(won.campaigns_as_candidate, 1, "{won:?}");
        assert!(won.campaigns_as_leader >= 1, "{won:?}");
        let interval = won.interval_gauge.unwrap();
        // A leader's next campaign is TwentySec's first step, 500 ms ± 50 %.
        assert!(
            interval >= Duration::from_millis(250) && interval < Duration::from_millis(750),
            "{interval:?}"
        );

        // Another writer takes the key: the leader's next update fails.
        store
            .put(PROVISIONER_ELECTION, "intruder".into())
            .await
            .unwrap();
        tokio::time::timeout(
            Duration::from_secs(10),
            state.wait_for(|s| *s == LeaderState::Candidate),
        )
        .await
        .unwrap()
        .unwrap();
        let lost = election.stats();
        assert_eq!(lost.leader_gauge, Some(false), "{lost:?}");
        assert!(!lost.holds_key);

        // Candidate campaigns go on (the key is taken) and are counted as such.
        let candidate_before = lost.campaigns_as_candidate;
        tokio::time::timeout(Duration::from_secs(10), async {
            while election.stats().campaigns_as_candidate <= candidate_before {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .unwrap();
        cancel.cancel();
        task.await.unwrap().unwrap();
        // Stopping leaves go-choria's gauges as they were.
        let stopped = election.stats();
        assert_eq!(stopped.leader_gauge, Some(false));
        assert!(stopped.interval_gauge.is_some());
    }

    #[test]
    fn names_are_checked() {
        assert!(valid_key("provisioner"));
        assert!(valid_key("a.b/c"));
        assert!(!valid_key(".a"));
        assert!(!valid_key("a b"));
        assert!(valid_token("provisioner"));
        assert!(valid_token("CHORIA_LEADER_ELECTION"));
        assert!(!valid_token("a.b"));
        assert!(!valid_token("a*"));
        assert!(!valid_token(""));
        assert!(valid_subject("choria.streams"));
        assert!(!valid_subject("choria..streams"));
        assert!(!valid_subject("choria.>"));
    }
}
