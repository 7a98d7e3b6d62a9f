//! The audit trail's JetStream stream in an HA pair: two provisioners with `leader_election`
//! on one broker both publish their decisions into the one `audit_stream`; a failover mid-run
//! makes both decide. Nothing secret reaches the stream, the audit files or the API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use choria_fleet_sim::Mode;
use common::*;
use futures::StreamExt as _;
use serde_json::Value;

const STREAM: &str = "PROVISIONER_AUDIT";

/// Every record in the stream, read with an ephemeral ordered consumer.
async fn stream_records(url: &str) -> Vec<Value> {
    let nc = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(nc);
    let mut stream = js.get_stream(STREAM).await.unwrap();
    let total = stream.info().await.unwrap().state.messages;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .unwrap();
    let mut msgs = consumer.messages().await.unwrap();
    let mut out = Vec::new();
    while (out.len() as u64) < total {
        let m = tokio::time::timeout(Duration::from_secs(5), msgs.next())
            .await
            .expect("the stream stopped answering")
            .unwrap()
            .unwrap();
        assert_eq!(m.subject.as_str(), "choria.provisioner.audit");
        out.push(serde_json::from_slice(&m.payload).unwrap());
    }
    out
}

fn role(prov: &Prov) -> String {
    prov.get("/api/v1/status")
        .and_then(|(_, b)| serde_json::from_str::<Value>(&b).ok())
        .map(|v| v["role"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_replicas_decisions_land_in_the_one_stream() {
    let env = Env::new();
    create_election_bucket(&env.url()).await;
    let helper = format!("{} slow 0.3", test_helper("scenario.py"));
    let start = |name: &str| {
        env.start(&env.ha_provisioner(name, helper.clone()).yaml(&format!(
            "audit_stream: {STREAM}\naudit_file: {}",
            env.path().join(format!("{name}.audit.jsonl")).display()
        )))
    };
    let mut a = start("provisioner-a");
    let mut b = start("provisioner-b");
    a.wait_ready().await;
    b.wait_ready().await;
    let (mut leader, mut standby) = elect(a, b, |p| role(p) == "leader").await;
    assert_eq!(role(&standby), "standby");
    for p in [&leader, &standby] {
        assert!(
            p.output()
                .contains(&format!("publishing decisions to stream {STREAM}")),
            "{}",
            p.output()
        );
    }

    let fleet = env.fleet(env.failover_fleet_config(24)).await;
    leader
        .expect_metric("provisioned", 4.0, Duration::from_secs(60))
        .await;
    // A clean stop: the leader drains and writes every decision it made.
    leader.stop_with("TERM").await;
    assert!(
        wait_until(Duration::from_secs(60), || role(&standby) == "leader").await,
        "the standby never took over:\n{}",
        standby.output()
    );
    expect_provisioned(&fleet, 24, Duration::from_secs(90), &standby).await;
    standby
        .expect_metric("provisioned", 1.0, Duration::from_secs(10))
        .await;
    standby.stop_with("TERM").await;

    let records = stream_records(&env.url()).await;
    let by: BTreeSet<&str> = records
        .iter()
        .map(|r| r["provisioner"].as_str().unwrap())
        .collect();
    assert_eq!(
        by,
        BTreeSet::from(["provisioner-a", "provisioner-b"]),
        "both replicas publish into the one stream"
    );
    // Every node of the fleet is recorded as provisioned, each by one replica.
    let mut provisioned: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in records.iter().filter(|r| r["decision"] == "provisioned") {
        provisioned
            .entry(r["identity"].as_str().unwrap())
            .or_default()
            .push(r["provisioner"].as_str().unwrap());
    }
    for id in fleet.identities() {
        assert!(
            provisioned.contains_key(id.as_str()),
            "{id} missing: {records:?}"
        );
    }
    // The stream holds exactly what each replica's file holds, record for record (so what
    // the secret-marker scenario proves of the file holds for the stream).
    for name in ["provisioner-a", "provisioner-b"] {
        let file = std::fs::read_to_string(env.path().join(format!("{name}.audit.jsonl"))).unwrap();
        let in_file: Vec<Value> = file
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let in_stream: Vec<Value> = records
            .iter()
            .filter(|r| r["provisioner"] == name)
            .cloned()
            .collect();
        assert_eq!(in_file, in_stream, "{name}");
        assert!(
            !file.contains(TOKEN) && !file.contains("eyJ"),
            "{name}'s file"
        );
    }
    let raw: String = records.iter().map(|r| r.to_string()).collect();
    assert!(!raw.contains(TOKEN), "the token reached the stream");
    assert!(!raw.contains("eyJ"), "a JWT reached the stream");
    fleet.shutdown().await;
}

/// The records of the audit file at `path`.
fn file_records(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// How many messages `STREAM` holds; None while it does not exist.
async fn stream_messages(js: &async_nats::jetstream::Context) -> Option<u64> {
    let mut s = js.get_stream(STREAM).await.ok()?;
    Some(s.info().await.ok()?.state.messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_cannot_be_created_at_start_is_tried_again_and_gets_the_kept_records() {
    let env = Env::new();
    let nc = env.client().await;
    let js = async_nats::jetstream::new(nc);
    // Another stream holds the audit subject, so creating the audit stream fails until it goes.
    js.create_stream(async_nats::jetstream::stream::Config {
        name: "BLOCKER".into(),
        subjects: vec!["choria.provisioner.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let file = env.path().join("audit.jsonl");
    let mut prov = env
        .start_ready(&env.plain().yaml(&format!(
            "audit_stream: {STREAM}\naudit_file: {}",
            file.display()
        )))
        .await;
    prov.expect_log("record(s) kept for it", Duration::from_secs(20))
        .await;

    // Decisions made while the stream cannot be created: the file has them at once.
    let early = env.fleet(env.fleet_config(5, Mode::Plain)).await;
    expect_provisioned(&early, 5, Duration::from_secs(60), &prov).await;
    assert!(
        wait_until(Duration::from_secs(20), || file_records(&file).len() >= 5).await,
        "{}",
        prov.output()
    );
    assert!(prov.m("audit_stream_errors") >= 1.0, "{}", prov.output());
    assert_eq!(stream_messages(&js).await, None);
    let blocked = js
        .get_stream("BLOCKER")
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(
        blocked, 0,
        "nothing is published while the stream is not open"
    );

    // The stream becomes possible: the writer creates it and publishes what it kept.
    js.delete_stream("BLOCKER").await.unwrap();
    let mut kept = 0;
    for _ in 0..120 {
        kept = stream_messages(&js).await.unwrap_or(0);
        if kept >= file_records(&file).len() as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        kept >= 5,
        "{kept} records in the stream:\n{}",
        prov.output()
    );
    prov.expect_output("record(s) waiting for it");

    // Decisions made after it is reachable arrive too.
    let mut cfg = env.fleet_config(4, Mode::Plain);
    cfg.identity_prefix = "late".into();
    let late = env.fleet(cfg).await;
    expect_provisioned(&late, 4, Duration::from_secs(60), &prov).await;
    prov.stop_with("TERM").await;
    let records = stream_records(&env.url()).await;
    assert_eq!(
        records,
        file_records(&file),
        "the stream holds what the file holds"
    );
    for id in early.identities().iter().chain(late.identities().iter()) {
        assert!(
            records
                .iter()
                .any(|r| r["identity"] == id.as_str() && r["decision"] == "provisioned"),
            "{id} missing: {records:?}"
        );
    }
    early.shutdown().await;
    late.shutdown().await;
}
