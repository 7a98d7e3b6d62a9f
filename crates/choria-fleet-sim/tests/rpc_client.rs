//! The fleet driven by the workspace's own RPC client, the way the provisioner will drive it.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use choria_fleet_sim::SimFleet;
use choria_rpc_client::agents::ConfigureInput;
use choria_rpc_client::protocol::Security;
use choria_rpc_client::rpc::{RpcClient, RpcOptions};
use futures::StreamExt as _;
use test_support::NatsServer;

async fn client(url: &str, identity: &str) -> RpcClient {
    let nats = async_nats::connect(url).await.unwrap();
    RpcClient::new(
        nats,
        Security::insecure(format!("choria={identity}.mcollective")),
        RpcOptions::new(identity, "provisioning"),
    )
    .await
    .unwrap()
}

/// Insists a sharded discovery `found` the whole fleet with one reply a node: `replies` is the
/// fleet's count of discovery replies before it, and becomes the count after it.
fn assert_found_once(fleet: &SimFleet, found: &[String], replies: &mut u64, what: &str) {
    assert_eq!(common::sorted(found.to_vec()), fleet.identities(), "{what}");
    let now = fleet.stats().discovery_replies;
    assert_eq!(now - *replies, 200, "{what}: each node answered once");
    *replies = now;
}

#[tokio::test]
async fn the_rpc_client_discovers_and_provisions_the_whole_fleet() {
    let nats = NatsServer::start();
    let fleet = common::start(&nats.url(), 200).await;
    let rpc = client(&nats.url(), "provisioner").await;
    let found = common::sorted(rpc.discover_provisionable().await.unwrap().to_vec());
    assert_eq!(found, fleet.identities());

    let t = Duration::from_secs(20);
    let other = client(&nats.url(), "intruder").await;
    let locked = other
        .provision_jwt(&found[0], "wrong", t)
        .await
        .unwrap_err();
    assert!(
        locked
            .to_string()
            .contains("Incorrect provision token supplied"),
        "{locked}"
    );

    let config = serde_json::json!({"plugin.choria.server.provision": "false"}).to_string();
    let results: Vec<(String, Result<(), choria_rpc_client::rpc::RequestError>)> =
        futures::stream::iter(found.clone())
            .map(|id| {
                let rpc = &rpc;
                let config = config.clone();
                async move {
                    let r = provision(rpc, &id, config).await;
                    (id, r)
                }
            })
            .buffer_unordered(32)
            .collect()
            .await;
    // The intruder took node 0's lock first (a refused call still locks), so only it failed.
    for (id, r) in &results {
        match r {
            Err(e) if id == &found[0] => assert!(e.is_provisioning_locked(), "{e}"),
            r => assert!(r.is_ok(), "{id}: {r:?}"),
        }
    }
    assert!(results.iter().any(|(id, r)| id == &found[0] && r.is_err()));
    assert!(fleet.wait_provisioned(199, Duration::from_secs(20)).await);
    assert_eq!(
        rpc.discover_provisionable().await.unwrap().to_vec(),
        [found[0].clone()]
    );
    fleet.shutdown().await;
}

async fn provision(
    rpc: &RpcClient,
    id: &str,
    config: String,
) -> Result<(), choria_rpc_client::rpc::RequestError> {
    let t = Duration::from_secs(20);
    let jwt = rpc.provision_jwt(id, common::TOKEN, t).await?;
    assert_eq!(jwt.ecdh_public.len(), 64);
    let inv = rpc.inventory(id, t).await?;
    assert_eq!(inv.version, "0.30.0");
    let req = ConfigureInput {
        config,
        ..ConfigureInput::default()
    };
    rpc.provision_configure(id, common::TOKEN, &req, t).await?;
    let r = rpc.provision_restart(id, common::TOKEN, Some(1), t).await?;
    assert_eq!(r.message, "Restarting Choria Server after 2s");
    Ok(())
}

#[tokio::test]
async fn a_sharded_discovery_finds_every_node_once() {
    let nats = NatsServer::start();
    let fleet = common::start(&nats.url(), 200).await;
    let rpc = client(&nats.url(), "provisioner").await;
    let whole = rpc.discover_provisionable().await.unwrap();
    assert_eq!(whole.len(), 200);
    let mut replies = fleet.stats().discovery_replies;
    assert_eq!(replies, 200);
    for shards in [2, 7, 10] {
        // Each node answers one shard only: as many replies as one whole discovery.
        let found = rpc.discover_provisionable_in(shards).await.unwrap();
        assert_found_once(
            &fleet,
            &found.to_vec(),
            &mut replies,
            &format!("{shards} shards"),
        );
    }
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_probed_discovery_finds_every_node_once_and_sizes_its_shards_from_the_first() {
    let nats = NatsServer::start();
    let fleet = common::start(&nats.url(), 200).await;
    let rpc = client(&nats.url(), "provisioner").await;
    let mut replies = 0;
    let mut requests = fleet.stats().requests;
    // A fleet the first shard says is small (20 of 200 in the first of ten, 200 estimated, at
    // most 1,000 a shard): that shard, then the rest in one. One it says is large (at most 50
    // a shard): all ten shards one by one.
    for (shard_size, asked) in [(1_000, 2), (50, 10)] {
        let found = rpc
            .discover_provisionable_probed(shard_size, 10)
            .await
            .unwrap();
        let what = format!("shards of {shard_size}");
        assert_found_once(&fleet, &found.to_vec(), &mut replies, &what);
        // Only discoveries are sent here: the requests the simulator took are the broadcasts.
        let now = fleet.stats().requests;
        assert_eq!(
            now - requests,
            asked,
            "discoveries for shards of {shard_size}"
        );
        requests = now;
    }
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_node_provisioned_before_its_startup_event_is_not_announced_after_it() {
    let nats = NatsServer::start();
    let (_watcher, mut events) = common::subscribe(
        &nats.url(),
        "choria.lifecycle.event.startup.provision_mode_server",
    )
    .await;
    // Ten nodes announced one a second, in order: the last one's turn comes after 9 s.
    let mut cfg = common::config(&nats.url(), 10);
    cfg.startup_rate = 1;
    let fleet = choria_fleet_sim::SimFleet::start(cfg).await.unwrap();
    let rpc = client(&nats.url(), "provisioner").await;
    let last = fleet.identities()[9].clone();
    let config = serde_json::json!({"plugin.choria.server.provision": "false"}).to_string();
    provision(&rpc, &last, config).await.unwrap();
    assert!(fleet.wait_provisioned(1, Duration::from_secs(10)).await);
    let mut announced = Vec::new();
    while announced.len() < 9 {
        let m = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("nine startup events")
            .unwrap();
        let e = choria_rpc_client::lifecycle::LifecycleEvent::parse(&m.payload).unwrap();
        announced.push(e.event.identity);
    }
    // Its turn passes in silence (it announces its restart as a provisioned server only): it
    // is past its boot in provisioning mode.
    assert!(
        tokio::time::timeout(Duration::from_secs(3), events.next())
            .await
            .is_err(),
        "no tenth startup event"
    );
    assert!(!announced.contains(&last), "{announced:?}");
    assert_eq!(fleet.stats().events_skipped, 1);
    fleet.shutdown().await;
}
