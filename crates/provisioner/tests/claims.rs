//! Active-active claims on a real three-server JetStream cluster: the bucket is created with
//! three replicas, one claim per node whoever races for it, done and released claims, claims of
//! a dead replica expiring, the live replicas agreeing on first choices, the operations per node
//! counted, and a replica cut off from JetStream refusing to claim.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use choria_rpc_client::streams::StreamsApi;
use provisioner::claims::{node_key, Claim, ClaimStore, CLAIMS_BUCKET};
use provisioner::fleet_lifecycle::seal::Seal;
use test_support::NatsCluster;

const LIFETIME: Duration = Duration::from_secs(6);

/// The replicas' shared secret.
fn seal() -> Seal {
    Seal::with_secret(b"shared by the replicas and no node")
}

/// A replica's store on `url`, once the bucket exists (opened by [`cluster_with_bucket`]).
async fn replica(url: &str, name: &str) -> ClaimStore {
    let client = async_nats::connect(url).await.unwrap();
    ClaimStore::open(
        client,
        StreamsApi::Account,
        CLAIMS_BUCKET,
        name,
        LIFETIME,
        seal(),
    )
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
                seal(),
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
                // The dead replica's late write at its old revision fails while the new
                // claim stands (once that one has aged out too, a done mark is anyone's to
                // write: the loop runs on past it).
                assert!(b
                    .done("dead.fleet.example.net", &abandoned.0, abandoned.1)
                    .await
                    .is_err());
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

/// A client that can write the bucket but has no secret (as a node on a plain NATS server
/// could) writes 64 heartbeats of replicas that do not exist, `done` marks for nodes, and claims
/// of its own: the replicas' live set stays theirs, the forged claims are taken over, and the
/// forged marks are ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_heartbeats_claims_and_done_marks_change_nothing() {
    let nats = test_support::NatsServer::start_with_config("jetstream {}\n");
    let client = async_nats::connect(nats.url()).await.unwrap();
    let a = ClaimStore::open(
        client.clone(),
        StreamsApi::Account,
        CLAIMS_BUCKET,
        "r-a.example.net",
        LIFETIME,
        seal(),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let b = replica(&nats.url(), "r-b.example.net").await;
    a.heartbeat().await.unwrap();
    b.heartbeat().await.unwrap();

    let hostile = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap())
        .get_key_value(CLAIMS_BUCKET)
        .await
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let forge = async |key: String, value: String| hostile.put(key, value.into()).await.unwrap();
    for n in 0..64 {
        forge(
            format!("replica.fake-{n}"),
            format!("alive fake-{n} {now} {}", "ab".repeat(16)),
        )
        .await;
    }
    // A forged done mark under a real replica's name, and a forged claim.
    forge(
        node_key("done.example.net"),
        format!("done r-b.example.net {now} {}", "cd".repeat(16)),
    )
    .await;
    forge(
        node_key("claimed.example.net"),
        "claimed r-b.example.net".into(),
    )
    .await;

    assert_eq!(
        a.heartbeat().await.unwrap(),
        2,
        "only the two real replicas are live"
    );
    assert_eq!(b.refresh().await.unwrap(), 2);
    assert!(a.forged() >= 64, "{} forged values seen", a.forged());
    // Every node still has a real first choice, so none is left to a replica that is not there.
    for n in 0..200 {
        let id = format!("n{n}.example.net");
        assert!(a.first_choice(&id) != b.first_choice(&id), "{id}");
    }
    // The forged mark and claim hold nothing: the node is claimed as if they were not there.
    for id in ["done.example.net", "claimed.example.net"] {
        let c = a.claim(id, false).await.unwrap();
        assert!(won(&c).is_some(), "{id}: {c:?}");
    }
    // A real done mark is honoured.
    let Claim::Won { key, revision } = b.claim("real.example.net", true).await.unwrap() else {
        panic!("not won");
    };
    b.done("real.example.net", &key, revision).await.unwrap();
    match a.claim("real.example.net", false).await.unwrap() {
        Claim::Taken { by, done } => assert!(done && by == "r-b.example.net", "{by} {done}"),
        c => panic!("{c:?}"),
    }
}
