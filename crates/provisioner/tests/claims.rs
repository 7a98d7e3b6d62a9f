//! Active-active claims on a real three-server JetStream cluster: the bucket is created with
//! three replicas, one claim per node whoever races for it, done and released claims, claims of
//! a dead replica expiring, the live replicas agreeing on first choices, the operations per node
//! counted, and a replica cut off from JetStream refusing to claim.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use choria_rpc_client::streams::StreamsApi;
use provisioner::claims::{Claim, ClaimStore, CLAIMS_BUCKET};
use test_support::NatsCluster;

const LIFETIME: Duration = Duration::from_secs(6);

/// A replica's store on `url`, once the bucket exists (opened by [`cluster_with_bucket`]).
async fn replica(url: &str, name: &str) -> ClaimStore {
    let client = async_nats::connect(url).await.unwrap();
    ClaimStore::open(client, StreamsApi::Account, CLAIMS_BUCKET, name, LIFETIME)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A three-server cluster whose first replica has created the bucket. Right after a cluster
/// forms, JetStream may not yet place a three-replica stream ("no suitable peers for
/// placement"): the daemon retries opening, so does this, for 45 s; a cluster that still places
/// nothing on a loaded machine is replaced by a fresh one (at most three clusters).
async fn cluster_with_bucket() -> (NatsCluster, ClaimStore) {
    let mut last = String::new();
    for _ in 0..3 {
        let cluster = NatsCluster::start().unwrap();
        let url = cluster.urls()[0].clone();
        let client = async_nats::connect(&url).await.unwrap();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(45) {
            match ClaimStore::open(
                client.clone(),
                StreamsApi::Account,
                CLAIMS_BUCKET,
                "r-a.example.net",
                LIFETIME,
            )
            .await
            {
                Ok(store) => return (cluster, store),
                Err(e) => {
                    last = e.to_string();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        eprintln!("a cluster that placed no bucket in 45 s is replaced: {last}");
    }
    panic!("three clusters placed no bucket: {last}");
}

fn won(c: &Claim) -> Option<(String, u64)> {
    match c {
        Claim::Won { key, revision } => Some((key.clone(), *revision)),
        Claim::Taken { .. } => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_claim_per_node_across_a_cluster() {
    let (cluster, a) = cluster_with_bucket().await;
    let urls = cluster.urls();
    // Each replica on its own server of the cluster.
    let b = replica(&urls[1], "r-b.example.net").await;
    let c = replica(&urls[2], "r-c.example.net").await;

    // Created by the first replica with three replicas and the lifetime as max age.
    let js = async_nats::jetstream::new(async_nats::connect(&urls[0]).await.unwrap());
    let mut stream = js.get_stream(format!("KV_{CLAIMS_BUCKET}")).await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.num_replicas, 3);
    assert_eq!(info.config.max_age, LIFETIME);
    assert_eq!(info.config.max_messages_per_subject, 1);
    assert_eq!(a.keep_every(), Duration::from_secs(2));

    // All three race for 150 nodes, each thinking it is the first choice: one winner each.
    let ids: Vec<String> = (0..150)
        .map(|n| format!("n-{n:03}.fleet.example.net"))
        .collect();
    let mut tasks = Vec::new();
    for store in [&a, &b, &c] {
        let store = store.clone();
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for id in &ids {
                out.push((id.clone(), store.claim(id, true).await.unwrap()));
            }
            out
        }));
    }
    let mut winners: HashMap<String, usize> = HashMap::new();
    for t in tasks {
        for (id, claim) in t.await.unwrap() {
            if won(&claim).is_some() {
                *winners.entry(id).or_default() += 1;
            }
        }
    }
    assert_eq!(winners.len(), ids.len(), "some node was claimed by nobody");
    assert!(
        winners.values().all(|&n| n == 1),
        "a node was claimed twice: {winners:?}"
    );

    // A free node: create and done are one write each; a late replica reading a done node
    // spends one read and learns it is done.
    let before = a.stats().node_operations;
    let claim = a.claim("free.fleet.example.net", true).await.unwrap();
    let (key, rev) = won(&claim).unwrap();
    a.done("free.fleet.example.net", &key, rev).await.unwrap();
    assert_eq!(a.stats().node_operations - before, 2);
    let before = b.stats().node_operations;
    assert_eq!(
        b.claim("free.fleet.example.net", false).await.unwrap(),
        Claim::Taken {
            by: "r-a.example.net".into(),
            done: true
        }
    );
    assert_eq!(b.stats().node_operations - before, 1);
    // A first choice that lost spends the failed create and one read.
    let before = c.stats().node_operations;
    assert!(matches!(
        c.claim("free.fleet.example.net", true).await.unwrap(),
        Claim::Taken { done: true, .. }
    ));
    assert_eq!(c.stats().node_operations - before, 2);

    // A released claim is free for anyone at once.
    let claim = b.claim("released.fleet.example.net", true).await.unwrap();
    let (key, rev) = won(&claim).unwrap();
    assert!(matches!(
        c.claim("released.fleet.example.net", false).await.unwrap(),
        Claim::Taken { done: false, .. }
    ));
    b.release("released.fleet.example.net", &key, rev)
        .await
        .unwrap();
    assert!(won(&c.claim("released.fleet.example.net", false).await.unwrap()).is_some());

    // A kept claim survives its lifetime; an abandoned one (a dead replica) expires and is
    // taken over.
    let (kkey, mut krev) = won(&a.claim("kept.fleet.example.net", true).await.unwrap()).unwrap();
    let abandoned = won(&b.claim("dead.fleet.example.net", true).await.unwrap()).unwrap();
    let started = Instant::now();
    let mut taken_over = None;
    let mut kept = Instant::now();
    while started.elapsed() < LIFETIME * 2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if kept.elapsed() >= a.keep_every() {
            krev = a.keep("kept.fleet.example.net", &kkey, krev).await.unwrap();
            kept = Instant::now();
        }
        if taken_over.is_none() {
            if let Some(w) = won(&c.claim("dead.fleet.example.net", false).await.unwrap()) {
                taken_over = Some((started.elapsed(), w));
            }
        }
        assert!(
            won(&c.claim("kept.fleet.example.net", false).await.unwrap()).is_none(),
            "a kept claim was taken"
        );
    }
    let (after, _) = taken_over.expect("the abandoned claim never expired");
    assert!(
        after >= LIFETIME - Duration::from_millis(600)
            && after <= LIFETIME + Duration::from_secs(3),
        "taken over after {after:?}"
    );
    // The dead replica's late write at its old revision fails.
    assert!(b
        .done("dead.fleet.example.net", &abandoned.0, abandoned.1)
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_agree_on_first_choices_and_a_cut_off_replica_claims_nothing() {
    let (mut cluster, a) = cluster_with_bucket().await;
    let urls = cluster.urls();
    let stores = [
        a,
        replica(&urls[1], "r-b.example.net").await,
        replica(&urls[2], "r-c.example.net").await,
    ];
    for s in &stores {
        s.heartbeat().await.unwrap();
    }
    for s in &stores {
        assert_eq!(s.heartbeat().await.unwrap(), 3);
        assert_eq!(s.stats().live_replicas, 3);
    }
    let mut per_replica = [0usize; 3];
    for n in 0..600 {
        let id = format!("n-{n:03}.fleet.example.net");
        let firsts: Vec<usize> = (0..3).filter(|&r| stores[r].first_choice(&id)).collect();
        assert_eq!(firsts.len(), 1, "{id}: first choice of {firsts:?}");
        per_replica[firsts[0]] += 1;
    }
    assert!(
        per_replica.iter().all(|&n| (150..=250).contains(&n)),
        "{per_replica:?}"
    );

    // Without the cluster the heartbeat fails and claims are refused without a guess.
    for n in 0..3 {
        cluster.stop(n);
    }
    let lonely = &stores[0];
    assert!(lonely.heartbeat().await.is_err());
    assert!(!lonely.healthy());
    let err = lonely
        .claim("n-000.fleet.example.net", true)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("taking no new node"), "{err}");
    assert!(lonely.stats().errors >= 1);
}
