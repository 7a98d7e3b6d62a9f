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
//! [`RequestErrorKind::NoResponders`] without waiting for its timeout. Broadcasts are published
//! without one: many nodes answer them, and an empty collective is an empty discovery.

mod events;
mod replies;

pub use events::LifecycleSubscription;
pub use replies::Discovered;
use replies::*;

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
