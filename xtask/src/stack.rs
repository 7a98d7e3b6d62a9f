//! A local provisioning stack on loopback: nats-server with JetStream, the fleet simulator and the
//! provisioner with a helper. Shared by `demo` and `bench`; every process is killed when its
//! guard drops, so an error or Ctrl-C leaves nothing running.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::tools::{self, root, run};

/// A child process killed (SIGTERM, then SIGKILL) when dropped.
pub struct Proc {
    pub name: &'static str,
    pub child: Child,
}

impl Proc {
    /// Spawn `cmd`, naming it for messages.
    pub fn spawn(name: &'static str, cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name}: {cmd:?}"))?;
        Ok(Proc { name, child })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ask the process to stop with SIGTERM and wait up to `grace` before killing it.
    pub fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if let Ok(Some(st)) = self.child.try_wait() {
            return Some(st);
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "xtask: {} did not stop within {grace:?}, killing it",
            self.name
        );
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(3));
    }
}

/// A free loopback port.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Start nats-server with JetStream in `dir`, waiting until it accepts connections.
pub fn start_nats(dir: &Path) -> Result<(Proc, String)> {
    let port = free_port()?;
    let proc = start_nats_on(dir, port)?;
    Ok((proc, format!("nats://127.0.0.1:{port}")))
}

/// nats-server with JetStream in `dir` on a chosen port, so a restart keeps the address; its
/// log is appended to across restarts.
pub fn start_nats_on(dir: &Path, port: u16) -> Result<Proc> {
    let bin = tools::ensure_nats_server()?;
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\nmax_payload: 4MB\njetstream {{\n  store_dir: \"{}\"\n}}\n",
            dir.join("jetstream").display()
        ),
    )?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("nats-server.log"))?;
    let proc = Proc::spawn(
        "nats-server",
        Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(log),
    )?;
    wait_port(port, Duration::from_secs(15)).context("nats-server did not start")?;
    Ok(proc)
}

/// Wait until something listens on `port`.
pub fn wait_port(port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    bail!("nothing listens on 127.0.0.1:{port} after {timeout:?}")
}

/// Build the stack's binaries (`release` for benchmarks) and return the directory holding them.
pub fn build_binaries(release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root()).args(["build", "--quiet"]);
    if release {
        cmd.arg("--release");
    }
    cmd.args([
        "-p",
        "choria-provisioner",
        "-p",
        "choria-fleet-sim",
        "-p",
        "choria-demo-helper",
    ]);
    run(&mut cmd)?;
    Ok(root()
        .join("target")
        .join(if release { "release" } else { "debug" }))
}

/// Enrollment mode of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Pki,
    Ed25519,
}

impl Mode {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "plain" | "jwt" => Mode::Plain,
            "pki" => Mode::Pki,
            "ed25519" => Mode::Ed25519,
            other => bail!("unknown mode {other:?}: plain, pki or ed25519"),
        })
    }
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Pki => "pki",
            Mode::Ed25519 => "ed25519",
        }
    }
}

/// The files of one run: signer, CA, configurations.
pub struct RunFiles {
    pub signer_seed: PathBuf,
    pub signer_pub: String,
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub provisioner_yaml: PathBuf,
    pub choria_cfg: PathBuf,
    pub monitor_port: u16,
    pub token: String,
}

/// Options for the provisioner's YAML.
pub struct ProvisionerOptions<'a> {
    pub mode: Mode,
    pub workers: usize,
    pub helper: &'a str,
    pub broker: &'a str,
    pub identity: &'a str,
    pub leader_election: bool,
    pub extra_yaml: &'a str,
}

/// A new ed25519 signer in `dir` (`signer.seed`, `signer.pub`, made by the demo helper); returns
/// its public key in hex.
pub fn init_signer(bins: &Path, dir: &Path) -> Result<String> {
    std::fs::create_dir_all(dir)?;
    let out = Command::new(bins.join("choria-demo-helper"))
        .arg("init-signer")
        .arg(dir)
        .output()
        .context("init-signer")?;
    if !out.status.success() {
        bail!(
            "init-signer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Write the signer, CA and both configuration files for a run into `dir`.
pub fn write_run_files(dir: &Path, bins: &Path, opts: &ProvisionerOptions<'_>) -> Result<RunFiles> {
    std::fs::create_dir_all(dir)?;
    let helper_bin = bins.join("choria-demo-helper");
    let signer_pub = init_signer(bins, dir)?;
    run(Command::new(&helper_bin)
        .arg("init-ca")
        .arg(dir)
        .stdout(Stdio::null()))?;
    let token = "s3cret-demo-token".to_string();
    let monitor_port = free_port()?;
    let features = match opts.mode {
        Mode::Plain => "  jwt: true\n",
        Mode::Pki => "  jwt: true\n  pki: true\n",
        Mode::Ed25519 => "  jwt: true\n  ed25519: true\n",
    };
    let signing = if opts.mode == Mode::Ed25519 {
        format!("jwt_signing_key: {}\n", dir.join("signer.seed").display())
    } else {
        String::new()
    };
    let yaml = format!(
        "# generated by cargo xtask for a local run\n\
         workers: {workers}\n\
         interval: 1m\n\
         logfile: {log}\n\
         loglevel: info\n\
         helper: {helper}\n\
         token: {token}\n\
         site: {site}\n\
         choria_insecure: true\n\
         monitor_port: {monitor_port}\n\
         jwt_verify_cert: {signer_pub}\n\
         {signing}\
         leader_election: {le}\n\
         cert_deny_list:\n  - \"\\\\.privileged\\\\.choria$\"\n\
         features:\n{features}{extra}",
        workers = opts.workers,
        log = dir.join(format!("{}.log", opts.identity)).display(),
        helper = opts.helper,
        site = "local",
        le = opts.leader_election,
        extra = opts.extra_yaml,
    );
    let provisioner_yaml = dir.join(format!("{}.yaml", opts.identity));
    std::fs::write(&provisioner_yaml, yaml)?;
    let choria_cfg = dir.join(format!("{}.cfg", opts.identity));
    std::fs::write(
        &choria_cfg,
        format!(
            "identity = {}\nplugin.choria.middleware_hosts = {}\nplugin.choria.use_srv = false\nplugin.security.provider = file\n",
            opts.identity, opts.broker
        ),
    )?;
    Ok(RunFiles {
        signer_seed: dir.join("signer.seed"),
        signer_pub,
        ca_cert: dir.join("ca.pem"),
        ca_key: dir.join("ca-key.pem"),
        provisioner_yaml,
        choria_cfg,
        monitor_port,
        token,
    })
}

/// The provisioner's `/metrics` page on loopback `port` (empty when it cannot be reached).
pub fn scrape_all(port: u16) -> String {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// The sum of every sample of metric `name` (all label sets) in a scrape.
pub fn metric_sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl RunFiles {
    /// The fleet simulator's command for this run: broker, size, mode, token, identity prefix,
    /// the provisioning-JWT signer and, in ed25519 mode, the issuer key server JWTs are checked
    /// against; its progress goes to `log`. Callers add the run's own switches.
    pub fn fleet_sim(
        &self,
        bins: &Path,
        url: &str,
        nodes: usize,
        mode: Mode,
        prefix: &str,
        log: &Path,
    ) -> Result<Command> {
        let mut cmd = Command::new(bins.join("choria-fleet-sim"));
        cmd.args([
            "--broker",
            url,
            "--nodes",
            &nodes.to_string(),
            "--mode",
            mode.name(),
        ])
        .args(["--token", &self.token, "--identity-prefix", prefix])
        .arg("--provisioning-signer")
        .arg(&self.signer_seed)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?);
        if mode == Mode::Ed25519 {
            cmd.args(["--issuer-public", &self.signer_pub]);
        }
        Ok(cmd)
    }

    /// `program run --config <yaml> --choria-config <cfg>` for this run (the provisioner, or a
    /// compatible one given by path).
    pub fn provisioner_command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.arg("run")
            .arg("--config")
            .arg(&self.provisioner_yaml)
            .arg("--choria-config")
            .arg(&self.choria_cfg);
        cmd
    }

    /// The environment the demo helper reads (brokers, CA, issuer), set on the provisioner so
    /// its helper inherits it.
    pub fn helper_env<'c>(&self, cmd: &'c mut Command, url: &str) -> &'c mut Command {
        cmd.env("CHORIA_BROKERS", url)
            .env("CHORIA_CA_CERT", &self.ca_cert)
            .env("CHORIA_CA_KEY", &self.ca_key)
            .env("CHORIA_ISSUER", &self.signer_pub)
    }
}
