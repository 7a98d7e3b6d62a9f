//! Active-active on a three-server NATS cluster with JetStream (the claims bucket at three
//! replicas): three replicas sharing a fleet, one of them SIGKILLed mid-run, the server one
//! replica is connected to stopped mid-run, a replica started late, and the leader-election
//! mode on the same cluster with the leader's server killed. Every scenario checks the
//! simulator's report (each node provisioned, configured once) and the helper's record (the
//! demo helper appends the identity of every run: each node's helper ran once).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use test_support::metrics::{metric_sum, scrape};
use test_support::provisioner::{Output, Provisioner, ProvisionerProcess};
use test_support::simulator::{Report, Simulator};
use test_support::stack::{write_run_files, RunFiles};
use test_support::{Mode, NatsCluster};

use crate::harness::{wait_for, Env, DOMAIN};

/// The claim lifetime of the scenarios: short, so a dead replica's claims expire quickly.
const LIFETIME_SECS: u64 = 9;

/// One scenario's stack: the cluster, the run's files and the replicas.
struct AaRun {
    dir: PathBuf,
    bins: PathBuf,
    cluster: NatsCluster,
    files: RunFiles,
    /// The helper's record: one identity per helper run.
    record: PathBuf,
    /// The replicas' settings; each is a copy under its own identity.
    provisioner: Provisioner,
    replicas: Vec<ProvisionerProcess>,
}

impl AaRun {
    fn new(env: &Env, name: &str, election: bool, helper_delay_ms: u64) -> Result<AaRun> {
        let dir = env.base.join(name);
        std::fs::create_dir_all(&dir)?;
        let cluster = NatsCluster::start_with(3, "max_payload: 4MB")?;
        let helper = env.bins.join("choria-demo-helper").display().to_string();
        let extra = if election {
            String::new()
        } else {
            format!("active_active: true\nclaim_lifetime: {LIFETIME_SECS}s\n")
        };
        let files = write_run_files(&dir, &env.bins)?;
        let record = dir.join("helper-runs.txt");
        let mut provisioner = files
            .provisioner(&dir, &cluster.url(), &helper, Mode::Plain)
            .yaml(&extra)
            .env("CHORIA_HELPER_RECORD", record.display().to_string());
        provisioner.workers = 8;
        provisioner.leader_election = election;
        // A replica started again keeps its output.
        provisioner.output = Output::Append;
        if helper_delay_ms > 0 {
            provisioner = provisioner.env("CHORIA_HELPER_DELAY_MS", helper_delay_ms.to_string());
        }
        Ok(AaRun {
            record,
            dir,
            bins: env.bins.clone(),
            cluster,
            files,
            provisioner,
            replicas: Vec::new(),
        })
    }

    /// Start replica `identity`, connected to `broker` (the whole cluster, or one server whose
    /// peers it learns from the server), and wait until it listens for startup events.
    fn start(&mut self, identity: &str, broker: &str) -> Result<usize> {
        let mut settings = self.provisioner.for_identity(identity);
        settings.broker = broker.to_string();
        let mut proc = settings.start(&self.bins.join("choria-provisioner"), &self.dir)?;
        proc.wait_ready(Duration::from_secs(60))?;
        self.replicas.push(proc);
        Ok(self.replicas.len() - 1)
    }

    fn metric(&self, idx: usize, name: &str) -> f64 {
        metric_sum(&scrape(self.replicas[idx].port), name)
    }

    /// Wait until each of `replicas` counts `live` live replicas.
    fn wait_live(&self, replicas: &[usize], live: f64, timeout: Duration) -> Result<Duration> {
        let what = format!("{live} live replicas");
        wait_for(&what, timeout, || {
            Ok(replicas
                .iter()
                .all(|&i| self.metric(i, "choria_provisioner_active_replicas") == live))
        })
    }

    /// Start replicas `a`, `b` and `c` on the whole cluster and wait until each sees all three.
    fn start_three(&mut self) -> Result<Vec<usize>> {
        let url = self.cluster.url();
        let all: Vec<usize> = ["provisioner-a", "provisioner-b", "provisioner-c"]
            .iter()
            .map(|id| self.start(id, &url))
            .collect::<Result<_>>()?;
        self.wait_live(&all, 3.0, Duration::from_secs(30))?;
        Ok(all)
    }

    /// Wait up to two minutes until replica `idx` has provisioned `nodes`, failing as soon as it
    /// exits.
    fn wait_provisioned_by(&mut self, idx: usize, nodes: f64, what: &str) -> Result<Duration> {
        wait_for(what, Duration::from_secs(120), || {
            self.replicas[idx].alive()?;
            Ok(self.metric(idx, "choria_provisioner_provisioned") >= nodes)
        })
    }

    /// `name` summed over `replicas`.
    fn sum(&self, replicas: &[usize], name: &str) -> f64 {
        replicas.iter().map(|&i| self.metric(i, name)).sum()
    }

    fn start_sim(&self, nodes: usize) -> Result<Simulator> {
        let mut cmd = Simulator::command(&self.bins);
        cmd.args([
            "--broker",
            &self.cluster.url(),
            "--nodes",
            &nodes.to_string(),
        ])
        .args([
            "--mode",
            Mode::Plain.name(),
            "--token",
            &self.provisioner.token,
        ])
        .args(["--identity-prefix", "n", "--domain", DOMAIN])
        .args(["--restart-delay", "0s", "--progress", "1s"])
        .arg("--provisioning-signer")
        .arg(&self.files.signer_seed);
        Ok(Simulator::start(
            &mut cmd,
            &self.dir.join("report.json"),
            &self.dir.join("fleet-sim.log"),
        )?)
    }

    /// Wait until the simulator counts `nodes` provisioned, failing when any of `watch` exits.
    fn wait_fleet(
        &mut self,
        sim: &Simulator,
        watch: &[usize],
        nodes: usize,
        what: &str,
        timeout: Duration,
    ) -> Result<Duration> {
        wait_for(what, timeout, || {
            for &i in watch {
                self.replicas[i].alive()?;
            }
            Ok(sim.provisioned() >= nodes)
        })
    }

    /// How many times the helper ran for each identity.
    fn helper_runs(&self) -> BTreeMap<String, usize> {
        let mut runs = BTreeMap::new();
        for id in std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
        {
            *runs.entry(id.to_string()).or_insert(0) += 1;
        }
        runs
    }

    /// The nodes a replica logged a failed cycle for (`Could not provision <id>: ...`): such a
    /// node is still waiting in provisioning mode (for example its `restart` never reached it
    /// while the replica's server was down), so the next discovery finds it and a new cycle runs
    /// the helper and configures it again, as designed.
    fn failed_cycles(&self) -> BTreeSet<String> {
        let mut failed = BTreeSet::new();
        let Ok(dir) = std::fs::read_dir(&self.dir) else {
            return failed;
        };
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !(name.starts_with("provisioner") && name.ends_with(".log")) {
                continue;
            }
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines() {
                if let Some(rest) = line.split("Could not provision ").nth(1) {
                    if let Some((id, _)) = rest.split_once(':') {
                        failed.insert(id.to_string());
                    }
                }
            }
        }
        failed
    }

    fn stop(&mut self, which: &[usize]) -> Result<()> {
        for &i in which {
            self.replicas[i].stop_cleanly(Duration::from_secs(20))?;
            self.replicas[i].ensure_no_panic()?;
        }
        Ok(())
    }
}

/// Every node provisioned; the helper ran once per node and each node was configured by one
/// cycle, apart from at most `rerun_allowed` nodes (in flight on a killed replica: helper run
/// and possibly configured again by another) and the nodes in `failed` (a replica logged their
/// cycle as failed, so a later cycle had to provision them again). A node sent `configure` twice
/// by one cycle (the reply lost with a stopped server, the try repeated: the helper ran once) is
/// counted apart, at most `retried_allowed`. Returns (reruns, retried).
fn check_once(
    report: &Report,
    runs: &BTreeMap<String, usize>,
    failed: &BTreeSet<String>,
    nodes: usize,
    rerun_allowed: usize,
    retried_allowed: usize,
) -> Result<(usize, usize)> {
    ensure!(
        report.len() == nodes,
        "the report has {} nodes, not {nodes}",
        report.len()
    );
    crate::harness::ensure_all_provisioned(report)?;
    let (mut twice, mut retried) = (Vec::new(), 0usize);
    for (id, n) in report {
        let helper = runs.get(id).copied().unwrap_or(0);
        ensure!(helper > 0, "the helper never ran for {id}");
        let configured = n.ok_count("configure");
        if failed.contains(id) {
            // Provisioned again after a failed cycle: counted by neither rule.
        } else if configured > 1 && helper == 1 {
            retried += 1;
        } else if configured > 1 {
            twice.push(format!(
                "{id}: configured {configured} times, helper {helper} times"
            ));
        }
    }
    let reruns: Vec<_> = runs
        .iter()
        .filter(|(id, &n)| n > 1 && !failed.contains(*id))
        .collect();
    ensure!(
        reruns.len() <= rerun_allowed && twice.len() <= rerun_allowed,
        "the helper ran more than once for {} nodes and {} were configured by two cycles (at most {rerun_allowed} allowed): {:?} {twice:?}",
        reruns.len(),
        twice.len(),
        reruns.iter().take(10).collect::<Vec<_>>()
    );
    ensure!(
        retried <= retried_allowed,
        "{retried} nodes were sent configure twice by one cycle (at most {retried_allowed})"
    );
    Ok((reruns.len(), retried))
}

/// The JetStream operations per node, summed over `replicas`.
fn ops_per_node(run: &AaRun, replicas: &[usize], nodes: usize) -> f64 {
    run.sum(replicas, "choria_provisioner_claim_operations") / nodes as f64
}

pub fn aa_three_replicas(env: &Env, name: &str) -> Result<String> {
    let mut run = AaRun::new(env, name, false, 0)?;
    let all = run.start_three()?;
    let nodes = 2000;
    let sim = run.start_sim(nodes)?;
    let t = run.wait_fleet(
        &sim,
        &all,
        nodes,
        "2000 nodes provisioned by three replicas",
        Duration::from_secs(400),
    )?;
    let per: Vec<f64> = all
        .iter()
        .map(|&i| run.metric(i, "choria_provisioner_provisioned"))
        .collect();
    let ops = ops_per_node(&run, &all, nodes);
    let report = sim.finish()?;
    check_once(&report, &run.helper_runs(), &BTreeSet::new(), nodes, 0, 0)?;
    ensure!(
        per.iter().sum::<f64>() == nodes as f64,
        "the replicas counted {per:?} provisioned, not {nodes} in all"
    );
    ensure!(
        per.iter().all(|&p| p >= nodes as f64 / 10.0),
        "the work was not spread: {per:?}"
    );
    ensure!(ops <= 6.0, "{ops:.2} JetStream operations per node");
    run.stop(&all)?;
    Ok(format!(
        "{nodes} nodes in {:.1}s by three replicas ({per:?}); each configured once, each helper run once; {ops:.2} JetStream operations per node",
        t.as_secs_f64()
    ))
}

pub fn aa_replica_killed(env: &Env, name: &str) -> Result<String> {
    // A latency-bound helper keeps nodes in flight when the kill comes.
    let mut run = AaRun::new(env, name, false, 200)?;
    let all = run.start_three()?;
    let nodes = 600;
    let sim = run.start_sim(nodes)?;
    let victim = all[0];
    let survivors = [all[1], all[2]];
    run.wait_provisioned_by(victim, 40.0, "the first replica to provision 40 nodes")?;
    let _ = run.replicas[victim].proc.child.kill();
    let _ = run.replicas[victim].proc.child.wait();
    let killed = Instant::now();
    let done_at_kill = sim.provisioned();
    // The dead replica leaves the survivors' live set when its heartbeat ages out of the
    // bucket (the claim lifetime): from then on its share is theirs at once.
    let gone = run.wait_live(&survivors, 2.0, Duration::from_secs(60))?;
    // The victim's unfinished nodes: at most its 8 workers' were reached (those wait out the
    // nodes' 2-minute provisioning lock); every other node must be taken over within the claim
    // lifetime plus a few seconds of work.
    let workers = 8;
    run.wait_fleet(
        &sim,
        &survivors,
        nodes - workers,
        "the survivors to take over",
        Duration::from_secs(120),
    )?;
    let bulk = killed.elapsed();
    let t = run.wait_fleet(
        &sim,
        &survivors,
        nodes,
        "every node provisioned after the kill",
        Duration::from_secs(330),
    )?;
    let report = sim.finish()?;
    let (reruns, _) = check_once(
        &report,
        &run.helper_runs(),
        &BTreeSet::new(),
        nodes,
        workers,
        0,
    )?;
    let lock_held = run.sum(&survivors, "choria_provisioner_lock_held");
    let ops = ops_per_node(&run, &survivors, nodes);
    run.stop(&survivors)?;
    Ok(format!(
        "replica killed at {done_at_kill}/{nodes}; out of the survivors' live set {:.1}s after the kill (claim lifetime {LIFETIME_SECS}s); all but its in-flight nodes done {:.1}s after the kill, all {nodes} after {:.1}s; {reruns} helper reruns (nodes in flight on the dead replica), {lock_held} lock refusals; each node configured once; survivors' {ops:.2} JetStream operations per node",
        gone.as_secs_f64(),
        bulk.as_secs_f64(),
        killed.elapsed().as_secs_f64().max(t.as_secs_f64())
    ))
}

pub fn aa_server_stopped(env: &Env, name: &str) -> Result<String> {
    let mut run = AaRun::new(env, name, false, 20)?;
    let urls = run.cluster.urls();
    // The first replica knows only server 0; it learns the others from it.
    let a = run.start("provisioner-a", &urls[0])?;
    let b = run.start("provisioner-b", &urls[1])?;
    let c = run.start("provisioner-c", &urls[2])?;
    let all = [a, b, c];
    run.wait_live(&all, 3.0, Duration::from_secs(30))?;
    let nodes = 1000;
    let sim = run.start_sim(nodes)?;
    run.wait_provisioned_by(a, 50.0, "the first replica to provision 50 nodes")?;
    let before = run.metric(a, "choria_provisioner_provisioned");
    run.cluster.stop(0);
    let stopped = Instant::now();
    let t = run.wait_fleet(
        &sim,
        &all,
        nodes,
        "every node provisioned with a server down",
        Duration::from_secs(300),
    )?;
    let after = run.metric(a, "choria_provisioner_provisioned");
    let reconnected = run.metric(a, "choria_connector_reconnections");
    ensure!(reconnected >= 1.0, "replica a never reconnected");
    let report = sim.finish()?;
    // Replies in flight through the stopped server are lost: a cycle may send `configure` again
    // (one helper run), but no node is configured by two cycles and no helper runs twice.
    let failed = run.failed_cycles();
    let (reruns, retried) = check_once(&report, &run.helper_runs(), &failed, nodes, 0, 24)?;
    ensure!(
        after > before,
        "the replica on the stopped server provisioned nothing after reconnecting ({before} before)"
    );
    run.stop(&all)?;
    Ok(format!(
        "server 0 stopped at {before} nodes of replica a; it reconnected ({reconnected} reconnections counted) and provisioned {} more; all {nodes} done {:.1}s after the stop; {reruns} helper reruns, {retried} configure tries repeated by one cycle after a lost reply; no node configured by two cycles ({} provisioned again after a cycle failed while the server was down: {failed:?})",
        after - before,
        stopped.elapsed().as_secs_f64().min(t.as_secs_f64() + 1.0),
        failed.len()
    ))
}

pub fn aa_late_replica(env: &Env, name: &str) -> Result<String> {
    let mut run = AaRun::new(env, name, false, 20)?;
    let url = run.cluster.url();
    let a = run.start("provisioner-a", &url)?;
    let b = run.start("provisioner-b", &url)?;
    let nodes = 1200;
    let sim = run.start_sim(nodes)?;
    wait_for(
        "100 nodes provisioned by two replicas",
        Duration::from_secs(120),
        || Ok(sim.provisioned() >= 100),
    )?;
    let joined_at = sim.provisioned();
    let c = run.start("provisioner-c", &url)?;
    let all = [a, b, c];
    let t = run.wait_fleet(
        &sim,
        &all,
        nodes,
        "every node provisioned after a replica joined",
        Duration::from_secs(300),
    )?;
    let late = run.metric(c, "choria_provisioner_provisioned");
    let report = sim.finish()?;
    check_once(&report, &run.helper_runs(), &BTreeSet::new(), nodes, 0, 0)?;
    ensure!(late > 0.0, "the late replica took no node");
    run.stop(&all)?;
    Ok(format!(
        "a third replica joined at {joined_at}/{nodes} and provisioned {late}; all done {:.1}s later; each node configured once, each helper run once",
        t.as_secs_f64()
    ))
}

/// Leader election (active-standby) on the cluster: the leader's server is killed mid-run.
pub fn ha_cluster_server_killed(env: &Env, name: &str) -> Result<String> {
    let mut run = AaRun::new(env, name, true, 20)?;
    let port = run.cluster.urls()[1]
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .context("no port in the cluster's URL")?;
    crate::ha::create_replicated_election_bucket(port, Duration::from_secs(10), 3)?;
    let urls = run.cluster.urls();
    let a = run.start("provisioner-a", &urls[0])?;
    let b = run.start("provisioner-b", &urls[1])?;
    let ports = [a, b].map(|i| run.replicas[i].port);
    let first = [a, b][crate::harness::wait_leader(&ports)?];
    let nodes = 400;
    let sim = run.start_sim(nodes)?;
    run.wait_provisioned_by(first, 30.0, "the leader to provision 30 nodes")?;
    // Each replica was given one server: stop the leader's.
    run.cluster.stop(if first == a { 0 } else { 1 });
    let stopped = Instant::now();
    let t = run.wait_fleet(
        &sim,
        &[a, b],
        nodes,
        "every node provisioned after the leader's server died",
        Duration::from_secs(330),
    )?;
    let report = sim.finish()?;
    // As in aa-server-stopped: a `configure` whose reply was lost with the server is tried again
    // by the same cycle (one helper run); no node is configured by two cycles. When the leader
    // could not renew its lease while it reconnected, it lost leadership: a leader that loses
    // the election stops its in-flight cycles before their next action (active-standby shares
    // no helper results), so the nodes its 8 workers held may see the helper again from the new
    // leader. Without a leadership change no node may.
    let changes: usize = ["provisioner-a", "provisioner-b"]
        .iter()
        .map(|id| {
            std::fs::read_to_string(run.dir.join(format!("{id}.log")))
                .map(|l| l.matches("Lost leadership").count())
                .unwrap_or(0)
        })
        .sum();
    let allowed = if changes > 0 { 8 } else { 0 };
    let failed = run.failed_cycles();
    let (reruns, retried) = check_once(&report, &run.helper_runs(), &failed, nodes, allowed, 24)?;
    let led: Vec<f64> = [a, b]
        .iter()
        .map(|&i| run.metric(i, "choria_provisioner_provisioned"))
        .collect();
    run.stop(&[a, b])?;
    Ok(format!(
        "the leader's server was killed; the fleet finished {:.1}s later (provisioned per replica {led:?}); leadership lost {changes} times, {reruns} helper reruns (at most {allowed}), no node configured by two cycles ({retried} configure tries repeated after a lost reply; {} provisioned again after a cycle failed while the server was down: {failed:?})",
        stopped.elapsed().as_secs_f64().min(t.as_secs_f64() + 1.0),
        failed.len()
    ))
}
