//! Every branch of the per-node cycle against a scripted node and helper.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use provision_core::helper_protocol::{HelperReply, ServerClaims};
use provision_core::jwt::{self, VerifyingKey};
use provision_core::rpc::{Action, RpcErrorKind};
use provision_core::{Features, Host, Outcome, ProvisionErrorKind};
use tokio::time::Instant;

#[tokio::test]
async fn no_features_fetches_inventory_then_configures_and_restarts() {
    let (node, helper, obs) = fakes();
    let p = provisioner(token(), &node, &helper, &obs);
    let out = p.provision(&mut host()).await.unwrap();
    assert_eq!(out, Outcome::Provisioned);
    assert_eq!(
        node.calls(),
        vec![Action::Inventory, Action::Configure, Action::Restart]
    );
    let input = helper.inputs.lock().unwrap()[0].clone();
    assert!(input.csr.is_none() && input.ed25519_pubkey.is_none() && input.jwt.is_none());
    assert!(input.inventory.contains("\"version\":\"0.29.4\""));
    let c = node.configured().unwrap();
    assert_eq!(c.token, "s3cret");
    assert_eq!(
        c.config,
        r#"{"identity":"n1.example.net","plugin.choria.server.provision":"false"}"#
    );
    assert!(c.key.is_empty() && c.ecdh_public.is_empty() && c.server_jwt.is_empty());
    assert_eq!(obs.0.helper_times.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn ed25519_feature_verifies_jwt_and_nonce_and_issues_a_server_jwt() {
    let (node, helper, obs) = fakes();
    let p = provisioner(ed25519(), &node, &helper, &obs);
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(
        node.calls(),
        vec![
            Action::Jwt,
            Action::Gen25519,
            Action::Inventory,
            Action::Configure,
            Action::Restart
        ]
    );
    let input = helper.inputs.lock().unwrap()[0].clone();
    assert_eq!(input.jwt.as_ref().unwrap().token, "s3cret");
    assert_eq!(input.jwt.as_ref().unwrap().organization_unit, "choria");
    let node_pk = ed25519_dalek::SigningKey::from_bytes(&[5u8; 32]).verifying_key();
    assert_eq!(
        input.ed25519_pubkey.unwrap().public_key,
        hex::encode(node_pk.to_bytes())
    );
    let c = node.configured().unwrap();
    let signer = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]).verifying_key();
    let claims: ServerClaims =
        jwt::verify(&c.server_jwt, &VerifyingKey::Ed25519(signer), now()).unwrap();
    assert_eq!(claims.identity, "n1.example.net");
    assert_eq!(claims.standard.public_key, hex::encode(node_pk.to_bytes()));
    assert_eq!(claims.collectives, vec!["mcollective".to_string()]);
}

#[tokio::test]
async fn jwt_feature_alone_skips_gen25519_and_server_jwt() {
    let (node, helper, obs) = fakes();
    let p = provisioner(jwt(), &node, &helper, &obs);
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(
        node.calls(),
        vec![
            Action::Jwt,
            Action::Inventory,
            Action::Configure,
            Action::Restart
        ]
    );
    assert!(node.configured().unwrap().server_jwt.is_empty());
}

#[tokio::test]
async fn pki_feature_validates_the_csr_and_uses_its_ssldir() {
    let node = FakeNode::new();
    node.state.lock().unwrap().csr = provision_core::helper_protocol::CsrReply {
        csr: make_csr("n1.example.net", &[]),
        public_key: String::new(),
        ssldir: "/etc/choria/ssl".into(),
    };
    let mut reply = good_reply();
    reply.ssldir = "/helper/ssl".into();
    reply.certificate = "-----BEGIN CERTIFICATE-----\n".into();
    let helper = FakeHelper::replying(reply);
    let obs = CountingObserver::default();
    let p = provisioner(
        features(Features::NONE.with_pki(true)),
        &node,
        &helper,
        &obs,
    );
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(
        node.calls(),
        vec![
            Action::Inventory,
            Action::Gencsr,
            Action::Configure,
            Action::Restart
        ]
    );
    assert!(helper.inputs.lock().unwrap()[0].csr.is_some());
    let c = node.configured().unwrap();
    assert_eq!(c.ssldir, "/etc/choria/ssl");
    assert_eq!(c.certificate, "-----BEGIN CERTIFICATE-----\n");
}

#[tokio::test]
async fn helper_ssldir_is_used_without_a_csr() {
    let node = FakeNode::new();
    let mut reply = good_reply();
    reply.ssldir = "/helper/ssl".into();
    let helper = FakeHelper::replying(reply);
    let p = provisioner(token(), &node, &helper, &CountingObserver::default());
    p.provision(&mut host()).await.unwrap();
    assert_eq!(node.configured().unwrap().ssldir, "/helper/ssl");
}

#[tokio::test]
async fn csr_with_wrong_name_or_denied_name_stops_before_the_helper() {
    for (cn, dns, want) in [
        ("other.example.net", vec![], "does not match identity"),
        (
            "n1.example.net",
            vec!["bad.mcollective"],
            "is not the identity n1.example.net",
        ),
        (
            "n1.mcollective",
            vec![],
            "matches denied certificate pattern",
        ),
    ] {
        let node = FakeNode::new();
        node.state.lock().unwrap().csr.csr = make_csr(cn, &dns);
        let helper = FakeHelper::replying(good_reply());
        let p = provisioner(
            features(Features::NONE.with_pki(true)),
            &node,
            &helper,
            &CountingObserver::default(),
        );
        let mut h = if cn == "n1.mcollective" {
            Host::new(cn.into(), tokio::time::Instant::now())
        } else {
            host()
        };
        let err = p.provision(&mut h).await.unwrap_err();
        assert!(matches!(err.kind, ProvisionErrorKind::Csr(_)), "{err}");
        assert!(err.to_string().contains(want), "{err}");
        assert_eq!(helper.runs(), 0);
        assert!(node.configured().is_none());
    }
}

#[tokio::test]
async fn each_rpc_failing_stops_the_cycle_after_its_tries() {
    for action in [
        Action::Jwt,
        Action::Gen25519,
        Action::Inventory,
        Action::Configure,
        Action::Restart,
    ] {
        let node = FakeNode::new();
        node.fail(action, RpcErrorKind::Timeout, 100);
        let helper = FakeHelper::replying(good_reply());
        let obs = CountingObserver::default();
        let p = provisioner(ed25519(), &node, &helper, &obs);
        let err = p.provision(&mut host()).await.unwrap_err();
        match &err.kind {
            ProvisionErrorKind::Rpc(e) => {
                assert_eq!(e.action, action);
                assert_eq!(e.kind, RpcErrorKind::Timeout);
            }
            other => panic!("{action}: unexpected {other}"),
        }
        assert_eq!(node.count(action), action.tries() as usize, "{action}");
        assert_eq!(*obs.0.rpc_errors.lock().unwrap(), vec![action.label()]);
        if action != Action::Restart {
            assert!(node.configured().is_none(), "{action}");
        }
    }
}

#[tokio::test]
async fn gencsr_is_tried_once() {
    let node = FakeNode::new();
    node.fail(Action::Gencsr, RpcErrorKind::Timeout, 1);
    let helper = FakeHelper::replying(good_reply());
    let p = provisioner(
        cfg().features(Features::NONE.with_pki(true)),
        &node,
        &helper,
        &CountingObserver::default(),
    );
    assert!(p.provision(&mut host()).await.is_err());
    assert_eq!(node.count(Action::Gencsr), 1);
}

#[tokio::test]
async fn transient_failures_are_retried() {
    let node = FakeNode::new();
    node.fail(Action::Inventory, RpcErrorKind::Timeout, 4);
    node.fail(
        Action::Configure,
        RpcErrorKind::Aborted {
            code: 1,
            message: "busy".into(),
        },
        2,
    );
    let helper = FakeHelper::replying(good_reply());
    let obs = CountingObserver::default();
    let p = provisioner(token(), &node, &helper, &obs);
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(node.count(Action::Inventory), 5);
    assert_eq!(node.count(Action::Configure), 3);
    assert!(obs.0.rpc_errors.lock().unwrap().is_empty());
}

#[tokio::test]
async fn held_lock_is_asked_again_once_then_the_node_is_left_alone() {
    let node = FakeNode::new();
    node.fail(Action::Jwt, RpcErrorKind::LockHeld, 10);
    let helper = FakeHelper::replying(good_reply());
    let obs = CountingObserver::default();
    let p = provisioner(ed25519(), &node, &helper, &obs);
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::LockHeld {
            action: Action::Jwt
        }
    );
    assert_eq!(node.calls(), vec![Action::Jwt, Action::Jwt]);
    assert!(obs.0.rpc_errors.lock().unwrap().is_empty());
}

#[tokio::test]
async fn invalid_or_expired_provisioning_jwt_is_refused() {
    let other = ed25519_dalek::SigningKey::from_bytes(&[1u8; 32]);
    for (token, want) in [
        (
            provisioning_jwt(&other, now() + 3600, "choria_provisioning"),
            "invalid token signature",
        ),
        (
            provisioning_jwt(&prov_signer(), now() - 5, "choria_provisioning"),
            "expired",
        ),
        (
            provisioning_jwt(&prov_signer(), now() + 3600, "choria_server"),
            "not a provisioning token",
        ),
        (String::new(), "no JWT received"),
    ] {
        let node = FakeNode::new();
        node.state.lock().unwrap().jwt = token;
        let helper = FakeHelper::replying(good_reply());
        let p = provisioner(jwt(), &node, &helper, &CountingObserver::default());
        let err = p.provision(&mut host()).await.unwrap_err();
        assert!(matches!(err.kind, ProvisionErrorKind::Jwt(_)), "{err}");
        assert!(err.to_string().contains(want), "{err}");
        assert_eq!(node.calls(), vec![Action::Jwt]);
        assert_eq!(helper.runs(), 0);
    }
}

#[tokio::test]
async fn bad_nonce_signature_or_short_key_is_refused_without_crashing() {
    for short in [false, true] {
        let node = FakeNode::new();
        {
            let mut s = node.state.lock().unwrap();
            s.bad_nonce = !short;
            s.short_key = short;
        }
        let helper = FakeHelper::replying(good_reply());
        let p = provisioner(ed25519(), &node, &helper, &CountingObserver::default());
        let err = p.provision(&mut host()).await.unwrap_err();
        assert!(matches!(err.kind, ProvisionErrorKind::Ed25519(_)), "{err}");
        assert_eq!(node.calls(), vec![Action::Jwt, Action::Gen25519]);
    }
}

#[tokio::test]
async fn helper_failure_is_counted_and_stops_the_cycle() {
    let node = FakeNode::new();
    let helper = FakeHelper::failing();
    let obs = CountingObserver::default();
    let p = provisioner(token(), &node, &helper, &obs);
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(matches!(err.kind, ProvisionErrorKind::Helper(_)));
    assert_eq!(obs.0.helper_errors.load(Ordering::SeqCst), 1);
    assert_eq!(node.calls(), vec![Action::Inventory]);
}

#[tokio::test]
async fn defer_is_a_soft_failure_without_configure() {
    let node = FakeNode::new();
    let helper = FakeHelper::replying(HelperReply {
        defer: true,
        msg: "not yet".into(),
        ..good_reply()
    });
    let p = provisioner(token(), &node, &helper, &CountingObserver::default());
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(matches!(&err.kind, ProvisionErrorKind::Deferred(m) if m == "not yet"));
    assert_eq!(node.calls(), vec![Action::Inventory]);
}

#[tokio::test]
async fn shutdown_request_shuts_the_node_down() {
    let node = FakeNode::new();
    let helper = FakeHelper::replying(HelperReply {
        shutdown: true,
        ..good_reply()
    });
    let obs = CountingObserver::default();
    let p = provisioner(token(), &node, &helper, &obs);
    assert_eq!(p.provision(&mut host()).await.unwrap(), Outcome::ShutDown);
    assert_eq!(node.calls(), vec![Action::Inventory, Action::Shutdown]);
    assert_eq!(obs.0.helper_shutdowns.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn refused_shutdown_is_only_a_warning_but_a_timeout_is_an_error() {
    let node = FakeNode::new();
    node.fail(
        Action::Shutdown,
        RpcErrorKind::Aborted {
            code: 1,
            message: "no".into(),
        },
        3,
    );
    let helper = FakeHelper::replying(HelperReply {
        shutdown: true,
        ..good_reply()
    });
    let obs = CountingObserver::default();
    let p = provisioner(token(), &node, &helper, &obs);
    assert_eq!(p.provision(&mut host()).await.unwrap(), Outcome::ShutDown);
    assert_eq!(obs.0.helper_shutdowns.load(Ordering::SeqCst), 0);

    let node = FakeNode::new();
    node.fail(Action::Shutdown, RpcErrorKind::Timeout, 3);
    let p = provisioner(token(), &node, &helper, &obs);
    assert!(p.provision(&mut host()).await.is_err());
}

#[tokio::test]
async fn helper_key_is_encrypted_for_the_node() {
    let node = FakeNode::new();
    let der = b"a private key in DER form".to_vec();
    let key_pem = pem::encode(&pem::Pem::new("RSA PRIVATE KEY", der.clone()));
    let helper = FakeHelper::replying(HelperReply {
        key: key_pem,
        ..good_reply()
    });
    let p = provisioner(jwt(), &node, &helper, &CountingObserver::default());
    p.provision(&mut host()).await.unwrap();
    let c = node.configured().unwrap();
    assert!(c.key.contains("Proc-Type: 4,ENCRYPTED"));
    let plain = provision_core::choria_crypto::keyenc::decrypt_private_key(
        &c.key,
        &[9u8; 32],
        &c.ecdh_public,
    )
    .unwrap();
    assert_eq!(plain, der);
}

#[tokio::test]
async fn helper_key_without_the_jwt_feature_fails() {
    let node = FakeNode::new();
    let key_pem = pem::encode(&pem::Pem::new("RSA PRIVATE KEY", vec![1, 2, 3]));
    let helper = FakeHelper::replying(HelperReply {
        key: key_pem,
        ..good_reply()
    });
    let p = provisioner(token(), &node, &helper, &CountingObserver::default());
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(matches!(err.kind, ProvisionErrorKind::KeyEncryption(_)));
    assert!(err
        .to_string()
        .contains("did not start Diffie-Hellman exchange"));
    assert!(node.configured().is_none());
}

#[tokio::test]
async fn empty_configuration_fails_before_sending() {
    let node = FakeNode::new();
    let helper = FakeHelper::replying(HelperReply::default());
    let p = provisioner(token(), &node, &helper, &CountingObserver::default());
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(matches!(err.kind, ProvisionErrorKind::EmptyConfiguration));
    assert_eq!(node.count(Action::Configure), 0);
}

#[tokio::test]
async fn differing_version_is_upgraded_without_configuring() {
    let node = FakeNode::new();
    let helper = FakeHelper::replying(HelperReply {
        upgrade: "0.30.0".into(),
        ..good_reply()
    });
    let p = provisioner(upgrades(), &node, &helper, &CountingObserver::default());
    let out = p.provision(&mut host()).await.unwrap();
    assert_eq!(
        out,
        Outcome::Upgraded {
            from: "0.29.4".into(),
            to: "0.30.0".into()
        }
    );
    assert_eq!(node.calls(), vec![Action::Inventory, Action::ReleaseUpdate]);
    assert_eq!(
        node.state.lock().unwrap().released,
        Some(("https://repo.example.net".into(), "0.30.0".into()))
    );
}

#[tokio::test]
async fn equal_version_is_configured_without_upgrade() {
    let node = FakeNode::new();
    // rpm ordering: leading zeros do not make a different version.
    let helper = FakeHelper::replying(HelperReply {
        upgrade: "0.29.04".into(),
        ..good_reply()
    });
    let p = provisioner(upgrades(), &node, &helper, &CountingObserver::default());
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(node.count(Action::ReleaseUpdate), 0);
}

#[tokio::test]
async fn upgrade_request_is_ignored_without_the_feature() {
    let node = FakeNode::new();
    let helper = FakeHelper::replying(HelperReply {
        upgrade: "0.30.0".into(),
        ..good_reply()
    });
    let p = provisioner(token(), &node, &helper, &CountingObserver::default());
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(node.count(Action::ReleaseUpdate), 0);
}

#[tokio::test]
async fn upgrade_problems_are_fatal_unless_optional() {
    type Setup = fn(&FakeNode);
    let cases: [(&str, Setup, &str); 4] = [
        ("", |_| {}, "upgrades_repository is not configured"),
        (
            "https://repo.example.net",
            |n| n.state.lock().unwrap().inventory.version.clear(),
            "did not receive a version",
        ),
        (
            "https://repo.example.net",
            |n| n.state.lock().unwrap().inventory.upgradable = false,
            "does not support upgrades",
        ),
        (
            "https://repo.example.net",
            |n| n.fail(Action::ReleaseUpdate, RpcErrorKind::Timeout, 3),
            "release_update",
        ),
    ];
    for (repository, setup, want) in cases {
        for optional in [false, true] {
            let node = FakeNode::new();
            setup(&node);
            let helper = FakeHelper::replying(HelperReply {
                upgrade: "0.30.0".into(),
                ..good_reply()
            });
            let config =
                features(Features::NONE.with_upgrades(true)).upgrades(repository, optional);
            let p = provisioner(config, &node, &helper, &CountingObserver::default());
            let res = p.provision(&mut host()).await;
            if optional {
                assert_eq!(res.unwrap(), Outcome::Provisioned, "{want}");
                assert!(node.configured().is_some());
            } else {
                let err = res.unwrap_err();
                assert!(err.to_string().contains(want), "{err}");
                assert!(node.configured().is_none());
            }
        }
    }
}

#[tokio::test]
async fn pause_mid_cycle_stops_before_the_next_step() {
    let (node, helper, obs) = fakes();
    let p = provisioner(token(), &node, &helper, &obs);
    node.state.lock().unwrap().pause_on = Some((Action::Inventory, p.pause_state().clone()));
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(matches!(err.kind, ProvisionErrorKind::Paused(_)), "{err}");
    assert_eq!(node.calls(), vec![Action::Inventory]);
    assert_eq!(helper.runs(), 0);
}

#[tokio::test]
async fn pause_stops_retries() {
    let node = FakeNode::new();
    node.fail(Action::Configure, RpcErrorKind::Timeout, 5);
    let helper = FakeHelper::replying(good_reply());
    let p = provisioner(token(), &node, &helper, &CountingObserver::default());
    node.state.lock().unwrap().pause_on = Some((Action::Configure, p.pause_state().clone()));
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(
        matches!(
            err.kind,
            ProvisionErrorKind::Paused("choria_provision#configure")
        ),
        "{err}"
    );
    assert_eq!(node.count(Action::Configure), 1);
}

#[tokio::test]
async fn paused_provisioner_makes_no_calls() {
    let node = FakeNode::new();
    let helper = FakeHelper::replying(good_reply());
    let p = provisioner(token(), &node, &helper, &CountingObserver::default());
    p.pause_state().pause();
    assert!(p.provision(&mut host()).await.is_err());
    assert!(node.calls().is_empty());
}

#[tokio::test]
async fn the_nonce_comes_from_the_injected_entropy() {
    let node = FakeNode::new();
    let helper = FakeHelper::replying(good_reply());
    let p = builder(ed25519(), &node, &helper, &CountingObserver::default())
        .random(FixedRandom(0x11))
        .build();
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    // 16 bytes of 0x11 as a version 4 UUID without dashes.
    let nonce = "11111111111141119111111111111111";
    assert_eq!(node.state.lock().unwrap().nonces, vec![nonce]);
    // The server JWT's id is a KSUID whose random part is the same bytes.
    let c = node.configured().unwrap();
    let claims: ServerClaims = jwt::decode_unverified(&c.server_jwt).unwrap();
    let at = choria_crypto::ksuid::ksuid_time(&claims.standard.id).unwrap();
    assert_eq!(
        claims.standard.id,
        choria_crypto::ksuid::ksuid_with(at, &[0x11; 16])
    );
}

#[test]
fn backoff_jitter_comes_from_the_injected_entropy() {
    let steps = [Duration::from_millis(500), Duration::from_millis(750)];
    let b = provision_core::Backoff::from_steps(&steps, true);
    // The low end of half to one and a half times the step; the last step repeats.
    assert_eq!(b.delay(1, &FixedRandom(0)), Duration::from_millis(375));
    assert_eq!(b.delay(9, &FixedRandom(0)), Duration::from_millis(375));
    assert_eq!(b.delay(0, &FixedRandom(0)), Duration::from_millis(250));
    let fixed = provision_core::Backoff::from_steps(&steps, false);
    assert_eq!(fixed.delay(1, &FixedRandom(0)), Duration::from_millis(750));
}

#[tokio::test]
async fn second_round_reuses_what_was_fetched() {
    let node = FakeNode::new();
    node.fail(Action::Configure, RpcErrorKind::Timeout, 5);
    let helper = FakeHelper::replying(good_reply());
    let p = provisioner(ed25519(), &node, &helper, &CountingObserver::default());
    let mut h = host();
    assert!(p.provision(&mut h).await.is_err());
    assert_eq!(p.provision(&mut h).await.unwrap(), Outcome::Provisioned);
    assert_eq!(node.count(Action::Jwt), 1);
    assert_eq!(node.count(Action::Gen25519), 1);
    assert_eq!(node.count(Action::Inventory), 1);
}

#[tokio::test]
async fn a_single_lock_held_reply_does_not_park_the_node() {
    let node = FakeNode::new();
    node.fail(Action::Jwt, RpcErrorKind::LockHeld, 1);
    let helper = FakeHelper::replying(good_reply());
    let p = provisioner(ed25519(), &node, &helper, &CountingObserver::default());
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(node.count(Action::Jwt), 2);
}

#[tokio::test]
async fn an_announced_node_that_never_answers_gets_one_try() {
    let node = FakeNode::new();
    node.fail(Action::Jwt, RpcErrorKind::Timeout, 100);
    let helper = FakeHelper::replying(good_reply());
    let obs = CountingObserver::default();
    let p = provisioner(ed25519(), &node, &helper, &obs);
    let mut h = host().found_by(provision_core::Source::Event);
    let err = p.provision(&mut h).await.unwrap_err();
    assert!(err.kind.is_unanswered_first_contact(), "{err}");
    assert_eq!(
        node.count(Action::Jwt),
        1,
        "no retries for a node never heard from"
    );
    assert_eq!(helper.runs(), 0);
    // Once it has answered, the Go retry counts apply again.
    let node = FakeNode::new();
    node.fail(Action::Inventory, RpcErrorKind::Timeout, 2);
    let p = provisioner(ed25519(), &node, &helper, &obs);
    let mut h = host().found_by(provision_core::Source::Event);
    assert_eq!(p.provision(&mut h).await.unwrap(), Outcome::Provisioned);
    assert_eq!(node.count(Action::Inventory), 3);
}

#[tokio::test]
async fn an_invalid_identity_is_never_sent_anything() {
    for bad in [
        ">",
        "*",
        "a\nb",
        "evil.example.net,DNS:admin.privileged.mcollective,DNS:x",
    ] {
        let node = FakeNode::new();
        let helper = FakeHelper::replying(good_reply());
        let p = provisioner(token(), &node, &helper, &CountingObserver::default());
        let mut h = Host::new(bad.into(), tokio::time::Instant::now());
        let err = p.provision(&mut h).await.unwrap_err();
        assert!(matches!(err.kind, ProvisionErrorKind::Identity(_)), "{err}");
        assert!(node.calls().is_empty(), "{bad:?}");
        assert_eq!(helper.runs(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_discovered_node_that_never_answers_does_not_hold_a_worker_for_a_minute() {
    let node = FakeNode::new();
    node.state.lock().unwrap().silent_prefix = Some("n1".into());
    let helper = FakeHelper::replying(good_reply());
    let obs = CountingObserver::default();
    let p = provisioner(ed25519(), &node, &helper, &obs);
    let started = Instant::now();
    let err = p.provision(&mut host()).await.unwrap_err();
    let took = started.elapsed();
    // The Go retry count is kept for a discovered node, but each try waits at most the
    // first-contact limit, not the action's 22 s.
    assert!(
        matches!(&err.kind, ProvisionErrorKind::Rpc(e) if e.kind == RpcErrorKind::Timeout),
        "{err}"
    );
    assert_eq!(node.count(Action::Jwt), Action::Jwt.tries() as usize);
    assert!(took < Duration::from_secs(45), "held a worker {took:?}");
    assert!(took >= provision_core::provision::FIRST_CONTACT_TIMEOUT * 3);
    assert_eq!(helper.runs(), 0);
}
