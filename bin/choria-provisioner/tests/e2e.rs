//! End to end: a real nats-server, the provisioner binary, real helper processes and a simulated
//! fleet of provisioning-mode servers in this process.
//!
//! The provisioner's discovery interval cannot be below one minute, so no test waits for a
//! second discovery: nodes are found by the discovery at start-up (fleet started first) or by
//! their startup events (provisioner started first). Where a scenario needs "retried in a later
//! cycle", the test re-announces the nodes with startup events, exactly what a server restarting
//! into provisioning mode does, and the same provisioner process takes them again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use choria_fleet_sim::{Mode, Phase};
use common::*;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_mode_provisions_the_fleet_and_metrics_show_the_counts() {
    let env = Env::new();
    let fleet = env.fleet(env.fleet_config(20, Mode::Plain)).await;
    let mut prov = env.start_ready(&env.plain()).await;

    expect_provisioned(&fleet, 20, WAIT, &prov).await;
    for r in fleet.report() {
        let received = r.received.as_ref().expect("configuration received");
        assert_eq!(received.configuration["identity"], r.identity);
        assert_eq!(
            received.configuration["plugin.choria.middleware_hosts"],
            env.url()
        );
        assert!(r.problems.is_empty(), "{}: {:?}", r.identity, r.problems);
    }

    // The counters are bumped when the restart is acknowledged, before the fleet sees the
    // node come back, so they are complete by now.
    let m = prov.metrics();
    let get = |name: &str, label: Option<(&str, &str)>| {
        metric(&m, name, label).unwrap_or_else(|| panic!("{name} {label:?} missing:\n{m}"))
    };
    assert_eq!(get("choria_provisioner_provisioned", None), 20.0);
    assert_eq!(get("choria_provisioner_discovered", None), 20.0);
    assert_eq!(get("choria_provisioner_provision_errors", None), 0.0);
    assert_eq!(get("choria_provisioner_helper_errors", None), 0.0);
    assert_eq!(get("choria_provisioner_helper_time_count", None), 20.0);
    assert!(get("choria_provisioner_discover_cycles", None) >= 1.0);
    assert_eq!(get("choria_provisioner_paused", None), 0.0);
    for rpc in [
        "choria_provision#jwt",
        "rpcutil#inventory",
        "choria_provision#configure",
        "choria_provision#restart",
    ] {
        assert_eq!(
            get("choria_provisioner_rpc_time_count", Some(("rpc", rpc))),
            20.0,
            "{rpc}"
        );
    }
    assert!(
        metric(
            &m,
            "choria_provisioner_rpc_time_count",
            Some(("rpc", "choria_provision#gencsr"))
        )
        .is_none(),
        "no CSR is asked for in plain mode"
    );
    assert!(m.contains("site=\"testsite\""));
    assert_eq!(prov.get("/healthz").unwrap().0, 200);
    let (status, body) = prov.get("/readyz").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("connected") && body.contains("active"),
        "{body}"
    );

    prov.stop_with("TERM").await;
    let out = prov.output();
    assert!(!out.contains('\u{1b}'), "colour codes in redirected output");
    // Debug level, and still no secret: not the token, not a provisioning JWT.
    assert!(out.contains("DEBUG"));
    assert!(!out.contains(TOKEN), "the token was logged");
    assert!(!out.contains("eyJ"), "a JWT was logged");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pki_mode_signs_csrs_and_refuses_denied_names() {
    let env = Env::new();
    let ca = test_ca(env.path());
    let denied = "db1.privileged.example.net".to_string();
    let mut ids: Vec<String> = (1..=5).map(|i| format!("web{i}.example.net")).collect();
    ids.push(denied.clone());
    let mut cfg = env.fleet_config(ids.len(), Mode::Pki);
    cfg.identities = Some(ids.clone());
    let fleet = env.fleet(cfg).await;

    let opts = env
        .pki_provisioner(example_helper("helper-pki.py"), &ca)
        .yaml("cert_deny_list:\n  - \"\\\\.privileged\\\\.example\\\\.net$\"");
    let mut prov = env.start_ready(&opts).await;

    expect_provisioned(&fleet, 5, WAIT, &prov).await;
    prov.expect_metric("provision_errors", 1.0, WAIT).await;
    let ca_pem = std::fs::read_to_string(&ca.cert).unwrap();
    for id in &ids[..5] {
        let r = fleet.node_report(id).unwrap();
        assert!(r.provisioned, "{id}: {:?}", r.problems);
        assert_eq!(r.csr_cn.as_deref(), Some(id.as_str()));
        let rec = r.received.unwrap();
        assert_eq!(rec.certificate_matches_key, Some(true), "{id}");
        assert_eq!(rec.ca, ca_pem);
        assert_eq!(rec.ssldir, "/etc/choria/ssl");
    }
    // The denied node made a CSR and was then left alone: never configured, never restarted,
    // and the helper never saw it.
    let seen = actions(&fleet, &denied);
    assert!(seen.contains(&"gencsr".to_string()), "{seen:?}");
    assert!(!seen.contains(&"configure".to_string()), "{seen:?}");
    assert!(!seen.contains(&"restart".to_string()), "{seen:?}");
    assert_eq!(fleet.phase(&denied), Some(Phase::Provisioning));
    assert_eq!(prov.m("provision_errors"), 1.0);
    assert_eq!(prov.m("helper_time_count"), 5.0);
    assert!(
        prov.output().contains(&denied),
        "the refusal names the node:\n{}",
        prov.output()
    );
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_mode_issues_server_jwts_the_fleet_verifies() {
    let env = Env::new();
    let fleet = env.fleet(env.ed25519_fleet_config(10)).await;
    let opts = env
        .provisioner(example_helper("helper-ed25519.py"))
        .env("CHORIA_ISSUER", env.signer.public_hex.clone())
        .features(&["ed25519"]);
    let mut prov = env.start_ready(&opts).await;

    expect_provisioned(&fleet, 10, WAIT, &prov).await;
    for r in fleet.report() {
        let rec = r.received.as_ref().unwrap();
        assert!(
            rec.server_jwt_trust.is_some(),
            "{}: not verified",
            r.identity
        );
        let claims = rec.server_jwt_claims.as_ref().unwrap();
        assert_eq!(claims["identity"], r.identity.as_str());
        assert_eq!(
            claims["public_key"].as_str(),
            r.ed25519_public_key.as_deref()
        );
        assert_eq!(
            rec.configuration["plugin.security.issuer.choria.public"],
            env.signer.public_hex
        );
    }
    assert_eq!(prov.rpc_count("choria_provision#gen25519"), 10.0);
    prov.stop_with("TERM").await;
    let out = prov.output();
    assert!(
        !out.contains(&env.signer.seed_hex),
        "the signing seed was logged"
    );
    assert!(!out.contains(TOKEN), "the token was logged");
    assert!(!out.contains("eyJ"), "a JWT was logged");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_mode_server_jwts_from_another_issuer_are_refused() {
    // The negative control of the test above: the fleet trusts another issuer, so every
    // configure is refused and no node leaves provisioning mode.
    let env = Env::new();
    let other_dir = env.path().join("other");
    std::fs::create_dir(&other_dir).unwrap();
    let other = Signer::new(&other_dir);
    let mut cfg = env.fleet_config(3, Mode::Ed25519);
    cfg.issuer_public = Some(other.verifier());
    let fleet = env.fleet(cfg).await;
    let opts = env
        .provisioner(example_helper("helper-ed25519.py"))
        .env("CHORIA_ISSUER", env.signer.public_hex.clone())
        .features(&["ed25519"]);
    let mut prov = env.start_ready(&opts).await;
    prov.expect_metric("provision_errors", 3.0, WAIT).await;
    assert_eq!(fleet.stats().configured, 0);
    assert_eq!(prov.m("provisioned"), 0.0);
    prov.expect_output("does not verify");
    finish(&mut prov, fleet).await;
}

fn upgrade_options(env: &Env, version: &str, optional: bool) -> Provisioner {
    env.provisioner(format!("{} upgrade {version}", test_helper("scenario.py")))
        .yaml("upgrades_repository: https://repo.example.net/choria")
        .yaml(&format!("upgrades_optional: {optional}"))
        .features(&["jwt", "upgrades"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_to_a_newer_version_then_provisions() {
    let env = Env::new();
    let mut cfg = env.fleet_config(5, Mode::Plain);
    cfg.upgradable = true;
    let fleet = env.fleet(cfg).await;
    let mut prov = env
        .start_ready(&upgrade_options(&env, "0.31.0", false))
        .await;

    expect_provisioned(&fleet, 5, WAIT, &prov).await;
    for id in fleet.identities() {
        let r = fleet.node_report(&id).unwrap();
        assert_eq!(r.version, "0.31.0", "{id}");
        let seen = actions(&fleet, &id);
        let updates: Vec<usize> = seen
            .iter()
            .enumerate()
            .filter(|(_, a)| *a == "release_update")
            .map(|(i, _)| i)
            .collect();
        assert_eq!(updates.len(), 1, "{id}: {seen:?}");
        let configure = seen.iter().position(|a| a == "configure").unwrap();
        assert!(updates[0] < configure, "{id}: upgraded first: {seen:?}");
        assert_eq!(
            r.restarts, 2,
            "{id}: once after the upgrade, once configured"
        );
    }
    assert_eq!(prov.rpc_count("choria_provision#release_update"), 5.0);
    // The upgraded nodes came back with startup events and were taken from those.
    assert!(prov.m("event_discovered") >= 5.0, "{}", prov.metrics());
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equal_version_is_not_upgraded() {
    let env = Env::new();
    let mut cfg = env.fleet_config(4, Mode::Plain);
    cfg.upgradable = true;
    let fleet = env.fleet(cfg).await;
    let mut prov = env
        .start_ready(&upgrade_options(&env, "0.30.0", false))
        .await;
    expect_provisioned(&fleet, 4, WAIT, &prov).await;
    for id in fleet.identities() {
        let seen = actions(&fleet, &id);
        assert!(!seen.contains(&"release_update".to_string()), "{seen:?}");
        assert_eq!(fleet.node_report(&id).unwrap().version, "0.30.0");
    }
    assert_eq!(prov.rpc_count("choria_provision#release_update"), 0.0);
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_upgrades_let_a_non_upgradable_node_be_provisioned() {
    let env = Env::new();
    let fleet = env.fleet(env.fleet_config(4, Mode::Plain)).await; // not upgradable
    let mut prov = env
        .start_ready(&upgrade_options(&env, "0.31.0", true))
        .await;
    expect_provisioned(&fleet, 4, WAIT, &prov).await;
    for id in fleet.identities() {
        assert!(!actions(&fleet, &id).contains(&"release_update".to_string()));
        assert_eq!(fleet.node_report(&id).unwrap().version, "0.30.0");
    }
    assert_eq!(prov.m("provision_errors"), 0.0);
    assert!(prov.output().contains("does not support upgrades"));
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mandatory_upgrades_leave_a_non_upgradable_node_unconfigured() {
    let env = Env::new();
    let fleet = env.fleet(env.fleet_config(4, Mode::Plain)).await; // not upgradable
    let mut prov = env
        .start_ready(&upgrade_options(&env, "0.31.0", false))
        .await;
    prov.expect_metric("provision_errors", 4.0, WAIT).await;
    assert_eq!(fleet.stats().configured, 0);
    for id in fleet.identities() {
        let seen = actions(&fleet, &id);
        assert!(!seen.contains(&"release_update".to_string()), "{seen:?}");
        assert!(!seen.contains(&"configure".to_string()), "{seen:?}");
    }
    assert_eq!(prov.m("provisioned"), 0.0);
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_nodes_are_not_configured_and_are_taken_again_later() {
    let env = Env::new();
    let once = env.path().join("once");
    std::fs::create_dir(&once).unwrap();
    let log = env.path().join("helper.log");
    let fleet = env.fleet(env.fleet_config(5, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("{} defer", test_helper("scenario.py")))
        .env("HELPER_ONCE_DIR", once.display().to_string())
        .env("HELPER_LOG", log.display().to_string());
    let mut prov = env.start_ready(&opts).await;

    prov.expect_metric("provision_errors", 5.0, WAIT).await;
    assert_eq!(fleet.stats().configured, 0);
    assert_eq!(
        prov.m("helper_errors"),
        0.0,
        "a deferral is not a helper error"
    );
    assert!(prov
        .output()
        .contains("configuration defered: the CMDB does not know"));

    // The next cycle: the nodes announce themselves again and the helper now configures them.
    env.announce(&fleet.identities()).await;
    expect_provisioned(&fleet, 5, WAIT, &prov).await;
    let calls = lines(&log);
    assert_eq!(calls.iter().filter(|l| l.ends_with(" defer")).count(), 5);
    assert_eq!(
        calls.iter().filter(|l| l.ends_with(" configure")).count(),
        5
    );
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_replies_shut_the_node_down() {
    let env = Env::new();
    let fleet = env.fleet(env.fleet_config(5, Mode::Plain)).await;
    let victim = "node-2.example.net";
    let opts = env
        .provisioner(format!("{} shutdown", test_helper("scenario.py")))
        .env("HELPER_ONLY", "node-2.");
    let mut prov = env.start_ready(&opts).await;

    expect_provisioned(&fleet, 4, WAIT, &prov).await;
    assert!(
        wait_until(WAIT, || fleet.phase(victim) == Some(Phase::ShutDown)).await,
        "{:?}",
        fleet.node_report(victim)
    );
    let seen = actions(&fleet, victim);
    assert!(seen.contains(&"shutdown".to_string()), "{seen:?}");
    assert!(!seen.contains(&"configure".to_string()), "{seen:?}");
    assert_eq!(fleet.stats().shut_down, 1);
    assert_eq!(prov.m("helper_shutdown_requests"), 1.0);
    assert_eq!(prov.rpc_count("choria_provision#shutdown"), 1.0);
    assert!(prov.output().contains("is not wanted here"));
    finish(&mut prov, fleet).await;
}

/// A helper that misbehaves once per node: counted as helper errors, nothing configured, and
/// the nodes are provisioned when they are announced again.
async fn failing_helper_is_counted_and_retried(behaviour: &str) {
    let env = Env::new();
    let once = env.path().join("once");
    std::fs::create_dir(&once).unwrap();
    let fleet = env.fleet(env.fleet_config(5, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("{} {behaviour}", test_helper("scenario.py")))
        .env("HELPER_ONCE_DIR", once.display().to_string());
    let mut prov = env.start_ready(&opts).await;

    prov.expect_metric("helper_errors", 5.0, WAIT).await;
    assert_eq!(prov.m("provision_errors"), 5.0);
    assert_eq!(fleet.stats().configured, 0);
    for id in fleet.identities() {
        assert!(!actions(&fleet, &id).contains(&"configure".to_string()));
    }

    env.announce(&fleet.identities()).await;
    expect_provisioned(&fleet, 5, WAIT, &prov).await;
    assert_eq!(prov.m("helper_errors"), 5.0);
    prov.assert_provisioned(5.0).await;
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_exiting_non_zero_is_a_helper_error() {
    failing_helper_is_counted_and_retried("fail").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helper_printing_garbage_is_a_helper_error() {
    failing_helper_is_counted_and_retried("garbage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_helper_is_killed_after_the_timeout() {
    let env = Env::new();
    let pids = env.path().join("pids");
    let fleet = env.fleet(env.fleet_config(3, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("{} hang", test_helper("scenario.py")))
        .env("HELPER_PIDS", pids.display().to_string());
    let started = Instant::now();
    let mut prov = env.start_ready(&opts).await;

    prov.expect_metric("helper_errors", 3.0, Duration::from_secs(40))
        .await;
    // The helper timeout is a fixed 10 seconds.
    assert!(started.elapsed() >= Duration::from_secs(10));
    assert_eq!(fleet.stats().configured, 0);
    assert_eq!(prov.m("provision_errors"), 3.0);
    assert!(prov.output().contains("did not finish within"));
    let pids = lines(&pids);
    assert_eq!(pids.len(), 3);
    for pid in pids {
        let alive = std::process::Command::new("kill")
            .args(["-0", &pid])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(!alive, "helper {pid} still runs after the timeout");
    }
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_announced_by_startup_events_are_taken_without_discovery() {
    let env = Env::new();
    let mut prov = env.start_ready(&env.plain()).await;
    // The start-up discovery found nothing; every node now announces itself.
    prov.expect_metric("discover_cycles", 1.0, WAIT).await;
    let started = Instant::now();
    let fleet = env.fleet(env.fleet_config(20, Mode::Plain)).await;
    expect_provisioned(&fleet, 20, WAIT, &prov).await;
    // Well inside the one-minute interval: no second discovery can have found them.
    assert!(started.elapsed() < Duration::from_secs(55));
    assert_eq!(prov.m("event_discovered"), 20.0);
    assert_eq!(prov.m("discovered"), 0.0);
    assert_eq!(prov.m("discover_cycles"), 1.0);
    prov.assert_provisioned(20.0).await;
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_broker_connection() {
    let mut env = Env::new();
    let mut prov = env.start_ready(&env.plain()).await;
    assert_eq!(prov.get("/readyz").unwrap().0, 200);

    env.nats.stop();
    assert!(
        wait_until(Duration::from_secs(10), || prov
            .get("/readyz")
            .is_some_and(|(s, _)| s == 503))
        .await,
        "/readyz stayed ready without a broker"
    );
    assert_eq!(
        prov.get("/healthz").unwrap().0,
        200,
        "the process is still up"
    );

    env.nats.restart();
    assert!(
        wait_until(Duration::from_secs(40), || prov
            .get("/readyz")
            .is_some_and(|(s, _)| s == 200))
        .await,
        "/readyz not ready after the broker came back:\n{}",
        prov.output()
    );
    prov.stop_with("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_nodes_in_flight_finish() {
    let env = Env::new();
    let log = env.path().join("helper.log");
    let fleet = env.fleet(env.fleet_config(2, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("{} slow 3", test_helper("scenario.py")))
        .env("HELPER_LOG", log.display().to_string());
    let mut prov = env.start_ready(&opts).await;
    // Both nodes are with the helper for three seconds; stop the provisioner meanwhile.
    assert!(wait_until(WAIT, || lines(&log).len() == 2).await);
    prov.stop_with("TERM").await;
    assert_eq!(
        fleet.stats().configured,
        2,
        "in-flight nodes were abandoned:\n{}",
        prov.output()
    );
    assert!(fleet.wait_provisioned(2, Duration::from_secs(10)).await);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_go_to_the_logfile() {
    let env = Env::new();
    let logfile = env.path().join("provisioner.log");
    let mut opts = env.plain().yaml("feature:\n  pki: true");
    opts.logfile = Some(logfile.clone());
    let mut prov = env.start(&opts);
    expect_in_file(
        &logfile,
        "listening for startup events",
        Duration::from_secs(30),
    )
    .await;
    prov.stop_with("TERM").await;
    let text = std::fs::read_to_string(&logfile).unwrap();
    assert!(
        text.contains("Choria Provisioner starting using configuration file"),
        "{text}"
    );
    assert!(
        text.contains("unknown configuration key \\\"feature\\\""),
        "{text}"
    );
    assert!(text.contains("stopped"), "{text}");
    assert!(!text.contains('\u{1b}'), "no colour codes in a file");
    prov.expect_not_in_output(
        "listening for startup events",
        "logs went to standard output too",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_made_by_the_helper_reach_the_node_encrypted() {
    // No CSR from the node: the helper makes the key and certificate, and the provisioner
    // encrypts the key with the key exchange of the `jwt` step. The simulated server decrypts
    // it and counts itself provisioned only when the key matches the certificate.
    let env = Env::new();
    let ca = test_ca(env.path());
    let fleet = env.fleet(env.fleet_config(3, Mode::Pki)).await;
    let opts = env
        .pki_provisioner(test_helper("keyed.py"), &ca)
        .features(&["jwt"]);
    let mut prov = env.start_ready(&opts).await;
    assert!(
        fleet.wait_provisioned(3, WAIT).await,
        "{:?}\n{}",
        fleet.report(),
        prov.output()
    );
    for r in fleet.report() {
        let rec = r.received.unwrap();
        assert!(rec.key_received, "{}", r.identity);
        assert_eq!(rec.certificate_matches_key, Some(true), "{}", r.identity);
        assert!(r.csr_cn.is_none(), "no CSR was asked for");
    }
    // The key never appears in the log, at debug level either.
    assert!(!prov.output().contains("PRIVATE KEY"), "{}", prov.output());
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_events_in_the_legacy_choria_format_are_taken_too() {
    let env = Env::new();
    let mut prov = env.start_ready(&env.plain()).await;
    prov.expect_metric("discover_cycles", 1.0, WAIT).await;
    let mut cfg = env.fleet_config(5, Mode::Plain);
    cfg.legacy_lifecycle = true;
    let fleet = env.fleet(cfg).await;
    expect_provisioned(&fleet, 5, WAIT, &prov).await;
    assert_eq!(prov.m("event_discovered"), 5.0);
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_ends_the_drain_at_once() {
    let env = Env::new();
    let log = env.path().join("helper.log");
    let fleet = env.fleet(env.fleet_config(2, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("{} slow 8", test_helper("scenario.py")))
        .env("HELPER_LOG", log.display().to_string());
    let mut prov = env.start_ready(&opts).await;
    assert!(wait_until(WAIT, || lines(&log).len() == 2).await);
    prov.signal("INT");
    prov.expect_log("shutting down", Duration::from_secs(5))
        .await;
    prov.stop_within("INT", Duration::from_secs(5)).await;
    prov.expect_output("abandoning 2 nodes");
    assert_eq!(fleet.stats().configured, 0);
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provisioning_password_logs_in_as_the_provisioner_user() {
    let env = Env::with_broker_config(
        "authorization {\n  users = [\n    {user: provisioner, password: \"pr0v-pw\"}\n    {user: node, password: \"n0de-pw\"}\n  ]\n}\n",
    );
    let mut cfg = env.fleet_config(3, Mode::Plain);
    cfg.nats_user = Some(("node".into(), "n0de-pw".into()));
    cfg.token_auth = false;
    let fleet = env.fleet(cfg).await;
    let opts = env.plain().yaml("broker_provisioning_password: pr0v-pw");
    let mut prov = env.start_ready(&opts).await;
    expect_provisioned(&fleet, 3, WAIT, &prov).await;
    prov.stop_with("TERM").await;
    assert!(
        !prov.output().contains("pr0v-pw"),
        "the password was logged"
    );
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_fleet_found_by_discovery_and_events_at_once() {
    larger_fleet(None).await;
}

/// The same fleet with the daemon's work spread over two runtime threads (`threads: 2`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_fleet_on_two_runtime_threads() {
    larger_fleet(Some(2)).await;
}

/// The threads of process `pid` named `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(|t| t.ok())
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

async fn larger_fleet(threads: Option<usize>) {
    // Half the fleet is up before the provisioner (found by discovery), half comes up after it
    // (found by events): every node is provisioned exactly once.
    let env = Env::new();
    let mut first = env.fleet_config(100, Mode::Plain);
    first.identity_prefix = "early".into();
    let early = env.fleet(first).await;
    let mut opts = env.provisioner(test_helper("fast.sh"));
    opts.workers = 8;
    opts.loglevel = "info".into();
    if let Some(n) = threads {
        opts = opts.yaml(&format!("threads: {n}"));
    }
    let mut prov = env.start_ready(&opts).await;
    if let Some(n) = threads {
        // The runtime's worker threads carry its name (as do blocking threads, started on
        // demand): with `threads: n` at least n of them are up.
        let named = threads_named(prov.pid(), "provisioner");
        assert!(named >= n, "{named} threads named provisioner");
    }
    let mut second = env.fleet_config(100, Mode::Plain);
    second.identity_prefix = "late".into();
    let late = env.fleet(second).await;
    let started = Instant::now();
    assert!(
        early.wait_provisioned(100, Duration::from_secs(120)).await
            && late.wait_provisioned(100, Duration::from_secs(120)).await,
        "early {} late {}\n{}",
        early.provisioned(),
        late.provisioned(),
        prov.metrics()
    );
    println!(
        "200 nodes provisioned in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    prov.assert_provisioned(200.0).await;
    assert_eq!(prov.rpc_count("choria_provision#configure"), 200.0);
    assert_eq!(prov.m("discovered") + prov.m("event_discovered"), 200.0);
    assert!(prov.m("event_discovered") >= 100.0);
    for r in early.report().into_iter().chain(late.report()) {
        let configures = r.actions.iter().filter(|a| a.action == "configure").count();
        assert_eq!(configures, 1, "{}", r.identity);
    }
    prov.stop_with("TERM").await;
    early.shutdown().await;
    late.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reprovisioned_fleet_is_provisioned_again_with_new_certificates() {
    use choria_rpc_client::protocol::Security;
    use choria_rpc_client::rpc::{RpcClient, RpcOptions};
    const N: usize = 50;
    let env = Env::new();
    let ca = test_ca(env.path());
    let mut cfg = env.fleet_config(N, Mode::Pki);
    cfg.stay_online = true;
    cfg.reprovision_delay = Some(Duration::from_millis(200));
    // The fleet is provisioned already, as it is when a campaign comes long after its
    // enrollment (a node the provisioner has just provisioned is left alone for a minute).
    cfg.preprovisioned = N;
    let fleet = env.fleet(cfg).await;
    let opts = env.pki_provisioner(example_helper("helper-pki.py"), &ca);
    let mut prov = env.start_ready(&opts).await;
    expect_provisioned(&fleet, N, WAIT, &prov).await;

    // An operator on the main collective (go-choria's default with the file provider) finds
    // the fleet and sends every node reprovision.
    let operator = ca.issue("operator.mcollective", &[]).unwrap();
    let security =
        Security::x509_from_files("choria=operator.mcollective", &operator.cert, &operator.key)
            .unwrap();
    let nc = env.client().await;
    let client = RpcClient::new(nc, security, RpcOptions::new("operator", "mcollective"))
        .await
        .unwrap();
    let found = client
        .discover(
            &choria_rpc_client::protocol::Filter::with_agent("choria_provision"),
            Duration::from_secs(5),
            Some(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    assert_eq!(found.len(), N, "{found:?}");
    for id in &found {
        let data = client
            .call(
                id,
                "choria_provision",
                "reprovision",
                &serde_json::json!({"token": TOKEN}),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let msg = data["message"].as_str().unwrap_or_default();
        assert!(msg.starts_with("Restarting after"), "{id}: {msg}");
    }

    // Each node comes back in provisioning mode, announces itself and is provisioned again.
    assert!(
        fleet
            .wait_for(
                |s| s.reprovisioned == N as u64 && s.provisions == N as u64,
                WAIT
            )
            .await,
        "{:?}\n{}",
        fleet.stats(),
        prov.output()
    );
    assert!(fleet.wait_provisioned(N, WAIT).await, "{:?}", fleet.stats());
    for r in fleet.report() {
        assert_eq!(
            (r.provisions, r.reprovisions),
            (1, 1),
            "{}: {:?}",
            r.identity,
            r.problems
        );
        let [a, b] = &r.enrollments[..] else {
            panic!("{}: {:?}", r.identity, r.enrollments);
        };
        // The first enrollment is the simulator's own (a serial, no certificate); the second
        // is a certificate the helper signed.
        assert!(b.certificate_sha256.is_some(), "{}", r.identity);
        assert_ne!(a.certificate_serial, b.certificate_serial, "{}", r.identity);
    }
    finish(&mut prov, fleet).await;
}
