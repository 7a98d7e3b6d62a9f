//! The approval queue on the status page and API, on a real listener with a fake fleet
//! control: the pending list, the pause and deny count in `/api/v1/status`; the Approve and
//! Reject forms only with a token; a POST needs the token, the page's CSRF token and an Origin
//! naming the Host, and is refused otherwise without deciding anything.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use provisioner_metrics::Metrics;
use provisioner_status::control::{DecideFuture, Decision};
use provisioner_status::{ControlPanel, FleetControlView, Monitor, PauseInfo, PendingInfo};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Fake {
    decided: Mutex<Vec<(String, bool, String, String)>>,
}

impl FleetControlView for Fake {
    fn pause(&self) -> Option<PauseInfo> {
        Some(PauseInfo {
            by: "alice@prov1".into(),
            at: 1_796_000_000,
            reason: "helper <2.4> broken".into(),
        })
    }
    fn deny_entries(&self) -> usize {
        3
    }
    fn pending(&self) -> Vec<PendingInfo> {
        vec![PendingInfo {
            identity: "web<7>.example.net".into(),
            fingerprints: vec![format!("sha256:{}", "ab".repeat(32))],
            reason: "approval: manual".into(),
            facts: BTreeMap::from([("os".to_string(), "linux".to_string())]),
            first_seen: 1_796_000_000,
            last_seen: 1_796_000_060,
            expires: 1_796_604_800,
        }]
    }
    fn decide<'a>(&'a self, d: Decision<'a>) -> DecideFuture<'a> {
        self.decided.lock().unwrap().push((
            d.identity.into(),
            d.approve,
            d.reason.into(),
            d.by.into(),
        ));
        Box::pin(std::future::ready(Ok(format!("decided {}", d.identity))))
    }
}

const CSRF: &str = "0123456789abcdef0123456789abcdef";

async fn serve(token: Option<&str>) -> (SocketAddr, Arc<Fake>, CancellationToken) {
    let fake = Arc::new(Fake::default());
    let mut m = Monitor::metrics_only(Metrics::new("lab"));
    m.identity = "prov1".into();
    m.token = token.map(str::to_string);
    m.control = Some(ControlPanel {
        view: Arc::clone(&fake) as Arc<dyn FleetControlView>,
        csrf: CSRF.into(),
    });
    let stop = CancellationToken::new();
    let serving = provisioner_status::serve_monitor(
        &[SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)],
        m,
        stop.clone(),
    )
    .await
    .unwrap();
    (serving.local_addr(), fake, stop)
}

/// One request; (status, body).
async fn ask(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn the_status_shows_the_pause_deny_count_and_pending_nodes() {
    let (addr, _, stop) = serve(None).await;
    let (st, body) = ask(addr, "GET", "/api/v1/status", "", "").await;
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["pause"]["by"], "alice@prov1");
    assert_eq!(v["pause"]["reason"], "helper <2.4> broken");
    assert_eq!(v["deny_entries"], 3);
    assert_eq!(v["pending_approval"], 1);
    let (st, body) = ask(addr, "GET", "/api/v1/pending", "", "").await;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["pending"][0]["identity"], "web<7>.example.net");
    assert_eq!(v["pending"][0]["facts"]["os"], "linux");
    // Without a token: the list and the commands, no form; a POST is refused.
    let (_, page) = ask(addr, "GET", "/", "", "").await;
    assert!(page.contains("Paused by alice@prov1"), "{page}");
    assert!(page.contains("helper &lt;2.4&gt; broken"));
    assert!(page.contains("Deny list: 3 entries"));
    assert!(page.contains("web&lt;7&gt;.example.net"));
    assert!(!page.contains("<form"), "{page}");
    let origin = format!("Origin: http://{addr}\r\n");
    let body = format!("csrf={CSRF}&identity=web%3C7%3E.example.net");
    let (st, text) = ask(addr, "POST", "/pending/approve", &origin, &body).await;
    assert_eq!(st, 403, "{text}");
    assert!(text.contains("monitor_token_file"), "{text}");
    stop.cancel();
}

#[tokio::test]
async fn a_form_post_needs_the_token_the_csrf_token_and_the_origin() {
    let (addr, fake, stop) = serve(Some("t0ken")).await;
    let auth = "Authorization: Bearer t0ken\r\n";
    let (_, page) = ask(addr, "GET", "/", auth, "").await;
    assert!(page.contains("action=\"/pending/approve\""), "{page}");
    assert!(page.contains("action=\"/pending/reject\""));
    assert!(page.contains(CSRF));
    assert!(
        !page.contains("http-equiv=\"refresh\""),
        "a page with forms is not reloaded"
    );
    let origin = format!("Origin: http://{addr}\r\n");
    let good = format!("csrf={CSRF}&identity=web%3C7%3E.example.net&token=t0ken");
    // No Origin, another origin, a wrong CSRF token, no token: refused, nothing decided.
    for (headers, body, want) in [
        (String::new(), good.clone(), 403),
        (
            "Origin: http://evil.example\r\n".to_string(),
            good.clone(),
            403,
        ),
        (origin.clone(), good.replace(CSRF, "bad"), 403),
        (origin.clone(), format!("csrf={CSRF}&identity=x"), 401),
        (
            origin.clone(),
            format!("csrf={CSRF}&identity=x&token=wrong"),
            401,
        ),
    ] {
        let (st, text) = ask(addr, "POST", "/pending/approve", &headers, &body).await;
        assert_eq!(st, want, "{headers:?} {body}: {text}");
    }
    // A GET of the action decides nothing either.
    let (st, _) = ask(addr, "GET", "/pending/approve", auth, "").await;
    assert_ne!(st, 200);
    assert!(fake.decided.lock().unwrap().is_empty());
    // The token typed in the form, or in the header.
    let (st, text) = ask(addr, "POST", "/pending/approve", &origin, &good).await;
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("decided web&lt;7&gt;.example.net"), "{text}");
    let headers = format!("{origin}{auth}");
    let (st, text) = ask(
        addr,
        "POST",
        "/pending/reject",
        &headers,
        &format!("csrf={CSRF}&identity=n2&reason="),
    )
    .await;
    assert_eq!(st, 400, "a rejection needs a reason: {text}");
    let (st, _) = ask(
        addr,
        "POST",
        "/pending/reject",
        &headers,
        &format!("csrf={CSRF}&identity=n2&reason=not+ours"),
    )
    .await;
    assert_eq!(st, 200);
    let d = fake.decided.lock().unwrap().clone();
    assert_eq!(
        d,
        vec![
            (
                "web<7>.example.net".into(),
                true,
                String::new(),
                "status-page@prov1".into()
            ),
            (
                "n2".into(),
                false,
                "not ours".into(),
                "status-page@prov1".into()
            ),
        ]
    );
    stop.cancel();
}
