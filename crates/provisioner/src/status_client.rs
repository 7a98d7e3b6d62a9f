//! A client of a running provisioner's JSON status API (`/api/v1/...` on its monitor
//! listener): where the API is and the token it wants, found from the daemon's own YAML or given
//! directly, and one bounded GET per question.
//!
//! The answer is read up to [`MAX_RESPONSE`] bytes within [`TIMEOUT`] per step, with no proxy
//! and no redirect: a daemon that cannot be reached, refuses, or answers something else is one
//! [`StatusError`] naming the URL.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::config::Config;
use crate::settings::read_token;

/// How long connecting, and then the whole answer, may take.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read (a page of 500 nodes is well under this).
pub const MAX_RESPONSE: usize = 8 << 20;

/// Why the status API could not be asked or did not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatusError {
    /// Neither a configuration nor a URL says where the API is.
    #[error("give --config FILE (the daemon's YAML) or --monitor URL")]
    NoTarget,
    /// The configuration serves no API.
    #[error("monitor_port is 0 in {file}: the daemon serves no API (give --monitor URL if it runs with another configuration)")]
    NoMonitor {
        /// The configuration file.
        file: String,
    },
    /// The URL is not `http://HOST:PORT`.
    #[error("--monitor {url:?}: {why}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The configuration or token file could not be used.
    #[error(transparent)]
    Settings(#[from] crate::Error),
    /// No connection could be made or the answer did not arrive.
    #[error("cannot reach the provisioner's monitor listener at {base}: {detail} (is the daemon running, and is monitor_port set?)")]
    Unreachable {
        /// The API's base URL.
        base: String,
        /// What failed.
        detail: String,
    },
    /// The API wants a bearer token it was not given, or refused the one given.
    #[error("the provisioner at {base} wants a bearer token{said} (monitor_token_file in the YAML, or --token-file)")]
    Unauthorized {
        /// The API's base URL.
        base: String,
        /// What it said, `: ...` or empty.
        said: String,
    },
    /// Nothing at that path (an unknown node).
    #[error("not found at {url}{said}")]
    NotFound {
        /// The URL asked.
        url: String,
        /// What it said, `: ...` or empty.
        said: String,
    },
    /// Any other answer.
    #[error("{url} answered {status}{said}")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What it said, `: ...` or empty.
        said: String,
    },
    /// The answer is too large or not JSON.
    #[error("the answer from {url} {why}")]
    BadAnswer {
        /// The URL asked.
        url: String,
        /// What is wrong with it.
        why: String,
    },
}

/// A client of one provisioner's status API.
#[derive(Debug, Clone)]
pub struct StatusClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl StatusClient {
    /// As [`StatusClient::locate`] for a command: `config`, else `default` when it exists and
    /// no `monitor` is given.
    pub fn for_command(
        config: Option<&Path>,
        monitor: Option<&str>,
        token_file: Option<&Path>,
        default: &Path,
    ) -> Result<StatusClient, StatusError> {
        let config = match (config, monitor) {
            (Some(p), _) => Some(p),
            (None, None) if default.is_file() => Some(default),
            _ => None,
        };
        Self::locate(config, monitor, token_file)
    }

    /// The API of the daemon configured by `config` (its `monitor_address`, `monitor_port` and
    /// `monitor_token_file`), unless `monitor` (`http://HOST:PORT`) and `token_file` say
    /// otherwise. `config` may be `None` when `monitor` is given.
    pub fn locate(
        config: Option<&Path>,
        monitor: Option<&str>,
        token_file: Option<&Path>,
    ) -> Result<StatusClient, StatusError> {
        let config = match config {
            Some(p) => Some(Config::load(p).map_err(crate::Error::from)?.config),
            None => None,
        };
        let token_file = match (token_file, &config) {
            (Some(p), _) => p.display().to_string(),
            (None, Some(c)) => c.monitor_token_file.clone(),
            (None, None) => String::new(),
        };
        let token = read_token(&token_file)?;
        // With TLS on the listener, its certificate file is trusted besides the system's roots
        // (a self-signed or site-CA certificate).
        let trusted = config
            .as_ref()
            .map(|c| c.monitor_tls_cert.clone())
            .filter(|c| !c.is_empty());
        let base = match (monitor, &config) {
            (Some(url), _) => base_url(url)?,
            (None, Some(c)) => {
                if c.monitor_port == 0 {
                    return Err(StatusError::NoMonitor {
                        file: c.file.display().to_string(),
                    });
                }
                // Every interface (empty or unspecified) is reached on loopback; over TLS by
                // the name a certificate carries.
                let ip: IpAddr = match c.monitor_address.parse::<IpAddr>() {
                    Ok(ip) if ip.is_unspecified() && ip.is_ipv6() => Ipv6Addr::LOCALHOST.into(),
                    Ok(ip) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
                    Ok(ip) => ip,
                    Err(_) => Ipv4Addr::LOCALHOST.into(),
                };
                if c.monitor_tls_cert.is_empty() {
                    format!("http://{}", SocketAddr::new(ip, c.monitor_port))
                } else if ip.is_loopback() {
                    format!("https://localhost:{}", c.monitor_port)
                } else {
                    format!("https://{}", SocketAddr::new(ip, c.monitor_port))
                }
            }
            (None, None) => return Err(StatusError::NoTarget),
        };
        StatusClient::with_roots(base, token, trusted.as_deref().map(Path::new))
    }

    /// A client of the API at `base` (`http://HOST:PORT` or `https://HOST:PORT`), sending
    /// `token` as a bearer token.
    pub fn new(base: String, token: Option<String>) -> Result<StatusClient, StatusError> {
        StatusClient::with_roots(base, token, None)
    }

    /// [`StatusClient::new`], also trusting the certificates in the PEM file `roots`.
    pub fn with_roots(
        base: String,
        token: Option<String>,
        roots: Option<&Path>,
    ) -> Result<StatusClient, StatusError> {
        let unreachable = |detail: String| StatusError::Unreachable {
            base: base.clone(),
            detail,
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(TIMEOUT)
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        if let Some(path) = roots {
            let pem = std::fs::read(path).map_err(|e| {
                unreachable(format!(
                    "cannot read monitor_tls_cert {}: {e}",
                    path.display()
                ))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| unreachable(format!("monitor_tls_cert {}: {e}", path.display())))?;
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        let http = builder.build().map_err(|e| unreachable(e.to_string()))?;
        Ok(StatusClient { base, token, http })
    }

    /// The API's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// GETs `path` (`/api/v1/...`) and returns the JSON of a 200 answer.
    pub async fn get(&self, path: &str) -> Result<Value, StatusError> {
        let url = format!("{}{path}", self.base);
        let unreachable = |e: reqwest::Error| StatusError::Unreachable {
            base: self.base.clone(),
            detail: crate::one_line(&e),
        };
        let mut req = self
            .http
            .get(&url)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut answer = req.send().await.map_err(unreachable)?;
        let status = answer.status().as_u16();
        let mut body = Vec::new();
        while let Some(chunk) = answer.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > MAX_RESPONSE {
                return Err(StatusError::BadAnswer {
                    url,
                    why: format!("is larger than {MAX_RESPONSE} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        let json: Option<Value> = serde_json::from_slice(&body).ok();
        let said = json
            .as_ref()
            .and_then(|j| j["error"].as_str())
            .map(|e| format!(": {}", crate::text::quoted(e)))
            .unwrap_or_default();
        match status {
            200 => json.ok_or(StatusError::BadAnswer {
                url,
                why: "is not JSON".into(),
            }),
            401 => Err(StatusError::Unauthorized {
                base: self.base.clone(),
                said,
            }),
            404 => Err(StatusError::NotFound { url, said }),
            status => Err(StatusError::Status { url, status, said }),
        }
    }
}

/// `http://HOST:PORT` or `https://HOST:PORT` (a trailing `/` allowed) as a base URL without
/// the slash.
fn base_url(url: &str) -> Result<String, StatusError> {
    let bad = |why| StatusError::BadUrl {
        url: url.to_string(),
        why,
    };
    let (scheme, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(r), _) => ("http", r),
        (_, Some(r)) => ("https", r),
        _ => {
            return Err(bad(
                "only http://HOST:PORT or https://HOST:PORT is supported",
            ))
        }
    };
    let hostport = rest.trim_end_matches('/');
    if hostport.is_empty() || hostport.contains(['/', '?', '#', '@']) {
        return Err(bad("expected http://HOST:PORT"));
    }
    let parsed = reqwest::Url::parse(&format!("{scheme}://{hostport}/"))
        .map_err(|_| bad("expected http://HOST:PORT"))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("expected http://HOST:PORT"));
    }
    Ok(format!("{scheme}://{hostport}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_host_and_port() {
        assert_eq!(
            base_url("http://127.0.0.1:8080/").ok().as_deref(),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(
            base_url("http://[::1]:9").ok().as_deref(),
            Some("http://[::1]:9")
        );
        assert!(base_url("http://127.0.0.1").is_ok());
        assert_eq!(
            base_url("https://prov1.example.net:8443").ok().as_deref(),
            Some("https://prov1.example.net:8443")
        );
        for bad in [
            "ftp://x:1",
            "http://x:1/api",
            "http://",
            "http://u@x:1",
            "ftp://x",
        ] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn an_answer_past_the_limit_is_refused_without_reading_it_all() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            // A hostile chunked answer: a huge chunk size, then data without end.
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n",
                )
                .await;
            let block = vec![b'x'; 64 * 1024];
            for _ in 0..(MAX_RESPONSE / block.len() + 4) {
                if s.write_all(&block).await.is_err() {
                    return;
                }
            }
        });
        let c = StatusClient::new(format!("http://{addr}"), None).unwrap_or_else(|e| panic!("{e}"));
        let e = c.get("/api/v1/status").await.err();
        assert!(e.is_some(), "a hostile answer was accepted");
    }
}
