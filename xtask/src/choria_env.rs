//! A real-Choria environment on loopback: a test CA, a Choria broker with its provisioning
//! account, and provisioning-mode `choria server` processes, all under one directory.
//!
//! Everything the environment writes is under `--dir`; `DIR/env.conf` lists the facts a test
//! needs (`key = value`, one a line) and `DIR/pids` the process ids `stop` kills.

use std::fmt::Write as _;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::tools::run;

/// The provisioning token (`cht`) and the broker's provisioning password.
pub const TOKEN: &str = "s3cret";

/// The NATS user of the provisioning account's provisioner.
pub const PROVISIONER_USER: &str = "provisioner";

/// The identity (and certificate CN) of the provisioner's client.
pub const PROVISIONER_IDENTITY: &str = "provisioner.mcollective";

/// How the environment provisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// x509 / protocol v1, insecure provisioning, the provisioner verifies the JWT.
    Plain,
    /// As `Plain`, and the provisioner config turns on CSRs (`features.pki`).
    Pki,
    /// Issuer-based protocol v2 (not built yet).
    Ed25519,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Pki => "pki",
            Mode::Ed25519 => "ed25519",
        }
    }
}

/// Options of `peers env`.
#[derive(Clone, Debug)]
pub struct EnvOptions {
    /// Directory for every file and log; created when missing.
    pub dir: PathBuf,
    /// How many provisioning-mode servers to start.
    pub servers: usize,
    /// The provisioning flavour.
    pub mode: Mode,
    /// Wait until every server answers a ping in the `provisioning` collective.
    pub wait: bool,
}

impl EnvOptions {
    /// Parse `--dir DIR [--servers N] [--mode plain|pki|ed25519] [--no-wait]`.
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut dir = None;
        let mut servers = 3;
        let mut mode = Mode::Plain;
        let mut wait = true;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--dir" => dir = Some(PathBuf::from(it.next().context("--dir needs a value")?)),
                "--servers" => {
                    servers = it
                        .next()
                        .context("--servers needs a value")?
                        .parse()
                        .context("--servers needs a number")?;
                }
                "--mode" => {
                    mode = match it.next().map(String::as_str) {
                        Some("plain") => Mode::Plain,
                        Some("pki") => Mode::Pki,
                        Some("ed25519") => Mode::Ed25519,
                        other => bail!("--mode must be plain, pki or ed25519, not {other:?}"),
                    }
                }
                "--no-wait" => wait = false,
                other => bail!("peers env: unknown argument {other}"),
            }
        }
        let dir = dir.context("peers env: --dir DIR is required")?;
        Ok(Self {
            dir,
            servers,
            mode,
            wait,
        })
    }
}

/// A started environment.
#[derive(Debug)]
pub struct Env {
    /// The identities of the servers, in start order.
    pub identities: Vec<String>,
    facts: Vec<(&'static str, String)>,
}

impl Env {
    /// The `env.conf` text: one `key = value` a line.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (key, value) in &self.facts {
            let _ = writeln!(out, "{key} = {value}");
        }
        out
    }
}

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl")?;
    if !out.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Make `<name>-key.pem` and `<name>-cert.pem` in `pki`, signed by the test CA, with the given
/// common name and subject alternative names.
fn leaf_cert(pki: &Path, name: &str, cn: &str, sans: &str) -> Result<()> {
    let ext = pki.join(format!("{name}.ext"));
    write(
        &ext,
        &format!(
            "basicConstraints = critical,CA:FALSE\n\
             keyUsage = critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage = serverAuth,clientAuth\n\
             subjectAltName = {sans}\n"
        ),
    )?;
    let key = format!("{name}-key.pem");
    let csr = format!("{name}.csr");
    let cert = format!("{name}-cert.pem");
    let ext = format!("{name}.ext");
    openssl(
        pki,
        &[
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    )?;
    openssl(
        pki,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAserial",
            "ca.srl",
            "-CAcreateserial",
            "-days",
            "30",
            "-sha256",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ],
    )
}

/// Start a long-running process in its own process group, output to `log`, and record its pid.
fn spawn(dir: &Path, name: &str, cmd: &mut Command, log: &Path) -> Result<u32> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let pid = child.id();
    let mut pids = std::fs::read_to_string(dir.join("pids")).unwrap_or_default();
    let _ = writeln!(pids, "{pid} {name}");
    write(&dir.join("pids"), &pids)?;
    Ok(pid)
}

fn wait_for_port(port: u16, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the broker did not listen on 127.0.0.1:{port} within {within:?}")
}

/// Generate every file and start the broker and the servers.
pub fn start(choria: &Path, opts: &EnvOptions) -> Result<Env> {
    if opts.mode == Mode::Ed25519 {
        bail!("peers env: the ed25519 mode is not built yet");
    }
    std::fs::create_dir_all(&opts.dir)?;
    let dir = opts
        .dir
        .canonicalize()
        .with_context(|| format!("resolving {}", opts.dir.display()))?;
    if dir.join("pids").exists() {
        bail!(
            "{} already holds a running environment (stop it first)",
            dir.display()
        );
    }
    let d = |rel: &str| dir.join(rel).display().to_string();
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki)?;

    // The CA, the broker's and the provisioner's certificates, the provisioning JWT signer.
    openssl(
        &pki,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "30",
            "-sha256",
            "-subj",
            "/CN=choria-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
        ],
    )?;
    leaf_cert(&pki, "broker", "localhost", "DNS:localhost,IP:127.0.0.1")?;
    leaf_cert(
        &pki,
        "provisioner",
        PROVISIONER_IDENTITY,
        &format!("DNS:{PROVISIONER_IDENTITY}"),
    )?;
    openssl(&pki, &["genrsa", "-out", "prov-signer-key.pem", "2048"])?;
    openssl(
        &pki,
        &[
            "rsa",
            "-in",
            "prov-signer-key.pem",
            "-pubout",
            "-out",
            "prov-signer.pem",
        ],
    )?;

    let port = free_port()?;
    let url = format!("nats://127.0.0.1:{port}");

    // The provisioning JWT: insecure (chs false), not provisioning by default (chpd false), since
    // each server's own config file switches provisioning on and keeps its identity.
    let jwt = dir.join("provisioning.jwt");
    run(Command::new(choria)
        .args(["jwt", "prov"])
        .arg(&jwt)
        .arg(pki.join("prov-signer-key.pem"))
        .args(["--token", TOKEN, "--urls", &url]))?;

    // The broker.
    let broker_dir = dir.join("broker");
    std::fs::create_dir_all(broker_dir.join("streams"))?;
    let broker_conf = broker_dir.join("broker.conf");
    write(
        &broker_conf,
        &format!(
            "identity = broker.example.net\n\
             loglevel = info\n\
             plugin.choria.broker_network = true\n\
             plugin.choria.network.listen_address = 127.0.0.1\n\
             plugin.choria.network.client_port = {port}\n\
             plugin.choria.use_srv = false\n\
             plugin.security.provider = file\n\
             plugin.security.file.certificate = {pki}/broker-cert.pem\n\
             plugin.security.file.key = {pki}/broker-key.pem\n\
             plugin.security.file.ca = {pki}/ca.pem\n\
             plugin.choria.network.provisioning.client_password = {TOKEN}\n\
             plugin.choria.network.provisioning.signer_cert = {pki}/prov-signer.pem\n\
             plugin.choria.network.stream.store = {streams}\n\
             plugin.choria.network.stream.event_replicas = 1\n\
             plugin.choria.network.stream.machine_replicas = 1\n\
             plugin.choria.network.stream.advisory_replicas = 1\n\
             plugin.choria.network.stream.leader_election_replicas = 1\n\
             plugin.choria.network.stream.executor_replicas = 1\n",
            pki = pki.display(),
            streams = broker_dir.join("streams").display(),
        ),
    )?;
    spawn(
        &dir,
        "broker",
        Command::new(choria)
            .args(["broker", "run", "--config"])
            .arg(&broker_conf)
            .current_dir(&broker_dir),
        &broker_dir.join("broker.log"),
    )?;
    wait_for_port(port, Duration::from_secs(60))?;

    // The servers: each has a config file that keeps its identity and switches provisioning on,
    // with the file security provider pointing at an existing (CA-signed) certificate, since the
    // provider is validated before provisioning starts.
    let mut identities = Vec::new();
    for n in 1..=opts.servers {
        let identity = format!("node{n}.example.net");
        let sdir = dir.join("servers").join(&identity);
        let boot = sdir.join("boot");
        std::fs::create_dir_all(&boot)?;
        leaf_cert(&pki, &identity, &identity, &format!("DNS:{identity}"))?;
        std::fs::rename(
            pki.join(format!("{identity}-cert.pem")),
            boot.join("cert.pem"),
        )?;
        std::fs::rename(
            pki.join(format!("{identity}-key.pem")),
            boot.join("key.pem"),
        )?;
        let conf = sdir.join("server.conf");
        write(
            &conf,
            &format!(
                "identity = {identity}\n\
                 loglevel = info\n\
                 plugin.choria.server.provision = true\n\
                 plugin.choria.use_srv = false\n\
                 plugin.security.provider = file\n\
                 plugin.security.file.certificate = {boot}/cert.pem\n\
                 plugin.security.file.key = {boot}/key.pem\n\
                 plugin.security.file.ca = {pki}/ca.pem\n",
                boot = boot.display(),
                pki = pki.display(),
            ),
        )?;
        // A copy of the initial file, as the server rewrites server.conf when configured.
        std::fs::copy(&conf, sdir.join("server.conf.initial"))?;
        spawn(
            &dir,
            &identity,
            Command::new(choria)
                .args(["server", "run", "--config"])
                .arg(&conf)
                .current_dir(&sdir)
                .env("CHORIA_PROVISION_JWT", &jwt)
                .env_remove("MCOLLECTIVE_CERTNAME"),
            &sdir.join("server.log"),
        )?;
        identities.push(identity);
    }

    // The provisioner side: a client config, a helper and a Go provisioner config.
    let pdir = dir.join("provisioner");
    std::fs::create_dir_all(&pdir)?;
    let client_conf = pdir.join("client.conf");
    write(
        &client_conf,
        &format!(
            "identity = {PROVISIONER_IDENTITY}\n\
             collectives = provisioning\n\
             main_collective = provisioning\n\
             loglevel = warn\n\
             plugin.choria.middleware_hosts = {url}\n\
             plugin.choria.use_srv = false\n\
             plugin.security.provider = file\n\
             plugin.security.file.certificate = {pki}/provisioner-cert.pem\n\
             plugin.security.file.key = {pki}/provisioner-key.pem\n\
             plugin.security.file.ca = {pki}/ca.pem\n\
             plugin.nats.user = {PROVISIONER_USER}\n\
             plugin.nats.pass = {TOKEN}\n",
            pki = pki.display(),
        ),
    )?;
    let helper = pdir.join("helper.py");
    write(&helper, &helper_script(&dir, &url))?;
    run(Command::new("chmod").arg("0755").arg(&helper))?;
    let prov_yaml = pdir.join("provisioner.yaml");
    write(
        &prov_yaml,
        &format!(
            "workers: 4\n\
             interval: 1m\n\
             logfile: {log}\n\
             loglevel: debug\n\
             helper: {helper}\n\
             token: {TOKEN}\n\
             site: test\n\
             broker_provisioning_password: {TOKEN}\n\
             jwt_verify_cert: {pki}/prov-signer.pem\n\
             features:\n  jwt: true\n  pki: {pki_on}\n",
            log = pdir.join("provisioner.log").display(),
            helper = helper.display(),
            pki = pki.display(),
            pki_on = opts.mode == Mode::Pki,
        ),
    )?;

    let facts = vec![
        ("mode", opts.mode.name().to_string()),
        ("dir", dir.display().to_string()),
        ("choria", choria.display().to_string()),
        ("broker_url", url.clone()),
        ("broker_port", port.to_string()),
        ("tls_ca", d("pki/ca.pem")),
        ("tls_cert", d("pki/provisioner-cert.pem")),
        ("tls_key", d("pki/provisioner-key.pem")),
        ("nats_user", PROVISIONER_USER.to_string()),
        ("nats_password", TOKEN.to_string()),
        ("token", TOKEN.to_string()),
        ("collective", "provisioning".to_string()),
        ("provisioning_jwt", jwt.display().to_string()),
        ("jwt_verify_cert", d("pki/prov-signer.pem")),
        ("jwt_signer_key", d("pki/prov-signer-key.pem")),
        ("ca_key", d("pki/ca-key.pem")),
        ("client_config", client_conf.display().to_string()),
        ("provisioner_config", prov_yaml.display().to_string()),
        ("helper", helper.display().to_string()),
        ("servers", identities.join(",")),
        ("server_dir", d("servers")),
    ];
    let env = Env { identities, facts };
    write(&dir.join("env.conf"), &env.describe())?;

    if opts.wait {
        wait_for_servers(
            choria,
            &client_conf,
            &env.identities,
            Duration::from_secs(90),
        )?;
    }
    Ok(env)
}

/// Ping the `provisioning` collective with the real CLI until every identity answers.
fn wait_for_servers(
    choria: &Path,
    client_conf: &Path,
    identities: &[String],
    within: Duration,
) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut missing: Vec<&String> = identities.iter().collect();
    while Instant::now() < deadline {
        let out = Command::new(choria)
            .args(["ping", "--config"])
            .arg(client_conf)
            .args([
                "-T",
                "provisioning",
                "--names",
                "--timeout",
                "2",
                "--expect",
            ])
            .arg(identities.len().to_string())
            .output()
            .context("running choria ping")?;
        let text = String::from_utf8_lossy(&out.stdout);
        missing.retain(|id| !text.contains(id.as_str()));
        if missing.is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("servers not answering in the provisioning collective: {missing:?}")
}

/// The sample helper: configures each server for the `mcollective` collective with the file
/// provider. With a CSR (pki) it signs it with the test CA and points the server at the files
/// `configure` writes; otherwise at the certificate the environment made for the node.
fn helper_script(dir: &Path, url: &str) -> String {
    let dir = dir.display();
    format!(
        r#"#!/usr/bin/env python3
# Sample provisioning helper for the test environment in {dir}.
import json, os, subprocess, sys, tempfile

DIR = "{dir}"
node = json.load(sys.stdin)
identity = node["identity"]
reply = {{"defer": False, "msg": "configured by the test helper", "certificate": "", "ca": "",
          "ssldir": "", "key": "", "configuration": {{}}, "server_claims": {{}}}}
conf = {{
    "identity": identity,
    "plugin.choria.server.provision": "false",
    "plugin.choria.middleware_hosts": "{url}",
    "plugin.choria.use_srv": "false",
    "plugin.security.provider": "file",
    "loglevel": "info",
}}
csr = node.get("csr")
if csr:
    ssldir = csr["ssldir"]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "req.csr"), "w") as f:
            f.write(csr["csr"])
        with open(os.path.join(tmp, "ext"), "w") as f:
            f.write("extendedKeyUsage = serverAuth,clientAuth\nsubjectAltName = DNS:%s\n" % identity)
        subprocess.run(["openssl", "x509", "-req", "-in", os.path.join(tmp, "req.csr"),
                        "-CA", DIR + "/pki/ca.pem", "-CAkey", DIR + "/pki/ca-key.pem",
                        "-CAserial", DIR + "/pki/ca.srl", "-CAcreateserial", "-days", "30",
                        "-sha256", "-extfile", os.path.join(tmp, "ext"),
                        "-out", os.path.join(tmp, "cert.pem")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(os.path.join(tmp, "cert.pem")) as f:
            reply["certificate"] = f.read()
    with open(DIR + "/pki/ca.pem") as f:
        reply["ca"] = f.read()
    reply["ssldir"] = ssldir
    conf["plugin.security.file.certificate"] = ssldir + "/certificate.pem"
    conf["plugin.security.file.key"] = ssldir + "/private.pem"
    conf["plugin.security.file.ca"] = ssldir + "/ca.pem"
else:
    boot = DIR + "/servers/" + identity + "/boot"
    conf["plugin.security.file.certificate"] = boot + "/cert.pem"
    conf["plugin.security.file.key"] = boot + "/key.pem"
    conf["plugin.security.file.ca"] = DIR + "/pki/ca.pem"
reply["configuration"] = conf
json.dump(reply, sys.stdout)
"#
    )
}

/// Kill every process recorded in `DIR/pids` (each with its process group) and forget them.
pub fn stop(dir: &Path) -> Result<()> {
    let pids_file = dir.join("pids");
    let Ok(text) = std::fs::read_to_string(&pids_file) else {
        eprintln!("xtask: nothing running in {}", dir.display());
        return Ok(());
    };
    let pids: Vec<(u32, &str)> = text
        .lines()
        .filter_map(|line| {
            let (pid, name) = line.split_once(' ')?;
            Some((pid.parse().ok()?, name))
        })
        .collect();
    // Servers first, so they do not spend the shutdown reconnecting to a stopped broker.
    for (pid, name) in pids.iter().rev() {
        signal(*pid, "TERM");
        eprintln!("xtask: stopped {name} (pid {pid})");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (pid, name) in &pids {
        while alive(*pid) {
            if Instant::now() > deadline {
                eprintln!("xtask: {name} (pid {pid}) ignored TERM, killing it");
                signal(*pid, "KILL");
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::fs::remove_file(&pids_file)?;
    Ok(())
}

/// Signal a process group; each peer leads its own group (`process_group(0)` at spawn).
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(format!("-{pid}"))
        .stderr(Stdio::null())
        .status();
}

/// A process counts as gone when /proc has no entry or only a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}
