//! The monitor listener under abuse while a fleet is provisioned.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use test_support::process::{nofile, set_nofile};

use crate::harness::{setup, wait_for, Env, Setup};

/// The listener's header read timeout and connection cap (crates/provisioner-metrics/src/http.rs).
pub const MONITOR_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
pub const MONITOR_CAP: usize = 256;
/// The longest a scrape may take while the listener is abused.
pub const SCRAPE_BOUND: Duration = Duration::from_secs(2);

/// Scrapes `/metrics` on `port` every 250 ms until `stop`, recording how long each took and
/// each failure (no complete answer within [`SCRAPE_BOUND`] counts as one).
struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<(Vec<Duration>, Vec<String>)>,
}

impl Scraper {
    fn start(port: u16) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let (mut took, mut failed) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match timed_scrape(port) {
                        Ok(()) => took.push(t.elapsed()),
                        Err(e) => failed.push(format!("{e:#}")),
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                (took, failed)
            })
        };
        Scraper { stop, handle }
    }

    /// Stop; fail on any failed scrape; the number of scrapes and the slowest.
    fn finish(self) -> Result<(usize, Duration)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (took, failed) = self
            .handle
            .join()
            .map_err(|_| anyhow::anyhow!("the scraper thread panicked"))?;
        ensure!(
            failed.is_empty(),
            "{} of {} scrapes failed, the first: {}",
            failed.len(),
            failed.len() + took.len(),
            failed[0]
        );
        let slowest = took.iter().copied().max().unwrap_or_default();
        Ok((took.len(), slowest))
    }
}

/// One `GET /metrics` answered with 200 and the provisioned counter within [`SCRAPE_BOUND`].
pub fn timed_scrape(port: u16) -> Result<()> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    let (status, body) =
        test_support::metrics::http_get_raw(addr, "/metrics", "x", SCRAPE_BOUND)
            .with_context(|| format!("no complete answer after {:?}", start.elapsed()))?;
    ensure!(
        status == 200 && body.contains("choria_provisioner_provisioned"),
        "not a metrics page after {:?}: {:.80}",
        start.elapsed(),
        body
    );
    ensure!(
        start.elapsed() <= SCRAPE_BOUND,
        "answered after {:?}",
        start.elapsed()
    );
    Ok(())
}

/// Whether the server closed `s` (end of file or an error on a non-blocking read).
pub fn closed_by_peer(s: &std::net::TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let mut r = s;
    let mut b = [0u8; 256];
    loop {
        match r.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

pub fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

pub fn monitor_slowloris(env: &Env, name: &str) -> Result<String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CLIENTS: usize = 8;
    let nodes = 400;
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let port = run.provisioners[p].port;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    // Each client sends one header byte a second and never finishes its request; when the
    // provisioner closes the connection it notes how long it lasted and starts again.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || -> Result<Vec<Duration>> {
                let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
                let mut lasted = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let s = std::net::TcpStream::connect(("127.0.0.1", port))?;
                    let start = Instant::now();
                    let mut w = &s;
                    for &byte in head.iter().chain(std::iter::repeat(&b'a')) {
                        if stop.load(Ordering::Relaxed) {
                            return Ok(lasted);
                        }
                        if w.write_all(&[byte]).is_err() || closed_by_peer(&s) {
                            lasted.push(start.elapsed());
                            break;
                        }
                        ensure!(
                            start.elapsed() < Duration::from_secs(60),
                            "a slowloris connection was still open after 60 s"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
                Ok(lasted)
            })
        })
        .collect();
    // Let the first connections run into the timeout before the fleet starts.
    std::thread::sleep(Duration::from_secs(2));
    let scraper = Scraper::start(port);
    let sim = run.start_sim("fleet", "n", nodes, &[])?;
    let took = run.wait_metric(
        p,
        "the fleet to be provisioned beside the slowloris clients",
        "choria_provisioner_provisioned",
        nodes as f64,
        Duration::from_secs(120),
    )?;
    // Past one more header timeout, so every client has been cut off at least once.
    std::thread::sleep(MONITOR_HEADER_TIMEOUT + Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let (scrapes, slowest) = scraper.finish()?;
    let mut lasted = Vec::new();
    for c in clients {
        lasted.extend(
            c.join()
                .map_err(|_| anyhow::anyhow!("a slowloris thread panicked"))??,
        );
    }
    let report = sim.finish()?;
    ensure!(
        report.values().all(|n| n.provisioned),
        "not every node was provisioned"
    );
    ensure!(
        lasted.len() >= CLIENTS,
        "only {} slowloris connections were closed by the provisioner",
        lasted.len()
    );
    let longest = lasted.iter().copied().max().unwrap_or_default();
    ensure!(
        longest <= MONITOR_HEADER_TIMEOUT + Duration::from_secs(2),
        "a slowloris connection lasted {longest:?}, past the {MONITOR_HEADER_TIMEOUT:?} header timeout"
    );
    run.alive(p)?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes provisioned in {:.1}s beside {CLIENTS} slowloris clients; {} of their connections cut off, the longest after {:.1}s; {scrapes} scrapes, the slowest {} ms",
        took.as_secs_f64(),
        lasted.len(),
        longest.as_secs_f64(),
        slowest.as_millis()
    ))
}

pub fn monitor_idle_flood(env: &Env, name: &str) -> Result<String> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const FLOOD: usize = 1000;
    let nodes = 400;
    // The flood holds 1,000 sockets in this process.
    let me = std::process::id();
    if let Some((soft, hard)) = nofile(me) {
        if soft < 4096 {
            ensure!(hard >= 4096, "the fault suite needs 4,096 descriptors for this scenario; the hard limit is {hard}");
            set_nofile(me, hard, hard)?;
        }
    }
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let port = run.provisioners[p].port;
    let pid = run.provisioners[p].proc.pid();
    // The limit a service gets without LimitNOFILE: the flood must not exhaust it.
    set_nofile(pid, 1024, 1024)?;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let reopened = std::sync::Arc::new(AtomicUsize::new(0));
    // Keeps FLOOD silent connections open: every half second each one the provisioner closed is
    // opened again.
    let flooder = {
        let stop = std::sync::Arc::clone(&stop);
        let reopened = std::sync::Arc::clone(&reopened);
        std::thread::spawn(move || -> Result<()> {
            let connect = || std::net::TcpStream::connect(("127.0.0.1", port));
            let mut conns = (0..FLOOD)
                .map(|_| connect())
                .collect::<std::io::Result<Vec<_>>>()?;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
                for c in conns.iter_mut() {
                    if closed_by_peer(c) {
                        *c = connect()?;
                        reopened.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(())
        })
    };
    // The flood at its steady state (past one header timeout) before the fleet starts.
    std::thread::sleep(MONITOR_HEADER_TIMEOUT + Duration::from_secs(1));
    let scraper = Scraper::start(port);
    let sim = run.start_sim("fleet", "n", nodes, &[])?;
    let mut most_fds = 0;
    let took = wait_for(
        "the fleet to be provisioned during the flood",
        Duration::from_secs(120),
        || {
            run.alive(p)?;
            most_fds = most_fds.max(open_descriptors(pid));
            Ok(sim.provisioned() >= nodes)
        },
    )?;
    let fleet_count = run.metric(p, "choria_provisioner_provisioned");
    stop.store(true, Ordering::Relaxed);
    flooder
        .join()
        .map_err(|_| anyhow::anyhow!("the flood thread panicked"))??;
    let (scrapes, slowest) = scraper.finish()?;
    let report = sim.finish()?;
    ensure!(
        report.values().all(|n| n.provisioned),
        "not every node was provisioned"
    );
    ensure!(
        fleet_count >= nodes as f64,
        "the provisioner counted {fleet_count} of {nodes} nodes provisioned"
    );
    ensure!(
        most_fds <= MONITOR_CAP + 100,
        "the provisioner held {most_fds} descriptors during the flood (cap {MONITOR_CAP} connections)"
    );
    let log = run.log(p);
    let cap_lines = log
        .lines()
        .filter(|l| l.contains("at the limit of 256 open connections"))
        .count();
    ensure!(
        cap_lines > 0,
        "no log line says the connection limit was reached"
    );
    let accept_lines = log
        .lines()
        .filter(|l| l.contains("accepting a connection"))
        .count();
    ensure!(
        accept_lines == 0,
        "{accept_lines} accept failures logged: the descriptor limit was reached"
    );
    run.alive(p)?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes provisioned in {:.1}s while {FLOOD} idle connections were held (reopened {} times) against a 1024-descriptor limit; the provisioner held at most {most_fds} descriptors; {scrapes} scrapes, the slowest {} ms; {cap_lines} connection-limit log lines",
        took.as_secs_f64(),
        reopened.load(Ordering::Relaxed),
        slowest.as_millis()
    ))
}
