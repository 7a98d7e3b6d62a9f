//! The broker connection end to end, as a Go deployment sets it up: brokers found through SRV
//! records served by a real DNS server (dnsmasq) on loopback, a NATS credentials file against a
//! nats-server in operator (JWT) mode, and a first connection that waits for a broker started
//! after the provisioner (with `/readyz` 503 meanwhile, and SIGTERM ending the wait cleanly).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use choria_fleet_sim::{FleetConfig, Mode, ProvisioningJwt, SimFleet};
use common::*;
use test_support::dns::{DnsServer, SrvRecord};
use test_support::nats::NatsOperator;
use test_support::NatsServer;

const WAIT: Duration = Duration::from_secs(60);

/// A fleet of `nodes` on `url`, signed by `signer`.
fn fleet_config(url: &str, nodes: usize, signer: &Signer) -> FleetConfig {
    let mut c = FleetConfig::new(
        url.to_string(),
        nodes,
        TOKEN,
        ProvisioningJwt::Sign(signer.jwt_signer()),
    );
    c.mode = Mode::Plain;
    c.identity_prefix = "node".into();
    c.domain = "example.net".into();
    c.restart_delay = Duration::from_millis(300);
    c.rsa_keys_pem = Some(test_support::ca::rsa_keys_pem(1).unwrap());
    c
}

/// Start the provisioner (plain mode, the sample helper) in `dir` with the given Choria
/// configuration and `env`.
fn start(dir: &Path, signer: &Signer, choria_cfg: &str, env: &[(&str, String)]) -> Prov {
    let mut p = provisioner("unused", example_helper("helper-plain.py"), signer);
    p.choria_config = Some(choria_cfg.to_string());
    for (k, v) in env {
        p = p.env(k, v.clone());
    }
    start_in(
        dir,
        &p.env("CHORIA_BROKERS", "nats://broker.example.net:4222"),
    )
}

async fn assert_fleet_provisioned(fleet: &SimFleet, n: usize, prov: &Prov) {
    expect_provisioned(fleet, n, WAIT, prov).await;
    prov.assert_provisioned(n as f64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_found_through_srv_records_provision_the_fleet() {
    let nats = NatsServer::start();
    // The first name has no records, the second (Puppet's) points at the broker through two
    // targets: one that is not there (higher priority number, tried second) and the broker.
    let Some(dns) = DnsServer::start_or_skip(
        "brokers_found_through_srv_records_provision_the_fleet",
        &[
            SrvRecord::new(
                "_x-puppet-mcollective._tcp.prov.example.net",
                "localhost",
                nats.port(),
            )
            .prio(1, 10),
            SrvRecord::new(
                "_x-puppet-mcollective._tcp.prov.example.net",
                "localhost",
                test_support::free_port(),
            )
            .prio(50, 10),
        ],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let fleet = SimFleet::start(fleet_config(&nats.url(), 5, &signer))
        .await
        .unwrap();
    // No middleware_hosts: as a Puppet-managed choria.cfg usually reads.
    let mut prov = start(
        dir.path(),
        &signer,
        "identity = provisioner1\nplugin.security.provider = file\n",
        &[
            ("CHORIA_SRV_DOMAIN", "prov.example.net".into()),
            ("CHORIA_PROVISIONER_DNS_SERVER", dns.addr()),
        ],
    );
    prov.wait_ready().await;
    assert_fleet_provisioned(&fleet, 5, &prov).await;
    let out = prov.output();
    assert!(
        out.contains("from SRV records _x-puppet-mcollective._tcp.prov.example.net"),
        "{out}"
    );
    assert!(
        out.contains(&format!("nats://localhost:{}", nats.port())),
        "{out}"
    );
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_srv_records_the_provisioner_falls_back_to_puppet_4222() {
    let Some(dns) = DnsServer::start_or_skip(
        "without_srv_records_the_provisioner_falls_back_to_puppet_4222",
        &[],
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let mut prov = start(
        dir.path(),
        &signer,
        "identity = provisioner1\nplugin.security.provider = file\nplugin.choria.srv_domain = nothing.example.net\n",
        &[("CHORIA_PROVISIONER_DNS_SERVER", dns.addr())],
    );
    prov.expect_log("Attempting to connect to: nats://puppet:4222", WAIT)
        .await;
    prov.stop_with("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credentials_file_connects_to_an_operator_mode_broker() {
    let broker = NatsOperator::start().unwrap();
    let prov_creds = broker.user_creds("provisioner").unwrap();
    // The simulated fleet takes no credentials file: it joins the account through a leafnode
    // that logs in with a user of its own.
    let leaf = broker
        .start_leaf(&broker.user_creds("fleet").unwrap())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let fleet = SimFleet::start(fleet_config(&leaf.url(), 3, &signer))
        .await
        .unwrap();

    // Without credentials the broker refuses the provisioner: the credentials are what work.
    let anonymous = async_nats::connect(broker.url()).await;
    assert!(
        anonymous.is_err(),
        "the operator-mode broker let an anonymous client in"
    );

    let seed_line = std::fs::read_to_string(&prov_creds)
        .unwrap()
        .lines()
        .find(|l| l.starts_with("SU"))
        .unwrap()
        .to_string();
    let mut prov = start(
        dir.path(),
        &signer,
        &format!(
            "identity = provisioner1\nplugin.security.provider = file\n\
             plugin.choria.middleware_hosts = {}\nplugin.nats.credentials = /nonexistent/overridden.creds\n",
            broker.url()
        ),
        // The environment variable wins over the file's setting, as in go-choria.
        &[("MCOLLECTIVE_NATS_CREDENTIALS", prov_creds.display().to_string())],
    );
    prov.wait_ready().await;
    assert_fleet_provisioned(&fleet, 3, &prov).await;
    prov.stop_with("TERM").await;
    let out = prov.output();
    assert!(!out.contains(&seed_line), "the nkey seed was logged");
    assert!(!out.contains("eyJ"), "a JWT was logged");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_credentials_file_stops_the_daemon_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let creds = dir.path().join("broken.creds");
    std::fs::write(&creds, "SUAM-not-a-seed-5d1e\n").unwrap();
    let mut prov = start(
        dir.path(),
        &signer,
        &format!(
            "identity = provisioner1\nplugin.security.provider = file\n\
             plugin.choria.middleware_hosts = nats://127.0.0.1:{}\nplugin.nats.credentials = {}\n",
            test_support::free_port(),
            creds.display()
        ),
        &[],
    );
    let st = prov.wait_exit(Duration::from_secs(20)).await;
    assert!(st.is_some_and(|s| !s.success()), "{st:?}");
    let out = prov.output();
    assert!(out.contains("broken.creds"), "{out}");
    assert!(
        !out.contains("5d1e"),
        "the file's contents were shown: {out}"
    );
    assert!(
        !out.contains("Attempting to connect"),
        "settings that never work are not retried: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_connection_waits_for_a_broker_started_later() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let port = test_support::free_port();
    let password = "nats-pw-3c81f0";
    let mut prov = start(
        dir.path(),
        &signer,
        &format!(
            "identity = provisioner1\nplugin.security.provider = file\n\
             plugin.choria.middleware_hosts = nats://127.0.0.1:{port}\n\
             plugin.nats.user = provisioner\nplugin.nats.pass = {password}\n"
        ),
        &[],
    );
    prov.expect_log("Initial connection to the Broker failed on try 2", WAIT)
        .await;
    // Alive but not ready while it waits.
    assert_eq!(prov.get("/healthz").map(|r| r.0), Some(200));
    assert_eq!(prov.get("/readyz").map(|r| r.0), Some(503));
    assert!(
        prov.output().contains(&format!(
            "Attempting to connect to: nats://127.0.0.1:{port}"
        )),
        "each try names the brokers: {}",
        prov.output()
    );

    // The broker comes up (with the provisioner's user), then the fleet.
    let broker_dir = dir.path().join("broker");
    let nats = NatsServer::start_in(
        &broker_dir,
        port,
        &format!("authorization {{\n  user: provisioner\n  password: \"{password}\"\n}}\n"),
        false,
    )
    .unwrap();
    prov.wait_ready().await;
    assert_eq!(prov.get("/readyz").map(|r| r.0), Some(200));
    let mut fleet_cfg = fleet_config(&nats.url(), 3, &signer);
    fleet_cfg.nats_user = Some(("provisioner".into(), password.into()));
    let fleet = SimFleet::start(fleet_cfg).await.unwrap();
    assert_fleet_provisioned(&fleet, 3, &prov).await;
    // go-choria counts every failed initial try.
    let failed = prov
        .metric("choria_connector_initial_connection_attempts", None)
        .unwrap_or(0.0);
    assert!(failed >= 2.0, "initial_connection_attempts {failed}");
    assert_eq!(
        prov.metric("choria_connector_initial_connect_time_count", None),
        Some(1.0)
    );
    prov.stop_with("TERM").await;
    assert!(!prov.output().contains(password), "the password was logged");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_waiting_for_the_first_connection_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(dir.path());
    let mut prov = start(
        dir.path(),
        &signer,
        &format!(
            "identity = provisioner1\nplugin.security.provider = file\n\
             plugin.choria.middleware_hosts = nats://127.0.0.1:{}\n",
            test_support::free_port()
        ),
        &[],
    );
    prov.expect_log("Initial connection to the Broker failed on try 1", WAIT)
        .await;
    prov.stop_within("TERM", Duration::from_secs(5)).await;
    prov.expect_output("stopped");
}
