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

/// The caller id of the provisioner's client JWT in the ed25519 mode.
pub const PROVISIONER_ED25519_ID: &str = "provisioner_signer";

/// How the environment provisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// x509 / protocol v1, insecure provisioning, the provisioner verifies the JWT.
    Plain,
    /// As `Plain`, and the provisioner config turns on CSRs (`features.pki`).
    Pki,
    /// Issuer-based protocol v2: ed25519 keys and JWTs, `features.ed25519`.
    Ed25519,
}

impl Mode {
    pub fn name(self) -> &'static str {
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

/// Make an ed25519 key pair with the real CLI: `<name>.seed` and `<name>.pub` (hex) in `pki`;
/// returns the public key in hex.
fn ed25519_keys(choria: &Path, pki: &Path, name: &str) -> Result<String> {
    let seed = pki.join(format!("{name}.seed"));
    let public = pki.join(format!("{name}.pub"));
    let out = Command::new(choria)
        .args(["jwt", "keys"])
        .arg(&seed)
        .arg(&public)
        .output()
        .context("running choria jwt keys")?;
    if !out.status.success() {
        bail!(
            "choria jwt keys {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(std::fs::read_to_string(&public)?.trim().to_string())
}

/// Run a choria CLI command quietly, failing with its output.
fn choria_cli(choria: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new(choria)
        .args(args)
        .output()
        .context("running choria")?;
    if !out.status.success() {
        bail!(
            "choria {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Generate every file and start the broker and the servers.
pub fn start(choria: &Path, opts: &EnvOptions) -> Result<Env> {
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
    let ed25519 = opts.mode == Mode::Ed25519;
    let p = |rel: &str| dir.join(rel).display().to_string();
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki)?;

    // The CA, the broker's TLS certificate and the provisioner's client certificate.
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

    let port = free_port()?;
    let url = format!("nats://127.0.0.1:{port}");
    let jwt = dir.join("provisioning.jwt");
    let jwt_s = jwt.display().to_string();

    // Trust material. x509: an RSA key signs the provisioning JWT and the broker checks it with
    // the public key. ed25519: an organization issuer signs the broker's and the provisioner's
    // JWTs and the provisioning JWT (protocol v2).
    let mut issuer = String::new();
    if ed25519 {
        issuer = ed25519_keys(choria, &pki, "issuer")?;
        let broker_pub = ed25519_keys(choria, &pki, "broker")?;
        let prov_pub = ed25519_keys(choria, &pki, "provisioner")?;
        let admin_pub = ed25519_keys(choria, &pki, "admin")?;
        choria_cli(
            choria,
            &[
                "jwt",
                "server",
                &p("pki/broker.jwt"),
                "broker.example.net",
                &broker_pub,
                &p("pki/issuer.seed"),
                "--collectives",
                "choria",
            ],
        )?;
        choria_cli(
            choria,
            &[
                "jwt",
                "client",
                &p("pki/provisioner.jwt"),
                PROVISIONER_ED25519_ID,
                &p("pki/issuer.seed"),
                "--public-key",
                &prov_pub,
                "--server-provisioner",
                "--issuer",
                "--validity",
                "8760h",
            ],
        )?;
        choria_cli(
            choria,
            &[
                "jwt",
                "client",
                &p("pki/admin.jwt"),
                "admin",
                &p("pki/issuer.seed"),
                "--public-key",
                &admin_pub,
                "--agents",
                "*",
                "--validity",
                "24h",
            ],
        )?;
        choria_cli(
            choria,
            &[
                "jwt",
                "prov",
                &jwt_s,
                &p("pki/issuer.seed"),
                "--token",
                TOKEN,
                "--urls",
                &url,
                "--protocol-v2",
            ],
        )?;
    } else {
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
        // Insecure (chs false), not provisioning by default (chpd false): each server's own
        // config file switches provisioning on and keeps its identity.
        choria_cli(
            choria,
            &[
                "jwt",
                "prov",
                &jwt_s,
                &p("pki/prov-signer-key.pem"),
                "--token",
                TOKEN,
                "--urls",
                &url,
            ],
        )?;
    }

    // The broker.
    let broker_dir = dir.join("broker");
    std::fs::create_dir_all(broker_dir.join("streams"))?;
    let broker_conf = broker_dir.join("broker.conf");
    let security = if ed25519 {
        format!(
            "plugin.security.provider = choria\n\
             plugin.security.choria.certificate = {pki}/broker-cert.pem\n\
             plugin.security.choria.key = {pki}/broker-key.pem\n\
             plugin.security.choria.token_file = {pki}/broker.jwt\n\
             plugin.security.choria.seed_file = {pki}/broker.seed\n\
             plugin.security.issuer.names = choria\n\
             plugin.security.issuer.choria.public = {issuer}\n",
            pki = pki.display(),
        )
    } else {
        format!(
            "plugin.security.provider = file\n\
             plugin.security.file.certificate = {pki}/broker-cert.pem\n\
             plugin.security.file.key = {pki}/broker-key.pem\n\
             plugin.security.file.ca = {pki}/ca.pem\n\
             plugin.choria.network.provisioning.signer_cert = {pki}/prov-signer.pem\n",
            pki = pki.display(),
        )
    };
    write(
        &broker_conf,
        &format!(
            "identity = broker.example.net\n\
             loglevel = info\n\
             plugin.choria.broker_network = true\n\
             plugin.choria.network.listen_address = 127.0.0.1\n\
             plugin.choria.network.client_port = {port}\n\
             plugin.choria.use_srv = false\n\
             {security}\
             plugin.choria.network.provisioning.client_password = {TOKEN}\n\
             plugin.choria.network.stream.store = {streams}\n\
             plugin.choria.network.stream.event_replicas = 1\n\
             plugin.choria.network.stream.machine_replicas = 1\n\
             plugin.choria.network.stream.advisory_replicas = 1\n\
             plugin.choria.network.stream.leader_election_replicas = 1\n\
             plugin.choria.network.stream.executor_replicas = 1\n",
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
    // provider is validated before provisioning starts (in every mode: a v2 server switches to
    // the choria provider with the provisioning JWT itself).
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

    // The provisioner side: client configs (provisioning account, and the collective provisioned
    // servers join), a helper and a Go provisioner config.
    let pdir = dir.join("provisioner");
    std::fs::create_dir_all(&pdir)?;
    let client_security = |cert: &str| {
        if ed25519 {
            format!(
                "plugin.security.provider = choria\n\
                 plugin.security.choria.token_file = {pki}/{cert}.jwt\n\
                 plugin.security.choria.seed_file = {pki}/{cert}.seed\n\
                 plugin.security.choria.ca = {pki}/ca.pem\n\
                 plugin.security.issuer.names = choria\n\
                 plugin.security.issuer.choria.public = {issuer}\n",
                pki = pki.display(),
            )
        } else {
            format!(
                "plugin.security.provider = file\n\
                 plugin.security.file.certificate = {pki}/provisioner-cert.pem\n\
                 plugin.security.file.key = {pki}/provisioner-key.pem\n\
                 plugin.security.file.ca = {pki}/ca.pem\n",
                pki = pki.display(),
            )
        }
    };
    let client_identity = if ed25519 {
        PROVISIONER_ED25519_ID
    } else {
        PROVISIONER_IDENTITY
    };
    let client_conf = pdir.join("client.conf");
    write(
        &client_conf,
        &format!(
            "identity = {client_identity}\n\
             collectives = provisioning\n\
             main_collective = provisioning\n\
             loglevel = warn\n\
             plugin.choria.middleware_hosts = {url}\n\
             plugin.choria.use_srv = false\n\
             {security}\
             plugin.nats.user = {PROVISIONER_USER}\n\
             plugin.nats.pass = {TOKEN}\n",
            security = client_security("provisioner"),
        ),
    )?;
    let (admin_identity, collective) = if ed25519 {
        ("admin", "choria")
    } else {
        (PROVISIONER_IDENTITY, "mcollective")
    };
    let admin_conf = pdir.join("admin.conf");
    write(
        &admin_conf,
        &format!(
            "identity = {admin_identity}\n\
             collectives = {collective}\n\
             main_collective = {collective}\n\
             loglevel = warn\n\
             plugin.choria.middleware_hosts = {url}\n\
             plugin.choria.use_srv = false\n\
             {security}",
            security = client_security("admin"),
        ),
    )?;
    let helper = pdir.join("helper.py");
    write(&helper, &helper_script(&dir, &url, &issuer))?;
    run(Command::new("chmod").arg("0755").arg(&helper))?;
    let prov_yaml = pdir.join("provisioner.yaml");
    let trust = if ed25519 {
        format!(
            "jwt_verify_cert: {issuer}\n\
             jwt_signing_key: {pki}/provisioner.seed\n\
             jwt_signing_token: {pki}/provisioner.jwt\n\
             features:\n  jwt: true\n  ed25519: true\n",
            pki = pki.display(),
        )
    } else {
        format!(
            "jwt_verify_cert: {pki}/prov-signer.pem\n\
             features:\n  jwt: true\n  pki: {pki_on}\n",
            pki = pki.display(),
            pki_on = opts.mode == Mode::Pki,
        )
    };
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
             {trust}",
            log = pdir.join("provisioner.log").display(),
            helper = helper.display(),
        ),
    )?;

    let mut facts = vec![
        ("mode", opts.mode.name().to_string()),
        ("dir", dir.display().to_string()),
        ("choria", choria.display().to_string()),
        ("broker_url", url.clone()),
        ("broker_port", port.to_string()),
        ("tls_ca", p("pki/ca.pem")),
    ];
    if ed25519 {
        facts.extend([
            ("client_jwt", p("pki/provisioner.jwt")),
            ("client_seed", p("pki/provisioner.seed")),
            ("issuer_public", issuer.clone()),
            ("issuer_seed", p("pki/issuer.seed")),
        ]);
    } else {
        facts.extend([
            ("tls_cert", p("pki/provisioner-cert.pem")),
            ("tls_key", p("pki/provisioner-key.pem")),
            ("jwt_verify_cert", p("pki/prov-signer.pem")),
            ("jwt_signer_key", p("pki/prov-signer-key.pem")),
        ]);
    }
    facts.extend([
        ("ca_key", p("pki/ca-key.pem")),
        ("client_identity", client_identity.to_string()),
        ("nats_user", PROVISIONER_USER.to_string()),
        ("nats_password", TOKEN.to_string()),
        ("token", TOKEN.to_string()),
        ("collective", "provisioning".to_string()),
        ("provisioned_collective", collective.to_string()),
        ("provisioning_jwt", jwt_s.clone()),
        ("client_config", client_conf.display().to_string()),
        ("admin_config", admin_conf.display().to_string()),
        ("provisioner_config", prov_yaml.display().to_string()),
        ("helper", helper.display().to_string()),
        ("servers", identities.join(",")),
        ("server_dir", p("servers")),
    ]);
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

/// Ping with the real CLI (the collective of `client_conf`) until every identity answers.
pub fn wait_for_servers(
    choria: &Path,
    client_conf: &Path,
    identities: &[String],
    within: Duration,
) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut missing: Vec<&String> = identities.iter().collect();
    while Instant::now() < deadline {
        let mut cmd = Command::new(choria);
        // A client with the choria security provider takes its identity from USER and refuses
        // to start without it.
        if std::env::var_os("USER").is_none_or(|u| u.is_empty()) {
            cmd.env("USER", "root");
        }
        let out = cmd
            .args(["ping", "--config"])
            .arg(client_conf)
            .args(["--names", "--timeout", "2", "--expect"])
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
    bail!(
        "servers not answering to {}: {missing:?}",
        client_conf.display()
    )
}

/// The sample helper. With an ed25519 public key (ed25519 mode) it configures the `choria`
/// provider with the server JWT and seed the provisioner and `gen25519` leave in the reported
/// directory. Otherwise it configures the `file` provider (collective `mcollective`): with a CSR
/// (pki) it signs it with the test CA and points the server at the files `configure` writes, else
/// at the certificate the environment made for the node.
fn helper_script(dir: &Path, url: &str, issuer: &str) -> String {
    let dir = dir.display();
    format!(
        r#"#!/usr/bin/env python3
# Sample provisioning helper for the test environment in {dir}.
import json, os, subprocess, sys, tempfile

DIR = "{dir}"
ISSUER = "{issuer}"
node = json.load(sys.stdin)
identity = node["identity"]


def sign(tmp):
    """Sign tmp/req.csr with the test CA for this identity; return the certificate PEM."""
    with open(os.path.join(tmp, "ext"), "w") as f:
        f.write("extendedKeyUsage = serverAuth,clientAuth\nsubjectAltName = DNS:%s\n" % identity)
    subprocess.run(["openssl", "x509", "-req", "-in", os.path.join(tmp, "req.csr"),
                    "-CA", DIR + "/pki/ca.pem", "-CAkey", DIR + "/pki/ca-key.pem",
                    "-CAserial", DIR + "/pki/ca.srl", "-CAcreateserial", "-days", "30",
                    "-sha256", "-extfile", os.path.join(tmp, "ext"),
                    "-out", os.path.join(tmp, "cert.pem")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.path.join(tmp, "cert.pem")) as f:
        return f.read()

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
ed = node.get("ed25519_pubkey")
if ed:
    conf["plugin.security.provider"] = "choria"
    conf["plugin.security.choria.token_file"] = ed["directory"] + "/server.jwt"
    conf["plugin.security.choria.seed_file"] = ed["directory"] + "/server.seed"
    conf["plugin.security.issuer.names"] = "choria"
    conf["plugin.security.issuer.choria.public"] = ISSUER
elif csr:
    ssldir = csr["ssldir"]
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "req.csr"), "w") as f:
            f.write(csr["csr"])
        reply["certificate"] = sign(tmp)
    with open(DIR + "/pki/ca.pem") as f:
        reply["ca"] = f.read()
    reply["ssldir"] = ssldir
    conf["plugin.security.file.certificate"] = ssldir + "/certificate.pem"
    conf["plugin.security.file.key"] = ssldir + "/private.pem"
    conf["plugin.security.file.ca"] = ssldir + "/ca.pem"
elif os.environ.get("HELPER_SUPPLY_KEY"):
    # The helper makes the key: the provisioner encrypts it for the server (ECDH + PEM).
    ssldir = DIR + "/servers/" + identity + "/ssl"
    keys = DIR + "/provisioner/keys"
    os.makedirs(keys, exist_ok=True)
    key = os.path.join(keys, identity + ".pem")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["openssl", "genrsa", "-traditional", "-out", key, "2048"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["openssl", "req", "-new", "-key", key, "-subj", "/CN=" + identity,
                        "-out", os.path.join(tmp, "req.csr")],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        reply["certificate"] = sign(tmp)
    with open(key) as f:
        reply["key"] = f.read()
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

/// Read `DIR/env.conf` back.
pub fn read_env(dir: &Path) -> Result<std::collections::HashMap<String, String>> {
    let path = dir.join("env.conf");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(" = "))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Run `choria req choria_provision <action>` against one node in the provisioning collective
/// and return the reply's `data`, failing unless exactly one OK reply came.
fn provision_rpc(
    choria: &Path,
    client_conf: &str,
    identity: &str,
    action: &str,
    inputs: &[String],
) -> Result<serde_json::Value> {
    let mut cmd = Command::new(choria);
    if std::env::var_os("USER").is_none_or(|u| u.is_empty()) {
        cmd.env("USER", "root");
    }
    let out = cmd
        .args(["req", "choria_provision", action])
        .args(inputs)
        .args([
            "--config",
            client_conf,
            "-T",
            "provisioning",
            "-I",
            identity,
        ])
        .args(["--json", "--discovery-timeout", "2"])
        .output()
        .context("running choria req")?;
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{identity}: choria_provision#{action} printed no JSON: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let replies = reply["replies"].as_array().cloned().unwrap_or_default();
    match replies.as_slice() {
        [one] if one["statuscode"] == 0 => Ok(one["data"].clone()),
        _ => bail!("{identity}: choria_provision#{action} failed: {reply}"),
    }
}

/// Provision every server of a running environment through the real CLI and the sample helper,
/// the way a provisioner does (jwt, gencsr or gen25519 by mode, helper, configure, restart), then
/// check each rewrote its configuration and answers in the provisioned collective.
pub fn selftest(dir: &Path) -> Result<()> {
    let env = read_env(dir)?;
    let get = |k: &str| {
        env.get(k)
            .cloned()
            .with_context(|| format!("env.conf has no {k}"))
    };
    let choria = PathBuf::from(get("choria")?);
    let client = get("client_config")?;
    let mode = get("mode")?;
    let identities: Vec<String> = get("servers")?.split(',').map(str::to_string).collect();
    let token = format!("token={TOKEN}");
    for identity in &identities {
        let claims = provision_rpc(
            &choria,
            &client,
            identity,
            "jwt",
            std::slice::from_ref(&token),
        )?;
        if claims["jwt"].as_str().is_none_or(str::is_empty) {
            bail!("{identity}: the jwt action returned no token");
        }
        let mut input = serde_json::json!({
            "identity": identity, "csr": null, "ed25519_pubkey": null,
            "inventory": "{}", "jwt": null,
        });
        let mut server_jwt = String::new();
        match mode.as_str() {
            "pki" => {
                let cn = format!("cn={identity}");
                input["csr"] =
                    provision_rpc(&choria, &client, identity, "gencsr", &[token.clone(), cn])?;
            }
            "ed25519" => {
                let nonce = "nonce=selftest".to_string();
                let key = provision_rpc(
                    &choria,
                    &client,
                    identity,
                    "gen25519",
                    &[token.clone(), nonce],
                )?;
                let public = key["public_key"].as_str().unwrap_or_default().to_string();
                let file = dir.join("provisioner").join(format!("{identity}.jwt"));
                choria_cli(
                    &choria,
                    &[
                        "jwt",
                        "server",
                        &file.display().to_string(),
                        identity,
                        &public,
                        &get("issuer_seed")?,
                        "--collectives",
                        "choria",
                    ],
                )?;
                server_jwt = std::fs::read_to_string(&file)?;
                input["ed25519_pubkey"] = key;
            }
            _ => {}
        }
        let mut helper = Command::new(get("helper")?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the helper")?;
        if let Some(mut stdin) = helper.stdin.take() {
            use std::io::Write as _;
            stdin.write_all(input.to_string().as_bytes())?;
        }
        let out = helper.wait_with_output()?;
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("{identity}: the helper printed no JSON"))?;
        let mut inputs = vec![token.clone(), format!("config={}", answer["configuration"])];
        for key in ["certificate", "ca", "ssldir"] {
            if let Some(v) = answer[key].as_str().filter(|v| !v.is_empty()) {
                inputs.push(format!("{key}={v}"));
            }
        }
        if !server_jwt.is_empty() {
            inputs.push(format!("server_jwt={}", server_jwt.trim()));
        }
        provision_rpc(&choria, &client, identity, "configure", &inputs)?;
        provision_rpc(
            &choria,
            &client,
            identity,
            "restart",
            &[token.clone(), "splay=1".to_string()],
        )?;
        eprintln!("xtask: configured {identity}");
    }
    for identity in &identities {
        let conf = PathBuf::from(get("server_dir")?)
            .join(identity)
            .join("server.conf");
        let text = std::fs::read_to_string(&conf)?;
        if !text
            .lines()
            .any(|l| l == "plugin.choria.server.provision=false")
        {
            bail!(
                "{identity}: {} was not rewritten by configure",
                conf.display()
            );
        }
    }
    wait_for_servers(
        &choria,
        Path::new(&get("admin_config")?),
        &identities,
        Duration::from_secs(60),
    )
    .context("provisioned servers not answering in their new collective")?;
    eprintln!(
        "xtask: all {} servers provisioned and answering in {}",
        identities.len(),
        get("provisioned_collective")?
    );
    Ok(())
}
