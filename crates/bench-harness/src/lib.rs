//! The benchmark harness of `cargo xtask bench`: provisioning throughput and cost on loopback,
//! optionally side by side with the Go provisioner on an identical fresh fleet.
//!
//! Measured from provisioner start until the simulator reports every node provisioned: wall time,
//! nodes per minute, provisioner CPU seconds (user+sys from /proc), provisioner peak RSS (VmHWM),
//! the helper's share of the provisioner's busy time, failures, the simulator's own CPU and peak
//! RSS, and over time the simulator's provisioned count and the provisioner's RSS (VmRSS), for
//! `--plot` ([`plot`]). `--helper` picks the process helper, the webhook helper or both for our
//! provisioner; the Go provisioner always runs the process helper, the only one it has. `--runs
//! N` alternates the contenders N times and reports medians. The probes beside the plain run are
//! in `probes`, the active-active scaling run in `replicas`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use test_support::metrics::metric_sum;
use test_support::stack::{build_binaries, static_helper, write_run_files};
use test_support::{Mode, NatsServer, ProcessGuard};

use crate::procfs::{
    children_cpu_seconds, cpu_seconds, machine_busy_seconds, peak_rss_mib, rss_mib, status_mib,
};

pub mod plot;
mod probes;
mod procfs;
mod replicas;

pub(crate) use test_support::bail;
/// What a benchmark run fails with: the tooling's step error, shared with packaging.
pub use test_support::step::{Error, Result};

/// How the provisioner asks its helper in a local run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HelperKind {
    /// The demo helper run as a process for every node.
    #[default]
    Exec,
    /// The demo helper's server mode, POSTed to for every node.
    Webhook,
}

impl HelperKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            HelperKind::Exec => "exec",
            HelperKind::Webhook => "webhook",
        }
    }
}

/// nats-server with JetStream in `dir` on a free port, its log in `dir`, with `extra` added to
/// its configuration (TLS, say), and its URL. Simulator reports and large fleets need big
/// messages, so it takes 4 MB ones.
pub fn start_broker(dir: &Path, extra: &str) -> Result<(NatsServer, String)> {
    let nats = NatsServer::start_in_free_port(dir, &format!("max_payload: 4MB\n{extra}"), true)?;
    let url = nats.url();
    Ok((nats, url))
}

/// The run's directory under `target/bench`, emptied.
fn run_dir(label: &str) -> Result<PathBuf> {
    let dir = test_support::workspace_root()
        .join("target/bench")
        .join(label);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

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
    pub vs_go: bool,
    /// The Go provisioner to run (implies --vs-go).
    #[arg(long, value_name = "PATH")]
    pub go_bin: Option<PathBuf>,
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
    /// the ratio last.
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
    /// Draw the nodes provisioned and the provisioner's resident memory over time of every
    /// contender (its median run) into this SVG, one panel each.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Use the binaries already built (release, or debug with --debug-build); build
    /// nothing first.
    #[arg(long)]
    no_build: bool,
    /// The process helper's program: the statically linked demo helper in release runs
    /// (`test_support::stack::static_helper`), else the demo helper beside the other binaries.
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
    /// (seconds since the provisioner started, its resident MiB), read at the same times.
    pub rss_series: Vec<(f64, f64)>,
    /// Where the machine's CPU went over the same time: the broker, the helper (process
    /// helpers the provisioner waited for, or the webhook server), and the whole machine.
    pub broker_cpu_s: f64,
    pub helper_cpu_s: f64,
    pub machine_busy_s: f64,
}

/// How often a run prints where it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(30);

/// One progress line of a long run: nodes provisioned, the provisioner's memory now and at
/// its peak, its CPU, what it holds (queue, waiting nodes) and the replies it dropped; the
/// simulator's memory. Where the peak comes from is read off these lines.
fn progress(label: &str, elapsed: Duration, sim_log: &Path, pid: u32, sim_pid: u32, metrics: &str) {
    let mib = |pid, field| status_mib(pid, field).map_or("-".into(), |v| format!("{v:.1}"));
    let gauge = |name| format!("{:.0}", metric_sum(metrics, name));
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
    let dir = run_dir(label)?;
    let (nats, url) = start_broker(&dir, "")?;
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
    let files = write_run_files(&dir, bins)?;
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
    let mut sim = ProcessGuard::spawn("choria-fleet-sim", &mut sim_cmd)?;
    let sim_pid = sim.pid();
    // Let the fleet come up and announce itself before the clock starts.
    std::thread::sleep(Duration::from_secs(2));
    let sim_cpu_before = cpu_seconds(sim_pid).unwrap_or(0.0);
    let broker_pid = nats.pid();
    let broker_cpu = || broker_pid.and_then(cpu_seconds).unwrap_or(0.0);
    let webhook_pid = webhook_server.as_ref().map(ProcessGuard::pid);
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
            probes::FLOOD_DOMAIN,
        ]);
        Some(ProcessGuard::spawn("choria-fleet-sim (flood)", &mut cmd)?)
    } else {
        None
    };
    let mut peak = 0.0f64;
    let mut cpu = 0.0f64;
    let mut sim_peak = 0.0f64;
    let mut sim_cpu = sim_cpu_before;
    let mut children_cpu = 0.0f64;
    let mut series = vec![(0.0, 0.0)];
    let mut rss_series = Vec::new();
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
        let now = started.elapsed().as_secs_f64();
        if let Some(n) = sim_progress(&sim_log) {
            series.push((now, n as f64));
        }
        if let Some(r) = rss_mib(pid) {
            rss_series.push((now, r));
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
    let helper_s = metric_sum(&metrics, "choria_provisioner_helper_time_sum");
    let rpc_s = metric_sum(&metrics, "choria_provisioner_rpc_time_sum");
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
        failures: metric_sum(&metrics, "choria_provisioner_provision_errors"),
        provisioned,
        sim_cpu_s: sim_cpu - sim_cpu_before,
        sim_rss_mib: sim_peak,
        series,
        rss_series,
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
        metric_sum(&metrics, "choria_provisioner_dropped_messages"),
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

/// Runs the benchmark `args` ask for (`cargo xtask bench`). The Go provisioner, when asked
/// for, is `args.go_bin`, which the caller provides (xtask builds it).
pub fn bench(mut args: Args) -> Result<()> {
    let debug = args.debug_build;
    let profile = if debug { "debug" } else { "release" };
    let bins = if args.no_build {
        test_support::workspace_root().join("target").join(profile)
    } else {
        eprintln!("bench: {profile} build");
        build_binaries(!debug)?
    };
    if let Some(n) = args.waiting {
        return probes::waiting(n, &bins);
    }
    if !debug && args.helper.contains(&HelperKind::Exec) {
        match static_helper(!args.no_build) {
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
        return probes::rego_policy(&args, &bins, policy);
    }
    if let Some(n) = args.forged_events {
        return probes::forged(&args, &bins, n);
    }
    if let Some(replicas) = args.replicas {
        let scaling = replicas::Scaling {
            bins: &bins,
            helper_delay_ms: args.helper_delay,
            nodes: args.nodes,
            workers: args.replica_workers,
            timeout: Duration::from_secs(args.timeout_s()),
        };
        return replicas::run(&scaling, replicas);
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
        Some(args.go_bin.clone().ok_or_else(|| {
            Error::Failed("--vs-go: no Go provisioner given (--go-bin PATH)".into())
        })?)
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
        let lines: Vec<plot::Line> = contenders
            .iter()
            .map(|c| {
                let run = c.median();
                plot::Line {
                    label: c.legend.clone(),
                    provisioned: run.series,
                    rss_mib: run.rss_series,
                }
            })
            .collect();
        let title = format!("{} nodes, {} mode", args.nodes, args.mode.name());
        plot::draw(path, &title, &lines)?;
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
