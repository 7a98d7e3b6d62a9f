//! `cargo xtask bench --replicas R [--helper-delay MS]`: does active-active scale out? The same
//! fleet is provisioned by one replica, then by `R` replicas, on a three-server JetStream cluster,
//! with the demo helper made latency-bound (a fixed delay per node standing for a remote CA) and
//! the same workers per replica. The fleet comes up first and the replicas start together, so
//! each one's first discovery finds every node and the claims settle who takes which.
//! Throughput is taken between 10 % and 90 % of the fleet, from the replicas' `/metrics`, so
//! start-up and the last stragglers do not blur it. The last line
//! prints the ratio, the JetStream operations per node and the nodes each replica took.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use test_support::stack::write_run_files;
use test_support::{Mode, NatsCluster, ProcessGuard};

use crate::{bail, run_dir, Result};

/// What one run achieved.
struct Run {
    per_min: f64,
    ops_per_node: f64,
    per_replica: Vec<f64>,
}

/// The fleet and the replicas' settings, the same for both runs.
pub struct Scaling<'a> {
    /// The directory holding the binaries.
    pub bins: &'a Path,
    /// The helper's latency per node.
    pub helper_delay_ms: u64,
    /// Simulated servers.
    pub nodes: usize,
    /// Workers per replica.
    pub workers: usize,
    /// The longest a run may take.
    pub timeout: Duration,
}

/// The scaling benchmark: one replica, then `replicas`.
pub fn run(s: &Scaling, replicas: usize) -> Result<()> {
    if replicas == 0 {
        bail!("--replicas needs at least 1");
    }
    let one = run_with(s, 1)?;
    let many = run_with(s, replicas)?;
    let Scaling {
        helper_delay_ms,
        nodes,
        workers,
        ..
    } = *s;
    let ratio = if one.per_min > 0.0 {
        many.per_min / one.per_min
    } else {
        0.0
    };
    println!(
        "bench: replicas={replicas} nodes={nodes} workers_per_replica={workers} helper_delay_ms={helper_delay_ms} one_per_min={:.0} replicas_per_min={:.0} ops_per_node_one={:.2} ops_per_node_replicas={:.2} per_replica={:?} scaling_ratio={ratio:.2}",
        one.per_min, many.per_min, one.ops_per_node, many.ops_per_node, many.per_replica
    );
    Ok(())
}

/// One run of `replicas` replicas.
fn run_with(s: &Scaling, replicas: usize) -> Result<Run> {
    let Scaling {
        bins,
        helper_delay_ms,
        nodes,
        workers,
        timeout,
    } = *s;
    let label = format!("replicas-{replicas}");
    let dir = run_dir(&label)?;
    let cluster = NatsCluster::start_with(3, "max_payload: 4MB")?;
    let url = cluster.url();
    let helper = bins.join("choria-demo-helper");
    let files = write_run_files(&dir, bins)?;
    let mut settings = files
        .provisioner(&dir, &url, &helper.display().to_string(), Mode::Plain)
        .yaml("active_active: true\nclaim_lifetime: 30s\n")
        .env("CHORIA_HELPER_DELAY_MS", helper_delay_ms.to_string());
    settings.workers = workers;
    settings.grace = Duration::from_secs(5);
    let sim_log = dir.join("fleet-sim.log");
    let mut sim_cmd = files.fleet_sim(bins, &url, nodes, Mode::Plain, "bench", &sim_log)?;
    sim_cmd
        .args(["--restart-delay", "0s", "--timeout"])
        .arg(format!("{}s", timeout.as_secs()))
        .stdout(Stdio::null());
    let _sim = ProcessGuard::spawn("choria-fleet-sim", &mut sim_cmd)?;
    // The fleet is up before the replicas, so their first discovery finds every node (the
    // discovery lane, all workers), as the single-replica run's does.
    std::thread::sleep(Duration::from_secs(2));
    let mut procs = Vec::new();
    for n in 0..replicas {
        let identity = format!("replica-{n}");
        let replica = settings.for_identity(&identity);
        procs.push(replica.start(&bins.join("choria-provisioner"), &dir)?);
    }
    for p in &mut procs {
        p.wait_ready(Duration::from_secs(60))?;
    }
    let started = Instant::now();
    let (low, high) = (nodes as f64 * 0.1, nodes as f64 * 0.9);
    let (mut t_low, mut t_high) = (None, None);
    let mut done = 0.0;
    while t_high.is_none() {
        std::thread::sleep(Duration::from_millis(100));
        if started.elapsed() > timeout {
            bail!(
                "{label}: {done}/{nodes} provisioned after {timeout:?}; see {}",
                dir.display()
            );
        }
        for p in &mut procs {
            if p.exited().is_some() {
                bail!("{label}: a replica exited; see {}", dir.display());
            }
        }
        done = procs
            .iter()
            .map(|p| p.metric_sum("choria_provisioner_provisioned"))
            .sum();
        if t_low.is_none() && done >= low {
            t_low = Some((Instant::now(), done));
        }
        if done >= high {
            t_high = Some((Instant::now(), done));
        }
    }
    let (Some((tl, dl)), Some((th, dh))) = (t_low, t_high) else {
        bail!("{label}: no throughput window");
    };
    let secs = th.duration_since(tl).as_secs_f64().max(0.001);
    let per_min = (dh - dl) / secs * 60.0;
    // Let the fleet finish so the operation count covers every node.
    let _ = test_support::wait_for("the fleet to finish", Duration::from_secs(120), || {
        Ok::<bool, test_support::Error>(
            procs
                .iter()
                .map(|p| p.metric_sum("choria_provisioner_provisioned"))
                .sum::<f64>()
                >= nodes as f64,
        )
    });
    // The claim counters are copied into /metrics every second.
    std::thread::sleep(Duration::from_millis(1500));
    let ops: f64 = procs
        .iter()
        .map(|p| p.metric_sum("choria_provisioner_claim_operations"))
        .sum();
    let per_replica: Vec<f64> = procs
        .iter()
        .map(|p| p.metric_sum("choria_provisioner_provisioned"))
        .collect();
    let total: f64 = per_replica.iter().sum();
    eprintln!(
        "bench: {label}: {per_min:.0} nodes/min between 10% and 90% ({:.1}s), {total}/{nodes} provisioned, {:.2} JetStream operations per node, per replica {per_replica:?}",
        secs,
        ops / total.max(1.0)
    );
    for mut p in procs {
        p.proc.terminate(Duration::from_secs(10));
    }
    drop(cluster);
    Ok(Run {
        per_min,
        ops_per_node: ops / total.max(1.0),
        per_replica,
    })
}
