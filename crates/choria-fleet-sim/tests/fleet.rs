//! The fleet against a real nats-server: discovery, inventory, every provisioning action with
//! go-choria's answers, a full provisioning by hand, faults and the command line.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use choria_fleet_sim::config::{is_affected, FaultKind};
use choria_fleet_sim::crypto::{self, JwtSigner, TrustPath};
use choria_fleet_sim::{Mode, Phase, SimFleet};
use choria_rpc_client::lifecycle::{EventFormat, LifecycleEvent};
use choria_rpc_client::mcorpc::StatusCode;
use choria_rpc_client::protocol::{Filter, ProtocolVersion};
use common::{now, Client, SEC, TOKEN};
use ed25519_dalek::{Signer as _, Verifier as _};
use futures::StreamExt as _;
use serde_json::json;
use test_support::NatsServer;

/// A server JWT issued through a chain issuer, as the Go provisioner does with
/// `jwt_signing_token`.
fn chain_server_jwt(org: &ed25519_dalek::SigningKey, identity: &str, public_key: &str) -> String {
    let signer = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
    let signer_pub = hex::encode(signer.verifying_key().as_bytes());
    let t = now();
    let chain_jti = crypto::ksuid(t);
    let chain_tcs = hex::encode(
        org.sign(format!("{chain_jti}.{signer_pub}").as_bytes())
            .to_bytes(),
    );
    let jti = crypto::ksuid(t);
    let sig = signer.sign(format!("{jti}.{chain_tcs}").as_bytes());
    let claims = json!({
        "identity": identity,
        "collectives": ["choria"],
        "purpose": "choria_server",
        "tcs": format!("{chain_tcs}.{}", hex::encode(sig.to_bytes())),
        "public_key": public_key,
        "issexp": t + 3600,
        "iss": format!("C-{chain_jti}.{signer_pub}"),
        "exp": t + 3600,
        "nbf": t,
        "iat": t,
        "jti": jti,
    });
    JwtSigner::ed25519(signer).sign(&claims).unwrap()
}

#[tokio::test]
async fn discovery_finds_every_node_and_other_protocol_versions_are_ignored() {
    let nats = NatsServer::start();
    let fleet = common::start(&nats.url(), 300).await;
    let client = Client::v1(&nats.url(), "prov").await;
    let mut found = client.discover(300, 20 * SEC).await;
    found.sort();
    let mut want = fleet.identities();
    want.sort();
    assert_eq!(found, want);

    // A v1 fleet drops v2 requests, as go-choria servers do.
    let v2 = Client::v2(&nats.url(), "prov2").await;
    assert!(v2.discover(1, SEC).await.is_empty());

    // A filter that matches no node gets no answer.
    client.assert_unmatched_filter_unanswered().await;
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_v2_fleet_answers_v2_in_kind() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 5);
    cfg.protocol = ProtocolVersion::V2;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let v2 = Client::v2(&nats.url(), "prov").await;
    let replies = v2
        .request(
            None,
            "discovery",
            b"cGluZw==",
            &Filter::default(),
            5,
            10 * SEC,
        )
        .await;
    assert_eq!(replies.len(), 5);
    assert!(replies
        .iter()
        .all(|r| r.version == ProtocolVersion::V2 && r.body == b"pong"));
    let v1 = Client::v1(&nats.url(), "prov").await;
    assert!(v1.discover(1, SEC).await.is_empty());

    // The JWT tells provisioners the fleet is v2.
    let id = &fleet.identities()[0];
    let jwt = v2.rpc(id, "jwt", json!({"token": TOKEN})).await;
    let claims = crypto::jwt_claims_unverified(jwt.data["jwt"].as_str().unwrap()).unwrap();
    assert_eq!(claims["v2"], true);
    fleet.shutdown().await;
}

#[tokio::test]
async fn inventory_reports_a_string_version_and_the_provisioning_agents() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 3);
    cfg.version = "0.29.4".into();
    cfg.upgradable = true;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let client = Client::v1(&nats.url(), "prov").await;
    let id = &fleet.identities()[1];
    let (reply, rpc) = client
        .rpc_wait(id, "rpcutil", "inventory", json!({}), 10 * SEC)
        .await
        .unwrap();
    assert_eq!(&reply.sender, id);
    assert_eq!(reply.transport_sender.as_deref(), Some(id.as_str()));
    assert_eq!(rpc.statuscode, StatusCode::Ok);
    assert_eq!(rpc.data["version"], "0.29.4");
    assert_eq!(rpc.data["upgradable"], true);
    assert_eq!(
        rpc.data["agents"],
        json!(["choria_provision", "choria_util", "discovery", "rpcutil"])
    );
    assert_eq!(rpc.data["main_collective"], "provisioning");
    assert_eq!(rpc.data["facts"], json!({}));
    let (_, unknown) = client
        .rpc_wait(id, "rpcutil", "frobnicate", json!({}), 10 * SEC)
        .await
        .unwrap();
    assert_eq!(unknown.statuscode, StatusCode::UnknownAction);
    assert_eq!(
        unknown.statusmsg,
        "Unknown action frobnicate for agent rpcutil"
    );
    fleet.shutdown().await;
}

#[tokio::test]
async fn provisioning_actions_answer_errors_as_go_choria_does() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 2);
    cfg.lock_window = Duration::from_secs(3);
    let fleet = SimFleet::start(cfg).await.unwrap();
    let id = fleet.identities()[0].clone();
    let a = Client::v1(&nats.url(), "prov-a").await;
    let b = Client::v1(&nats.url(), "prov-b").await;

    // Wrong token, and the refused call still takes the lock (go-choria locks first).
    let r = a.rpc(&id, "jwt", json!({"token": "wrong"})).await;
    assert_eq!(r.statuscode, StatusCode::Aborted);
    assert_eq!(r.statusmsg, "Incorrect provision token supplied");
    assert_eq!(r.data, json!({}));
    let r = b.rpc(&id, "jwt", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Aborted);
    assert_eq!(r.statusmsg, "Could not obtain provisioning lock");
    // Unlocked actions are not refused for the other caller.
    let r = b.rpc(&id, "shutdown", json!({"token": "nope"})).await;
    assert_eq!(r.statusmsg, "Incorrect provision token supplied");
    // The holder keeps working.
    let r = a.rpc(&id, "jwt", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    assert_eq!(r.data["ecdh_public"].as_str().unwrap().len(), 64);

    // Input validation, in go-choria's order and words.
    let cases = [
        ("gen25519", json!({"token": 5}), StatusCode::InvalidData,
         "Could not parse request data for choria_provision#gen25519: json: cannot unmarshal number into Go struct field ED25519Request.token of type string"),
        ("restart", json!({"token": TOKEN, "splay": 1.5}), StatusCode::InvalidData,
         "Could not parse request data for choria_provision#restart: json: cannot unmarshal number 1.5 into Go struct field RestartRequest.splay of type int"),
        ("configure", json!({"token": TOKEN}), StatusCode::Aborted,
         "Did not receive any configuration to write, cannot write a empty configuration file"),
        ("configure", json!({"token": TOKEN, "config": "{}", "key": "x"}), StatusCode::Aborted,
         "EDCH Public Key not supplied while providing a private key"),
        ("configure", json!({"token": TOKEN, "config": "{\"a\":1}"}), StatusCode::Aborted,
         "Could not decode configuration data: json: cannot unmarshal number into Go value of type string"),
        ("configure", json!({"token": TOKEN, "config": "{\"a\":\"b\"}", "action_policies": {"x": "y"}}), StatusCode::Aborted,
         "Could not save Action Policies: expected \"x\" to have .policy extension"),
        ("configure", json!({"token": TOKEN, "config": "{}", "action_policies": {"x.policy": 1}}), StatusCode::InvalidData,
         "Could not parse request data for choria_provision#configure: json: cannot unmarshal number into Go struct field ConfigureRequest.action_policies of type string"),
        ("restart", json!({"token": TOKEN}), StatusCode::Aborted,
         "Configuration /etc/choria/server.conf could not be parsed, restart cannot continue: open /etc/choria/server.conf: no such file or directory"),
        ("release_update", json!({"token": TOKEN, "version": "1", "repository": "https://x"}), StatusCode::Aborted,
         "Version updates is not enabled in the configuration"),
        ("reprovision", json!({"token": TOKEN}), StatusCode::Aborted,
         "Server is already in provisioning mode, cannot enable provisioning mode again"),
        ("frob", json!({}), StatusCode::UnknownAction, "Unknown action frob for agent choria_provision"),
    ];
    for (action, data, code, msg) in cases {
        let r = a.rpc(&id, action, data.clone()).await;
        assert_eq!(
            (r.statuscode, r.statusmsg.as_str()),
            (code, msg),
            "{action} {data}"
        );
    }

    // A configuration that keeps provisioning on cannot be restarted into.
    let r = a
        .rpc(
            &id,
            "configure",
            json!({"token": TOKEN, "config": "{\"plugin.choria.server.provision\":\"true\"}"}),
        )
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    assert_eq!(
        r.data["message"],
        "Wrote 2 lines to /etc/choria/server.conf"
    );
    let r = a
        .rpc(&id, "restart", json!({"token": TOKEN, "splay": 1}))
        .await;
    assert_eq!(
        r.statusmsg,
        "Configuration /etc/choria/server.conf enables provisioning, restart cannot continue"
    );

    // The lock expires after its window and then the other caller gets it.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    let r = b.rpc(&id, "jwt", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    let r = a.rpc(&id, "jwt", json!({"token": TOKEN})).await;
    assert_eq!(r.statusmsg, "Could not obtain provisioning lock");

    // The report records what was seen, in order.
    let report = fleet.node_report(&id).unwrap();
    assert_eq!(report.actions[0].action, "jwt");
    assert_eq!(report.actions[0].statuscode, 1);
    assert_eq!(report.actions[1].statuscode, 1);
    assert!(!report.provisioned);
    fleet.shutdown().await;
}

#[tokio::test]
async fn a_node_provisioned_by_hand_leaves_the_provisioning_collective() {
    let nats = NatsServer::start();
    let (_events_nc, mut events) = common::subscribe(&nats.url(), "choria.lifecycle.event.>").await;

    let org = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32]);
    let mut cfg = common::config(&nats.url(), 4);
    cfg.mode = Mode::Pki;
    cfg.startup_rate = 1000;
    cfg.provisioning_jwt = choria_fleet_sim::ProvisioningJwt::Sign(
        JwtSigner::from_key_data(common::read("prov-signer-key.pem").as_bytes()).unwrap(),
    );
    cfg.issuer_public = Some(
        crypto::verifier_from_public_data(&hex::encode(org.verifying_key().as_bytes())).unwrap(),
    );
    let fleet = SimFleet::start(cfg).await.unwrap();
    let id = fleet.identities()[0].clone();
    let client = Client::v1(&nats.url(), "prov").await;

    // Every node announces itself in provisioning mode, as CloudEvents.
    let mut startups = Vec::new();
    while startups.len() < 4 {
        let m = tokio::time::timeout(10 * SEC, events.next())
            .await
            .unwrap()
            .unwrap();
        let e = LifecycleEvent::parse(&m.payload).unwrap();
        assert_eq!(e.format, EventFormat::CloudEvent);
        assert_eq!(
            m.subject.as_str(),
            "choria.lifecycle.event.startup.provision_mode_server"
        );
        startups.push(e.event.identity);
    }
    startups.sort();
    assert_eq!(startups, fleet.identities());

    // jwt: an RS256 provisioning token the Go provisioner can verify, and an ECDH key.
    let r = client.rpc(&id, "jwt", json!({"token": TOKEN})).await;
    let verifier = crypto::verifier_from_public_data(&common::read("prov-signer.pem")).unwrap();
    let claims = crypto::verify_jwt(r.data["jwt"].as_str().unwrap(), &verifier, now()).unwrap();
    assert_eq!(claims["cht"], TOKEN);
    assert_eq!(claims["chu"], nats.url());
    assert_eq!(claims["chpd"], true);
    assert_eq!(claims["purpose"], "choria_provisioning");
    assert_eq!(claims["sub"], "choria_provisioning");
    assert!(claims.get("v2").is_none());
    let server_ecdh = r.data["ecdh_public"].as_str().unwrap().to_string();

    // gen25519: a real key whose signature over the nonce text verifies.
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let r = client
        .rpc(&id, "gen25519", json!({"token": TOKEN, "nonce": nonce}))
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    assert_eq!(r.data["directory"], "/etc/choria");
    let pk_hex = r.data["public_key"].as_str().unwrap().to_string();
    let pk: [u8; 32] = hex::decode(&pk_hex).unwrap().try_into().unwrap();
    let sig: [u8; 64] = hex::decode(r.data["signature"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    ed25519_dalek::VerifyingKey::from_bytes(&pk)
        .unwrap()
        .verify(
            nonce.as_bytes(),
            &ed25519_dalek::Signature::from_bytes(&sig),
        )
        .unwrap();

    // gencsr: a CSR for the requested name with a PKCS#1 key in a PUBLIC KEY block.
    let r = client
        .rpc(
            &id,
            "gencsr",
            json!({"token": TOKEN, "cn": id, "o": "Choria", "C": "NL"}),
        )
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    assert_eq!(r.data["ssldir"], "/etc/choria/ssl");
    let csr = r.data["csr"].as_str().unwrap();
    assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----\n"));
    let csr_der = pem::parse(csr).unwrap();
    let req = <x509_cert::request::CertReq as der::Decode>::from_der(csr_der.contents()).unwrap();
    assert_eq!(
        req.info.subject.to_string(),
        format!("CN={id},O=Choria,C=NL")
    );
    assert!(r.data["public_key"]
        .as_str()
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----\n"));

    // configure: an encrypted key for the certificate, and a chain-issued server JWT.
    let encrypted =
        choria_crypto::keyenc::encrypt_private_key(&common::read("node-key.pem"), &server_ecdh)
            .unwrap();
    let server_jwt = chain_server_jwt(&org, &id, &pk_hex);
    let config = json!({"plugin.choria.server.provision": "false", "identity": id}).to_string();
    let data = json!({
        "token": TOKEN, "config": config, "certificate": common::read("node-cert.pem"),
        "ca": common::read("node-cert.pem"), "ssldir": "/etc/choria/ssl", "key": encrypted.pem,
        "ecdh_public": encrypted.ecdh_public, "server_jwt": server_jwt,
        "action_policies": {"rpcutil.policy": "policy default allow"}, "opa_policies": {},
    });
    let r = client.rpc(&id, "configure", data).await;
    assert_eq!(r.statuscode, StatusCode::Ok, "{}", r.statusmsg);
    assert_eq!(
        r.data["message"],
        "Wrote 3 lines to /etc/choria/server.conf"
    );

    // A server JWT not from the issuer is refused.
    let other = ed25519_dalek::SigningKey::from_bytes(&[2u8; 32]);
    let forged = chain_server_jwt(&other, &id, &pk_hex);
    let r = client
        .rpc(
            &fleet.identities()[1],
            "configure",
            json!({"token": TOKEN, "config": "{}", "server_jwt": forged}),
        )
        .await;
    assert_eq!(r.statuscode, StatusCode::Aborted);
    assert!(
        r.statusmsg.starts_with("JWT Setup Failed: "),
        "{}",
        r.statusmsg
    );

    // restart: go-choria's reply, then shutdown, and a startup as a normal server.
    let r = client
        .rpc(&id, "restart", json!({"token": TOKEN, "splay": 1}))
        .await;
    assert_eq!(r.data["message"], "Restarting Choria Server after 2s");
    assert!(fleet.wait_provisioned(1, 10 * SEC).await);
    let mut seen = Vec::new();
    while !seen.contains(&"startup.server".to_string()) {
        let m = tokio::time::timeout(10 * SEC, events.next())
            .await
            .unwrap()
            .unwrap();
        let e = LifecycleEvent::parse(&m.payload).unwrap().event;
        if e.identity == id {
            seen.push(format!("{}.{}", e.event_type(), e.component));
        }
    }
    assert_eq!(
        seen,
        [
            "provisioned.provision_mode_server",
            "shutdown.provision_mode_server",
            "startup.server"
        ]
    );
    assert_eq!(fleet.phase(&id), Some(Phase::Provisioned));

    // It does not answer in the provisioning collective now; the others still do.
    let found = client.discover(4, 3 * SEC).await;
    assert_eq!(found.len(), 3);
    assert!(!found.contains(&id));
    assert!(client
        .rpc_wait(&id, "rpcutil", "inventory", json!({}), SEC)
        .await
        .is_none());

    // The report holds what the node received.
    let report = fleet.node_report(&id).unwrap();
    assert!(report.provisioned);
    let received = report.received.unwrap();
    assert!(received.key_received);
    assert_eq!(received.certificate_matches_key, Some(true));
    assert_eq!(received.server_jwt_trust, Some(TrustPath::Chain));
    assert_eq!(received.server_jwt_claims.unwrap()["identity"], id.as_str());
    assert_eq!(received.configuration["identity"], id);
    assert_eq!(
        received.action_policies["rpcutil.policy"],
        "policy default allow"
    );
    let names: Vec<_> = report.actions.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(names, ["jwt", "gen25519", "gencsr", "configure", "restart"]);
    assert_eq!(report.csr_cn.as_deref(), Some(id.as_str()));
    assert_eq!(report.ed25519_public_key.as_deref(), Some(pk_hex.as_str()));
    fleet.shutdown().await;
}

#[tokio::test]
async fn pki_nodes_use_their_csr_key_and_loops_are_caught() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 3);
    cfg.mode = Mode::Pki;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let ids = fleet.identities();
    let client = Client::v1(&nats.url(), "prov").await;
    let off = json!({"plugin.choria.server.provision": "false"}).to_string();

    // Node 0 uses pool key 0, for which pool0-cert.pem was issued.
    let r = client.rpc(&ids[0], "gencsr", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    let cert = common::read("pool0-cert.pem");
    let r = client
        .rpc(&ids[0], "configure", json!({"token": TOKEN, "config": off, "certificate": cert, "ca": cert, "ssldir": "/etc/choria/ssl"}))
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    client
        .rpc(&ids[0], "restart", json!({"token": TOKEN, "splay": 1}))
        .await;

    // Node 1 gets a certificate for some other key: it restarts broken.
    client.rpc(&ids[1], "gencsr", json!({"token": TOKEN})).await;
    let other = common::read("node-cert.pem");
    client
        .rpc(&ids[1], "configure", json!({"token": TOKEN, "config": off, "certificate": other, "ca": other, "ssldir": "/x"}))
        .await;
    client
        .rpc(&ids[1], "restart", json!({"token": TOKEN}))
        .await;

    // Node 2's configuration leaves provisioning on by default: it comes back unprovisioned.
    client
        .rpc(
            &ids[2],
            "configure",
            json!({"token": TOKEN, "config": "{\"a\":\"b\"}"}),
        )
        .await;
    client
        .rpc(&ids[2], "restart", json!({"token": TOKEN, "splay": 1}))
        .await;

    assert!(fleet.wait_provisioned(1, 10 * SEC).await);
    for _ in 0..50 {
        if fleet.stats().broken == 1 && fleet.node_report(&ids[2]).unwrap().restarts == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fleet.phase(&ids[0]), Some(Phase::Provisioned));
    assert_eq!(fleet.phase(&ids[1]), Some(Phase::Broken));
    assert_eq!(fleet.phase(&ids[2]), Some(Phase::Provisioning));
    let r2 = fleet.node_report(&ids[2]).unwrap();
    assert!(
        r2.problems[0].contains("provisioning again"),
        "{:?}",
        r2.problems
    );
    // Back in provisioning mode it answers again.
    let r = client.rpc(&ids[2], "jwt", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    assert_eq!(fleet.stats().provisioned, 1);
    fleet.shutdown().await;
}

#[tokio::test]
async fn release_update_changes_the_version_and_restarts_into_provisioning() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 1);
    cfg.upgradable = true;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let id = fleet.identities()[0].clone();
    let client = Client::v1(&nats.url(), "prov").await;
    let r = client
        .rpc(
            &id,
            "release_update",
            json!({"token": TOKEN, "repository": "https://repo.example.net", "version": "0.31.0"}),
        )
        .await;
    assert_eq!(r.statuscode, StatusCode::Ok);
    assert_eq!(r.data["message"], "Restarting Choria Server after 2s");
    for _ in 0..50 {
        if fleet.node_report(&id).unwrap().restarts == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, inv) = client
        .rpc_wait(&id, "rpcutil", "inventory", json!({}), 10 * SEC)
        .await
        .unwrap();
    assert_eq!(inv.data["version"], "0.31.0");
    assert_eq!(fleet.phase(&id), Some(Phase::Provisioning));
    fleet.shutdown().await;
}

#[tokio::test]
async fn faults_hit_the_predicted_nodes() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 40);
    cfg.faults.drop = 0.25;
    cfg.faults.bad_nonce = 0.5;
    cfg.faults.wrong_identity = 0.25;
    cfg.faults.fail_action = vec![("jwt".into(), 0.5)];
    cfg.faults.drop_once = 0.5;
    cfg.faults.bad_csr = 0.5;
    cfg.faults.slow = Some((0.5, Duration::from_millis(1500)));
    let fleet = SimFleet::start(cfg).await.unwrap();
    let client = Client::v1(&nats.url(), "prov").await;
    let ids = fleet.identities();
    // Discovery still finds dropping nodes.
    assert_eq!(client.discover(40, 10 * SEC).await.len(), 40);

    let dropping = ids
        .iter()
        .find(|i| is_affected(FaultKind::Drop, i, 0.25))
        .unwrap();
    assert!(client
        .rpc_wait(dropping, "rpcutil", "inventory", json!({}), SEC)
        .await
        .is_none());

    let healthy = |i: &&String| {
        !is_affected(FaultKind::Drop, i, 0.25) && !is_affected(FaultKind::DropOnce, i, 0.5)
    };
    let wrong = ids
        .iter()
        .filter(healthy)
        .find(|i| is_affected(FaultKind::WrongIdentity, i, 0.25))
        .unwrap();
    let (reply, _) = client
        .rpc_wait(wrong, "rpcutil", "inventory", json!({}), 5 * SEC)
        .await
        .unwrap();
    assert_ne!(&reply.sender, wrong);

    let bad = ids
        .iter()
        .filter(healthy)
        .find(|i| is_affected(FaultKind::BadNonce, i, 0.5))
        .unwrap();
    let r = client
        .rpc(bad, "gen25519", json!({"token": TOKEN, "nonce": "abc"}))
        .await;
    let pk: [u8; 32] = hex::decode(r.data["public_key"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let sig: [u8; 64] = hex::decode(r.data["signature"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    assert!(ed25519_dalek::VerifyingKey::from_bytes(&pk)
        .unwrap()
        .verify(b"abc", &ed25519_dalek::Signature::from_bytes(&sig))
        .is_err());

    let failing = ids
        .iter()
        .filter(healthy)
        .find(|i| is_affected(FaultKind::FailAction, i, 0.5))
        .unwrap();
    let r = client.rpc(failing, "jwt", json!({"token": TOKEN})).await;
    assert_eq!(r.statuscode, StatusCode::Aborted);
    let fine = ids
        .iter()
        .filter(healthy)
        .find(|i| !is_affected(FaultKind::FailAction, i, 0.5))
        .unwrap();
    assert_eq!(
        client
            .rpc(fine, "jwt", json!({"token": TOKEN}))
            .await
            .statuscode,
        StatusCode::Ok
    );

    // The first reply of each action is lost on drop-once nodes; a retry is answered.
    let once = ids
        .iter()
        .filter(|i| !is_affected(FaultKind::Drop, i, 0.25))
        .find(|i| is_affected(FaultKind::DropOnce, i, 0.5))
        .unwrap();
    let data = json!({"token": TOKEN, "nonce": "n"});
    assert!(client
        .rpc_wait(once, "choria_provision", "gen25519", data.clone(), 2 * SEC)
        .await
        .is_none());
    assert_eq!(
        client.rpc(once, "gen25519", data).await.statuscode,
        StatusCode::Ok
    );

    let bad_csr = ids
        .iter()
        .filter(healthy)
        .find(|i| is_affected(FaultKind::BadCsr, i, 0.5))
        .unwrap();
    let r = client.rpc(bad_csr, "gencsr", json!({"token": TOKEN})).await;
    let der = pem::parse(r.data["csr"].as_str().unwrap()).unwrap();
    let req = <x509_cert::request::CertReq as der::Decode>::from_der(der.contents()).unwrap();
    assert_eq!(req.info.subject.to_string(), format!("CN=bogus-{bad_csr}"));

    let slow = ids
        .iter()
        .filter(healthy)
        .find(|i| is_affected(FaultKind::Slow, i, 0.5))
        .unwrap();
    let t = std::time::Instant::now();
    client
        .rpc_wait(slow, "rpcutil", "inventory", json!({}), 10 * SEC)
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_millis(1500));
    fleet.shutdown().await;
}

#[test]
fn the_binary_reports_and_fails_when_not_done_in_time() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let out = common::sim_command(&nats.url(), dir.path(), &report)
        .args(["--nodes", "7", "--mode", "plain"])
        .args([
            "--exit-when-done",
            "--timeout",
            "1s",
            "--identity-prefix",
            "cli",
        ])
        .output()
        .unwrap();
    common::assert_sim_ended(&out, 1, "fleet-sim: 0/7 nodes provisioned");
    let nodes = common::read_report(&report);
    assert_eq!(nodes.len(), 7);
    assert_eq!(nodes[0]["identity"], "cli-1.fleet.example.net");
    assert_eq!(nodes[0]["provisioned"], false);
    assert_eq!(nodes[0]["phase"], "provisioning");
}

#[tokio::test]
async fn the_fleet_connects_over_tls_without_verifying_the_broker() {
    // A broker with a self-signed certificate for another name, which plain clients may
    // still use without TLS.
    let tls = format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\nallow_non_tls: true\n",
        common::testdata("node-cert.pem").display(),
        common::testdata("node-key.pem").display()
    );
    let nats = NatsServer::start_with_config(&tls);
    let mut cfg = common::config(&nats.url(), 3);
    cfg.tls = true;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let client = Client::v1(&nats.url(), "prov").await;
    assert_eq!(client.discover(3, 10 * SEC).await.len(), 3);
    fleet.shutdown().await;

    // TLS really is in use: verifying against an unrelated CA fails.
    let mut cfg = common::config(&nats.url(), 1);
    cfg.tls_ca = Some(common::testdata("pool0-cert.pem"));
    assert!(matches!(
        SimFleet::start(cfg).await,
        Err(choria_fleet_sim::FleetError::Connect { .. })
    ));
}

#[tokio::test]
async fn the_binary_exits_zero_once_every_node_is_provisioned() {
    let nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("signer.seed");
    std::fs::write(&seed, hex::encode(common::SIGNER_SEED)).unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_choria-fleet-sim"))
        .args(["--broker", &nats.url(), "--nodes", "3", "--token", TOKEN])
        .arg("--provisioning-signer")
        .arg(&seed)
        .args([
            "--exit-when-done",
            "--timeout",
            "60s",
            "--restart-delay",
            "100ms",
        ])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = Client::v1(&nats.url(), "prov").await;
    let mut nodes = Vec::new();
    for _ in 0..50 {
        nodes = client.discover(3, SEC).await;
        if nodes.len() == 3 {
            break;
        }
    }
    assert_eq!(nodes.len(), 3);
    let config = json!({"plugin.choria.server.provision": "false"}).to_string();
    for node in &nodes {
        let r = client
            .rpc(node, "configure", json!({"token": TOKEN, "config": config}))
            .await;
        assert_eq!(r.statuscode, StatusCode::Ok);
        client.rpc(node, "restart", json!({"token": TOKEN})).await;
    }
    let out = tokio::time::timeout(30 * SEC, child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    common::assert_sim_ended(&out, 0, "fleet-sim: 3/3 nodes provisioned");
}

#[tokio::test]
async fn ed25519_nodes_need_a_server_jwt_for_their_own_key() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 2);
    cfg.mode = Mode::Ed25519;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let ids = fleet.identities();
    let client = Client::v1(&nats.url(), "prov").await;
    let org = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32]);
    let config =
        json!({"plugin.choria.server.provision": "false", "plugin.security.provider": "choria"})
            .to_string();
    // Keys made at start: each node has its own.
    let mut keys = std::collections::HashSet::new();
    for id in &ids {
        let r = client
            .rpc(id, "gen25519", json!({"token": TOKEN, "nonce": "n"}))
            .await;
        keys.insert(r.data["public_key"].as_str().unwrap().to_string());
    }
    assert_eq!(keys.len(), ids.len());
    for (i, id) in ids.iter().enumerate() {
        let r = client
            .rpc(id, "gen25519", json!({"token": TOKEN, "nonce": "n"}))
            .await;
        // Node 1 gets a token for some other key.
        let pk = if i == 0 {
            r.data["public_key"].as_str().unwrap().to_string()
        } else {
            hex::encode([8u8; 32])
        };
        let jwt = chain_server_jwt(&org, id, &pk);
        let r = client
            .rpc(
                id,
                "configure",
                json!({"token": TOKEN, "config": config, "server_jwt": jwt}),
            )
            .await;
        assert_eq!(r.statuscode, StatusCode::Ok);
        client
            .rpc(id, "restart", json!({"token": TOKEN, "splay": 1}))
            .await;
    }
    assert!(fleet.wait_provisioned(1, 10 * SEC).await);
    for _ in 0..50 {
        if fleet.node_report(&ids[1]).unwrap().restarts == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(fleet.phase(&ids[0]), Some(Phase::Provisioned));
    assert_eq!(fleet.phase(&ids[1]), Some(Phase::Provisioning));
    let problems = fleet.node_report(&ids[1]).unwrap().problems;
    assert!(
        problems[0].contains("public_key does not match"),
        "{problems:?}"
    );
    fleet.shutdown().await;
}

#[tokio::test]
async fn garbage_and_duplicate_replies_hit_rpcs_but_not_discovery() {
    let nats = NatsServer::start();
    let mut cfg = common::config(&nats.url(), 20);
    cfg.faults.garbage = 0.3;
    cfg.faults.duplicate = 0.3;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let client = Client::v1(&nats.url(), "prov").await;
    let ids = fleet.identities();
    // Every node is still discovered, once.
    assert_eq!(client.discover(40, 3 * SEC).await.len(), 20);
    let body =
        choria_rpc_client::mcorpc::encode_request("rpcutil", "inventory", &json!({})).unwrap();
    let ask = |id: &str| {
        let filter = Filter::with_identity(id);
        let body = body.clone();
        let id = id.to_string();
        let client = &client;
        async move {
            client
                .request(Some(&id), "rpcutil", &body, &filter, 2, 2 * SEC)
                .await
        }
    };
    let garbage = ids
        .iter()
        .find(|i| {
            is_affected(FaultKind::Garbage, i, 0.3) && !is_affected(FaultKind::Duplicate, i, 0.3)
        })
        .unwrap();
    let r = ask(garbage).await;
    assert_eq!(r.len(), 1);
    assert!(serde_json::from_slice::<serde_json::Value>(&r[0].body).is_err());
    let dup = ids
        .iter()
        .find(|i| {
            is_affected(FaultKind::Duplicate, i, 0.3) && !is_affected(FaultKind::Garbage, i, 0.3)
        })
        .unwrap();
    let r = ask(dup).await;
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].body, r[1].body);
    let fine = ids
        .iter()
        .find(|i| {
            !is_affected(FaultKind::Duplicate, i, 0.3) && !is_affected(FaultKind::Garbage, i, 0.3)
        })
        .unwrap();
    let r = ask(fine).await;
    assert_eq!(r.len(), 1);
    assert!(serde_json::from_slice::<serde_json::Value>(&r[0].body).is_ok());
    fleet.shutdown().await;
}

#[tokio::test]
async fn with_issuer_check_every_one_server_jwt_in_n_is_verified() {
    // A real server writes its server JWT unchecked; a load test may check a sample. With
    // one in three, forged JWTs are refused at the first and fourth configure and accepted
    // (decoded, unverified) at the second and third.
    let nats = NatsServer::start();
    let org = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32]);
    let other = ed25519_dalek::SigningKey::from_bytes(&[2u8; 32]);
    let mut cfg = common::config(&nats.url(), 4);
    cfg.issuer_public = Some(
        crypto::verifier_from_public_data(&hex::encode(org.verifying_key().as_bytes())).unwrap(),
    );
    cfg.issuer_check_every = 3;
    let fleet = SimFleet::start(cfg).await.unwrap();
    let client = Client::v1(&nats.url(), "prov").await;
    let pk_hex = hex::encode([7u8; 32]);
    let mut outcomes = Vec::new();
    for id in fleet.identities() {
        let forged = chain_server_jwt(&other, &id, &pk_hex);
        let r = client
            .rpc(
                &id,
                "configure",
                json!({"token": TOKEN, "config": "{}", "server_jwt": forged}),
            )
            .await;
        outcomes.push(r.statuscode);
        if r.statuscode == StatusCode::Ok {
            let received = fleet.node_report(&id).unwrap().received.unwrap();
            assert!(received.server_jwt_trust.is_none(), "{id}: not verified");
            assert_eq!(
                received.server_jwt_claims.as_ref().unwrap()["identity"],
                json!(id)
            );
        } else {
            assert!(
                r.statusmsg.starts_with("JWT Setup Failed: "),
                "{}",
                r.statusmsg
            );
        }
    }
    assert_eq!(
        outcomes,
        [
            StatusCode::Aborted,
            StatusCode::Ok,
            StatusCode::Ok,
            StatusCode::Aborted
        ]
    );
    fleet.shutdown().await;
}
