//! The cycle under a claim (active-active) against an in-memory claims store: nothing is sent to
//! a node another replica holds, a finished node is marked done, a failed one released, a claim
//! that cannot be kept stops the cycle before `configure`, and a store that does not answer
//! starts nothing. The JetStream store itself is tested on a real cluster in choria-rpc-client's
//! `claims` tests and the fault suite's `aa-*` scenarios.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use provision_core::claims::{ClaimFuture, ClaimOutcome, Claims, Ticket};
use provision_core::helper_protocol::{HelperError, HelperInput, HelperReply};
use provision_core::rpc::{Action, Helper, RpcErrorKind};
use provision_core::{Backoff, ClaimError, Outcome, ProvisionErrorKind, Provisioner};

#[derive(Default)]
struct Store {
    /// identity -> (holder, done)
    held: Mutex<std::collections::HashMap<String, (String, bool)>>,
    log: Mutex<Vec<String>>,
    keep_fails: bool,
    unreachable: bool,
    keep_every: Duration,
}

fn err(identity: &str, action: &'static str) -> ClaimError {
    ClaimError {
        identity: identity.into(),
        action,
        detail: "no responders".into(),
    }
}

impl Claims for Store {
    fn claim<'a>(&'a self, identity: &'a str) -> ClaimFuture<'a, Result<ClaimOutcome, ClaimError>> {
        Box::pin(async move {
            self.log.lock().unwrap().push(format!("claim {identity}"));
            if self.unreachable {
                return Err(err(identity, "claim"));
            }
            let mut held = self.held.lock().unwrap();
            if let Some((by, done)) = held.get(identity) {
                return Ok(ClaimOutcome::Taken {
                    by: by.clone(),
                    done: *done,
                });
            }
            held.insert(identity.into(), ("me".into(), false));
            Ok(ClaimOutcome::Claimed(Ticket {
                identity: identity.into(),
                key: format!("node.{identity}"),
                revision: 1,
            }))
        })
    }
    fn keep<'a>(&'a self, ticket: &'a mut Ticket) -> ClaimFuture<'a, Result<(), ClaimError>> {
        Box::pin(async move {
            self.log
                .lock()
                .unwrap()
                .push(format!("keep {}", ticket.identity));
            if self.keep_fails {
                return Err(err(&ticket.identity, "keep"));
            }
            ticket.revision += 1;
            Ok(())
        })
    }
    fn done(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>> {
        Box::pin(async move {
            self.log
                .lock()
                .unwrap()
                .push(format!("done {}", ticket.identity));
            self.held
                .lock()
                .unwrap()
                .insert(ticket.identity.clone(), ("me".into(), true));
            Ok(())
        })
    }
    fn release(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>> {
        Box::pin(async move {
            self.log
                .lock()
                .unwrap()
                .push(format!("release {}", ticket.identity));
            self.held.lock().unwrap().remove(&ticket.identity);
            Ok(())
        })
    }
    fn keep_every(&self) -> Duration {
        self.keep_every
    }
}

fn with(
    store: &Arc<Store>,
    node: &FakeNode,
    helper: &FakeHelper,
    obs: &CountingObserver,
) -> Provisioner {
    builder(token(), node, helper, obs)
        .claims(store.clone())
        .build()
}

fn log(store: &Store) -> Vec<String> {
    store.log.lock().unwrap().clone()
}

#[tokio::test]
async fn a_claimed_node_is_provisioned_and_marked_done() {
    let store = Arc::new(Store {
        keep_every: Duration::from_secs(60),
        ..Store::default()
    });
    let (node, helper, obs) = (
        FakeNode::new(),
        FakeHelper::replying(good_reply()),
        CountingObserver::default(),
    );
    let p = with(&store, &node, &helper, &obs);
    assert!(p.claims_nodes());
    assert_eq!(
        p.provision(&mut host()).await.unwrap(),
        Outcome::Provisioned
    );
    assert_eq!(log(&store), ["claim n1.example.net", "done n1.example.net"]);
    assert_eq!(node.count(Action::Configure), 1);
    assert_eq!(helper.runs(), 1);

    // Another attempt, on this replica or another, finds it done and sends nothing.
    let node2 = FakeNode::new();
    let p2 = with(&store, &node2, &helper, &obs);
    assert_eq!(
        p2.provision(&mut host()).await.unwrap(),
        Outcome::ClaimedElsewhere {
            by: "me".into(),
            done: true
        }
    );
    assert!(node2.calls().is_empty(), "{:?}", node2.calls());
    assert_eq!(helper.runs(), 1);
}

#[tokio::test]
async fn a_node_held_elsewhere_is_left_alone() {
    let store = Arc::new(Store {
        keep_every: Duration::from_secs(60),
        ..Store::default()
    });
    store
        .held
        .lock()
        .unwrap()
        .insert("n1.example.net".into(), ("replica-b".into(), false));
    let (node, helper, obs) = (
        FakeNode::new(),
        FakeHelper::replying(good_reply()),
        CountingObserver::default(),
    );
    let out = with(&store, &node, &helper, &obs)
        .provision(&mut host())
        .await
        .unwrap();
    assert_eq!(
        out,
        Outcome::ClaimedElsewhere {
            by: "replica-b".into(),
            done: false
        }
    );
    assert!(node.calls().is_empty());
    assert_eq!(helper.runs(), 0);
}

#[tokio::test]
async fn a_failed_cycle_releases_its_claim() {
    let store = Arc::new(Store {
        keep_every: Duration::from_secs(60),
        ..Store::default()
    });
    let (node, helper, obs) = (
        FakeNode::new(),
        FakeHelper::replying(good_reply()),
        CountingObserver::default(),
    );
    node.fail(Action::Configure, RpcErrorKind::Timeout, 100);
    let e = with(&store, &node, &helper, &obs)
        .provision(&mut host())
        .await
        .unwrap_err();
    assert!(matches!(e.kind, ProvisionErrorKind::Rpc(_)), "{e}");
    assert_eq!(
        log(&store),
        ["claim n1.example.net", "release n1.example.net"]
    );
    assert!(
        store.held.lock().unwrap().is_empty(),
        "the claim was not given back"
    );
}

#[tokio::test]
async fn an_unreachable_store_starts_nothing() {
    let store = Arc::new(Store {
        unreachable: true,
        keep_every: Duration::from_secs(60),
        ..Store::default()
    });
    let (node, helper, obs) = (
        FakeNode::new(),
        FakeHelper::replying(good_reply()),
        CountingObserver::default(),
    );
    let e = with(&store, &node, &helper, &obs)
        .provision(&mut host())
        .await
        .unwrap_err();
    assert!(matches!(e.kind, ProvisionErrorKind::Claim(_)), "{e}");
    assert!(e.to_string().contains("not started"), "{e}");
    assert!(node.calls().is_empty());
    assert_eq!(helper.runs(), 0);
}

/// A helper that takes a while, so the claim is due to be kept while it runs.
#[derive(Clone)]
struct SlowHelper(FakeHelper);

impl Helper for SlowHelper {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.0.run(input).await
    }
}

// On tokio's paused clock, so the count of keeps during the 200 ms helper does not depend on
// how loaded the machine is.
#[tokio::test(start_paused = true)]
async fn a_claim_that_cannot_be_kept_stops_the_cycle_before_configure() {
    for keep_fails in [true, false] {
        let store = Arc::new(Store {
            keep_fails,
            keep_every: Duration::from_millis(20),
            ..Store::default()
        });
        let node = FakeNode::new();
        let helper = SlowHelper(FakeHelper::replying(good_reply()));
        let p = Provisioner::builder(node.clone(), helper.clone())
            .config(token().build().unwrap())
            .keys(test_keys())
            .backoff(Backoff::fixed(vec![Duration::ZERO]))
            .claims(store.clone())
            .build();
        let res = p.provision(&mut host()).await;
        let keeps = log(&store).iter().filter(|l| l.starts_with("keep")).count();
        if keep_fails {
            let e = res.unwrap_err();
            assert!(
                matches!(e.kind, ProvisionErrorKind::ClaimLost("configuration")),
                "{e}"
            );
            assert_eq!(node.count(Action::Configure), 0);
            // A failed keep is tried again every sixth of the period until the last good write
            // is two periods old, then given up: a handful of tries, not one per period for
            // the rest of the 200 ms helper.
            assert!((2..=14).contains(&keeps), "{keeps} keeps");
        } else {
            assert_eq!(res.unwrap(), Outcome::Provisioned);
            assert!(keeps >= 3, "kept {keeps} times during a 200 ms helper");
            assert_eq!(node.count(Action::Configure), 1);
        }
    }
}
