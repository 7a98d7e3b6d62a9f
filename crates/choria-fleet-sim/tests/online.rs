//! Provisioned nodes that stay online (`stay_online`): discovery and RPCs on their main
//! collective, `reprovision` back into provisioning mode, and nodes started provisioned.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use choria_fleet_sim::crypto::JwtSigner;
use choria_fleet_sim::{EnrollmentSource, FleetConfig, Mode, Phase, SimFleet};
use choria_rpc_client::lifecycle::LifecycleEvent;
use choria_rpc_client::mcorpc::StatusCode;
use choria_rpc_client::protocol::ProtocolVersion;
use common::{now, Client, SEC, TOKEN};
use futures::StreamExt as _;
use serde_json::json;
use test_support::NatsServer;

fn online_config(url: &str, nodes: usize, mode: Mode) -> FleetConfig {
    let mut cfg = common::config(url, nodes);
    cfg.mode = mode;
    cfg.stay_online = true;
    cfg.reprovision_delay = Some(Duration::from_millis(300));
    cfg
}

/// A server JWT for `identity` and `public_key`, signed by a throwaway issuer (the fleet
/// verifies none without `issuer_public`).
fn server_jwt(identity: &str, public_key: &str) -> String {
    let t = now();
    JwtSigner::ed25519(ed25519_dalek::SigningKey::from_bytes(&[4u8; 32]))
        .sign(&json!({
            "identity": identity,
            "purpose": "choria_server",
            "public_key": public_key,
            "exp": t + 3600,
            "nbf": t,
            "iat": t,
            "jti": choria_fleet_sim::crypto::ksuid(t),
        }))
        .unwrap()
}

/// gen25519, configure with a server JWT for the new key, restart.
async fn provision_ed25519(client: &Client, id: &str, config: &serde_json::Value) -> String {
    let r = client
        .rpc(id, "gen25519", json!({"token": TOKEN, "nonce": "n"}))
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    let pk = r.data["public_key"].as_str().unwrap().to_string();
    let r = client
        .rpc(
            id,
            "configure",
            json!({"token": TOKEN, "config": config.to_string(), "server_jwt": server_jwt(id, &pk)}),
        )
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    let r = client
        .rpc(id, "restart", json!({"token": TOKEN, "splay": 1}))
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    pk
}

/// The next lifecycle event on `sub` of `kind` for `identity`, with its subject.
async fn next_event(
    sub: &mut async_nats::Subscriber,
    kind: &str,
    identity: &str,
) -> (String, LifecycleEvent) {
    loop {
        let m = tokio::time::timeout(10 * SEC, sub.next())
            .await
            .expect("no lifecycle event in time")
            .unwrap();
        let e = LifecycleEvent::parse(&m.payload).unwrap().event;
        if e.identity == identity && m.subject.as_str().contains(&format!(".{kind}.")) {
            return (m.subject.to_string(), e);
        }
    }
}

#[tokio::test]
async fn a_provisioned_node_answers_on_its_main_collective_and_reprovisions() {
    let nats = NatsServer::start();
    let (_events_nc, mut events) = common::subscribe(&nats.url(), "choria.lifecycle.event.>").await;
    let fleet = SimFleet::start(online_config(&nats.url(), 3, Mode::Ed25519))
        .await
        .unwrap();
    let ids = fleet.identities();
    let id = ids[0].clone();
    let prov = Client::v1(&nats.url(), "prov").await;
    // No main_collective nor collectives: go-choria's default with the choria provider.
    let config =
        json!({"plugin.choria.server.provision": "false", "plugin.security.provider": "choria"});
    let first_key = provision_ed25519(&prov, &id, &config).await;
    assert!(fleet.wait_provisioned(1, 10 * SEC).await);
    let (subject, _) = next_event(&mut events, "startup", &id).await;
    assert_eq!(subject, "choria.lifecycle.event.startup.server");

    // Gone from the provisioning collective, present on `choria`.
    let mut found = prov.discover(3, 2 * SEC).await;
    found.sort();
    assert_eq!(found, ids[1..].to_vec());
    let main = Client::v1_signed(&nats.url(), "operator", "choria").await;
    assert_eq!(main.discover(3, 2 * SEC).await, vec![id.clone()]);
    // The filter is applied.
    main.assert_unmatched_filter_unanswered().await;
    // Unsigned requests are dropped, as a provisioned server drops them.
    let mut unsigned = Client::v1(&nats.url(), "intruder").await;
    unsigned.collective = "choria".into();
    assert!(unsigned.discover(1, SEC).await.is_empty());
    assert!(fleet.stats().unverified >= 1);
    // Its inventory names its collectives.
    let (_, inv) = main
        .rpc_wait(&id, "rpcutil", "inventory", json!({}), 5 * SEC)
        .await
        .unwrap();
    assert_eq!(inv.data["main_collective"], "choria");
    assert_eq!(inv.data["collectives"], json!(["choria"]));
    // Provisioning actions are refused outside provisioning mode.
    let r = main
        .rpc(&id, "gen25519", json!({"token": TOKEN, "nonce": "x"}))
        .await;
    assert_eq!(
        r.statusmsg,
        "Cannot reconfigure a server that is not in provisioning mode"
    );

    // reprovision: the token is checked first.
    let r = main
        .rpc(&id, "reprovision", json!({"token": "wrong"}))
        .await;
    assert_eq!(r.statuscode, StatusCode::Aborted);
    assert_eq!(r.statusmsg, "Incorrect provision token supplied");
    assert_eq!(fleet.phase(&id), Some(Phase::Provisioned));
    let r = main.rpc(&id, "reprovision", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    assert_eq!(r.data["message"], "Restarting after 300ms");
    let (subject, _) = next_event(&mut events, "shutdown", &id).await;
    assert_eq!(subject, "choria.lifecycle.event.shutdown.server");
    let (subject, _) = next_event(&mut events, "startup", &id).await;
    assert_eq!(
        subject,
        "choria.lifecycle.event.startup.provision_mode_server"
    );
    assert!(fleet.wait_for(|s| s.reprovisioned == 1, 5 * SEC).await);
    let s = fleet.stats();
    assert_eq!((s.provisioned, s.reprovision_requests), (0, 1));
    assert_eq!(fleet.phase(&id), Some(Phase::Provisioning));

    // Back on the provisioning collective only, where reprovision is refused.
    assert!(main.discover(1, SEC).await.is_empty());
    assert_eq!(prov.discover(3, 2 * SEC).await.len(), 3);
    let r = prov.rpc(&id, "reprovision", json!({"token": TOKEN})).await;
    assert_eq!(
        r.statusmsg,
        "Server is already in provisioning mode, cannot enable provisioning mode again"
    );
    // Restart alone does not leave provisioning mode: the configuration enables it.
    let r = prov
        .rpc(&id, "restart", json!({"token": TOKEN, "splay": 1}))
        .await;
    assert!(
        r.statusmsg.contains("enables provisioning"),
        "{}",
        r.statusmsg
    );

    // Provisioned again, with a new key and JWT, on the collective its new configuration sets.
    let config = json!({
        "plugin.choria.server.provision": "false",
        "plugin.security.provider": "choria",
        "collectives": "acme, other",
        "main_collective": "acme",
    });
    let second_key = provision_ed25519(&prov, &id, &config).await;
    assert_ne!(first_key, second_key);
    assert!(fleet.wait_for(|s| s.provisions == 2, 10 * SEC).await);
    let acme = Client::v1_signed(&nats.url(), "operator", "acme").await;
    assert_eq!(acme.discover(3, 2 * SEC).await, vec![id.clone()]);
    assert!(main.discover(1, SEC).await.is_empty());
    let report = fleet.node_report(&id).unwrap();
    assert_eq!((report.provisions, report.reprovisions), (2, 1));
    assert_eq!(report.collectives, vec!["acme", "other"]);
    assert_eq!(report.enrollments.len(), 2);
    let (a, b) = (&report.enrollments[0], &report.enrollments[1]);
    assert_eq!(a.source, EnrollmentSource::Configure);
    assert!(a.server_jwt_id.is_some() && b.server_jwt_id.is_some());
    assert_ne!(a.server_jwt_id, b.server_jwt_id);
    assert_ne!(a.server_jwt_sha256, b.server_jwt_sha256);
    assert!(report.expires.unwrap() > now());
    fleet.shutdown().await;
}

#[tokio::test]
async fn nodes_started_provisioned_answer_and_reprovision() {
    let nats = NatsServer::start();
    let (_events_nc, mut events) = common::subscribe(&nats.url(), "choria.lifecycle.event.>").await;
    let mut cfg = online_config(&nats.url(), 3, Mode::Pki);
    cfg.preprovisioned = 2;
    cfg.preprovisioned_expires_in = Duration::from_secs(5 * 86_400);
    cfg.startup_rate = 1000;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let ids = fleet.identities();
    let s = fleet.stats();
    assert_eq!((s.preprovisioned, s.provisioned, s.provisions), (2, 2, 0));
    // They come up as normal servers, the third in provisioning mode.
    let (subject, _) = next_event(&mut events, "startup", &ids[0]).await;
    assert_eq!(subject, "choria.lifecycle.event.startup.server");
    let (subject, _) = next_event(&mut events, "startup", &ids[2]).await;
    assert_eq!(
        subject,
        "choria.lifecycle.event.startup.provision_mode_server"
    );

    let report = fleet.node_report(&ids[0]).unwrap();
    assert_eq!(report.phase, Phase::Provisioned);
    assert_eq!(report.collectives, vec!["mcollective"]);
    let expires = report.expires.unwrap();
    assert!((expires - (now() + 5 * 86_400)).abs() < 60, "{expires}");
    assert_eq!(report.enrollments.len(), 1);
    assert_eq!(
        report.enrollments[0].source,
        EnrollmentSource::Preprovisioned
    );
    assert!(report.enrollments[0].certificate_serial.is_some());
    assert_ne!(
        report.enrollments[0].certificate_serial,
        fleet.node_report(&ids[1]).unwrap().enrollments[0].certificate_serial
    );

    let main = Client::v1_signed(&nats.url(), "operator", "mcollective").await;
    let mut found = main.discover(3, 2 * SEC).await;
    found.sort();
    assert_eq!(found, ids[..2].to_vec());
    let prov = Client::v1(&nats.url(), "prov").await;
    assert_eq!(prov.discover(3, 2 * SEC).await, vec![ids[2].clone()]);

    let r = main
        .rpc(&ids[0], "reprovision", json!({"token": "nope"}))
        .await;
    assert_eq!(r.statusmsg, "Incorrect provision token supplied");
    let r = main
        .rpc(&ids[0], "reprovision", json!({"token": TOKEN}))
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    let (subject, _) = next_event(&mut events, "startup", &ids[0]).await;
    assert_eq!(
        subject,
        "choria.lifecycle.event.startup.provision_mode_server"
    );
    assert!(fleet.wait_for(|s| s.reprovisioned == 1, 5 * SEC).await);
    assert_eq!(fleet.stats().provisioned, 1);
    let mut found = prov.discover(3, 2 * SEC).await;
    found.sort();
    assert_eq!(found, vec![ids[0].clone(), ids[2].clone()]);
    assert_eq!(main.discover(3, 2 * SEC).await, vec![ids[1].clone()]);
    // A new CSR can be made for the next certificate.
    let r = prov.rpc(&ids[0], "gencsr", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    let report = fleet.node_report(&ids[0]).unwrap();
    assert_eq!((report.provisions, report.reprovisions), (0, 1));
    assert_eq!(report.expires, None);
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_v2_node_started_provisioned_wants_signed_v2_requests() {
    let nats = NatsServer::start();
    let mut cfg = online_config(&nats.url(), 2, Mode::Ed25519);
    cfg.protocol = ProtocolVersion::V2;
    cfg.preprovisioned = 1;
    cfg.main_collective = Some("acme".into());
    let fleet = SimFleet::start(cfg).await.unwrap();
    let id = fleet.identities()[0].clone();
    let report = fleet.node_report(&id).unwrap();
    assert!(report.enrollments[0].server_jwt_id.is_some());

    let signed = Client::v2_signed(&nats.url(), "operator", "acme").await;
    assert_eq!(signed.discover(2, 2 * SEC).await, vec![id.clone()]);
    let mut unsigned = Client::v2(&nats.url(), "intruder").await;
    unsigned.collective = "acme".into();
    assert!(unsigned.discover(1, SEC).await.is_empty());
    // v1 requests are dropped by a v2 server.
    let v1 = Client::v1_signed(&nats.url(), "operator", "acme").await;
    assert!(v1.discover(1, SEC).await.is_empty());
    let r = signed
        .rpc(&id, "reprovision", json!({"token": TOKEN}))
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    assert!(fleet.wait_for(|s| s.reprovisioned == 1, 5 * SEC).await);
    fleet.shutdown().await;
}

#[tokio::test]
async fn started_provisioned_nodes_need_stay_online_and_a_usable_collective() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 2);
    cfg.preprovisioned = 1;
    assert!(SimFleet::start(cfg.clone()).await.is_err());
    cfg.stay_online = true;
    cfg.main_collective = Some("a.b".into());
    assert!(SimFleet::start(cfg.clone()).await.is_err());
    cfg.main_collective = None;
    cfg.preprovisioned = 3;
    assert!(SimFleet::start(cfg).await.is_err());
}

#[test]
fn the_binary_starts_nodes_provisioned_and_reports_their_expiry() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let run = |extra: &[&str]| {
        common::sim_command(&nats.url(), dir.path(), &report)
            .args(["--nodes", "3", "--mode", "ed25519", "--startup-rate", "0"])
            .args(["--exit-when-done", "--timeout", "20s"])
            .args(extra)
            .output()
            .unwrap()
    };
    // Nodes started provisioned need --stay-online.
    let out = run(&["--preprovisioned", "3"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    let out = run(&[
        "--stay-online",
        "--preprovisioned",
        "3",
        "--expires-in",
        "2d",
        "--main-collective",
        "acme",
        "--reprovision-delay",
        "100ms",
    ]);
    common::assert_sim_ended(&out, 0, "fleet-sim: 3/3 nodes provisioned");
    for n in &common::read_report(&report) {
        assert_eq!(n["phase"], "provisioned");
        assert_eq!(n["collectives"], json!(["acme"]));
        let expires = n["expires"].as_i64().unwrap();
        assert!((expires - (now() + 2 * 86_400)).abs() < 60, "{n}");
        assert_eq!(n["enrollments"][0]["source"], "preprovisioned");
        assert!(n["enrollments"][0]["server_jwt_id"].is_string(), "{n}");
    }
}

#[tokio::test]
async fn a_configuration_with_an_unusable_collective_leaves_the_node_broken() {
    let nats = NatsServer::start();
    let fleet = SimFleet::start(online_config(&nats.url(), 1, Mode::Ed25519))
        .await
        .unwrap();
    let id = fleet.identities()[0].clone();
    let prov = Client::v1(&nats.url(), "prov").await;
    let config = json!({
        "plugin.choria.server.provision": "false",
        "plugin.security.provider": "choria",
        "main_collective": "a.>",
    });
    provision_ed25519(&prov, &id, &config).await;
    assert!(fleet.wait_for(|s| s.broken == 1, 10 * SEC).await);
    let s = fleet.stats();
    assert_eq!((s.provisioned, s.provisions), (0, 0));
    let report = fleet.node_report(&id).unwrap();
    assert_eq!(report.phase, Phase::Broken);
    assert!(
        report.problems[0].contains("invalid collective"),
        "{:?}",
        report.problems
    );
    assert!(report.enrollments.is_empty());
    fleet.shutdown().await;
}
