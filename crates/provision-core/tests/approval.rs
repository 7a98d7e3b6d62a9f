//! The approval queue in the cycle: a node that needs an operator's approval is recorded as
//! pending and never reaches the helper; an approval for its identity and key lets it through;
//! an approval for another key does not; a policy's `pending` without a queue is a defer.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use provision_core::admission::DecisionFuture;
use provision_core::helper_protocol::HelperInput;
use provision_core::{
    Admission, Approval, Decision, HoldFuture, Outcome, PendingNode, ProvisionErrorKind,
};

/// An identity and key fingerprints.
type Keyed = (String, Vec<String>);
/// An identity, key fingerprints and why it waits.
type Held = (String, Vec<String>, String);

/// Approves the (identity, keys) pairs it holds; records what it is asked to hold.
#[derive(Default, Clone)]
struct Queue {
    manual: bool,
    approved: Arc<Mutex<Vec<Keyed>>>,
    held: Arc<Mutex<Vec<Held>>>,
}

impl Approval for Queue {
    fn manual(&self) -> bool {
        self.manual
    }
    fn approved(&self, identity: &str, keys: &[String]) -> Option<String> {
        let a = self.approved.lock().unwrap();
        a.iter()
            .any(|(i, k)| i == identity && k == keys)
            .then(|| "ops at noon".to_string())
    }
    fn hold<'a>(&'a self, node: PendingNode<'a>) -> HoldFuture<'a> {
        self.held.lock().unwrap().push((
            node.identity.to_string(),
            node.keys.to_vec(),
            node.reason.to_string(),
        ));
        Box::pin(std::future::ready(Ok(())))
    }
}

struct SaysPending;

impl Admission for SaysPending {
    fn decide<'a>(&'a self, _input: &'a HelperInput) -> DecisionFuture<'a> {
        Box::pin(std::future::ready(Decision::Pending("new rack".into())))
    }
}

#[tokio::test]
async fn a_manual_queue_holds_the_node_until_its_identity_and_key_are_approved() {
    let (node, helper, obs) = fakes();
    let queue = Queue {
        manual: true,
        ..Default::default()
    };
    let p = builder(ed25519(), &node, &helper, &obs)
        .approval(queue.clone())
        .build();
    let out = p.provision(&mut host()).await.unwrap();
    assert!(
        matches!(&out, Outcome::Pending { reason } if reason == "approval: manual"),
        "{out:?}"
    );
    assert_eq!(helper.runs(), 0);
    assert!(node.configured().is_none());
    let held = queue.held.lock().unwrap().clone();
    assert_eq!(held.len(), 1);
    let (id, keys, _) = &held[0];
    assert_eq!(id, "n1.example.net");
    assert_eq!(keys.len(), 1);
    assert!(keys[0].starts_with("sha256:"));

    // Approved for another key: still pending.
    queue
        .approved
        .lock()
        .unwrap()
        .push((id.clone(), vec![format!("sha256:{}", "0".repeat(64))]));
    assert!(matches!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Pending { .. }
    ));
    assert_eq!(helper.runs(), 0);
    // Approved for its key: provisioned.
    queue
        .approved
        .lock()
        .unwrap()
        .push((id.clone(), keys.clone()));
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(helper.runs(), 1);
}

#[tokio::test]
async fn a_policy_pending_waits_in_the_queue_or_is_deferred_without_one() {
    let (node, helper, obs) = fakes();
    let queue = Queue::default();
    let p = builder(ed25519(), &node, &helper, &obs)
        .admission(SaysPending)
        .approval(queue.clone())
        .build();
    let out = p.provision(&mut host()).await.unwrap();
    assert!(
        matches!(&out, Outcome::Pending { reason } if reason == "new rack"),
        "{out:?}"
    );
    assert_eq!(queue.held.lock().unwrap().len(), 1);
    assert_eq!(helper.runs(), 0);

    let p = builder(ed25519(), &node, &helper, &obs)
        .admission(SaysPending)
        .build();
    let err = p.provision(&mut host()).await.unwrap_err();
    assert!(
        matches!(&err.kind, ProvisionErrorKind::Deferred(r) if r == "new rack"),
        "{err}"
    );
    assert_eq!(helper.runs(), 0);
}

#[tokio::test]
async fn an_automatic_queue_lets_nodes_the_policy_allows_through() {
    let (node, helper, obs) = fakes();
    let queue = Queue::default();
    let p = builder(ed25519(), &node, &helper, &obs)
        .approval(queue.clone())
        .build();
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert!(queue.held.lock().unwrap().is_empty());
}
