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

async fn create_bucket(url: &str) {
    let nc = async_nats::connect(url).await.unwrap();
    let js = async_nats::jetstream::new(nc);
    js.create_key_value(async_nats::jetstream::kv::Config {
        bucket: "CHORIA_LEADER_ELECTION".into(),
        max_age: Duration::from_secs(5),
        history: 1,
        ..Default::default()
    })
    .await
    .unwrap();
}

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
    create_bucket(&env.url()).await;
    let helper = format!("{} slow 0.3", test_helper("scenario.py"));
    let start = |name: &str| {
        let mut o = ProvOptions::new(helper.clone()).yaml(&format!(
            "audit_stream: {STREAM}\naudit_file: {}",
            env.path().join(format!("{name}.audit.jsonl")).display()
        ));
        o.identity = name.into();
        o.leader_election = true;
        o.workers = 2;
        env.start(&o)
    };
    let mut a = start("provisioner-a");
    let mut b = start("provisioner-b");
    a.wait_ready().await;
    b.wait_ready().await;
    assert!(
        wait_until(Duration::from_secs(40), || role(&a) == "leader"
            || role(&b) == "leader")
        .await,
        "nobody won:\n{}\n{}",
        a.output(),
        b.output()
    );
    let (mut leader, mut standby) = if role(&a) == "leader" { (a, b) } else { (b, a) };
    assert_eq!(role(&standby), "standby");
    for p in [&leader, &standby] {
        assert!(
            p.output()
                .contains(&format!("publishing decisions to stream {STREAM}")),
            "{}",
            p.output()
        );
    }

    let mut cfg = env.fleet_config(24, Mode::Plain);
    cfg.lock_window = Duration::from_secs(2);
    cfg.restart_delay = Duration::from_millis(200);
    let fleet = env.fleet(cfg).await;
    assert!(
        leader
            .wait_metric("provisioned", 4.0, Duration::from_secs(60))
            .await,
        "{}",
        leader.output()
    );
    // A clean stop: the leader drains and writes every decision it made.
    leader.stop_with("TERM").await;
    assert!(
        wait_until(Duration::from_secs(60), || role(&standby) == "leader").await,
        "the standby never took over:\n{}",
        standby.output()
    );
    assert!(
        fleet.wait_provisioned(24, Duration::from_secs(90)).await,
        "{} of 24 provisioned:\n{}",
        fleet.provisioned(),
        standby.output()
    );
    assert!(
        standby
            .wait_metric("provisioned", 1.0, Duration::from_secs(10))
            .await
    );
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
