//! The stack of one scenario on test-support's pieces: nats-server in the scenario's directory
//! (a restart keeps the address), the run's files, provisioners started and watched through their
//! log and `/metrics`, the fleet simulator with its report, and small waiting and log helpers.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use test_support::metrics::{metric_sum, scrape as scrape_all};
use test_support::provisioner::{Output, Provisioner, ProvisionerProcess};
use test_support::simulator::Simulator;
use test_support::stack::{write_run_files, RunFiles};
use test_support::{Mode, NatsServer};

pub use test_support::simulator::{NodeReport, Report};

/// The domain of the simulated nodes' identities.
pub const DOMAIN: &str = "fleet.example.net";

/// The broker's extra configuration: simulator reports and large fleets need big messages.
const NATS_EXTRA: &str = "max_payload: 4MB";

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
    /// The settings of the provisioner called `provisioner`; any other is a copy under its own
    /// identity. A scenario changes them before starting one.
    pub provisioner: Provisioner,
    pub mode: Mode,
    /// The provisioners started, in order: output in `<identity>.out` (appended to across
    /// restarts), log in `<identity>.log`.
    pub provisioners: Vec<ProvisionerProcess>,
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
    let nats = NatsServer::start_in_free_port(&dir, NATS_EXTRA, true)?;
    let nats_port = nats.port();
    let url = format!("nats://127.0.0.1:{nats_port}");
    let helper = s
        .helper
        .map(str::to_string)
        .unwrap_or_else(|| env.bins.join("choria-demo-helper").display().to_string());
    let files = write_run_files(&dir, &env.bins)?;
    let mut provisioner = files
        .provisioner(&dir, &url, &helper, s.mode)
        .yaml(s.extra_yaml);
    provisioner.workers = s.workers;
    provisioner.leader_election = s.leader_election;
    provisioner
        .features
        .extend(s.features.iter().map(|f| f.to_string()));
    // Every run of a provisioner goes into one output file.
    provisioner.output = Output::Append;
    Ok(Run {
        dir,
        bins: env.bins.clone(),
        nats,
        nats_port,
        url,
        files,
        provisioner,
        mode: s.mode,
        provisioners: Vec::new(),
    })
}

impl Run {
    /// Write the files of a provisioner named `identity` (the run's settings, under its own
    /// identity, port and log unless it is `provisioner`), start it and wait until it listens
    /// for startup events.
    pub fn start_provisioner(&mut self, identity: &str) -> Result<usize> {
        let settings = if identity == self.provisioner.identity {
            self.provisioner.clone()
        } else {
            self.provisioner.for_identity(identity)
        };
        let mut proc = settings.start(&self.bins.join("choria-provisioner"), &self.dir)?;
        proc.wait_ready(Duration::from_secs(30))?;
        self.provisioners.push(proc);
        Ok(self.provisioners.len() - 1)
    }

    /// Kill provisioner `idx` and start it again on the same files, port and output, and wait
    /// until it listens for startup events.
    pub fn restart(&mut self, idx: usize) -> Result<()> {
        let p = &mut self.provisioners[idx];
        p.restart()?;
        p.wait_ready(Duration::from_secs(30))?;
        Ok(())
    }

    /// Fail when provisioner `idx` exited.
    pub fn alive(&mut self, idx: usize) -> Result<()> {
        Ok(self.provisioners[idx].alive()?)
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

    /// Wait up to a minute until provisioner `idx` counts at least `nodes` nodes provisioned,
    /// failing as soon as it exits.
    pub fn wait_provisioned(&mut self, idx: usize, what: &str, nodes: f64) -> Result<Duration> {
        let name = "choria_provisioner_provisioned";
        self.wait_metric(idx, what, name, nodes, Duration::from_secs(60))
    }

    /// Wait up to a minute until provisioner `idx` counts at least `nodes` provision errors,
    /// failing as soon as it exits.
    pub fn wait_errors(&mut self, idx: usize, what: &str, nodes: f64) -> Result<Duration> {
        let name = "choria_provisioner_provision_errors";
        self.wait_metric(idx, what, name, nodes, Duration::from_secs(60))
    }

    /// Wait up to 90 s until provisioner `idx` counts at least `nodes` provision errors and no
    /// worker is busy any more (every node has failed and nothing is still being tried),
    /// failing as soon as it exits.
    pub fn wait_all_failed(&mut self, idx: usize, what: &str, nodes: usize) -> Result<Duration> {
        wait_for(what, Duration::from_secs(90), || {
            self.alive(idx)?;
            let m = scrape_all(self.provisioners[idx].port);
            Ok(
                metric_sum(&m, "choria_provisioner_provision_errors") >= nodes as f64
                    && metric_sum(&m, "choria_provisioner_busy_workers") == 0.0,
            )
        })
    }

    /// Every node of `report` refused, as [`ensure_refused`] says, by provisioner `idx`'s log.
    pub fn ensure_all_refused(
        &self,
        idx: usize,
        report: &Report,
        never: &[&str],
        words: &[&str],
        why: &str,
    ) -> Result<()> {
        let log = self.log(idx);
        for (id, n) in report {
            ensure_refused(id, n, &log, never, words, why)?;
        }
        Ok(())
    }

    pub fn metric(&self, idx: usize, name: &str) -> f64 {
        metric_sum(&scrape_all(self.provisioners[idx].port), name)
    }

    /// Start the fleet simulator with `nodes` nodes named `<prefix>-N`, the run's signer unless
    /// `args` brings its own JWT source, and a report written at exit.
    pub fn start_sim(
        &self,
        tag: &str,
        prefix: &str,
        nodes: usize,
        args: &[String],
    ) -> Result<Simulator> {
        let report = self.dir.join(format!("report-{tag}.json"));
        let log = self.dir.join(format!("fleet-sim-{tag}.log"));
        let mut cmd = Simulator::command(&self.bins);
        cmd.args(["--broker", &self.url, "--nodes", &nodes.to_string()])
            .args([
                "--mode",
                self.mode.name(),
                "--token",
                &self.provisioner.token,
            ])
            .args(["--identity-prefix", prefix])
            .args(["--restart-delay", "0s", "--progress", "1s"]);
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
        cmd.args(args);
        Ok(Simulator::start(&mut cmd, &report, &log)?)
    }

    /// Stop every provisioner with SIGTERM and insist on a clean exit without a panic.
    pub fn stop_all(&mut self) -> Result<()> {
        for p in &mut self.provisioners {
            p.stop_cleanly(Duration::from_secs(20))?;
        }
        for p in &self.provisioners {
            p.ensure_no_panic()?;
        }
        Ok(())
    }

    pub fn log(&self, idx: usize) -> String {
        self.provisioners[idx].log_text()
    }

    /// Start a fleet of `nodes` slow nodes (300 ms a step, so that a run lasts long enough to be
    /// interrupted) and wait until provisioner `idx` has provisioned five; the simulator and
    /// the count of provisioned nodes by then.
    pub fn start_slow_fleet(
        &mut self,
        idx: usize,
        tag: &str,
        nodes: usize,
    ) -> Result<(Simulator, f64)> {
        let flags = ["--fault-slow".to_string(), "1:300ms".to_string()];
        let sim = self.start_sim(tag, "n", nodes, &flags)?;
        self.wait_provisioned(idx, "a few nodes to be provisioned", 5.0)?;
        Ok((sim, self.metric(idx, "choria_provisioner_provisioned")))
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
        let what = format!("the fleet to be provisioned {when}");
        let t = self.wait_provisioned(idx, &what, nodes as f64)?;
        ensure_all_provisioned(&sim.finish()?)
            .with_context(|| format!("after the fleet {when}"))?;
        Ok(t)
    }

    /// Wait until the simulator counts `nodes` nodes provisioned, failing as soon as provisioner
    /// `idx` exits. After a broker restart or a provisioner's death the fleet is the one to ask:
    /// a node that was restarted while its reply was lost is provisioned although no provisioner
    /// counted it (its restart ends as an RPC timeout).
    pub fn wait_fleet(
        &mut self,
        idx: usize,
        sim: &Simulator,
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

/// Poll `f` until it returns true: test-support's `wait_for` with the suite's error type.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    f: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    test_support::wait_for(what, timeout, f)
}

/// Log lines at WARN or ERROR naming `identity`.
pub fn problem_lines<'a>(log: &'a str, identity: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| {
            (l.contains("\"level\":\"error\"") || l.contains("\"level\":\"warning\""))
                && l.contains(identity)
        })
        .collect()
}

/// Wait up to a minute until one of the provisioners on `ports` leads (its `/metrics` says it
/// is not paused); its place in `ports`.
pub fn wait_leader(ports: &[u16]) -> Result<usize> {
    let mut leader = None;
    wait_for("a leader", Duration::from_secs(60), || {
        leader = ports.iter().position(|&port| {
            let m = scrape_all(port);
            m.contains("choria_provisioner_paused")
                && metric_sum(&m, "choria_provisioner_paused") == 0.0
        });
        Ok(leader.is_some())
    })?;
    leader.context("the leader vanished")
}

/// Every node of `report` provisioned; the first that is not is named with its actions and
/// problems.
pub fn ensure_all_provisioned(report: &Report) -> Result<()> {
    for (id, n) in report {
        ensure!(
            n.provisioned,
            "{id} not provisioned: {:?} {:?}",
            n.actions,
            n.problems
        );
    }
    Ok(())
}

/// `node` was refused: not provisioned, never sent any of `never`, and an error line of `log`
/// names it with one of `words` (case-insensitive). `why` says what failed, for the message.
pub fn ensure_refused(
    id: &str,
    node: &NodeReport,
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
