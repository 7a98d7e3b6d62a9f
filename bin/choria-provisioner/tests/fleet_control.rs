//! Fleet control against a real broker: `deny` reaches two active-active replicas within a
//! second and the denied nodes are never provisioned while the rest of the fleet is; `pause`
//! stops a provisioner until `resume`; `dry_run` asks the helper for every node and provisions
//! none; `max_per_minute` is one limit for two replicas.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use choria_fleet_sim::Mode;
use common::*;
use test_support::provisioner::Launch;

fn replica(env: &Env, identity: &str) -> (Launch, Prov) {
    let mut p = env
        .provisioner(test_helper("scenario.py") + " configure")
        .yaml("fleet_control: true\nactive_active: true\nclaim_lifetime: 30s\n");
    p.identity = identity.into();
    p.workers = 4;
    let launch = env.prepare(&p);
    let prov = Prov::launch(&launch);
    (launch, prov)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_identities_are_never_provisioned_by_either_replica() {
    let env = Env::new();
    let (launch, mut a) = replica(&env, "provisioner-a");
    let (_, mut b) = replica(&env, "provisioner-b");
    for p in [&mut a, &mut b] {
        p.wait_ready().await;
        p.expect_log("fleet control: following bucket", Duration::from_secs(30))
            .await;
    }
    let said = control(
        &launch,
        &[
            "deny",
            "add",
            "node-03.example.net",
            "--reason",
            "stolen laptop",
        ],
    );
    assert!(said.contains("Denied node-03.example.net"), "{said}");
    assert!(
        said.contains("reached 2 of 2 replicas (provisioner-a, provisioner-b)"),
        "{said}"
    );
    // From the moment `deny add` has returned, each replica has the entry within a second.
    let added = Instant::now();
    for p in [&mut a, &mut b] {
        p.expect_log(
            "deny list: node-03.example.net denied",
            Duration::from_secs(5),
        )
        .await;
    }
    let seen = added.elapsed();
    println!("fleet control: both replicas had the deny entry {seen:?} after deny add returned");
    assert!(
        seen < Duration::from_secs(1),
        "the entry reached both replicas only after {seen:?}"
    );
    control(
        &launch,
        &[
            "deny",
            "add",
            "/^node-1[0-2][.]/",
            "--reason",
            "lab",
            "--expires",
            "1h",
        ],
    );
    for p in [&mut a, &mut b] {
        p.expect_log(
            "deny list: /^node-1[0-2][.]/ denied",
            Duration::from_secs(5),
        )
        .await;
    }
    let listed = control(&launch, &["deny", "ls"]);
    assert!(
        listed.contains("node-03.example.net") && listed.contains("stolen laptop"),
        "{listed}"
    );

    let fleet = env.fleet(env.fleet_config(20, Mode::Plain)).await;
    assert!(
        fleet.wait_provisioned(16, Duration::from_secs(90)).await,
        "{} provisioned\n{}\n{}",
        fleet.provisioned(),
        a.output(),
        b.output()
    );
    // Give the denied nodes time to be found, refused and found again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let done: Vec<String> = fleet
        .identities()
        .into_iter()
        .filter(|id| actions(&fleet, id).iter().any(|a| a.contains("configure")))
        .collect();
    assert_eq!(fleet.provisioned(), 16, "configured: {done:?}");
    let both = format!("{}{}", a.output(), b.output());
    for id in [
        "node-03.example.net",
        "node-10.example.net",
        "node-11.example.net",
        "node-12.example.net",
    ] {
        let configured = fleet
            .node_report(id)
            .map(|r| format!("{r:?}"))
            .unwrap_or_default();
        assert!(
            !actions(&fleet, id).iter().any(|a| a.contains("configure")),
            "{id} was configured: {configured}"
        );
        assert!(
            both.contains(&format!("Could not provision {id}: on the deny list")),
            "{id} not refused:\n{both}"
        );
    }

    // Lifted: the node is provisioned when it is found again (its next startup event).
    control(&launch, &["deny", "rm", "node-03.example.net"]);
    for p in [&mut a, &mut b] {
        p.expect_log(
            "deny list: node-03.example.net removed",
            Duration::from_secs(5),
        )
        .await;
    }
    env.announce(&["node-03.example.net".to_string()]).await;
    expect_provisioned(&fleet, 17, Duration::from_secs(30), &a).await;
    fleet.shutdown().await;
}

/// With no running provisioner following the bucket (the default, `fleet_control` unset), a
/// change reaches nothing: `deny add`, `pause` and `approve` fail naming the fix, and succeed
/// with `--no-replicas-ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_reaches_no_replica_fails_and_names_the_fix() {
    let env = Env::new();
    let p = env.provisioner(test_helper("scenario.py") + " configure");
    let launch = env.prepare(&p);
    let mut prov = Prov::launch(&launch);
    prov.wait_ready().await;
    let changes: [&[&str]; 3] = [
        &["deny", "add", "node-03.example.net", "--reason", "stolen"],
        &["pause", "--reason", "maintenance"],
        &["approve", "node-04.example.net"],
    ];
    for args in changes {
        let ran = cli_on(args, &launch.config, &launch.choria_config);
        let err = ran.text();
        if args[0] == "approve" {
            // Nothing is pending, so nothing is written: refused before any reach.
            assert!(
                !ran.ok && err.contains("no pending node"),
                "{args:?}: {err}"
            );
            continue;
        }
        assert!(!ran.ok, "{args:?} succeeded reaching nothing: {err}");
        assert!(
            err.contains("no running provisioner follows the fleet control bucket")
                && err.contains("set fleet_control: true")
                && err.contains("--no-replicas-ok"),
            "{args:?}: {err}"
        );
        assert_eq!(
            err.trim().lines().filter(|l| l.contains("error")).count(),
            1,
            "{err}"
        );
        let mut prepared = args.to_vec();
        prepared.push("--no-replicas-ok");
        let said = control(&launch, &prepared);
        assert!(said.contains("No running provisioner follows"), "{said}");
    }
    // The provisioner without fleet_control still provisions the fleet, denied node included:
    // exactly what the failing command said.
    let fleet = env.fleet(env.fleet_config(5, Mode::Plain)).await;
    assert!(
        fleet.wait_provisioned(5, Duration::from_secs(30)).await,
        "{}",
        prov.output()
    );
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_stops_new_work_until_resume() {
    let env = Env::new();
    let p = env
        .provisioner(test_helper("scenario.py") + " configure")
        .yaml("fleet_control: true\n");
    let launch = env.prepare(&p);
    let mut prov = Prov::launch(&launch);
    prov.wait_ready().await;
    prov.expect_log("fleet control: following bucket", Duration::from_secs(30))
        .await;
    let said = control(&launch, &["pause", "--reason", "bad helper release"]);
    assert!(said.contains("Provisioning paused"), "{said}");
    assert!(said.contains("reached 1 of 1 replica ("), "{said}");
    prov.expect_log("Provisioning paused by", Duration::from_secs(5))
        .await;
    assert!(prov.output().contains("bad helper release"));
    let fleet = env.fleet(env.fleet_config(10, Mode::Plain)).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(fleet.provisioned(), 0, "provisioned while paused");
    assert_eq!(prov.m("provisioned"), 0.0);
    assert_eq!(prov.m("paused"), 1.0);

    let said = control(&launch, &["resume"]);
    assert!(said.contains("it was paused by"), "{said}");
    // Discovery runs as soon as the pause is lifted: the whole fleet, well before the next
    // interval.
    assert!(
        fleet.wait_provisioned(10, Duration::from_secs(30)).await,
        "{} provisioned after resume\n{}",
        fleet.provisioned(),
        prov.output()
    );
    assert_eq!(prov.m("paused"), 0.0);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_judges_every_node_and_changes_none() {
    let env = Env::new();
    let log = env.path().join("helper.log");
    let p = env
        .provisioner(test_helper("scenario.py") + " configure")
        .env("HELPER_LOG", log.display().to_string())
        .yaml("dry_run: true\n");
    let prov = env.start_ready(&p).await;
    let fleet = env.fleet(env.fleet_config(6, Mode::Plain)).await;
    prov.expect_output_count(
        "would be configured and restarted",
        6,
        Duration::from_secs(30),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fleet.provisioned(), 0);
    for id in fleet.identities() {
        assert!(
            !actions(&fleet, &id).iter().any(|a| a.contains("configure")),
            "{id} was configured"
        );
    }
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(calls.lines().count(), 6, "{calls}");
    // Judged once: held like a provisioned node, not asked again at every announcement.
    env.announce(&fleet.identities()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(calls.lines().count(), 6, "{calls}");
    fleet.shutdown().await;
}

/// `max_per_minute` is one limit for all replicas: two active-active replicas at 60 a minute
/// (one a second, a burst of one) take about as long for 12 nodes as one replica would, not
/// half; each replica alone would let 120 a minute through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_per_minute_is_shared_by_the_replicas() {
    let env = Env::new();
    let mut replicas = Vec::new();
    for identity in ["provisioner-a", "provisioner-b"] {
        let mut p = env
            .provisioner(test_helper("scenario.py") + " configure")
            .yaml(
            "fleet_control: true\nactive_active: true\nclaim_lifetime: 30s\nmax_per_minute: 60\n",
        );
        p.identity = identity.into();
        let launch = env.prepare(&p);
        let mut prov = Prov::launch(&launch);
        prov.wait_ready().await;
        prov.expect_log("shared by every replica", Duration::from_secs(10))
            .await;
        replicas.push(prov);
    }
    let fleet = env.fleet(env.fleet_config(12, Mode::Plain)).await;
    let started = Instant::now();
    assert!(
        fleet.wait_provisioned(1, Duration::from_secs(30)).await,
        "{}",
        replicas[0].output()
    );
    let first = started.elapsed();
    assert!(
        fleet.wait_provisioned(12, Duration::from_secs(90)).await,
        "{} provisioned\n{}\n{}",
        fleet.provisioned(),
        replicas[0].output(),
        replicas[1].output()
    );
    let spread = started.elapsed() - first;
    println!("max_per_minute 60 on two replicas: 12 nodes, first after {first:?}, the last {spread:?} later");
    // 11 more nodes at one a second, less the burst each replica may hold: at least 8 s.
    // Two separate limits would pass them in about 5 s.
    assert!(
        spread >= Duration::from_secs(8),
        "12 nodes within {spread:?}: the replicas did not share the limit"
    );
    let helped: f64 = replicas.iter().map(|p| p.m("provisioned")).sum();
    assert_eq!(helped, 12.0);
    fleet.shutdown().await;
}
