//! The daemon's monitor listener: where it binds (`monitor_address`), what `check` says about
//! it and the identity and CSR name rules, and the series a running provisioner exports besides
//! its own: go-choria's connector and election series and the standard process series.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::ErrorKind;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use test_support::metrics::{http_get_at, http_get_raw, parse, Sample};

fn get(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    http_get_raw(addr, path, "x", Duration::from_secs(3)).map(|(status, _)| status)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The one unlabelled sample `name` of a scrape.
fn value(samples: &[Sample], name: &str) -> f64 {
    let found: Vec<&Sample> = samples.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "{name}: {found:?}");
    assert!(found[0].labels.is_empty(), "{name}: {found:?}");
    found[0].value
}

/// Every line of an exposition is a comment or a sample that parses, and each family has its
/// HELP and TYPE once.
fn assert_well_formed(text: &str) {
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    let samples = lines.iter().filter(|l| !l.starts_with('#')).count();
    assert_eq!(
        parse(text).len(),
        samples,
        "a sample line does not parse:\n{text}"
    );
    let mut types = std::collections::BTreeSet::new();
    for l in lines.iter().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split_whitespace().nth(2).unwrap();
        assert!(types.insert(name), "{name} typed twice:\n{text}");
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP"
        );
    }
}

fn ipv6_loopback_available() -> bool {
    std::net::TcpListener::bind((Ipv6Addr::LOCALHOST, 0)).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_monitor_address_ipv4_and_ipv6_clients_are_answered() {
    let env = Env::new();
    let mut prov = env.start_ready(&env.plain()).await;
    let port = prov.port;
    let out = prov.output();
    let v6 = ipv6_loopback_available();
    if v6 {
        assert!(
            out.contains(&format!(
                "serving /metrics, /healthz and /readyz on [::]:{port} (every interface, IPv4 and IPv6)"
            )),
            "{out}"
        );
    }
    let (v4_status, v6_status) = tokio::task::spawn_blocking(move || {
        (
            get((Ipv4Addr::LOCALHOST, port).into(), "/healthz").unwrap(),
            v6.then(|| get((Ipv6Addr::LOCALHOST, port).into(), "/metrics").unwrap()),
        )
    })
    .await
    .unwrap();
    assert_eq!(v4_status, 200);
    if v6 {
        assert_eq!(v6_status, Some(200), "no answer on [::1]:{port}");
    }
    prov.stop_with("TERM").await;
}

/// A running provisioner's `/metrics`, fetched over IPv4 and IPv6, carries the process series
/// (read from its own `/proc`) and go-choria's connector series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_over_ipv4_and_ipv6_carry_the_process_and_connector_series() {
    let env = Env::new();
    let before = now();
    let mut prov = env.start(&env.plain());
    let after = now();
    prov.wait_ready().await;
    let port = prov.port;
    let pid = prov.0.pid();
    let v6 = ipv6_loopback_available();
    let (v4, v6_answer) = tokio::task::spawn_blocking(move || {
        (
            http_get_at((Ipv4Addr::LOCALHOST, port).into(), "/metrics")
                .expect("/metrics over IPv4"),
            v6.then(|| {
                http_get_at((Ipv6Addr::LOCALHOST, port).into(), "/metrics")
                    .expect("/metrics over IPv6")
            }),
        )
    })
    .await
    .unwrap();
    let mut pages = vec![v4];
    pages.extend(v6_answer);
    for (status, text) in &pages {
        assert_eq!(*status, 200, "{text}");
        assert_well_formed(text);
        let samples = parse(text);

        let start = value(&samples, "process_start_time_seconds");
        assert!(
            start >= before - 1.0 && start <= after + 1.0,
            "start time {start} not within [{before}, {after}]"
        );
        let open = value(&samples, "process_open_fds");
        let max = value(&samples, "process_max_fds");
        assert!(open >= 3.0 && open <= max, "open {open}, max {max}");
        // The provisioner's own descriptors, counted the same way.
        let own = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count() as f64;
        assert!((open - own).abs() < 16.0, "open {open}, /proc says {own}");
        let rss = value(&samples, "process_resident_memory_bytes");
        let vsize = value(&samples, "process_virtual_memory_bytes");
        assert!(rss > 1e6 && vsize >= rss, "rss {rss}, vsize {vsize}");
        assert!(value(&samples, "process_virtual_memory_max_bytes") > 0.0);
        assert!(value(&samples, "process_cpu_seconds_total") >= 0.0);
        assert!(value(&samples, "process_network_receive_bytes_total") >= 0.0);
        assert!(value(&samples, "process_network_transmit_bytes_total") >= 0.0);
        for (name, kind) in [
            ("process_cpu_seconds_total", "counter"),
            ("process_start_time_seconds", "gauge"),
            ("choria_connector_reconnections", "counter"),
            ("choria_connector_initial_connect_time", "summary"),
        ] {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        }
        // Go runtime series are not imitated.
        assert!(!samples.iter().any(|s| s.name.starts_with("go_")), "{text}");

        // One connection, made at the first try, never lost.
        assert_eq!(value(&samples, "choria_connector_reconnections"), 0.0);
        assert_eq!(value(&samples, "choria_connector_connection_closed"), 0.0);
        assert_eq!(value(&samples, "choria_connector_errors"), 0.0);
        assert_eq!(
            value(&samples, "choria_connector_initial_connection_attempts"),
            0.0
        );
        assert_eq!(
            value(&samples, "choria_connector_initial_connect_time_count"),
            1.0
        );
        let connect_time = value(&samples, "choria_connector_initial_connect_time_sum");
        assert!(connect_time > 0.0 && connect_time < 10.0, "{connect_time}");
        // No election without leader_election.
        assert!(
            !samples
                .iter()
                .any(|s| s.name.starts_with("choria_election_")),
            "{text}"
        );
    }
    prov.stop_with("TERM").await;
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// Under the packaged unit's `ProcSubset=pid` (`/proc` mounted with `subset=pid`, so no
/// `/proc/stat` and no boot time) every process series is still exported and the start time is
/// still right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_series_under_proc_subset_pid() {
    if !running_as_root() {
        eprintln!("skipped: mounting /proc with subset=pid in a mount namespace needs root");
        return;
    }
    let env = Env::new();
    let mut launch = env.prepare(&env.plain());
    // The binary runs under a shell in a mount namespace of its own, which mounts /proc with
    // subset=pid first; the generated arguments follow the binary.
    launch.program = "unshare".into();
    launch.args = [
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t proc -o subset=pid proc /proc && exec \"$0\" \"$@\"",
        BIN,
    ]
    .map(String::from)
    .to_vec();
    launch.name = "subset-pid".into();
    launch.out = env.path().join("subset-pid.out");
    let before = now();
    let mut prov = Prov::launch(&launch);
    let after = now();
    prov.wait_ready().await;
    // It really runs with the restricted /proc.
    let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", prov.pid())).unwrap();
    assert!(
        mounts
            .lines()
            .any(|l| l.contains(" /proc ") && l.contains("subset=pid")),
        "{mounts}"
    );
    let text = prov.metrics();
    let samples = parse(&text);
    for name in [
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_virtual_memory_bytes",
        "process_virtual_memory_max_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
        "process_network_receive_bytes_total",
        "process_network_transmit_bytes_total",
    ] {
        assert!(
            samples.iter().any(|s| s.name == name),
            "{name} missing:\n{text}"
        );
    }
    let start = value(&samples, "process_start_time_seconds");
    assert!(
        start >= before - 1.0 && start <= after + 1.0,
        "start time {start} not within [{before}, {after}]"
    );
    // As the Go client computes it from the host's boot time and the process's start tick;
    // `btime` is in whole seconds, so that value itself may be up to a second early.
    let btime: f64 = std::fs::read_to_string("/proc/stat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", prov.pid())).unwrap();
    let ticks: f64 = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap();
    let expected = btime + ticks / 100.0;
    assert!(
        (start - expected).abs() < 1.05,
        "start time {start}, Go's computation gives {expected}"
    );
    prov.stop_with("TERM").await;
}

/// The connector series count what go-choria counts: failed tries of the first connection
/// while the broker is down, the time the first connection took once it came, and a
/// reconnection after a broker restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connector_series_count_a_late_broker_and_a_reconnection() {
    let mut env = Env::new();
    env.nats.stop();
    let spawned = std::time::Instant::now();
    let mut prov = env.start(&env.plain());
    let scrape = |prov: &Prov| parse(&prov.metrics());
    let sample = |samples: &[Sample], name: &str| {
        samples
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.value)
            .unwrap_or(-1.0)
    };
    // The listener answers while the first connection is being tried.
    assert!(
        wait_until(Duration::from_secs(20), || {
            sample(
                &scrape(&prov),
                "choria_connector_initial_connection_attempts",
            ) >= 2.0
        })
        .await,
        "no failed connection tries counted:\n{}\n{}",
        prov.metrics(),
        prov.output()
    );
    let waiting = scrape(&prov);
    assert_eq!(
        sample(&waiting, "choria_connector_initial_connect_time_count"),
        0.0
    );
    // The first connection has been tried for at least a second when the broker comes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.nats.start_again().unwrap();
    prov.wait_ready().await;
    let up = scrape(&prov);
    assert_eq!(
        sample(&up, "choria_connector_initial_connect_time_count"),
        1.0
    );
    let took = sample(&up, "choria_connector_initial_connect_time_sum");
    assert!(took >= 1.0, "the first connection took {took} s");
    assert!(took <= spawned.elapsed().as_secs_f64(), "{took}");
    let attempts = sample(&up, "choria_connector_initial_connection_attempts");
    assert!(attempts >= 2.0, "{attempts}");
    assert_eq!(sample(&up, "choria_connector_reconnections"), 0.0);

    env.nats.restart();
    assert!(
        wait_until(Duration::from_secs(30), || {
            sample(&scrape(&prov), "choria_connector_reconnections") >= 1.0
        })
        .await,
        "no reconnection counted:\n{}\n{}",
        prov.metrics(),
        prov.output()
    );
    let after = scrape(&prov);
    // The first connection's series do not move again.
    assert_eq!(
        sample(&after, "choria_connector_initial_connect_time_count"),
        1.0
    );
    assert_eq!(
        sample(&after, "choria_connector_initial_connection_attempts"),
        attempts
    );
    assert_eq!(sample(&after, "choria_connector_connection_closed"), 0.0);
    prov.stop_with("TERM").await;
}

/// With `leader_election`, go-choria's election series appear labelled with the election and
/// the identity: campaigns by state, the leader gauge once the key is won, the interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_series_are_exported_as_go_choria_labels_them() {
    let env = Env::new();
    create_election_bucket(&env.url()).await;
    let mut o = env.plain();
    o.identity = "provisioner-a".into();
    o.leader_election = true;
    let mut prov = env.start_ready(&o).await;
    let leads = || {
        prov.get("/readyz")
            .is_some_and(|(_, body)| body.trim().ends_with("leader"))
    };
    assert!(
        wait_until(Duration::from_secs(30), leads).await,
        "never led:\n{}",
        prov.output()
    );
    let text = prov.metrics();
    assert_well_formed(&text);
    let samples = parse(&text);
    let election = |name: &str, state: Option<&str>| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| {
                s.name == name
                    && s.label("election") == Some("provisioner")
                    && s.label("identity") == Some("provisioner-a")
                    && s.label("state") == state
            })
            .collect()
    };
    let leader = election("choria_election_leader", None);
    assert_eq!(leader.len(), 1, "{text}");
    assert_eq!(leader[0].value, 1.0);
    assert_eq!(leader[0].labels.len(), 2, "{:?}", leader[0]);
    let as_candidate = election("choria_election_campaigns", Some("candidate"));
    assert_eq!(as_candidate.len(), 1, "{text}");
    assert!(as_candidate[0].value >= 1.0);
    let as_leader = election("choria_election_campaigns", Some("leader"));
    assert_eq!(as_leader.len(), 1, "{text}");
    assert!(as_leader[0].value >= 1.0);
    let interval = election("choria_election_interval_seconds", None);
    assert_eq!(interval.len(), 1, "{text}");
    // A leader campaigns on TwentySec's first step: 500 ms ± 50 %.
    assert!(
        interval[0].value >= 0.25 && interval[0].value < 0.75,
        "{:?}",
        interval[0]
    );
    for (name, kind) in [
        ("choria_election_campaigns", "counter"),
        ("choria_election_leader", "gauge"),
        ("choria_election_interval_seconds", "gauge"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
    }
    // Campaigns go on while it leads.
    let first = as_leader[0].value;
    assert!(
        wait_until(Duration::from_secs(5), || {
            test_support::metrics::metric_with(
                &prov.metrics(),
                "choria_election_campaigns",
                "state",
                "leader",
            ) > first
        })
        .await
    );

    // A standby that never led: candidate campaigns only, and the leader gauge at 0.
    let mut o = env.plain();
    o.identity = "provisioner-b".into();
    o.leader_election = true;
    let mut standby = env.start_ready(&o).await;
    let candidate_campaigns = |p: &Prov| {
        parse(&p.metrics())
            .iter()
            .filter(|s| {
                s.name == "choria_election_campaigns"
                    && s.label("identity") == Some("provisioner-b")
                    && s.label("state") == Some("candidate")
            })
            .map(|s| s.value)
            .sum::<f64>()
    };
    assert!(
        wait_until(Duration::from_secs(30), || candidate_campaigns(&standby)
            >= 3.0)
        .await,
        "{}",
        standby.metrics()
    );
    let text = standby.metrics();
    let samples = parse(&text);
    assert!(
        !samples.iter().any(|s| s.label("state") == Some("leader")),
        "{text}"
    );
    // The leader gauge is there at 0 from the start (go-choria creates it on a first win), so
    // a pair without a leader is visible.
    let gauge: Vec<_> = samples
        .iter()
        .filter(|s| s.name == "choria_election_leader")
        .collect();
    assert_eq!(gauge.len(), 1, "{text}");
    assert_eq!(gauge[0].value, 0.0, "{text}");
    assert_eq!(gauge[0].label("identity"), Some("provisioner-b"));
    // A fourth campaign started, so at least three failed: the wait is TwentySec's fourth step
    // or a later one, 1.5 s ± 50 % at least.
    let interval = samples
        .iter()
        .find(|s| s.name == "choria_election_interval_seconds")
        .unwrap();
    assert_eq!(interval.label("identity"), Some("provisioner-b"));
    assert!(interval.value >= 0.75, "{interval:?}");
    assert!(is_ready_role(&standby, "standby"));
    standby.stop_with("TERM").await;
    prov.stop_with("TERM").await;
}

fn is_ready_role(p: &Prov, role: &str) -> bool {
    p.get("/readyz")
        .is_some_and(|(_, body)| body.trim().ends_with(role))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_address_binds_that_address_only() {
    let env = Env::new();
    let opts = env.plain().yaml("monitor_address: 127.0.0.1");
    let mut prov = env.start_ready(&opts).await;
    let port = prov.port;
    // The start-up line names that address alone (whatever fields the log format adds).
    let out = prov.output();
    let bound = format!("serving /metrics, /healthz and /readyz on 127.0.0.1:{port}");
    let line = out
        .lines()
        .find(|l| l.contains(&bound))
        .unwrap_or_else(|| panic!("{out}"));
    let rest = &line[line.find(&bound).unwrap() + bound.len()..];
    assert!(!rest.starts_with(" ("), "{line}");
    assert!(!out.contains("every interface"), "{out}");
    let v6 = ipv6_loopback_available();
    let (v4, v6_err) = tokio::task::spawn_blocking(move || {
        (
            get((Ipv4Addr::LOCALHOST, port).into(), "/healthz").unwrap(),
            v6.then(|| get((Ipv6Addr::LOCALHOST, port).into(), "/healthz").unwrap_err()),
        )
    })
    .await
    .unwrap();
    assert_eq!(v4, 200);
    if let Some(e) = v6_err {
        assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    }
    prov.stop_with("TERM").await;
}

#[test]
fn check_prints_the_monitor_address_and_the_identity_and_csr_name_rules() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let cfg = dir.path().join("c.cfg");
    std::fs::write(
        &cfg,
        "identity = prov1.example.net\nplugin.choria.middleware_hosts = nats://broker.example.net:4222\n",
    )
    .unwrap();
    let base = format!(
        "helper: {}\ntoken: x\nchoria_insecure: true\njwt_verify_cert: {}\nmonitor_port: 9100\n\
         features:\n  jwt: true\n",
        example_helper("helper-plain.py"),
        signer.public_hex
    );
    let run = |extra: &str| {
        let yaml = dir.path().join("p.yaml");
        std::fs::write(&yaml, format!("{base}{extra}")).unwrap();
        check_files(&yaml, &cfg).succeeded("check").stdout
    };
    let out = run("");
    test_support::assert_contains_all(
        &out,
        &[
            "monitoring: port 9100 on every interface, IPv4 and IPv6 (monitor_address unset)",
            "identities: the built-in grammar",
            "extra CSR DNS names: none (every DNS name must be the identity)",
        ],
    );
    let out = run(
        "monitor_address: 10.1.2.3\nidentity_pattern: '[a-z0-9-]+\\.lab'\n\
         csr_extra_dns_names: '[a-z0-9-]+\\.svc\\.lab'\n",
    );
    test_support::assert_contains_all(
        &out,
        &[
            "monitoring: port 9100 on 10.1.2.3 (monitor_address)",
            "identities: identity_pattern \"[a-z0-9-]+\\\\.lab\"",
            "extra CSR DNS names: csr_extra_dns_names \"[a-z0-9-]+\\\\.svc\\\\.lab\"",
        ],
    );
}
