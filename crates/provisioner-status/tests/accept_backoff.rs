//! A monitor listener out of file descriptors: `accept` fails until connections close. It must
//! back off (not spin a core), log at most about a line a second, and serve again once
//! descriptors are free.
//!
//! The listener runs in a child process (this test binary again, running the ignored
//! `child_listener_with_few_descriptors`) whose descriptor limit is lowered to 64 with
//! `prlimit`, so the test's own sockets do not share the limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "MONITOR_ACCEPT_BACKOFF_CHILD";
const CHILD_TEST: &str = "child_listener_with_few_descriptors";
const CHILD_NOFILE: u32 = 64;

/// Run only as the child of `accept_errors_are_backed_off_and_logged_at_most_once_a_second`.
#[test]
#[ignore = "the child half of accept_errors_are_backed_off_and_logged_at_most_once_a_second"]
fn child_listener_with_few_descriptors() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let me = std::process::id();
    let (_, hard) = test_support::process::nofile(me).unwrap();
    test_support::process::set_nofile(me, CHILD_NOFILE.into(), hard).unwrap();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let m = provisioner_metrics::Metrics::new("child");
    let addr = rt
        .block_on(provisioner_status::serve(
            "127.0.0.1:0".parse().unwrap(),
            m,
            stop.clone(),
        ))
        .unwrap()
        .local_addr();
    println!("LISTENING {addr}");
    std::io::stdout().flush().unwrap();
    // Serve until the parent closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    stop.cancel();
}

/// User plus system CPU time of `pid`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which is in parentheses): state is the first, utime the
    // 12th and stime the 13th.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz: u64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100);
    Duration::from_millis(ticks * 1000 / hz)
}

fn get(addr: SocketAddr) -> std::io::Result<u16> {
    test_support::metrics::http_get_raw(addr, "/metrics", "x", Duration::from_secs(2))
        .map(|(status, _)| status)
}

#[test]
fn accept_errors_are_backed_off_and_logged_at_most_once_a_second() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", CHILD_TEST, "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let lines: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let stderr = child.stderr.take().unwrap();
    let reader = {
        let lines = Arc::clone(&lines);
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { break };
                lines.lock().unwrap().push((Instant::now(), l));
            }
        })
    };
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr: SocketAddr = loop {
        let mut l = String::new();
        assert!(
            out.read_line(&mut l).unwrap() > 0,
            "the child exited before listening: {:?}",
            lines.lock().unwrap()
        );
        // libtest may print `test <name> ... ` on the same line first.
        if let Some((_, a)) = l.trim().split_once("LISTENING ") {
            break a.parse().unwrap();
        }
    };
    assert_eq!(get(addr).unwrap(), 200);

    // Twice the child's descriptors in connections, left silent: its accept fails with EMFILE
    // until the header timeout closes the accepted ones (5 s).
    let flood: Vec<TcpStream> = (0..2 * CHILD_NOFILE)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let failing = |lines: &[(Instant, String)]| {
        lines
            .iter()
            .filter(|(_, l)| l.contains("accept") && l.contains("failed"))
            .count()
    };
    assert!(
        failing(&lines.lock().unwrap()) > 0,
        "no accept failure was logged: is the descriptor limit in place? {:?}",
        lines.lock().unwrap()
    );
    let window_start = Instant::now();
    let cpu_before = cpu_time(pid);
    std::thread::sleep(Duration::from_secs(3));
    let cpu = cpu_time(pid).saturating_sub(cpu_before);
    let window = window_start.elapsed();
    let logged = {
        let l = lines.lock().unwrap();
        l.iter()
            .filter(|(t, l)| *t >= window_start && l.contains("accept") && l.contains("failed"))
            .count()
    };
    // The failures were still going on at the end of the window, so the backoff was tested.
    let still_failing = lines
        .lock()
        .unwrap()
        .iter()
        .any(|(t, l)| *t >= window_start + Duration::from_secs(2) && l.contains("failed"));

    // Once the silent connections are gone the listener serves again, within the 1 s backoff.
    drop(flood);
    let recovered = Instant::now();
    let status = loop {
        match get(addr) {
            Ok(s) => break s,
            Err(e) if recovered.elapsed() < Duration::from_secs(5) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("no answer 5 s after the flood closed: {e}"),
        }
    };
    let recovery = recovered.elapsed();
    drop(child.stdin.take());
    let st = child.wait().unwrap();
    reader.join().unwrap();

    assert!(
        cpu < Duration::from_millis(300),
        "the listener used {cpu:?} of CPU in {window:?} while accept failed"
    );
    assert!(
        logged <= 5,
        "{logged} accept-failure lines in {window:?}: {:?}",
        lines
            .lock()
            .unwrap()
            .iter()
            .rev()
            .take(5)
            .collect::<Vec<_>>()
    );
    assert!(
        still_failing,
        "accept stopped failing early; the window saw {logged} lines"
    );
    assert_eq!(status, 200);
    assert!(st.success(), "the child failed: {st}");
    eprintln!(
        "accept failing: {cpu:?} CPU and {logged} log lines in {window:?}; serving again {recovery:?} after the flood closed"
    );
}
