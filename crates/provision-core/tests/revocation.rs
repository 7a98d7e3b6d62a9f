//! The operator's deny list and dry run in the cycle: a denied identity or key never reaches
//! the policy or the helper, a node denied while its helper runs is not configured, and a dry
//! run asks the helper (telling it) and changes nothing.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use provision_core::revocation::key_fingerprints;
use provision_core::rpc::Action;
use provision_core::{Host, Outcome, ProvisionErrorKind, Revocation};
use tokio::time::Instant;

/// Denies the identities and key fingerprints it holds.
#[derive(Default, Clone)]
struct Denied(Arc<Mutex<Vec<String>>>);

impl Revocation for Denied {
    fn denied(&self, identity: &str, keys: &[String]) -> Option<String> {
        let list = self.0.lock().unwrap();
        list.iter()
            .find(|e| *e == identity || keys.contains(e))
            .map(|e| format!("{e} (test)"))
    }
}

/// The fingerprint of the fake node's ed25519 key, as an operator computes it from the key.
fn node_key_fingerprint() -> String {
    use sha2::Digest;
    let pk = ed25519_dalek::SigningKey::from_bytes(&[5u8; 32]).verifying_key();
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(pk.to_bytes()))
    )
}

#[tokio::test]
async fn a_denied_key_never_reaches_the_helper_whatever_the_name() {
    let (node, helper, obs) = fakes();
    let denied = Denied::default();
    denied.0.lock().unwrap().push(node_key_fingerprint());
    let p = builder(ed25519(), &node, &helper, &obs)
        .revocation(denied.clone())
        .build();
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(
        matches!(&err.kind, ProvisionErrorKind::Revoked(w) if w.contains(&node_key_fingerprint())),
        "{err}"
    );
    assert_eq!(helper.runs(), 0);
    assert!(node.configured().is_none());
    assert!(!node.calls().contains(&Action::Configure));
    // The same key under another name is denied too; lifted, the node is provisioned.
    let mut other = Host::new(Arc::from("renamed.example.net"), Instant::now());
    assert!(p.provision(&mut other).await.is_err());
    denied.0.lock().unwrap().clear();
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
}

#[tokio::test]
async fn fingerprints_are_of_the_ed25519_key_and_the_csr_key() {
    let ed = provision_core::helper_protocol::Ed25519Reply {
        public_key: hex::encode(
            ed25519_dalek::SigningKey::from_bytes(&[5u8; 32])
                .verifying_key()
                .to_bytes(),
        ),
        ..Default::default()
    };
    assert_eq!(
        key_fingerprints(None, Some(&ed)),
        vec![node_key_fingerprint()]
    );
    let csr = provision_core::helper_protocol::CsrReply {
        csr: make_csr("a.example.net", &[]),
        ..Default::default()
    };
    let other = provision_core::helper_protocol::CsrReply {
        csr: make_csr("b.example.net", &["b.example.net"]),
        ..Default::default()
    };
    let a = key_fingerprints(Some(&csr), None);
    assert_eq!(a.len(), 1);
    assert!(a[0].starts_with("sha256:") && a[0].len() == 7 + 64);
    // The same key under another name has the same fingerprint.
    assert_eq!(a, key_fingerprints(Some(&other), None));
}

#[tokio::test]
async fn an_identity_denied_while_the_helper_runs_is_not_configured() {
    let (node, helper, obs) = fakes();
    let denied = Denied::default();
    // The helper's run is when the entry arrives.
    let list = denied.0.clone();
    let p = builder(token(), &node, &helper, &obs)
        .revocation(denied)
        .observer(OnHelper(list))
        .build();
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(matches!(err.kind, ProvisionErrorKind::Revoked(_)), "{err}");
    assert_eq!(helper.runs(), 1);
    assert!(node.configured().is_none());
}

/// Adds the node to the deny list when its helper step is reported.
#[derive(Clone)]
struct OnHelper(Arc<Mutex<Vec<String>>>);

impl provision_core::Observer for OnHelper {
    fn node_event(&self, identity: &str, event: &provision_core::NodeEvent<'_>) {
        if let provision_core::NodeEvent::Step { step: "helper", .. } = event {
            self.0.lock().unwrap().push(identity.to_string());
        }
    }
}

#[tokio::test]
async fn a_dry_run_asks_the_helper_and_changes_nothing() {
    let (node, helper, obs) = fakes();
    let p = provisioner(ed25519().dry_run(true), &node, &helper, &obs);
    let out = p.provision(&mut host()).await.unwrap();
    assert_eq!(
        out,
        Outcome::DryRun {
            would: "configure".into()
        }
    );
    assert_eq!(helper.runs(), 1);
    assert!(helper.inputs()[0].dry_run);
    let json = provision_core::helper_protocol::to_go_json_string(&helper.inputs()[0]).unwrap();
    assert!(json.contains("\"dry_run\":true"), "{json}");
    assert!(node.configured().is_none());
    assert!(!node.calls().contains(&Action::Configure));
    assert!(!node.calls().contains(&Action::Restart));
    // Without dry_run the key is not in the helper's input at all (the Go provisioner's bytes).
    let helper = FakeHelper::replying(good_reply());
    let p = provisioner(ed25519(), &node, &helper, &obs);
    p.provision(&mut host()).await.unwrap();
    let json = provision_core::helper_protocol::to_go_json_string(&helper.inputs()[0]).unwrap();
    assert!(!json.contains("dry_run"), "{json}");
}
