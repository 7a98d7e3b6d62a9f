//! End to end: identities are hostile input. Anyone holding a provisioning JWT can publish
//! startup events naming any identity; the provisioner must refuse the invalid ones before
//! anything is done for them, survive a flood of bogus ones, and still provision the real
//! fleet promptly. A real nats-server, the provisioner binary, a real helper and the simulated
//! fleet in this process; a test subscriber sees every directed request the provisioner sends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use choria_fleet_sim::config::bogus_identity;
use choria_fleet_sim::Mode;
use common::*;
use futures::StreamExt as _;

/// Records the subject of every directed request on the broker.
async fn watch_directed(url: &str) -> Arc<Mutex<Vec<String>>> {
    let nc = async_nats::connect(url).await.unwrap();
    let mut sub = nc.subscribe("provisioning.node.>").await.unwrap();
    nc.flush().await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let out = seen.clone();
    tokio::spawn(async move {
        let _keep = nc;
        while let Some(m) = sub.next().await {
            out.lock().unwrap().push(m.subject.to_string());
        }
    });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_identities_are_refused_and_a_bogus_flood_does_not_starve_the_real_fleet() {
    let env = Env::new();
    let seen = watch_directed(&env.url()).await;
    let logfile = env.path().join("provisioner.log");
    let mut o = env.plain();
    o.workers = 8;
    o.loglevel = "info".into();
    o.logfile = Some(logfile.clone());
    let mut prov = env.start(&o);
    assert!(
        wait_until(Duration::from_secs(30), || lines(&logfile)
            .iter()
            .any(|l| l.contains("listening for startup events")))
        .await,
        "the provisioner did not start: {}",
        prov.output()
    );

    // 2,000 announcements of nodes that do not exist (a tenth of them hostile identities),
    // then 30 real nodes that announce themselves behind them.
    let bogus = 2000;
    let mut cfg = env.fleet_config(30, Mode::Plain);
    cfg.bogus_events = bogus;
    let fleet = env.fleet(cfg).await;

    assert!(
        fleet.wait_provisioned(30, Duration::from_secs(90)).await,
        "only {} of 30 provisioned: {:?}\n{}",
        fleet.provisioned(),
        fleet.stats(),
        lines(&logfile).join("\n")
    );
    let hostile = (0..bogus).filter(|n| n % 10 == 9).count() as f64;
    assert!(
        prov.wait_metric("invalid_identities", hostile, Duration::from_secs(10))
            .await,
        "{} of {hostile} refused:\n{}",
        prov.m("invalid_identities"),
        lines(&logfile).join("\n")
    );
    assert_eq!(prov.m("invalid_identities"), hostile);

    // No request was ever sent for a hostile identity: every directed subject names a real
    // node or a bogus-but-valid one, in one token.
    let subjects = seen.lock().unwrap().clone();
    assert!(!subjects.is_empty());
    for s in &subjects {
        let id = s.strip_prefix("provisioning.node.").unwrap();
        assert!(
            id.starts_with("node-") || id.starts_with("bogus-"),
            "a request went to {s:?}"
        );
    }
    // The log: refusals summarised (a handful of lines, not one per event), nothing forged,
    // every line bounded.
    let log = lines(&logfile);
    let refusal_lines = log.iter().filter(|l| l.contains("refus")).count();
    assert!(
        (1..=20).contains(&refusal_lines),
        "{refusal_lines} refusal lines"
    );
    for l in &log {
        assert!(!l.starts_with("ERROR forged"), "forged line: {l}");
        assert!(l.len() < 2048, "a {} byte log line", l.len());
    }
    for n in (0..bogus).filter(|n| n % 10 == 9).take(8) {
        let id = bogus_identity(n, "example.net");
        assert!(
            !log.iter().any(|l| l.contains(&id) && id.contains('\n')),
            "an unescaped identity reached the log"
        );
    }
    prov.stop_with("TERM").await;
}
