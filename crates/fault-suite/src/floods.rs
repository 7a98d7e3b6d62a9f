//! Load and floods: discovery and a burst of startup events at once, a burst overflowing the
//! work queue, and 20,000 bogus startup events ahead of a real fleet.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use test_support::metrics::{metric_sum, scrape as scrape_all};

use test_support::simulator::Simulator;

use crate::harness::{setup, wait_for, Env, Run, Setup};

pub fn load(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(
        env,
        name,
        Setup {
            workers: 64,
            ..Setup::default()
        },
    )?;
    // 10,000 nodes with release builds; a debug provisioner manages about 2,500 a minute on a
    // busy 2-core machine, so the default run keeps to 2,000.
    let half = if env.release { 5000 } else { 1000 };
    // Already waiting, silent: only discovery finds these.
    let quiet = run.start_sim(
        "discovered",
        "d",
        half,
        &[
            "--startup-rate".into(),
            "0".into(),
            "--exit-when-done".into(),
        ],
    )?;
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    let p = run.start_provisioner("provisioner")?;
    // These arrive all at once through startup events while the first discovery runs.
    let loud = run.start_sim(
        "events",
        "e",
        half,
        &[
            "--startup-rate".into(),
            "20000".into(),
            "--exit-when-done".into(),
        ],
    )?;
    let t = run.wait_metric(
        p,
        "the whole fleet to be provisioned",
        "choria_provisioner_provisioned",
        (2 * half) as f64,
        Duration::from_secs(300),
    )?;
    let metrics = scrape_all(run.provisioners[p].port);
    let discovered = metric_sum(&metrics, "choria_provisioner_discovered");
    let evented = metric_sum(&metrics, "choria_provisioner_event_discovered");
    let errors = metric_sum(&metrics, "choria_provisioner_provision_errors");
    let mut twice = 0;
    for sim in [quiet, loud] {
        for (id, n) in sim.finish()? {
            ensure!(n.provisioned, "{id} not provisioned: {:?}", n.actions);
            if n.ok_count("configure") > 1 {
                twice += 1;
            }
        }
    }
    ensure!(twice == 0, "{twice} nodes configured twice");
    let full = run
        .log(p)
        .lines()
        .filter(|l| l.contains("work queue failed"))
        .count();
    run.stop_all()?;
    let wall = started.elapsed().max(t);
    Ok(format!(
        "{} nodes provisioned {:.1}s after start ({:.0}/min, debug build unless --release), {discovered} queued by discovery, {evented} by events, {errors} errors, {full} queue-full warnings, each node configured once",
        2 * half,
        wall.as_secs_f64(),
        (2 * half) as f64 / wall.as_secs_f64() * 60.0
    ))
}

/// A burst of startup events larger than the work queue: the overflow is dropped with a warning
/// naming each node and queued again by the next discovery; nothing is lost.
pub fn queue_full(env: &Env, name: &str) -> Result<String> {
    const CAPACITY: usize = 10;
    let mut run = setup(
        env,
        name,
        Setup {
            workers: 2,
            extra_yaml: "work_queue_size: 10\n",
            ..Setup::default()
        },
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 20;
    // Slow replies keep both workers busy while the burst arrives; the first discovery ran
    // before the fleet existed, so only events and the next discovery can find it.
    let flags = vec![
        "--fault-slow".to_string(),
        "1:150ms".to_string(),
        "--startup-rate".to_string(),
        "20000".to_string(),
    ];
    let started = Instant::now();
    let sim = run.start_sim("burst", "n", nodes, &flags)?;
    let mut max_queue = 0.0f64;
    let t = wait_for(
        "the whole fleet, overflow included",
        Duration::from_secs(150),
        || {
            run.alive(p)?;
            let m = scrape_all(run.provisioners[p].port);
            max_queue = max_queue.max(metric_sum(&m, "choria_provisioner_work_queue_entries"));
            Ok(metric_sum(&m, "choria_provisioner_provisioned") >= nodes as f64)
        },
    )?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    let log = run.log(p);
    let dropped: std::collections::BTreeSet<String> = log
        .lines()
        .filter(|l| l.contains("\"level\":\"warning\"") && l.contains("work queue failed"))
        .filter_map(|l| {
            l.split("entries: ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .map(str::to_string)
        })
        .collect();
    ensure!(
        !dropped.is_empty(),
        "the burst never filled the queue (no 'work queue failed' warning)"
    );
    ensure!(
        log.contains(&format!("with {CAPACITY} / {CAPACITY} entries")),
        "the warning does not give the queue's size"
    );
    ensure!(
        max_queue <= CAPACITY as f64,
        "work_queue_entries reached {max_queue} with a capacity of {CAPACITY}"
    );
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} lost: {:?} {:?}", n.actions, n.problems);
        ensure!(
            n.ok_count("configure") == 1,
            "{id} configured {} times",
            n.ok_count("configure")
        );
    }
    for id in &dropped {
        ensure!(
            report.contains_key(id),
            "warning names {id}, not a node of the fleet"
        );
    }
    let rediscovered = metric_sum(&metrics, "choria_provisioner_discovered");
    ensure!(
        rediscovered >= dropped.len() as f64,
        "{} nodes dropped but only {rediscovered} queued by discovery",
        dropped.len()
    );
    let cycles = metric_sum(&metrics, "choria_provisioner_discover_cycles");
    run.stop_all()?;
    Ok(format!(
        "{} of {nodes} nodes dropped from a full {CAPACITY}-entry queue with a warning each (the gauge never passed {max_queue}); all {nodes} provisioned once, {:.1}s after the burst, the dropped ones queued again by discovery (cycle {cycles})",
        dropped.len(),
        t.max(started.elapsed()).as_secs_f64()
    ))
}

/// Anyone holding a provisioning JWT can announce nodes: 20,000 startup events for nodes that do
/// not exist (nine in ten valid-looking names, served by nothing that answers; one in ten hostile
/// identities: wildcards, names smuggling certificate names, newlines, 5,000 bytes...), then a
/// real fleet of 200 announcing itself behind them. The real fleet must be provisioned promptly,
/// every hostile identity refused and counted without a request sent for it, and the
/// provisioner's memory and log must stay bounded.
/// Start `nodes` real nodes behind `bogus` forged startup events and wait up to `timeout` until
/// the simulator counts every real one provisioned, failing as soon as provisioner `p` exits;
/// the simulator and how long that took.
fn flood(
    run: &mut Run,
    p: usize,
    nodes: usize,
    bogus: usize,
    timeout: Duration,
) -> Result<(Simulator, Duration)> {
    let flags = ["--bogus-events".to_string(), bogus.to_string()];
    let sim = run.start_sim("flood", "n", nodes, &flags)?;
    let what = "the real fleet behind the flood";
    let took = run.wait_fleet(p, &sim, what, nodes, timeout)?;
    Ok((sim, took))
}

pub fn event_flood(env: &Env, name: &str) -> Result<String> {
    const BOGUS: usize = 20_000;
    let nodes = 200;
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let pid = run.provisioners[p].proc.pid();
    let started = Instant::now();
    let (sim, took) = flood(&mut run, p, nodes, BOGUS, Duration::from_secs(120))?;
    let hostile = (0..BOGUS).filter(|n| n % 10 == 9).count() as f64;
    wait_for(
        "every hostile identity to be refused",
        Duration::from_secs(30),
        || Ok(run.metric(p, "choria_provisioner_invalid_identities") >= hostile),
    )?;
    let refused = run.metric(p, "choria_provisioner_invalid_identities");
    let queued = run.metric(p, "choria_provisioner_event_discovered");
    let hwm_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let report = sim.finish()?;
    let log = run.log(p);
    ensure!(
        refused == hostile,
        "{refused} identities refused, expected {hostile}"
    );
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.problems);
        let configures = n.ok_count("configure");
        ensure!(configures == 1, "{id} configured {configures} times");
    }
    let lines = log.lines().count();
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    let refusal_lines = log.lines().filter(|l| l.contains("refus")).count();
    ensure!(
        refusal_lines <= 30,
        "{refusal_lines} log lines about refused identities: not summarised"
    );
    ensure!(
        longest < 2048,
        "a log line of {longest} bytes: node text is not bounded"
    );
    ensure!(
        !log.lines().any(|l| l.starts_with("ERROR forged")),
        "a newline in an identity forged a log line"
    );
    ensure!(
        lines < 5_000,
        "{lines} log lines for a flood of {BOGUS}: the log is not bounded"
    );
    ensure!(
        hwm_kib > 0 && hwm_kib < 64 * 1024,
        "provisioner peak RSS {hwm_kib} KiB"
    );
    Ok(format!(
        "{nodes} real nodes provisioned {:.1}s after the flood began ({:.1}s in all); {refused} hostile identities refused and counted, {queued} announcements queued; {lines} log lines ({refusal_lines} about refusals, longest {longest} bytes); provisioner peak RSS {} MiB",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        hwm_kib / 1024
    ))
}

/// An audit trail under a flood: 100,000 startup events for nodes that do not exist (anyone
/// holding a provisioning JWT can send them), a real fleet of 100 behind them, and an
/// `audit_file`. The real fleet must be provisioned and recorded one line each, and the nodes
/// that never answered summed up in a few summary records, so the file stays under 1 MB.
pub fn audit_flood(env: &Env, name: &str) -> Result<String> {
    const BOGUS: usize = 100_000;
    let nodes = 100;
    let dir = env.base.join(name);
    std::fs::create_dir_all(&dir)?;
    let audit = dir.join("audit.jsonl");
    let yaml = format!("audit_file: {}\n", audit.display());
    let mut run = setup(
        env,
        name,
        Setup {
            extra_yaml: &yaml,
            ..Setup::default()
        },
    )?;
    let p = run.start_provisioner("provisioner")?;

    let (sim, took) = flood(&mut run, p, nodes, BOGUS, Duration::from_secs(180))?;
    // Let the flood drain: every announced name gets its one try.
    let drained = wait_for("the flood to be tried", Duration::from_secs(360), || {
        Ok(run.metric(p, "choria_provisioner_provision_errors") >= (BOGUS as f64) * 0.8)
    });
    let report = sim.finish()?;
    run.stop_all()?;
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.problems);
    }
    let size = std::fs::metadata(&audit)?.len();
    let text = std::fs::read_to_string(&audit)?;
    let mut provisioned = 0usize;
    let mut summaries = 0usize;
    let mut summed = 0u64;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| anyhow::anyhow!("an audit line is not JSON ({e}): {line:.200}"))?;
        match v["decision"].as_str() {
            Some("provisioned") => provisioned += 1,
            Some("undecided") => {
                summaries += 1;
                summed += v["count"].as_u64().unwrap_or(0);
            }
            _ => {}
        }
    }
    ensure!(
        provisioned >= nodes,
        "{provisioned} provisioned records for {nodes} nodes"
    );
    ensure!(
        size < 1_000_000,
        "the audit file grew to {size} bytes under a flood of {BOGUS}"
    );
    ensure!(
        summaries > 0 && summed > 0,
        "no summary of the nodes that never answered ({summaries} records)"
    );
    ensure!(
        summed as f64 >= (BOGUS as f64) * 0.8,
        "only {summed} of {BOGUS} forged cycles were tried before the stop ({drained:?})"
    );
    Ok(format!(
        "{nodes} real nodes provisioned {:.1}s after a flood of {BOGUS} announcements began; the audit file holds {} lines in {size} bytes: {provisioned} decisions and {summaries} summary records counting {summed} cycles that never reached their node",
        took.as_secs_f64(),
        text.lines().count()
    ))
}
