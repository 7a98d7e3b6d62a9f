//! The stack of one scenario on test-support's pieces: nats-server in the scenario's directory
//! (a restart keeps the address), the run's files, provisioners started and watched through their
//! log and `/metrics`, the fleet simulator with its report, and small waiting and log helpers.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use test_support::metrics::{metric_sum, scrape as scrape_all};
use test_support::stack::{write_run_files, ProvisionerOptions, RunFiles};
use test_support::{Mode, NatsServer, ProcessGuard as Proc};

/// The domain of the simulated nodes' identities.
pub const DOMAIN: &str = "fleet.example.net";

/// The broker's extra configuration: simulator reports and large fleets need big messages.
const NATS_EXTRA: &str = "max_payload: 4MB";

/// Make `path` readable and writable by its owner only (mode 0600).
pub fn private(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {}", path.display()))
}

/// What every scenario shares: the binaries, the suite's directory, the build profile.
pub struct Env {
    /// The directory holding the provisioner, simulator and demo helper.
    pub bins: PathBuf,
    /// `target/faults`: one directory per scenario below it.
    pub base: PathBuf,
    /// Release binaries (`--release`).
    pub release: bool,
}

// ---------------------------------------------------------------------------------------------
// The stack of one scenario.

pub struct Run {
    pub dir: PathBuf,
    pub bins: PathBuf,
    /// nats-server with JetStream, its configuration, store and log in the scenario's
    /// directory: a restart keeps the address and appends to the log.
    pub nats: NatsServer,
    pub nats_port: u16,
    pub url: String,
    pub files: RunFiles,
    pub mode: Mode,
    /// Start provisioners with `--debug`.
    pub debug: bool,
    pub provisioners: Vec<Prov>,
}

pub struct Prov {
    pub proc: Proc,
    pub identity: String,
    pub log: PathBuf,
    pub port: u16,
}

pub struct Setup<'a> {
    pub mode: Mode,
    pub workers: usize,
    pub helper: Option<&'a str>,
    pub extra_yaml: &'a str,
    /// More `features` switched on beside the mode's.
    pub features: &'a [&'a str],
    pub leader_election: bool,
}

impl Setup<'_> {
    pub fn in_mode(mode: Mode) -> Self {
        Setup {
            mode,
            ..Setup::default()
        }
    }
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            mode: Mode::Plain,
            workers: 8,
            helper: None,
            extra_yaml: "",
            features: &[],
            leader_election: false,
        }
    }
}

pub fn setup(env: &Env, name: &str, s: Setup<'_>) -> Result<Run> {
    let dir = env.base.join(name);
    std::fs::create_dir_all(&dir)?;
    let nats = NatsServer::start_in(&dir, test_support::free_port(), NATS_EXTRA, true)?;
    let nats_port = nats.port();
    let url = format!("nats://127.0.0.1:{nats_port}");
    let helper = s
        .helper
        .map(str::to_string)
        .unwrap_or_else(|| env.bins.join("choria-demo-helper").display().to_string());
    let files = write_run_files(
        &dir,
        &env.bins,
        &ProvisionerOptions {
            mode: s.mode,
            workers: s.workers,
            helper: &helper,
            broker: &url,
            identity: "provisioner",
            leader_election: s.leader_election,
            extra_yaml: s.extra_yaml,
        },
    )?;
    if !s.features.is_empty() {
        // The run files end with the `features:` map; continue it.
        let mut yaml = std::fs::read_to_string(&files.provisioner_yaml)?;
        let tail = yaml.rsplit_once("\nfeatures:\n").map(|(_, t)| t);
        ensure!(
            tail.is_some_and(|t| t.lines().all(|l| l.starts_with("  "))),
            "the provisioner YAML does not end with its features map"
        );
        for f in s.features {
            yaml.push_str(&format!("  {f}: true\n"));
        }
        std::fs::write(&files.provisioner_yaml, yaml)?;
    }
    // The YAML holds the token: owner only, as the provisioner asks of files holding secrets.
    private(&files.provisioner_yaml)?;
    Ok(Run {
        dir,
        bins: env.bins.clone(),
        nats,
        nats_port,
        url,
        files,
        mode: s.mode,
        debug: false,
        provisioners: Vec::new(),
    })
}

impl Run {
    /// Start a provisioner named `identity` (its own YAML and Choria config unless it is the
    /// first one) and wait until it listens for startup events.
    pub fn start_provisioner(&mut self, identity: &str) -> Result<usize> {
        let (yaml, cfg, port, log) = if identity == "provisioner" {
            (
                self.files.provisioner_yaml.clone(),
                self.files.choria_cfg.clone(),
                self.files.monitor_port,
                self.dir.join("provisioner.log"),
            )
        } else {
            // A second provisioner: the same settings with its own identity, port and log.
            let port = test_support::free_port();
            let text = std::fs::read_to_string(&self.files.provisioner_yaml)?;
            let text = text
                .replace(
                    &format!("monitor_port: {}", self.files.monitor_port),
                    &format!("monitor_port: {port}"),
                )
                .replace("provisioner.log", &format!("{identity}.log"));
            let yaml = self.dir.join(format!("{identity}.yaml"));
            std::fs::write(&yaml, text)?;
            private(&yaml)?;
            let cfg = self.dir.join(format!("{identity}.cfg"));
            std::fs::write(
                &cfg,
                std::fs::read_to_string(&self.files.choria_cfg)?
                    .replace("identity = provisioner", &format!("identity = {identity}")),
            )?;
            (yaml, cfg, port, self.dir.join(format!("{identity}.log")))
        };
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{identity}.out")))?;
        let start_len = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = Command::new(self.bins.join("choria-provisioner"));
        if self.debug {
            cmd.arg("--debug");
        }
        let proc = Proc::spawn(
            "choria-provisioner",
            cmd.arg("--config")
                .arg(&yaml)
                .arg("--choria-config")
                .arg(&cfg)
                .env("CHORIA_BROKERS", &self.url)
                .env("CHORIA_CA_CERT", &self.files.ca_cert)
                .env("CHORIA_CA_KEY", &self.files.ca_key)
                .env("CHORIA_ISSUER", &self.files.signer_pub)
                .stdout(out.try_clone()?)
                .stderr(out),
        )?;
        self.provisioners.push(Prov {
            proc,
            identity: identity.to_string(),
            log: log.clone(),
            port,
        });
        let idx = self.provisioners.len() - 1;
        wait_for(
            &format!("{identity} to listen for startup events"),
            Duration::from_secs(30),
            || {
                self.alive(idx)?;
                let text = read_from(&log, start_len);
                Ok(text.contains("listening for startup events"))
            },
        )?;
        Ok(idx)
    }

    /// Fail when provisioner `idx` exited or panicked.
    pub fn alive(&mut self, idx: usize) -> Result<()> {
        let p = &mut self.provisioners[idx];
        if !p.proc.running() {
            bail!(
                "{} exited: {}",
                p.identity,
                tail(&self.dir.join(format!("{}.out", p.identity)), 20)
            );
        }
        Ok(())
    }

    /// Wait until metric `name` of provisioner `idx` reaches `at_least`, failing as soon as the
    /// provisioner exits.
    pub fn wait_metric(
        &mut self,
        idx: usize,
        what: &str,
        name: &str,
        at_least: f64,
        timeout: Duration,
    ) -> Result<Duration> {
        wait_for(what, timeout, || {
            self.alive(idx)?;
            Ok(self.metric(idx, name) >= at_least)
        })
    }

    pub fn metric(&self, idx: usize, name: &str) -> f64 {
        metric_sum(&scrape_all(self.provisioners[idx].port), name)
    }

    /// Start the fleet simulator with `nodes` nodes named `<prefix>-N`, the run's signer unless
    /// `args` brings its own JWT source, and a report written at exit.
    pub fn start_sim(&self, tag: &str, prefix: &str, nodes: usize, args: &[String]) -> Result<Sim> {
        let report = self.dir.join(format!("report-{tag}.json"));
        let log = self.dir.join(format!("fleet-sim-{tag}.log"));
        let mut cmd = Command::new(self.bins.join("choria-fleet-sim"));
        cmd.args(["--broker", &self.url, "--nodes", &nodes.to_string()])
            .args(["--mode", self.mode.name(), "--token", &self.files.token])
            .args(["--identity-prefix", prefix])
            .args(["--restart-delay", "0s", "--progress", "1s"])
            .arg("--report")
            .arg(&report);
        if !args
            .iter()
            .any(|a| a == "--provisioning-jwt" || a == "--provisioning-signer")
        {
            cmd.arg("--provisioning-signer")
                .arg(&self.files.signer_seed);
        }
        if !args.iter().any(|a| a == "--domain") {
            cmd.args(["--domain", DOMAIN]);
        }
        if self.mode == Mode::Pki {
            // Pre-made RSA keys: nodes answer gencsr from the first startup event.
            cmd.arg("--rsa-keys").arg(
                test_support::workspace_root()
                    .join("crates/choria-fleet-sim/testdata/rsa-pool.pem"),
            );
        }
        if self.mode == Mode::Ed25519 && !args.iter().any(|a| a == "--issuer-public") {
            cmd.args(["--issuer-public", &self.files.signer_pub]);
        }
        cmd.args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let proc = Proc::spawn("choria-fleet-sim", &mut cmd)?;
        Ok(Sim { proc, report, log })
    }

    /// Stop every provisioner with SIGTERM and insist on a clean exit without a panic.
    pub fn stop_all(&mut self) -> Result<()> {
        for p in &mut self.provisioners {
            if !p.proc.running() {
                continue;
            }
            let st = p.proc.terminate(Duration::from_secs(20));
            ensure!(
                st.is_some_and(|s| s.success()),
                "{} did not stop cleanly on SIGTERM: {st:?}",
                p.identity
            );
        }
        for p in &self.provisioners {
            let out = std::fs::read_to_string(self.dir.join(format!("{}.out", p.identity)))
                .unwrap_or_default();
            let log = std::fs::read_to_string(&p.log).unwrap_or_default();
            ensure!(
                !out.contains("panicked") && !log.contains("panicked"),
                "{} panicked: {}",
                p.identity,
                tail(&self.dir.join(format!("{}.out", p.identity)), 20)
            );
        }
        Ok(())
    }

    pub fn log(&self, idx: usize) -> String {
        std::fs::read_to_string(&self.provisioners[idx].log).unwrap_or_default()
    }

    /// The second phase of a scenario whose fault has cleared: start a clean fleet of `nodes`
    /// (`sim_flags` added), wait for provisioner `idx` to count every one, and insist that the
    /// simulator saw each provisioned. `when` ends both messages ("once the key is back").
    pub fn provision_clear_fleet(
        &mut self,
        idx: usize,
        nodes: usize,
        sim_flags: &[String],
        when: &str,
    ) -> Result<Duration> {
        let sim = self.start_sim("clear", "n", nodes, sim_flags)?;
        let t = self.wait_metric(
            idx,
            &format!("the fleet to be provisioned {when}"),
            "choria_provisioner_provisioned",
            nodes as f64,
            Duration::from_secs(60),
        )?;
        let report = sim.finish()?;
        ensure!(
            report.values().all(|n| n.provisioned),
            "not every node provisioned {when}"
        );
        Ok(t)
    }

    /// Wait until the simulator counts `nodes` nodes provisioned, failing as soon as provisioner
    /// `idx` exits. After a broker restart or a provisioner's death the fleet is the one to ask:
    /// a node that was restarted while its reply was lost is provisioned although no provisioner
    /// counted it (its restart ends as an RPC timeout).
    pub fn wait_fleet(
        &mut self,
        idx: usize,
        sim: &Sim,
        what: &str,
        nodes: usize,
        timeout: Duration,
    ) -> Result<Duration> {
        wait_for(what, timeout, || {
            self.alive(idx)?;
            Ok(sim.provisioned() >= nodes)
        })
    }
}

pub struct Sim {
    pub proc: Proc,
    pub report: PathBuf,
    pub log: PathBuf,
}

/// One node's record from the simulator's report.
#[derive(Debug)]
pub struct NodeRep {
    pub provisioned: bool,
    /// `(action, statuscode)` in arrival order; 255 means the node stayed silent.
    pub actions: Vec<(String, u64)>,
    pub received: Option<Value>,
    pub problems: Vec<String>,
}

impl NodeRep {
    pub fn saw(&self, action: &str) -> bool {
        self.actions.iter().any(|(a, _)| a == action)
    }
    pub fn ok_count(&self, action: &str) -> usize {
        self.actions
            .iter()
            .filter(|(a, c)| a == action && *c == 0)
            .count()
    }
}

impl Sim {
    /// How many nodes the simulator counts as provisioned, from its latest progress line
    /// (`fleet-sim: 35s 40/40 provisioned, ...`, one a second).
    pub fn provisioned(&self) -> usize {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .rev()
            .find_map(progress_provisioned)
            .unwrap_or(0)
    }

    /// SIGTERM the simulator and read its report.
    pub fn finish(mut self) -> Result<BTreeMap<String, NodeRep>> {
        // SIGTERM again every second: one sent while the simulator is between two waits can be
        // missed.
        let start = Instant::now();
        while self.proc.running() && start.elapsed() < Duration::from_secs(20) {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.proc.pid().to_string())
                .status();
            let tick = Instant::now();
            while self.proc.running() && tick.elapsed() < Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.proc.terminate(Duration::from_secs(5));
        let text = std::fs::read(&self.report).with_context(|| {
            format!(
                "no simulator report {}: {}",
                self.report.display(),
                tail(&self.log, 5)
            )
        })?;
        let v: Vec<Value> = serde_json::from_slice(&text).context("simulator report")?;
        let mut out = BTreeMap::new();
        for n in v {
            let id = n["identity"].as_str().unwrap_or_default().to_string();
            let actions = n["actions"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|x| {
                            (
                                x["action"].as_str().unwrap_or_default().to_string(),
                                x["statuscode"].as_u64().unwrap_or(255),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.insert(
                id,
                NodeRep {
                    provisioned: n["provisioned"].as_bool().unwrap_or(false),
                    actions,
                    received: n.get("received").filter(|r| !r.is_null()).cloned(),
                    problems: n["problems"]
                        .as_array()
                        .map(|p| {
                            p.iter()
                                .filter_map(|s| s.as_str().map(str::to_string))
                                .collect()
                        })
                        .unwrap_or_default(),
                },
            );
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Small utilities.

pub fn identities(prefix: &str, nodes: usize) -> Vec<String> {
    let width = nodes.max(1).to_string().len();
    (1..=nodes)
        .map(|i| format!("{prefix}-{i:0width$}.{DOMAIN}"))
        .collect()
}

/// The simulator's choice of affected nodes: FNV-1a of `<salt>:<identity>` modulo 1000 below
/// `share * 1000` (crates/choria-fleet-sim/src/config.rs).
pub fn affected(salt: &str, identity: &str, share: f64) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in salt
        .bytes()
        .chain(std::iter::once(b':'))
        .chain(identity.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    ((h % 1000) as f64) < (share.clamp(0.0, 1.0) * 1000.0).round()
}

/// The provisioned count of one simulator progress line, `None` for any other line.
pub fn progress_provisioned(line: &str) -> Option<usize> {
    let mut words = line.strip_prefix("fleet-sim: ")?.split_whitespace();
    words.next()?.strip_suffix('s')?;
    let (done, _) = words.next()?.split_once('/')?;
    (words.next()? == "provisioned,").then_some(())?;
    done.parse().ok()
}

pub fn wait_for(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if f()? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

pub fn read_from(path: &Path, offset: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    use std::io::Seek;
    let _ = f.seek(std::io::SeekFrom::Start(offset));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// Log lines at WARN or ERROR naming `identity`.
pub fn problem_lines<'a>(log: &'a str, identity: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| (l.contains(" ERROR ") || l.contains(" WARN ")) && l.contains(identity))
        .collect()
}

/// `node` was refused: not provisioned, never sent any of `never`, and an error line of `log`
/// names it with one of `words` (case-insensitive). `why` says what failed, for the message.
pub fn ensure_refused(
    id: &str,
    node: &NodeRep,
    log: &str,
    never: &[&str],
    words: &[&str],
    why: &str,
) -> Result<()> {
    ensure!(!node.provisioned, "{id} provisioned although {why}");
    for a in never {
        ensure!(
            !node.saw(a),
            "{id} was sent {a} although {why}: {:?}",
            node.actions
        );
    }
    let lines = problem_lines(log, id);
    ensure!(
        lines.iter().any(|l| {
            let l = l.to_lowercase();
            words.iter().any(|w| l.contains(&w.to_lowercase()))
        }),
        "no error line names {id} with any of {words:?}; lines: {lines:#?}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::progress_provisioned;

    #[test]
    pub fn the_provisioned_count_is_read_from_progress_lines_only() {
        let line = "fleet-sim: 35s 32/40 provisioned, 33 configured, 0 broken, 0 shut down, 141 requests, 133 replies (0 discovery), 0 ignored, 137 events";
        assert_eq!(progress_provisioned(line), Some(32));
        assert_eq!(
            progress_provisioned("fleet-sim: 40 nodes up on nats://127.0.0.1:41927 (Plain, V1)"),
            None
        );
        assert_eq!(
            progress_provisioned("fleet-sim: 40/40 nodes provisioned"),
            None
        );
        assert_eq!(
            progress_provisioned("fleet-sim: 5s x/40 provisioned, 0 configured"),
            None
        );
        assert_eq!(progress_provisioned("something else"), None);
    }
}
