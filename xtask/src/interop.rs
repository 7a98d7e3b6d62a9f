//! `cargo xtask interop`: our provisioner against real go-choria servers.
//!
//! For each flow (plain, pki, ed25519, and a helper that supplies the private key), a real
//! Choria broker and five real `choria server` processes in provisioning mode are started on
//! loopback (`peers env`), and our `choria-provisioner` provisions them with the environment's
//! helper and the configuration files written for the Go provisioner. Each server must then have
//! rewritten its configuration as the helper said, published a `provisioned` lifecycle event,
//! and come back up out of provisioning mode, answering in its new collective.
//!
//! The `pki` flow's servers are set up as shipped for production (no configuration file, a
//! provisioning JWT that turns provisioning on, identities from host names in UTS namespaces),
//! and once provisioned they are rotated: `choria-provisioner rotate` sends each
//! `choria_provision#reprovision` as the admin, and each must come back provisioned with a new
//! certificate.
//!
//! The `go-deployment` flow runs the provisioner on files as a Go site has them: the YAML with
//! Go-style keys (`Helper:`, `Features:`) and YAML 1.1 booleans, logging to a file; a
//! `choria.cfg` with no security provider (so `puppet`, reading a Puppet-style ssldir as
//! `root.mcollective`, the name the Go package's root unit gives it) and no broker, found by SRV
//! records served by a real DNS server (dnsmasq) on loopback; and the site's helper signing CSRs
//! with a CA key only its owner can read.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use test_support::dns::{DnsServer, SrvRecord};
use test_support::go_env::{self, EnvOptions, GoEnv};
use test_support::provisioner::Launch;
use test_support::{Mode, ProcessGuard};

use crate::tools::root;

/// One interop scenario.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// x509, no CSR: the helper's configuration only.
    Plain,
    /// The servers' CSRs signed by the helper.
    Pki,
    /// ed25519 keys and server JWTs (protocol v2).
    Ed25519,
    /// The helper supplies the private key, encrypted for the server.
    Key,
    /// A Go site's files: Go-style YAML, puppet security, brokers by SRV, a log file.
    GoDeployment,
}

impl Flow {
    const ALL: [Flow; 5] = [
        Flow::Plain,
        Flow::Pki,
        Flow::Ed25519,
        Flow::Key,
        Flow::GoDeployment,
    ];

    fn name(self) -> &'static str {
        match self {
            Flow::Plain => "plain",
            Flow::Pki => "pki",
            Flow::Ed25519 => "ed25519",
            Flow::Key => "key",
            Flow::GoDeployment => "go-deployment",
        }
    }

    fn mode(self) -> Mode {
        match self {
            Flow::Plain | Flow::Key => Mode::Plain,
            Flow::Pki | Flow::GoDeployment => Mode::Pki,
            Flow::Ed25519 => Mode::Ed25519,
        }
    }
}

/// Run the flows in `wanted` (all when none).
pub fn main(wanted: &[Flow]) -> Result<()> {
    let servers = 5;
    crate::peers::build_choria()?;
    let bins = test_support::stack::build_binaries(false)?;
    let mut failed = Vec::new();
    for flow in Flow::ALL
        .into_iter()
        .filter(|f| wanted.is_empty() || wanted.contains(f))
    {
        let started = Instant::now();
        let dir = root().join("target/interop").join(flow.name());
        match run_flow(flow, &dir, &bins, servers) {
            Ok(()) => eprintln!(
                "interop: {}: {servers} real servers provisioned by choria-provisioner in {:.1}s",
                flow.name(),
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                eprintln!("interop: {}: FAILED: {e:#}", flow.name());
                failed.push(flow.name());
            }
        }
    }
    if !failed.is_empty() {
        bail!("interop flows failed: {failed:?} (logs under target/interop/)");
    }
    eprintln!("interop: every flow passed");
    Ok(())
}

fn run_flow(flow: Flow, dir: &Path, bins: &Path, servers: usize) -> Result<()> {
    if dir.exists() {
        let _ = go_env::stop(dir);
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot clean {}", dir.display()))?;
    }
    let opts = EnvOptions {
        dir: dir.to_path_buf(),
        servers,
        mode: flow.mode(),
        wait: true,
        default_provisioning: flow == Flow::Pki,
    };
    let env = GoEnv::start(&crate::peers::choria_bin(), &opts)?;
    let get = |k: &str| {
        env.get(k)
            .map(str::to_string)
            .with_context(|| format!("env.conf has no {k}"))
    };
    let choria = PathBuf::from(get("choria")?);
    let admin = PathBuf::from(get("admin_config")?);

    // Watch for the servers' `provisioned` events on the broker while we provision, in the
    // provisioning account where the servers publish them.
    let events_file = dir.join("provisioned-events.txt");
    let mut watch_cmd = go_env::cli(&choria);
    watch_cmd
        .args(["tool", "event", "--type", "provisioned", "--config"])
        .arg(get("client_config")?)
        .stdout(std::fs::File::create(&events_file)?)
        .stderr(Stdio::null());
    let _watch = ProcessGuard::spawn("choria tool event", &mut watch_cmd)?;
    std::thread::sleep(Duration::from_millis(500));

    let (yaml, cfg) = if flow == Flow::GoDeployment {
        go_site_files(&env, dir)?
    } else {
        (
            PathBuf::from(get("provisioner_config")?),
            PathBuf::from(get("client_config")?),
        )
    };
    let out = dir.join("choria-provisioner.out");
    let mut launch = Launch::new(
        "choria-provisioner",
        &bins.join("choria-provisioner"),
        &yaml,
        &cfg,
        &out,
    );
    launch.grace = Duration::from_secs(3);
    if flow == Flow::Key {
        launch.env.push(("HELPER_SUPPLY_KEY".into(), "1".into()));
    }
    // The Go site's brokers are found by SRV, served by a real DNS server on loopback.
    let _dns = if flow == Flow::GoDeployment {
        let port: u16 = get("broker_port")?.parse().context("broker_port")?;
        let dns = start_dns(port)?;
        let addr = dns.addr();
        // As systemd sets it for the packaged unit (User=root): the puppet provider's certname
        // is root.mcollective, as under the Go package.
        launch.env.push((DNS_SERVER_ENV.into(), addr));
        launch.env.push(("USER".into(), "root".into()));
        launch.env_remove = vec!["MCOLLECTIVE_CERTNAME".into(), "CHORIA_SRV_DOMAIN".into()];
        Some(dns)
    } else {
        None
    };
    let mut prov = launch.spawn()?;

    // Every server rewrites its configuration as the helper said.
    let server_dir = PathBuf::from(get("server_dir")?);
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut pending: Vec<&String> = env.identities.iter().collect();
    while !pending.is_empty() {
        if Instant::now() > deadline {
            bail!("not configured within 90s: {pending:?}");
        }
        if prov.exited().is_some() {
            bail!(
                "choria-provisioner exited; see {}",
                dir.join("choria-provisioner.out").display()
            );
        }
        pending.retain(|id| !configured(&server_dir.join(id).join("server.conf"), id));
        std::thread::sleep(Duration::from_millis(250));
    }
    // ...and comes back up out of provisioning mode, answering in its new collective.
    go_env::wait_for_servers(&choria, &admin, &env.identities, Duration::from_secs(60))
        .context("provisioned servers do not answer in their new collective")?;

    // What the flow adds beyond the configuration file.
    for id in &env.identities {
        let node = server_dir.join(id);
        match flow.mode() {
            Mode::Pki => {
                for f in ["certificate.pem", "ca.pem", "private.pem"] {
                    let p = node.join("ssl").join(f);
                    if !p.exists() {
                        bail!("{id}: {} missing after pki provisioning", p.display());
                    }
                }
            }
            Mode::Ed25519 => {
                for f in ["server.jwt", "server.seed"] {
                    if !node.join(f).exists() {
                        bail!("{id}: {f} missing after ed25519 provisioning");
                    }
                }
            }
            Mode::Plain if flow == Flow::Key => {
                let given = std::fs::read_to_string(
                    dir.join("provisioner/keys").join(format!("{id}.pem")),
                )?;
                let installed = std::fs::read_to_string(node.join("ssl/private.pem"))
                    .with_context(|| format!("{id}: no decrypted private.pem"))?;
                if modulus(&given)? != modulus(&installed)? {
                    bail!("{id}: the server's private.pem is not the key the helper supplied");
                }
            }
            Mode::Plain => {}
        }
    }
    if flow == Flow::GoDeployment {
        check_go_log(&dir.join("provisioner/go-site.log"), &env.identities)?;
    }

    // The servers announced it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = std::fs::read_to_string(&events_file).unwrap_or_default();
        let missing: Vec<&String> = env
            .identities
            .iter()
            .filter(|id| !seen.contains(id.as_str()))
            .collect();
        if missing.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("no provisioned lifecycle event seen from {missing:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    if flow == Flow::Pki {
        rotate(
            flow,
            dir,
            bins,
            &yaml,
            &cfg,
            &admin,
            &server_dir,
            &env.identities,
        )?;
        go_env::wait_for_servers(&choria, &admin, &env.identities, Duration::from_secs(60))
            .context("rotated servers do not answer in their collective")?;
    }
    prov.proc.terminate(Duration::from_secs(10));
    Ok(())
}

/// The credential a flow's server was enrolled with: its certificate (pki) or server JWT
/// (ed25519).
fn credential(flow: Flow, node: &Path) -> Result<String> {
    let file = match flow.mode() {
        Mode::Ed25519 => node.join("server.jwt"),
        _ => node.join("ssl/certificate.pem"),
    };
    std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))
}

/// A rotation campaign over the provisioned servers: `choria-provisioner rotate` sends each
/// `choria_provision#reprovision` on the main collective (as the admin), follows it back
/// through provisioning by the running provisioner, and exits 0 once every server is done;
/// each must then hold a new certificate or server JWT.
#[allow(clippy::too_many_arguments)]
fn rotate(
    flow: Flow,
    dir: &Path,
    bins: &Path,
    yaml: &Path,
    cfg: &Path,
    admin: &Path,
    server_dir: &Path,
    identities: &[String],
) -> Result<()> {
    let before: Vec<String> = identities
        .iter()
        .map(|id| credential(flow, &server_dir.join(id)))
        .collect::<Result<_>>()?;
    let list = dir.join("rotate.txt");
    std::fs::write(&list, identities.join("\n") + "\n")?;
    let started = Instant::now();
    let out = dir.join("rotate.out");
    let mut cmd = Command::new(bins.join("choria-provisioner"));
    cmd.arg("rotate")
        .arg("--config")
        .arg(yaml)
        .arg("--provisioner-choria-config")
        .arg(cfg)
        .arg("--choria-config")
        .arg(admin)
        .arg("--identities")
        .arg(&list)
        .args([
            "--rate",
            "600/min",
            "--max-in-flight",
            "5",
            "--node-timeout",
            "3m",
        ])
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(dir.join("rotate.err"))?);
    let mut child = ProcessGuard::spawn("choria-provisioner rotate", &mut cmd)?;
    let status = loop {
        if let Some(s) = child.exited() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(240) {
            bail!("rotate did not finish within 240s; see {}", out.display());
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if !status.success() {
        bail!(
            "rotate failed ({status}): {}{}",
            std::fs::read_to_string(&out).unwrap_or_default(),
            std::fs::read_to_string(dir.join("rotate.err")).unwrap_or_default()
        );
    }
    for (id, old) in identities.iter().zip(before) {
        let node = server_dir.join(id);
        if !configured(&node.join("server.conf"), id) {
            bail!("{id}: not configured again after the rotation");
        }
        if credential(flow, &node)? == old {
            bail!("{id}: the same credential after the rotation");
        }
    }
    eprintln!(
        "interop: {}: {} servers rotated (new {}) in {:.1}s",
        flow.name(),
        identities.len(),
        if flow.mode() == Mode::Ed25519 {
            "server JWT"
        } else {
            "certificate"
        },
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The environment variable pointing the provisioner's SRV lookups at a given DNS server
/// (`host:port`), documented with the broker settings (choria-rpc-client's
/// `brokers::DNS_SERVER_ENV`; xtask does not depend on the client).
const DNS_SERVER_ENV: &str = "CHORIA_PROVISIONER_DNS_SERVER";

/// The SRV domain of the Go site.
const SITE_DOMAIN: &str = "example.net";

/// The certname go-choria's puppet provider gives a client run by root (USER=root).
const ROOT_CERTNAME: &str = "root.mcollective";

/// The Go site's files, written beside the environment's: the provisioner YAML as a Go site
/// writes it and a `choria.cfg` naming neither a broker nor a security provider. Returns
/// (yaml, choria.cfg).
fn go_site_files(env: &GoEnv, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let get = |k: &str| {
        env.get(k)
            .map(str::to_string)
            .with_context(|| format!("env.conf has no {k}"))
    };
    let ssldir = env.puppet_ssldir(ROOT_CERTNAME)?;
    // The site's helper signs with a CA key only its owner can read.
    let ca_key = PathBuf::from(get("ca_key")?);
    std::fs::set_permissions(&ca_key, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", ca_key.display()))?;
    let pdir = dir.join("provisioner");
    let yaml = pdir.join("go-site.yaml");
    std::fs::write(
        &yaml,
        format!(
            "---\n\
             # refer to https://github.com/choria-io/provisioner for\n\
             # full details about the structure and contents of the config file\n\
             Workers: 4\n\
             Interval: 1m\n\
             logfile: {log}\n\
             loglevel: debug\n\
             Helper: {helper}\n\
             Token: {token}\n\
             choria_insecure: no\n\
             leader_election: no\n\
             Site: TEST\n\
             monitor_port: 0\n\
             broker_provisioning_password: {token}\n\
             JWT_Verify_Cert: {verify}\n\
             Features:\n  PKI: yes\n  JWT: on\n  ed25519: off\n",
            log = pdir.join("go-site.log").display(),
            helper = get("helper")?,
            token = get("token")?,
            verify = get("jwt_verify_cert")?,
        ),
    )?;
    // As the Go package installs it: readable by its owner (and group) only.
    std::fs::set_permissions(&yaml, std::fs::Permissions::from_mode(0o640))
        .with_context(|| format!("cannot restrict {}", yaml.display()))?;
    let cfg = pdir.join("go-site.cfg");
    std::fs::write(
        &cfg,
        format!(
            "# no plugin.security.provider (puppet) and no plugin.choria.middleware_hosts (SRV)\n\
             identity = provisioner.{SITE_DOMAIN}\n\
             loglevel = warn\n\
             plugin.choria.srv_domain = {SITE_DOMAIN}\n\
             plugin.choria.ssldir = {}\n",
            ssldir.display()
        ),
    )?;
    Ok((yaml, cfg))
}

/// A real DNS server (dnsmasq) on loopback serving the site's SRV record for the broker, with
/// target `localhost`, which the broker's certificate names.
fn start_dns(broker_port: u16) -> Result<DnsServer> {
    let record = SrvRecord::new(
        &format!("_mcollective-server._tcp.{SITE_DOMAIN}"),
        "localhost",
        broker_port,
    );
    DnsServer::start(&[record]).context(
        "the go-deployment flow finds its broker by SRV and needs dnsmasq (Debian's dnsmasq-base)",
    )
}

/// The log file a Go site names holds logrus-style JSON lines (each an object with `level` and
/// `msg`), as the Go provisioner writes them and log shippers parse them, with Go's
/// `Provisioned <identity>` at info for every server.
fn check_go_log(log: &Path, identities: &[String]) -> Result<()> {
    let text = std::fs::read_to_string(log)
        .with_context(|| format!("the provisioner wrote no {}", log.display()))?;
    if text.trim().is_empty() {
        bail!("{} is empty", log.display());
    }
    let mut lines = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: not a JSON line: {line}", log.display()))?;
        if !v["level"].is_string() || !v["msg"].is_string() {
            bail!("{}: a line without level or msg: {line}", log.display());
        }
        lines.push((v["level"].clone(), v["msg"].clone()));
    }
    for id in identities {
        let want = format!("Provisioned {id}");
        if !lines
            .iter()
            .any(|(level, msg)| level == "info" && *msg == want.as_str())
        {
            bail!("{}: no info line {want:?}", log.display());
        }
    }
    Ok(())
}

fn configured(conf: &Path, identity: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(conf) else {
        return false;
    };
    text.lines()
        .any(|l| l == "plugin.choria.server.provision=false")
        && text.lines().any(|l| l == format!("identity={identity}"))
}

/// The RSA modulus of a PEM private key, through the openssl command.
fn modulus(pem: &str) -> Result<String> {
    let dir = tempfile_dir()?;
    let f = dir.join("k.pem");
    std::fs::write(&f, pem)?;
    let out = Command::new("openssl")
        .args(["rsa", "-noout", "-modulus", "-in"])
        .arg(&f)
        .output()?;
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        bail!(
            "openssl cannot read the key: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = root()
        .join("target/interop/tmp")
        .join(format!("{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
