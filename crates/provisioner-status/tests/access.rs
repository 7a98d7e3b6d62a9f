//! Who the status API and pages answer, on a real listener: without a token only loopback
//! clients; with one any client that sends it; a `Host` that is not loopback, the address
//! reached or a configured name is refused (DNS rebinding); the answers are never cached and the
//! pages carry a strict Content-Security-Policy; `/metrics`, `/healthz` and `/readyz` answer
//! everyone as before. Over TLS the same, with the certificate reloaded when its files change.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use provisioner_metrics::Metrics;
use provisioner_status::{HistoryLimits, Monitor, NodeTable};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

/// An address of this host that is not loopback: a client connecting to it is not on loopback
/// either. CI machines have one; elsewhere the cross-host checks are skipped, said out loud.
fn lan_address() -> Option<IpAddr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let found = text
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|cidr| cidr.split('/').next())
        .and_then(|a| a.parse().ok());
    if found.is_none() {
        test_support::skip_unless_ci("no non-loopback IPv4 address for the cross-host checks");
    }
    found
}

fn monitor(token: Option<&str>, hostnames: &[&str]) -> Monitor {
    let mut m = Monitor::metrics_only(Metrics::new("lab"));
    m.nodes = Some(NodeTable::new(HistoryLimits::default()));
    m.token = token.map(str::to_string);
    m.hostnames = hostnames.iter().map(|h| h.to_string()).collect();
    m
}

/// One response: status, headers (lower-cased names) and body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    path: &str,
    host: &str,
    token: Option<&str>,
) -> Answer {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_string(),
    }
}

async fn get(addr: SocketAddr, path: &str, host: &str, token: Option<&str>) -> Answer {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    exchange(s, path, host, token).await
}

async fn serve(m: Monitor) -> (SocketAddr, CancellationToken) {
    let stop = CancellationToken::new();
    let serving = provisioner_status::serve_monitor(
        &[SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0)],
        m,
        stop.clone(),
    )
    .await
    .unwrap();
    (serving.local_addr(), stop)
}

#[tokio::test]
async fn without_a_token_the_api_answers_loopback_only_and_scrapers_everyone() {
    let (bound, stop) = serve(monitor(None, &[])).await;
    let port = bound.port();
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let a = get(lo, "/api/v1/nodes", &format!("127.0.0.1:{port}"), None).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("cache-control"), Some("no-store"));
    let page = get(lo, "/", &format!("localhost:{port}"), None).await;
    assert_eq!(page.status, 200);
    let csp = page.header("content-security-policy").unwrap_or_default();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("style-src 'sha256-"),
        "{csp}"
    );
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert_eq!(page.header("cache-control"), Some("no-store"));

    // A foreign Host, as a DNS-rebinding page in an operator's browser would send.
    let rebound = get(
        lo,
        "/api/v1/nodes",
        &format!("evil.example.com:{port}"),
        None,
    )
    .await;
    assert_eq!(rebound.status, 403, "{}", rebound.body);
    assert!(rebound.body.contains("Host"), "{}", rebound.body);
    assert_eq!(rebound.header("cache-control"), Some("no-store"));

    if let Some(ip) = lan_address() {
        let lan = SocketAddr::new(ip, port);
        let host = format!("{ip}:{port}");
        let refused = get(lan, "/api/v1/nodes", &host, None).await;
        assert_eq!(refused.status, 403, "{}", refused.body);
        assert!(
            refused.body.contains("monitor_token_file"),
            "{}",
            refused.body
        );
        assert!(!refused.body.contains("nodes\":"), "{}", refused.body);
        for path in ["/", "/nodes/n1.example.net", "/api/v1/status"] {
            assert_eq!(get(lan, path, &host, None).await.status, 403, "{path}");
        }
        // Scrapers and supervisors are not affected.
        for path in ["/metrics", "/healthz"] {
            assert_eq!(get(lan, path, &host, None).await.status, 200, "{path}");
        }
        assert_eq!(
            get(lan, "/metrics", "prom.example.net", None).await.status,
            200
        );
    }
    stop.cancel();
}

#[tokio::test]
async fn a_token_opens_the_api_to_other_hosts_that_send_it() {
    let (bound, stop) = serve(monitor(Some("s3cret"), &["prov1.example.net"])).await;
    let port = bound.port();
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let host = format!("127.0.0.1:{port}");
    assert_eq!(get(lo, "/api/v1/status", &host, None).await.status, 401);
    assert_eq!(
        get(lo, "/api/v1/status", &host, Some("s3cret"))
            .await
            .status,
        200
    );
    // A configured name is a valid Host.
    let named = get(lo, "/api/v1/status", "prov1.example.net", Some("s3cret")).await;
    assert_eq!(named.status, 200, "{}", named.body);
    if let Some(ip) = lan_address() {
        let lan = SocketAddr::new(ip, port);
        let host = format!("{ip}:{port}");
        assert_eq!(get(lan, "/api/v1/nodes", &host, None).await.status, 401);
        let a = get(lan, "/api/v1/nodes", &host, Some("s3cret")).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("cache-control"), Some("no-store"));
    }
    stop.cancel();
}

async fn tls_get(
    addr: SocketAddr,
    ca: &std::path::Path,
    name: &str,
) -> (Answer, Vec<rustls::pki_types::CertificateDer<'static>>) {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let tls = connector.connect(server_name, tcp).await.unwrap();
    let presented = tls
        .get_ref()
        .1
        .peer_certificates()
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let host = format!("localhost:{}", addr.port());
    (
        exchange(tls, "/api/v1/status", &host, None).await,
        presented,
    )
}

#[tokio::test]
async fn over_tls_the_same_and_a_renewed_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = test_support::ca::TestCa::new(dir.path()).unwrap();
    let first = ca.issue("localhost", &["localhost", "127.0.0.1"]).unwrap();
    let cert = dir.path().join("monitor.pem");
    let key = dir.path().join("monitor-key.pem");
    std::fs::copy(&first.cert, &cert).unwrap();
    std::fs::copy(&first.key, &key).unwrap();
    let mut m = monitor(None, &[]);
    m.tls = Some(provisioner_status::tls::server_config(&cert, &key).unwrap());
    let (bound, stop) = serve(m).await;
    let lo = SocketAddr::from((Ipv4Addr::LOCALHOST, bound.port()));

    let (a, presented) = tls_get(lo, &ca.cert, "localhost").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("cache-control"), Some("no-store"));
    let before = presented.first().cloned().unwrap();
    // Plain HTTP to the TLS port gets no answer.
    assert_eq!(get(lo, "/healthz", "localhost", None).await.status, 0);

    // Renewed in place (a new key and certificate), as a certificate manager does.
    let renewed = ca.issue("localhost", &["localhost"]).unwrap();
    std::fs::copy(&renewed.key, &key).unwrap();
    std::fs::copy(&renewed.cert, &cert).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (a, presented) = tls_get(lo, &ca.cert, "localhost").await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_ne!(
        presented.first(),
        Some(&before),
        "the renewed certificate is served"
    );

    // A broken renewal keeps the last good certificate.
    std::fs::write(&cert, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (a, _) = tls_get(lo, &ca.cert, "localhost").await;
    assert_eq!(a.status, 200, "{}", a.body);
    stop.cancel();
}
