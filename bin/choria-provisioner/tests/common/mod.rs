//! Shared harness of the end-to-end tests: a broker, a signer and a scratch directory, the
//! provisioner binary started through test-support's provisioner harness (with waits that yield
//! to the simulated fleet running in this process), its `/metrics`, and that fleet; the binary's
//! other commands (`check`, `policy eval`, fleet control) run to their end; the assertions the
//! tests share on a provisioner's output, log file and metrics and on the fleet; and the leader
//! election bucket.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use choria_fleet_sim::crypto::{JwtSigner, JwtVerifier};
use choria_fleet_sim::{FleetConfig, Mode, ProvisioningJwt, SimFleet};
pub use choria_rpc_client::async_nats;
pub use test_support::metrics::{http_get, metric};
pub use test_support::provisioner::{Launch, Provisioner};
use test_support::provisioner::{ProvisionerProcess, READY};
use test_support::NatsServer;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_choria-provisioner");

/// The provisioning token shared by the fleet and the provisioner.
pub const TOKEN: &str = "s3cret-test-token";

/// The workspace root.
pub fn workspace() -> PathBuf {
    test_support::workspace_root()
}

/// A sample helper from `docs/examples`.
pub fn example_helper(name: &str) -> String {
    workspace()
        .join("docs/examples")
        .join(name)
        .display()
        .to_string()
}

/// A test helper from `tests/helpers`.
pub fn test_helper(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/helpers")
        .join(name)
        .display()
        .to_string()
}

/// An ed25519 signer: the provisioning JWT signer, server JWT issuer and `jwt_verify_cert`.
pub struct Signer {
    /// File holding the 64 hex character seed.
    pub seed_file: PathBuf,
    /// The seed, hex.
    pub seed_hex: String,
    /// The public key, hex.
    pub public_hex: String,
}

impl Signer {
    /// A fresh signer whose seed is written into `dir`.
    pub fn new(dir: &Path) -> Self {
        let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
        let seed_hex = hex::encode(key.to_bytes());
        let public_hex = hex::encode(key.verifying_key().to_bytes());
        let seed_file = dir.join("signer.seed");
        std::fs::write(&seed_file, &seed_hex).unwrap();
        Signer {
            seed_file,
            seed_hex,
            public_hex,
        }
    }

    /// The fleet-side signer of provisioning JWTs.
    pub fn jwt_signer(&self) -> JwtSigner {
        JwtSigner::from_key_data(self.seed_hex.as_bytes()).unwrap()
    }

    /// The fleet-side verifier of server JWTs.
    pub fn verifier(&self) -> JwtVerifier {
        choria_fleet_sim::crypto::verifier_from_public_data(&self.public_hex).unwrap()
    }
}

/// Run a command and insist it succeeds; its standard output.
pub fn run(cmd: &mut Command) -> String {
    test_support::stack::run(cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// A finished run of the binary (or another program): whether it succeeded and what it printed.
pub struct Ran {
    /// Whether it exited with status 0.
    pub ok: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Ran {
    /// Run `cmd` to its end.
    pub fn of(cmd: &mut Command) -> Ran {
        let o = cmd.output().unwrap();
        Ran {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Its standard output followed by its standard error.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    /// Insists it succeeded, naming `what` and showing its output when it did not.
    pub fn succeeded(self, what: &str) -> Ran {
        assert!(self.ok, "{what} failed: {}", self.text());
        self
    }
}

/// Runs the binary with `args`.
pub fn cli<S: AsRef<OsStr>>(args: &[S]) -> Ran {
    Ran::of(Command::new(BIN).args(args))
}

/// Runs the binary with `args` followed by `--config yaml --choria-config cfg`.
pub fn cli_on<S: AsRef<OsStr>>(args: &[S], yaml: impl AsRef<Path>, cfg: impl AsRef<Path>) -> Ran {
    Ran::of(
        Command::new(BIN)
            .args(args)
            .arg("--config")
            .arg(yaml.as_ref())
            .arg("--choria-config")
            .arg(cfg.as_ref()),
    )
}

/// Runs `check` on the files `yaml` and `cfg`.
pub fn check_files(yaml: impl AsRef<Path>, cfg: impl AsRef<Path>) -> Ran {
    cli_on(&["check"], yaml, cfg)
}

/// Runs `policy eval --config yaml --input input` followed by `more`.
pub fn policy_eval(yaml: &Path, input: &Path, more: &[&str]) -> Ran {
    Ran::of(
        Command::new(BIN)
            .args(["policy", "eval", "--config"])
            .arg(yaml)
            .arg("--input")
            .arg(input)
            .args(more),
    )
}

/// Runs `choria-provisioner ARGS` on `launch`'s files and insists it succeeds; its output.
pub fn control(launch: &Launch, args: &[&str]) -> String {
    cli_on(args, &launch.config, &launch.choria_config)
        .succeeded(&format!("{args:?}"))
        .text()
}

/// A test certificate authority in `dir`.
pub fn test_ca(dir: &Path) -> test_support::ca::TestCa {
    test_support::ca::TestCa::new(dir).unwrap()
}

/// A plain (jwt) provisioner with `helper`, called `provisioner1`, for a test without a broker
/// of its own: it checks the test token and verifies provisioning JWTs with `signer`.
pub fn provisioner(broker: &str, helper: impl Into<String>, signer: &Signer) -> Provisioner {
    Provisioner::new(
        "provisioner1",
        broker,
        &helper.into(),
        TOKEN,
        &signer.public_hex,
    )
}

/// Start a provisioner whose files are in `dir`.
pub fn start_in(dir: &Path, p: &Provisioner) -> Prov {
    Prov(p.start(Path::new(BIN), dir).unwrap())
}

/// A broker, a signer and a scratch directory for one test.
pub struct Env {
    /// Scratch directory.
    pub dir: tempfile::TempDir,
    /// The broker.
    pub nats: NatsServer,
    /// The signer.
    pub signer: Signer,
}

impl Env {
    /// Start a broker and make a signer.
    pub fn new() -> Self {
        Self::with_broker_config("")
    }

    /// Start a broker whose configuration gets `extra` (users, accounts...).
    pub fn with_broker_config(extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let signer = Signer::new(dir.path());
        Env {
            nats: NatsServer::start_with_config(extra),
            signer,
            dir,
        }
    }

    /// The scratch directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The broker URL.
    pub fn url(&self) -> String {
        self.nats.url()
    }

    /// A fleet of `nodes` called `node-<n>.example.net`, restarting quickly.
    pub fn fleet_config(&self, nodes: usize, mode: Mode) -> FleetConfig {
        let mut c = FleetConfig::new(
            self.url(),
            nodes,
            TOKEN,
            ProvisioningJwt::Sign(self.signer.jwt_signer()),
        );
        c.mode = mode;
        c.identity_prefix = "node".into();
        c.domain = "example.net".into();
        c.restart_delay = Duration::from_millis(300);
        c.workers = 16;
        // Without keys the fleet generates its own, which takes long in an unoptimised build
        // and holds up the end of the test.
        static KEYS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        c.rsa_keys_pem = Some(
            KEYS.get_or_init(|| test_support::ca::rsa_keys_pem(2).unwrap())
                .clone(),
        );
        c
    }

    /// A fleet of `nodes` for a failover: go-choria keeps a provisioning lock for two minutes,
    /// these servers for two seconds, so that the nodes a dead leader was working on are free
    /// again once the standby has taken over; restarting after 200 ms.
    pub fn failover_fleet_config(&self, nodes: usize) -> FleetConfig {
        let mut c = self.fleet_config(nodes, Mode::Plain);
        c.lock_window = Duration::from_secs(2);
        c.restart_delay = Duration::from_millis(200);
        c
    }

    /// A fleet of `nodes` in ed25519 mode that trusts server JWTs issued by the test's signer.
    pub fn ed25519_fleet_config(&self, nodes: usize) -> FleetConfig {
        let mut c = self.fleet_config(nodes, Mode::Ed25519);
        c.issuer_public = Some(self.signer.verifier());
        c
    }

    /// A plain (jwt) provisioner with `helper` on this test's broker, called `provisioner1`: it
    /// checks the test token, verifies provisioning JWTs with the signer, signs server JWTs
    /// with it, and hands the sample helpers the broker in `CHORIA_BROKERS`.
    pub fn provisioner(&self, helper: impl Into<String>) -> Provisioner {
        let mut p =
            provisioner(&self.url(), helper, &self.signer).env("CHORIA_BROKERS", self.url());
        p.jwt_signing_key = Some(self.signer.seed_file.clone());
        p
    }

    /// [`Env::provisioner`] with the sample plain helper.
    pub fn plain(&self) -> Provisioner {
        self.provisioner(example_helper("helper-plain.py"))
    }

    /// [`Env::provisioner`] called `identity`, with `leader_election` and two workers: one of an
    /// HA pair.
    pub fn ha_provisioner(&self, identity: &str, helper: impl Into<String>) -> Provisioner {
        let mut p = self.provisioner(helper);
        p.identity = identity.into();
        p.leader_election = true;
        p.workers = 2;
        p
    }

    /// [`Env::provisioner`] with the `pki` feature and `ca` handed to the helper in
    /// `CHORIA_CA_CERT` and `CHORIA_CA_KEY`.
    pub fn pki_provisioner(
        &self,
        helper: impl Into<String>,
        ca: &test_support::ca::TestCa,
    ) -> Provisioner {
        self.provisioner(helper)
            .env("CHORIA_CA_CERT", ca.cert.display().to_string())
            .env("CHORIA_CA_KEY", ca.key.display().to_string())
            .features(&["jwt", "pki"])
    }

    /// Write the files of a provisioner into the scratch directory; how it is started on them.
    pub fn prepare(&self, p: &Provisioner) -> Launch {
        p.prepare(Path::new(BIN), self.path()).unwrap()
    }

    /// Write the files and start the provisioner.
    pub fn start(&self, p: &Provisioner) -> Prov {
        start_in(self.path(), p)
    }

    /// Write the files, start the provisioner and wait until it is connected.
    pub async fn start_ready(&self, p: &Provisioner) -> Prov {
        let mut prov = self.start(p);
        prov.wait_ready().await;
        prov
    }

    /// Start a simulated fleet in this process.
    pub async fn fleet(&self, cfg: FleetConfig) -> SimFleet {
        SimFleet::start(cfg).await.unwrap()
    }

    /// A client of this test's broker.
    pub async fn client(&self) -> async_nats::Client {
        async_nats::connect(self.url()).await.unwrap()
    }

    /// Publish a startup event for each identity, as servers coming up again would.
    pub async fn announce(&self, identities: &[String]) {
        use choria_rpc_client::lifecycle::LifecycleEvent;
        let nc = self.client().await;
        for id in identities {
            let e = LifecycleEvent::startup(id, "provision_mode_server", "0.30.0");
            nc.publish(e.subject(), e.to_cloudevent_json().unwrap().into())
                .await
                .unwrap();
        }
        nc.flush().await.unwrap();
    }
}

/// A running provisioner, killed when dropped.
pub struct Prov(pub ProvisionerProcess);

impl std::ops::Deref for Prov {
    type Target = ProvisionerProcess;
    fn deref(&self) -> &ProvisionerProcess {
        &self.0
    }
}

impl Prov {
    /// Start a provisioner on files written by hand.
    pub fn launch(launch: &Launch) -> Self {
        Prov(launch.spawn().unwrap())
    }

    /// Wait until its output contains `needle`; panics as soon as it exits.
    pub async fn wait_log(&mut self, needle: &str, timeout: Duration) -> bool {
        poll(timeout, Duration::from_millis(50), || {
            if self.output().contains(needle) {
                return true;
            }
            if let Some(st) = self.0.exited() {
                panic!(
                    "{} exited with {st} while waiting for {needle:?}:\n{}",
                    self.name,
                    self.output()
                );
            }
            false
        })
        .await
    }

    /// Insists its output comes to contain `needle` within `timeout`, showing the output when
    /// it does not.
    pub async fn expect_log(&mut self, needle: &str, timeout: Duration) {
        assert!(
            self.wait_log(needle, timeout).await,
            "{} never logged {needle:?}:\n{}",
            self.name,
            self.output()
        );
    }

    /// Insists its output comes to hold `needle` at least `n` times within `timeout`.
    pub async fn expect_output_count(&self, needle: &str, n: usize, timeout: Duration) {
        assert!(
            wait_until(timeout, || self.output().matches(needle).count() >= n).await,
            "{needle:?} not {n} times in the output:\n{}",
            self.output()
        );
    }

    /// Insists its output so far does not contain `needle`; `why` says what that would mean.
    pub fn expect_not_in_output(&self, needle: &str, why: &str) {
        let out = self.output();
        assert!(!out.contains(needle), "{why}:\n{out}");
    }

    /// Send `sig`, insist on a clean exit and that it came within `limit`.
    pub async fn stop_within(&mut self, sig: &str, limit: Duration) {
        let started = Instant::now();
        self.stop_with(sig).await;
        let took = started.elapsed();
        assert!(
            took < limit,
            "{} took {took:?} to stop on SIG{sig}",
            self.name
        );
    }

    /// Insists its output so far contains `needle`, showing the output when it does not.
    pub fn expect_output(&self, needle: &str) {
        let out = self.output();
        assert!(out.contains(needle), "{needle:?} not in the output:\n{out}");
    }

    /// Wait until the provisioner listens for startup events (so it is connected).
    pub async fn wait_ready(&mut self) {
        assert!(
            self.wait_log(READY, Duration::from_secs(30)).await,
            "{} did not start:\n{}",
            self.name,
            self.output()
        );
    }

    /// A metric, 0 when absent.
    pub fn m(&self, name: &str) -> f64 {
        self.metric(&format!("choria_provisioner_{name}"), None)
            .unwrap_or(0.0)
    }

    /// The `rpc_time_count` of one RPC, 0 when absent.
    pub fn rpc_count(&self, rpc: &str) -> f64 {
        self.metric("choria_provisioner_rpc_time_count", Some(("rpc", rpc)))
            .unwrap_or(0.0)
    }

    /// Wait until `choria_provisioner_<name>` reaches at least `at_least`.
    pub async fn wait_metric(&self, name: &str, at_least: f64, timeout: Duration) -> bool {
        wait_until(timeout, || self.m(name) >= at_least).await
    }

    /// Insists `choria_provisioner_<name>` reaches at least `at_least` within `timeout`,
    /// showing the output when it does not.
    pub async fn expect_metric(&self, name: &str, at_least: f64, timeout: Duration) {
        assert!(
            self.wait_metric(name, at_least, timeout).await,
            "{name} is {} rather than at least {at_least}:\n{}",
            self.m(name),
            self.output()
        );
    }

    /// Asserts the provisioner counted exactly `n` nodes provisioned. The simulated fleet counts
    /// a node when its restart arrives, the provisioner when the reply does, so the metric may
    /// trail the fleet's count by a moment: it is waited for first.
    pub async fn assert_provisioned(&self, n: f64) {
        assert!(
            self.wait_metric("provisioned", n, Duration::from_secs(10))
                .await,
            "provisioned {} of {n}",
            self.m("provisioned")
        );
        assert_eq!(self.m("provisioned"), n);
    }

    /// Send a signal by name (`TERM`, `INT`, `KILL`).
    pub fn signal(&self, sig: &str) {
        assert!(self.0.signal(sig), "kill -{sig} {} failed", self.pid());
    }

    /// Wait for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut status = None;
        poll(timeout, Duration::from_millis(25), || {
            status = self.0.exited();
            status.is_some()
        })
        .await;
        status
    }

    /// Send `sig`, wait for the exit and insist it is a clean one.
    pub async fn stop_with(&mut self, sig: &str) {
        self.signal(sig);
        let st = self.wait_exit(Duration::from_secs(20)).await;
        assert!(
            st.is_some_and(|s| s.success()),
            "{} did not exit cleanly on SIG{sig}: {st:?}\n{}",
            self.name,
            self.output()
        );
    }
}

impl Drop for Prov {
    fn drop(&mut self) {
        if std::env::var_os("E2E_SHOW_LOGS").is_some() {
            eprintln!("==== {} output ====\n{}", self.name, self.output());
        }
    }
}

/// Wait until `f` holds, asking every 100 ms.
pub async fn wait_until(timeout: Duration, f: impl FnMut() -> bool) -> bool {
    poll(timeout, Duration::from_millis(100), f).await
}

/// Ask `f` every `every` until it holds or `timeout` passes; whether it held. The wait yields
/// to the runtime, where the simulated fleet runs, rather than blocking a worker thread.
async fn poll(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// Insists `fleet` counts `n` nodes provisioned within `timeout`, showing its counters and
/// `prov`'s output when it does not.
pub async fn expect_provisioned(fleet: &SimFleet, n: usize, timeout: Duration, prov: &Prov) {
    assert!(
        fleet.wait_provisioned(n, timeout).await,
        "{} of {n} provisioned: {:?}\n{}",
        fleet.provisioned(),
        fleet.stats(),
        prov.output()
    );
}

/// Wait up to 40 s (the start-up splay is up to 5 s, then one round confirms the win) until one
/// of `a` and `b` leads, as `leads` tells; (leader, standby).
pub async fn elect(a: Prov, b: Prov, leads: impl Fn(&Prov) -> bool) -> (Prov, Prov) {
    assert!(
        wait_until(Duration::from_secs(40), || leads(&a) || leads(&b)).await,
        "nobody won:\n{}\n{}",
        a.output(),
        b.output()
    );
    if leads(&a) {
        (a, b)
    } else {
        (b, a)
    }
}

/// Stop `prov` cleanly (SIGTERM) and shut `fleet` down: the end of a test.
pub async fn finish(prov: &mut Prov, fleet: SimFleet) {
    prov.stop_with("TERM").await;
    fleet.shutdown().await;
}

/// Insists the file at `path` comes to contain `needle` within `timeout`, showing the file
/// when it does not.
pub async fn expect_in_file(path: &Path, needle: &str, timeout: Duration) {
    let read = || std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        wait_until(timeout, || read().contains(needle)).await,
        "{needle:?} never reached {}:\n{}",
        path.display(),
        read()
    );
}

/// Connect to `url`, as `user` (name, password) when given.
pub async fn connect_as(url: &str, user: Option<(&str, &str)>) -> async_nats::Client {
    let opts = match user {
        Some((u, p)) => async_nats::ConnectOptions::with_user_and_password(u.into(), p.into()),
        None => async_nats::ConnectOptions::new(),
    };
    opts.connect(url).await.unwrap()
}

/// Create the election bucket as Choria Streams would, with a short TTL so a dead leader's key
/// expires quickly.
pub async fn create_election_bucket(url: &str) -> async_nats::jetstream::kv::Store {
    create_election_bucket_as(url, None).await
}

/// [`create_election_bucket`], connected as `user` (name, password) when given.
pub async fn create_election_bucket_as(
    url: &str,
    user: Option<(&str, &str)>,
) -> async_nats::jetstream::kv::Store {
    async_nats::jetstream::new(connect_as(url, user).await)
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "CHORIA_LEADER_ELECTION".into(),
            max_age: Duration::from_secs(5),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// The election bucket, connected as `user` (name, password) when given.
pub async fn election_bucket(
    url: &str,
    user: Option<(&str, &str)>,
) -> async_nats::jetstream::kv::Store {
    async_nats::jetstream::new(connect_as(url, user).await)
        .get_key_value("CHORIA_LEADER_ELECTION")
        .await
        .unwrap()
}

/// The `choria_provision` actions a node received, in order.
pub fn actions(fleet: &SimFleet, identity: &str) -> Vec<String> {
    fleet
        .node_report(identity)
        .unwrap()
        .actions
        .into_iter()
        .map(|a| a.action)
        .collect()
}

/// Lines of a file, empty when it does not exist.
pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}
