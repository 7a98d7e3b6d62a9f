//! `cargo xtask demo`: a local broker, a simulated fleet and the provisioner with the demo
//! helper (run per node, or serving webhooks with `--helper webhook`), with live progress and a
//! summary; then a rotation campaign over servers already provisioned (`--rotate N`).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bench_harness::HelperKind;
use test_support::metrics::metric_sum;
use test_support::stack::{self, RunFiles};
use test_support::{Mode, ProcessGuard};

use crate::tools::root;

/// `cargo xtask demo` flags.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Simulated servers.
    #[arg(long, default_value_t = 48)]
    nodes: usize,
    /// plain, pki or ed25519.
    #[arg(long, default_value = "plain")]
    mode: Mode,
    /// Give up after this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 180)]
    timeout: u64,
    /// How the provisioner asks the demo helper: exec (a process per node) or webhook (an
    /// HTTP POST per node to `choria-demo-helper serve`, signed with a shared secret).
    #[arg(long, value_enum, default_value_t = HelperKind::Exec)]
    helper: HelperKind,
    /// Then rotate this many servers that are already provisioned: `choria-provisioner
    /// rotate` sends them reprovision on the main collective and the provisioner provisions
    /// them again (0: no rotation).
    #[arg(long, default_value_t = 12)]
    rotate: usize,
}

/// Run the demo.
pub fn main(args: Args) -> Result<()> {
    eprintln!("demo: building the provisioner, the fleet simulator and the demo helper");
    let bins = stack::build_binaries(false)?;
    let dir = root().join("target/demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    // The broker takes TLS (a client certificate required) beside plain connections: the
    // operator of the rotation reaches the main collective over TLS, as go-choria clients do.
    let main = MainCollective::new(&dir)?;
    crate::tools::ensure_nats_server()?;
    let (nats, url) = bench_harness::start_broker(&dir, &main.broker_tls)?;
    main.point_at(nats.port())?;
    eprintln!("demo: nats-server with JetStream on {url}");
    let plan = match args.helper {
        HelperKind::Exec => None,
        HelperKind::Webhook => Some(test_support::webhook::WebhookPlan::new(&dir)?),
    };
    let helper = match &plan {
        None => bins.join("choria-demo-helper").display().to_string(),
        Some(p) => p.url.clone(),
    };
    let extra_yaml = plan.as_ref().map(|p| p.extra_yaml()).unwrap_or_default();
    let files = stack::write_run_files(&dir, &bins)?;
    let mut settings = files
        .provisioner(&dir, &url, &helper, args.mode)
        .yaml(&extra_yaml);
    settings.workers = 8;
    settings.pid_file = Some(dir.join("provisioner.pid"));
    let _webhook = match &plan {
        None => None,
        Some(p) => {
            let guard = p.start(&bins, &files, &url, &dir.join("webhook.log"))?;
            eprintln!("demo: the demo helper serves webhooks on {}", p.url);
            Some(guard)
        }
    };

    let report = dir.join("fleet-report.json");
    let sim_log = dir.join("fleet-sim.log");
    let mut sim_cmd = files.fleet_sim(&bins, &url, args.nodes, args.mode, "demo-node", &sim_log)?;
    sim_cmd.arg("--report").arg(&report).args([
        "--exit-when-done",
        "--timeout",
        &format!("{}s", args.timeout),
    ]);
    let mut sim = ProcessGuard::spawn("choria-fleet-sim", &mut sim_cmd)?;
    eprintln!(
        "demo: {} simulated servers in provisioning mode ({})",
        args.nodes,
        args.mode.name()
    );

    let started = Instant::now();
    let launch = settings.prepare(&bins.join("choria-provisioner"), &dir)?;
    let mut prov = launch.spawn()?;
    let metrics_url = format!("http://127.0.0.1:{}/metrics", prov.port);
    eprintln!("demo: provisioner started, metrics at {metrics_url}");

    let mut last = -1.0;
    let sim_status = loop {
        std::thread::sleep(Duration::from_millis(500));
        if let Ok(Some(st)) = sim.child.try_wait() {
            break st;
        }
        if prov.exited().is_some() {
            bail!("the provisioner exited early:\n{}", prov.output());
        }
        let metrics = prov.metrics();
        let done = metric_sum(&metrics, "choria_provisioner_provisioned");
        if done != last {
            let errors = metric_sum(&metrics, "choria_provisioner_provision_errors");
            let busy = metric_sum(&metrics, "choria_provisioner_busy_workers");
            eprintln!(
                "demo: [{:>5.1}s] provisioned {done}/{} errors {errors} busy workers {busy}",
                started.elapsed().as_secs_f64(),
                args.nodes
            );
            last = done;
        }
    };
    let elapsed = started.elapsed();
    let metrics = prov.metrics();
    let rotation = if args.rotate > 0 && sim_status.success() {
        Some(rotate(&args, &bins, &files, &url, &dir, &launch, &main)?)
    } else {
        None
    };
    let provisioned = metric_sum(&metrics, "choria_provisioner_provisioned");
    let errors = metric_sum(&metrics, "choria_provisioner_provision_errors");
    let sim_line = test_support::stack::sim_summary(&sim_log)
        .unwrap_or_else(|| "fleet-sim: (no summary)".into());
    prov.proc.terminate(Duration::from_secs(10));
    println!();
    println!("demo summary");
    println!("  mode          {}", args.mode.name());
    println!("  helper        {} ({helper})", args.helper.name());
    println!("  provisioned   {provisioned} of {}", args.nodes);
    println!("  failed        {errors} (provision errors; failed nodes are retried)");
    println!("  time          {:.1}s", elapsed.as_secs_f64());
    println!("  metrics       {metrics_url} (while it ran)");
    println!("  simulator     {sim_line}");
    if let Some(r) = &rotation {
        println!("  rotation      {r}");
    }
    println!("  files         {}", dir.display());
    if !sim_status.success() {
        bail!("the simulated fleet was not fully provisioned: {sim_line}");
    }
    Ok(())
}

/// The main collective's TLS: a CA, the broker's certificate and an operator's, and the
/// operator's Choria client configuration.
struct MainCollective {
    broker_tls: String,
    config: std::path::PathBuf,
}

impl MainCollective {
    fn new(dir: &std::path::Path) -> Result<MainCollective> {
        let ca_dir = dir.join("main-ca");
        std::fs::create_dir_all(&ca_dir)?;
        let main = test_support::ca::TestCa::new(&ca_dir)?.main_collective()?;
        let config = dir.join("main.cfg");
        std::fs::write(&config, &main.operator_config)?;
        Ok(MainCollective {
            broker_tls: main.broker_tls,
            config,
        })
    }

    fn point_at(&self, port: u16) -> Result<()> {
        let mut text = std::fs::read_to_string(&self.config)?;
        text.push_str(&format!(
            "plugin.choria.middleware_hosts = 127.0.0.1:{port}\n"
        ));
        std::fs::write(&self.config, text)?;
        Ok(())
    }
}

/// Servers already provisioned, online on the main collective, rotated by `choria-provisioner
/// rotate`: each is sent reprovision, comes back into provisioning and is provisioned again.
fn rotate(
    args: &Args,
    bins: &std::path::Path,
    files: &RunFiles,
    url: &str,
    dir: &std::path::Path,
    launch: &test_support::provisioner::Launch,
    main: &MainCollective,
) -> Result<String> {
    let n = args.rotate;
    let log = dir.join("rotated-sim.log");
    let mut cmd = files.fleet_sim(bins, url, n, Mode::Plain, "rotated-node", &log)?;
    cmd.args(["--stay-online", "--preprovisioned", &n.to_string()])
        .args([
            "--reprovision-delay",
            "200ms",
            "--main-collective",
            "mcollective",
        ]);
    let _sim = ProcessGuard::spawn("choria-fleet-sim (provisioned)", &mut cmd)?;
    eprintln!("demo: {n} servers already provisioned on the main collective; rotating them");
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    let status = std::process::Command::new(bins.join("choria-provisioner"))
        .arg("rotate")
        .arg("--config")
        .arg(&launch.config)
        .arg("--provisioner-choria-config")
        .arg(&launch.choria_config)
        .arg("--choria-config")
        .arg(&main.config)
        .args(["--filter", "identity=/^rotated-node-/"])
        .args(["--rate", "1200/min", "--max-in-flight", "8"])
        .status()?;
    if !status.success() {
        bail!("the rotation campaign failed ({status}); see rotate status");
    }
    Ok(format!(
        "{n} provisioned servers sent reprovision and provisioned again in {:.1}s",
        started.elapsed().as_secs_f64()
    ))
}
