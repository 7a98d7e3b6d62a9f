//! The real go-choria environment on loopback: a test CA, a Choria broker with its provisioning
//! account, and provisioning-mode `choria server` processes, all under one directory. The
//! `choria` binary is the peer `cargo xtask peers` builds into `target/peers/bin/choria`.
//!
//! [`GoEnv::start`] writes everything under its directory: `DIR/env.conf` lists the facts a test
//! needs (`key = value`, one a line) and `DIR/pids` the processes, which the environment stops
//! when dropped (or [`stop`] stops, for an environment left running by [`GoEnv::detach`]).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ca::{KeyFormat, TestCa};
use crate::process::{alive, signal};
use crate::{free_port, mkdir, write, Error, IoContext, Mode, ProcessGuard, Result};

/// The provisioning token (`cht`) and the broker's provisioning password.
pub const TOKEN: &str = "s3cret";

/// The NATS user of the provisioning account's provisioner.
pub const PROVISIONER_USER: &str = "provisioner";

/// The identity (and certificate CN) of the provisioner's client.
pub const PROVISIONER_IDENTITY: &str = "provisioner.mcollective";

/// The caller id of the provisioner's client JWT in the ed25519 mode.
pub const PROVISIONER_ED25519_ID: &str = "provisioner_signer";

/// The Choria peer binary (broker, server and CLI in one), where `cargo xtask peers` puts it.
pub fn choria_bin() -> PathBuf {
    crate::workspace_root().join("target/peers/bin/choria")
}

/// The Choria peer binary for a test.
///
/// # Panics
/// When it has not been built, saying how to build it.
pub fn require_choria_bin() -> PathBuf {
    let bin = choria_bin();
    assert!(
        bin.is_file(),
        "{} is missing: run the tests through `cargo xtask test`, or build the peer with \
         `cargo xtask peers` (Go 1.25 or newer; it takes a few minutes once)",
        bin.display()
    );
    bin
}

/// Options of an environment.
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
    /// Servers as shipped for production: no configuration file, a provisioning JWT that turns
    /// provisioning on by default (`chpd`), and the identity from the host name, each server in
    /// a UTS namespace of its own named after it (`unshare --uts`, which needs root). Such a
    /// server goes back to provisioning after `choria_provision#reprovision`. Otherwise each
    /// server's own configuration file switches provisioning on and keeps its identity.
    pub default_provisioning: bool,
}

/// A started environment, stopped when dropped (servers first, then the broker).
#[derive(Debug)]
pub struct GoEnv {
    /// The identities of the servers, in start order.
    pub identities: Vec<String>,
    dir: PathBuf,
    ca: TestCa,
    facts: Vec<(&'static str, String)>,
    procs: Vec<ProcessGuard>,
}

/// What the steps of [`GoEnv::start`] share.
struct Layout {
    dir: PathBuf,
    pki: PathBuf,
    /// The test CA in `pki`.
    ca: TestCa,
    choria: PathBuf,
    mode: Mode,
    port: u16,
    url: String,
    /// The provisioning JWT file.
    jwt: PathBuf,
    /// The organisation issuer's public key (ed25519 mode), else empty.
    issuer: String,
    /// [`EnvOptions::default_provisioning`].
    default_provisioning: bool,
}

impl Layout {
    fn ed25519(&self) -> bool {
        self.mode == Mode::Ed25519
    }

    /// A path under the environment's directory, as text.
    fn p(&self, rel: &str) -> String {
        self.dir.join(rel).display().to_string()
    }

    /// Start a long-running process in its own process group, output to `log`, and record its
    /// pid in `DIR/pids`.
    fn spawn(&self, name: &str, cmd: &mut Command, log: &Path) -> Result<ProcessGuard> {
        let out = std::fs::File::create(log).ctx(|| format!("creating {}", log.display()))?;
        let err = out
            .try_clone()
            .ctx(|| format!("opening {}", log.display()))?;
        let guard =
            ProcessGuard::spawn_group(name, cmd.stdin(Stdio::null()).stdout(out).stderr(err))?;
        let pids = self.dir.join("pids");
        let mut text = std::fs::read_to_string(&pids).unwrap_or_default();
        let _ = writeln!(text, "{} {name}", guard.pid());
        write(&pids, &text)?;
        Ok(guard)
    }
}

impl GoEnv {
    /// Generate every file and start the broker and the servers; with `opts.wait`, wait until
    /// every server answers.
    pub fn start(choria: &Path, opts: &EnvOptions) -> Result<GoEnv> {
        let mut l = layout(choria, opts)?;
        if l.ed25519() {
            l.issuer = ed25519_trust(&l)?;
        } else {
            x509_trust(&l)?;
        }
        let mut env = GoEnv {
            identities: Vec::new(),
            dir: l.dir.clone(),
            ca: l.ca.clone(),
            facts: Vec::new(),
            procs: vec![start_broker(&l)?],
        };
        for n in 1..=opts.servers {
            let identity = format!("node{n}.example.net");
            env.procs.push(start_server(&l, &identity)?);
            env.identities.push(identity);
        }
        let clients = write_client_configs(&l)?;
        let helper = l.dir.join("provisioner/helper.py");
        write_helper(&l, &helper)?;
        let prov_yaml = write_provisioner_yaml(&l, &helper)?;
        env.facts = facts(&l, &clients, &helper, &prov_yaml, &env.identities);
        write(&l.dir.join("env.conf"), &env.describe())?;
        if opts.wait {
            let within = Duration::from_secs(90);
            wait_for_servers(choria, &clients.client, &env.identities, within)?;
        }
        Ok(env)
    }

    /// The `env.conf` text: one `key = value` a line.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (key, value) in &self.facts {
            let _ = writeln!(out, "{key} = {value}");
        }
        out
    }

    /// One fact of `env.conf`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.facts
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The directory holding everything.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pid of a process the environment started (`broker` or a server identity).
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.procs
            .iter()
            .find(|p| p.name() == name)
            .map(ProcessGuard::pid)
    }

    /// A Puppet-style ssldir under the environment's directory (`DIR/puppet-ssl`) for a client
    /// named `certname`, as `choria enroll` or a Puppet agent leaves it and go-choria's `puppet`
    /// security provider reads it: `certs/<certname>.pem` (signed by the environment's CA),
    /// `private_keys/<certname>.pem` (mode 0600) and `certs/ca.pem`.
    pub fn puppet_ssldir(&self, certname: &str) -> Result<PathBuf> {
        let pki = self.dir.join("pki");
        let ssl = self.dir.join("puppet-ssl");
        let name = format!("puppet-{certname}");
        leaf_cert(&self.ca, &name, certname, &[certname])?;
        mkdir(&ssl.join("certs"))?;
        mkdir(&ssl.join("private_keys"))?;
        let key = ssl.join("private_keys").join(format!("{certname}.pem"));
        for (from, to) in [
            (
                pki.join(format!("{name}-cert.pem")),
                ssl.join("certs").join(format!("{certname}.pem")),
            ),
            (pki.join(format!("{name}-key.pem")), key.clone()),
            (pki.join("ca.pem"), ssl.join("certs").join("ca.pem")),
        ] {
            std::fs::copy(&from, &to)
                .ctx(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        crate::owner_only(&key)?;
        Ok(ssl)
    }

    /// Leave every process running (for `cargo xtask peers env`); [`stop`] ends them.
    pub fn detach(mut self) {
        for p in std::mem::take(&mut self.procs) {
            p.detach();
        }
    }
}

impl Drop for GoEnv {
    fn drop(&mut self) {
        if !self.procs.is_empty() {
            let _ = stop(&self.dir);
        }
    }
}

/// Create and resolve the directory, refusing one that holds a running environment.
fn layout(choria: &Path, opts: &EnvOptions) -> Result<Layout> {
    mkdir(&opts.dir)?;
    let dir = opts
        .dir
        .canonicalize()
        .ctx(|| format!("resolving {}", opts.dir.display()))?;
    if dir.join("pids").exists() {
        return Err(Error::Failed(format!(
            "{} already holds a running environment (stop it first)",
            dir.display()
        )));
    }
    let pki = dir.join("pki");
    mkdir(&pki)?;
    let ca = make_pki(&pki)?;
    let port = free_port();
    Ok(Layout {
        jwt: dir.join("provisioning.jwt"),
        dir,
        pki,
        ca,
        choria: choria.to_path_buf(),
        mode: opts.mode,
        port,
        url: format!("nats://127.0.0.1:{port}"),
        issuer: String::new(),
        default_provisioning: opts.default_provisioning,
    })
}

/// Run a command quietly, failing with its output.
fn quiet(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().ctx(|| format!("running {what}"))?;
    if !out.status.success() {
        return Err(Error::Failed(format!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let what = format!("openssl {}", args.join(" "));
    quiet(Command::new("openssl").current_dir(dir).args(args), &what)
}

fn choria_cli(choria: &Path, args: &[&str]) -> Result<()> {
    let what = format!("choria {}", args.join(" "));
    quiet(Command::new(choria).args(args), &what)
}

/// The CA, the broker's TLS certificate and the provisioner's client certificate.
fn make_pki(pki: &Path) -> Result<TestCa> {
    let ca = TestCa::named(pki, "choria-test-ca", 30)?;
    leaf_cert(&ca, "broker", "localhost", &["localhost", "127.0.0.1"])?;
    leaf_cert(
        &ca,
        "provisioner",
        PROVISIONER_IDENTITY,
        &[PROVISIONER_IDENTITY],
    )?;
    Ok(ca)
}

/// Make `<name>-key.pem` and `<name>-cert.pem` beside the CA, signed by it, with the given
/// common name and subject alternative names.
fn leaf_cert(ca: &TestCa, name: &str, cn: &str, sans: &[&str]) -> Result<()> {
    ca.issue_as(name, cn, sans, KeyFormat::Pkcs8).map(drop)
}

/// Make an ed25519 key pair with the real CLI: `<name>.seed` and `<name>.pub` (hex) in `pki`;
/// returns the public key in hex.
fn ed25519_keys(l: &Layout, name: &str) -> Result<String> {
    let public = l.pki.join(format!("{name}.pub"));
    let seed = l.pki.join(format!("{name}.seed"));
    quiet(
        Command::new(&l.choria)
            .args(["jwt", "keys"])
            .arg(&seed)
            .arg(&public),
        &format!("choria jwt keys {name}"),
    )?;
    let text = std::fs::read_to_string(&public).ctx(|| format!("reading {}", public.display()))?;
    Ok(text.trim().to_string())
}

/// Protocol v2: an organisation issuer signs the broker's, the provisioner's and an admin's
/// JWTs and the provisioning JWT. Returns the issuer's public key.
fn ed25519_trust(l: &Layout) -> Result<String> {
    let issuer = ed25519_keys(l, "issuer")?;
    let broker_pub = ed25519_keys(l, "broker")?;
    let prov_pub = ed25519_keys(l, "provisioner")?;
    let admin_pub = ed25519_keys(l, "admin")?;
    let seed = l.p("pki/issuer.seed");
    let broker_jwt = l.p("pki/broker.jwt");
    let broker = [
        "jwt",
        "server",
        &broker_jwt,
        "broker.example.net",
        &broker_pub,
        &seed,
    ];
    choria_cli(
        &l.choria,
        &[&broker[..], &["--collectives", "choria"]].concat(),
    )?;
    let prov_jwt = l.p("pki/provisioner.jwt");
    choria_cli(
        &l.choria,
        &[
            "jwt",
            "client",
            &prov_jwt,
            PROVISIONER_ED25519_ID,
            &seed,
            "--public-key",
            &prov_pub,
            "--server-provisioner",
            "--issuer",
            "--validity",
            "8760h",
        ],
    )?;
    let admin_jwt = l.p("pki/admin.jwt");
    choria_cli(
        &l.choria,
        &[
            "jwt",
            "client",
            &admin_jwt,
            "admin",
            &seed,
            "--public-key",
            &admin_pub,
            "--agents",
            "*",
            "--validity",
            "24h",
        ],
    )?;
    let jwt = l.jwt.display().to_string();
    choria_cli(
        &l.choria,
        &[
            "jwt",
            "prov",
            jwt.as_str(),
            seed.as_str(),
            "--token",
            TOKEN,
            "--urls",
            &l.url,
            "--protocol-v2",
        ]
        .into_iter()
        .chain(l.default_provisioning.then_some("--default"))
        .collect::<Vec<_>>(),
    )?;
    Ok(issuer)
}

/// x509: an RSA key signs the provisioning JWT and the broker checks it with the public key.
/// Insecure (chs false), not provisioning by default (chpd false): each server's own config file
/// switches provisioning on and keeps its identity.
fn x509_trust(l: &Layout) -> Result<()> {
    crate::ca::rsa_key(&l.pki.join("prov-signer-key.pem"), KeyFormat::Pkcs8)?;
    openssl(
        &l.pki,
        &[
            "rsa",
            "-in",
            "prov-signer-key.pem",
            "-pubout",
            "-out",
            "prov-signer.pem",
        ],
    )?;
    let (jwt, key) = (l.jwt.display().to_string(), l.p("pki/prov-signer-key.pem"));
    choria_cli(
        &l.choria,
        &[
            "jwt", "prov", &jwt, &key, "--token", TOKEN, "--urls", &l.url,
        ]
        .into_iter()
        .chain(l.default_provisioning.then_some("--default"))
        .collect::<Vec<_>>(),
    )
}

/// Write the broker's configuration, start it and wait until it listens.
fn start_broker(l: &Layout) -> Result<ProcessGuard> {
    let broker_dir = l.dir.join("broker");
    mkdir(&broker_dir.join("streams"))?;
    let pki = l.pki.display();
    let security = if l.ed25519() {
        format!(
            "plugin.security.provider = choria\n\
             plugin.security.choria.certificate = {pki}/broker-cert.pem\n\
             plugin.security.choria.key = {pki}/broker-key.pem\n\
             plugin.security.choria.token_file = {pki}/broker.jwt\n\
             plugin.security.choria.seed_file = {pki}/broker.seed\n\
             plugin.security.issuer.names = choria\n\
             plugin.security.issuer.choria.public = {}\n",
            l.issuer
        )
    } else {
        format!(
            "plugin.security.provider = file\n\
             plugin.security.file.certificate = {pki}/broker-cert.pem\n\
             plugin.security.file.key = {pki}/broker-key.pem\n\
             plugin.security.file.ca = {pki}/ca.pem\n\
             plugin.choria.network.provisioning.signer_cert = {pki}/prov-signer.pem\n"
        )
    };
    let replicas: String = [
        "event",
        "machine",
        "advisory",
        "leader_election",
        "executor",
    ]
    .iter()
    .map(|s| format!("plugin.choria.network.stream.{s}_replicas = 1\n"))
    .collect();
    let conf = broker_dir.join("broker.conf");
    write(
        &conf,
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
             {replicas}",
            port = l.port,
            streams = broker_dir.join("streams").display(),
        ),
    )?;
    let mut cmd = Command::new(&l.choria);
    cmd.args(["broker", "run", "--config"])
        .arg(&conf)
        .current_dir(&broker_dir);
    let broker = l.spawn("broker", &mut cmd, &broker_dir.join("broker.log"))?;
    crate::ports::wait_port(l.port, Duration::from_secs(60))
        .map_err(|e| Error::Failed(format!("the broker did not start: {e}")))?;
    Ok(broker)
}

/// One server: a config file that keeps its identity and switches provisioning on, with the
/// file security provider pointing at an existing (CA-signed) certificate, since the provider is
/// validated before provisioning starts (in every mode: a v2 server switches to the choria
/// provider with the provisioning JWT itself).
fn start_server(l: &Layout, identity: &str) -> Result<ProcessGuard> {
    let sdir = l.dir.join("servers").join(identity);
    let boot = sdir.join("boot");
    mkdir(&boot)?;
    leaf_cert(&l.ca, identity, identity, &[identity])?;
    for (made, to) in [("cert", "cert.pem"), ("key", "key.pem")] {
        let from = l.pki.join(format!("{identity}-{made}.pem"));
        std::fs::rename(&from, boot.join(to)).ctx(|| format!("moving {}", from.display()))?;
    }
    let conf = sdir.join("server.conf");
    if l.default_provisioning {
        return start_default_server(l, identity, &sdir, &conf);
    }
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
            pki = l.pki.display(),
        ),
    )?;
    // A copy of the initial file, as the server rewrites server.conf when configured.
    std::fs::copy(&conf, sdir.join("server.conf.initial"))
        .ctx(|| format!("copying {}", conf.display()))?;
    let mut cmd = Command::new(&l.choria);
    cmd.args(["server", "run", "--config"])
        .arg(&conf)
        .current_dir(&sdir)
        .env("CHORIA_PROVISION_JWT", &l.jwt)
        .env_remove("MCOLLECTIVE_CERTNAME");
    l.spawn(identity, &mut cmd, &sdir.join("server.log"))
}

/// A server as shipped for production (`EnvOptions::default_provisioning`): no `conf` yet, the
/// action policy beside where it will be, and the host name `identity` in a UTS namespace of
/// its own (the server's restarts re-execute in place, so they keep it).
fn start_default_server(
    l: &Layout,
    identity: &str,
    sdir: &Path,
    conf: &Path,
) -> Result<ProcessGuard> {
    write_policy(sdir)?;
    let mut cmd = Command::new("unshare");
    cmd.args(["--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\""])
        .arg(identity)
        .arg(&l.choria)
        .args(["server", "run", "--config"])
        .arg(conf)
        .current_dir(sdir)
        .env("CHORIA_PROVISION_JWT", &l.jwt)
        .env_remove("MCOLLECTIVE_CERTNAME");
    l.spawn(identity, &mut cmd, &sdir.join("server.log"))
}

/// The site's action policy, as configuration management lays it down beside the server's
/// configuration: the admin may ask a provisioned server to reprovision (a rotation campaign),
/// nothing else of the agent.
fn write_policy(sdir: &Path) -> Result<()> {
    let policies = sdir.join("policies");
    mkdir(&policies)?;
    write(
        &policies.join("choria_provision.policy"),
        "policy default deny\n\
         allow\tchoria=provisioner.mcollective\treprovision\t*\t*\n\
         allow\tchoria=admin\treprovision\t*\t*\n",
    )
}

/// The provisioner side's client configurations.
struct Clients {
    /// The provisioning account's client (collective `provisioning`).
    client: PathBuf,
    /// A client of the collective provisioned servers join.
    admin: PathBuf,
    /// The client identity of `client`.
    identity: &'static str,
    /// The collective provisioned servers join.
    collective: &'static str,
}

/// The security lines of a client using the `name` credentials.
fn client_security(l: &Layout, name: &str) -> String {
    let pki = l.pki.display();
    if l.ed25519() {
        format!(
            "plugin.security.provider = choria\n\
             plugin.security.choria.token_file = {pki}/{name}.jwt\n\
             plugin.security.choria.seed_file = {pki}/{name}.seed\n\
             plugin.security.choria.ca = {pki}/ca.pem\n\
             plugin.security.issuer.names = choria\n\
             plugin.security.issuer.choria.public = {}\n",
            l.issuer
        )
    } else {
        format!(
            "plugin.security.provider = file\n\
             plugin.security.file.certificate = {pki}/provisioner-cert.pem\n\
             plugin.security.file.key = {pki}/provisioner-key.pem\n\
             plugin.security.file.ca = {pki}/ca.pem\n"
        )
    }
}

fn client_config(l: &Layout, identity: &str, collective: &str, creds: &str) -> String {
    format!(
        "identity = {identity}\n\
         collectives = {collective}\n\
         main_collective = {collective}\n\
         loglevel = warn\n\
         plugin.choria.middleware_hosts = {url}\n\
         plugin.choria.use_srv = false\n\
         {security}",
        url = l.url,
        security = client_security(l, creds),
    )
}

/// Client configurations: the provisioning account, and the collective provisioned servers
/// join.
fn write_client_configs(l: &Layout) -> Result<Clients> {
    let pdir = l.dir.join("provisioner");
    mkdir(&pdir)?;
    let (identity, admin_identity, collective) = if l.ed25519() {
        (PROVISIONER_ED25519_ID, "admin", "choria")
    } else {
        (PROVISIONER_IDENTITY, PROVISIONER_IDENTITY, "mcollective")
    };
    let client = pdir.join("client.conf");
    let account = format!("plugin.nats.user = {PROVISIONER_USER}\nplugin.nats.pass = {TOKEN}\n");
    let text = client_config(l, identity, "provisioning", "provisioner") + &account;
    write(&client, &text)?;
    let admin = pdir.join("admin.conf");
    write(
        &admin,
        &client_config(l, admin_identity, collective, "admin"),
    )?;
    Ok(Clients {
        client,
        admin,
        identity,
        collective,
    })
}

/// The sample helper (`go_env_helper.py`). With an ed25519 public key (ed25519 mode) it
/// configures the `choria` provider with the server JWT and seed the provisioner and `gen25519`
/// leave in the reported directory. Otherwise it configures the `file` provider (collective
/// `mcollective`): with a CSR (pki) it signs it with the test CA and points the server at the
/// files `configure` writes; with `HELPER_SUPPLY_KEY` set it makes the key itself; else it points
/// the server at the certificate the environment made for the node.
fn write_helper(l: &Layout, path: &Path) -> Result<()> {
    let script = include_str!("go_env_helper.py")
        .replace("@DIR@", &l.dir.display().to_string())
        .replace("@URL@", &l.url)
        .replace("@ISSUER@", &l.issuer);
    crate::write_executable(path, &script)
}

/// A provisioner YAML for this environment (the Go provisioner's and ours).
fn write_provisioner_yaml(l: &Layout, helper: &Path) -> Result<PathBuf> {
    let pki = l.pki.display();
    let trust = if l.ed25519() {
        format!(
            "jwt_verify_cert: {}\n\
             jwt_signing_key: {pki}/provisioner.seed\n\
             jwt_signing_token: {pki}/provisioner.jwt\n\
             features:\n  jwt: true\n  ed25519: true\n",
            l.issuer
        )
    } else {
        format!(
            "jwt_verify_cert: {pki}/prov-signer.pem\n\
             features:\n  jwt: true\n  pki: {}\n",
            l.mode == Mode::Pki
        )
    };
    let yaml = l.dir.join("provisioner/provisioner.yaml");
    write(
        &yaml,
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
            log = l.p("provisioner/provisioner.log"),
            helper = helper.display(),
        ),
    )?;
    Ok(yaml)
}

/// The facts `env.conf` lists.
fn facts(
    l: &Layout,
    c: &Clients,
    helper: &Path,
    prov_yaml: &Path,
    identities: &[String],
) -> Vec<(&'static str, String)> {
    let mut facts = vec![
        ("mode", l.mode.name().to_string()),
        ("dir", l.dir.display().to_string()),
        ("choria", l.choria.display().to_string()),
        ("broker_url", l.url.clone()),
        ("broker_port", l.port.to_string()),
        ("tls_ca", l.p("pki/ca.pem")),
    ];
    if l.ed25519() {
        facts.extend([
            ("client_jwt", l.p("pki/provisioner.jwt")),
            ("client_seed", l.p("pki/provisioner.seed")),
            ("issuer_public", l.issuer.clone()),
            ("issuer_seed", l.p("pki/issuer.seed")),
        ]);
    } else {
        facts.extend([
            ("tls_cert", l.p("pki/provisioner-cert.pem")),
            ("tls_key", l.p("pki/provisioner-key.pem")),
            ("jwt_verify_cert", l.p("pki/prov-signer.pem")),
            ("jwt_signer_key", l.p("pki/prov-signer-key.pem")),
        ]);
    }
    facts.extend([
        ("ca_key", l.p("pki/ca-key.pem")),
        ("client_identity", c.identity.to_string()),
        ("nats_user", PROVISIONER_USER.to_string()),
        ("nats_password", TOKEN.to_string()),
        ("token", TOKEN.to_string()),
        ("collective", "provisioning".to_string()),
        ("provisioned_collective", c.collective.to_string()),
        ("provisioning_jwt", l.jwt.display().to_string()),
        ("client_config", c.client.display().to_string()),
        ("admin_config", c.admin.display().to_string()),
        ("provisioner_config", prov_yaml.display().to_string()),
        ("helper", helper.display().to_string()),
        ("servers", identities.join(",")),
        ("server_dir", l.p("servers")),
    ]);
    facts
}

/// A `choria` CLI command; a client with the choria security provider takes its identity from
/// USER and refuses to start without it.
pub fn cli(choria: &Path) -> Command {
    let mut cmd = Command::new(choria);
    if std::env::var_os("USER").is_none_or(|u| u.is_empty()) {
        cmd.env("USER", "root");
    }
    cmd
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
        let out = cli(choria)
            .args(["ping", "--config"])
            .arg(client_conf)
            .args(["--names", "--timeout", "2", "--expect"])
            .arg(identities.len().to_string())
            .output()
            .ctx(|| "running choria ping".into())?;
        let text = String::from_utf8_lossy(&out.stdout);
        missing.retain(|id| !text.contains(id.as_str()));
        if missing.is_empty() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(Error::Failed(format!(
        "servers not answering to {}: {missing:?}",
        client_conf.display()
    )))
}

/// Stop every process recorded in `DIR/pids` (each with its process group, servers first so
/// they do not spend the shutdown reconnecting to a stopped broker) and forget them.
pub fn stop(dir: &Path) -> Result<()> {
    let pids_file = dir.join("pids");
    let Ok(text) = std::fs::read_to_string(&pids_file) else {
        return Ok(());
    };
    let pids: Vec<(u32, &str)> = text
        .lines()
        .filter_map(|line| {
            let (pid, name) = line.split_once(' ')?;
            Some((pid.parse().ok()?, name))
        })
        .collect();
    for (pid, _) in pids.iter().rev() {
        signal(*pid, true, "TERM");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (pid, name) in &pids {
        while alive(*pid) {
            if Instant::now() > deadline {
                eprintln!("{name} (pid {pid}) ignored TERM, killing it");
                signal(*pid, true, "KILL");
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    std::fs::remove_file(&pids_file).ctx(|| format!("removing {}", pids_file.display()))
}

/// Read `DIR/env.conf` back.
pub fn read_env(dir: &Path) -> Result<std::collections::HashMap<String, String>> {
    let path = dir.join("env.conf");
    let text = std::fs::read_to_string(&path).ctx(|| format!("reading {}", path.display()))?;
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
    let out = cli(choria)
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
        .ctx(|| "running choria req".into())?;
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|_| {
        Error::Failed(format!(
            "{identity}: choria_provision#{action} printed no JSON: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    })?;
    let replies = reply["replies"].as_array().cloned().unwrap_or_default();
    match replies.as_slice() {
        [one] if one["statuscode"] == 0 => Ok(one["data"].clone()),
        _ => Err(Error::Failed(format!(
            "{identity}: choria_provision#{action} failed: {reply}"
        ))),
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
            .ok_or_else(|| Error::Failed(format!("env.conf has no {k}")))
    };
    let choria = PathBuf::from(get("choria")?);
    let client = get("client_config")?;
    let identities: Vec<String> = get("servers")?.split(',').map(str::to_string).collect();
    let token = format!("token={TOKEN}");
    for identity in &identities {
        let rpc = |action: &str, inputs: &[String]| {
            provision_rpc(&choria, &client, identity, action, inputs)
        };
        let claims = rpc("jwt", std::slice::from_ref(&token))?;
        if claims["jwt"].as_str().is_none_or(str::is_empty) {
            return Err(Error::Failed(format!(
                "{identity}: the jwt action returned no token"
            )));
        }
        let mut input = serde_json::json!({
            "identity": identity, "csr": null, "ed25519_pubkey": null,
            "inventory": "{}", "jwt": null,
        });
        let mut server_jwt = String::new();
        match get("mode")?.as_str() {
            "pki" => input["csr"] = rpc("gencsr", &[token.clone(), format!("cn={identity}")])?,
            "ed25519" => {
                let key = rpc("gen25519", &[token.clone(), "nonce=selftest".into()])?;
                let public = key["public_key"].as_str().unwrap_or_default().to_string();
                let file = dir.join("provisioner").join(format!("{identity}.jwt"));
                let (file_s, seed) = (file.display().to_string(), get("issuer_seed")?);
                let args = ["jwt", "server", &file_s, identity, &public, &seed];
                choria_cli(&choria, &[&args[..], &["--collectives", "choria"]].concat())?;
                server_jwt =
                    std::fs::read_to_string(&file).ctx(|| format!("reading {}", file.display()))?;
                input["ed25519_pubkey"] = key;
            }
            _ => {}
        }
        let answer = run_helper(Path::new(&get("helper")?), &input)
            .map_err(|e| Error::Failed(format!("{identity}: {e}")))?;
        let mut inputs = vec![token.clone(), format!("config={}", answer["configuration"])];
        for key in ["certificate", "ca", "ssldir"] {
            if let Some(v) = answer[key].as_str().filter(|v| !v.is_empty()) {
                inputs.push(format!("{key}={v}"));
            }
        }
        if !server_jwt.is_empty() {
            inputs.push(format!("server_jwt={}", server_jwt.trim()));
        }
        rpc("configure", &inputs)?;
        rpc("restart", &[token.clone(), "splay=1".to_string()])?;
        eprintln!("selftest: configured {identity}");
    }
    for identity in &identities {
        let conf = PathBuf::from(get("server_dir")?)
            .join(identity)
            .join("server.conf");
        let text = std::fs::read_to_string(&conf).ctx(|| format!("reading {}", conf.display()))?;
        if !text
            .lines()
            .any(|l| l == "plugin.choria.server.provision=false")
        {
            return Err(Error::Failed(format!(
                "{identity}: {} was not rewritten by configure",
                conf.display()
            )));
        }
    }
    let admin = PathBuf::from(get("admin_config")?);
    wait_for_servers(&choria, &admin, &identities, Duration::from_secs(60)).map_err(|e| {
        Error::Failed(format!(
            "provisioned servers not answering in their new collective: {e}"
        ))
    })?;
    eprintln!(
        "selftest: all {} servers provisioned and answering in {}",
        identities.len(),
        get("provisioned_collective")?
    );
    Ok(())
}

/// Run the sample helper with `input` on its standard input; its JSON reply.
fn run_helper(helper: &Path, input: &serde_json::Value) -> Result<serde_json::Value> {
    use std::io::Write as _;
    let mut child = Command::new(helper)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ctx(|| "starting the helper".into())?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input.to_string().as_bytes())
            .ctx(|| "writing to the helper".into())?;
    }
    let out = child
        .wait_with_output()
        .ctx(|| "waiting for the helper".into())?;
    serde_json::from_slice(&out.stdout)
        .map_err(|_| Error::Failed("the helper printed no JSON".into()))
}
