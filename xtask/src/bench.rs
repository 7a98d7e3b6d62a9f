//! `cargo xtask bench`: provisioning throughput and cost, optionally side by side with the Go
//! provisioner on an identical fresh fleet.
//!
//! Measured from provisioner start until the simulator reports every node provisioned: wall time,
//! nodes per minute, provisioner CPU seconds (user+sys from /proc), provisioner peak RSS (VmHWM),
//! the helper's share of the provisioner's busy time, failures, the simulator's own CPU and peak
//! RSS, and the simulator's provisioned count over time (for `--plot`). `--helper` picks the
//! process helper, the webhook helper or both for our provisioner; the Go provisioner always runs
//! the process helper, the only one it has. `--runs N` alternates the contenders N times and
//! reports medians.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::demo::HelperKind;
use crate::stack::{self, Mode, Proc};
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
    /// Give up after this many seconds (default: 600, or 1.2 ms a node when that is longer, so a
    /// million nodes get 20 minutes).
    #[arg(long, value_name = "S")]
    timeout: Option<u64>,
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
    /// Instead: three runs of the fleet without and three with N forged startup events
    /// published beside it (a second simulator announcing nodes that do not exist, as anyone
    /// holding a provisioning JWT can), alternating; prints the medians and the loss in nodes a
    /// minute, and fails above 20%.
    #[arg(long, value_name = "N")]
    forged_events: Option<usize>,
    /// Instead: active-active scaling on a three-server cluster, one replica then R; prints
    /// the ratio last (bench_replicas.rs).
    #[arg(long, value_name = "R")]
    replicas: Option<usize>,
    /// The helper's latency per node in --replicas runs, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    helper_delay: u64,
    /// Workers per replica in --replicas runs.
    #[arg(long, value_name = "N", default_value_t = 8)]
    replica_workers: usize,
    /// The helper of our provisioner: exec (a process per node), webhook (the demo helper's
    /// server mode over HTTP), or both, comma separated (each is a contender).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "exec")]
    helper: Vec<HelperKind>,
    /// Run every contender this many times, alternating, and report the medians.
    #[arg(long, value_name = "N", default_value_t = 1)]
    runs: usize,
    /// Draw the nodes provisioned over time of every contender (its median run) into this SVG.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Use the binaries already built (release, or debug with --debug-build) instead of
    /// building them first.
    #[arg(long)]
    no_build: bool,
    /// The process helper's program: the statically linked demo helper in release runs
    /// (`stack::static_helper`), else the demo helper beside the other binaries.
    #[arg(skip)]
    process_helper: Option<PathBuf>,
}

impl Args {
    /// `--timeout`, or its default: 600 s, or 1.2 ms a node when that is longer.
    fn timeout_s(&self) -> u64 {
        self.timeout
            .unwrap_or_else(|| (self.nodes as u64).saturating_mul(12) / 10_000)
            .max(if self.timeout.is_some() { 1 } else { 600 })
    }
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
    /// The simulator's CPU seconds and peak RSS over the same time.
    pub sim_cpu_s: f64,
    pub sim_rss_mib: f64,
    /// (seconds since the provisioner started, nodes provisioned) as the simulator reported
    /// them.
    pub series: Vec<(f64, f64)>,
    /// Where the machine's CPU went over the same time: the broker, the helper (process
    /// helpers the provisioner waited for, or the webhook server), and the whole machine.
    pub broker_cpu_s: f64,
    pub helper_cpu_s: f64,
    pub machine_busy_s: f64,
}

/// USER_HZ on Linux: the unit of /proc's CPU times.
const TICKS: f64 = 100.0;

/// Fields of /proc/<pid>/stat after the command name (which is in parentheses and may contain
/// spaces): index 11 is utime, 12 stime, 13 cutime, 14 cstime.
fn stat_fields(pid: u32) -> Option<Vec<f64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0.0))
            .collect(),
    )
}

/// user+sys CPU seconds of a process from /proc/<pid>/stat.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    Some((f.get(11)? + f.get(12)?) / TICKS)
}

/// user+sys CPU seconds of a process's children that it has waited for (its process helpers).
fn children_cpu_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(pid)?;
    Some((f.get(13)? + f.get(14)?) / TICKS)
}

/// CPU seconds the whole machine has been busy (every state but idle and iowait), from the
/// first line of /proc/stat.
fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let f: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let total: f64 = f.iter().sum();
    Some((total - f.get(3)? - f.get(4)?) / TICKS)
}

/// Peak resident set size in MiB from /proc/<pid>/status.
fn peak_rss_mib(pid: u32) -> Option<f64> {
    status_mib(pid, "VmHWM:")
}

/// A memory figure of /proc/<pid>/status (`VmHWM:`, `VmRSS:`) in MiB.
fn status_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// How often a run prints where it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// One progress line of a long run: nodes provisioned, the provisioner's memory now and at
/// its peak, its CPU, what it holds (queue, waiting nodes) and the replies it dropped; the
/// simulator's memory. Where the peak comes from is read off these lines.
fn progress(label: &str, elapsed: Duration, sim_log: &Path, pid: u32, sim_pid: u32, metrics: &str) {
    let mib = |pid, field| status_mib(pid, field).map_or("-".into(), |v| format!("{v:.1}"));
    let gauge = |name| format!("{:.0}", stack::metric_sum(metrics, name));
    eprintln!(
        "bench: {label}: {:.0}s: {} provisioned; provisioner rss {} MiB (peak {}), cpu {:.1}s, queue {}, waiting {}, discovered {}, dropped replies {}; simulator rss {} MiB",
        elapsed.as_secs_f64(),
        sim_progress(sim_log).unwrap_or(0),
        mib(pid, "VmRSS:"),
        mib(pid, "VmHWM:"),
        cpu_seconds(pid).unwrap_or(0.0),
        gauge("choria_provisioner_work_queue_entries"),
        gauge("choria_provisioner_waiting_nodes"),
        gauge("choria_provisioner_discovered"),
        gauge("choria_provisioner_dropped_messages"),
        mib(sim_pid, "VmRSS:"),
    );
}

/// Run one contender (`go_bin` None = ours) against a fresh fleet.
fn contender(
    args: &Args,
    bins: &Path,
    go_bin: Option<&Path>,
    helper: HelperKind,
    label: &str,
) -> Result<Figures> {
    contender_with(args, bins, go_bin, helper, label, "", 0)
}

/// The simulator's provisioned count from its latest progress line in `log`.
fn sim_progress(log: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .find_map(test_support::simulator::progress_provisioned)
}

/// [`contender`] with more provisioner YAML, and `forged` startup events of nodes that do not
/// exist published beside the fleet from the provisioner's start.
fn contender_with(
    args: &Args,
    bins: &Path,
    go_bin: Option<&Path>,
    helper: HelperKind,
    label: &str,
    extra_yaml: &str,
    forged: usize,
) -> Result<Figures> {
    let dir = root().join("target/bench").join(label);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (nats, url) = stack::start_nats(&dir)?;
    let workers = if args.workers == 0 { 64 } else { args.workers };
    let webhook = match helper {
        HelperKind::Exec => None,
        HelperKind::Webhook => Some(test_support::webhook::WebhookPlan::new(&dir)?),
    };
    let helper_cmd = match &webhook {
        None => args
            .process_helper
            .clone()
            .unwrap_or_else(|| bins.join("choria-demo-helper"))
            .display()
            .to_string(),
        Some(w) => w.url.clone(),
    };
    let extra_yaml = match &webhook {
        None => extra_yaml.to_string(),
        Some(w) => format!("{}{extra_yaml}", w.extra_yaml()),
    };
    let files = stack::write_run_files(&dir, bins)?;
    let mut settings = files
        .provisioner(&dir, &url, &helper_cmd, args.mode)
        .yaml(&extra_yaml);
    settings.workers = workers;
    let webhook_server = match &webhook {
        None => None,
        Some(w) => Some(w.start(bins, &files, &url, &dir.join("webhook.log"))?),
    };
    let sim_log = dir.join("fleet-sim.log");
    let mut sim_cmd = files.fleet_sim(bins, &url, args.nodes, args.mode, "bench", &sim_log)?;
    sim_cmd.args([
        "--exit-when-done",
        "--timeout",
        &format!("{}s", args.timeout_s()),
        "--restart-delay",
        "0s",
        // Progress five times a second: the curve of --plot.
        "--progress",
        "200ms",
        // A real server writes the server JWT it is sent unchecked: the simulator checks one
        // in a hundred (a wrong key or chain still fails the run), not the cost of every one.
        "--issuer-check-every",
        "100",
    ]);
    let mut sim = Proc::spawn("choria-fleet-sim", &mut sim_cmd)?;
    let sim_pid = sim.pid();
    // Let the fleet come up and announce itself before the clock starts.
    std::thread::sleep(Duration::from_secs(2));
    let sim_cpu_before = cpu_seconds(sim_pid).unwrap_or(0.0);
    let broker_pid = nats.pid();
    let broker_cpu = || broker_pid.and_then(cpu_seconds).unwrap_or(0.0);
    let webhook_pid = webhook_server.as_ref().map(Proc::pid);
    let webhook_cpu = || webhook_pid.and_then(cpu_seconds).unwrap_or(0.0);
    let broker_before = broker_cpu();
    let webhook_before = webhook_cpu();
    let machine_before = machine_busy_seconds().unwrap_or(0.0);

    let program: PathBuf = go_bin
        .map(Path::to_path_buf)
        .unwrap_or_else(|| bins.join("choria-provisioner"));
    let launch = settings.prepare(&program, &dir)?;
    let started = Instant::now();
    let mut prov = launch.spawn()?;
    let pid = prov.pid();
    // The flood: one simulator whose only real node is announced after every forged one. Its
    // names are in a domain of their own, which it answers for (so each forged name it
    // announces reaches a worker and is left unanswered until the timeout, the costlier case
    // for the provisioner), while it is not sent the fleet's own requests.
    let _flood = if forged > 0 {
        let mut cmd =
            files.fleet_sim(bins, &url, 1, args.mode, "forged", &dir.join("flood.log"))?;
        cmd.args([
            "--bogus-events",
            &forged.to_string(),
            "--startup-rate",
            "1",
            "--domain",
            FLOOD_DOMAIN,
        ]);
        Some(Proc::spawn("choria-fleet-sim (flood)", &mut cmd)?)
    } else {
        None
    };
    let mut peak = 0.0f64;
    let mut cpu = 0.0f64;
    let mut sim_peak = 0.0f64;
    let mut sim_cpu = sim_cpu_before;
    let mut children_cpu = 0.0f64;
    let mut series = vec![(0.0, 0.0)];
    let mut next_report = PROGRESS_EVERY;
    let status = loop {
        std::thread::sleep(Duration::from_millis(200));
        if let Some(r) = peak_rss_mib(pid) {
            peak = peak.max(r);
        }
        if started.elapsed() >= next_report {
            next_report += PROGRESS_EVERY;
            progress(
                label,
                started.elapsed(),
                &sim_log,
                pid,
                sim_pid,
                &prov.metrics(),
            );
        }
        if let Some(c) = cpu_seconds(pid) {
            cpu = c;
        }
        if let Some(c) = children_cpu_seconds(pid) {
            children_cpu = c;
        }
        if let Some(r) = peak_rss_mib(sim_pid) {
            sim_peak = sim_peak.max(r);
        }
        if let Some(c) = cpu_seconds(sim_pid) {
            sim_cpu = c;
        }
        if let Some(n) = sim_progress(&sim_log) {
            series.push((started.elapsed().as_secs_f64(), n as f64));
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
    let machine_busy = machine_busy_seconds().unwrap_or(0.0) - machine_before;
    let broker_cpu_s = broker_cpu() - broker_before;
    let helper_cpu_s = children_cpu + webhook_cpu() - webhook_before;
    let metrics = prov.metrics();
    prov.proc.terminate(Duration::from_secs(10));
    let sim_line = test_support::stack::sim_summary(&sim_log).unwrap_or_default();
    let provisioned = sim_line
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.split('/').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    series.push((wall.as_secs_f64(), provisioned as f64));
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
        sim_cpu_s: sim_cpu - sim_cpu_before,
        sim_rss_mib: sim_peak,
        series,
        broker_cpu_s,
        helper_cpu_s,
        machine_busy_s: machine_busy,
    };
    eprintln!(
        "bench: {label}: {}/{} provisioned in {:.2}s = {:.0}/min, cpu {:.2}s, peak rss {:.1} MiB, helper share {:.0}%, failures {}, dropped replies {}, simulator cpu {:.2}s, simulator peak rss {:.1} MiB",
        f.provisioned,
        args.nodes,
        f.wall.as_secs_f64(),
        f.per_min,
        f.cpu_s,
        f.rss_mib,
        f.helper_share * 100.0,
        f.failures,
        stack::metric_sum(&metrics, "choria_provisioner_dropped_messages"),
        f.sim_cpu_s,
        f.sim_rss_mib,
    );
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let named = f.cpu_s + f.sim_cpu_s + f.broker_cpu_s + f.helper_cpu_s;
    eprintln!(
        "bench: {label}: machine cpu {:.2}s busy of {:.2}s ({cores} cores x wall): provisioner {:.2}s, simulator {:.2}s, broker {:.2}s, helper {:.2}s, everything else {:.2}s",
        f.machine_busy_s,
        cores as f64 * f.wall.as_secs_f64(),
        f.cpu_s,
        f.sim_cpu_s,
        f.broker_cpu_s,
        f.helper_cpu_s,
        (f.machine_busy_s - named).max(0.0),
    );
    Ok(f)
}

/// One contender's runs.
struct Contender {
    /// Its name in the plot's legend.
    legend: String,
    /// `go_bin` for the Go provisioner, else ours.
    go: bool,
    helper: HelperKind,
    runs: Vec<Figures>,
}

impl Contender {
    /// The run with the median throughput (the one drawn), with the median of every figure.
    fn median(&self) -> Figures {
        let pick = |f: fn(&Figures) -> f64| median(self.runs.iter().map(f).collect());
        let per_min = pick(|f| f.per_min);
        let middle = self
            .runs
            .iter()
            .min_by(|a, b| {
                (a.per_min - per_min)
                    .abs()
                    .total_cmp(&(b.per_min - per_min).abs())
            })
            .cloned()
            .unwrap_or_default();
        Figures {
            per_min,
            cpu_s: pick(|f| f.cpu_s),
            rss_mib: pick(|f| f.rss_mib),
            helper_share: pick(|f| f.helper_share),
            failures: pick(|f| f.failures),
            sim_cpu_s: pick(|f| f.sim_cpu_s),
            sim_rss_mib: pick(|f| f.sim_rss_mib),
            broker_cpu_s: pick(|f| f.broker_cpu_s),
            helper_cpu_s: pick(|f| f.helper_cpu_s),
            machine_busy_s: pick(|f| f.machine_busy_s),
            ..middle
        }
    }
}

/// Run the benchmark.
pub fn main(mut args: Args) -> Result<()> {
    let debug = args.debug_build;
    let profile = if debug { "debug" } else { "release" };
    let bins = if args.no_build {
        test_support::workspace_root().join("target").join(profile)
    } else {
        eprintln!("bench: {profile} build");
        stack::build_binaries(!debug)?
    };
    if let Some(n) = args.waiting {
        return waiting_probe(n, &bins);
    }
    if !debug && args.helper.contains(&HelperKind::Exec) {
        match stack::static_helper(!args.no_build) {
            Ok(path) => {
                eprintln!(
                    "bench: process helper: {} (statically linked)",
                    path.display()
                );
                args.process_helper = Some(path);
            }
            Err(e) if args.no_build => {
                eprintln!("bench: process helper: the dynamically linked demo helper ({e})")
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(policy) = &args.rego_policy {
        return rego_policy_probe(&args, &bins, policy);
    }
    if let Some(n) = args.forged_events {
        return forged_probe(&args, &bins, n);
    }
    if let Some(replicas) = args.replicas {
        return crate::bench_replicas::main(
            &bins,
            replicas,
            args.helper_delay,
            args.nodes,
            args.replica_workers,
            Duration::from_secs(args.timeout_s()),
        );
    }
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let mut helpers = args.helper.clone();
    helpers.dedup();
    let mut contenders: Vec<Contender> = helpers
        .iter()
        .map(|&h| Contender {
            legend: format!("choria-provisioner (Rust), {} helper", h.name()),
            go: false,
            helper: h,
            runs: Vec::new(),
        })
        .collect();
    let go_bin = if args.vs_go || args.go_bin.is_some() {
        contenders.push(Contender {
            legend: "Go provisioner, exec helper".into(),
            go: true,
            helper: HelperKind::Exec,
            runs: Vec::new(),
        });
        Some(match &args.go_bin {
            Some(p) => p.clone(),
            None => {
                crate::peers::build_provisioner()?;
                crate::peers::provisioner_bin()
            }
        })
    } else {
        None
    };
    for round in 1..=args.runs {
        for c in &mut contenders {
            let who = if c.go {
                "go".to_string()
            } else {
                format!("rust-{}", c.helper.name())
            };
            let label = if args.runs > 1 {
                format!("{who}-{round}")
            } else {
                who
            };
            let go = if c.go { go_bin.as_deref() } else { None };
            c.runs.push(contender(&args, &bins, go, c.helper, &label)?);
        }
    }
    let go = contenders.iter().find(|c| c.go).map(Contender::median);
    if let Some(path) = &args.plot {
        let lines: Vec<crate::plot::Line> = contenders
            .iter()
            .map(|c| crate::plot::Line {
                label: c.legend.clone(),
                points: c.median().series,
            })
            .collect();
        let title = format!(
            "{} nodes, {} mode: nodes provisioned over time",
            args.nodes,
            args.mode.name()
        );
        crate::plot::draw(path, &title, &lines)?;
        eprintln!("bench: plot written to {}", path.display());
    }
    for c in contenders.iter().filter(|c| !c.go) {
        let ours = c.median();
        if args.runs > 1 {
            eprintln!(
                "bench: medians of {} runs, {} helper: {:.0}/min, cpu {:.2}s, peak rss {:.1} MiB, simulator cpu {:.2}s, simulator peak rss {:.1} MiB, broker cpu {:.2}s, helper cpu {:.2}s, machine busy {:.2}s; runs {:.0?}/min, cpu {:.2?}s",
                args.runs,
                c.helper.name(),
                ours.per_min,
                ours.cpu_s,
                ours.rss_mib,
                ours.sim_cpu_s,
                ours.sim_rss_mib,
                ours.broker_cpu_s,
                ours.helper_cpu_s,
                ours.machine_busy_s,
                c.runs.iter().map(|f| f.per_min).collect::<Vec<_>>(),
                c.runs.iter().map(|f| f.cpu_s).collect::<Vec<_>>(),
            );
        }
        println!("{}", last_line(&args, &ours, go.as_ref(), c.helper));
    }
    Ok(())
}

/// The closing line of a run: our figures (medians), the Go provisioner's when it ran, and
/// the helper ours used.
fn last_line(args: &Args, ours: &Figures, go: Option<&Figures>, helper: HelperKind) -> String {
    let dash = "-".to_string();
    let (gp, gc, gr, tr, rr) = match go {
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
    // CPU microseconds per node of each process of the run: the daemon's is the headline, since
    // nodes a minute also measures the simulator, the broker and the box.
    let us = |cpu_s: f64| cpu_s * 1e6 / (args.nodes.max(1) as f64);
    format!(
        "bench: mode={} nodes={} daemon_us_per_node={:.0} sim_us_per_node={:.0} broker_us_per_node={:.0} helper_us_per_node={:.0} rust_per_min={:.0} rust_cpu_s={:.2} rust_rss_mib={:.1} go_per_min={gp} go_cpu_s={gc} go_rss_mib={gr} throughput_ratio={tr} rss_ratio={rr} helper={}",
        args.mode.name(),
        args.nodes,
        us(ours.cpu_s),
        us(ours.sim_cpu_s),
        us(ours.broker_cpu_s),
        us(ours.helper_cpu_s),
        ours.per_min,
        ours.cpu_s,
        ours.rss_mib,
        helper.name()
    )
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
    let (none, with) = alternate(
        args,
        bins,
        ("no-policy", "", 0),
        ("rego-policy", &yaml, 0),
        true,
    )?;
    let (none, with): (Vec<f64>, Vec<f64>) = (
        none.iter().map(|f| f.per_min).collect(),
        with.iter().map(|f| f.per_min).collect(),
    );
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

/// Three runs of contender `a` and three of `b` (label, extra YAML, forged events), alternating so
/// that a change in the machine's load falls on both; fails when a run leaves nodes
/// unprovisioned (or, with `no_failures`, counts a failure).
fn alternate(
    args: &Args,
    bins: &Path,
    a: (&str, &str, usize),
    b: (&str, &str, usize),
    no_failures: bool,
) -> Result<(Vec<Figures>, Vec<Figures>)> {
    let helper = args.helper.first().copied().unwrap_or(HelperKind::Exec);
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for round in 1..=3 {
        for ((label, yaml, forged), runs) in [(a, &mut ra), (b, &mut rb)] {
            let f = contender_with(
                args,
                bins,
                None,
                helper,
                &format!("rust-{label}-{round}"),
                yaml,
                forged,
            )?;
            if f.provisioned < args.nodes || (no_failures && f.failures > 0.0) {
                bail!(
                    "{label} round {round}: {}/{} provisioned, {} failures",
                    f.provisioned,
                    args.nodes,
                    f.failures
                );
            }
            runs.push(f);
        }
    }
    Ok((ra, rb))
}

/// The domain of the flood's forged node names.
const FLOOD_DOMAIN: &str = "flood.example.net";

/// Three runs without a flood and three with `forged` forged startup events beside the fleet,
/// alternating; the medians and the loss in nodes a minute (at most 20%).
fn forged_probe(args: &Args, bins: &Path, forged: usize) -> Result<()> {
    let (a, b) = alternate(
        args,
        bins,
        ("no-flood", "", 0),
        ("flood", "", forged),
        false,
    )?;
    let figures = |v: &[Figures], f: fn(&Figures) -> f64| v.iter().map(f).collect::<Vec<f64>>();
    let (none, with) = (figures(&a, |f| f.per_min), figures(&b, |f| f.per_min));
    let (cpu_none, cpu_with) = (figures(&a, |f| f.cpu_s), figures(&b, |f| f.cpu_s));
    let (n, w) = (median(none.clone()), median(with.clone()));
    let loss = if n > 0.0 { (n - w) / n * 100.0 } else { 0.0 };
    // The flood must add no log line per forged event: the lines of a flooded run that name the
    // flood's domain (every line about a forged node names it; the fleet's own lines vary from
    // run to run with how many of its nodes discovery finds before their startup events do).
    let flood_lines = |label: String| {
        std::fs::read(
            root()
                .join("target/bench")
                .join(label)
                .join("provisioner.log"),
        )
        .map(|b| {
            b.split(|&c| c == b'\n')
                .filter(|l| {
                    l.windows(FLOOD_DOMAIN.len())
                        .any(|w| w == FLOOD_DOMAIN.as_bytes())
                })
                .count()
        })
        .unwrap_or(0)
    };
    let most_flood_lines = (1..=3)
        .map(|r| flood_lines(format!("rust-flood-{r}")))
        .max()
        .unwrap_or(0);
    println!(
        "bench: forged_events={forged} mode={} nodes={} no_flood_per_min={n:.0} flood_per_min={w:.0} loss_pct={loss:.1} daemon_cpu_s_no_flood={:.2} daemon_cpu_s_flood={:.2} flood_log_lines={most_flood_lines} runs_no_flood={none:.0?} runs_flood={with:.0?}",
        args.mode.name(),
        args.nodes,
        median(cpu_none),
        median(cpu_with),
    );
    if most_flood_lines > forged / 1000 + 100 {
        bail!("a flooded run wrote {most_flood_lines} log lines naming {FLOOD_DOMAIN}: the flood is logged per event");
    }
    if loss > 20.0 {
        bail!("{forged} forged startup events cost {loss:.1}% of the fleet's nodes a minute (at most 20%)");
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
    let files = stack::write_run_files(&dir, bins)?;
    let mut settings = files
        .provisioner(&dir, &url, &hang.display().to_string(), Mode::Plain)
        // The queue is sized to the fleet, as an operator sizes it: announced nodes may fill
        // half of it, so it is twice the fleet. The node history keeps its default size (its
        // own cost a node is printed apart, from the status API).
        .yaml(&format!("work_queue_size: {}\n", n.max(1) * 2));
    settings.workers = 1;
    let mut prov = settings.start(&bins.join("choria-provisioner"), &dir)?;
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
    while started.elapsed() < Duration::from_secs(300 + (n / 5000) as u64) {
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
