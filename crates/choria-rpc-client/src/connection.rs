//! The one shared NATS connection: TLS from the security provider's files (plain when
//! insecure), user and password, endless reconnects with backoff, named after the identity,
//! with library inboxes under `<main_collective>.reply`.

use std::time::Duration;

use async_nats::{ConnectOptions, Event, ServerAddr};

use crate::config::{ChoriaConfig, ChoriaConfigError, SecurityProvider};

/// Why the connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// The configuration does not allow a connection (no hosts, bad URL...).
    #[error(transparent)]
    Config(#[from] ChoriaConfigError),
    /// A middleware URL is not a valid NATS address.
    #[error("invalid middleware url {url}: {reason}")]
    InvalidUrl {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// NATS credentials files (`plugin.nats.credentials`) are not supported.
    #[error(
        "nats credentials file {path} is not supported, use plugin.nats.user and plugin.nats.pass"
    )]
    CredentialsUnsupported {
        /// The file.
        path: String,
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
        /// The URLs tried.
        urls: String,
    },
    /// Connecting to the broker failed.
    #[error("cannot connect to {urls}: {source}")]
    Connect {
        /// The URLs tried.
        urls: String,
        /// The client error.
        #[source]
        source: async_nats::ConnectError,
    },
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
    /// Broker URLs.
    pub urls: Vec<String>,
    /// Connection name (the identity).
    pub name: String,
    /// NATS user and password.
    pub user_password: Option<(String, String)>,
    /// Token sent as `auth_token`.
    pub token: Option<String>,
    /// Client JWT and ed25519 seed (the choria provider): the JWT goes out as `auth_token`
    /// and as the user JWT, with the broker's nonce signed by the seed.
    pub jwt_auth: Option<JwtAuth>,
    /// NATS 2 credentials file.
    pub credentials: Option<std::path::PathBuf>,
    /// TLS material; `None` for plain TCP.
    pub tls: Option<TlsSettings>,
    /// Per-attempt connect timeout.
    pub connect_timeout: Duration,
    /// Inbox prefix for library-level request/reply (`<main_collective>.reply`).
    pub inbox_prefix: String,
}

impl std::fmt::Debug for ConnectionSettings {
    // Passwords and tokens stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("urls", &self.urls)
            .field("name", &self.name)
            .field("user", &self.user_password.as_ref().map(|(u, _)| u))
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

impl ConnectionSettings {
    /// What [`connect`] refuses before trying the network: a broker URL that is not a NATS
    /// address, or a credentials file.
    pub fn validate(&self) -> Result<(), ConnectionError> {
        self.server_addrs().map(|_| ())
    }

    fn server_addrs(&self) -> Result<Vec<ServerAddr>, ConnectionError> {
        let addrs = self
            .urls
            .iter()
            .map(|u| {
                u.parse::<ServerAddr>()
                    .map_err(|e| ConnectionError::InvalidUrl {
                        url: u.clone(),
                        reason: e.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        if let Some(path) = &self.credentials {
            // Credentials files need nonce signing with nkeys, which this build does not
            // include.
            return Err(ConnectionError::CredentialsUnsupported {
                path: path.display().to_string(),
            });
        }
        Ok(addrs)
    }

    /// Settings for a configuration: TLS from the file provider's (or choria provider's)
    /// files unless TLS is disabled, NATS user and password, name = identity.
    pub fn from_config(cfg: &ChoriaConfig) -> Result<Self, ConnectionError> {
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
        Ok(ConnectionSettings {
            urls: cfg.middleware_urls()?,
            name: cfg.identity.clone(),
            user_password: cfg.nats_user.clone().zip(cfg.nats_pass.clone()),
            token: None,
            jwt_auth,
            credentials: cfg.nats_credentials.clone(),
            tls,
            connect_timeout: cfg.connect_timeout,
            inbox_prefix: format!("{}.reply", cfg.main_collective),
        })
    }
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

/// Open the shared connection. The initial connect fails with an error; once connected, the
/// client reconnects forever, logging every disconnect and reconnect.
pub async fn connect(settings: &ConnectionSettings) -> Result<async_nats::Client, ConnectionError> {
    let addrs = settings.server_addrs()?;
    let mut opts = ConnectOptions::new();
    let name = settings.name.clone();
    opts = opts
        .name(&settings.name)
        .custom_inbox_prefix(&settings.inbox_prefix)
        .connection_timeout(settings.connect_timeout)
        .max_reconnects(None)
        .reconnect_delay_callback(reconnect_delay)
        .ping_interval(Duration::from_secs(30))
        .event_callback(move |event| {
            let name = name.clone();
            async move {
                match event {
                    Event::Connected => {
                        tracing::info!(connection = %name, "nats connection (re)established")
                    }
                    Event::Disconnected => {
                        tracing::warn!(connection = %name, "nats connection lost, reconnecting")
                    }
                    Event::Closed => tracing::info!(connection = %name, "nats connection closed"),
                    other => {
                        tracing::warn!(connection = %name, event = %other, "nats connection event")
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
    opts.connect(addrs)
        .await
        .map_err(|source| ConnectionError::Connect {
            urls: settings.urls.join(","),
            source,
        })
}

/// Like [`connect`], but retries a failing initial connect with a backoff of up to 5 s (as
/// go-choria does) until it succeeds or `shutdown` is cancelled. Configuration errors (bad
/// URLs, unsupported credentials) are returned at once.
pub async fn connect_with_retry(
    settings: &ConnectionSettings,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<async_nats::Client, ConnectionError> {
    let mut attempt = 0usize;
    loop {
        let res = tokio::select! {
            r = connect(settings) => r,
            _ = shutdown.cancelled() => return Err(ConnectionError::Cancelled { urls: settings.urls.join(",") }),
        };
        match res {
            Ok(c) => return Ok(c),
            Err(e @ ConnectionError::Connect { .. }) => {
                attempt += 1;
                let delay = reconnect_delay(attempt).min(Duration::from_secs(5));
                tracing::warn!(error = %e, attempt, retry_in_ms = delay.as_millis() as u64, "initial broker connection failed");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.cancelled() => return Err(ConnectionError::Cancelled { urls: settings.urls.join(",") }),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(urls: &[&str]) -> ConnectionSettings {
        ConnectionSettings {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            name: "p1".into(),
            user_password: None,
            token: None,
            jwt_auth: None,
            credentials: None,
            tls: None,
            connect_timeout: Duration::from_secs(1),
            inbox_prefix: "provisioning.reply".into(),
        }
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
        let mut creds = settings(&["nats://b:4222"]);
        creds.credentials = Some("/etc/p.creds".into());
        let err = creds.validate().unwrap_err();
        assert!(
            matches!(err, ConnectionError::CredentialsUnsupported { .. }),
            "{err}"
        );
    }
}
