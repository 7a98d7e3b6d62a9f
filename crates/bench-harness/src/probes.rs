//! The benchmark's probes beside the plain run: a `rego_policy`'s cost and a flood of forged
//! startup events' (three runs without and three with, alternating), and the memory of nodes
//! waiting behind a stuck helper.

use std::path::Path;
use std::time::{Duration, Instant};

use test_support::stack::write_run_files;
use test_support::{Mode, ProcessGuard};

use crate::procfs::{peak_rss_mib, rss_bytes};
use crate::Result;
use crate::{
    bail, contender_with, median, run_dir, start_broker, Args, Error, Figures, HelperKind,
};

/// Three runs without a policy and three with `policy`, alternating so that a change in the
/// machine's load falls on both; the medians and the loss in nodes a minute.
pub fn rego_policy(args: &Args, bins: &Path, policy: &Path) -> Result<()> {
    let policy = std::fs::canonicalize(policy)
        .map_err(|e| Error::Failed(format!("cannot read rego policy {}: {e}", policy.display())))?;
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
pub const FLOOD_DOMAIN: &str = "flood.example.net";

/// Three runs without a flood and three with `forged` forged startup events beside the fleet,
/// alternating; the medians and the loss in nodes a minute (at most 20%).
pub fn forged(args: &Args, bins: &Path, forged: usize) -> Result<()> {
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
            test_support::workspace_root()
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

/// The waiting-node memory probe: `n` nodes announce themselves while the one worker is stuck on
/// a helper that never answers, so every other node waits in the host table and the queue. The
/// provisioner's RSS growth divided by the nodes held is the cost of a waiting node.
pub fn waiting(n: usize, bins: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let dir = run_dir("waiting")?;
    let (_nats, url) = start_broker(&dir, "")?;
    let hang = dir.join("hang.sh");
    std::fs::write(&hang, "#!/bin/sh\nexec sleep 3600\n")?;
    std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755))?;
    let files = write_run_files(&dir, bins)?;
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
    let rss =
        || rss_bytes(pid).ok_or_else(|| Error::Failed("cannot read the provisioner's RSS".into()));
    let before = rss()?;
    let log = dir.join("fleet-sim.log");
    let mut cmd = files.fleet_sim(bins, &url, n, Mode::Plain, "waiting", &log)?;
    let mut sim = ProcessGuard::spawn("choria-fleet-sim", cmd.args(["--startup-rate", "20000"]))?;
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
    let after = rss()?;
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
