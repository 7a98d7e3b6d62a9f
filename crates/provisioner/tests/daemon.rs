//! The daemon started from a library call, as another Rust tool embeds it: a real nats-server,
//! a simulated fleet in this process, a real helper process, and `Daemon::run` in the test's
//! runtime. The embedder's observer sees every node finish, and cancelling the shutdown token
//! drains and returns.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use choria_fleet_sim::crypto::JwtSigner;
use choria_fleet_sim::{FleetConfig, ProvisioningJwt, SimFleet};
use provision_core::events::{NodeEvent, NodeState};
use provision_core::{CancellationToken, Observer};
use provisioner::{Daemon, Paths, Settings};
use test_support::NatsServer;

const NODES: usize = 25;

/// Counts the cycles that ended provisioned.
#[derive(Default)]
struct Provisioned(AtomicUsize);

impl Observer for Provisioned {
    fn node_event(&self, _identity: &str, event: &NodeEvent<'_>) {
        if let NodeEvent::Finished(v) = event {
            if v.state == NodeState::Provisioned {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_is_provisioned_by_the_daemon_started_from_the_library() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let signer = JwtSigner::from_key_data(hex::encode([7u8; 32]).as_bytes()).unwrap();
    let fleet = SimFleet::start(FleetConfig::new(
        nats.url(),
        NODES,
        "s3cret",
        ProvisioningJwt::Sign(signer),
    ))
    .await
    .unwrap();

    // A helper process: the node's input on stdin, a configuration that turns provisioning off.
    let helper = dir.path().join("helper.sh");
    test_support::write_executable(
        &helper,
        "#!/bin/sh\ncat >/dev/null\n\
         echo '{\"defer\":false,\"msg\":\"ok\",\"configuration\":{\"plugin.choria.server.provision\":\"false\"}}'\n",
    )
    .unwrap();
    let (yaml, cfg) = test_support::write_config(
        dir.path(),
        &format!(
            "helper: {}\ntoken: s3cret\nworkers: 4\nchoria_insecure: true\nlogfile: discard\n",
            helper.display()
        ),
        &format!(
            "identity = embedded.example.net\nplugin.choria.middleware_hosts = {}\n",
            nats.url()
        ),
    )
    .unwrap();

    let settings = Settings::load(&Paths::new(&yaml, &cfg)).unwrap();
    let provisioned = Arc::new(Provisioned::default());
    let daemon = Daemon::builder(settings)
        .observer(Arc::clone(&provisioned))
        .drain_grace(Duration::from_secs(2))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(daemon.run(shutdown.clone()));

    assert!(
        fleet.wait_provisioned(NODES, Duration::from_secs(60)).await,
        "{} of {NODES} nodes provisioned: {:?}",
        fleet.provisioned(),
        fleet.stats()
    );
    // The embedder's observer saw each node's cycle end provisioned.
    let seen = || provisioned.0.load(Ordering::SeqCst);
    for _ in 0..100 {
        if seen() >= NODES {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen(), NODES);

    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the daemon stops after its shutdown token is cancelled")
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
    fleet.shutdown().await;
}

#[test]
fn a_refused_setup_never_starts() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = test_support::write_config(
        dir.path(),
        "helper: /nonexistent/helper\nchoria_insecure: true\n",
        "identity = p1\nplugin.choria.middleware_hosts = nats://127.0.0.1:1\n",
    )
    .unwrap();
    let settings = Settings::load(&Paths::new(&yaml, &cfg)).unwrap();
    match Daemon::builder(settings).build() {
        Err(provisioner::Error::Refused { problems }) => {
            assert!(
                problems.iter().any(|p| p.contains("/nonexistent/helper")),
                "{problems:?}"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// A daemon with leader election on, against a broker with JetStream but no election bucket.
fn election_settings(dir: &std::path::Path, nats: &NatsServer, port: u16, wait: bool) -> Settings {
    let helper = dir.join("helper.sh");
    test_support::write_executable(&helper, "#!/bin/sh\ncat >/dev/null\necho '{}'\n").unwrap();
    let (yaml, cfg) = test_support::write_config(
        dir,
        &format!(
            "helper: {}\ntoken: s3cret\nchoria_insecure: true\nlogfile: discard\n\
             leader_election: true\nleader_election_wait: {wait}\nmonitor_port: {port}\n",
            helper.display()
        ),
        &format!(
            "identity = standby.example.net\nplugin.choria.middleware_hosts = {}\n",
            nats.url()
        ),
    )
    .unwrap();
    Settings::load(&Paths::new(&yaml, &cfg)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_that_cannot_start_stops_the_daemon_with_its_cause() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let port = test_support::free_port();
    let daemon = Daemon::builder(election_settings(dir.path(), &nats, port, false))
        .drain_grace(Duration::from_secs(1))
        .build()
        .unwrap();
    let stopped = tokio::time::timeout(
        Duration::from_secs(30),
        daemon.run(CancellationToken::new()),
    )
    .await
    .expect("the daemon stops by itself when its election cannot start");
    match stopped {
        Err(provisioner::Error::Election(e)) => {
            let text = e.to_string();
            assert!(text.contains("CHORIA_LEADER_ELECTION"), "{text}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_leader_election_wait_a_standby_says_why_it_cannot_campaign() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let port = test_support::free_port();
    let daemon = Daemon::builder(election_settings(dir.path(), &nats, port, true))
        .drain_grace(Duration::from_secs(1))
        .build()
        .unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(daemon.run(shutdown.clone()));

    // Not ready, and why; the election series say it does not lead.
    let mut seen = None;
    for _ in 0..200 {
        let got =
            tokio::task::spawn_blocking(move || test_support::metrics::http_get(port, "/readyz"))
                .await
                .unwrap();
        if let Some((503, body)) = &got {
            // Until the first campaign the reason is "not started yet": wait for the bucket's.
            if body.contains("leader election cannot campaign")
                && body.contains("CHORIA_LEADER_ELECTION")
            {
                seen = got;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, body) = seen.expect("/readyz says the election cannot campaign");
    assert!(body.contains("CHORIA_LEADER_ELECTION"), "{body}");
    let metrics = tokio::task::spawn_blocking(move || test_support::metrics::scrape(port))
        .await
        .unwrap();
    let leader: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("choria_election_leader{"))
        .collect();
    assert_eq!(
        leader.len(),
        1,
        "{}\n{}",
        &metrics[..600.min(metrics.len())],
        metrics
            .lines()
            .filter(|l| l.contains("election"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(leader[0].ends_with(" 0"), "{metrics}");
    assert!(!running.is_finished(), "it waits instead of stopping");

    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .unwrap()
        .unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
}
