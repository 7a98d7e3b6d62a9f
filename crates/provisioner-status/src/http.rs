//! The monitoring HTTP server: `/metrics`, `/healthz` and `/readyz`, and with a [`Monitor`] the
//! JSON API (`/api/v1/...`), the status page (`/`) and each node's page (`/nodes/{identity}`).
//!
//! The listener is exposed to whoever can reach the port, so it is bounded:
//!
//! - a client must send its whole request head within [`HEADER_READ_TIMEOUT`] of the connection
//!   being ready for one (at connect, and again after every response on a kept-alive connection),
//!   so a slowloris client or a silent connection is closed after 5 seconds;
//! - a connection that has not started a request for [`IDLE_TIMEOUT`] is closed, whatever state
//!   it is in (a client that stopped reading its response, a body that never ends), and no
//!   connection lives longer than [`MAX_CONNECTION_AGE`] (it is closed gracefully, then dropped);
//! - at most [`MAX_CONNECTIONS`] connections are open. A new connection over the cap closes the
//!   oldest connection that is not being answered, so a flood of idle connections cannot keep a
//!   scraper out; when every connection is being answered the new one is closed at once;
//! - an `accept` error (out of file descriptors, say) is not retried in a spin: the loop sleeps
//!   from 10 ms doubling to 1 s while the errors go on, and logs at most one line a second.
//!
//! An unspecified IPv6 address (`[::]`, what an empty `monitor_address` means) is bound with
//! `IPV6_V6ONLY` off, so IPv4 and IPv6 clients both reach it as with Go's `:port`; a host without
//! IPv6 gets `0.0.0.0` instead.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::Monitor;
use provisioner_metrics::{Metrics, Role};

/// How long a client has to send a complete request head.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection that has not started a request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a connection is kept, however busy.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(120);
/// The most connections open at once, over every bound address.
pub const MAX_CONNECTIONS: usize = 256;
/// The first sleep after a failed `accept`.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The longest sleep between failing `accept`s.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// At most one log line per this interval for failing `accept`s.
const ACCEPT_LOG_INTERVAL: Duration = Duration::from_secs(1);
/// At most one log line per this interval for connections closed at the cap.
const CAP_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// How long a new connection over the cap waits for the connection it displaced to be gone.
const EVICT_WAIT: Duration = Duration::from_millis(250);
/// The listen backlog.
const BACKLOG: i32 = 1024;

/// The monitoring server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding the monitoring port failed.
    #[error("cannot listen for monitoring on {addr}: {source}")]
    Bind {
        /// The address tried.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// A running monitoring server: its bound addresses, and its tasks (the accept loops and one
/// task per connection), which end when the `shutdown` token given to [`serve`] is cancelled.
#[derive(Debug)]
pub struct Serving {
    addrs: Vec<SocketAddr>,
    tasks: TaskTracker,
}

impl Serving {
    /// The first bound address (the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Waits until every task of the server has ended (after its shutdown token is cancelled).
    pub async fn stopped(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Bind `addr` and serve the endpoints until `shutdown` is cancelled. Returns once listening;
/// the server's tasks are tracked by the returned [`Serving`], whose `stopped` waits for them.
///
/// `[::]` (the unspecified IPv6 address) listens on every interface for IPv4 and IPv6 clients
/// alike, or on `0.0.0.0` when the host has no IPv6; the address returned says which.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError> {
    serve_all(&[addr], metrics, shutdown).await
}

/// [`serve_all`] with the API and the status pages of `monitor` as well.
pub async fn serve_monitor(
    addrs: &[SocketAddr],
    monitor: Monitor,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError> {
    serve_with(addrs, Arc::new(monitor), shutdown).await
}

/// [`serve`] on several addresses at once, sharing one connection cap. Either every address is
/// bound or none is served; the bound addresses are in the same order. `addrs` must not be
/// empty.
pub async fn serve_all(
    addrs: &[SocketAddr],
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError> {
    serve_with(addrs, Arc::new(Monitor::metrics_only(metrics)), shutdown).await
}

async fn serve_with(
    addrs: &[SocketAddr],
    monitor: Arc<Monitor>,
    shutdown: CancellationToken,
) -> Result<Serving, ServeError> {
    let mut listeners = Vec::with_capacity(addrs.len());
    for &addr in addrs {
        listeners.push(bind(addr)?);
    }
    let shared = Arc::new(Shared {
        monitor,
        shutdown,
        slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        open: Mutex::new(BTreeMap::new()),
        next_id: AtomicU64::new(0),
        displaced: Mutex::new(LogLimiter::new(CAP_LOG_INTERVAL)),
        tasks: TaskTracker::new(),
    });
    let mut bound = Vec::with_capacity(listeners.len());
    for (listener, local) in listeners {
        bound.push(local);
        shared
            .tasks
            .spawn(accept_loop(listener, local, Arc::clone(&shared)));
    }
    Ok(Serving {
        addrs: bound,
        tasks: shared.tasks.clone(),
    })
}

/// Binds one address; `[::]` dual-stack, falling back to `0.0.0.0` without IPv6.
fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServeError> {
    let dual_stack = matches!(addr, SocketAddr::V6(a) if a.ip().is_unspecified());
    let listener = match listen(addr, dual_stack) {
        Ok(l) => l,
        // Without IPv6 the socket cannot be made or the address is not available; a port in
        // use or not permitted would fail the same way on IPv4, so that is reported as it is.
        Err(e)
            if dual_stack
                && !matches!(
                    e.kind(),
                    std::io::ErrorKind::AddrInUse | std::io::ErrorKind::PermissionDenied
                ) =>
        {
            let v4 = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), addr.port());
            tracing::info!("monitoring: cannot listen on {addr} ({e}), using {v4} (IPv4 only)");
            listen(v4, false).map_err(|source| ServeError::Bind { addr: v4, source })?
        }
        Err(source) => return Err(ServeError::Bind { addr, source }),
    };
    let local = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    Ok((listener, local))
}

fn listen(addr: SocketAddr, dual_stack: bool) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if dual_stack {
        socket.set_only_v6(false)?;
    }
    // As tokio's own bind: a restarted provisioner can bind while old connections linger.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// What every accept loop and connection of one server shares.
struct Shared {
    monitor: Arc<Monitor>,
    shutdown: CancellationToken,
    /// One permit per open connection, held by its task until the socket is closed.
    slots: Arc<Semaphore>,
    /// The open connections by age (ids grow), to pick one to close at the cap.
    open: Mutex<BTreeMap<u64, OpenConn>>,
    next_id: AtomicU64,
    displaced: Mutex<LogLimiter>,
    /// The accept loops and the connection tasks.
    tasks: TaskTracker,
}

struct OpenConn {
    close: CancellationToken,
    /// Requests being answered now.
    busy: Arc<AtomicUsize>,
}

impl Shared {
    /// Closes the oldest connection that is not being answered; false when every one is.
    fn displace_oldest_idle(&self) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let victim = open
            .iter()
            .find(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
            .map(|(id, _)| *id);
        match victim.and_then(|id| open.remove(&id)) {
            Some(c) => {
                c.close.cancel();
                true
            }
            None => false,
        }
    }

    fn note_at_cap(&self, displaced: bool) {
        let mut l = self.displaced.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = l.hit(Instant::now()) {
            let what = if displaced {
                "closed the oldest idle connection for a new one"
            } else {
                "refused a new connection, every open one being answered"
            };
            tracing::warn!(
                "monitoring: at the limit of {MAX_CONNECTIONS} open connections, {what} \
                 ({n} connection(s) closed at the limit since the last report); something is \
                 holding connections open"
            );
        }
    }

    fn deregister(&self, id: u64) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(&id);
    }
}

async fn accept_loop(listener: TcpListener, local: SocketAddr, shared: Arc<Shared>) {
    let mut backoff = Backoff::new();
    let mut errors = LogLimiter::new(ACCEPT_LOG_INTERVAL);
    loop {
        let accepted = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((s, _)) => {
                backoff.reset();
                s
            }
            Err(e) => {
                let delay = backoff.next_delay();
                if let Some(n) = errors.hit(Instant::now()) {
                    tracing::warn!(
                        "monitoring: accepting a connection on {local} failed: {e} \
                         ({n} failure(s) since the last report; retrying in {delay:?}, backing \
                         off up to {ACCEPT_BACKOFF_MAX:?})"
                    );
                }
                tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        let permit = match Arc::clone(&shared.slots).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let displaced = shared.displace_oldest_idle();
                shared.note_at_cap(displaced);
                let wait =
                    tokio::time::timeout(EVICT_WAIT, Arc::clone(&shared.slots).acquire_owned());
                let got = tokio::select! {
                    _ = shared.shutdown.cancelled() => return,
                    r = wait => r,
                };
                match got {
                    Ok(Ok(p)) => p,
                    // Still full (or closed): this connection is dropped, closing it.
                    _ => continue,
                }
            }
        };
        shared
            .tasks
            .spawn(connection(Arc::clone(&shared), stream, permit));
    }
}

/// Removes a connection from the open table when its task ends.
struct Registered<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.shared.deregister(self.id);
    }
}

/// Counts a request as being answered while alive.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn new(n: &Arc<AtomicUsize>) -> Self {
        n.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(n))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn connection(shared: Arc<Shared>, stream: TcpStream, _permit: OwnedSemaphorePermit) {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    let close = CancellationToken::new();
    let busy = Arc::new(AtomicUsize::new(0));
    {
        let mut open = shared.open.lock().unwrap_or_else(|p| p.into_inner());
        open.insert(
            id,
            OpenConn {
                close: close.clone(),
                busy: Arc::clone(&busy),
            },
        );
    }
    let _registered = Registered {
        shared: &shared,
        id,
    };
    let (Ok(peer), Ok(local)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    let client = Client {
        peer: peer.ip(),
        local: local.ip(),
    };
    match shared.monitor.tls.clone() {
        None => serve_io(&shared, TokioIo::new(stream), client, close, busy).await,
        Some(config) => {
            // The handshake is bounded like a request head: a client that never finishes it
            // does not hold its connection longer than that.
            let accept = tokio_rustls::TlsAcceptor::from(config).accept(stream);
            let tls = tokio::select! {
                r = tokio::time::timeout(HEADER_READ_TIMEOUT, accept) => r,
                _ = close.cancelled() => return,
                _ = shared.shutdown.cancelled() => return,
            };
            match tls {
                Ok(Ok(s)) => serve_io(&shared, TokioIo::new(s), client, close, busy).await,
                Ok(Err(e)) => tracing::debug!("monitoring connection: TLS handshake failed: {e}"),
                Err(_) => tracing::debug!("monitoring connection: TLS handshake timed out"),
            }
        }
    }
}

/// Who is asking: the peer's address and the local address it reached.
#[derive(Debug, Clone, Copy)]
struct Client {
    peer: std::net::IpAddr,
    local: std::net::IpAddr,
}

async fn serve_io<I>(
    shared: &Shared,
    io: TokioIo<I>,
    client: Client,
    close: CancellationToken,
    busy: Arc<AtomicUsize>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let born = tokio::time::Instant::now();
    // Milliseconds after `born` at which the latest request started.
    let last_request = Arc::new(AtomicU64::new(0));
    let svc = {
        let monitor = Arc::clone(&shared.monitor);
        let busy = Arc::clone(&busy);
        let last_request = Arc::clone(&last_request);
        service_fn(move |req| {
            let guard = Busy::new(&busy);
            let since = u64::try_from(born.elapsed().as_millis()).unwrap_or(u64::MAX);
            last_request.store(since, Ordering::Release);
            let monitor = Arc::clone(&monitor);
            async move {
                let r = respond(req, monitor, client).await;
                drop(guard);
                r
            }
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let mut conn = pin!(builder.serve_connection(io, svc));
    let mut closing_at: Option<tokio::time::Instant> = None;
    loop {
        let idle_at =
            born + Duration::from_millis(last_request.load(Ordering::Acquire)) + IDLE_TIMEOUT;
        let end_at = closing_at.unwrap_or(born + MAX_CONNECTION_AGE);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("monitoring connection: {e}");
                }
                return;
            }
            _ = close.cancelled() => return,
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep_until(idle_at) => {
                let started = Duration::from_millis(last_request.load(Ordering::Acquire));
                if born + started + IDLE_TIMEOUT <= tokio::time::Instant::now() {
                    tracing::debug!("monitoring connection: no request for {IDLE_TIMEOUT:?}, closed");
                    return;
                }
            }
            _ = tokio::time::sleep_until(end_at) => {
                if closing_at.is_some() {
                    return;
                }
                // Finish the request in flight, if any, then close; dropped if that stalls.
                conn.as_mut().graceful_shutdown();
                closing_at = Some(tokio::time::Instant::now() + HEADER_READ_TIMEOUT);
            }
        }
    }
}

/// The sleep schedule after consecutive failed `accept`s: [`ACCEPT_BACKOFF_MIN`] doubling up to
/// [`ACCEPT_BACKOFF_MAX`], back to the start after a success.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff {
            next: ACCEPT_BACKOFF_MIN,
        }
    }

    /// The sleep before the next try.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (d * 2).min(ACCEPT_BACKOFF_MAX);
        d
    }

    pub(crate) fn reset(&mut self) {
        self.next = ACCEPT_BACKOFF_MIN;
    }
}

/// Lets one log line through per interval and counts the events in between.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    interval: Duration,
    last: Option<Instant>,
    pending: u64,
}

impl LogLimiter {
    pub(crate) fn new(interval: Duration) -> Self {
        LogLimiter {
            interval,
            last: None,
            pending: 0,
        }
    }

    /// Counts one event; `Some(n)` when a line may be logged now, `n` counting this event and
    /// every one held back since the last line.
    pub(crate) fn hit(&mut self, now: Instant) -> Option<u64> {
        self.pending = self.pending.saturating_add(1);
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.interval => None,
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.pending))
            }
        }
    }
}

async fn respond(
    req: Request<Incoming>,
    monitor: Arc<Monitor>,
    client: Client,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let metrics: &Metrics = &monitor.metrics;
    let reply = |status: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(ctype));
        Ok(r)
    };
    // The API and the pages: never cached, never framed, no script, and for a page one
    // stylesheet only (its hash).
    let private = |mut r: Response<Full<Bytes>>| {
        use hyper::header::{HeaderName, HeaderValue};
        let h = r.headers_mut();
        for (name, value) in [
            (hyper::header::CACHE_CONTROL, "no-store"),
            (hyper::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (hyper::header::REFERRER_POLICY, "no-referrer"),
            (hyper::header::X_FRAME_OPTIONS, "DENY"),
        ] {
            h.insert(name, HeaderValue::from_static(value));
        }
        if let Ok(csp) = HeaderValue::from_str(&crate::page::content_security_policy()) {
            h.insert(HeaderName::from_static("content-security-policy"), csp);
        }
        Ok(r)
    };
    if req.method() == Method::POST
        && matches!(req.uri().path(), "/pending/approve" | "/pending/reject")
    {
        let (status, ok, text) = decide(req, &monitor, client).await;
        let page = crate::page::decision_page(ok, &text);
        return private(reply(status, "text/html; charset=utf-8", page)?);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => {
            let role = match metrics.role() {
                Role::Active => "active",
                Role::Leader => "leader",
                Role::Standby => "standby",
            };
            if let Some(why) = metrics.election_blocked() {
                // A standby that can never campaign is not one replica of a working pair.
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!(
                        "not ready: {}, {role}, leader election cannot campaign: {}\n",
                        if metrics.connected() {
                            "connected"
                        } else {
                            "not connected"
                        },
                        why.replace(['\r', '\n'], " ")
                    ),
                )
            } else if metrics.connected() {
                reply(
                    StatusCode::OK,
                    "text/plain",
                    format!("ready: connected, {role}\n"),
                )
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: not connected, {role}\n"),
                )
            }
        }
        path if path == "/" || path.starts_with("/api/") || path.starts_with("/nodes/") => {
            let headers = req.headers();
            let auth = headers
                .get(hyper::header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            let host = headers.get(hyper::header::HOST).map(|v| v.as_bytes());
            if let Err(refusal) = monitor.admit(client.peer, client.local, host, auth) {
                let body = serde_json::json!({"error": refusal.to_string()}).to_string() + "\n";
                let mut r = Response::new(Full::new(Bytes::from(body)));
                *r.status_mut() = refusal.status();
                r.headers_mut().insert(
                    CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("application/json"),
                );
                if refusal == crate::api::Refusal::Token {
                    r.headers_mut().insert(
                        hyper::header::WWW_AUTHENTICATE,
                        hyper::header::HeaderValue::from_static(
                            "Bearer realm=\"choria-provisioner\"",
                        ),
                    );
                }
                return private(r);
            }
            if path == "/" {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                    .unwrap_or(0);
                return private(reply(
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    crate::page::status_page(&monitor, now),
                )?);
            }
            if let Some(raw) = path.strip_prefix("/nodes/") {
                let page = crate::api::percent_decode(raw)
                    .and_then(|id| crate::page::node_page(&monitor, &id));
                return private(match page {
                    Some(p) => reply(StatusCode::OK, "text/html; charset=utf-8", p)?,
                    None => reply(
                        StatusCode::NOT_FOUND,
                        "text/plain",
                        "no history for this node\n".into(),
                    )?,
                });
            }
            let (status, body) = monitor.api(path, req.uri().query());
            let mut text = body.to_string();
            text.push('\n');
            private(reply(status, "application/json", text)?)
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// The largest form body of an approve or reject.
const MAX_FORM: usize = 4096;

/// An approve or reject POST from the status page: only with a configured token, which the
/// request carries (its `Authorization` header or the form's `token`), with the page's CSRF
/// token in the body, and an `Origin` that names the `Host` the request was sent to.
async fn decide(
    req: Request<Incoming>,
    monitor: &Monitor,
    client: Client,
) -> (StatusCode, bool, String) {
    use http_body_util::BodyExt as _;
    let refuse = |status: StatusCode, text: &str| (status, false, text.to_string());
    let Some(control) = &monitor.control else {
        return refuse(
            StatusCode::NOT_FOUND,
            "no approval queue: fleet_control is off",
        );
    };
    if monitor.token.is_none() {
        return refuse(
            StatusCode::FORBIDDEN,
            "approving from the status page needs monitor_token_file; use choria-provisioner approve or reject",
        );
    }
    let approve = req.uri().path() == "/pending/approve";
    let headers = req.headers().clone();
    let host = headers.get(hyper::header::HOST).map(|v| v.as_bytes());
    // A browser names the page's origin in every POST; it must be the host asked.
    let origin_ok = match (headers.get(hyper::header::ORIGIN), host) {
        (Some(o), Some(h)) => o
            .as_bytes()
            .split(|&b| b == b'/')
            .nth(2)
            .is_some_and(|authority| authority.eq_ignore_ascii_case(h)),
        _ => false,
    };
    if !origin_ok {
        return refuse(
            StatusCode::FORBIDDEN,
            "the Origin header does not name the host the form was sent to",
        );
    }
    let body = match http_body_util::Limited::new(req.into_body(), MAX_FORM)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, "the form is too large"),
    };
    let Some(form) = crate::control::form_pairs(&body) else {
        return refuse(StatusCode::BAD_REQUEST, "the form is not valid");
    };
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    let bearer = format!("Bearer {}", field("token"));
    let auth = headers
        .get(hyper::header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .unwrap_or(bearer.as_bytes());
    if let Err(r) = monitor.admit(client.peer, client.local, host, Some(auth)) {
        return refuse(r.status(), &r.to_string());
    }
    if control.csrf.is_empty()
        || !crate::api::constant_time_eq(field("csrf").as_bytes(), control.csrf.as_bytes())
    {
        return refuse(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or stale: reload the status page",
        );
    }
    let identity = field("identity");
    let reason = field("reason").trim();
    if identity.is_empty() || identity.len() > 255 {
        return refuse(StatusCode::BAD_REQUEST, "not a node identity");
    }
    if !approve && reason.is_empty() {
        return refuse(StatusCode::BAD_REQUEST, "a rejection needs a reason");
    }
    let by = format!("status-page@{}", monitor.identity);
    match control
        .view
        .decide(crate::control::Decision {
            identity,
            approve,
            reason,
            by: &by,
        })
        .await
    {
        Ok(text) => (StatusCode::OK, true, text),
        Err(e) => (StatusCode::CONFLICT, false, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_backoff_doubles_from_10ms_to_1s_and_restarts_after_a_success() {
        let mut b = Backoff::new();
        let ms: Vec<u128> = (0..10).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(10));
        // A minute of failures costs about seventy tries, not millions.
        let mut b = Backoff::new();
        let mut t = Duration::ZERO;
        let mut tries = 0;
        while t < Duration::from_secs(60) {
            t += b.next_delay();
            tries += 1;
        }
        assert!(tries < 70, "{tries} tries in a minute");
    }

    #[test]
    fn log_limiter_lets_one_line_through_per_interval_and_counts_the_rest() {
        let mut l = LogLimiter::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(l.hit(t0), Some(1));
        for i in 1..=999u64 {
            assert_eq!(l.hit(t0 + Duration::from_micros(i)), None);
        }
        assert_eq!(l.hit(t0 + Duration::from_millis(999)), None);
        assert_eq!(l.hit(t0 + Duration::from_secs(1)), Some(1001));
        assert_eq!(l.hit(t0 + Duration::from_millis(1500)), None);
        assert_eq!(l.hit(t0 + Duration::from_secs(3)), Some(2));
    }
}
