//! Several provisioners on one fleet: two without election (the node's provisioning lock keeps
//! each node to one of them), leader election without its bucket, and the leader killed.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use crate::harness::{ensure_all_provisioned, setup, wait_for, wait_leader, Env, Setup};

pub fn lock_held(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let a = run.start_provisioner("provisioner")?;
    let b = run.start_provisioner("provisioner-b")?;
    let nodes = 30;
    let sim = run.start_sim("race", "n", nodes, &[])?;
    let t = wait_for(
        "the fleet to be provisioned",
        Duration::from_secs(120),
        || {
            run.alive(a)?;
            run.alive(b)?;
            let done = run.metric(a, "choria_provisioner_provisioned")
                + run.metric(b, "choria_provisioner_provisioned");
            Ok(done >= nodes as f64)
        },
    )?;
    let held = run.metric(a, "choria_provisioner_lock_held")
        + run.metric(b, "choria_provisioner_lock_held");
    let report = sim.finish()?;
    let mut twice = 0;
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.actions);
        if n.ok_count("configure") > 1 {
            twice += 1;
        }
    }
    ensure!(
        twice == 0,
        "{twice} nodes were configured by both provisioners"
    );
    let lock_lines = run.log(a).matches("provisioning lock held").count()
        + run.log(b).matches("provisioning lock held").count();
    ensure!(
        held as usize >= lock_lines.min(1),
        "lock_held counter {held} but {lock_lines} log lines"
    );
    // Each provisioner's node history shows the nodes it left to the other, with the action
    // that found the lock.
    let mut in_history = 0;
    for p in [a, b] {
        let counted = run.metric(p, "choria_provisioner_lock_held") as usize;
        let (_, body) = test_support::metrics::http_get(
            run.provisioners[p].port,
            "/api/v1/nodes?state=lock_held&limit=500",
        )
        .context("the node API did not answer")?;
        let v: serde_json::Value = serde_json::from_str(&body).context("node API JSON")?;
        let listed = v["nodes"].as_array().cloned().unwrap_or_default();
        ensure!(
            listed.len() <= counted && (counted == 0 || !listed.is_empty()),
            "{} nodes in lock_held in the history, {counted} counted",
            listed.len()
        );
        for n in &listed {
            ensure!(
                n["step"].as_str().is_some_and(|s| s.contains('#'))
                    && n["cause"]
                        .as_str()
                        .is_some_and(|c| c.contains("provisioning lock held")),
                "a lock_held node without its action and cause: {n}"
            );
        }
        in_history += listed.len();
    }
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes provisioned in {:.1}s, each configured once; {held} lock refusals counted and logged, {in_history} nodes shown as lock_held with the action by the node history",
        t.as_secs_f64()
    ))
}

/// Create the election KV bucket's stream over a raw NATS connection (JetStream API).
pub fn create_election_bucket(port: u16, ttl: Duration) -> Result<()> {
    create_replicated_election_bucket(port, ttl, 1)
}

/// [`create_election_bucket`] with `replicas` copies (a cluster, which test-support starts
/// only once it has placed a replicated stream).
pub fn create_replicated_election_bucket(port: u16, ttl: Duration, replicas: usize) -> Result<()> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = serde_json::json!({
        "name": "KV_CHORIA_LEADER_ELECTION",
        "subjects": ["$KV.CHORIA_LEADER_ELECTION.>"],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs_per_subject": 1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": ttl.as_nanos() as u64,
        "max_msg_size": -1,
        "storage": "file",
        "discard": "new",
        "num_replicas": replicas,
        "duplicate_window": 2_000_000_000u64,
        "allow_rollup_hdrs": true,
        "deny_delete": true,
        "deny_purge": false,
        "allow_direct": true,
    })
    .to_string();
    write!(
        s,
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":false}}\r\nSUB _INBOX.faults 1\r\nPUB $JS.API.STREAM.CREATE.KV_CHORIA_LEADER_ELECTION _INBOX.faults {}\r\n{req}\r\nPING\r\n",
        req.len()
    )?;
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
        if let Some(i) = got.find("MSG _INBOX.faults") {
            if got[i..].matches("\r\n").count() >= 2 {
                break;
            }
        }
    }
    ensure!(
        got.contains("\"config\"") && !got.contains("\"error\""),
        "creating the election bucket failed: {got}"
    );
    Ok(())
}

pub fn election_bucket_missing(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(
        env,
        name,
        Setup {
            leader_election: true,
            // Without it the provisioner stops at once, as the Go one does (daemon tests).
            extra_yaml: "leader_election_wait: true\n",
            ..Setup::default()
        },
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 10;
    let sim = run.start_sim("run", "n", nodes, &[])?;
    let t = wait_for(
        "repeated election errors in the log",
        Duration::from_secs(40),
        || {
            run.alive(p)?;
            let log = run.log(p);
            Ok(log
                .lines()
                .filter(|l| l.contains("\"level\":\"error\"") && l.contains("eader election"))
                .count()
                >= 2)
        },
    )?;
    ensure!(
        run.metric(p, "choria_provisioner_provisioned") == 0.0,
        "provisioned without an election"
    );
    ensure!(
        run.metric(p, "choria_provisioner_paused") == 1.0,
        "the provisioner is not reported paused"
    );
    let sample = run
        .log(p)
        .lines()
        .find(|l| l.contains("\"level\":\"error\"") && l.contains("eader election"))
        .map(|l| {
            let msg = l.split_once("\"msg\":\"").map_or(l, |x| x.1);
            msg.split("\",\"").next().unwrap_or(msg).to_string()
        })
        .unwrap_or_default();
    create_election_bucket(run.nats_port, Duration::from_secs(10))?;
    let t2 = run.wait_provisioned(
        p,
        "the provisioner to win and provision once the bucket exists",
        nodes as f64,
    )?;
    ensure_all_provisioned(&sim.finish()?)?;
    run.stop_all()?;
    Ok(format!(
        "two errors within {:.1}s, paused=1 (\"{sample}\"); after the bucket was created the fleet was provisioned in {:.1}s",
        t.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

pub fn ha_leader_killed(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(
        env,
        name,
        Setup {
            leader_election: true,
            ..Setup::default()
        },
    )?;
    create_election_bucket(run.nats_port, Duration::from_secs(10))?;
    let a = run.start_provisioner("provisioner")?;
    let b = run.start_provisioner("provisioner-b")?;
    let ports = [a, b].map(|i| run.provisioners[i].port);
    let first = [a, b][wait_leader(&ports)?];
    let other = if first == a { b } else { a };
    ensure!(
        run.metric(other, "choria_provisioner_paused") == 1.0,
        "both provisioners are active"
    );
    let nodes = 40;
    let (sim, before) = run.start_slow_fleet(first, "run", nodes)?;
    let _ = run.provisioners[first].proc.child.kill();
    let _ = run.provisioners[first].proc.child.wait();
    let killed = Instant::now();
    let took_over = wait_for("the standby to take over", Duration::from_secs(60), || {
        run.alive(other)?;
        Ok(run.metric(other, "choria_provisioner_paused") == 0.0)
    })?;
    // Nodes the dead leader was working on stay locked to it (go-choria's 2 minute lock); the
    // new leader leaves them alone for its 120 s lock hold and finds them again by discovery.
    let t = run.wait_fleet(
        other,
        &sim,
        "the new leader to finish the fleet",
        nodes,
        Duration::from_secs(260),
    )?;
    let counted = run.metric(other, "choria_provisioner_provisioned");
    ensure!(counted > 0.0, "the new leader provisioned nothing");
    ensure_all_provisioned(&sim.finish()?)?;
    ensure!(
        run.log(other)
            .contains("Became leader after winning election"),
        "the new leader did not log its election"
    );
    let _ = killed;
    run.stop_all()?;
    Ok(format!(
        "leader killed after {before} nodes; the standby led {:.1}s later and finished the fleet {:.1}s after the kill, {counted} nodes counted by it (nodes locked by the dead leader wait out the 120 s lock hold and the next discovery)",
        took_over.as_secs_f64(),
        t.as_secs_f64() + took_over.as_secs_f64()
    ))
}
