//! The harness's brokers are real: a single server restarts on its port with its store, and the
//! three-server cluster forms and holds a KV bucket with three replicas.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use test_support::{NatsCluster, NatsServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_restarts_on_its_port() {
    let mut nats = NatsServer::start();
    let nc = async_nats::connect(nats.url()).await.unwrap();
    nc.flush().await.unwrap();
    let port = nats.port();
    nats.restart();
    assert_eq!(nats.port(), port);
    let nc = async_nats::connect(nats.url()).await.unwrap();
    nc.flush().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_in_a_directory_stops_gracefully_and_starts_again_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let port = test_support::free_port();
    let mut nats = NatsServer::start_in(dir.path(), port, "max_payload: 4MB", true).unwrap();
    assert!(nats.terminate(Duration::from_secs(5)).is_some());
    nats.start_again().unwrap();
    let nc = async_nats::connect(nats.url()).await.unwrap();
    assert_eq!(nc.server_info().max_payload, 4 * 1024 * 1024);
    let log = std::fs::read_to_string(dir.path().join("nats-server.log")).unwrap();
    assert_eq!(log.matches("Server is ready").count(), 2, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_forms_and_a_kv_bucket_with_three_replicas_works() {
    let cluster = NatsCluster::start().unwrap();
    let urls = cluster.urls();
    assert_eq!(urls.len(), 3);
    let first = async_nats::connect(&urls[0]).await.unwrap();
    let js = async_nats::jetstream::new(first);
    // The meta leader may still be settling just after the cluster reports healthy.
    let deadline = Instant::now() + Duration::from_secs(30);
    let kv = loop {
        let made = js
            .create_key_value(async_nats::jetstream::kv::Config {
                bucket: "HA_TEST".into(),
                num_replicas: 3,
                ..Default::default()
            })
            .await;
        match made {
            Ok(kv) => break kv,
            Err(e) if Instant::now() < deadline => {
                eprintln!("kv not created yet: {e}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("no R3 bucket on the cluster: {e}"),
        }
    };
    let info = kv.status().await.unwrap();
    assert_eq!(info.info.config.num_replicas, 3);
    kv.put("leader", "n0".into()).await.unwrap();

    // Read it through another server of the cluster.
    let third = async_nats::connect(&urls[2]).await.unwrap();
    let kv3 = async_nats::jetstream::new(third)
        .get_key_value("HA_TEST")
        .await
        .unwrap();
    let got = kv3.get("leader").await.unwrap();
    assert_eq!(got.as_deref(), Some(&b"n0"[..]));
}
