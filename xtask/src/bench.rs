//! `cargo xtask bench`: provisioning throughput and cost, optionally side by side with the Go
//! provisioner on an identical fresh fleet.
//!
//! Measured from provisioner start until the simulator reports every node provisioned: wall time,
//! nodes per minute, provisioner CPU seconds (user+sys from /proc), provisioner peak RSS (VmHWM),
//! the helper's share of the provisioner's busy time, and failures.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::stack::{self, Mode, Proc, ProvisionerOptions};
use crate::tools::root;

/// `cargo xtask bench` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Simulated servers.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// plain, pki or ed25519.
    #[arg(long, default_value = "plain")]
    mode: Mode,
    /// Provisioner workers.
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// Also run the Go provisioner on an identical fleet.
    #[arg(long)]
    vs_go: bool,
    /// The Go provisioner to run (implies --vs-go).
    #[arg(long, value_name = "PATH")]
    go_bin: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 600)]
    timeout: u64,
    /// Instead: the memory of N nodes waiting behind a stuck helper.
    #[arg(long, value_name = "N")]
    waiting: Option<usize>,
    /// Use debug builds (no release build): for memory figures such as --waiting, which do not
    /// depend on the optimisation level; speed figures from them mean nothing.
    #[arg(long)]
    debug_build: bool,
    /// Instead: three runs without a policy and three with this rego_policy, alternating;
    /// prints the medians and the loss in nodes a minute.
    #[arg(long, value_name = "FILE")]
    rego_policy: Option<PathBuf>,
}

/// What one contender achieved.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    pub wall: Duration,
    pub per_min: f64,
    pub cpu_s: f64,
    pub rss_mib: f64,
    pub helper_share: f64,
    pub failures: f64,
    pub provisioned: usize,
}

/// user+sys CPU seconds of a process from /proc/<pid>/stat.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let ticks = 100.0; // USER_HZ on Linux
    Some((utime + stime) / ticks)
}

/// Peak resident set size in MiB from /proc/<pid>/status.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Run one contender (`go_bin` None = ours) against a fresh fleet.
fn contender(args: &Args, bins: &Path, go_bin: Option<&Path>, label: &str) -> Result<Figures> {
    contender_with(args, bins, go_bin, label, "")
}

/// [`contender`] with more provisioner YAML.
fn contender_with(
    args: &Args,
    bins: &Path,
    go_bin: Option<&Path>,
    label: &str,
    extra_yaml: &str,
) -> Result<Figures> {
    let dir = root().join("target/bench").join(label);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (_nats, url) = stack::start_nats(&dir)?;
    let helper = bins.join("choria-demo-helper");
    let workers = if args.workers == 0 { 64 } else { args.workers };
    let files = stack::write_run_files(
        &dir,
        bins,
        &ProvisionerOptions {
            mode: args.mode,
            workers,
            helper: &helper.display().to_string(),
            broker: &url,
            identity: "provisioner",
            leader_election: false,
            extra_yaml,
        },
    )?;
    let sim_log = dir.join("fleet-sim.log");
    let mut sim_cmd = files.fleet_sim(bins, &url, args.nodes, args.mode, "bench", &sim_log)?;
    sim_cmd.args([
        "--exit-when-done",
        "--timeout",
        &format!("{}s", args.timeout),
        "--restart-delay",
        "0s",
    ]);
    let mut sim = Proc::spawn("choria-fleet-sim", &mut sim_cmd)?;
    // Let the fleet come up and announce itself before the clock starts.
    std::thread::sleep(Duration::from_secs(2));

    let program: PathBuf = go_bin
        .map(Path::to_path_buf)
        .unwrap_or_else(|| bins.join("choria-provisioner"));
    let started = Instant::now();
    let out = dir.join("provisioner.out");
    let mut prov = files.start_provisioner(&program, &url, &[], &out)?;
    let pid = prov.pid();
    let mut peak = 0.0f64;
    let mut cpu = 0.0f64;
    let status = loop {
        std::thread::sleep(Duration::from_millis(200));
        if let Some(r) = peak_rss_mib(pid) {
            peak = peak.max(r);
        }
        if let Some(c) = cpu_seconds(pid) {
            cpu = c;
        }
        if let Ok(Some(st)) = sim.child.try_wait() {
            break st;
        }
        if prov.exited().is_some() {
            bail!(
                "{label}: the provisioner exited early; see {}",
                dir.join("provisioner.out").display()
            );
        }
    };
    let wall = started.elapsed();
    let metrics = prov.metrics();
    prov.proc.terminate(Duration::from_secs(10));
    let sim_line = test_support::stack::sim_summary(&sim_log).unwrap_or_default();
    let provisioned = sim_line
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if !status.success() {
        eprintln!("bench: {label}: fleet not complete: {sim_line}");
    }
    let helper_s = stack::metric_sum(&metrics, "choria_provisioner_helper_time_sum");
    let rpc_s = stack::metric_sum(&metrics, "choria_provisioner_rpc_time_sum");
    let f = Figures {
        wall,
        per_min: provisioned as f64 / wall.as_secs_f64() * 60.0,
        cpu_s: cpu,
        rss_mib: peak,
        helper_share: if helper_s + rpc_s > 0.0 {
            helper_s / (helper_s + rpc_s)
        } else {
            0.0
        },
        failures: stack::metric_sum(&metrics, "choria_provisioner_provision_errors"),
        provisioned,
    };
    eprintln!(
        "bench: {label}: {}/{} provisioned in {:.2}s = {:.0}/min, cpu {:.2}s, peak rss {:.1} MiB, helper share {:.0}%, failures {}",
        f.provisioned,
        args.nodes,
        f.wall.as_secs_f64(),
        f.per_min,
        f.cpu_s,
        f.rss_mib,
        f.helper_share * 100.0,
        f.failures
    );
    Ok(f)
}

/// Run the benchmark.
pub fn main(args: Args) -> Result<()> {
    eprintln!(
        "bench: {} build",
        if args.debug_build { "debug" } else { "release" }
    );
    let bins = stack::build_binaries(!args.debug_build)?;
    if let Some(n) = args.waiting {
        return waiting_probe(n, &bins);
    }
    if let Some(policy) = &args.rego_policy {
        return rego_policy_probe(&args, &bins, policy);
    }
    let ours = contender(&args, &bins, None, "rust")?;
    let go = if args.vs_go || args.go_bin.is_some() {
        let go_bin = match &args.go_bin {
            Some(p) => p.clone(),
            None => {
                crate::peers::build_provisioner()?;
                crate::peers::provisioner_bin()
            }
        };
        Some(contender(&args, &bins, Some(&go_bin), "go")?)
    } else {
        None
    };
    let dash = "-".to_string();
    let (gp, gc, gr, tr, rr) = match &go {
        Some(g) => (
            format!("{:.0}", g.per_min),
            format!("{:.2}", g.cpu_s),
            format!("{:.1}", g.rss_mib),
            format!(
                "{:.2}",
                if g.per_min > 0.0 {
                    ours.per_min / g.per_min
                } else {
                    0.0
                }
            ),
            format!(
                "{:.2}",
                if ours.rss_mib > 0.0 {
                    g.rss_mib / ours.rss_mib
                } else {
                    0.0
                }
            ),
        ),
        None => (dash.clone(), dash.clone(), dash.clone(), dash.clone(), dash),
    };
    println!(
        "bench: mode={} nodes={} rust_per_min={:.0} rust_cpu_s={:.2} rust_rss_mib={:.1} go_per_min={gp} go_cpu_s={gc} go_rss_mib={gr} throughput_ratio={tr} rss_ratio={rr}",
        args.mode.name(),
        args.nodes,
        ours.per_min,
        ours.cpu_s,
        ours.rss_mib
    );
    Ok(())
}

/// The median of three or more figures.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Three runs without a policy and three with `policy`, alternating so that a change in the
/// machine's load falls on both; the medians and the loss in nodes a minute.
fn rego_policy_probe(args: &Args, bins: &Path, policy: &Path) -> Result<()> {
    let policy = std::fs::canonicalize(policy)
        .with_context(|| format!("cannot read rego policy {}", policy.display()))?;
    let yaml = format!("rego_policy: {}\n", policy.display());
    let (mut none, mut with) = (Vec::new(), Vec::new());
    for round in 1..=3 {
        let n = contender_with(args, bins, None, &format!("rust-no-policy-{round}"), "")?;
        let w = contender_with(
            args,
            bins,
            None,
            &format!("rust-rego-policy-{round}"),
            &yaml,
        )?;
        for (f, label) in [(&n, "no policy"), (&w, "rego policy")] {
            if f.provisioned < args.nodes || f.failures > 0.0 {
                bail!(
                    "{label} round {round}: {}/{} provisioned, {} failures",
                    f.provisioned,
                    args.nodes,
                    f.failures
                );
            }
        }
        none.push(n.per_min);
        with.push(w.per_min);
    }
    let (n, w) = (median(none.clone()), median(with.clone()));
    let loss = if n > 0.0 { (n - w) / n * 100.0 } else { 0.0 };
    println!(
        "bench: rego_policy mode={} nodes={} no_policy_per_min={n:.0} rego_policy_per_min={w:.0} loss_pct={loss:.1} runs_no_policy={none:.0?} runs_rego_policy={with:.0?}",
        args.mode.name(),
        args.nodes,
    );
    if loss > 10.0 {
        bail!("the rego_policy costs {loss:.1}% of the nodes a minute (at most 10%)");
    }
    Ok(())
}

/// Resident set size in bytes from /proc/<pid>/statm.
fn rss_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// The waiting-node memory probe: `n` nodes announce themselves while the one worker is stuck on
/// a helper that never answers, so every other node waits in the host table and the queue. The
/// provisioner's RSS growth divided by the nodes held is the cost of a waiting node.
fn waiting_probe(n: usize, bins: &Path) -> Result<()> {
    let dir = root().join("target/bench/waiting");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (_nats, url) = stack::start_nats(&dir)?;
    let hang = dir.join("hang.sh");
    std::fs::write(&hang, "#!/bin/sh\nexec sleep 3600\n")?;
    crate::tools::run(Command::new("chmod").arg("0755").arg(&hang))?;
    let files = stack::write_run_files(
        &dir,
        bins,
        &ProvisionerOptions {
            mode: Mode::Plain,
            workers: 1,
            helper: &hang.display().to_string(),
            broker: &url,
            identity: "provisioner",
            leader_election: false,
            // The node history holds every waiting node, so its cost is in the figure.
            extra_yaml: &format!("node_history_size: {}\n", n.max(1)),
        },
    )?;
    let mut prov = files.start_provisioner(
        &bins.join("choria-provisioner"),
        &url,
        &[],
        &dir.join("provisioner.out"),
    )?;
    // Let it connect, run its first (empty) discovery and settle.
    std::thread::sleep(Duration::from_secs(3));
    let pid = prov.pid();
    let before = rss_bytes(pid).context("cannot read the provisioner's RSS")?;
    let mut sim = Proc::spawn(
        "choria-fleet-sim",
        Command::new(bins.join("choria-fleet-sim"))
            .args([
                "--broker",
                &url,
                "--nodes",
                &n.to_string(),
                "--token",
                &files.token,
            ])
            .arg("--provisioning-signer")
            .arg(&files.signer_seed)
            .args(["--identity-prefix", "waiting", "--startup-rate", "20000"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("fleet-sim.log"))?),
    )?;
    let started = Instant::now();
    let mut held = 0.0;
    let mut last_change = Instant::now();
    while started.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(500));
        if prov.exited().is_some() || !sim.running() {
            bail!("a process exited during the probe; see {}", dir.display());
        }
        let now = prov.metric_sum("choria_provisioner_waiting_nodes");
        if now > held {
            held = now;
            last_change = Instant::now();
        }
        if held >= n as f64 - 1.0 || (held > 0.0 && last_change.elapsed() > Duration::from_secs(5))
        {
            break;
        }
    }
    let after = rss_bytes(pid).context("cannot read the provisioner's RSS")?;
    let peak = peak_rss_mib(pid).unwrap_or(0.0);
    let per_node = if held > 0.0 {
        after.saturating_sub(before) as f64 / held
    } else {
        0.0
    };
    // What the node history says it holds (counted from its allocations), included above.
    let history = prov
        .get("/api/v1/status")
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
        .map(|s| s["history"].clone())
        .unwrap_or_default();
    prov.proc.terminate(Duration::from_secs(5));
    println!(
        "bench: waiting nodes={n} held={held} rss_before_mib={:.1} rss_after_mib={:.1} peak_rss_mib={peak:.1} bytes_per_waiting_node={per_node:.0} history_nodes={} history_bytes_per_node={}",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        history["nodes"],
        history["bytes_per_node"],
    );
    Ok(())
}
