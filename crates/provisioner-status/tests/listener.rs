//! The monitor listener under abuse, over real sockets: an idle-connection flood larger than the
//! connection cap, a slowloris client, kept-alive connections left idle, and the dual-stack
//! default bind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use provisioner_metrics::Metrics;
use provisioner_status::serve;
use tokio_util::sync::CancellationToken;

/// The cap of the listener (`MAX_CONNECTIONS` in src/http.rs).
const CAP: usize = 256;
/// The header read timeout of the listener (`HEADER_READ_TIMEOUT` in src/http.rs).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

async fn start(addr: SocketAddr) -> (Arc<Metrics>, SocketAddr, CancellationToken) {
    let m = Metrics::new("test");
    m.provisioned.inc();
    let stop = CancellationToken::new();
    let bound = serve(addr, m.clone(), stop.clone())
        .await
        .unwrap()
        .local_addr();
    (m, bound, stop)
}

/// One `GET path` with `Connection: close`; the status and the time to the full answer.
fn get(addr: SocketAddr, path: &str, limit: Duration) -> std::io::Result<(u16, String)> {
    test_support::metrics::http_get_raw(addr, path, "x", limit)
}

/// Whether the server has closed `s`: a read sees end of file or a reset.
fn closed_by_server(s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 512];
    let mut r = s;
    let closed = loop {
        match r.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    closed
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Raises this process's soft descriptor limit to its hard limit (the flood holds both ends of
/// about 1,300 connections in one process), failing with a clear message when that is too low.
fn enough_descriptors(needed: u64) {
    let me = std::process::id();
    let (soft, hard) = test_support::process::nofile(me).unwrap();
    if soft >= needed {
        return;
    }
    assert!(
        hard >= needed,
        "this test needs {needed} file descriptors; the hard limit is {hard}"
    );
    test_support::process::set_nofile(me, hard, hard).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_flood_over_the_cap_keeps_few_sockets_and_does_not_block_a_scrape() {
    const FLOOD: usize = 1000;
    enough_descriptors(4096);
    let (_m, addr, stop) = start((Ipv4Addr::LOCALHOST, 0).into()).await;
    let baseline = open_fds();

    let report = tokio::task::spawn_blocking(move || {
        // 1,000 connections opened and left silent.
        let flood: Vec<TcpStream> = (0..FLOOD)
            .map(|i| {
                TcpStream::connect(addr).unwrap_or_else(|e| panic!("flood connection {i}: {e}"))
            })
            .collect();

        // A scraper arriving now is answered at once: it does not wait for the header timeout
        // to clear the flood.
        let t = Instant::now();
        let (status, body) = get(addr, "/metrics", Duration::from_secs(3)).unwrap();
        let scrape = t.elapsed();
        assert_eq!(status, 200);
        assert!(body.contains("choria_provisioner_provisioned{site=\"test\"} 1"));
        assert!(
            scrape < Duration::from_secs(2),
            "the scrape took {scrape:?} behind {FLOOD} idle connections"
        );

        // The server holds at most the cap: every flood connection over it was closed, and
        // this process (both ends) holds the flood plus at most the cap.
        let deadline = Instant::now() + Duration::from_secs(3);
        let (mut closed, mut fds);
        loop {
            closed = flood.iter().filter(|s| closed_by_server(s)).count();
            fds = open_fds();
            if (closed >= FLOOD - CAP && fds <= baseline + FLOOD + CAP + 8)
                || Instant::now() > deadline
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            closed >= FLOOD - CAP,
            "only {closed} of {FLOOD} idle connections were closed by the server"
        );
        assert!(
            fds <= baseline + FLOOD + CAP + 8,
            "{fds} descriptors open ({baseline} before the flood): the server holds more than {CAP} connections"
        );

        // The rest go with the header timeout.
        let deadline = Instant::now() + HEADER_TIMEOUT + Duration::from_secs(4);
        loop {
            closed = flood.iter().filter(|s| closed_by_server(s)).count();
            if closed == FLOOD || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        assert_eq!(
            closed, FLOOD,
            "idle connections left open past the header timeout"
        );
        // Still serving.
        let (status, _) = get(addr, "/healthz", Duration::from_secs(3)).unwrap();
        assert_eq!(status, 200);
        format!("scrape answered in {scrape:?}")
    })
    .await
    .unwrap();
    eprintln!("{report}");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_client_is_disconnected_by_the_header_timeout() {
    let (_m, addr, stop) = start((Ipv4Addr::LOCALHOST, 0).into()).await;
    let took = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let start = Instant::now();
        // One header byte a second, never ending the head.
        let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for &byte in head.iter().cycle().take(20) {
            if s.write_all(&[byte]).is_err() || closed_by_server(&s) {
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
                assert!(
                    !String::from_utf8_lossy(&rest).contains("200 OK"),
                    "an unfinished request was answered"
                );
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        panic!("a client sending one header byte a second was still connected after 20 s");
    })
    .await
    .unwrap();
    assert!(
        took >= HEADER_TIMEOUT - Duration::from_millis(500) && took < HEADER_TIMEOUT * 2,
        "disconnected after {took:?}, expected about {HEADER_TIMEOUT:?}"
    );
    // Meanwhile and afterwards, scrapes are answered.
    let (status, _) =
        tokio::task::spawn_blocking(move || get(addr, "/metrics", Duration::from_secs(3)).unwrap())
            .await
            .unwrap();
    assert_eq!(status, 200);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_left_idle_is_closed() {
    let (_m, addr, stop) = start((Ipv4Addr::LOCALHOST, 0).into()).await;
    let took = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        // A keep-alive request, answered; then nothing more is sent.
        write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut b = [0u8; 1024];
        let n = s.read(&mut b).unwrap();
        assert!(String::from_utf8_lossy(&b[..n]).starts_with("HTTP/1.1 200"));
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if closed_by_server(&s) {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("an idle kept-alive connection was still open after 20 s");
    })
    .await
    .unwrap();
    assert!(
        took < HEADER_TIMEOUT * 2,
        "closed after {took:?}, expected about {HEADER_TIMEOUT:?}"
    );
    stop.cancel();
}

fn ipv6_loopback_available() -> bool {
    std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_bind_answers_ipv4_and_ipv6_clients() {
    // `[::]` is what an empty monitor_address binds.
    let (_m, bound, stop) = start((Ipv6Addr::UNSPECIFIED, 0).into()).await;
    let port = bound.port();
    let v6 = ipv6_loopback_available();
    let answers = tokio::task::spawn_blocking(move || {
        let mut out = vec![get(
            (Ipv4Addr::LOCALHOST, port).into(),
            "/metrics",
            Duration::from_secs(3),
        )
        .map(|(s, _)| s)
        .unwrap_or_else(|e| panic!("IPv4 client on the default bind {bound}: {e}"))];
        if v6 {
            out.push(
                get(
                    (Ipv6Addr::LOCALHOST, port).into(),
                    "/metrics",
                    Duration::from_secs(3),
                )
                .map(|(s, _)| s)
                .unwrap_or_else(|e| panic!("IPv6 client on the default bind {bound}: {e}")),
            );
        }
        out
    })
    .await
    .unwrap();
    assert!(answers.iter().all(|s| *s == 200), "{answers:?}");
    if v6 {
        assert_eq!(answers.len(), 2);
        assert_eq!(bound.ip(), Ipv6Addr::UNSPECIFIED);
    } else {
        // A host without IPv6 gets every IPv4 interface instead.
        assert!(bound.ip().is_unspecified());
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_address_is_the_only_one_bound() {
    let (_m, bound, stop) = start((Ipv4Addr::LOCALHOST, 0).into()).await;
    assert_eq!(bound.ip(), Ipv4Addr::LOCALHOST);
    let port = bound.port();
    let v6 = ipv6_loopback_available();
    tokio::task::spawn_blocking(move || {
        let (status, _) = get(bound, "/healthz", Duration::from_secs(3)).unwrap();
        assert_eq!(status, 200);
        if v6 {
            let e = TcpStream::connect_timeout(
                &(Ipv6Addr::LOCALHOST, port).into(),
                Duration::from_secs(2),
            )
            .expect_err("a listener bound to 127.0.0.1 answered on ::1");
            assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
        }
    })
    .await
    .unwrap();
    stop.cancel();
}
