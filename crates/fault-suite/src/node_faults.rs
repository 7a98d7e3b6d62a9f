//! Nodes that misbehave: slow, silent, under another identity, with garbage or oversized
//! replies, duplicated replies, bad nonce signatures, bad or denied CSRs, a failing configure,
//! and the whole fleet restarting mid-cycle. One fleet with the fault, then the same fleet
//! without it.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use test_support::logs::read_from;
use test_support::metrics::{metric_sum, metric_with, scrape as scrape_all};
use test_support::Mode;

use crate::harness::{affected, ensure_refused, identities, setup, wait_for, Env, Setup};

/// The share of the fleet a node fault hits.
pub const SHARE: f64 = 0.2;

struct NodeFault<'a> {
    /// The simulator's fault switch `--fault-<switch>`; also the salt that picks the nodes.
    switch: &'a str,
    /// The switch's value: the share, unless the switch takes more (`0.2:6s`).
    value: String,
    /// Actions an affected node must never see after its failed check.
    never: &'a [&'a str],
    /// Words (any one, case-insensitive) that an error line naming the node must contain.
    words: &'a [&'a str],
    /// An error counter and its `rpc` label that must have counted the failures, e.g.
    /// `("choria_provisioner_rpc_errors", "rpcutil#inventory")`.
    counter: Option<(&'a str, &'a str)>,
    /// A line the log must contain somewhere (e.g. a warning without the node's name).
    log_has: Option<&'a str>,
    /// How long the faulty fleet may take to settle.
    settle: Duration,
    setup: Setup<'a>,
}

impl<'a> NodeFault<'a> {
    /// `--fault-<switch> 0.2` on 20 plain nodes: the hit ones are never configured or
    /// restarted and an error line names each with one of `words`, within 60 s.
    fn new(switch: &'a str, words: &'a [&'a str]) -> Self {
        NodeFault {
            switch,
            value: SHARE.to_string(),
            never: &["configure", "restart"],
            words,
            counter: None,
            log_has: None,
            settle: Duration::from_secs(60),
            setup: Setup::default(),
        }
    }

    fn in_mode(self, mode: Mode) -> Self {
        NodeFault {
            setup: Setup { mode, ..self.setup },
            ..self
        }
    }

    /// The failures must be counted as `choria_provisioner_rpc_errors` of `rpc`.
    fn counted_as_rpc_errors(self, rpc: &'a str) -> Self {
        NodeFault {
            counter: Some(("choria_provisioner_rpc_errors", rpc)),
            ..self
        }
    }

    /// The faulty fleet may take two minutes to settle (the fault is a timeout).
    fn slow_to_settle(self) -> Self {
        NodeFault {
            settle: Duration::from_secs(120),
            ..self
        }
    }
}

/// What an error line names a node with when its RPC timed out.
const TIMEOUT_WORDS: &[&str] = &["timeout", "timed out", "no reply", "no response"];

fn node_fault(env: &Env, name: &str, f: NodeFault<'_>) -> Result<String> {
    const NODES: usize = 20;
    let mut run = setup(env, name, f.setup)?;
    let p = run.start_provisioner("provisioner")?;
    let ids = identities("n", NODES);
    let hit: Vec<&String> = ids
        .iter()
        .filter(|i| affected(f.switch, i, SHARE))
        .collect();
    ensure!(
        !hit.is_empty(),
        "the fault selects no node of {} (choose another share)",
        NODES
    );
    let good = NODES - hit.len();

    // Phase 1: the faulty fleet.
    let sim = run.start_sim(
        "fault",
        "n",
        NODES,
        &[format!("--fault-{}", f.switch), f.value],
    )?;
    let t1 = wait_for("the faulty fleet to settle", f.settle, || {
        run.alive(p)?;
        let m = scrape_all(run.provisioners[p].port);
        let done = metric_sum(&m, "choria_provisioner_provisioned");
        let errs = metric_sum(&m, "choria_provisioner_provision_errors");
        let busy = metric_sum(&m, "choria_provisioner_busy_workers");
        let queued = metric_sum(&m, "choria_provisioner_work_queue_entries");
        Ok(done >= good as f64 && errs >= hit.len() as f64 && busy == 0.0 && queued == 0.0)
    })?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    let log = run.log(p);
    for id in &ids {
        let n = report
            .get(id)
            .with_context(|| format!("{id} missing from the report"))?;
        if hit.contains(&id) {
            ensure_refused(id, n, &log, f.never, f.words, "it failed a check")?;
            ensure!(
                n.received.is_none() || f.never.is_empty(),
                "{id} failed a check but received a configuration"
            );
        } else {
            ensure!(
                n.provisioned,
                "{id} was not hit by the fault but is not provisioned: {:?} {:?}",
                n.actions,
                n.problems
            );
        }
    }
    let errors = metric_sum(&metrics, "choria_provisioner_provision_errors");
    ensure!(
        errors >= hit.len() as f64,
        "provision_errors {errors} < {} failed nodes",
        hit.len()
    );
    if let Some(want) = f.log_has {
        ensure!(log.contains(want), "the log has no line with {want:?}");
    }
    let mut counted = String::new();
    if let Some((metric, label)) = f.counter {
        let v = metric_with(&metrics, metric, "rpc", label);
        ensure!(
            v >= 1.0,
            "{metric}{{rpc={label:?}}} did not count the failures"
        );
        counted = format!(", {metric}{{rpc={label:?}}}={v}");
    }

    // Phase 2: the fault clears; the restarted fleet announces itself with startup events.
    // Success is read from the log: nodes provisioned in phase 1 may be provisioned again here
    // once their hold expires, so the counter alone cannot tell.
    let log_start = std::fs::metadata(&run.provisioners[p].log)
        .map(|m| m.len())
        .unwrap_or(0);
    let sim = run.start_sim("clear", "n", NODES, &[])?;
    let t2 = wait_for(
        "the failed nodes to be provisioned after the fault cleared",
        Duration::from_secs(60),
        || {
            run.alive(p)?;
            let text = read_from(&run.provisioners[p].log, log_start);
            Ok(hit.iter().all(|id| {
                text.lines()
                    .any(|l| l.contains(&format!("\"msg\":\"Provisioned {id}\"")))
            }))
        },
    )?;
    let report = sim.finish()?;
    for id in &hit {
        let n = report
            .get(*id)
            .with_context(|| format!("{id} missing from the second report"))?;
        ensure!(
            n.provisioned,
            "{id} not provisioned after the fault cleared: {:?} {:?}",
            n.actions,
            n.problems
        );
    }
    run.stop_all()?;
    Ok(format!(
        "{} of {} nodes failed ({errors} provision errors{counted}), none configured; {good} provisioned in {:.1}s; the {} recovered {:.1}s after restart events",
        hit.len(),
        NODES,
        t1.as_secs_f64(),
        hit.len(),
        t2.as_secs_f64()
    ))
}

pub fn node_slow(env: &Env, name: &str) -> Result<String> {
    let fault = NodeFault {
        value: format!("{SHARE}:6s"),
        ..NodeFault::new("slow", TIMEOUT_WORDS)
    };
    let fault = fault.counted_as_rpc_errors("rpcutil#inventory");
    node_fault(env, name, fault.slow_to_settle())
}

pub fn node_silent(env: &Env, name: &str) -> Result<String> {
    let fault = NodeFault::new("drop", TIMEOUT_WORDS).counted_as_rpc_errors("choria_provision#jwt");
    node_fault(env, name, fault.slow_to_settle())
}

pub fn node_wrong_identity(env: &Env, name: &str) -> Result<String> {
    let words = &["identity", "sender", "timeout", "timed out", "no reply"];
    node_fault(
        env,
        name,
        NodeFault::new("wrong-identity", words).slow_to_settle(),
    )
}

pub fn node_garbage(env: &Env, name: &str) -> Result<String> {
    let words = &["bad reply", "invalid", "json", "decode", "parse"];
    let fault = NodeFault::new("garbage", words).counted_as_rpc_errors("choria_provision#jwt");
    node_fault(env, name, fault)
}

pub fn node_oversize(env: &Env, name: &str) -> Result<String> {
    let fault = NodeFault {
        log_has: Some("dropping oversized reply"),
        ..NodeFault::new("oversize", &["timeout"])
    };
    let fault = fault.counted_as_rpc_errors("choria_provision#jwt");
    node_fault(env, name, fault.slow_to_settle())
}

/// Duplicated replies must change nothing: every node provisioned once, no error.
pub fn node_duplicate(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 20;
    let ids = identities("n", nodes);
    let dup = ids
        .iter()
        .filter(|i| affected("duplicate", i, 0.34))
        .count();
    ensure!(dup > 0, "the fault selects no node");
    let sim = run.start_sim(
        "dup",
        "n",
        nodes,
        &["--fault-duplicate".into(), "0.34".into()],
    )?;
    let t = run.wait_provisioned(p, "the fleet", nodes as f64)?;
    std::thread::sleep(Duration::from_secs(1));
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.actions);
        for a in ["jwt", "configure", "restart"] {
            ensure!(
                n.ok_count(a) == 1,
                "{id} was sent {a} {} times",
                n.ok_count(a)
            );
        }
    }
    let errors = metric_sum(&metrics, "choria_provisioner_provision_errors")
        + metric_sum(&metrics, "choria_provisioner_rpc_errors");
    ensure!(errors == 0.0, "{errors} errors with duplicated replies");
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes ({dup} sending every reply twice) provisioned in {:.1}s, each action once, no error",
        t.as_secs_f64()
    ))
}

pub fn node_bad_nonce(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("bad-nonce", &["nonce"]).in_mode(Mode::Ed25519),
    )
}

pub fn node_bad_csr(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("bad-csr", &["common name", "csr"]).in_mode(Mode::Pki),
    )
}

pub fn node_bad_csr_signature(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("bad-csr-signature", &["signature"]).in_mode(Mode::Pki),
    )
}

/// Nodes whose CSR carries a DNS name (not the common name) matching the deny list.
pub fn node_denied_san(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("denied-san", &["privileged.choria"]).in_mode(Mode::Pki),
    )
}

/// Nodes whose own name matches the deny list: refused for good, nothing configured.
pub fn node_denied_name(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Pki))?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 6;
    let sim = run.start_sim(
        "denied",
        "n",
        nodes,
        &["--domain".into(), "web.privileged.choria".into()],
    )?;
    let t = run.wait_errors(p, "every node to be refused", nodes as f64)?;
    std::thread::sleep(Duration::from_secs(1));
    let provisioned = run.metric(p, "choria_provisioner_provisioned");
    let report = sim.finish()?;
    ensure!(provisioned == 0.0, "{provisioned} denied nodes provisioned");
    run.ensure_all_refused(
        p,
        &report,
        &["configure"],
        &["privileged"],
        "it matches the deny list",
    )?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes named *.web.privileged.choria refused in {:.1}s, none configured (no recovery: the name itself is denied)",
        t.as_secs_f64()
    ))
}

pub fn node_configure_fails(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault {
            value: format!("configure:{SHARE}"),
            never: &["restart"],
            counter: Some((
                "choria_provisioner_rpc_errors",
                "choria_provision#configure",
            )),
            settle: Duration::from_secs(90),
            ..NodeFault::new("fail-action", &["configure"])
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Nodes restarting mid-cycle: the whole simulated fleet is killed and started again.

pub fn provisioned_in(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| l.contains("\"msg\":\"Provisioned "))
        .filter_map(|l| l.split("\"identity\":\"").nth(1)?.split('"').next())
        .map(|id| id.trim().to_string())
        .collect()
}

pub fn fleet_restart(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 30;
    let (sim, _) = run.start_slow_fleet(p, "first", nodes)?;
    // Every node dies at once, mid-cycle for the busy ones, without a report.
    let mut sim = sim;
    let _ = sim.proc.child.kill();
    let _ = sim.proc.child.wait();
    drop(sim);
    std::thread::sleep(Duration::from_secs(1));
    let log_path = run.provisioners[p].log.clone();
    let before = std::fs::read_to_string(&log_path).unwrap_or_default();
    let done_before = provisioned_in(&before);
    let offset = before.len() as u64;
    let flags = ["--fault-slow".to_string(), "1:300ms".to_string()];
    let sim = run.start_sim("second", "n", nodes, &flags)?;
    let ids = identities("n", nodes);
    let rest: Vec<&String> = ids.iter().filter(|i| !done_before.contains(*i)).collect();
    // Nodes whose old cycle is still waiting on a dead node when their startup event arrives
    // are not queued twice; they come back with the next discovery (one 60 s interval).
    let t = wait_for(
        "every node not provisioned before the restart",
        Duration::from_secs(150),
        || {
            run.alive(p)?;
            let after = provisioned_in(&read_from(&log_path, offset));
            Ok(rest.iter().all(|id| after.contains(*id)))
        },
    )?;
    let report = sim.finish()?;
    for id in &rest {
        let n = report.get(*id).context("missing from the report")?;
        ensure!(
            n.provisioned,
            "{id} not provisioned after the restart: {:?}",
            n.actions
        );
        ensure!(
            n.ok_count("configure") == 1,
            "{id} configured {} times after the restart",
            n.ok_count("configure")
        );
    }
    run.stop_all()?;
    Ok(format!(
        "{} provisioned before every node restarted; the other {} provisioned {:.1}s after the restart",
        done_before.len(),
        rest.len(),
        t.as_secs_f64()
    ))
}
