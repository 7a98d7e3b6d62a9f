//! The one shared NATS connection: brokers found as go-choria finds them ([`crate::brokers`]),
//! TLS from the security provider's files (plain when insecure), user and password, a NATS
//! credentials file or the choria provider's JWT, endless reconnects with backoff, named after
//! the identity, with library inboxes under `<main_collective>.reply`. The first connection can
//! be retried for ever with go-choria's backoff ([`connect_with_retry`]), and the connector's
//! counts (go-choria's `choria_connector_*` series) are kept in [`ConnectorStats`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_nats::{ConnectOptions, Event, ServerAddr};
use tokio::sync::watch;

use crate::brokers::{BrokerError, BrokerPlan, Brokers, SrvSettings};
use crate::config::{ChoriaConfig, ChoriaConfigError, SecurityProvider};

/// The environment variable naming a NATS credentials file; it wins over
/// `plugin.nats.credentials`, as in go-choria.
pub const CREDENTIALS_ENV: &str = "MCOLLECTIVE_NATS_CREDENTIALS";
/// A credentials file larger than this is refused (a real one is well under 4 KiB).
pub const MAX_CREDENTIALS_SIZE: u64 = 64 * 1024;
/// The longest client error text carried in a [`ConnectionError::Connect`].
const MAX_REASON_CHARS: usize = 512;
/// go-choria's `backoff.FiveSec` table, the pause after each failed initial connection try
/// (the last one repeating), each randomised to between half and one and a half times its
/// value.
pub const INITIAL_BACKOFF_MILLIS: [u64; 11] = [
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000,
];

/// Why the connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The configuration does not allow a connection (security files...).
    #[error(transparent)]
    Config(#[from] ChoriaConfigError),
    /// The broker settings (middleware hosts, SRV domain, DNS server) cannot be used.
    #[error(transparent)]
    Brokers(#[from] BrokerError),
    /// A middleware URL is not a valid NATS address.
    #[error("invalid middleware url {url}: {reason}")]
    InvalidUrl {
        /// The URL (its password, if any, redacted).
        url: String,
        /// Why.
        reason: String,
    },
    /// The NATS credentials file cannot be used. The message never holds its contents.
    #[error("nats credentials file {}: {reason}", path.display())]
    Credentials {
        /// The file.
        path: PathBuf,
        /// Why, in words.
        reason: String,
    },
    /// The broker did not confirm earlier operations in time.
    #[error("broker round trip failed: {reason}")]
    RoundTrip {
        /// Why.
        reason: String,
    },
    /// [`connect_with_retry`] was cancelled before a connection was made.
    #[error("connecting to {urls} was cancelled")]
    Cancelled {
        /// The brokers tried.
        urls: String,
    },
    /// Connecting to the broker failed.
    #[error("cannot connect to {urls}: {reason}")]
    Connect {
        /// The URLs tried (passwords redacted).
        urls: String,
        /// The client's error, with any password redacted.
        reason: String,
        /// The client error.
        #[source]
        source: async_nats::ConnectError,
    },
}

impl ConnectionError {
    /// Whether trying again may help (the broker did not answer or refused us), as opposed to
    /// settings that can never work.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ConnectionError::Connect { .. })
    }
}

/// Wait until the broker has processed everything this connection sent before, in particular
/// its subscriptions. `flush` only empties the socket buffer; a message sent to ourselves
/// comes back only after the broker handled every earlier operation of this connection.
pub async fn round_trip(
    nats: &async_nats::Client,
    timeout: Duration,
) -> Result<(), ConnectionError> {
    let fail = |reason: String| ConnectionError::RoundTrip { reason };
    let inbox = nats.new_inbox();
    let mut sub = nats
        .subscribe(inbox.clone())
        .await
        .map_err(|e| fail(e.to_string()))?;
    nats.publish(inbox, bytes::Bytes::new())
        .await
        .map_err(|e| fail(e.to_string()))?;
    let res = tokio::time::timeout(timeout, futures::StreamExt::next(&mut sub)).await;
    // Best effort: the subscription is private and dies with the connection anyway.
    let _ = sub.unsubscribe().await;
    match res {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(fail("connection closed".into())),
        Err(_) => Err(fail(format!("no echo from the broker within {timeout:?}"))),
    }
}

/// Everything the connection needs, derived from a [`ChoriaConfig`] (or built by hand).
#[derive(Clone)]
pub struct ConnectionSettings {
    /// Broker URLs; when empty, the brokers are looked up with `srv`, else `puppet:4222`.
    pub urls: Vec<String>,
    /// SRV lookup of the brokers when `urls` is empty (`None`: `plugin.choria.use_srv` off).
    pub srv: Option<SrvSettings>,
    /// Connection name (the identity).
    pub name: String,
    /// NATS user and password.
    pub user_password: Option<(String, String)>,
    /// Token sent as `auth_token`.
    pub token: Option<String>,
    /// Client JWT and ed25519 seed (the choria provider): the JWT goes out as `auth_token`
    /// and as the user JWT, with the broker's nonce signed by the seed.
    pub jwt_auth: Option<JwtAuth>,
    /// NATS 2 credentials file (user JWT and nkey seed), read again at every connection try.
    pub credentials: Option<PathBuf>,
    /// TLS material; `None` for plain TCP.
    pub tls: Option<TlsSettings>,
    /// Per-attempt connect timeout.
    pub connect_timeout: Duration,
    /// Inbox prefix for library-level request/reply (`<main_collective>.reply`).
    pub inbox_prefix: String,
    /// How many messages each subscription holds while they wait to be read
    /// ([`SUBSCRIPTION_CAPACITY`] for the connection discovery replies arrive on); past that
    /// the client drops them and counts a slow consumer.
    pub subscription_capacity: usize,
}

impl std::fmt::Debug for ConnectionSettings {
    // Passwords and tokens stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
            )
            .field("srv", &self.srv)
            .field("name", &self.name)
            .field("user", &self.user_password.as_ref().map(|(u, _)| u))
            .field("credentials", &self.credentials)
            .field("tls", &self.tls)
            .field("inbox_prefix", &self.inbox_prefix)
            .finish_non_exhaustive()
    }
}

/// A client JWT and the seed whose key it names.
#[derive(Clone)]
pub struct JwtAuth {
    /// The JWT, compact form.
    pub jwt: String,
    /// The ed25519 seed.
    pub seed: [u8; 32],
}

impl std::fmt::Debug for JwtAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JwtAuth(<redacted>)")
    }
}

/// TLS files.
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// CA bundle to verify the broker with; `None` uses the system roots.
    pub ca: Option<std::path::PathBuf>,
    /// Client certificate and key.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The brokers' URLs on one line, passwords redacted.
fn redacted_urls(brokers: &crate::brokers::Brokers) -> String {
    brokers
        .urls
        .iter()
        .map(|u| redact_url(u))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A URL with the password of its user part, if any, replaced by `<redacted>`.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:<redacted>@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    match scheme {
        Some(s) => format!("{s}://{authority}{path}"),
        None => format!("{authority}{path}"),
    }
}

/// Read a credentials file, bounded, and check it holds a user JWT and an nkey seed. Errors
/// name the file and never show its contents.
pub fn read_credentials(path: &Path) -> Result<String, ConnectionError> {
    use std::io::Read;
    let fail = |reason: String| ConnectionError::Credentials {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
    let mut text = String::new();
    file.take(MAX_CREDENTIALS_SIZE + 1)
        .read_to_string(&mut text)
        .map_err(|e| fail(format!("cannot read: {}", e.kind())))?;
    if text.len() as u64 > MAX_CREDENTIALS_SIZE {
        return Err(fail(format!(
            "larger than {MAX_CREDENTIALS_SIZE} bytes, not a credentials file"
        )));
    }
    // async-nats parses it again; this only turns its errors into words without contents.
    ConnectOptions::with_credentials(&text).map_err(|_| {
        fail("not a NATS credentials file (a user JWT and an nkey seed, as nsc writes them)".into())
    })?;
    Ok(text)
}

impl ConnectionSettings {
    /// What [`connect`] refuses before trying the network: a broker URL that is not a NATS
    /// address, or an unreadable or malformed credentials file.
    pub fn validate(&self) -> Result<(), ConnectionError> {
        server_addrs(&self.urls)?;
        if let Some(path) = &self.credentials {
            read_credentials(path)?;
        }
        Ok(())
    }

    /// How the brokers are found.
    pub fn broker_plan(&self) -> BrokerPlan {
        if self.urls.is_empty() {
            BrokerPlan::lookup(self.srv.clone())
        } else {
            BrokerPlan::urls(self.urls.clone())
        }
    }

    /// The brokers, or how they will be found, for messages (passwords redacted).
    pub fn describe_brokers(&self) -> String {
        redact_url(&self.broker_plan().describe())
    }

    /// Settings for a configuration: brokers as [`BrokerPlan::from_config`] finds them, TLS
    /// from the file provider's (or choria provider's) files unless TLS is disabled, NATS user
    /// and password, the credentials file ([`CREDENTIALS_ENV`], else
    /// `plugin.nats.credentials`), name = identity.
    pub fn from_config(cfg: &ChoriaConfig) -> Result<Self, ConnectionError> {
        Self::from_config_env(
            cfg,
            BrokerPlan::from_config(cfg)?,
            std::env::var(CREDENTIALS_ENV).ok(),
        )
    }

    /// [`ConnectionSettings::from_config`] with the broker plan and the credentials variable
    /// given.
    pub fn from_config_env(
        cfg: &ChoriaConfig,
        plan: BrokerPlan,
        credentials_env: Option<String>,
    ) -> Result<Self, ConnectionError> {
        let tls = if cfg.disable_tls {
            None
        } else {
            Some(match cfg.security_provider {
                SecurityProvider::Choria => TlsSettings {
                    ca: cfg.choria_ca.clone(),
                    client_cert: cfg.choria_certificate.clone().zip(cfg.choria_key.clone()),
                },
                _ => TlsSettings {
                    ca: cfg.file_ca.clone(),
                    client_cert: cfg.file_certificate.clone().zip(cfg.file_key.clone()),
                },
            })
        };
        let jwt_auth = match &cfg.security_provider {
            SecurityProvider::Choria if !cfg.insecure => {
                match cfg.security().map_err(ConnectionError::Config)? {
                    crate::protocol::Security::Choria { jwt, key, .. } => Some(JwtAuth {
                        jwt,
                        seed: key.to_bytes(),
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        let credentials = credentials_env
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .map(|v| crate::config::expand_home(&v))
            .or_else(|| cfg.nats_credentials.clone());
        Ok(ConnectionSettings {
            urls: plan.configured().to_vec(),
            srv: plan.srv().cloned(),
            name: cfg.identity.clone(),
            user_password: cfg.nats_user.clone().zip(cfg.nats_pass.clone()),
            token: None,
            jwt_auth,
            credentials,
            tls,
            connect_timeout: cfg.connect_timeout,
            inbox_prefix: format!("{}.reply", cfg.main_collective),
            subscription_capacity: SUBSCRIPTION_CAPACITY,
        })
    }

    /// Replace every secret this connection knows (the NATS password, passwords in broker
    /// URLs) in `text` with `<redacted>`.
    fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        let url_passwords = self.urls.iter().filter_map(|u| {
            let rest = u.split_once("://").map_or(u.as_str(), |(_, r)| r);
            let authority = rest.split('/').next().unwrap_or(rest);
            authority
                .rsplit_once('@')
                .and_then(|(ui, _)| ui.split_once(':'))
                .map(|(_, p)| p.to_string())
        });
        let secrets: Vec<String> = self
            .user_password
            .iter()
            .map(|(_, p)| p.clone())
            .chain(self.token.clone())
            .chain(url_passwords)
            .filter(|p| !p.is_empty())
            .collect();
        for s in secrets {
            out = out.replace(&s, "<redacted>");
        }
        // The text may quote the broker; keep it to one bounded line.
        if out.chars().count() > MAX_REASON_CHARS {
            out = out.chars().take(MAX_REASON_CHARS).collect::<String>() + "...";
        }
        out
    }
}

fn server_addrs(urls: &[String]) -> Result<Vec<ServerAddr>, ConnectionError> {
    urls.iter()
        .map(|u| {
            u.parse::<ServerAddr>()
                .map_err(|e| ConnectionError::InvalidUrl {
                    url: redact_url(u),
                    reason: e.to_string(),
                })
        })
        .collect()
}

/// Delay before reconnect attempt `attempt`: grows by a second per attempt up to 20 s, with
/// up to 25% jitter so a fleet of clients does not reconnect in lock step.
pub fn reconnect_delay(attempt: usize) -> Duration {
    if attempt == 0 {
        return Duration::ZERO;
    }
    let base = Duration::from_secs(u64::try_from(attempt.min(20)).unwrap_or(20));
    let jitter = rand::random::<f64>() * 0.25;
    base.mul_f64(1.0 - jitter)
}

/// The pause before try `attempt` (1 for the first) of a connection that was never up: none
/// before the first, then [`reconnect_delay`] of the tries before it.
pub fn first_connect_delay(attempt: usize) -> Duration {
    reconnect_delay(attempt.saturating_sub(1))
}

/// The pause after failed initial connection try `try_number` (1 for the first): go-choria's
/// `backoff.FiveSec` entry, randomised to between half and one and a half times its value
/// (so never more than 7.5 s).
pub fn initial_backoff(try_number: usize) -> Duration {
    let last = INITIAL_BACKOFF_MILLIS.len() - 1;
    let base = INITIAL_BACKOFF_MILLIS
        .get(try_number.min(last))
        .copied()
        .unwrap_or(5000);
    Duration::from_millis(base / 2 + rand::random::<u64>() % base.max(1))
}

/// The connector's counts, go-choria's `choria_connector_*` series: shared by clones, updated
/// by [`connect_observed`] and [`connect_with_retry_observed`] and by the connection's events,
/// readable at any time ([`ConnectorStats::snapshot`]) or followed ([`ConnectorStats::watch`]).
#[derive(Clone)]
pub struct ConnectorStats {
    inner: Arc<StatsInner>,
}

struct StatsInner {
    initial_connection_attempts: AtomicU64,
    reconnections: AtomicU64,
    connection_closed: AtomicU64,
    errors: AtomicU64,
    slow_consumers: AtomicU64,
    initial_connect_time: Mutex<Option<Duration>>,
    watch: watch::Sender<ConnectorSnapshot>,
}

/// One reading of [`ConnectorStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConnectorSnapshot {
    /// `choria_connector_initial_connection_attempts`: failed initial connection tries
    /// (go-choria counts after each failure).
    pub initial_connection_attempts: u64,
    /// `choria_connector_reconnections`: connections made again after a disconnection.
    pub reconnections: u64,
    /// `choria_connector_connection_closed`: connections closed for good.
    pub connection_closed: u64,
    /// `choria_connector_errors`: asynchronous errors (slow consumer, server or client errors).
    pub errors: u64,
    /// Slow consumer events: messages dropped because a subscription was not read in time
    /// (counted in `errors` too).
    pub slow_consumers: u64,
    /// `choria_connector_initial_connect_time`: how long the initial connection took, retries
    /// included, once it ended (connected or given up).
    pub initial_connect_time: Option<Duration>,
}

impl Default for ConnectorStats {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ConnectorStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.snapshot().fmt(f)
    }
}

impl ConnectorStats {
    /// Counts at zero.
    pub fn new() -> Self {
        let (watch, _) = watch::channel(ConnectorSnapshot::default());
        ConnectorStats {
            inner: Arc::new(StatsInner {
                initial_connection_attempts: AtomicU64::new(0),
                reconnections: AtomicU64::new(0),
                connection_closed: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                slow_consumers: AtomicU64::new(0),
                initial_connect_time: Mutex::new(None),
                watch,
            }),
        }
    }

    /// The counts now.
    pub fn snapshot(&self) -> ConnectorSnapshot {
        let i = &self.inner;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConnectorSnapshot {
            initial_connection_attempts: g(&i.initial_connection_attempts),
            reconnections: g(&i.reconnections),
            connection_closed: g(&i.connection_closed),
            errors: g(&i.errors),
            slow_consumers: g(&i.slow_consumers),
            initial_connect_time: *i
                .initial_connect_time
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        }
    }

    /// A receiver that sees every change of the counts.
    pub fn watch(&self) -> watch::Receiver<ConnectorSnapshot> {
        self.inner.watch.subscribe()
    }

    fn bump(&self, counter: impl Fn(&StatsInner) -> &AtomicU64) {
        counter(&self.inner).fetch_add(1, Ordering::Relaxed);
        self.publish();
    }

    fn publish(&self) {
        let now = self.snapshot();
        self.inner.watch.send_if_modified(|s| {
            let changed = *s != now;
            *s = now;
            changed
        });
    }

    fn initial_connect_done(&self, took: Duration) {
        let mut t = self
            .inner
            .initial_connect_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if t.is_none() {
            *t = Some(took);
        }
        drop(t);
        self.publish();
    }
}

/// Open the shared connection with one try: the brokers are resolved (configured, SRV or
/// `puppet:4222`), then each is tried once. Once connected, the client reconnects forever,
/// logging every disconnect and reconnect.
pub async fn connect(settings: &ConnectionSettings) -> Result<async_nats::Client, ConnectionError> {
    connect_observed(settings, &ConnectorStats::new()).await
}

/// [`connect`], counting the connection's reconnections, closes and errors in `stats`.
pub async fn connect_observed(
    settings: &ConnectionSettings,
    stats: &ConnectorStats,
) -> Result<async_nats::Client, ConnectionError> {
    let brokers = settings.broker_plan().resolve().await;
    connect_to(settings, &brokers, stats).await
}

/// How many messages a subscription holds while they wait to be read; past that the client
/// drops them (a slow consumer, counted in [`ConnectorSnapshot::slow_consumers`]).
pub const SUBSCRIPTION_CAPACITY: usize = 1 << 20;

/// The subscription capacity of a connection that only listens for lifecycle events: anyone
/// holding a provisioning JWT can publish them by the million, so what the listener has not
/// read yet is held in tens of MiB at most, and the rest dropped and counted.
pub const EVENT_SUBSCRIPTION_CAPACITY: usize = 1 << 16;

/// At most one slow-consumer line per connection in this long; the others are counted.
const SLOW_CONSUMER_LOG_EVERY: Duration = Duration::from_secs(10);

async fn connect_to(
    settings: &ConnectionSettings,
    brokers: &Brokers,
    stats: &ConnectorStats,
) -> Result<async_nats::Client, ConnectionError> {
    let addrs = server_addrs(&brokers.urls)?;
    let mut opts = match &settings.credentials {
        // Read at every try, so a rotated file is picked up.
        Some(path) => {
            let text = read_credentials(path)?;
            ConnectOptions::with_credentials(&text).map_err(|_| ConnectionError::Credentials {
                path: path.clone(),
                reason: "not a NATS credentials file".into(),
            })?
        }
        None => ConnectOptions::new(),
    };
    // Every reply to a discovery arrives on one subscription: room for a fleet of a million
    // answering at once. The queue holds messages only while they wait to be read, and takes
    // memory only for those.
    opts = opts.subscription_capacity(settings.subscription_capacity.max(1));
    // Slow-consumer events come one per dropped message: one line per interval says how many.
    let slow_log: Arc<std::sync::Mutex<(Option<std::time::Instant>, u64)>> = Arc::default();
    let name = settings.name.clone();
    let events = stats.clone();
    // The first Connected event is the initial connection; every later one a reconnection.
    let seen_connected = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The client, once connected, so that an event can name the server (async-nats does not
    // say which URL it connected to).
    let this: Arc<std::sync::OnceLock<async_nats::Client>> = Arc::default();
    let configured: Arc<[String]> = brokers.urls.iter().map(|u| redact_url(u)).collect();
    let (client_slot, urls) = (Arc::clone(&this), Arc::clone(&configured));
    opts = opts
        .name(&settings.name)
        .custom_inbox_prefix(&settings.inbox_prefix)
        .connection_timeout(settings.connect_timeout)
        .max_reconnects(None)
        .reconnect_delay_callback({
            let connected_before = Arc::clone(&seen_connected);
            move |attempt| {
                // async-nats counts the first try of a new connection as attempt 1 and sleeps
                // this long before it: a connection that was never up tries at once.
                let d = if connected_before.load(Ordering::Relaxed) {
                    reconnect_delay(attempt)
                } else {
                    first_connect_delay(attempt)
                };
                if !d.is_zero() {
                    tracing::info!("Sleeping {d:.3?} till the next reconnection attempt");
                }
                d
            }
        })
        .ping_interval(Duration::from_secs(30))
        .event_callback(move |event| {
            let name = name.clone();
            let stats = events.clone();
            let seen_connected = Arc::clone(&seen_connected);
            let slow_log = Arc::clone(&slow_log);
            let server = client_slot
                .get()
                .map(|c| connected_url(&c.server_info(), &urls));
            async move {
                // go-choria's wording (choria/connection.go), so alerts written for the Go
                // provisioner's log still match.
                match event {
                    Event::Connected => {
                        if seen_connected.swap(true, Ordering::Relaxed) {
                            stats.bump(|s| &s.reconnections);
                            tracing::warn!(
                                connection = %name,
                                "NATS client reconnected after a previous disconnection, connected to {}",
                                server.as_deref().unwrap_or("the broker")
                            );
                        }
                    }
                    Event::Disconnected => tracing::warn!(
                        connection = %name,
                        "NATS client connection got disconnected: the connection to {} was lost",
                        server.as_deref().unwrap_or("the broker")
                    ),
                    Event::Closed => {
                        stats.bump(|s| &s.connection_closed);
                        tracing::info!(connection = %name, "NATS client connection closed")
                    }
                    Event::SlowConsumer(sid) => {
                        stats.bump(|s| &s.errors);
                        stats.bump(|s| &s.slow_consumers);
                        let dropped = {
                            let mut l = slow_log.lock().unwrap_or_else(|p| p.into_inner());
                            l.1 += 1;
                            let due = l.0.is_none_or(|t| t.elapsed() >= SLOW_CONSUMER_LOG_EVERY);
                            if due {
                                l.0 = Some(std::time::Instant::now());
                                Some(std::mem::take(&mut l.1))
                            } else {
                                None
                            }
                        };
                        if let Some(n) = dropped {
                            tracing::error!(
                                connection = %name,
                                "NATS client dropped {n} messages of subscription {sid} that were not read in time (slow consumer); at most one such line every {}s",
                                SLOW_CONSUMER_LOG_EVERY.as_secs()
                            );
                        }
                    }
                    e @ (Event::ServerError(_) | Event::ClientError(_)) => {
                        stats.bump(|s| &s.errors);
                        match &server {
                            Some(url) => tracing::error!(
                                connection = %name,
                                "NATS client on {url} encountered an error: {e}"
                            ),
                            None => tracing::error!(
                                connection = %name,
                                "NATS client encountered an error: {e}"
                            ),
                        }
                    }
                    other => {
                        tracing::warn!(connection = %name, "NATS client event: {other}")
                    }
                }
            }
        });
    if let Some((u, p)) = &settings.user_password {
        opts = opts.user_and_password(u.clone(), p.clone());
    }
    if let Some(t) = &settings.token {
        opts = opts.token(t.clone());
    }
    if let Some(auth) = &settings.jwt_auth {
        // go-choria sends the JWT both as the token and as the user JWT, signing the nonce.
        let key = ed25519_dalek::SigningKey::from_bytes(&auth.seed);
        opts = opts
            .token(auth.jwt.clone())
            .jwt(auth.jwt.clone(), move |nonce: Vec<u8>| {
                let sig = ed25519_dalek::Signer::sign(&key, &nonce)
                    .to_bytes()
                    .to_vec();
                async move { Ok(sig) }
            });
    }
    if let Some(tls) = &settings.tls {
        opts = opts.require_tls(true);
        if let Some(ca) = &tls.ca {
            opts = opts.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &tls.client_cert {
            opts = opts.add_client_certificate(cert.clone(), key.clone());
        }
    }
    let client = opts
        .connect(addrs)
        .await
        .map_err(|source| ConnectionError::Connect {
            urls: redacted_urls(brokers),
            reason: settings.scrub(&source.to_string()),
            source,
        })?;
    tracing::info!(
        "Connected to {}",
        connected_url(&client.server_info(), &configured)
    );
    let _ = this.set(client.clone());
    Ok(client)
}

/// The broker a client is connected to, as go-choria names it (`nats://host:port`, no
/// password): the configured URL when only one has the port the server announced, else the
/// host and port of the server's INFO.
fn connected_url(info: &async_nats::ServerInfo, configured: &[String]) -> String {
    let port = format!(":{}", info.port);
    let mut same_port = configured
        .iter()
        .filter(|u| u.trim_end_matches('/').ends_with(&port));
    match (same_port.next(), same_port.next()) {
        (Some(u), None) => u.clone(),
        _ => {
            let scheme = if info.tls_required { "tls" } else { "nats" };
            format!("{scheme}://{}:{}", info.host, info.port)
        }
    }
}

/// Like [`connect`], but retries a failing initial connection for ever, as go-choria does,
/// until it succeeds or `shutdown` is cancelled. Settings errors (bad URLs, an unusable
/// credentials file) are returned at once.
pub async fn connect_with_retry(
    settings: &ConnectionSettings,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<async_nats::Client, ConnectionError> {
    connect_with_retry_observed(settings, shutdown, &ConnectorStats::new()).await
}

/// [`connect_with_retry`], counting in `stats`. Each try resolves the brokers again (an SRV
/// record set may change while we wait) and is logged with the broker list; each failure is
/// counted, logged with the try number and the pause before the next try (go-choria's FiveSec
/// backoff, jittered), never with a password.
pub async fn connect_with_retry_observed(
    settings: &ConnectionSettings,
    shutdown: &tokio_util::sync::CancellationToken,
    stats: &ConnectorStats,
) -> Result<async_nats::Client, ConnectionError> {
    let started = Instant::now();
    let cancelled = || ConnectionError::Cancelled {
        urls: settings.describe_brokers(),
    };
    let mut tries = 0usize;
    let result = loop {
        tries += 1;
        let attempt = async {
            let brokers = settings.broker_plan().resolve().await;
            tracing::info!(
                "Attempting to connect to: {} (from {})",
                redacted_urls(&brokers),
                brokers.source
            );
            connect_to(settings, &brokers, stats).await
        };
        let res = tokio::select! {
            r = attempt => r,
            _ = shutdown.cancelled() => break Err(cancelled()),
        };
        match res {
            Ok(c) => break Ok(c),
            Err(e) if e.is_retryable() => {
                stats.bump(|s| &s.initial_connection_attempts);
                let delay = initial_backoff(tries);
                tracing::warn!(
                    "Initial connection to the Broker failed on try {tries}: {e}; trying again in {delay:.1?}"
                );
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => break Err(cancelled()),
                }
            }
            Err(e) => break Err(e),
        }
    };
    stats.initial_connect_done(started.elapsed());
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(urls: &[&str]) -> ConnectionSettings {
        ConnectionSettings {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            srv: None,
            name: "p1".into(),
            user_password: None,
            token: None,
            jwt_auth: None,
            credentials: None,
            tls: None,
            connect_timeout: Duration::from_secs(1),
            inbox_prefix: "provisioning.reply".into(),
            subscription_capacity: SUBSCRIPTION_CAPACITY,
        }
    }

    #[test]
    fn a_connection_never_up_tries_at_once_then_backs_off_as_a_reconnection() {
        assert_eq!(first_connect_delay(1), Duration::ZERO);
        assert_eq!(first_connect_delay(0), Duration::ZERO);
        for attempt in 2..30 {
            let d = first_connect_delay(attempt);
            let base = Duration::from_secs((attempt as u64 - 1).min(20));
            assert!(d <= base && d >= base.mul_f64(0.75), "{attempt}: {d:?}");
        }
        // A reconnection's first try waits.
        assert!(reconnect_delay(1) >= Duration::from_millis(750));
    }

    #[test]
    fn validate_refuses_what_connect_would_before_the_network() {
        settings(&["nats://broker.example.net:4222", "tls://b2:4222"])
            .validate()
            .unwrap();
        let err = settings(&["nats://broker.example.net:notaport"])
            .validate()
            .unwrap_err();
        assert!(
            matches!(err, ConnectionError::InvalidUrl { ref url, .. } if url.ends_with("notaport")),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let mut creds = settings(&["nats://b:4222"]);
        creds.credentials = Some(dir.path().join("missing.creds"));
        let err = creds.validate().unwrap_err();
        assert!(
            matches!(err, ConnectionError::Credentials { .. })
                && err.to_string().contains("missing.creds"),
            "{err}"
        );
        // A file that is not a credentials file is refused without showing what it holds.
        let bogus = dir.path().join("bogus.creds");
        std::fs::write(&bogus, "not-a-seed-7f3a9c\n").unwrap();
        creds.credentials = Some(bogus);
        let err = creds.validate().unwrap_err().to_string();
        assert!(
            err.contains("bogus.creds") && !err.contains("7f3a9c"),
            "{err}"
        );
        let big = dir.path().join("big.creds");
        std::fs::write(&big, vec![b'a'; 70_000]).unwrap();
        creds.credentials = Some(big);
        let err = creds.validate().unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact_url("nats://alice:s3cret-91@b1:4222"),
            "nats://alice:<redacted>@b1:4222"
        );
        assert_eq!(redact_url("nats://b1:4222"), "nats://b1:4222");
        assert_eq!(redact_url("tok@b1:4222"), "tok@b1:4222");
        let mut s = settings(&["nats://bob:url-pass-44@b1:4222"]);
        s.user_password = Some(("alice".into(), "nats-pass-17".into()));
        let scrubbed = s.scrub("failed with nats-pass-17 and url-pass-44");
        assert!(
            !scrubbed.contains("pass-17") && !scrubbed.contains("pass-44"),
            "{scrubbed}"
        );
        let long = s.scrub(&"x".repeat(10_000));
        assert!(long.len() <= MAX_REASON_CHARS + 3, "{}", long.len());
        let text = format!("{s:?} {}", s.describe_brokers());
        assert!(
            !text.contains("pass-17") && !text.contains("url-pass-44"),
            "{text}"
        );
    }

    #[test]
    fn initial_backoff_follows_go_five_sec_with_jitter() {
        for _ in 0..200 {
            let first = initial_backoff(1);
            assert!(
                first >= Duration::from_millis(375) && first < Duration::from_millis(1125),
                "{first:?}"
            );
            let late = initial_backoff(1000);
            assert!(
                late >= Duration::from_millis(2500) && late < Duration::from_millis(7500),
                "{late:?}"
            );
        }
    }

    #[test]
    fn credentials_come_from_the_environment_first() {
        let cfg = ChoriaConfig::parse_str(
            "plugin.choria.middleware_hosts = b1:4222\nplugin.nats.credentials = /etc/file.creds\nplugin.security.provider = file\n",
        )
        .unwrap();
        let plan = BrokerPlan::from_parts(&cfg, None, None).unwrap();
        let s = ConnectionSettings::from_config_env(&cfg, plan.clone(), None).unwrap();
        assert_eq!(s.credentials.as_deref(), Some(Path::new("/etc/file.creds")));
        let s =
            ConnectionSettings::from_config_env(&cfg, plan.clone(), Some("/run/env.creds".into()))
                .unwrap();
        assert_eq!(s.credentials.as_deref(), Some(Path::new("/run/env.creds")));
        let s = ConnectionSettings::from_config_env(&cfg, plan, Some(String::new())).unwrap();
        assert_eq!(s.credentials.as_deref(), Some(Path::new("/etc/file.creds")));
        assert_eq!(s.urls, ["nats://b1:4222"]);
    }

    #[tokio::test]
    async fn connects_to_the_broker_its_srv_records_name_and_counts_reconnections() {
        use test_support::dns::{DnsServer, SrvRecord};
        let mut nats = test_support::NatsServer::start();
        let Some(dns) = DnsServer::start_or_skip(
            "connects_to_the_broker_its_srv_records_name_and_counts_reconnections",
            &[SrvRecord::new(
                "_mcollective-server._tcp.example.net",
                "localhost",
                nats.port(),
            )],
        ) else {
            return;
        };
        let mut cfg = ChoriaConfig::parse_str(
            "identity = p1\nplugin.security.provider = file\nplugin.choria.srv_domain = example.net\n",
        )
        .unwrap();
        cfg.disable_tls = true;
        let plan = BrokerPlan::from_parts(&cfg, None, Some(dns.addr())).unwrap();
        let settings = ConnectionSettings::from_config_env(&cfg, plan, None).unwrap();
        assert!(settings.urls.is_empty());
        let stats = ConnectorStats::new();
        let mut counts = stats.watch();
        let nc = connect_with_retry_observed(
            &settings,
            &tokio_util::sync::CancellationToken::new(),
            &stats,
        )
        .await
        .unwrap();
        round_trip(&nc, Duration::from_secs(5)).await.unwrap();
        let first = stats.snapshot();
        assert_eq!(
            first.initial_connection_attempts, 0,
            "connected at the first try"
        );
        assert!(first.initial_connect_time.is_some());
        assert_eq!(
            first.reconnections, 0,
            "the first connection is not a reconnection"
        );

        // A broker restart is one reconnection, seen through the watch.
        nats.restart();
        let seen = tokio::time::timeout(
            Duration::from_secs(30),
            counts.wait_for(|s| s.reconnections == 1),
        )
        .await;
        assert!(
            seen.is_ok(),
            "no reconnection counted: {:?}",
            stats.snapshot()
        );
        round_trip(&nc, Duration::from_secs(5)).await.unwrap();
        assert_eq!(stats.snapshot().initial_connection_attempts, 0);
    }

    #[tokio::test]
    async fn failed_initial_tries_are_counted_and_the_time_recorded_when_given_up() {
        let dead = settings(&[&format!("nats://127.0.0.1:{}", test_support::free_port())]);
        let stats = ConnectorStats::new();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stop = shutdown.clone();
        let mut counts = stats.watch();
        let waiter = tokio::spawn(async move {
            let _ = counts
                .wait_for(|s| s.initial_connection_attempts >= 2)
                .await;
            stop.cancel();
        });
        let err = connect_with_retry_observed(&dead, &shutdown, &stats)
            .await
            .unwrap_err();
        assert!(matches!(err, ConnectionError::Cancelled { .. }), "{err}");
        waiter.await.unwrap();
        let s = stats.snapshot();
        assert!(s.initial_connection_attempts >= 2, "{s:?}");
        assert!(
            s.initial_connect_time
                .is_some_and(|t| t >= Duration::from_millis(300)),
            "{s:?}"
        );
    }
}
