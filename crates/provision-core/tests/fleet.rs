//! The host table, the bounded queue and the worker pool.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use provision_core::helper_protocol::HelperReply;
use provision_core::identity::IdentityRule;
use provision_core::rpc::{Action, RpcErrorKind};
use provision_core::{AddResult, Features, Fleet, Source};
use tokio_util::sync::CancellationToken;

/// A fleet of `node` with the default settings and a helper that approves every node.
fn fleet_of(node: &FakeNode, obs: &CountingObserver) -> std::sync::Arc<Fleet> {
    Fleet::new(provisioner(
        token(),
        node,
        &FakeHelper::replying(good_reply()),
        obs,
    ))
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..20_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(start_paused = true)]
async fn add_deduplicates_within_one_interval_and_counts_sources() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = Fleet::new(provisioner(
        token().interval(Duration::from_secs(60)),
        &node,
        &FakeHelper::replying(good_reply()),
        &obs,
    ));
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
    assert_eq!(fleet.add("a", Source::Event), AddResult::Known);
    assert_eq!(fleet.add("b", Source::Event), AddResult::Queued);
    assert_eq!(obs.0.discovered.load(Ordering::SeqCst), 1);
    assert_eq!(obs.0.event_discovered.load(Ordering::SeqCst), 1);
    // Still waiting after a whole interval: the entry is renewed in place, and not counted
    // again.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Known);
    assert_eq!(obs.0.discovered.load(Ordering::SeqCst), 1);
    assert_eq!(fleet.known(), 2);
    assert_eq!(fleet.queued(), 2);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    wait_for("two nodes provisioned", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 2
    })
    .await;
    // Two nodes, two configures.
    assert_eq!(node.count(Action::Configure), 2);
    assert_eq!(fleet.queued(), 0);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn full_queue_backlogs_discovered_nodes_then_drops_them() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = Fleet::with_capacity(
        provisioner(token(), &node, &FakeHelper::replying(good_reply()), &obs),
        2,
    );
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
    assert_eq!(fleet.add("b", Source::Discovery), AddResult::Queued);
    // Beyond the queue, discovered nodes wait in the backlog, four times the queue at most.
    for n in 0..8 {
        assert_eq!(
            fleet.add(&format!("c{n}"), Source::Discovery),
            AddResult::Backlogged
        );
    }
    assert_eq!(fleet.add("d", Source::Discovery), AddResult::QueueFull);
    assert_eq!(fleet.add("e", Source::Event), AddResult::QueueFull);
    assert!(!fleet.is_known("c0"));
    assert_eq!((fleet.queued(), fleet.backlog()), (2, 8));
    // Every node that answered is counted as discovered, the dropped one too is not.
    assert_eq!(obs.0.discovered.load(Ordering::SeqCst), 10);
    // A new discovery replaces the backlog with what it finds.
    fleet.new_discovery();
    assert_eq!(fleet.backlog(), 0);
    // Room made by removing a node is found again.
    fleet.remove("a");
    assert_eq!(fleet.add("d", Source::Discovery), AddResult::Queued);
}

#[tokio::test(start_paused = true)]
async fn the_backlog_is_provisioned_as_the_queue_drains_without_another_discovery() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = Fleet::with_capacity(
        provisioner(token(), &node, &FakeHelper::replying(good_reply()), &obs),
        3,
    );
    // An announced node that the backlog reaches moves to the discovery lane once.
    assert_eq!(fleet.add("n5", Source::Event), AddResult::Queued);
    for n in 0..12 {
        let r = fleet.add(&format!("n{n}"), Source::Discovery);
        assert!(
            matches!(
                r,
                AddResult::Queued | AddResult::Known | AddResult::Backlogged
            ),
            "{r:?}"
        );
    }
    assert!(fleet.backlog() >= 9, "{}", fleet.backlog());
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    wait_for("twelve nodes provisioned", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 12
    })
    .await;
    // Each node configured once: the announced one was not provisioned twice.
    assert_eq!(node.count(Action::Configure), 12);
    assert_eq!((fleet.queued(), fleet.backlog()), (0, 0));
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn clear_forgets_everything() {
    let node = FakeNode::new();
    let fleet = fleet_of(&node, &CountingObserver::default());
    for n in ["a", "b", "c"] {
        fleet.add(n, Source::Discovery);
    }
    fleet.clear();
    assert_eq!((fleet.known(), fleet.queued()), (0, 0));
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(node.calls().is_empty());
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn workers_provision_every_node_and_hold_it_for_a_minute() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(4, stop.clone()));
    for i in 0..50 {
        fleet.add(&format!("n{i}"), Source::Discovery);
    }
    wait_for("fifty nodes", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 50
    })
    .await;
    assert_eq!(node.count(Action::Configure), 50);
    assert!(obs.0.max_busy.load(Ordering::SeqCst) <= 4);
    assert_eq!(
        fleet.add("n1", Source::Event),
        AddResult::Known,
        "held after success"
    );
    tokio::time::sleep(Duration::from_secs(66)).await;
    assert_eq!(fleet.known(), 0, "holds expire");
    assert_eq!(fleet.add("n1", Source::Event), AddResult::Queued);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_node_found_again_keeps_its_place_and_its_wait_counts_from_then() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let helper = FakeHelper::replying(good_reply());
    let fleet = Fleet::new(provisioner(
        token().interval(Duration::from_secs(60)),
        &node,
        &helper,
        &obs,
    ));
    for id in ["a", "b", "c"] {
        assert_eq!(fleet.add(id, Source::Discovery), AddResult::Queued);
    }
    // The next discovery finds "a" and "c" again; "b" has gone quiet.
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(fleet.add("c", Source::Discovery), AddResult::Known);
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Known);
    assert_eq!(fleet.queued(), 3);
    // Past two intervals since the first discovery: "b", not found since, is dropped as
    // stale; "a" and "c" were found a minute ago and are provisioned in their first order.
    tokio::time::advance(Duration::from_secs(61)).await;
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(1, stop.clone()));
    wait_for("two nodes", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 2
    })
    .await;
    let order: Vec<String> = helper.inputs().into_iter().map(|i| i.identity).collect();
    assert_eq!(order, ["a", "c"]);
    assert_eq!(
        obs.0.provision_errors.load(Ordering::SeqCst),
        1,
        "b was stale"
    );
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn failed_node_is_forgotten_at_once() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = Fleet::new(provisioner(token(), &node, &FakeHelper::failing(), &obs));
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(1, stop.clone()));
    fleet.add("a", Source::Discovery);
    wait_for("the error", || {
        obs.0.provision_errors.load(Ordering::SeqCst) == 1
    })
    .await;
    wait_for("removal", || !fleet.is_known("a")).await;
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn node_locked_by_another_provisioner_is_left_alone_for_the_lock_window() {
    let node = FakeNode::new();
    node.fail(Action::Configure, RpcErrorKind::LockHeld, 2);
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(1, stop.clone()));
    fleet.add("a", Source::Discovery);
    wait_for("lock", || obs.0.lock_held.load(Ordering::SeqCst) == 1).await;
    assert_eq!(obs.0.provision_errors.load(Ordering::SeqCst), 0);
    // Asked once more before the node is left to the other provisioner.
    assert_eq!(node.count(Action::Configure), 2);
    tokio::time::sleep(Duration::from_secs(100)).await;
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Known);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
    wait_for("provisioned", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 1
    })
    .await;
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn upgraded_node_is_provisioned_again_when_it_comes_back() {
    let node = FakeNode::new();
    node.state.lock().unwrap().upgrade_to_version = true;
    let obs = CountingObserver::default();
    let helper = FakeHelper::replying(HelperReply {
        upgrade: "0.30.0".into(),
        ..good_reply()
    });
    let cfg = token()
        .features(Features::NONE.with_upgrades(true))
        .upgrades("https://repo.example.net", false);
    let fleet = Fleet::new(provisioner(cfg, &node, &helper, &obs));
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(1, stop.clone()));
    fleet.add("a", Source::Discovery);
    wait_for("upgrade", || node.count(Action::ReleaseUpdate) == 1).await;
    wait_for("removal", || !fleet.is_known("a")).await;
    assert!(node.configured().is_none());
    // The restarted node announces itself again.
    assert_eq!(fleet.add("a", Source::Event), AddResult::Queued);
    wait_for("configure", || node.configured().is_some()).await;
    assert_eq!(node.count(Action::ReleaseUpdate), 1);
    assert_eq!(helper.runs(), 2);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_workers_mid_cycle() {
    let node = FakeNode::new();
    node.fail(Action::Inventory, RpcErrorKind::Timeout, 1000);
    let fleet = Fleet::new(
        builder(
            token(),
            &node,
            &FakeHelper::replying(good_reply()),
            &CountingObserver::default(),
        )
        .backoff(provision_core::Backoff::fixed(vec![Duration::from_secs(
            3600,
        )]))
        .build(),
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(3, stop.clone()));
    fleet.add("a", Source::Discovery);
    wait_for("first try", || node.count(Action::Inventory) == 1).await;
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn paused_gauge_follows_the_pause_state() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(1, stop.clone()));
    wait_for("initial state", || obs.0.paused.lock().unwrap().len() == 1).await;
    fleet.provisioner().pause_state().pause();
    wait_for("paused", || obs.0.paused.lock().unwrap().len() == 2).await;
    fleet.provisioner().pause_state().flip();
    wait_for("resumed", || obs.0.paused.lock().unwrap().len() == 3).await;
    assert_eq!(*obs.0.paused.lock().unwrap(), vec![false, true, false]);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn paused_workers_leave_nodes_queued_until_resumed() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    fleet.add("a", Source::Discovery);
    fleet.provisioner().pause_state().pause();
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(node.calls().is_empty());
    assert_eq!(fleet.queued(), 1);
    fleet.provisioner().pause_state().resume();
    wait_for("provisioned", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(obs.0.provision_errors.load(Ordering::SeqCst), 0);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn invalid_identities_are_refused_counted_and_never_queued() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    let long = "a".repeat(5000);
    for bad in [
        ">",
        "*",
        "n1.example.net\nINFO forged line",
        "evil.example.net,DNS:admin.privileged.mcollective,DNS:x",
        long.as_str(),
        "",
    ] {
        assert!(
            matches!(fleet.add(bad, Source::Event), AddResult::Refused(_)),
            "{bad:?}"
        );
        assert!(matches!(
            fleet.add(bad, Source::Discovery),
            AddResult::Refused(_)
        ));
        assert!(!fleet.is_known(bad));
    }
    assert_eq!(fleet.queued(), 0);
    assert_eq!(obs.0.invalid_identities.load(Ordering::SeqCst), 12);
    assert_eq!(obs.0.discovered.load(Ordering::SeqCst), 0);
    assert_eq!(obs.0.event_discovered.load(Ordering::SeqCst), 0);
    // A site pattern replaces the grammar but not the floor.
    let fleet = Fleet::new(provisioner(
        token().identity_rule(IdentityRule::with_pattern("[A-Z]+").unwrap()),
        &node,
        &FakeHelper::replying(good_reply()),
        &obs,
    ));
    assert_eq!(fleet.add("ABC", Source::Event), AddResult::Queued);
    assert!(matches!(
        fleet.add("abc", Source::Event),
        AddResult::Refused(_)
    ));
    assert!(node.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn announced_nodes_hold_half_the_queue_at_most() {
    let node = FakeNode::new();
    let fleet = Fleet::with_capacity(
        provisioner(
            token(),
            &node,
            &FakeHelper::replying(good_reply()),
            &CountingObserver::default(),
        ),
        4,
    );
    assert_eq!(fleet.add("e1", Source::Event), AddResult::Queued);
    assert_eq!(fleet.add("e2", Source::Event), AddResult::Queued);
    assert_eq!(fleet.add("e3", Source::Event), AddResult::QueueFull);
    assert_eq!(fleet.add("d1", Source::Discovery), AddResult::Queued);
    assert_eq!(fleet.add("d2", Source::Discovery), AddResult::Queued);
    assert_eq!(fleet.add("d3", Source::Discovery), AddResult::Backlogged);
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_bogus_announcements_does_not_starve_discovered_nodes() {
    let node = FakeNode::new();
    node.state.lock().unwrap().silent_prefix = Some("bogus".into());
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    for i in 0..500 {
        assert_eq!(
            fleet.add(&format!("bogus-{i}.example.net"), Source::Event),
            AddResult::Queued
        );
    }
    // A real node that announced itself behind the flood, then is found by discovery.
    assert_eq!(
        fleet.add("real-0.example.net", Source::Event),
        AddResult::Queued
    );
    for i in 1..50 {
        fleet.add(&format!("real-{i}.example.net"), Source::Discovery);
    }
    assert_eq!(
        fleet.add("real-0.example.net", Source::Discovery),
        AddResult::Known,
        "moved to the discovery lane"
    );
    let stop = CancellationToken::new();
    let started = tokio::time::Instant::now();
    let run = tokio::spawn(fleet.clone().run(4, stop.clone()));
    wait_for("the real fleet", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 50
    })
    .await;
    let took = started.elapsed();
    let bogus_tried = node.count(Action::Inventory) - 50;
    // Half the workers chew through bogus nodes, each given one short try; the real ones go
    // through the other half without waiting for the flood.
    assert!(took < Duration::from_secs(60), "took {took:?}");
    assert!(bogus_tried < 50, "{bogus_tried} bogus nodes tried first");
    assert!(node.configured().is_some());
    // Bogus nodes fail after one try of at most the first-contact timeout each; once the
    // first have failed, the lane keeps a single worker.
    tokio::time::sleep(provision_core::provision::FIRST_CONTACT_TIMEOUT * 3).await;
    let failed = obs.0.provision_errors.load(Ordering::SeqCst);
    assert!(failed >= 4, "{failed}");
    assert_eq!(fleet.event_workers(), 1);
    assert_eq!(
        node.count(Action::Inventory) - 50,
        failed + 1,
        "one try each, one in flight"
    );
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn nothing_is_queued_while_paused() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    fleet.provisioner().pause_state().pause();
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Paused);
    assert_eq!(fleet.add("b", Source::Event), AddResult::Paused);
    assert_eq!(fleet.add(">", Source::Event), AddResult::Paused);
    assert_eq!(fleet.known(), 0);
    assert_eq!(obs.0.discovered.load(Ordering::SeqCst), 0);
    assert_eq!(obs.0.event_discovered.load(Ordering::SeqCst), 0);
    assert_eq!(obs.0.invalid_identities.load(Ordering::SeqCst), 0);
    fleet.provisioner().pause_state().resume();
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
}

#[tokio::test(start_paused = true)]
async fn node_waiting_more_than_two_intervals_is_skipped_as_it_leaves_the_queue() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = Fleet::new(provisioner(
        token().interval(Duration::from_secs(60)),
        &node,
        &FakeHelper::replying(good_reply()),
        &obs,
    ));
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
    // Paused after queueing: the node waits in the queue.
    fleet.provisioner().pause_state().pause();
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(1, stop.clone()));
    tokio::time::sleep(Duration::from_secs(121)).await;
    fleet.provisioner().pause_state().resume();
    wait_for("the stale node dropped", || {
        obs.0.provision_errors.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(node.calls().is_empty());
    assert!(!fleet.is_known("a"));
    assert_eq!(fleet.queued(), 0);
    // Found again, it is provisioned.
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
    wait_for("provisioned", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 1
    })
    .await;
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn drain_lets_nodes_in_flight_finish_and_starts_no_more() {
    let node = FakeNode::new();
    // Each node's inventory fails once, then the retry comes after 10 s.
    node.fail(Action::Inventory, RpcErrorKind::Timeout, 2);
    let obs = CountingObserver::default();
    let fleet = Fleet::new(
        builder(token(), &node, &FakeHelper::replying(good_reply()), &obs)
            .backoff(provision_core::Backoff::fixed(vec![Duration::from_secs(
                10,
            )]))
            .build(),
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    for id in ["a", "b", "c", "d"] {
        assert_eq!(fleet.add(id, Source::Discovery), AddResult::Queued);
    }
    wait_for("two in flight", || node.count(Action::Inventory) == 2).await;
    assert_eq!(fleet.busy(), 2);
    let abandoned = fleet
        .drain(Duration::from_secs(60), &CancellationToken::new())
        .await;
    assert_eq!(abandoned, 0);
    assert_eq!(obs.0.provisioned.load(Ordering::SeqCst), 2);
    assert_eq!(
        node.count(Action::Configure),
        2,
        "the queued two never start"
    );
    assert_eq!(fleet.busy(), 0);
    assert_eq!(fleet.add("e", Source::Discovery), AddResult::Paused);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn drain_gives_up_after_the_grace_or_when_forced() {
    for forced in [false, true] {
        let node = FakeNode::new();
        node.fail(Action::Inventory, RpcErrorKind::Timeout, 1000);
        let fleet = Fleet::new(
            builder(
                token(),
                &node,
                &FakeHelper::replying(good_reply()),
                &CountingObserver::default(),
            )
            .backoff(provision_core::Backoff::fixed(vec![Duration::from_secs(
                3600,
            )]))
            .build(),
        );
        let stop = CancellationToken::new();
        let run = tokio::spawn(fleet.clone().run(3, stop.clone()));
        fleet.add("a", Source::Discovery);
        wait_for("first try", || node.count(Action::Inventory) == 1).await;
        let force = CancellationToken::new();
        if forced {
            force.cancel();
        }
        let started = tokio::time::Instant::now();
        assert_eq!(fleet.drain(Duration::from_secs(30), &force).await, 1);
        let took = started.elapsed();
        if forced {
            assert!(took < Duration::from_secs(1), "{took:?}");
        } else {
            assert!(took >= Duration::from_secs(30), "{took:?}");
        }
        stop.cancel();
        run.await.unwrap();
        assert_eq!(fleet.busy(), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn an_announced_node_that_fails_is_tried_again_after_a_backoff() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let helper = FakeHelper::failing();
    let fleet = Fleet::new(provisioner(
        token().interval(Duration::from_secs(300)),
        &node,
        &helper,
        &obs,
    ));
    assert_eq!(fleet.add("a", Source::Event), AddResult::Queued);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    wait_for("the first try", || {
        obs.0.provision_errors.load(Ordering::SeqCst) == 1
    })
    .await;
    // Kept, not queued.
    assert!(fleet.is_known("a"));
    assert_eq!(fleet.queued(), 0);
    *helper.reply.lock().unwrap() = Some(good_reply());
    tokio::time::sleep(provision_core::fleet::ANNOUNCED_RETRY / 2).await;
    assert_eq!(helper.runs(), 1, "not before its backoff");
    wait_for("the second try", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(helper.runs(), 2);
    assert!(node.configured().is_some());
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_announced_node_is_forgotten_after_its_tries() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let helper = FakeHelper::failing();
    let fleet = Fleet::new(provisioner(
        token().interval(Duration::from_secs(60)),
        &node,
        &helper,
        &obs,
    ));
    assert_eq!(fleet.add("a", Source::Event), AddResult::Queued);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    let tries = usize::from(provision_core::fleet::ANNOUNCED_TRIES);
    // Backoffs of 30 s, then 60 s (the interval) each, found by a sweep every 5 s.
    tokio::time::sleep(Duration::from_secs(30 + 60 * 3 + 4 * 5 + 10)).await;
    assert_eq!(obs.0.provision_errors.load(Ordering::SeqCst), tries);
    assert!(!fleet.is_known("a"));
    // Nothing more after the last try.
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(helper.runs(), tries);
    assert_eq!(obs.0.event_discovered.load(Ordering::SeqCst), 1);
    stop.cancel();
    run.await.unwrap();
}

/// An announced node fails once and waits for its next try; found again by `again`, it is
/// queued and provisioned at once, well before its backoff is over.
async fn waiting_node_found_again_is_queued_at_once(again: Source) {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let helper = FakeHelper::failing();
    let fleet = Fleet::new(provisioner(
        token().interval(Duration::from_secs(300)),
        &node,
        &helper,
        &obs,
    ));
    assert_eq!(fleet.add("a", Source::Event), AddResult::Queued);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    wait_for("the first try", || {
        obs.0.provision_errors.load(Ordering::SeqCst) == 1
    })
    .await;
    *helper.reply.lock().unwrap() = Some(good_reply());
    let found = tokio::time::Instant::now();
    assert_eq!(fleet.add("a", again), AddResult::Queued);
    wait_for("provisioned", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(found.elapsed() < provision_core::fleet::ANNOUNCED_RETRY);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_node_waiting_for_its_next_try_is_queued_at_once_when_it_announces_itself_again() {
    waiting_node_found_again_is_queued_at_once(Source::Event).await;
}

#[tokio::test(start_paused = true)]
async fn discovery_finding_a_node_waiting_for_its_next_try_queues_it_at_once() {
    waiting_node_found_again_is_queued_at_once(Source::Discovery).await;
}

#[tokio::test(start_paused = true)]
async fn announced_nodes_that_do_not_answer_shrink_their_lane_to_one_worker_and_answers_grow_it_back(
) {
    let node = FakeNode::new();
    node.state.lock().unwrap().silent_prefix = Some("bogus".into());
    node.state.lock().unwrap().unserved_prefix = Some("gone".into());
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    // Names nothing serves fail at once and cost nothing: the lane keeps its workers.
    for i in 0..100 {
        fleet.add(&format!("gone-{i}.example.net"), Source::Event);
    }
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(16, stop.clone()));
    wait_for("the unserved names", || {
        obs.0.provision_errors.load(Ordering::SeqCst) == 100
    })
    .await;
    assert_eq!(fleet.event_workers(), 8);
    let unserved_calls = node.count(Action::Inventory);
    for i in 0..200 {
        fleet.add(&format!("bogus-{i}.example.net"), Source::Event);
    }
    let timeout = provision_core::provision::FIRST_CONTACT_TIMEOUT;
    // Eight first tries at once; after they fail, one at a time.
    tokio::time::sleep(timeout * 4 + Duration::from_millis(1)).await;
    assert_eq!(fleet.event_workers(), 1);
    let tried = node.count(Action::Inventory) - unserved_calls;
    assert!(
        (8..=8 + 4).contains(&tried),
        "{tried} bogus nodes tried in four first-contact timeouts"
    );
    // Real nodes announcing themselves earn the lane its workers back, one per answer.
    fleet.clear();
    for i in 0..20 {
        fleet.add(&format!("real-{i}.example.net"), Source::Event);
    }
    wait_for("the real nodes", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 20
    })
    .await;
    assert_eq!(fleet.event_workers(), 8);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_announced_node_enters_the_node_history_when_started_not_when_queued() {
    let node = FakeNode::new();
    node.state.lock().unwrap().silent_prefix = Some("bogus".into());
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    for i in 0..1000 {
        fleet.add(&format!("bogus-{i}.example.net"), Source::Event);
    }
    fleet.add("real.example.net", Source::Discovery);
    // Queued: only the discovered node is recorded; a flood of names records nothing.
    assert_eq!(
        *obs.0.node_events.lock().unwrap(),
        vec![("real.example.net".to_string(), "queued")]
    );
    assert_eq!(obs.0.event_discovered.load(Ordering::SeqCst), 1000);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    wait_for("a bogus node started", || {
        obs.0
            .node_events
            .lock()
            .unwrap()
            .iter()
            .any(|(id, kind)| id.starts_with("bogus-") && *kind == "started")
    })
    .await;
    let recorded = obs
        .0
        .node_events
        .lock()
        .unwrap()
        .iter()
        .filter(|(id, _)| id.starts_with("bogus-"))
        .count();
    assert!(
        recorded <= 2,
        "{recorded} events of announced nodes before their cycles ended"
    );
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_announced_node_that_never_answers_is_not_kept() {
    let node = FakeNode::new();
    node.state.lock().unwrap().silent_prefix = Some("bogus".into());
    let obs = CountingObserver::default();
    let fleet = fleet_of(&node, &obs);
    assert_eq!(fleet.add("bogus-1", Source::Event), AddResult::Queued);
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(2, stop.clone()));
    wait_for("the try", || {
        obs.0.provision_errors.load(Ordering::SeqCst) == 1
    })
    .await;
    assert!(!fleet.is_known("bogus-1"));
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(obs.0.provision_errors.load(Ordering::SeqCst), 1);
    stop.cancel();
    run.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_node_found_again_in_a_full_queue_is_renewed_not_dropped_as_stale() {
    let node = FakeNode::new();
    let obs = CountingObserver::default();
    let fleet = Fleet::with_capacity(
        provisioner(
            token().interval(Duration::from_secs(60)),
            &node,
            &FakeHelper::replying(good_reply()),
            &obs,
        ),
        2,
    );
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Queued);
    assert_eq!(fleet.add("b", Source::Discovery), AddResult::Queued);
    tokio::time::advance(Duration::from_secs(61)).await;
    // The next discovery finds "a" again: renewed in its place, though the queue is full.
    assert_eq!(fleet.add("a", Source::Discovery), AddResult::Known);
    // Its startup event does not move a discovered node to the event lane.
    assert_eq!(fleet.add("a", Source::Event), AddResult::Known);
    assert_eq!(fleet.queued(), 2);
    tokio::time::advance(Duration::from_secs(61)).await;
    let stop = CancellationToken::new();
    let run = tokio::spawn(fleet.clone().run(1, stop.clone()));
    wait_for("a provisioned and b dropped", || {
        obs.0.provisioned.load(Ordering::SeqCst) == 1 && fleet.queued() == 0
    })
    .await;
    // "b" waited two intervals without being found again: dropped as stale; "a" was not.
    assert_eq!(node.count(Action::Configure), 1);
    assert_eq!(obs.0.provision_errors.load(Ordering::SeqCst), 1);
    stop.cancel();
    run.await.unwrap();
}
