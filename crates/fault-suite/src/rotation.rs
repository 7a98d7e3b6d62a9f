//! Rotation campaigns at fleet scale: 10,000 simulated servers started provisioned are all sent
//! `choria_provision#reprovision` by `choria-provisioner rotate` and provisioned again by two
//! active-active replicas (the demo helper as a webhook), while the campaign's own process and
//! one replica are SIGKILLed a third of the way through and `rotate resume` takes the campaign
//! over from another process once the dead driver's lease has lapsed.
//!
//! The operator signs its requests (a provisioned simulated server verifies the signature on its
//! main collective): the broker accepts plain connections from the fleet and the replicas and
//! TLS with a client certificate from the operator, whose `main.cfg` uses the file security
//! provider with a certificate from the scenario's CA (as bin/choria-provisioner/tests/rotation.rs).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use test_support::ca::TestCa;
use test_support::provisioner::{Output, ProvisionerProcess};
use test_support::simulator::Simulator;
use test_support::stack::write_run_files;
use test_support::webhook::WebhookPlan;
use test_support::{Mode, NatsServer};

use crate::harness::{identities, wait_for, Env, DOMAIN};

/// The fleet: every node starts provisioned and is rotated.
const NODES: usize = 10_000;
/// The claim lifetime of the replicas: short, so the killed replica's claims lapse quickly.
const LIFETIME_SECS: u64 = 9;
/// The campaign's pace: faster than two debug replicas provision, so the nodes in flight set
/// the pace. Requests the killed driver sent but whose acknowledgement it had not read yet are
/// sent again by the resumed one (those nodes are rotated twice), so the window is kept small.
const RATE: &str = "30000/min";
const IN_FLIGHT: &str = "300";

/// The broker's TLS block and the operator's main collective configuration without the
/// broker's address (added once the broker has started on its port).
fn operator_files(dir: &Path) -> Result<(String, String)> {
    let ca_dir = dir.join("ca");
    std::fs::create_dir_all(&ca_dir)?;
    let main = TestCa::new(&ca_dir)?.main_collective()?;
    Ok((
        format!("max_payload: 4MB\n{}", main.broker_tls),
        main.operator_config,
    ))
}

/// `choria-provisioner rotate ARGS` against `replica`'s files as the operator of `main`.
fn rotate(
    bins: &Path,
    replica: &ProvisionerProcess,
    dir: &Path,
    main: &Path,
    args: &[&str],
) -> Command {
    let mut c = Command::new(bins.join("choria-provisioner"));
    c.arg("rotate")
        .args(args)
        .arg("--config")
        .arg(dir.join(format!("{}.yaml", replica.name)))
        .arg("--provisioner-choria-config")
        .arg(dir.join(format!("{}.cfg", replica.name)))
        .arg("--choria-config")
        .arg(main)
        .stdin(Stdio::null());
    c
}

/// Start `cmd` with its output in `out` (emptied first).
fn spawn_into(cmd: &mut Command, out: &Path) -> Result<Child> {
    let f = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let e = f.try_clone()?;
    cmd.stdout(f)
        .stderr(e)
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))
}

/// Wait up to `timeout` for `child` to exit; its exit status and output (from `out`). Killed
/// when the time is up.
fn finish(child: &mut Child, out: &Path, timeout: Duration) -> Result<(bool, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok((
                st.success(),
                std::fs::read_to_string(out).unwrap_or_default(),
            ));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "still running after {timeout:?}: {}",
                tail(&std::fs::read_to_string(out).unwrap_or_default(), 5)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The number before `label` in the simulator's latest progress line (`..., 120 reprovision
/// requests, 80 provisions`).
fn sim_count(sim: &Simulator, label: &str) -> u64 {
    let text = std::fs::read_to_string(&sim.log).unwrap_or_default();
    text.lines()
        .rev()
        .filter(|l| l.starts_with("fleet-sim: ") && l.contains(" provisioned, "))
        .find_map(|l| count_before(l, label))
        .unwrap_or(0)
}

fn count_before(line: &str, label: &str) -> Option<u64> {
    line.split(", ")
        .find_map(|part| part.strip_suffix(label)?.trim().parse().ok())
}

pub fn rotation_kills(env: &Env, name: &str) -> Result<String> {
    let dir = env.base.join(name);
    std::fs::create_dir_all(&dir)?;
    let (tls, main_cfg) = operator_files(&dir)?;
    let nats = NatsServer::start_in_free_port(&dir, &tls, true)?;
    let port = nats.port();
    let main = dir.join("main.cfg");
    std::fs::write(
        &main,
        format!("{main_cfg}plugin.choria.middleware_hosts = 127.0.0.1:{port}\n"),
    )?;
    let url = format!("nats://127.0.0.1:{port}");
    let files = write_run_files(&dir, &env.bins)?;
    // The demo helper as a webhook: no process per node.
    let plan = WebhookPlan::new(&dir)?;
    let _webhook = plan.start(&env.bins, &files, &url, &dir.join("webhook.log"))?;
    let mut settings = files
        .provisioner(&dir, &url, &plan.url, Mode::Plain)
        .yaml(&plan.extra_yaml())
        .yaml(&format!(
            "active_active: true\nclaim_lifetime: {LIFETIME_SECS}s\naudit_stream: ROTATION_AUDIT\n"
        ));
    settings.workers = 64;
    settings.output = Output::Append;
    let mut replicas = Vec::new();
    for id in ["provisioner-a", "provisioner-b"] {
        let mut p = settings
            .for_identity(id)
            .start(&env.bins.join("choria-provisioner"), &dir)?;
        p.wait_ready(Duration::from_secs(60))?;
        replicas.push(p);
    }

    // Every node started provisioned, online on mcollective, back in provisioning 100 ms after
    // it answers reprovision.
    let mut cmd = Simulator::command(&env.bins);
    cmd.args(["--broker", &url, "--nodes", &NODES.to_string()])
        .args(["--mode", Mode::Plain.name(), "--token", &files.token])
        .args(["--identity-prefix", "n", "--domain", DOMAIN])
        .args(["--restart-delay", "0s", "--progress", "1s"])
        .args(["--stay-online", "--preprovisioned", &NODES.to_string()])
        .args([
            "--main-collective",
            "mcollective",
            "--reprovision-delay",
            "100ms",
        ])
        .arg("--provisioning-signer")
        .arg(&files.signer_seed);
    let sim = Simulator::start(
        &mut cmd,
        &dir.join("report.json"),
        &dir.join("fleet-sim.log"),
    )?;
    wait_for(
        "the fleet to start provisioned",
        Duration::from_secs(120),
        || Ok(sim.provisioned() >= NODES),
    )?;
    let ids = identities("n", NODES);
    let list = dir.join("rotate.txt");
    std::fs::write(&list, ids.join("\n") + "\n")?;

    let started = Instant::now();
    let first_out = dir.join("rotate-1.out");
    let mut campaign = spawn_into(
        &mut rotate(
            &env.bins,
            &replicas[0],
            &dir,
            &main,
            &[
                "--identities",
                list.to_str().context("path")?,
                "--rate",
                RATE,
                "--max-in-flight",
                IN_FLIGHT,
            ],
        ),
        &first_out,
    )?;
    let third = (NODES / 3) as u64;
    let waited = wait_for(
        "a third of the reprovision requests",
        Duration::from_secs(300),
        || {
            for r in &mut replicas {
                r.alive()?;
            }
            if let Some(st) = campaign.try_wait()? {
                bail!(
                    "rotate exited early ({st}): {}",
                    tail(&std::fs::read_to_string(&first_out).unwrap_or_default(), 10)
                );
            }
            Ok(sim_count(&sim, " reprovision requests") >= third)
        },
    );
    if let Err(e) = waited {
        let _ = campaign.kill();
        let _ = campaign.wait();
        return Err(e);
    }
    campaign.kill()?;
    campaign.wait()?;
    replicas[0].signal("KILL");
    // The progress line is a second old at most: read the simulator's count a moment later.
    std::thread::sleep(Duration::from_millis(1100));
    let at_kill = sim_count(&sim, " reprovision requests");
    let killed_after = started.elapsed();
    let survivor = &mut replicas[1];

    // From a new process: refused while the dead driver's lease holds, then driven to the end.
    let resume_out = dir.join("rotate-resume.out");
    let lease_deadline = Instant::now() + Duration::from_secs(90);
    let mut refusals = 0;
    let resumed = loop {
        survivor.alive()?;
        let mut child = spawn_into(
            &mut rotate(&env.bins, survivor, &dir, &main, &["resume"]),
            &resume_out,
        )?;
        let (ok, said) = finish(&mut child, &resume_out, Duration::from_secs(600))?;
        if ok {
            break said;
        }
        ensure!(
            said.contains("heartbeat"),
            "rotate resume failed otherwise than on the lease: {}",
            tail(&said, 10)
        );
        refusals += 1;
        ensure!(
            Instant::now() < lease_deadline,
            "the campaign was never taken over: {}",
            tail(&said, 5)
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    ensure!(
        resumed.contains(&format!("{NODES}/{NODES} done, 0 failed")),
        "the resumed campaign did not end with every node done: {}",
        tail(&resumed, 10)
    );
    let total = started.elapsed();
    ensure!(
        refusals > 0,
        "resume was never refused while the lease held"
    );

    let status_out = rotate(&env.bins, survivor, &dir, &main, &["status", "--json"]).output()?;
    ensure!(
        status_out.status.success(),
        "rotate status: {}",
        String::from_utf8_lossy(&status_out.stderr)
    );
    let status: Value = serde_json::from_slice(&status_out.stdout)?;
    ensure!(status["state"] == "completed", "campaign record: {status}");
    ensure!(
        status["failed"].as_u64() == Some(0)
            && status["done"].as_u64() == Some(NODES as u64)
            && status["total"].as_u64() == Some(NODES as u64),
        "campaign record: {status}"
    );

    // Done counts a node once a replica recorded it provisioned; it restarts a moment later.
    wait_for(
        "the simulator to count every node provisioned again",
        Duration::from_secs(60),
        || Ok(sim_count(&sim, " provisions") >= NODES as u64 && sim.provisioned() >= NODES),
    )?;
    let requests = sim_count(&sim, " reprovision requests");
    let report_file = sim.report.clone();
    let mut sim = sim;
    sim.stop();
    let report: Vec<Value> = serde_json::from_slice(
        &std::fs::read(&report_file).with_context(|| format!("{}", report_file.display()))?,
    )?;
    ensure!(
        report.len() == NODES,
        "the report has {} nodes",
        report.len()
    );
    let mut not_rotated = Vec::new();
    let mut twice = 0;
    for n in &report {
        if n["reprovisions"].as_u64().unwrap_or(0) >= 2 {
            twice += 1;
        }
        let again = n["provisioned"].as_bool() == Some(true)
            && n["reprovisions"].as_u64().unwrap_or(0) >= 1
            && n["provisions"].as_u64().unwrap_or(0) >= 1;
        if !again {
            not_rotated.push(n["identity"].as_str().unwrap_or("?").to_string());
        }
    }
    ensure!(
        not_rotated.is_empty(),
        "{} nodes were not reprovisioned and provisioned again: {:?}",
        not_rotated.len(),
        not_rotated.iter().take(10).collect::<Vec<_>>()
    );
    survivor.stop_cleanly(Duration::from_secs(20))?;
    survivor.ensure_no_panic()?;
    Ok(format!(
        "{NODES} nodes rotated in {:.1}s ({:.0} nodes/min, {} build); rotate and replica A SIGKILLed after {at_kill} reprovision requests ({:.1}s), resume refused {refusals} times while the lease held, then completed with 0 failed; {requests} requests in all ({twice} nodes rotated twice: sent by the killed driver, acknowledgement unread)",
        total.as_secs_f64(),
        NODES as f64 / total.as_secs_f64() * 60.0,
        if env.release { "release" } else { "debug" },
        killed_after.as_secs_f64()
    ))
}

#[cfg(test)]
mod tests {
    use super::count_before;

    #[test]
    fn counts_are_read_from_the_progress_line() {
        let line = "fleet-sim: 3s 9/10 provisioned, 0 configured, 0 broken, 0 shut down, 2 reprovisioned, 5 requests, 4 replies (0 discovery), 0 ignored, 12 events, 3 reprovision requests, 1 provisions";
        assert_eq!(count_before(line, " reprovision requests"), Some(3));
        assert_eq!(count_before(line, " provisions"), Some(1));
        assert_eq!(count_before(line, " reprovisioned"), Some(2));
        assert_eq!(count_before(line, " nothing"), None);
    }
}
