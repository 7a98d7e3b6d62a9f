//! Rotation campaigns against a real broker and the simulated fleet's provisioned servers:
//! `choria-provisioner rotate` sends `choria_provision#reprovision` on the main collective (as
//! an operator with a certificate, over TLS) and follows every selected node back through
//! provisioning; a campaign survives the SIGKILL of its own process and of one of two
//! active-active replicas.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use choria_fleet_sim::Mode;
use common::*;
use test_support::provisioner::Launch;

const WAIT: Duration = Duration::from_secs(120);

/// The broker's TLS (a client certificate required of TLS clients; the fleet and the
/// provisioners connect without TLS) and the operator's main collective configuration.
struct Main {
    broker: String,
    config: PathBuf,
    ca_cert: PathBuf,
    ca_key: PathBuf,
}

impl Main {
    fn new(dir: &Path) -> Main {
        let ca = test_ca(dir);
        let main = ca.main_collective().unwrap();
        let config = dir.join("main.cfg");
        std::fs::write(&config, &main.operator_config).unwrap();
        Main {
            broker: main.broker_tls,
            config,
            ca_cert: ca.cert.clone(),
            ca_key: ca.key.clone(),
        }
    }

    /// The configuration with the broker's address, once it is known.
    fn point_at(&self, port: u16) {
        let mut text = std::fs::read_to_string(&self.config).unwrap();
        text.push_str(&format!(
            "plugin.choria.middleware_hosts = 127.0.0.1:{port}\n"
        ));
        std::fs::write(&self.config, text).unwrap();
    }
}

/// A scratch directory, the operator's files and a broker with their TLS.
fn operator_broker() -> (tempfile::TempDir, Main, Env) {
    let dir = tempfile::tempdir().unwrap();
    let main = Main::new(dir.path());
    let env = Env::with_broker_config(&main.broker);
    main.point_at(env.nats.port());
    (dir, main, env)
}

/// A provisioner signing CSRs with the test CA, with `extra` settings.
fn pki_launch(env: &Env, main: &Main, identity: &str, extra: &str) -> Launch {
    let mut p = env
        .provisioner(example_helper("helper-pki.py"))
        .env("CHORIA_CA_CERT", main.ca_cert.display().to_string())
        .env("CHORIA_CA_KEY", main.ca_key.display().to_string())
        .features(&["jwt", "pki"])
        .yaml(extra);
    p.identity = identity.into();
    p.workers = 8;
    env.prepare(&p)
}

/// [`pki_launch`] writing its decisions to the audit stream.
fn pki_provisioner(env: &Env, main: &Main, identity: &str, extra: &str) -> Launch {
    pki_launch(
        env,
        main,
        identity,
        &format!("audit_stream: PROVISIONER_AUDIT\n{extra}"),
    )
}

fn rotate_cmd(launch: &Launch, main: &Main, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("rotate")
        .args(args)
        .arg("--config")
        .arg(&launch.config)
        .arg("--provisioner-choria-config")
        .arg(&launch.choria_config);
    if !args.contains(&"status") {
        c.arg("--choria-config").arg(&main.config);
    }
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `rotate status --json`, or why it failed (there is no campaign yet).
fn try_status(launch: &Launch, main: &Main) -> Result<serde_json::Value, String> {
    let o = rotate_cmd(launch, main, &["status", "--json"])
        .output()
        .unwrap();
    if !o.status.success() {
        return Err(text(&o));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("{e}: {}", text(&o)))
}

fn status(launch: &Launch, main: &Main) -> serde_json::Value {
    try_status(launch, main).unwrap()
}

/// A fleet of `n` servers started provisioned (certificates from the pool), online on
/// `mcollective`, coming back into provisioning 200 ms after `reprovision`.
async fn online_fleet(env: &Env, n: usize) -> choria_fleet_sim::SimFleet {
    let mut cfg = env.fleet_config(n, Mode::Pki);
    cfg.stay_online = true;
    cfg.preprovisioned = n;
    cfg.reprovision_delay = Some(Duration::from_millis(200));
    cfg.main_collective = Some("mcollective".into());
    env.fleet(cfg).await
}

fn write_ids(dir: &Path, ids: &[String]) -> PathBuf {
    let f = dir.join("rotate.txt");
    std::fs::write(&f, ids.join("\n") + "\n").unwrap();
    f
}

/// Every node named was provisioned again with a certificate it did not have before.
fn assert_rotated(fleet: &choria_fleet_sim::SimFleet, ids: &[String]) {
    for id in ids {
        let r = fleet.node_report(id).unwrap();
        assert!(r.reprovisions >= 1, "{id} was not reprovisioned: {r:?}");
        let first = r.enrollments.first().unwrap();
        let last = r.enrollments.last().unwrap();
        assert!(last.certificate_sha256.is_some(), "{id}: {r:?}");
        assert_ne!(
            first.certificate_sha256, last.certificate_sha256,
            "{id} kept its certificate"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_provisions_every_selected_node_again_and_no_other() {
    let (dir, main, env) = operator_broker();
    let launch = pki_provisioner(&env, &main, "provisioner1", "fleet_control: true\n");
    let mut prov = Prov::launch(&launch);
    prov.wait_ready().await;
    let fleet = online_fleet(&env, 40).await;
    assert!(fleet.wait_for(|s| s.preprovisioned == 40, WAIT).await);
    let mut ids = fleet.identities();
    ids.sort();
    let (chosen, spared) = ids.split_at(30);
    let list = write_ids(dir.path(), chosen);

    let started = Instant::now();
    let o = rotate_cmd(
        &launch,
        &main,
        &[
            "--identities",
            list.to_str().unwrap(),
            "--rate",
            "3000/min",
            "--max-in-flight",
            "10",
        ],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let said = text(&o);
    assert!(o.status.success(), "{said}\n{}", prov.output());
    println!("rotation: 30 of 40 nodes in {:?}", started.elapsed());
    assert!(said.contains("30/30 done, 0 failed"), "{said}");
    // Done when the provisioner has provisioned it; the server restarts a moment later.
    assert!(
        fleet.wait_provisioned(40, WAIT).await,
        "{:?}",
        fleet.stats()
    );
    assert_rotated(&fleet, chosen);
    for id in spared {
        assert_eq!(fleet.node_report(id).unwrap().reprovisions, 0, "{id}");
    }
    let s = status(&launch, &main);
    assert_eq!(s["state"], "completed", "{s}");
    assert_eq!(
        (s["done"].as_u64(), s["failed"].as_u64()),
        (Some(30), Some(0))
    );

    // Another campaign may start once this one is over; a filter selects by discovery.
    let o = rotate_cmd(
        &launch,
        &main,
        &["--filter", "identity=/^node-(3[1-9]|40)[.]/"],
    )
    .output()
    .unwrap();
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(said.contains("10 nodes selected"), "{said}");
    assert!(
        fleet.wait_provisioned(40, WAIT).await,
        "{:?}",
        fleet.stats()
    );
    assert_rotated(&fleet, spared);
    finish(&mut prov, fleet).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_survives_the_kill_of_its_process_and_of_a_replica() {
    const N: usize = 60;
    let (dir, main, env) = operator_broker();
    let aa = "active_active: true\nclaim_lifetime: 10s\n";
    let a = pki_provisioner(&env, &main, "provisioner-a", aa);
    let b = pki_provisioner(&env, &main, "provisioner-b", aa);
    let mut pa = Prov::launch(&a);
    let mut pb = Prov::launch(&b);
    pa.wait_ready().await;
    pb.wait_ready().await;
    // go-choria's provisioning lock lasts two minutes, and a replica killed mid-cycle leaves it
    // on the node it was provisioning; here it lasts five seconds, so the test does not wait
    // out the lock but the claim's expiry and the takeover.
    let mut cfg = env.fleet_config(N, Mode::Pki);
    cfg.stay_online = true;
    cfg.preprovisioned = N;
    cfg.reprovision_delay = Some(Duration::from_millis(200));
    cfg.main_collective = Some("mcollective".into());
    cfg.lock_window = Duration::from_secs(5);
    let fleet = env.fleet(cfg).await;
    assert!(fleet.wait_for(|s| s.preprovisioned == N, WAIT).await);
    let ids = fleet.identities();
    let list = write_ids(dir.path(), &ids);

    // Ten a second: the campaign is under way when its process and replica A are killed.
    let mut campaign = rotate_cmd(
        &a,
        &main,
        &[
            "--identities",
            list.to_str().unwrap(),
            "--rate",
            "10/s",
            "--max-in-flight",
            "8",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    assert!(
        fleet
            .wait_for(|s| s.reprovision_requests >= 15, Duration::from_secs(60))
            .await,
        "{:?}",
        fleet.stats()
    );
    campaign.kill().unwrap();
    campaign.wait().unwrap();
    pa.signal("KILL");
    let killed_at = fleet.stats().reprovision_requests;
    let killed = Instant::now();
    println!("rotation: campaign process and replica A killed after {killed_at} requests");
    let s = status(&b, &main);
    assert_eq!(s["state"], "running", "{s}");

    // From another shell: resume is refused while the dead driver's lease holds, then takes
    // the campaign over with every node where it was.
    let deadline = Instant::now() + Duration::from_secs(60);
    let resumed = loop {
        let child = rotate_cmd(&b, &main, &["resume"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let waiter = tokio::task::spawn_blocking(move || child.wait_with_output());
        let mut ticks = 0;
        while !waiter.is_finished() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            ticks += 1;
            if ticks % 30 == 0 {
                println!(
                    "rotation: {:?} after the kills: {:?}",
                    killed.elapsed(),
                    fleet.stats()
                );
            }
        }
        let o = waiter.await.unwrap().unwrap();
        let said = text(&o);
        if o.status.success() {
            break said;
        }
        assert!(said.contains("heartbeat"), "{said}");
        assert!(Instant::now() < deadline, "never taken over: {said}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    println!(
        "rotation: resumed and completed {:?} after the kills",
        killed.elapsed()
    );
    assert!(
        resumed.contains(&format!("{N}/{N} done, 0 failed")),
        "{resumed}\n{}",
        pb.output()
    );
    assert!(fleet.wait_provisioned(N, WAIT).await, "{:?}", fleet.stats());
    assert_rotated(&fleet, &ids);
    let s = status(&b, &main);
    assert_eq!(s["state"], "completed", "{s}");
    finish(&mut pb, fleet).await;
}

/// A provisioner killed between restarting a node and writing its audit record, while no
/// driver listened for the node's startup event, leaves the campaign no sign that the node is
/// back. Here no audit record is ever written (the replica that provisions the fleet has no
/// audit stream) and the campaign's driver is stopped meanwhile: the resumed driver asks each
/// node it holds `sent`, on its main collective, when it last started, and counts those
/// restarted since they acknowledged done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_back_with_no_record_or_event_seen_are_found_done_by_asking_them() {
    const N: usize = 10;
    let (dir, main, env) = operator_broker();
    // The replica whose files the operator uses makes the audit stream, then stops: nothing
    // provisions the nodes while the campaign sends them reprovision.
    let audited = pki_provisioner(&env, &main, "provisioner-a", "");
    let mut pa = Prov::launch(&audited);
    pa.wait_ready().await;
    pa.stop_with("TERM").await;
    let fleet = online_fleet(&env, N).await;
    assert!(fleet.wait_for(|s| s.preprovisioned == N, WAIT).await);
    let ids = fleet.identities();
    let list = write_ids(dir.path(), &ids);
    let campaign = rotate_cmd(
        &audited,
        &main,
        &[
            "--identities",
            list.to_str().unwrap(),
            "--rate",
            "6000/min",
            "--max-in-flight",
            &N.to_string(),
            "--node-timeout",
            "2m",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = Instant::now() + WAIT;
    // Every node acknowledged and recorded `sent` (the campaign is written once it exists).
    loop {
        let s = try_status(&audited, &main);
        if s.as_ref()
            .is_ok_and(|s| s["in_flight"].as_u64() == Some(N as u64))
        {
            break;
        }
        assert!(Instant::now() < deadline, "{s:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Interrupted, the driver releases its lease; the campaign stays running.
    let pid = campaign.id().to_string();
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let o = tokio::task::spawn_blocking(move || campaign.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(text(&o).contains("0/10 done"), "{}", text(&o));

    // Another replica, without the audit stream, provisions every node; their startup events
    // reach no driver.
    let quiet = pki_launch(&env, &main, "provisioner-b", "");
    let mut pb = Prov::launch(&quiet);
    pb.wait_ready().await;
    assert!(fleet.wait_provisioned(N, WAIT).await, "{:?}", fleet.stats());
    assert_rotated(&fleet, &ids);
    pb.stop_with("TERM").await;

    let started = Instant::now();
    let o = rotate_cmd(&audited, &main, &["resume"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(said.contains("10/10 done, 0 failed"), "{said}");
    println!(
        "rotation: {N} nodes with no record found done in {:?}",
        started.elapsed()
    );
    let s = status(&audited, &main);
    assert_eq!(s["state"], "completed", "{s}");
    fleet.shutdown().await;
}
