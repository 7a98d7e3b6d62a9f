//! The monitoring endpoints over real HTTP on a loopback port.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::TcpStream;

use provisioner_metrics::{Metrics, Role};
use provisioner_status::serve;
use tokio_util::sync::CancellationToken;

fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    let status = buf.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = buf.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// [`get`] on a blocking thread.
async fn fetch(addr: std::net::SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || get(addr, path))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_metrics_health_and_readiness() {
    let m = Metrics::new("test");
    let stop = CancellationToken::new();
    let serving = serve("127.0.0.1:0".parse().unwrap(), m.clone(), stop.clone())
        .await
        .unwrap();
    let addr = serving.local_addr();
    m.provisioned.inc();

    let (status, body) = fetch(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("choria_provisioner_provisioned{site=\"test\"} 1"));

    let (status, _) = fetch(addr, "/healthz").await;
    assert_eq!(status, 200);

    let (status, body) = fetch(addr, "/readyz").await;
    assert_eq!(status, 503, "not connected yet: {body}");
    m.set_connected(true);
    m.set_role(Role::Standby);
    let (status, body) = fetch(addr, "/readyz").await;
    assert_eq!(status, 200);
    assert!(body.contains("standby"));

    let (status, _) = fetch(addr, "/nope").await;
    assert_eq!(status, 404);
    stop.cancel();
    // Nothing of the server outlives its shutdown: the accept loop and every connection task
    // are tracked and end.
    tokio::time::timeout(std::time::Duration::from_secs(5), serving.stopped())
        .await
        .expect("the server's tasks end after shutdown");
}
