//! The RPC client: directed requests, broadcast discovery and lifecycle events over one shared
//! NATS connection.
//!
//! All replies arrive on one wildcard subscription, `<collective>.reply.<md5(callerid)>.>`,
//! and are handed to the waiting request by request id. A reply is trusted only after its
//! transport, hash, protocol strings, request id and (for directed requests) sender check out;
//! anything else is dropped with a log line and counted in [`ReplyStats`].
//!
//! A directed request is also published with its reply subject as the NATS reply subject (the
//! Choria envelope carries it too, and Choria servers read only the envelope's). When nothing is
//! subscribed to the node's subject, the broker answers at once on that subject with a
//! no-responders status message (503, no payload), and the request fails with
//! [`RequestErrorKind::NoResponders`] instead of waiting for its timeout. Broadcasts are published
//! without one: many nodes answer them, and an empty collective is an empty discovery.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt as _;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::lifecycle::{LifecycleEvent, ReceivedEvent};
use crate::mcorpc::{RpcReply, StatusCode};
use crate::protocol::{self, Filter, OutgoingRequest, Reply, Security};

/// The `statusmsg` of `choria_provision` when another provisioner holds the node's lock. Only
/// this client recognises it: a reply carrying it fails with
/// [`RequestErrorKind::ProvisioningLocked`].
pub const PROVISIONING_LOCK_MSG: &str = "Could not obtain provisioning lock";

/// How long to wait for the broker to confirm a new subscription.
/// The longest a discovery with a sliding window goes on while replies keep coming
/// ([`RpcClient::discover`]).
pub const DISCOVERY_MAX_TIME: Duration = Duration::from_secs(30);
/// The most identities one discovery keeps: beyond the largest fleets, and a bound on what
/// forged replies can make it hold (about 60 bytes an identity).
pub const MAX_DISCOVERED: usize = 4 << 20;
const ROUND_TRIP_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the connection state is looked at for [`RpcClient::connection_watch`].
const CONNECTION_POLL: Duration = Duration::from_millis(500);

/// What kind of failure an [`RequestError`] is, for callers that branch on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum RequestErrorKind {
    /// No valid reply before the timeout.
    #[error("timeout")]
    Timeout,
    /// The broker reported that nothing is subscribed to the node's subject, so no server with
    /// that identity is connected.
    #[error("no responders (no server is subscribed to its subject)")]
    NoResponders,
    /// The connection to the broker is down.
    #[error("not connected to the broker")]
    NotConnected,
    /// The client was shut down or its reply subscription ended.
    #[error("rpc client closed")]
    Closed,
    /// The request or its data could not be encoded or signed.
    #[error("cannot encode request")]
    Encode,
    /// Publishing, flushing or subscribing failed.
    #[error("transport error")]
    Transport,
    /// The reply body is not a valid RPC reply or its data does not have the expected shape.
    #[error("bad reply")]
    BadReply,
    /// The node refused with [`PROVISIONING_LOCK_MSG`] (statuscode 1): another provisioner
    /// holds its provisioning lock.
    #[error("{:?}: {PROVISIONING_LOCK_MSG}", StatusCode::Aborted)]
    ProvisioningLocked,
    /// The node answered with another non-zero statuscode.
    #[error("{code:?}: {message}")]
    Status {
        /// The statuscode.
        code: StatusCode,
        /// The statusmsg.
        message: String,
    },
}

impl RequestErrorKind {
    /// The kind of a reply with a non-zero `code` and `message`: the provisioning lock
    /// refusal (go-choria sends it with statuscode 1) or a plain status.
    pub fn from_status(code: StatusCode, message: String) -> Self {
        if message.contains(PROVISIONING_LOCK_MSG) {
            RequestErrorKind::ProvisioningLocked
        } else {
            RequestErrorKind::Status { code, message }
        }
    }
}

/// The cause kept in an [`RequestError`].
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An RPC failure: the node, the action, what kind of failure and the underlying cause.
///
/// Shown as `<action> on <identity> failed: <kind>`, followed by `: <cause>` when there is one
/// (the cause is also [`std::error::Error::source`]), so a log line names the reason.
#[derive(Debug)]
pub struct RequestError {
    /// Target node (`*` for broadcasts and subscriptions).
    pub identity: String,
    /// `agent#action` (or the agent, or what was subscribed or published).
    pub action: String,
    /// What went wrong.
    pub kind: RequestErrorKind,
    source: Option<Source>,
}

impl RequestError {
    /// An error without an underlying cause.
    pub fn new(
        identity: impl Into<String>,
        action: impl Into<String>,
        kind: RequestErrorKind,
    ) -> Self {
        RequestError {
            identity: identity.into(),
            action: action.into(),
            kind,
            source: None,
        }
    }

    /// The same error with `source` as its cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// The kind of failure.
    pub fn kind(&self) -> &RequestErrorKind {
        &self.kind
    }

    /// True when another provisioner holds the node's provisioning lock.
    pub fn is_provisioning_locked(&self) -> bool {
        self.kind == RequestErrorKind::ProvisioningLocked
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on {} failed: {}",
            self.action, self.identity, self.kind
        )?;
        match &self.source {
            Some(s) => write!(f, ": {s}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Tuning of an [`RpcClient`].
#[derive(Debug, Clone)]
pub struct RpcOptions {
    /// The sender identity placed in requests.
    pub identity: String,
    /// The collective requests go to (the main collective; `provisioning` for a provisioner).
    pub collective: String,
    /// Request TTL in seconds (at least 30 for v1).
    pub ttl: u32,
    /// Replies larger than this are dropped unread.
    pub max_reply_size: usize,
}

impl RpcOptions {
    /// Options with the defaults: TTL 60 s, 1 MiB reply limit.
    pub fn new(identity: impl Into<String>, collective: impl Into<String>) -> Self {
        RpcOptions {
            identity: identity.into(),
            collective: collective.into(),
            ttl: 60,
            max_reply_size: 1024 * 1024,
        }
    }
}

impl RpcOptions {
    /// Options from a client configuration: its identity, main collective and TTL.
    pub fn from_config(cfg: &crate::config::ChoriaConfig) -> Self {
        let mut o = RpcOptions::new(cfg.identity.clone(), cfg.main_collective.clone());
        o.ttl = cfg.ttl;
        o
    }
}

/// Why [`RpcClient::connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The configuration is unusable (hosts, security files...).
    #[error(transparent)]
    Config(#[from] crate::config::ChoriaConfigError),
    /// The broker connection failed.
    #[error(transparent)]
    Connection(#[from] crate::connection::ConnectionError),
    /// The reply subscription could not be made.
    #[error(transparent)]
    Rpc(#[from] RequestError),
}

/// Counters of the reply path.
#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    replies: AtomicU64,
    timeouts: AtomicU64,
    no_responders: AtomicU64,
    dropped_malformed: AtomicU64,
    dropped_wrong_request: AtomicU64,
    dropped_wrong_sender: AtomicU64,
    dropped_oversize: AtomicU64,
    unexpected: AtomicU64,
    late_discovery: AtomicU64,
}

/// A snapshot of the reply-path counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplyStats {
    /// Requests published (directed and broadcast).
    pub requests: u64,
    /// Valid replies delivered to a waiting request or discovery.
    pub replies: u64,
    /// Directed requests that timed out.
    pub timeouts: u64,
    /// Directed requests the broker answered with a no-responders status (nothing subscribed
    /// to the node's subject). Not a dropped reply.
    pub no_responders: u64,
    /// Replies dropped because they did not parse, had a wrong protocol string or a bad hash.
    pub dropped_malformed: u64,
    /// Replies whose envelope request id did not match their subject.
    pub dropped_wrong_request: u64,
    /// Directed replies whose envelope sender was not the target.
    pub dropped_wrong_sender: u64,
    /// Replies above the size limit.
    pub dropped_oversize: u64,
    /// Replies for no pending request (late, duplicate or unsolicited).
    pub unexpected: u64,
    /// Discovery replies that came after their discovery had ended (or beyond
    /// [`MAX_DISCOVERED`]): answering nodes the discovery did not count. Included in
    /// `unexpected`.
    pub late_discovery: u64,
}

impl ReplyStats {
    /// All dropped replies together.
    pub fn dropped(&self) -> u64 {
        self.dropped_malformed
            + self.dropped_wrong_request
            + self.dropped_wrong_sender
            + self.dropped_oversize
    }
}

/// What completes a directed request.
enum Delivery {
    /// The target's verified reply.
    Reply(Reply),
    /// The broker's no-responders status for the request's subject.
    NoResponders,
}

enum Pending {
    Directed {
        target: String,
        tx: oneshot::Sender<Delivery>,
    },
    /// Discovery replies go to the discovery unparsed: it checks them itself, so that the
    /// answers of a large fleet never hold up directed replies behind them in the dispatcher.
    Discovery { tx: mpsc::UnboundedSender<Bytes> },
}

type PendingMap = Mutex<HashMap<String, Pending>>;

struct Inner {
    nats: async_nats::Client,
    security: Security,
    opts: RpcOptions,
    reply_prefix: String,
    pending: PendingMap,
    /// The request ids of the latest discoveries, to tell their late replies from others.
    finished_discoveries: Mutex<VecDeque<String>>,
    counters: Counters,
    dispatcher: tokio::task::JoinHandle<()>,
    connected: watch::Sender<bool>,
    connection_poll: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.dispatcher.abort();
        self.connection_poll.abort();
    }
}

/// A cheap-to-clone handle for Choria RPC over one shared connection.
#[derive(Clone)]
pub struct RpcClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("opts", &self.inner.opts)
            .field("reply_prefix", &self.inner.reply_prefix)
            .finish_non_exhaustive()
    }
}

/// Removes a pending entry when the waiting future finishes or is dropped, so timed-out and
/// cancelled requests leave nothing behind.
struct PendingGuard<'a> {
    map: &'a PendingMap,
    id: String,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(self.map).remove(&self.id);
    }
}

fn lock(m: &PendingMap) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
    // A panic while holding the lock cannot leave the map inconsistent (single inserts and
    // removes), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn action_label(agent: &str, payload: &[u8]) -> String {
    // Only used for error messages: pull the action out of the RPC body without a full parse.
    #[derive(serde::Deserialize)]
    struct A<'a> {
        #[serde(borrow)]
        action: Option<&'a str>,
    }
    match serde_json::from_slice::<A<'_>>(payload) {
        Ok(A { action: Some(a) }) => format!("{agent}#{a}"),
        _ => agent.to_string(),
    }
}

/// The data of a reply body on statuscode 0; a typed error naming `identity` and the action
/// otherwise.
fn reply_data(
    identity: &str,
    label: impl Fn() -> String,
    body: &[u8],
) -> Result<serde_json::Value, RequestError> {
    let rpc = RpcReply::parse(body).map_err(|e| {
        RequestError::new(identity, label(), RequestErrorKind::BadReply).with_source(e)
    })?;
    if rpc.statuscode != StatusCode::Ok {
        return Err(RequestError::new(
            identity,
            label(),
            RequestErrorKind::from_status(rpc.statuscode, rpc.statusmsg),
        ));
    }
    Ok(rpc.data)
}

impl RpcClient {
    /// Start the client on an open connection: subscribes once to this caller's reply
    /// subjects and starts the reply dispatcher.
    pub async fn new(
        nats: async_nats::Client,
        security: Security,
        opts: RpcOptions,
    ) -> Result<Self, RequestError> {
        let reply_prefix = protocol::reply_prefix(&opts.collective, security.caller_id());
        let transport = |e: Source| {
            RequestError::new("*", "reply subscription", RequestErrorKind::Transport).with_source(e)
        };
        let sub = nats
            .subscribe(format!("{reply_prefix}.>"))
            .await
            .map_err(|e| transport(e.into()))?;
        // The subscription must be registered on the server before the first request goes out.
        crate::connection::round_trip(&nats, ROUND_TRIP_TIMEOUT)
            .await
            .map_err(|e| transport(e.into()))?;
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let weak = weak.clone();
            let dispatcher = tokio::spawn({
                let weak = weak.clone();
                async move {
                    dispatch(weak, sub).await;
                }
            });
            let (connected, _) = watch::channel(is_connected(&nats));
            let connection_poll = tokio::spawn(poll_connection(weak));
            Inner {
                nats,
                security,
                opts,
                reply_prefix,
                pending: Mutex::new(HashMap::new()),
                finished_discoveries: Mutex::new(VecDeque::new()),
                counters: Counters::default(),
                dispatcher,
                connected,
                connection_poll,
            }
        });
        Ok(RpcClient { inner })
    }

    /// Everything from a configuration (with the provisioner overrides already applied):
    /// security from its provider, one connection from its middleware hosts and TLS
    /// settings, options from its identity, main collective and TTL.
    pub async fn connect(cfg: &crate::config::ChoriaConfig) -> Result<Self, SetupError> {
        let security = cfg.security()?;
        let settings = crate::connection::ConnectionSettings::from_config(cfg)?;
        let nats = crate::connection::connect(&settings).await?;
        Ok(Self::new(nats, security, RpcOptions::from_config(cfg)).await?)
    }

    /// The largest reply (and lifecycle event) accepted, in bytes.
    pub fn max_reply_size(&self) -> usize {
        self.inner.opts.max_reply_size
    }

    /// The underlying NATS client (for JetStream, leader election...).
    pub fn nats(&self) -> &async_nats::Client {
        &self.inner.nats
    }

    /// Whether the broker connection is up right now.
    pub fn is_connected(&self) -> bool {
        is_connected(&self.inner.nats)
    }

    /// Waits until the broker connection is up or `deadline` passes; answers whether it is up.
    /// Looks every [`RECONNECT_POLL`] while it is down, so a connected client never waits.
    async fn wait_connected(&self, deadline: Instant) -> bool {
        loop {
            if self.is_connected() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            tokio::time::sleep((deadline - now).min(RECONNECT_POLL)).await;
        }
    }

    /// A watcher of the broker connection: `true` while connected. It follows the connection
    /// within half a second and changes only when the state does.
    pub fn connection_watch(&self) -> watch::Receiver<bool> {
        self.inner.connected.subscribe()
    }

    /// The options in use.
    pub fn options(&self) -> &RpcOptions {
        &self.inner.opts
    }

    /// The caller id requests carry.
    pub fn caller_id(&self) -> &str {
        self.inner.security.caller_id()
    }

    /// A snapshot of the reply-path counters.
    pub fn stats(&self) -> ReplyStats {
        let c = &self.inner.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReplyStats {
            requests: g(&c.requests),
            replies: g(&c.replies),
            timeouts: g(&c.timeouts),
            no_responders: g(&c.no_responders),
            dropped_malformed: g(&c.dropped_malformed),
            dropped_wrong_request: g(&c.dropped_wrong_request),
            dropped_wrong_sender: g(&c.dropped_wrong_sender),
            dropped_oversize: g(&c.dropped_oversize),
            unexpected: g(&c.unexpected),
            late_discovery: g(&c.late_discovery),
        }
    }

    /// Number of requests currently waiting for replies.
    pub fn pending(&self) -> usize {
        lock(&self.inner.pending).len()
    }

    fn encode(
        &self,
        agent: &str,
        payload: &[u8],
        filter: &Filter,
        id: &str,
        reply_to: &str,
        identity: &str,
    ) -> Result<Bytes, RequestError> {
        protocol::encode_request(
            &self.inner.security,
            &OutgoingRequest {
                agent,
                collective: &self.inner.opts.collective,
                payload,
                filter,
                ttl: self.inner.opts.ttl,
                sender: &self.inner.opts.identity,
                id,
                reply_to,
            },
            SystemTime::now(),
        )
        .map_err(|source| {
            RequestError::new(
                identity,
                action_label(agent, payload),
                RequestErrorKind::Encode,
            )
            .with_source(source)
        })
    }

    /// Publish `bytes` to `subject`, with `reply` as the NATS reply subject when given (the
    /// broker then answers with a no-responders status if nothing is subscribed to `subject`).
    async fn publish(
        &self,
        subject: String,
        reply: Option<String>,
        bytes: Bytes,
        identity: &str,
        action: impl FnOnce() -> String,
    ) -> Result<(), RequestError> {
        if !self.is_connected() {
            return Err(RequestError::new(
                identity,
                action(),
                RequestErrorKind::NotConnected,
            ));
        }
        let nats = &self.inner.nats;
        match reply {
            Some(reply) => nats.publish_with_reply(subject, reply, bytes).await,
            None => nats.publish(subject, bytes).await,
        }
        .map_err(|e| {
            RequestError::new(identity, action(), RequestErrorKind::Transport).with_source(e)
        })?;
        self.inner.counters.requests.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Send `payload` (an RPC body) to `agent` on one node and wait up to `timeout` for that
    /// node's verified reply. Fails at once with [`RequestErrorKind::NoResponders`] when the broker
    /// reports that nothing is subscribed to the node's subject.
    pub async fn request(
        &self,
        identity: &str,
        agent: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Reply, RequestError> {
        let deadline = Instant::now() + timeout;
        // While the client reconnects, the request waits for the connection (within its own
        // timeout) rather than failing at once: a node's restart sent a second after its broker
        // went away is not lost to a retry policy that runs out before the reconnection.
        self.wait_connected(deadline).await;
        let id = protocol::new_request_id();
        let reply_to = format!("{}.{id}", self.inner.reply_prefix);
        let filter = Filter::default();
        let bytes = self.encode(agent, payload, &filter, &id, &reply_to, identity)?;
        let (tx, rx) = oneshot::channel();
        lock(&self.inner.pending).insert(
            id.clone(),
            Pending::Directed {
                target: identity.to_string(),
                tx,
            },
        );
        let _guard = PendingGuard {
            map: &self.inner.pending,
            id,
        };
        self.publish(
            protocol::directed_subject(&self.inner.opts.collective, identity),
            Some(reply_to),
            bytes,
            identity,
            || action_label(agent, payload),
        )
        .await?;
        let kind = match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(Delivery::Reply(reply))) => return Ok(reply),
            Ok(Ok(Delivery::NoResponders)) => RequestErrorKind::NoResponders,
            Ok(Err(_)) => RequestErrorKind::Closed,
            Err(_) => {
                self.inner.counters.timeouts.fetch_add(1, Ordering::Relaxed);
                RequestErrorKind::Timeout
            }
        };
        Err(RequestError::new(
            identity,
            action_label(agent, payload),
            kind,
        ))
    }

    /// Call `agent#action` on one node with `data`, returning the reply data on statuscode 0
    /// and a typed error otherwise.
    pub async fn call<T: Serialize>(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        data: &T,
        timeout: Duration,
    ) -> Result<serde_json::Value, RequestError> {
        let body = self
            .reply_body(identity, agent, action, data, timeout)
            .await?;
        reply_data(identity, || format!("{agent}#{action}"), &body)
    }

    /// The body of `agent#action`'s reply from one node, its request encoded from `data`.
    async fn reply_body<T: Serialize>(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        data: &T,
        timeout: Duration,
    ) -> Result<Vec<u8>, RequestError> {
        let body = crate::mcorpc::encode_request(agent, action, data).map_err(|e| {
            RequestError::new(
                identity,
                format!("{agent}#{action}"),
                RequestErrorKind::Encode,
            )
            .with_source(e)
        })?;
        Ok(self.request(identity, agent, &body, timeout).await?.body)
    }

    /// [`RpcClient::call`] with the reply's data read as `O`: a successful reply is read
    /// straight into `O` ([`RpcReply::parse_ok_as`]); anything else goes the way of
    /// [`RpcClient::call`] and reading `O` from its value, with the same errors.
    pub async fn call_as<T: Serialize, O: serde::de::DeserializeOwned>(
        &self,
        identity: &str,
        agent: &str,
        action: &str,
        data: &T,
        timeout: Duration,
    ) -> Result<O, RequestError> {
        let label = || format!("{agent}#{action}");
        let body = self
            .reply_body(identity, agent, action, data, timeout)
            .await?;
        if let Some(out) = RpcReply::parse_ok_as(&body) {
            return Ok(out);
        }
        let data = reply_data(identity, label, &body)?;
        O::deserialize(&data).map_err(|e| {
            RequestError::new(identity, label(), RequestErrorKind::BadReply).with_source(e)
        })
    }

    /// Broadcast `discovery#ping` with `filter` and collect the identities that answer
    /// (de-duplicated, in arrival order). Ends at `timeout`, or, with `window`, that long after
    /// the last reply if that comes first (go-choria's sliding window).
    ///
    /// With a window, a discovery still receiving replies at `timeout` goes on until they pause
    /// for the window, for at most [`DISCOVERY_MAX_TIME`]: a fleet too large to answer within
    /// the timeout (hundreds of thousands of nodes) is found whole rather than cut off. At most
    /// [`MAX_DISCOVERED`] identities are kept. Replies that come after the end (or beyond that
    /// number) are counted in [`ReplyStats::late_discovery`].
    pub async fn discover(
        &self,
        filter: &Filter,
        timeout: Duration,
        window: Option<Duration>,
    ) -> Result<Vec<String>, RequestError> {
        Ok(self
            .discover_compact(filter, timeout, window)
            .await?
            .to_vec())
    }

    /// [`RpcClient::discover`], the identities held in one buffer ([`Discovered`]): a million
    /// of them cost their bytes and four more each, not an allocation each.
    pub async fn discover_compact(
        &self,
        filter: &Filter,
        timeout: Duration,
        window: Option<Duration>,
    ) -> Result<Discovered, RequestError> {
        let mut found = Collected::default();
        self.discover_into(filter, timeout, window, &mut found)
            .await?;
        Ok(found.found)
    }

    /// One discovery whose answers are added to `found` (each identity once across calls).
    async fn discover_into(
        &self,
        filter: &Filter,
        timeout: Duration,
        window: Option<Duration>,
        collected: &mut Collected,
    ) -> Result<(), RequestError> {
        let start = Instant::now();
        let hard_deadline = start + timeout;
        let id = protocol::new_request_id();
        let reply_to = format!("{}.{id}", self.inner.reply_prefix);
        let bytes = self.encode(
            "discovery",
            protocol::DISCOVERY_PING,
            filter,
            &id,
            &reply_to,
            "*",
        )?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        lock(&self.inner.pending).insert(id.clone(), Pending::Discovery { tx });
        {
            let mut finished = self
                .inner
                .finished_discoveries
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if finished.len() >= 16 {
                finished.pop_front();
            }
            finished.push_back(id.clone());
        }
        let id_text = id.clone();
        let _guard = PendingGuard {
            map: &self.inner.pending,
            id,
        };
        let extended_deadline = start + timeout.max(DISCOVERY_MAX_TIME);
        // No NATS reply subject: a broadcast has many responders, and a no-responders status
        // would only end a discovery that finds nothing early.
        self.publish(
            protocol::broadcast_subject(&self.inner.opts.collective, "discovery"),
            None,
            bytes,
            "*",
            || "discovery#ping".to_string(),
        )
        .await?;
        let Collected {
            found,
            seen,
            hasher,
        } = collected;
        let before = found.len();
        let mut deadline = hard_deadline;
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(payload)) => {
                    let Some(identity) =
                        discovery_sender(&self.inner, &reply_to, &id_text, &payload)
                    else {
                        continue;
                    };
                    if found.len() >= MAX_DISCOVERED {
                        self.inner
                            .counters
                            .late_discovery
                            .fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    let hash = hasher.hash_one(identity.as_str());
                    if seen.find(hash, |&i| found.get(i) == identity).is_none() {
                        let at = found.ends.len() as u32;
                        if found.push(&identity) {
                            seen.insert_unique(hash, at, |&i| hasher.hash_one(found.get(i)));
                        } else {
                            // Beyond what one discovery keeps.
                            self.inner
                                .counters
                                .late_discovery
                                .fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Some(w) = window {
                        // Past the timeout only while replies keep coming.
                        deadline = (Instant::now() + w).min(extended_deadline);
                    }
                }
                Ok(None) => {
                    return Err(RequestError::new(
                        "*",
                        "discovery#ping",
                        RequestErrorKind::Closed,
                    ))
                }
                Err(_) => break,
            }
        }
        tracing::debug!(
            nodes = found.len() - before,
            elapsed_ms = start.elapsed().as_millis() as u64,
            "discovery finished"
        );
        Ok(())
    }

    /// The provisioner's discovery: agent filter `choria_provision`, 2 s timeout, 300 ms
    /// sliding window (so at most [`DISCOVERY_MAX_TIME`] while replies keep coming).
    pub async fn discover_provisionable(&self) -> Result<Discovered, RequestError> {
        self.discover_provisionable_in(1).await
    }

    /// [`RpcClient::discover_provisionable`] in `shards` discoveries one after another, each
    /// for the identities of one [`Filter::identity_shard`]: a fleet of a million answers in
    /// bursts of a tenth, so the replies waiting to be read stay a tenth as many. The shards
    /// split every identity between them; an identity that answers more than one (a forged
    /// reply) is still kept once. Below 2 shards, one discovery.
    pub async fn discover_provisionable_in(
        &self,
        shards: usize,
    ) -> Result<Discovered, RequestError> {
        let mut collected = Collected::default();
        // Below 2 shards there is no shard filter: one discovery of every identity.
        for shard in 0..shards.max(1) {
            self.discover_part(Filter::identity_shard(shard, shards), &mut collected)
                .await?;
        }
        Ok(collected.found)
    }

    /// [`RpcClient::discover_provisionable`] for a fleet of unknown size (a daemon's first
    /// discovery), without a burst of every node's reply at once: the first of `max_shards`
    /// shards ([`Filter::identity_shard`]) alone, then the rest in one discovery when that
    /// shard's nodes times `max_shards` is at most `shard_size`, else one by one. A small fleet
    /// is found in two discoveries; a million nodes answer in bursts of a tenth.
    pub async fn discover_provisionable_probed(
        &self,
        shard_size: usize,
        max_shards: usize,
    ) -> Result<Discovered, RequestError> {
        if max_shards < 2 {
            return self.discover_provisionable_in(1).await;
        }
        let mut collected = Collected::default();
        self.discover_part(Filter::identity_shard(0, max_shards), &mut collected)
            .await?;
        let estimate = collected.found.len().saturating_mul(max_shards);
        if estimate <= shard_size {
            self.discover_part(
                Filter::identity_shards(1..max_shards, max_shards),
                &mut collected,
            )
            .await?;
        } else {
            tracing::debug!(
                found = collected.found.len(),
                estimate,
                shards = max_shards,
                "a large fleet: discovering the rest shard by shard"
            );
            for shard in 1..max_shards {
                self.discover_part(Filter::identity_shard(shard, max_shards), &mut collected)
                    .await?;
            }
        }
        Ok(collected.found)
    }

    /// One discovery of the provisioner's (agent `choria_provision`, 2 s timeout, 300 ms
    /// sliding window), limited to the identities `identity` matches when there is one.
    async fn discover_part(
        &self,
        identity: Option<String>,
        collected: &mut Collected,
    ) -> Result<(), RequestError> {
        let mut filter = Filter::with_agent("choria_provision");
        filter.identity.extend(identity);
        self.discover_into(
            &filter,
            Duration::from_secs(2),
            Some(Duration::from_millis(300)),
            collected,
        )
        .await
    }

    /// Publish a lifecycle event (Choria format) to its subject.
    pub async fn publish_event(&self, event: &LifecycleEvent) -> Result<(), RequestError> {
        let label = || format!("lifecycle {}", event.event_type());
        let body = event.to_choria_json().map_err(|e| {
            RequestError::new(&event.identity, label(), RequestErrorKind::Encode).with_source(e)
        })?;
        self.publish(
            event.subject(),
            None,
            Bytes::from(body),
            &event.identity,
            label,
        )
        .await?;
        self.inner.nats.flush().await.map_err(|e| {
            RequestError::new(&event.identity, label(), RequestErrorKind::Transport).with_source(e)
        })
    }

    /// Publish this client's `startup` event with component `component` (the provisioner uses
    /// `provisioner`) and `version`, identity from the options.
    pub async fn publish_startup(
        &self,
        component: &str,
        version: &str,
    ) -> Result<(), RequestError> {
        let ev = LifecycleEvent::startup(&self.inner.opts.identity, component, version);
        self.publish_event(&ev).await
    }

    /// Subscribe to `choria.lifecycle.event.<event_type>.<component>`, optionally in a queue
    /// group. Events in either format are parsed; unparsable ones are logged and skipped.
    pub async fn subscribe_lifecycle(
        &self,
        event_type: &str,
        component: &str,
        queue_group: Option<&str>,
    ) -> Result<LifecycleSubscription, RequestError> {
        LifecycleSubscription::subscribe(
            &self.inner.nats,
            event_type,
            component,
            queue_group,
            self.inner.opts.max_reply_size,
        )
        .await
    }
}

/// A subscription yielding parsed lifecycle events.
#[derive(Debug)]
pub struct LifecycleSubscription {
    sub: async_nats::Subscriber,
    max_size: usize,
    /// When a dropped event was last logged, and how many were dropped since.
    dropped_log: (Option<Instant>, u64),
}

/// At most one line about dropped (oversized or unparsable) events in this long.
const DROPPED_EVENT_LOG_EVERY: Duration = Duration::from_secs(10);

impl LifecycleSubscription {
    /// Subscribe on `nats` to `choria.lifecycle.event.<event_type>.<component>` (in
    /// `queue_group` when given), dropping events larger than `max_size` bytes. The connection
    /// may be one of its own (see
    /// [`EVENT_SUBSCRIPTION_CAPACITY`](crate::connection::EVENT_SUBSCRIPTION_CAPACITY)).
    pub async fn subscribe(
        nats: &async_nats::Client,
        event_type: &str,
        component: &str,
        queue_group: Option<&str>,
        max_size: usize,
    ) -> Result<Self, RequestError> {
        let subject = format!("choria.lifecycle.event.{event_type}.{component}");
        let res = match queue_group {
            Some(q) => nats.queue_subscribe(subject.clone(), q.to_string()).await,
            None => nats.subscribe(subject.clone()).await,
        };
        let transport = |e: Source| {
            RequestError::new(
                "*",
                format!("subscribe {subject}"),
                RequestErrorKind::Transport,
            )
            .with_source(e)
        };
        let sub = res.map_err(|e| transport(e.into()))?;
        crate::connection::round_trip(nats, ROUND_TRIP_TIMEOUT)
            .await
            .map_err(|e| transport(e.into()))?;
        Ok(LifecycleSubscription {
            sub,
            max_size,
            dropped_log: (None, 0),
        })
    }

    /// The next event that parses; `None` when the subscription ends. Oversized and
    /// unparsable events are dropped, with one line for them at most every ten seconds.
    pub async fn next(&mut self) -> Option<ReceivedEvent> {
        while let Some(msg) = self.sub.next().await {
            let why = if msg.payload.len() > self.max_size {
                format!(
                    "{} bytes, over the {} allowed",
                    msg.payload.len(),
                    self.max_size
                )
            } else {
                match LifecycleEvent::parse(&msg.payload) {
                    Ok(ev) => return Some(ev),
                    Err(e) => e.to_string(),
                }
            };
            let (last, count) = &mut self.dropped_log;
            *count += 1;
            if last.is_none_or(|t| t.elapsed() >= DROPPED_EVENT_LOG_EVERY) {
                *last = Some(Instant::now());
                tracing::warn!(
                    subject = %msg.subject,
                    "dropped {} lifecycle events that were oversized or unparsable, the latest: {why}",
                    std::mem::take(count)
                );
            }
        }
        None
    }

    /// Stop receiving.
    pub async fn unsubscribe(mut self) {
        // Unsubscribing a dead connection has nothing left to clean up.
        let _ = self.sub.unsubscribe().await;
    }
}

fn is_connected(nats: &async_nats::Client) -> bool {
    nats.connection_state() == async_nats::connection::State::Connected
}

/// Feeds [`RpcClient::connection_watch`] until the client is dropped (which aborts this task).
async fn poll_connection(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(CONNECTION_POLL).await;
        // Not upgradable only while the client is still being built.
        let Some(inner) = inner.upgrade() else {
            continue;
        };
        let up = is_connected(&inner.nats);
        inner
            .connected
            .send_if_modified(|was| std::mem::replace(was, up) != up);
    }
}

/// How often a request waiting for the broker connection looks at it.
const RECONNECT_POLL: Duration = Duration::from_millis(50);

async fn dispatch(inner: std::sync::Weak<Inner>, mut sub: async_nats::Subscriber) {
    while let Some(msg) = sub.next().await {
        // Not upgradable only while the client is still being built (it aborts this task when
        // dropped), so keep going.
        let Some(inner) = inner.upgrade() else {
            continue;
        };
        handle_reply(&inner, &msg);
    }
    // The subscription ended (client closed): wake every waiter with a closed channel.
    if let Some(inner) = inner.upgrade() {
        lock(&inner.pending).clear();
    }
}

fn handle_reply(inner: &Inner, msg: &async_nats::Message) {
    let c = &inner.counters;
    let count = |a: &AtomicU64| {
        a.fetch_add(1, Ordering::Relaxed);
    };
    let subject = msg.subject.as_str();
    let Some(subject_id) = subject
        .strip_prefix(inner.reply_prefix.as_str())
        .and_then(|s| s.strip_prefix('.'))
    else {
        count(&c.unexpected);
        return;
    };
    if let Some(status) = msg.status {
        // A status message from the broker, not a Choria reply: never parsed as one.
        handle_status(inner, subject, subject_id, status, msg.payload.is_empty());
        return;
    }
    if msg.payload.len() > inner.opts.max_reply_size {
        count(&c.dropped_oversize);
        tracing::warn!(
            subject,
            size = msg.payload.len(),
            limit = inner.opts.max_reply_size,
            "dropping oversized reply"
        );
        return;
    }
    // Cheap check first: replies for requests that already finished are common (late
    // discovery answers, timeouts) and need no parsing. A discovery's replies are handed to it
    // whole.
    let known = match lock(&inner.pending).get(subject_id) {
        None => false,
        Some(Pending::Discovery { tx }) => {
            // A discovery that has just ended drops what it no longer reads (the payload is
            // shared, not copied).
            let _ = tx.send(msg.payload.clone());
            return;
        }
        Some(Pending::Directed { .. }) => true,
    };
    if !known {
        count(&c.unexpected);
        let late = inner
            .finished_discoveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|id| id == subject_id);
        if late {
            count(&c.late_discovery);
        }
        tracing::debug!(subject, "dropping reply for no pending request");
        return;
    }
    let Some(reply) = checked_reply(inner, subject, subject_id, &msg.payload) else {
        return;
    };
    let mut pending = lock(&inner.pending);
    match pending.get(subject_id) {
        Some(Pending::Directed { target, .. }) => {
            if *target != reply.sender {
                let target = target.clone();
                drop(pending);
                count(&c.dropped_wrong_sender);
                tracing::warn!(
                    subject,
                    sender = %reply.sender,
                    expected = %target,
                    "dropping reply from a node that was not asked"
                );
                return;
            }
            if let Some(Pending::Directed { tx, .. }) = pending.remove(subject_id) {
                drop(pending);
                count(&c.replies);
                // The waiter may have timed out in the meantime; nothing to do then.
                let _ = tx.send(Delivery::Reply(reply));
            }
        }
        _ => count(&c.unexpected),
    }
}

/// The reply in `payload`, received on `subject` for request `id`, when it parses, speaks this
/// client's protocol version and answers that request; anything else is counted and dropped
/// with a log line. The one check of directed and discovery replies alike.
fn checked_reply(inner: &Inner, subject: &str, id: &str, payload: &[u8]) -> Option<Reply> {
    let c = &inner.counters;
    let reply = match protocol::parse_reply(payload) {
        Ok(r) => r,
        Err(e) => {
            c.dropped_malformed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(subject, error = %e, "dropping malformed reply");
            return None;
        }
    };
    if reply.version != inner.security.version() {
        c.dropped_malformed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(subject, sender = %reply.sender, "dropping reply in the wrong protocol version");
        return None;
    }
    if reply.request_id != id {
        c.dropped_wrong_request.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            subject,
            sender = %reply.sender,
            request_id = %reply.request_id,
            "dropping reply whose request id does not match its subject"
        );
        return None;
    }
    Some(reply)
}

/// What discoveries have found so far: the identities in arrival order, and an index of them
/// (positions in `found`, hashed by identity) to drop repeats: each identity is held once,
/// however many nodes answer with it.
#[derive(Default)]
struct Collected {
    found: Discovered,
    seen: hashbrown::HashTable<u32>,
    hasher: std::collections::hash_map::RandomState,
}

/// The identities a discovery found, each once, in arrival order: their bytes in one buffer and
/// where each ends. A million 25-byte identities take 29 MB in two allocations, where a
/// `Vec<String>` takes about 56 MB in a million and one (which the allocator keeps long after).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Discovered {
    text: String,
    ends: Vec<u32>,
}

impl Discovered {
    /// How many identities.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The identity at `i` (empty past the end).
    pub fn get(&self, i: u32) -> &str {
        let i = i as usize;
        let Some(&end) = self.ends.get(i) else {
            return "";
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text
            .get(start as usize..end as usize)
            .unwrap_or_default()
    }

    /// The identities in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.ends.len() as u32).map(|i| self.get(i))
    }

    /// Adds `identity`; false (nothing added) once the buffer would pass 4 GiB.
    fn push(&mut self, identity: &str) -> bool {
        let Ok(end) = u32::try_from(self.text.len() + identity.len()) else {
            return false;
        };
        self.text.push_str(identity);
        self.ends.push(end);
        true
    }

    /// The identities as strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_string).collect()
    }
}

/// The sender of a reply to discovery `id` ([`checked_reply`]), counted as a reply.
fn discovery_sender(inner: &Inner, subject: &str, id: &str, payload: &[u8]) -> Option<String> {
    let reply = checked_reply(inner, subject, id, payload)?;
    inner.counters.replies.fetch_add(1, Ordering::Relaxed);
    Some(
        reply
            .transport_sender
            .filter(|s| !s.is_empty())
            .unwrap_or(reply.sender),
    )
}

/// A broker status message on a reply subject. nats-server sends a no-responders status (503,
/// no payload) to a directed request's NATS reply subject when nothing is subscribed to the
/// node's subject: that completes the pending request at once. Any other status (or one for
/// no pending directed request) is counted as unexpected.
fn handle_status(
    inner: &Inner,
    subject: &str,
    subject_id: &str,
    status: async_nats::StatusCode,
    empty: bool,
) {
    let c = &inner.counters;
    if status == async_nats::StatusCode::NO_RESPONDERS && empty {
        let mut pending = lock(&inner.pending);
        if matches!(pending.get(subject_id), Some(Pending::Directed { .. })) {
            if let Some(Pending::Directed { target, tx }) = pending.remove(subject_id) {
                drop(pending);
                c.no_responders.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    subject,
                    identity = %target,
                    "no responders: nothing is subscribed to the node's subject"
                );
                // The waiter may have timed out in the meantime; nothing to do then.
                let _ = tx.send(Delivery::NoResponders);
            }
            return;
        }
    }
    c.unexpected.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        subject,
        status = %status,
        "dropping a status message for no pending directed request"
    );
}

#[cfg(test)]
mod tests {
    use super::Discovered;

    #[test]
    fn discovered_identities_come_back_in_order_from_one_buffer() {
        let mut d = Discovered::default();
        assert!(d.is_empty());
        assert_eq!(d.get(0), "");
        for id in ["n1.example.net", "", "node-two", "ü.example"] {
            assert!(d.push(id));
        }
        assert_eq!(d.len(), 4);
        assert_eq!(
            d.iter().collect::<Vec<_>>(),
            ["n1.example.net", "", "node-two", "ü.example"]
        );
        assert_eq!(d.get(2), "node-two");
        assert_eq!(d.get(4), "");
        assert_eq!(d.to_vec()[3], "ü.example");
    }
}
