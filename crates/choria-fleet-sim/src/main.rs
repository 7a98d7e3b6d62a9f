//! `choria-fleet-sim`: run a simulated fleet of go-choria servers in provisioning mode.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use choria_fleet_sim::config::{parse_duration, parse_share, Faults};
use choria_fleet_sim::crypto::JwtSigner;
use choria_fleet_sim::{FleetConfig, Mode, ProvisioningJwt, SimFleet};
use choria_rpc_client::protocol::ProtocolVersion;
use clap::Parser;

/// Thousands of simulated Choria servers in provisioning mode, in one process.
#[derive(Parser, Debug)]
#[command(name = "choria-fleet-sim", disable_version_flag = true)]
struct Cli {
    /// NATS broker URL(s), comma separated (also the provisioning JWT's `chu`).
    #[arg(long)]
    broker: String,
    /// Number of simulated nodes.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// What counts as provisioned: plain, pki or ed25519.
    #[arg(long, default_value = "plain")]
    mode: Mode,
    /// Protocol the nodes speak: v1 or v2.
    #[arg(long, default_value = "v1", value_parser = parse_protocol)]
    protocol: ProtocolVersion,
    /// Provisioning token (`cht`).
    #[arg(long)]
    token: String,
    /// Key signing the provisioning JWT: RSA PEM (RS256) or a 64-hex ed25519 seed (EdDSA).
    #[arg(long, required_unless_present = "provisioning_jwt")]
    provisioning_signer: Option<PathBuf>,
    /// Serve this provisioning JWT file verbatim, not one the simulator signs.
    #[arg(long, conflicts_with = "provisioning_signer")]
    provisioning_jwt: Option<PathBuf>,
    /// Verify received server JWTs against this issuer key (hex, or a file with hex or a PEM).
    #[arg(long)]
    issuer_public: Option<String>,
    /// With --issuer-public, verify the server JWT of one configure request in N (the first
    /// always); the others are decoded unchecked, as a real server writes its JWT unchecked.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..))]
    issuer_check_every: u64,
    /// Identities are `<prefix>-<n>.<domain>`.
    #[arg(long, default_value = "sim")]
    identity_prefix: String,
    /// Domain of generated identities.
    #[arg(long, default_value = "fleet.example.net")]
    domain: String,
    /// Server version reported by inventory and events.
    #[arg(long, default_value = "0.30.0")]
    version: String,
    /// Allow release_update (`update` claim, `upgradable` inventory).
    #[arg(long)]
    upgradable: bool,
    /// Write per-node JSON of what every node received here at exit.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Exit 0 as soon as every node is provisioned.
    #[arg(long)]
    exit_when_done: bool,
    /// Stop after this long (e.g. 5m); the exit status is 0 only if every node was provisioned.
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Delay between replying to restart/shutdown/release_update and acting on it.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    restart_delay: Duration,
    /// Provisioning lock duration.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    lock_window: Duration,
    /// Startup lifecycle events per second when the fleet starts (0: none).
    #[arg(long, default_value_t = 2000)]
    startup_rate: u32,
    /// Publish this many startup events for nodes that do not exist before the fleet's own
    /// (nine in ten named `bogus-<n>.<domain>`, the rest hostile identities).
    #[arg(long, default_value_t = 0)]
    bogus_events: usize,
    /// Publish lifecycle events in the Choria format, not as CloudEvents.
    #[arg(long)]
    legacy_lifecycle: bool,
    /// CSRs made at once (other requests are answered as they are read).
    #[arg(long, default_value_t = 64)]
    workers: usize,
    /// PEM file of RSA keys to make CSRs with (generated at start otherwise).
    #[arg(long)]
    rsa_keys: Option<PathBuf>,
    /// Number of RSA keys to generate when --rsa-keys is not given.
    #[arg(long, default_value_t = 4)]
    rsa_pool: usize,
    /// Connect with TLS without verifying the broker (as provisioning servers do).
    #[arg(long)]
    tls: bool,
    /// Verify the broker with this CA instead (implies TLS).
    #[arg(long)]
    tls_ca: Option<PathBuf>,
    /// NATS user for the provisioning connection (`chusr`).
    #[arg(long, requires = "nats_password")]
    nats_user: Option<String>,
    /// NATS password (`chpwd`).
    #[arg(long, requires = "nats_user")]
    nats_password: Option<String>,
    /// Do not send the provisioning JWT as the NATS auth token.
    #[arg(long)]
    no_token_auth: bool,
    /// Seconds between progress lines on stderr.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    progress: Duration,
    /// SHARE:DURATION — delay every reply of that share of nodes.
    #[arg(long, value_parser = Faults::parse_slow)]
    fault_slow: Option<(f64, Duration)>,
    /// SHARE — nodes that never answer RPCs (they are still discovered).
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_drop: f64,
    /// SHARE — nodes dropping the first reply to each provisioning action.
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_drop_once: f64,
    /// SHARE — nodes signing the wrong nonce in gen25519.
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_bad_nonce: f64,
    /// SHARE — nodes replying under another identity.
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_wrong_identity: f64,
    /// SHARE — nodes making CSRs for another common name.
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_bad_csr: f64,
    /// ACTION:SHARE — that action aborts on that share of nodes (repeatable).
    #[arg(long, value_parser = Faults::parse_fail_action)]
    fault_fail_action: Vec<(String, f64)>,
    /// SHARE — nodes making CSRs whose signature does not verify.
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_bad_csr_signature: f64,
    /// SHARE — nodes whose RPC replies are not JSON.
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_garbage: f64,
    /// SHARE — nodes sending every RPC reply twice.
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_duplicate: f64,
    /// SHARE — nodes whose RPC replies exceed 1 MiB (needs a broker max_payload above that).
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_oversize: f64,
    /// SHARE — nodes whose CSRs add a DNS name `<first label>.privileged.choria` (refused by
    /// the default cert_deny_list).
    #[arg(long, value_parser = parse_share, default_value_t = 0.0)]
    fault_denied_san: f64,
    /// Provisioned nodes stay connected as go-choria servers on the main collective of their
    /// configuration and answer discovery, rpcutil and choria_provision (reprovision) there.
    #[arg(long)]
    stay_online: bool,
    /// Fixed delay between answering reprovision and being back in provisioning mode
    /// (default: go-choria's random 2 to 11 s).
    #[arg(long, value_parser = parse_duration)]
    reprovision_delay: Option<Duration>,
    /// Start this many nodes (the first ones) already provisioned, on --main-collective.
    #[arg(long, default_value_t = 0, requires = "stay_online")]
    preprovisioned: usize,
    /// How long the credentials of nodes started provisioned are valid (e.g. 5d, 12h).
    #[arg(long, default_value = "5d", value_parser = parse_duration)]
    expires_in: Duration,
    /// Main collective of nodes started provisioned (default: choria in ed25519 mode,
    /// mcollective otherwise, as go-choria).
    #[arg(long)]
    main_collective: Option<String>,
}

fn parse_protocol(s: &str) -> Result<ProtocolVersion, String> {
    match s {
        "v1" | "1" => Ok(ProtocolVersion::V1),
        "v2" | "2" => Ok(ProtocolVersion::V2),
        _ => Err(format!("unknown protocol {s:?}, expected v1 or v2")),
    }
}

fn config(cli: &Cli) -> anyhow::Result<FleetConfig> {
    let jwt = match (&cli.provisioning_signer, &cli.provisioning_jwt) {
        (Some(signer), _) => {
            let data = std::fs::read(signer)
                .with_context(|| format!("cannot read {}", signer.display()))?;
            ProvisioningJwt::Sign(
                JwtSigner::from_key_data(&data)
                    .with_context(|| format!("invalid signer {}", signer.display()))?,
            )
        }
        (None, Some(file)) => ProvisioningJwt::Verbatim(
            std::fs::read_to_string(file)
                .with_context(|| format!("cannot read {}", file.display()))?,
        ),
        (None, None) => anyhow::bail!("--provisioning-signer or --provisioning-jwt is required"),
    };
    let mut cfg = FleetConfig::new(cli.broker.clone(), cli.nodes, cli.token.clone(), jwt);
    cfg.mode = cli.mode;
    cfg.protocol = cli.protocol;
    cfg.issuer_public = cli
        .issuer_public
        .as_deref()
        .map(choria_fleet_sim::crypto::verifier_from_hex_or_file)
        .transpose()
        .context("invalid --issuer-public")?;
    cfg.issuer_check_every = cli.issuer_check_every;
    cfg.identity_prefix = cli.identity_prefix.clone();
    cfg.domain = cli.domain.clone();
    cfg.version = cli.version.clone();
    cfg.upgradable = cli.upgradable;
    cfg.restart_delay = cli.restart_delay;
    cfg.lock_window = cli.lock_window;
    cfg.startup_rate = cli.startup_rate;
    cfg.bogus_events = cli.bogus_events;
    cfg.legacy_lifecycle = cli.legacy_lifecycle;
    cfg.workers = cli.workers;
    cfg.rsa_pool_size = cli.rsa_pool;
    cfg.rsa_keys_pem = cli
        .rsa_keys
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display())))
        .transpose()?;
    cfg.tls = cli.tls;
    cfg.tls_ca = cli.tls_ca.clone();
    cfg.nats_user = cli.nats_user.clone().zip(cli.nats_password.clone());
    cfg.token_auth = !cli.no_token_auth;
    cfg.faults = Faults {
        slow: cli.fault_slow,
        drop: cli.fault_drop,
        drop_once: cli.fault_drop_once,
        bad_nonce: cli.fault_bad_nonce,
        wrong_identity: cli.fault_wrong_identity,
        bad_csr: cli.fault_bad_csr,
        fail_action: cli.fault_fail_action.clone(),
        bad_csr_signature: cli.fault_bad_csr_signature,
        garbage: cli.fault_garbage,
        duplicate: cli.fault_duplicate,
        oversize: cli.fault_oversize,
        denied_san: cli.fault_denied_san,
    };
    cfg.stay_online = cli.stay_online;
    cfg.reprovision_delay = cli.reprovision_delay;
    cfg.preprovisioned = cli.preprovisioned;
    cfg.preprovisioned_expires_in = cli.expires_in;
    cfg.main_collective = cli.main_collective.clone();
    Ok(cfg)
}

/// Resolves on SIGTERM (never on platforms without it).
async fn terminated() {
    #[cfg(unix)]
    {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
            return;
        }
    }
    std::future::pending::<()>().await
}

fn progress_line(fleet: &SimFleet, started: Instant) -> String {
    let s = fleet.stats();
    format!(
        "fleet-sim: {:.0}s {}/{} provisioned, {} configured, {} broken, {} shut down, {} reprovisioned, {} requests, {} replies ({} discovery), {} ignored, {} events, {} reprovision requests, {} provisions",
        started.elapsed().as_secs_f64(),
        s.provisioned,
        s.nodes,
        s.configured,
        s.broken,
        s.shut_down,
        s.reprovisioned,
        s.requests,
        s.replies,
        s.discovery_replies,
        s.ignored,
        s.events,
        s.reprovision_requests,
        s.provisions
    )
}

/// How often `--exit-when-done` looks whether every node is provisioned: the exit comes at most
/// this late.
const DONE_CHECK: Duration = Duration::from_millis(20);

async fn run(cli: Cli) -> anyhow::Result<bool> {
    let cfg = config(&cli)?;
    let started = Instant::now();
    let fleet = SimFleet::start(cfg).await?;
    let n = fleet.len();
    eprintln!(
        "fleet-sim: {n} nodes up on {} ({:?}, {:?})",
        cli.broker, cli.mode, cli.protocol
    );
    let deadline = cli.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut progress = tokio::time::interval(cli.progress.max(Duration::from_millis(100)));
    progress.tick().await;
    // Created once: a signal arriving between two iterations of the loop below would be lost by
    // a stream created afresh in each of them.
    let term = terminated();
    tokio::pin!(term);
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut done_check = tokio::time::interval(DONE_CHECK);
    done_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let done = loop {
        if cli.exit_when_done && fleet.provisioned() >= n {
            break true;
        }
        let timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut interrupt => break fleet.provisioned() >= n,
            _ = &mut term => break fleet.provisioned() >= n,
            _ = timeout => {
                let all = fleet.provisioned() >= n;
                if !all {
                    eprintln!("fleet-sim: timed out");
                }
                break all;
            }
            _ = progress.tick() => eprintln!("{}", progress_line(&fleet, started)),
            // Looks at the count every DONE_CHECK: waking on every node's change cost the
            // simulator a thread wake-up (a system call and a context switch) twice a node.
            _ = done_check.tick(), if cli.exit_when_done => {},
        }
    };
    eprintln!("{}", progress_line(&fleet, started));
    if let Some(path) = &cli.report {
        let report = fleet.report();
        let text = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let provisioned = fleet.provisioned();
    fleet.shutdown().await;
    eprintln!("fleet-sim: {provisioned}/{n} nodes provisioned");
    // Success means every node was provisioned, however the run ended.
    Ok(done && provisioned >= n)
}

/// mimalloc, as the provisioner uses: every simulated request allocates and frees short-lived
/// buffers across the runtime's threads, where the C library's allocator is a noticeable share
/// of the simulator's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // As the provisioner does: resident memory follows what is used, not 2 MiB pages.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // One thread: a simulated request is a few tens of microseconds of work, and with two
    // workers waking each other the simulator spent a tenth of its CPU parking and unparking
    // (one thread answers 200,000 nodes a minute; RSA work runs on blocking threads). The
    // main task runs on it too, so nothing wakes another thread but a CSR.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleet-sim: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(run(cli));
    // Do not wait for work that cannot be interrupted (RSA key generation).
    rt.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("fleet-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}
