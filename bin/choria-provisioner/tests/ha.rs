//! High availability: provisioners with `leader_election` campaigning on one broker's
//! `CHORIA_LEADER_ELECTION` bucket (here the account's own JetStream, which the daemon falls back
//! to when the `choria.streams` import of a Choria broker does not answer).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use choria_fleet_sim::Mode;
use common::*;

fn role(prov: &Prov) -> String {
    prov.get("/readyz")
        .map(|(_, body)| body.trim().to_string())
        .unwrap_or_default()
}

fn is_leader(prov: &Prov) -> bool {
    role(prov).ends_with("leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_provisions_and_the_standby_takes_over_when_it_dies() {
    let env = Env::new();
    create_election_bucket(&env.url()).await;
    let helper = format!("{} slow 0.3", test_helper("scenario.py"));
    let mut a = env.start(&env.ha_provisioner("provisioner-a", helper.clone()));
    let mut b = env.start(&env.ha_provisioner("provisioner-b", helper));
    a.wait_ready().await;
    b.wait_ready().await;

    let (mut leader, standby) = elect(a, b, is_leader).await;
    assert!(role(&standby).ends_with("standby"), "{}", role(&standby));
    assert_eq!(standby.m("paused"), 1.0);
    assert_eq!(leader.m("paused"), 0.0);

    // The standby takes over after at least the bucket's 5 s TTL.
    let fleet = env.fleet(env.failover_fleet_config(30)).await;

    // The leader takes the nodes from their startup events; the standby ignores them.
    leader
        .expect_metric("provisioned", 5.0, Duration::from_secs(60))
        .await;
    assert_eq!(standby.m("provisioned"), 0.0, "the standby provisioned");
    assert_eq!(standby.m("event_discovered"), 0.0);
    assert!(
        fleet.provisioned() < 30,
        "the fleet was done before the leader could be stopped"
    );

    leader.signal("KILL");
    let killed = Instant::now();
    leader.wait_exit(Duration::from_secs(5)).await.unwrap();
    // The leader keeps working between the metric read above and the kill, so what it did is
    // read from the fleet once it is dead and the restarts it asked for have happened. The
    // standby cannot lead before the dead leader's key expires (5 s), so none of these are its.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let done_by_leader = fleet.provisioned();
    assert!(
        (5..30).contains(&done_by_leader),
        "{done_by_leader} provisioned at the kill"
    );

    assert!(
        wait_until(Duration::from_secs(60), || is_leader(&standby)).await,
        "the standby never took over:\n{}",
        standby.output()
    );
    let failover = killed.elapsed();
    println!(
        "failover: the standby led {:.1}s after the leader was killed (bucket TTL 5s)",
        failover.as_secs_f64()
    );

    expect_provisioned(&fleet, 30, Duration::from_secs(90), &standby).await;
    // Every node the dead leader left behind was provisioned by the standby. The fleet counts a
    // node when its restart request arrives, the provisioner once the reply is back, so the
    // metric may trail the fleet by a moment.
    let left = (30 - done_by_leader) as f64;
    assert!(
        standby
            .wait_metric("provisioned", left, Duration::from_secs(10))
            .await,
        "the new leader provisioned {} of the {left} nodes left behind",
        standby.m("provisioned")
    );
    // On winning it discovered at once without waiting for its interval.
    assert!(standby.m("discovered") > 0.0);
    assert!(standby.m("discover_cycles") >= 1.0);
    let mut standby = standby;
    finish(&mut standby, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_bucket_the_provisioner_exits_as_the_go_one_does() {
    let env = Env::new();
    let mut prov =
        env.start(&env.ha_provisioner("provisioner-a", example_helper("helper-plain.py")));
    let status = prov
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("still running without a bucket:\n{}", prov.output()));
    assert_eq!(status.code(), Some(1), "{}", prov.output());
    let out = prov.output();
    assert!(
        out.contains("Leader election failed to start") && out.contains("CHORIA_LEADER_ELECTION"),
        "{out}"
    );
    assert!(out.contains("set leader_election_wait: true"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_bucket_created_after_start_is_found() {
    let env = Env::new();
    let mut prov = env
        .start_ready(
            &env.ha_provisioner("provisioner-a", example_helper("helper-plain.py"))
                .yaml("leader_election_wait: true"),
        )
        .await;
    assert!(
        prov.wait_log("provisioning stays paused", Duration::from_secs(20))
            .await,
        "a missing bucket is reported"
    );
    // Not ready, and why: a standby that can never campaign is not half of a working pair.
    let (status, body) = prov.get("/readyz").unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready: connected, standby, leader election cannot campaign: ")
            && body.contains("CHORIA_LEADER_ELECTION"),
        "{body}"
    );
    assert_eq!(prov.m("paused"), 1.0);
    assert_eq!(
        prov.metric("choria_election_leader", None),
        Some(0.0),
        "the election series is there from the start"
    );

    create_election_bucket(&env.url()).await;
    assert!(
        wait_until(Duration::from_secs(45), || is_leader(&prov)).await,
        "never became leader once the bucket existed:\n{}",
        prov.output()
    );
    let fleet = env.fleet(env.fleet_config(5, Mode::Plain)).await;
    expect_provisioned(&fleet, 5, Duration::from_secs(60), &prov).await;
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_key_pauses_and_drops_its_queue() {
    let env = Env::new();
    create_election_bucket(&env.url()).await;
    let mut opts = env.ha_provisioner(
        "provisioner-a",
        format!("{} slow 0.3", test_helper("scenario.py")),
    );
    opts.workers = 1;
    let mut prov = env.start_ready(&opts).await;
    assert!(wait_until(Duration::from_secs(40), || is_leader(&prov)).await);

    let fleet = env.fleet(env.fleet_config(30, Mode::Plain)).await;
    prov.expect_metric("provisioned", 2.0, Duration::from_secs(60))
        .await;
    assert!(prov.m("work_queue_entries") > 0.0, "{}", prov.metrics());

    // Another candidate takes the key: the leader's next update fails and it stands down.
    let kv = election_bucket(&env.url(), None).await;
    kv.put("provisioner", "intruder".into()).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || role(&prov).ends_with("standby")).await,
        "{}",
        prov.output()
    );
    assert_eq!(prov.m("paused"), 1.0);
    assert_eq!(prov.m("work_queue_entries"), 0.0, "the queue was kept");
    assert_eq!(prov.m("waiting_nodes"), 0.0, "the host table was kept");
    let stood_down_at = prov.m("provisioned");
    tokio::time::sleep(Duration::from_secs(1)).await;
    // At most the node whose restart was already under way when the key was lost.
    assert!(prov.m("provisioned") <= stood_down_at + 1.0);
    // Thirty nodes at about 0.4 s each keep the fleet unfinished however slowly the key loss is
    // noticed on a loaded machine.
    assert!(fleet.provisioned() < 30);

    // The intruder's key expires with the bucket's TTL; the provisioner wins again, discovers
    // at once and finishes the fleet.
    assert!(
        wait_until(Duration::from_secs(60), || is_leader(&prov)).await,
        "{}",
        prov.output()
    );
    expect_provisioned(&fleet, 30, Duration::from_secs(90), &prov).await;
    finish(&mut prov, fleet).await;
}

/// A broker laid out like a Choria broker: JetStream lives in the `CHORIA` account and the
/// provisioning account reaches it only through imports under the `choria.streams` prefix.
const CHORIA_LIKE_ACCOUNTS: &str = r#"
accounts {
  CHORIA: {
    jetstream: enabled
    users: [{user: choria, password: "ch0ria-pw"}]
    exports: [
      {service: "$JS.API.>"}
      {service: "$KV.CHORIA_LEADER_ELECTION.>"}
    ]
  }
  PROVISIONING: {
    users: [
      {user: provisioner, password: "pr0v-pw"}
      {user: node, password: "n0de-pw"}
    ]
    imports: [
      {service: {account: CHORIA, subject: "$JS.API.>"}, to: "choria.streams.>"}
      {service: {account: CHORIA, subject: "$KV.CHORIA_LEADER_ELECTION.>"}, to: "choria.streams.$KV.CHORIA_LEADER_ELECTION.>"}
    ]
  }
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_election_works_through_the_choria_streams_import() {
    let env = Env::with_broker_config(CHORIA_LIKE_ACCOUNTS);
    let admin = Some(("choria", "ch0ria-pw"));
    let opts = env
        .ha_provisioner("provisioner-a", example_helper("helper-plain.py"))
        .yaml("broker_provisioning_password: pr0v-pw\nleader_election_wait: true");
    let mut prov = env.start_ready(&opts).await;
    // The import answers that the bucket does not exist yet; once it is created the campaign
    // finds it there.
    prov.expect_log("bucket does not exist", Duration::from_secs(20))
        .await;
    create_election_bucket_as(&env.url(), admin).await;
    assert!(
        wait_until(Duration::from_secs(40), || is_leader(&prov)).await,
        "{}",
        prov.output()
    );
    prov.expect_not_in_output(
        "account's own JetStream",
        "fell back instead of using the import",
    );
    let mut cfg = env.fleet_config(5, Mode::Plain);
    cfg.nats_user = Some(("node".into(), "n0de-pw".into()));
    cfg.token_auth = false;
    let fleet = env.fleet(cfg).await;
    expect_provisioned(&fleet, 5, Duration::from_secs(60), &prov).await;
    // The key is in the CHORIA account's bucket, written through the import.
    let kv = election_bucket(&env.url(), admin).await;
    let holder = kv.get("provisioner").await.unwrap().unwrap();
    assert_eq!(&holder[..], b"provisioner-a");
    finish(&mut prov, fleet).await;
}
