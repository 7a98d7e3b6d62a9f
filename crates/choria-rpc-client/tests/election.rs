//! Leader election against a real nats-server with JetStream: one leader at a time, failover,
//! eviction, typed opening errors, and the provisioning account's `choria.streams` prefix.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream::StorageType};
use choria_rpc_client::election::{
    backoff, Election, ElectionBuilder, ElectionError, ElectionEvent, LeaderState, LossCause,
    DEFAULT_BUCKET, PROVISIONER_ELECTION, PROVISIONING_API_PREFIX,
};
use test_support::NatsServer;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const SAMPLE: Duration = Duration::from_millis(50);

/// The bucket as the Choria broker makes it, as far as async-nats's KV settings reach: one value
/// per key, file storage, 1024-byte values, discard new, deny delete, rollup and direct get.
async fn make_bucket(js: &jetstream::Context, bucket: &str, ttl: Duration) -> kv::Store {
    js.create_key_value(kv::Config {
        bucket: bucket.to_string(),
        description: "Choria Leader Election Bucket".to_string(),
        history: 1,
        max_age: ttl,
        max_value_size: 1024,
        storage: StorageType::File,
        ..Default::default()
    })
    .await
    .unwrap()
}

struct Candidate {
    election: Election,
    cancel: CancellationToken,
    task: JoinHandle<Result<(), ElectionError>>,
}

fn spawn(election: Election) -> Candidate {
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let election = election.clone();
        let cancel = cancel.clone();
        async move { election.run(cancel).await }
    });
    Candidate {
        election,
        cancel,
        task,
    }
}

async fn candidate(url: &str, identity: &str) -> Election {
    let client = async_nats::connect(url).await.unwrap();
    Election::builder(client, PROVISIONER_ELECTION, identity)
        .splay(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Identities of the candidates that currently say they lead.
fn leaders(cands: &[&Candidate]) -> Vec<String> {
    cands
        .iter()
        .filter(|c| c.election.is_leader())
        .map(|c| c.election.identity().to_string())
        .collect()
}

/// Sample every 50 ms for up to `limit`, asserting that never more than one candidate leads,
/// until `done` holds; returns the time it took, or `None` when `limit` ran out.
async fn sample_until(
    cands: &[&Candidate],
    limit: Duration,
    mut done: impl FnMut(&[String]) -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let now = leaders(cands);
        assert!(now.len() <= 1, "two leaders at once: {now:?}");
        if done(&now) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(SAMPLE).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_one_leader_and_failover() {
    let server = NatsServer::start();
    let admin = async_nats::connect(server.url()).await.unwrap();
    let ttl = Duration::from_secs(5);
    make_bucket(&jetstream::new(admin.clone()), DEFAULT_BUCKET, ttl).await;

    let mut cands = Vec::new();
    for n in 1..=3 {
        cands.push(spawn(
            candidate(&server.url(), &format!("p{n}.example.net")).await,
        ));
    }
    let all: Vec<&Candidate> = cands.iter().collect();

    // Splay ≤ 1 s, create, then the win is announced one update (≤ 750 ms + 200 ms) later.
    sample_until(&all, Duration::from_secs(10), |l| l.len() == 1)
        .await
        .expect("no leader within 10 s");
    // Keep watching a stable election for a while: the leader must hold, nobody else may lead.
    let first = leaders(&all).remove(0);
    sample_until(&all, Duration::from_secs(6), |_| false).await;
    assert_eq!(
        leaders(&all),
        vec![first.clone()],
        "leadership moved without a failure"
    );

    // The bucket holds the leader's identity.
    let store = jetstream::new(admin.clone())
        .get_key_value(DEFAULT_BUCKET)
        .await
        .unwrap();
    let value = store.get(PROVISIONER_ELECTION).await.unwrap().unwrap();
    assert_eq!(value.as_ref(), first.as_bytes());

    // Stop the leader by cancellation: it reports the stop but leaves the key to expire.
    let idx = cands
        .iter()
        .position(|c| c.election.identity() == first)
        .unwrap();
    let old = cands.remove(idx);
    let mut old_events = old.election.subscribe();
    let stopped_at = Instant::now();
    old.cancel.cancel();
    old.task.await.unwrap().unwrap();
    assert_eq!(*old.election.state().borrow(), LeaderState::Stopped);
    assert_eq!(
        old_events.recv().await.unwrap(),
        ElectionEvent::Stopped { was_leader: true }
    );
    // Mirror go-choria: a stopping leader releases nothing, its value stays until it ages out.
    let kept = store.get(PROVISIONER_ELECTION).await.unwrap().unwrap();
    assert_eq!(kept.as_ref(), first.as_bytes());
    let rest: Vec<&Candidate> = cands.iter().collect();
    sample_until(&rest, Duration::from_secs(45), |l| l.len() == 1)
        .await
        .expect("no failover within 45 s");
    let failover = stopped_at.elapsed();
    println!("failover after cancelling the leader: {failover:?} (bucket ttl {ttl:?})");
    // Nothing was deleted, so nobody can win before the leader's key ages out (written at most 750 ms
    // before the stop, more slack for a loaded machine); and a candidate's backoff (≤ 1.5 × 20 s)
    // bounds the wait after expiry.
    assert!(
        failover >= ttl - Duration::from_secs(2),
        "took over after {failover:?}, before the old key could expire"
    );
    assert!(failover < ttl + Duration::from_secs(32), "{failover:?}");
    let second = leaders(&rest).remove(0);
    assert_ne!(second, first);

    // Stop the second leader by dropping its campaign: the watcher must not keep saying leader.
    let idx = cands
        .iter()
        .position(|c| c.election.identity() == second)
        .unwrap();
    let dropped = cands.remove(idx);
    let dropped_at = Instant::now();
    dropped.task.abort();
    assert!(dropped.task.await.unwrap_err().is_cancelled());
    assert!(!dropped.election.is_leader());
    assert_eq!(*dropped.election.state().borrow(), LeaderState::Stopped);
    let last: Vec<&Candidate> = cands.iter().collect();
    sample_until(&last, Duration::from_secs(45), |l| l.len() == 1)
        .await
        .expect("no failover after dropping the second leader");
    println!(
        "failover after dropping the leader: {:?} (bucket ttl {ttl:?})",
        dropped_at.elapsed()
    );
    for c in cands {
        c.cancel.cancel();
        c.task.await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bucket_is_a_typed_error_and_retry_works() {
    let server = NatsServer::start();
    let election = candidate(&server.url(), "p1.example.net").await;
    for _ in 0..3 {
        let err = election.run(CancellationToken::new()).await.unwrap_err();
        assert!(
            matches!(&err, ElectionError::BucketNotFound { bucket, .. } if bucket == DEFAULT_BUCKET),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("p1.example.net") && msg.contains("CHORIA_LEADER_ELECTION"),
            "{msg}"
        );
        assert_eq!(*election.state().borrow(), LeaderState::Stopped);
    }

    // A caller that retries keeps hearing about the missing bucket, then leads once it appears.
    let errors = Arc::new(AtomicUsize::new(0));
    let cancel = CancellationToken::new();
    let task = tokio::spawn({
        let election = election.clone();
        let cancel = cancel.clone();
        let errors = errors.clone();
        async move {
            election
                .run_retrying(cancel, &backoff::FIVE_SEC_START_GRACE, |err| {
                    assert!(
                        matches!(err, ElectionError::BucketNotFound { .. }),
                        "{err:?}"
                    );
                    errors.fetch_add(1, Ordering::SeqCst);
                })
                .await
        }
    });
    let c = Candidate {
        election,
        cancel,
        task,
    };
    let start = Instant::now();
    while errors.load(Ordering::SeqCst) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "errors not reported"
        );
        tokio::time::sleep(SAMPLE).await;
    }
    let admin = async_nats::connect(server.url()).await.unwrap();
    make_bucket(
        &jetstream::new(admin),
        DEFAULT_BUCKET,
        Duration::from_secs(5),
    )
    .await;
    let mut state = c.election.state();
    tokio::time::timeout(
        Duration::from_secs(15),
        state.wait_for(|s| *s == LeaderState::Leader),
    )
    .await
    .expect("did not lead once the bucket existed")
    .unwrap();
    // A second concurrent run of the same election is refused.
    let err = c.election.run(CancellationToken::new()).await.unwrap_err();
    assert!(
        matches!(err, ElectionError::AlreadyRunning { .. }),
        "{err:?}"
    );
    c.cancel.cancel();
    c.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_out_of_range_is_a_typed_error() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = jetstream::new(client.clone());
    for (bucket, ttl, ok) in [
        ("TTL_3S", Duration::from_secs(3), false),
        ("TTL_NONE", Duration::ZERO, false),
        ("TTL_2H", Duration::from_secs(7200), false),
        ("TTL_4S", Duration::from_secs(4), true),
        ("TTL_1H", Duration::from_secs(3600), true),
    ] {
        make_bucket(&js, bucket, ttl).await;
        let election = Election::builder(client.clone(), PROVISIONER_ELECTION, "p1.example.net")
            .bucket(bucket)
            .build()
            .unwrap();
        match election.open().await {
            Ok(info) => {
                assert!(ok, "{bucket}: accepted ttl {ttl:?}");
                assert_eq!(info.ttl, ttl);
                assert_eq!(info.campaign_interval, ttl * 3 / 4);
            }
            Err(ElectionError::InvalidTtl { ttl: got, .. }) => {
                assert!(!ok, "{bucket}: refused ttl {ttl:?}");
                assert_eq!(got, ttl);
            }
            Err(e) => panic!("{bucket}: unexpected error {e:?}"),
        }
        if !ok {
            // `run` fails the same way, before campaigning.
            let err = election.run(CancellationToken::new()).await.unwrap_err();
            assert!(matches!(err, ElectionError::InvalidTtl { .. }), "{err:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_hands_over_without_waiting_for_ttl() {
    let server = NatsServer::start();
    let admin = async_nats::connect(server.url()).await.unwrap();
    // A long TTL, so that winning again quickly can only come from seeing the delete marker.
    let store = make_bucket(
        &jetstream::new(admin),
        DEFAULT_BUCKET,
        Duration::from_secs(60),
    )
    .await;
    let c = spawn(candidate(&server.url(), "p1.example.net").await);
    let mut events = c.election.subscribe();
    let mut state = c.election.state();
    tokio::time::timeout(
        Duration::from_secs(10),
        state.wait_for(|s| *s == LeaderState::Leader),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(matches!(
        events.recv().await.unwrap(),
        ElectionEvent::Won { .. }
    ));

    // `choria election evict`: a delete marker on the key.
    let evicted = Instant::now();
    store.delete(PROVISIONER_ELECTION).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap()
    {
        ElectionEvent::Lost { cause, .. } => assert_eq!(cause, LossCause::KeyChanged),
        other => panic!("expected lost, got {other:?}"),
    }
    assert!(matches!(
        tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap()
            .unwrap(),
        ElectionEvent::Won { .. }
    ));
    assert!(evicted.elapsed() < Duration::from_secs(10));
    c.cancel.cancel();
    c.task.await.unwrap().unwrap();
}

/// The Choria broker's account layout: JetStream lives in `choria`; `provisioning` may only ask
/// for the election bucket's stream info and write the `provisioner` key, through the
/// `choria.streams` prefix (and the key also unprefixed), as go-choria's
/// `broker/network/network_accounts.go` sets it up.
const ACCOUNTS: &str = r#"
accounts {
  choria {
    jetstream: enabled
    users: [ { user: "choria", password: "choria" } ]
    exports: [
      { service: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION", response_type: "singleton" }
      { service: "$KV.CHORIA_LEADER_ELECTION.provisioner", response_type: "singleton" }
    ]
  }
  provisioning {
    users: [ { user: "provisioner", password: "provisioner" } ]
    imports: [
      { service: { account: "choria", subject: "$JS.API.STREAM.INFO.KV_CHORIA_LEADER_ELECTION" }, to: "choria.streams.STREAM.INFO.KV_CHORIA_LEADER_ELECTION" }
      { service: { account: "choria", subject: "$KV.CHORIA_LEADER_ELECTION.provisioner" }, to: "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner" }
      { service: { account: "choria", subject: "$KV.CHORIA_LEADER_ELECTION.provisioner" } }
    ]
  }
}
"#;

async fn connect_as(server: &NatsServer, user: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_user_and_password(user.to_string(), user.to_string())
        .connect(server.url())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_account_campaigns_through_choria_streams_prefix() {
    let server = NatsServer::start_with_config(ACCOUNTS);
    let admin = connect_as(&server, "choria").await;
    let ttl = Duration::from_secs(5);
    make_bucket(&jetstream::new(admin.clone()), DEFAULT_BUCKET, ttl).await;

    // Without the prefix the provisioning account sees no JetStream at all.
    let plain = Election::builder(
        connect_as(&server, "provisioner").await,
        PROVISIONER_ELECTION,
        "p0.example.net",
    )
    .build()
    .unwrap();
    let err = plain.open().await.unwrap_err();
    assert!(
        matches!(err, ElectionError::StreamsUnavailable { .. }),
        "{err:?}"
    );

    let mut cands = Vec::new();
    for n in 1..=2 {
        let election = Election::builder(
            connect_as(&server, "provisioner").await,
            PROVISIONER_ELECTION,
            format!("p{n}.example.net"),
        )
        .api_prefix(PROVISIONING_API_PREFIX)
        .splay(Duration::from_secs(1))
        .build()
        .unwrap();
        assert_eq!(
            election.put_subject(),
            "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner"
        );
        cands.push(spawn(election));
    }
    // A candidate in the choria account (no prefix) shares the same election.
    let native = Election::builder(admin.clone(), PROVISIONER_ELECTION, "p3.example.net")
        .splay(Duration::from_secs(1))
        .build()
        .unwrap();
    assert_eq!(
        native.put_subject(),
        "$KV.CHORIA_LEADER_ELECTION.provisioner"
    );
    cands.push(spawn(native));
    let all: Vec<&Candidate> = cands.iter().collect();

    // The broker imports only the `provisioner` key: another election opens (stream info is
    // imported) but none of its writes reach JetStream.
    let other = spawn(
        Election::builder(
            connect_as(&server, "provisioner").await,
            "other",
            "p4.example.net",
        )
        .api_prefix(PROVISIONING_API_PREFIX)
        .splay(Duration::ZERO)
        .build()
        .unwrap(),
    );

    sample_until(&all, Duration::from_secs(10), |l| l.len() == 1)
        .await
        .expect("no leader within 10 s");
    sample_until(&all, Duration::from_secs(3), |_| false).await;
    let stats = other.election.stats();
    assert!(stats.campaigns_as_candidate >= 2, "{stats:?}");
    assert!(!stats.holds_key && !other.election.is_leader(), "{stats:?}");
    assert_eq!(*other.election.state().borrow(), LeaderState::Candidate);
    other.cancel.cancel();
    other.task.await.unwrap().unwrap();
    let first = leaders(&all).remove(0);
    println!("first leader across both accounts: {first}");
    let store = jetstream::new(admin)
        .get_key_value(DEFAULT_BUCKET)
        .await
        .unwrap();
    let value = store.get(PROVISIONER_ELECTION).await.unwrap().unwrap();
    assert_eq!(value.as_ref(), first.as_bytes());

    // Make sure a prefixed candidate leads at some point: stop the native one if it won.
    if first == "p3.example.net" {
        let native = cands.pop().unwrap();
        native.cancel.cancel();
        native.task.await.unwrap().unwrap();
        let rest: Vec<&Candidate> = cands.iter().collect();
        let took = sample_until(&rest, Duration::from_secs(45), |l| l.len() == 1)
            .await
            .expect("no prefixed leader after the native leader stopped");
        println!("failover to the provisioning account: {took:?}");
    }
    let all: Vec<&Candidate> = cands.iter().collect();
    let leader = leaders(&all).remove(0);
    assert!(
        leader == "p1.example.net" || leader == "p2.example.net",
        "{leader}"
    );
    sample_until(&all, Duration::from_secs(2), |_| false).await;
    assert_eq!(leaders(&all), vec![leader.clone()]);
    assert_eq!(
        store
            .get(PROVISIONER_ELECTION)
            .await
            .unwrap()
            .unwrap()
            .as_ref(),
        leader.as_bytes()
    );
    for c in cands {
        c.cancel.cancel();
        c.task.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn subjects_follow_the_api_prefix_or_domain() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let build = |f: fn(ElectionBuilder) -> ElectionBuilder| {
        f(Election::builder(
            client.clone(),
            PROVISIONER_ELECTION,
            "p1.example.net",
        ))
        .build()
    };
    let plain = build(|b| b).unwrap();
    assert_eq!(
        plain.put_subject(),
        "$KV.CHORIA_LEADER_ELECTION.provisioner"
    );
    // The default prefix spelled out is still the default: no prefix on KV writes.
    let default = build(|b| b.api_prefix("$JS.API.")).unwrap();
    assert_eq!(
        default.put_subject(),
        "$KV.CHORIA_LEADER_ELECTION.provisioner"
    );
    let prefixed = build(|b| b.api_prefix("choria.streams.")).unwrap();
    assert_eq!(
        prefixed.put_subject(),
        "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner"
    );
    let domain = build(|b| b.domain("hub").bucket("ELECT")).unwrap();
    assert_eq!(domain.put_subject(), "$JS.hub.API.$KV.ELECT.provisioner");
    for bad in [
        build(|b| b.api_prefix("choria.*")),
        build(|b| b.bucket("A.B")),
        build(|b| b.domain("a.b")),
    ] {
        assert!(
            matches!(bad, Err(ElectionError::InvalidName { .. })),
            "{bad:?}"
        );
    }
    let err = Election::builder(client.clone(), "bad key", "p1.example.net")
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ElectionError::InvalidName { what: "key", .. }),
        "{err:?}"
    );
}

/// The provisioner's election for `p1.example.net` over `client`, as `choose` finds it with the
/// five-second backoff and no cancellation.
async fn choose_provisioner(client: async_nats::Client) -> Election {
    Election::choose(
        client,
        PROVISIONER_ELECTION,
        "p1.example.net",
        &backoff::FIVE_SEC,
        &CancellationToken::new(),
    )
    .await
    .unwrap()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choose_takes_the_choria_streams_import_when_it_answers() {
    let server = NatsServer::start_with_config(ACCOUNTS);
    // The bucket does not exist yet: the import answers (stream not found), so it is kept and a
    // bucket created later is found through it.
    let election = choose_provisioner(connect_as(&server, "provisioner").await).await;
    assert_eq!(election.api_prefix(), PROVISIONING_API_PREFIX);
    assert_eq!(
        election.put_subject(),
        "choria.streams.$KV.CHORIA_LEADER_ELECTION.provisioner"
    );
    let err = election.open().await.unwrap_err();
    assert!(
        matches!(err, ElectionError::BucketNotFound { .. }),
        "{err:?}"
    );
    let admin = connect_as(&server, "choria").await;
    make_bucket(
        &jetstream::new(admin),
        DEFAULT_BUCKET,
        Duration::from_secs(5),
    )
    .await;
    election.open().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choose_falls_back_to_the_accounts_own_jetstream() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let election = choose_provisioner(client).await;
    assert_eq!(election.api_prefix(), "$JS.API");
    assert_eq!(
        election.put_subject(),
        "$KV.CHORIA_LEADER_ELECTION.provisioner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn choose_keeps_asking_while_no_jetstream_answers_until_cancelled() {
    // An account with neither JetStream nor the import.
    let server = NatsServer::start_with_config(
        r#"accounts { lonely { users: [ { user: "lonely", password: "lonely" } ] } }"#,
    );
    let client = connect_as(&server, "lonely").await;
    let cancel = CancellationToken::new();
    let retry = backoff::Policy::from_static(&[20]);
    let start = Instant::now();
    let chosen = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            Election::choose(
                client,
                PROVISIONER_ELECTION,
                "p1.example.net",
                &retry,
                &cancel,
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!chosen.is_finished(), "chose an API that does not answer");
    cancel.cancel();
    let chosen = tokio::time::timeout(Duration::from_secs(5), chosen)
        .await
        .expect("choose did not stop when cancelled")
        .unwrap()
        .unwrap();
    assert!(chosen.is_none());
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn choose_refuses_names_that_make_no_election() {
    let server = NatsServer::start();
    let client = async_nats::connect(server.url()).await.unwrap();
    let err = Election::choose(
        client,
        "not a key",
        "p1.example.net",
        &backoff::FIVE_SEC,
        &CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ElectionError::InvalidName { .. }), "{err:?}");
}
