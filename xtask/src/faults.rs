//! `cargo xtask faults`: the fault-injection suite.
//!
//! Every scenario runs the real provisioner, fleet simulator, nats-server and a helper on
//! loopback, injects one fault, and checks the same invariants:
//!
//! 1. the provisioner neither panics nor exits, and stops cleanly on SIGTERM at the end;
//! 2. no node that failed a check was configured (read from the simulator's `--report`);
//! 3. every node is provisioned once the fault clears, within the stated time;
//! 4. the error counters on `/metrics` and the provisioner's log name what happened.
//!
//! Node faults are fixed for the life of a simulated fleet (the simulator picks the affected
//! nodes by a hash of their identity), so "the fault clears" means the simulator is started again
//! without the fault: every node comes back in provisioning mode and announces itself with a
//! startup event, which is what makes the provisioner try the failed nodes again (discovery runs
//! only once a minute). Helper faults clear by switching the helper script to the working helper.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::stack::{self, metric_sum, scrape_all, Mode, Proc, ProvisionerOptions, RunFiles};
use crate::tools::root;

const DOMAIN: &str = "fleet.example.net";

/// `cargo xtask faults [--release] [--list] [SCENARIO...]`.
pub fn main(args: &[String]) -> Result<()> {
    let mut release = false;
    let mut only = Vec::new();
    for a in args {
        match a.as_str() {
            "--release" => release = true,
            "--list" => {
                for s in scenarios() {
                    println!("{:<22} {}", s.name, s.about);
                }
                return Ok(());
            }
            s if s.starts_with('-') => {
                bail!("unknown faults flag {s:?} (--release, --list, SCENARIO...)")
            }
            s => only.push(s.to_string()),
        }
    }
    let all = scenarios();
    for o in &only {
        ensure!(
            all.iter().any(|s| s.name == o),
            "unknown scenario {o:?}; see --list"
        );
    }
    eprintln!("faults: building the provisioner, the fleet simulator and the demo helper");
    let bins = stack::build_binaries(release)?;
    let base = root().join("target/faults");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base)?;
    let env = Env {
        bins,
        base,
        release,
    };
    let started = Instant::now();
    let chosen: Vec<&Scenario> = all
        .iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    let run_one = |s: &Scenario| {
        eprintln!("faults: {} — {}", s.name, s.about);
        let t = Instant::now();
        let res = (s.run)(&env, s.name);
        let took = t.elapsed();
        match &res {
            Ok(note) => eprintln!(
                "faults: {} PASS in {:.1}s: {note}",
                s.name,
                took.as_secs_f64()
            ),
            Err(e) => eprintln!(
                "faults: {} FAIL after {:.1}s: {e:#}\n  files: {}",
                s.name,
                took.as_secs_f64(),
                env.base.join(s.name).display()
            ),
        }
        (s.name, took, res)
    };
    let mut results: Vec<(&str, Duration, Result<String>)> = std::thread::scope(|scope| {
        let long: Vec<_> = chosen
            .iter()
            .filter(|s| s.long)
            .map(|s| scope.spawn(|| run_one(s)))
            .collect();
        let mut out: Vec<_> = chosen
            .iter()
            .filter(|s| !s.long)
            .map(|s| run_one(s))
            .collect();
        for h in long {
            match h.join() {
                Ok(r) => out.push(r),
                Err(_) => out.push((
                    "?",
                    Duration::ZERO,
                    Err(anyhow::anyhow!("scenario thread panicked")),
                )),
            }
        }
        out
    });
    let order = |n: &str| all.iter().position(|s| s.name == n).unwrap_or(usize::MAX);
    results.sort_by_key(|r| order(r.0));
    println!();
    println!("fault suite ({:.0}s)", started.elapsed().as_secs_f64());
    let mut failed = 0;
    for (name, took, res) in &results {
        match res {
            Ok(note) => println!("  PASS {name:<22} {:>6.1}s  {note}", took.as_secs_f64()),
            Err(e) => {
                failed += 1;
                println!("  FAIL {name:<22} {:>6.1}s  {e:#}", took.as_secs_f64());
            }
        }
    }
    if failed > 0 {
        bail!("{failed} of {} fault scenarios failed", results.len());
    }
    Ok(())
}

struct Env {
    bins: PathBuf,
    base: PathBuf,
    release: bool,
}

struct Scenario {
    name: &'static str,
    about: &'static str,
    run: fn(&Env, &str) -> Result<String>,
    /// Mostly waiting out timeouts: run beside the others to keep the suite short.
    long: bool,
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "secrets",
            about: "ed25519 at debug level: no secret reaches a log, metric or helper input",
            run: secrets,
            long: false,
        },
        Scenario {
            name: "node-slow",
            about: "a fifth of the nodes answer after 6 s, past the 4 s inventory timeout",
            run: node_slow,
            long: true,
        },
        Scenario {
            name: "node-silent",
            about: "a fifth of the nodes are discovered but never answer an RPC",
            run: node_silent,
            long: true,
        },
        Scenario {
            name: "node-wrong-identity",
            about: "a fifth of the nodes reply under another identity",
            run: node_wrong_identity,
            long: true,
        },
        Scenario {
            name: "node-garbage",
            about: "a fifth of the nodes answer RPCs with a body that is not JSON",
            run: node_garbage,
            long: false,
        },
        Scenario {
            name: "node-oversize",
            about: "a fifth of the nodes answer RPCs with replies over the 1 MiB limit",
            run: node_oversize,
            long: true,
        },
        Scenario {
            name: "node-duplicate",
            about: "a third of the nodes send every RPC reply twice",
            run: node_duplicate,
            long: false,
        },
        Scenario {
            name: "node-bad-nonce",
            about: "ed25519: a fifth of the nodes sign something other than the nonce",
            run: node_bad_nonce,
            long: false,
        },
        Scenario {
            name: "node-bad-csr",
            about: "pki: a fifth of the nodes send a CSR for another common name",
            run: node_bad_csr,
            long: false,
        },
        Scenario {
            name: "node-bad-csr-signature",
            about: "pki: a fifth of the nodes send a CSR whose signature does not verify",
            run: node_bad_csr_signature,
            long: false,
        },
        Scenario {
            name: "node-denied-san",
            about: "pki: a fifth of the nodes add a DNS name matching cert_deny_list to their CSR",
            run: node_denied_san,
            long: false,
        },
        Scenario {
            name: "node-denied-name",
            about: "pki: nodes named to match cert_deny_list are refused",
            run: node_denied_name,
            long: false,
        },
        Scenario {
            name: "node-configure-fails",
            about: "a fifth of the nodes abort configure",
            run: node_configure_fails,
            long: false,
        },
        Scenario {
            name: "fleet-restart",
            about: "every node restarts (simulator killed and started again) mid-cycle",
            run: fleet_restart,
            long: true,
        },
        Scenario {
            name: "jwt-wrong-key",
            about: "every node serves a provisioning JWT signed by an unknown key",
            run: jwt_wrong_key,
            long: false,
        },
        Scenario {
            name: "jwt-expired",
            about: "every node serves an expired provisioning JWT",
            run: jwt_expired,
            long: false,
        },
        Scenario {
            name: "jwt-not-yet-valid",
            about: "every node serves a provisioning JWT valid only from tomorrow",
            run: jwt_not_yet_valid,
            long: false,
        },
        Scenario {
            name: "jwt-alg-none",
            about: "every node serves an unsigned (alg: none) provisioning JWT",
            run: jwt_alg_none,
            long: false,
        },
        Scenario {
            name: "jwt-hs256",
            about: "every node serves an HS256 JWT keyed with the verification key",
            run: jwt_hs256,
            long: false,
        },
        Scenario {
            name: "lock-held",
            about: "two provisioners without election race for one fleet",
            run: lock_held,
            long: false,
        },
        Scenario {
            name: "helper-hang",
            about: "the helper hangs past its 10 s timeout and leaves a child behind",
            run: helper_hang,
            long: false,
        },
        Scenario {
            name: "helper-exit-1",
            about: "the helper exits non-zero",
            run: helper_exit,
            long: false,
        },
        Scenario {
            name: "helper-silent",
            about: "the helper prints nothing",
            run: helper_silent,
            long: false,
        },
        Scenario {
            name: "helper-garbage",
            about: "the helper prints something that is not JSON",
            run: helper_garbage,
            long: false,
        },
        Scenario {
            name: "helper-flood",
            about: "the helper prints 100 MiB",
            run: helper_flood,
            long: false,
        },
        Scenario {
            name: "helper-bad-upgrade",
            about: "the helper asks for an upgrade to an unparsable version",
            run: helper_bad_upgrade,
            long: false,
        },
        Scenario {
            name: "signing-key-removed",
            about: "ed25519: the JWT signing key disappears while running, then returns",
            run: signing_key_removed,
            long: false,
        },
        Scenario {
            name: "signing-key-rotated",
            about: "ed25519: the JWT signing key is replaced while running",
            run: signing_key_rotated,
            long: false,
        },
        Scenario {
            name: "verify-cert-damaged",
            about: "the jwt_verify_cert file is replaced by a truncated certificate while running, then restored",
            run: verify_cert_damaged,
            long: false,
        },
        Scenario {
            name: "signing-token-rotated",
            about: "ed25519 chain issuer: jwt_signing_token removed, then replaced by another issuer's while running",
            run: signing_token_rotated,
            long: false,
        },
        Scenario {
            name: "broker-restart",
            about: "nats-server restarted while the fleet is being provisioned",
            run: broker_restart,
            long: false,
        },
        Scenario {
            name: "provisioner-sigkill",
            about: "ed25519: the provisioner is killed with SIGKILL mid-run and started again",
            run: provisioner_sigkill,
            long: false,
        },
        Scenario {
            name: "load",
            about: "10,000 nodes (2,000 without --release): half found by discovery while the other half announce at once",
            run: load,
            long: false,
        },
        Scenario {
            name: "queue-full",
            about: "a burst of startup events overflows a 10-entry work queue; the dropped nodes come back with the next discovery",
            run: queue_full,
            long: true,
        },
        Scenario {
            name: "election-bucket-missing",
            about: "leader election on without the bucket, then the bucket is created",
            run: election_bucket_missing,
            long: false,
        },
        Scenario {
            name: "ha-leader-killed",
            about: "two provisioners with leader election; the leader is killed mid-run",
            run: ha_leader_killed,
            long: true,
        },
        Scenario {
            name: "monitor-slowloris",
            about: "slowloris clients on the monitor port during a run: /metrics answers, the fleet is provisioned",
            run: monitor_slowloris,
            long: false,
        },
        Scenario {
            name: "monitor-idle-flood",
            about: "1,000 idle connections held on the monitor port (descriptor limit 1024) during a run",
            run: monitor_idle_flood,
            long: false,
        },
        Scenario {
            name: "event-flood",
            about: "20,000 startup events for bogus nodes (a tenth with hostile identities), then a real fleet of 200",
            run: event_flood,
            long: false,
        },
    ]
}

// ---------------------------------------------------------------------------------------------
// The stack of one scenario.

struct Run {
    dir: PathBuf,
    bins: PathBuf,
    nats: Proc,
    nats_port: u16,
    url: String,
    files: RunFiles,
    mode: Mode,
    /// Start provisioners with `--debug`.
    debug: bool,
    provisioners: Vec<Prov>,
}

struct Prov {
    proc: Proc,
    identity: String,
    log: PathBuf,
    port: u16,
}

struct Setup<'a> {
    mode: Mode,
    workers: usize,
    helper: Option<&'a str>,
    extra_yaml: &'a str,
    leader_election: bool,
}

impl Setup<'_> {
    fn in_mode(mode: Mode) -> Self {
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
            leader_election: false,
        }
    }
}

fn setup(env: &Env, name: &str, s: Setup<'_>) -> Result<Run> {
    let dir = env.base.join(name);
    std::fs::create_dir_all(&dir)?;
    let nats_port = stack::free_port()?;
    let nats = stack::start_nats_on(&dir, nats_port)?;
    let url = format!("nats://127.0.0.1:{nats_port}");
    let helper = s
        .helper
        .map(str::to_string)
        .unwrap_or_else(|| env.bins.join("choria-demo-helper").display().to_string());
    let files = stack::write_run_files(
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
    fn start_provisioner(&mut self, identity: &str) -> Result<usize> {
        let (yaml, cfg, port, log) = if identity == "provisioner" {
            (
                self.files.provisioner_yaml.clone(),
                self.files.choria_cfg.clone(),
                self.files.monitor_port,
                self.dir.join("provisioner.log"),
            )
        } else {
            // A second provisioner: the same settings with its own identity, port and log.
            let port = stack::free_port()?;
            let text = std::fs::read_to_string(&self.files.provisioner_yaml)?;
            let text = text
                .replace(
                    &format!("monitor_port: {}", self.files.monitor_port),
                    &format!("monitor_port: {port}"),
                )
                .replace("provisioner.log", &format!("{identity}.log"));
            let yaml = self.dir.join(format!("{identity}.yaml"));
            std::fs::write(&yaml, text)?;
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
    fn alive(&mut self, idx: usize) -> Result<()> {
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
    fn wait_metric(
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

    fn metric(&self, idx: usize, name: &str) -> f64 {
        metric_sum(&scrape_all(self.provisioners[idx].port), name)
    }

    /// Start the fleet simulator with `nodes` nodes named `<prefix>-N`, the run's signer unless
    /// `args` brings its own JWT source, and a report written at exit.
    fn start_sim(&self, tag: &str, prefix: &str, nodes: usize, args: &[String]) -> Result<Sim> {
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
            cmd.arg("--rsa-keys")
                .arg(root().join("crates/fleet-sim/testdata/rsa-pool.pem"));
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
    fn stop_all(&mut self) -> Result<()> {
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

    fn log(&self, idx: usize) -> String {
        std::fs::read_to_string(&self.provisioners[idx].log).unwrap_or_default()
    }

    /// The second phase of a scenario whose fault has cleared: start a clean fleet of `nodes`
    /// (`sim_flags` added), wait for provisioner `idx` to count every one, and insist that the
    /// simulator saw each provisioned. `when` ends both messages ("once the key is back").
    fn provision_clear_fleet(
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
    fn wait_fleet(
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

struct Sim {
    proc: Proc,
    report: PathBuf,
    log: PathBuf,
}

/// One node's record from the simulator's report.
#[derive(Debug)]
struct NodeRep {
    provisioned: bool,
    /// `(action, statuscode)` in arrival order; 255 means the node stayed silent.
    actions: Vec<(String, u64)>,
    received: Option<Value>,
    problems: Vec<String>,
}

impl NodeRep {
    fn saw(&self, action: &str) -> bool {
        self.actions.iter().any(|(a, _)| a == action)
    }
    fn ok_count(&self, action: &str) -> usize {
        self.actions
            .iter()
            .filter(|(a, c)| a == action && *c == 0)
            .count()
    }
}

impl Sim {
    /// How many nodes the simulator counts as provisioned, from its latest progress line
    /// (`fleet-sim: 35s 40/40 provisioned, ...`, one a second).
    fn provisioned(&self) -> usize {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .rev()
            .find_map(progress_provisioned)
            .unwrap_or(0)
    }

    /// SIGTERM the simulator and read its report.
    fn finish(mut self) -> Result<BTreeMap<String, NodeRep>> {
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

fn identities(prefix: &str, nodes: usize) -> Vec<String> {
    let width = nodes.max(1).to_string().len();
    (1..=nodes)
        .map(|i| format!("{prefix}-{i:0width$}.{DOMAIN}"))
        .collect()
}

/// The simulator's choice of affected nodes: FNV-1a of `<salt>:<identity>` modulo 1000 below
/// `share * 1000` (crates/fleet-sim/src/config.rs).
fn affected(salt: &str, identity: &str, share: f64) -> bool {
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
fn progress_provisioned(line: &str) -> Option<usize> {
    let mut words = line.strip_prefix("fleet-sim: ")?.split_whitespace();
    words.next()?.strip_suffix('s')?;
    let (done, _) = words.next()?.split_once('/')?;
    (words.next()? == "provisioned,").then_some(())?;
    done.parse().ok()
}

fn wait_for(
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

fn read_from(path: &Path, offset: u64) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    use std::io::Seek;
    let _ = f.seek(std::io::SeekFrom::Start(offset));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

/// A labelled sample of `name` whose labels contain `label` (e.g. `action="inventory"`).
fn metric_with(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') && r.contains(label))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Log lines at WARN or ERROR naming `identity`.
fn problem_lines<'a>(log: &'a str, identity: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| (l.contains(" ERROR ") || l.contains(" WARN ")) && l.contains(identity))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Node faults: one fleet with the fault, then the same fleet without it.

/// `node` was refused: not provisioned, never sent any of `never`, and an error line of `log`
/// names it with one of `words` (case-insensitive). `why` says what failed, for the message.
fn ensure_refused(
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

/// The share of the fleet a node fault hits.
const SHARE: f64 = 0.2;

struct NodeFault<'a> {
    /// The simulator's fault switch `--fault-<switch>`; also the salt that picks the nodes.
    switch: &'a str,
    /// The switch's value: the share, unless the switch takes more (`0.2:6s`).
    value: String,
    /// Actions an affected node must never see after its failed check.
    never: &'a [&'a str],
    /// Words (any one, case-insensitive) that an error line naming the node must contain.
    words: &'a [&'a str],
    /// A labelled error counter that must have counted the failures, e.g.
    /// `("choria_provisioner_rpc_errors", "inventory")`.
    counter: Option<(&'a str, &'a str)>,
    /// A line the log must contain somewhere (e.g. a warning without the node's name).
    log_has: Option<&'a str>,
    /// How long the faulty fleet may take to settle.
    settle: Duration,
    setup: Setup<'a>,
}

impl<'a> NodeFault<'a> {
    /// `--fault-<switch> 0.2` on 20 plain nodes: the hit ones are never configured or
    /// restarted and an error line names each with one of `words`, within 60 s.
    fn new(switch: &'a str, words: &'a [&'a str]) -> Self {
        NodeFault {
            switch,
            value: SHARE.to_string(),
            never: &["configure", "restart"],
            words,
            counter: None,
            log_has: None,
            settle: Duration::from_secs(60),
            setup: Setup::default(),
        }
    }

    fn in_mode(self, mode: Mode) -> Self {
        NodeFault {
            setup: Setup { mode, ..self.setup },
            ..self
        }
    }
}

fn node_fault(env: &Env, name: &str, f: NodeFault<'_>) -> Result<String> {
    const NODES: usize = 20;
    let mut run = setup(env, name, f.setup)?;
    let p = run.start_provisioner("provisioner")?;
    let ids = identities("n", NODES);
    let hit: Vec<&String> = ids
        .iter()
        .filter(|i| affected(f.switch, i, SHARE))
        .collect();
    ensure!(
        !hit.is_empty(),
        "the fault selects no node of {} (choose another share)",
        NODES
    );
    let good = NODES - hit.len();

    // Phase 1: the faulty fleet.
    let sim = run.start_sim(
        "fault",
        "n",
        NODES,
        &[format!("--fault-{}", f.switch), f.value],
    )?;
    let t1 = wait_for("the faulty fleet to settle", f.settle, || {
        run.alive(p)?;
        let m = scrape_all(run.provisioners[p].port);
        let done = metric_sum(&m, "choria_provisioner_provisioned");
        let errs = metric_sum(&m, "choria_provisioner_provision_errors");
        let busy = metric_sum(&m, "choria_provisioner_busy_workers");
        let queued = metric_sum(&m, "choria_provisioner_work_queue_entries");
        Ok(done >= good as f64 && errs >= hit.len() as f64 && busy == 0.0 && queued == 0.0)
    })?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    let log = run.log(p);
    for id in &ids {
        let n = report
            .get(id)
            .with_context(|| format!("{id} missing from the report"))?;
        if hit.contains(&id) {
            ensure_refused(id, n, &log, f.never, f.words, "it failed a check")?;
            ensure!(
                n.received.is_none() || f.never.is_empty(),
                "{id} failed a check but received a configuration"
            );
        } else {
            ensure!(
                n.provisioned,
                "{id} was not hit by the fault but is not provisioned: {:?} {:?}",
                n.actions,
                n.problems
            );
        }
    }
    let errors = metric_sum(&metrics, "choria_provisioner_provision_errors");
    ensure!(
        errors >= hit.len() as f64,
        "provision_errors {errors} < {} failed nodes",
        hit.len()
    );
    if let Some(want) = f.log_has {
        ensure!(log.contains(want), "the log has no line with {want:?}");
    }
    let mut counted = String::new();
    if let Some((metric, label)) = f.counter {
        let v = metric_with(&metrics, metric, label);
        ensure!(v >= 1.0, "{metric}{{{label}}} did not count the failures");
        counted = format!(", {metric}{{{label}}}={v}");
    }

    // Phase 2: the fault clears; the restarted fleet announces itself with startup events.
    // Success is read from the log: nodes provisioned in phase 1 may be provisioned again here
    // once their hold expires, so the counter alone cannot tell.
    let log_start = std::fs::metadata(&run.provisioners[p].log)
        .map(|m| m.len())
        .unwrap_or(0);
    let sim = run.start_sim("clear", "n", NODES, &[])?;
    let t2 = wait_for(
        "the failed nodes to be provisioned after the fault cleared",
        Duration::from_secs(60),
        || {
            run.alive(p)?;
            let text = read_from(&run.provisioners[p].log, log_start);
            Ok(hit.iter().all(|id| {
                text.lines()
                    .any(|l| l.contains(" provisioned ") && l.contains(&format!("identity={id}")))
            }))
        },
    )?;
    let report = sim.finish()?;
    for id in &hit {
        let n = report
            .get(*id)
            .with_context(|| format!("{id} missing from the second report"))?;
        ensure!(
            n.provisioned,
            "{id} not provisioned after the fault cleared: {:?} {:?}",
            n.actions,
            n.problems
        );
    }
    run.stop_all()?;
    Ok(format!(
        "{} of {} nodes failed ({errors} provision errors{counted}), none configured; {good} provisioned in {:.1}s; the {} recovered {:.1}s after restart events",
        hit.len(),
        NODES,
        t1.as_secs_f64(),
        hit.len(),
        t2.as_secs_f64()
    ))
}

fn node_slow(env: &Env, name: &str) -> Result<String> {
    let words = &["timeout", "timed out", "no reply", "no response"];
    node_fault(
        env,
        name,
        NodeFault {
            value: format!("{SHARE}:6s"),
            counter: Some(("choria_provisioner_rpc_errors", "inventory")),
            settle: Duration::from_secs(120),
            ..NodeFault::new("slow", words)
        },
    )
}

fn node_silent(env: &Env, name: &str) -> Result<String> {
    let words = &["timeout", "timed out", "no reply", "no response"];
    node_fault(
        env,
        name,
        NodeFault {
            counter: Some(("choria_provisioner_rpc_errors", "jwt")),
            settle: Duration::from_secs(120),
            ..NodeFault::new("drop", words)
        },
    )
}

fn node_wrong_identity(env: &Env, name: &str) -> Result<String> {
    let words = &["identity", "sender", "timeout", "timed out", "no reply"];
    node_fault(
        env,
        name,
        NodeFault {
            settle: Duration::from_secs(120),
            ..NodeFault::new("wrong-identity", words)
        },
    )
}

fn node_garbage(env: &Env, name: &str) -> Result<String> {
    let words = &["bad reply", "invalid", "json", "decode", "parse"];
    node_fault(
        env,
        name,
        NodeFault {
            counter: Some(("choria_provisioner_rpc_errors", "jwt")),
            ..NodeFault::new("garbage", words)
        },
    )
}

fn node_oversize(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault {
            counter: Some(("choria_provisioner_rpc_errors", "jwt")),
            log_has: Some("dropping oversized reply"),
            settle: Duration::from_secs(120),
            ..NodeFault::new("oversize", &["timeout"])
        },
    )
}

/// Duplicated replies must change nothing: every node provisioned once, no error.
fn node_duplicate(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 20;
    let ids = identities("n", nodes);
    let dup = ids
        .iter()
        .filter(|i| affected("duplicate", i, 0.34))
        .count();
    ensure!(dup > 0, "the fault selects no node");
    let sim = run.start_sim(
        "dup",
        "n",
        nodes,
        &["--fault-duplicate".into(), "0.34".into()],
    )?;
    let t = run.wait_metric(
        p,
        "the fleet",
        "choria_provisioner_provisioned",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.actions);
        for a in ["jwt", "configure", "restart"] {
            ensure!(
                n.ok_count(a) == 1,
                "{id} was sent {a} {} times",
                n.ok_count(a)
            );
        }
    }
    let errors = metric_sum(&metrics, "choria_provisioner_provision_errors")
        + metric_sum(&metrics, "choria_provisioner_rpc_errors");
    ensure!(errors == 0.0, "{errors} errors with duplicated replies");
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes ({dup} sending every reply twice) provisioned in {:.1}s, each action once, no error",
        t.as_secs_f64()
    ))
}

fn node_bad_nonce(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("bad-nonce", &["nonce"]).in_mode(Mode::Ed25519),
    )
}

fn node_bad_csr(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("bad-csr", &["common name", "csr"]).in_mode(Mode::Pki),
    )
}

fn node_bad_csr_signature(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("bad-csr-signature", &["signature"]).in_mode(Mode::Pki),
    )
}

/// Nodes whose CSR carries a DNS name (not the common name) matching the deny list.
fn node_denied_san(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault::new("denied-san", &["privileged.choria"]).in_mode(Mode::Pki),
    )
}

/// Nodes whose own name matches the deny list: refused for good, nothing configured.
fn node_denied_name(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Pki))?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 6;
    let sim = run.start_sim(
        "denied",
        "n",
        nodes,
        &["--domain".into(), "web.privileged.choria".into()],
    )?;
    let t = run.wait_metric(
        p,
        "every node to be refused",
        "choria_provisioner_provision_errors",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let provisioned = run.metric(p, "choria_provisioner_provisioned");
    let report = sim.finish()?;
    ensure!(provisioned == 0.0, "{provisioned} denied nodes provisioned");
    let log = run.log(p);
    for (id, n) in &report {
        ensure_refused(
            id,
            n,
            &log,
            &["configure"],
            &["privileged"],
            "it matches the deny list",
        )?;
    }
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes named *.web.privileged.choria refused in {:.1}s, none configured (no recovery: the name itself is denied)",
        t.as_secs_f64()
    ))
}

fn node_configure_fails(env: &Env, name: &str) -> Result<String> {
    node_fault(
        env,
        name,
        NodeFault {
            value: format!("configure:{SHARE}"),
            never: &["restart"],
            counter: Some(("choria_provisioner_rpc_errors", "configure")),
            settle: Duration::from_secs(90),
            ..NodeFault::new("fail-action", &["configure"])
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Lying provisioning JWTs: served by every node, so every node must be refused.

fn b64url(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        let chars = c.len() + 1;
        for i in 0..chars {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn prov_claims(run: &Run, nbf: i64, exp: i64) -> String {
    serde_json::json!({
        "cht": run.files.token, "chs": false, "chu": run.url, "chpd": true,
        "extensions": null, "ou": "choria", "purpose": "choria_provisioning",
        "iss": "Choria Tokens Package", "sub": "choria_provisioning",
        "exp": exp, "nbf": nbf, "iat": nbf, "jti": "faults"
    })
    .to_string()
}

/// Sign `header.claims` with the run's ed25519 seed through openssl.
fn eddsa_sign(run: &Run, signing_input: &str) -> Result<String> {
    Ok(b64url(&eddsa_raw(
        &run.files.signer_seed,
        &run.dir,
        signing_input,
    )?))
}

/// An ed25519 signature of `data` by the hex seed in `seed_file` (with openssl, so the xtask
/// needs no crypto crate).
fn eddsa_raw(seed_file: &Path, dir: &Path, data: &str) -> Result<Vec<u8>> {
    let seed_hex = std::fs::read_to_string(seed_file)?;
    let seed = hex_decode(seed_hex.trim()).context("signer seed is not hex")?;
    ensure!(seed.len() == 32, "signer seed is not 32 bytes");
    // PKCS#8 wrapping of an ed25519 seed.
    let mut der = hex_decode("302e020100300506032b657004220420").unwrap_or_default();
    der.extend_from_slice(&seed);
    let key = dir.join("forge-key.der");
    std::fs::write(&key, der)?;
    let input = dir.join("forge-input");
    std::fs::write(&input, data)?;
    let out = Command::new("openssl")
        .args(["pkeyutl", "-sign", "-rawin", "-keyform", "DER", "-inkey"])
        .arg(&key)
        .arg("-in")
        .arg(&input)
        .output()
        .context("openssl is needed to forge JWTs")?;
    ensure!(
        out.status.success(),
        "openssl pkeyutl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn hmac_sha256(key: &str, data: &str, dir: &Path) -> Result<String> {
    let input = dir.join("forge-hmac-input");
    std::fs::write(&input, data)?;
    let out = Command::new("openssl")
        .args(["dgst", "-sha256", "-binary", "-hmac", key])
        .arg(&input)
        .output()?;
    ensure!(out.status.success(), "openssl dgst failed");
    Ok(b64url(&out.stdout))
}

enum Forge {
    WrongKey,
    Expired,
    NotYetValid,
    AlgNone,
    Hs256,
}

fn jwt_fault(env: &Env, name: &str, forge: Forge, words: &[&str]) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let now = unix_now();
    let flags: Vec<String> = match forge {
        Forge::WrongKey => {
            let other = run.dir.join("other-signer");
            stack::init_signer(&run.bins, &other)?;
            vec![
                "--provisioning-signer".into(),
                other.join("signer.seed").display().to_string(),
            ]
        }
        _ => {
            let (alg, nbf, exp) = match forge {
                Forge::Expired => ("EdDSA", now - 7200, now - 3600),
                Forge::NotYetValid => ("EdDSA", now + 86_400, now + 2 * 86_400),
                Forge::AlgNone => ("none", now, now + 3600),
                _ => ("HS256", now, now + 3600),
            };
            let head = b64url(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#).as_bytes());
            let body = b64url(prov_claims(&run, nbf, exp).as_bytes());
            let input = format!("{head}.{body}");
            let sig = match alg {
                "EdDSA" => eddsa_sign(&run, &input)?,
                "none" => String::new(),
                _ => hmac_sha256(&run.files.signer_pub, &input, &run.dir)?,
            };
            let file = run.dir.join("forged.jwt");
            std::fs::write(&file, format!("{input}.{sig}"))?;
            vec!["--provisioning-jwt".into(), file.display().to_string()]
        }
    };
    let nodes = 10;
    let sim = run.start_sim("fault", "n", nodes, &flags)?;
    let t1 = run.wait_metric(
        p,
        "every node to be refused",
        "choria_provisioner_provision_errors",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let provisioned = run.metric(p, "choria_provisioner_provisioned");
    let report = sim.finish()?;
    ensure!(
        provisioned == 0.0,
        "{provisioned} nodes provisioned with a forged JWT"
    );
    let log = run.log(p);
    for (id, n) in &report {
        let never = ["gen25519", "gencsr", "configure", "restart"];
        ensure_refused(id, n, &log, &never, words, "its JWT was forged")?;
    }
    let t2 = run.provision_clear_fleet(p, nodes, &[], "with a genuine JWT")?;
    run.stop_all()?;
    Ok(format!(
        "all {nodes} refused in {:.1}s, nothing configured; provisioned {:.1}s after restarting with a genuine JWT",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

fn jwt_wrong_key(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::WrongKey, &["signature", "jwt"])
}
fn jwt_expired(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::Expired, &["expired"])
}
fn jwt_not_yet_valid(env: &Env, name: &str) -> Result<String> {
    jwt_fault(
        env,
        name,
        Forge::NotYetValid,
        &["not yet valid", "not valid yet"],
    )
}
fn jwt_alg_none(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::AlgNone, &["none", "algorithm"])
}
fn jwt_hs256(env: &Env, name: &str) -> Result<String> {
    jwt_fault(env, name, Forge::Hs256, &["hs256", "algorithm"])
}

// ---------------------------------------------------------------------------------------------
// Two provisioners without election on one fleet: the node's provisioning lock keeps each node
// to one of them.

fn lock_held(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let a = run.start_provisioner("provisioner")?;
    let b = run.start_provisioner("provisioner-b")?;
    let nodes = 30;
    let sim = run.start_sim("race", "n", nodes, &[])?;
    let t = wait_for(
        "the fleet to be provisioned",
        Duration::from_secs(120),
        || {
            run.alive(a)?;
            run.alive(b)?;
            let done = run.metric(a, "choria_provisioner_provisioned")
                + run.metric(b, "choria_provisioner_provisioned");
            Ok(done >= nodes as f64)
        },
    )?;
    let held = run.metric(a, "choria_provisioner_lock_held")
        + run.metric(b, "choria_provisioner_lock_held");
    let report = sim.finish()?;
    let mut twice = 0;
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.actions);
        if n.ok_count("configure") > 1 {
            twice += 1;
        }
    }
    ensure!(
        twice == 0,
        "{twice} nodes were configured by both provisioners"
    );
    let lock_lines = run.log(a).matches("provisioning lock held").count()
        + run.log(b).matches("provisioning lock held").count();
    ensure!(
        held as usize >= lock_lines.min(1),
        "lock_held counter {held} but {lock_lines} log lines"
    );
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes provisioned in {:.1}s, each configured once; {held} lock refusals counted and logged",
        t.as_secs_f64()
    ))
}

// ---------------------------------------------------------------------------------------------
// Helper faults: a script that misbehaves until a `fixed` file appears, then runs the demo
// helper.

fn helper_script(env: &Env, name: &str, body: &str) -> Result<(PathBuf, PathBuf)> {
    let dir = env.base.join(name);
    std::fs::create_dir_all(&dir)?;
    let fixed = dir.join("fixed");
    let script = dir.join("helper.sh");
    let demo = env.bins.join("choria-demo-helper").display().to_string();
    let body = body
        .replace("@DEMO@", &demo)
        .replace("@DIR@", &dir.display().to_string());
    let text = format!(
        "#!/bin/sh\n# Misbehaves until {fixed} exists, then behaves.\nif [ -e '{fixed}' ]; then exec '{demo}' \"$@\"; fi\n{body}\n",
        fixed = fixed.display(),
    );
    std::fs::write(&script, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok((script, fixed))
}

/// A misbehaviour shipped in `xtask/faults/helpers/` (`@DEMO@` is the working helper, `@DIR@`
/// the scenario's directory).
fn shipped(name: &str) -> Result<String> {
    let p = root().join("xtask/faults/helpers").join(name);
    std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))
}

fn helper_fault(
    env: &Env,
    name: &str,
    script: &str,
    extra_yaml: &str,
    sim_flags: &[String],
    words: &[&str],
    after: impl FnOnce(&Run) -> Result<String>,
) -> Result<String> {
    let body = shipped(script)?;
    let (helper, fixed) = helper_script(env, name, &body)?;
    let helper_s = helper.display().to_string();
    let mut run = setup(
        env,
        name,
        Setup {
            helper: Some(&helper_s),
            extra_yaml,
            ..Setup::default()
        },
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 6;
    let sim = run.start_sim("fault", "n", nodes, sim_flags)?;
    let t1 = wait_for(
        "every node to fail in the helper",
        Duration::from_secs(90),
        || {
            run.alive(p)?;
            let m = scrape_all(run.provisioners[p].port);
            Ok(
                metric_sum(&m, "choria_provisioner_provision_errors") >= nodes as f64
                    && metric_sum(&m, "choria_provisioner_busy_workers") == 0.0,
            )
        },
    )?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    let log = run.log(p);
    for (id, n) in &report {
        let never = ["configure", "restart"];
        ensure_refused(id, n, &log, &never, words, "the helper failed")?;
    }
    let helper_errors = metric_sum(&metrics, "choria_provisioner_helper_errors");
    let extra = after(&run)?;
    std::fs::write(&fixed, "")?;
    let t2 = run.provision_clear_fleet(p, nodes, sim_flags, "once the helper works")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes failed in {:.1}s, none configured, helper_errors={helper_errors}{extra}; provisioned {:.1}s after the helper was fixed",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

fn helper_hang(env: &Env, name: &str) -> Result<String> {
    let pids = env.base.join(name).join("children");
    std::fs::create_dir_all(&pids)?;
    helper_fault(
        env,
        name,
        "hang.sh",
        "",
        &[],
        &["did not finish", "timeout", "killed"],
        |_| {
            // Every child the helper left behind must be gone with it.
            let mut seen = 0;
            for e in std::fs::read_dir(&pids)? {
                let pid = e?.file_name().to_string_lossy().to_string();
                seen += 1;
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let state = stat
                    .rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next())
                    .unwrap_or("");
                ensure!(
                    stat.is_empty() || state == "Z",
                    "the helper's child {pid} is still running ({state})"
                );
            }
            ensure!(seen > 0, "the hanging helper recorded no child");
            Ok(format!(", {seen} orphaned children all killed"))
        },
    )
}

fn helper_exit(env: &Env, name: &str) -> Result<String> {
    helper_fault(
        env,
        name,
        "exit1.sh",
        "",
        &[],
        &["exit", "status", "helper"],
        |_| Ok(String::new()),
    )
}

fn helper_silent(env: &Env, name: &str) -> Result<String> {
    helper_fault(
        env,
        name,
        "silent.sh",
        "",
        &[],
        &["helper", "empty", "eof", "json"],
        |_| Ok(String::new()),
    )
}

fn helper_garbage(env: &Env, name: &str) -> Result<String> {
    helper_fault(
        env,
        name,
        "garbage.sh",
        "",
        &[],
        &["json", "helper", "invalid"],
        |_| Ok(String::new()),
    )
}

fn helper_flood(env: &Env, name: &str) -> Result<String> {
    helper_fault(
        env,
        name,
        "flood.sh",
        "",
        &[],
        &["more than", "output", "bytes"],
        |run| {
            // The provisioner must not have buffered the flood.
            let pid = run.provisioners[0].proc.pid();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let hwm = status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<u64>().ok())
                .unwrap_or(0);
            ensure!(
                hwm < 100 * 1024,
                "provisioner peak RSS {hwm} KiB after the flood"
            );
            Ok(format!(", provisioner peak RSS {} MiB", hwm / 1024))
        },
    )
}

fn helper_bad_upgrade(env: &Env, name: &str) -> Result<String> {
    helper_fault(
        env,
        name,
        "bad-upgrade.sh",
        // Continues the `features:` map the run files end with.
        "  upgrades: true\nupgrades_repository: https://packages.example.net/choria\n",
        &["--upgradable".into()],
        &["upgrade", "version"],
        |_| Ok(String::new()),
    )
}

// ---------------------------------------------------------------------------------------------
// Signing key faults (ed25519).

fn signing_key_removed(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    let p = run.start_provisioner("provisioner")?;
    let key = run.files.signer_seed.clone();
    let away = run.dir.join("signer.seed.away");
    std::fs::rename(&key, &away)?;
    let nodes = 10;
    // The simulator signs provisioning JWTs with the same seed: give it the moved file.
    let flags = vec![
        "--provisioning-signer".to_string(),
        away.display().to_string(),
    ];
    let sim = run.start_sim("fault", "n", nodes, &flags)?;
    let t1 = run.wait_metric(
        p,
        "every node to fail without a signing key",
        "choria_provisioner_provision_errors",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    let report = sim.finish()?;
    let log = run.log(p);
    for (id, n) in &report {
        ensure_refused(
            id,
            n,
            &log,
            &["configure"],
            &["signer.seed"],
            "the signing key is missing",
        )?;
    }
    std::fs::rename(&away, &key)?;
    let t2 = run.provision_clear_fleet(p, nodes, &[], "once the key is back")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes refused in {:.1}s with the file named, none configured; provisioned {:.1}s after the key returned",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

fn signing_key_rotated(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 10;
    let sim = run.start_sim("before", "n", nodes, &[])?;
    run.wait_metric(
        p,
        "the fleet with the first key",
        "choria_provisioner_provisioned",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    let old = sim.finish()?;
    ensure!(
        old.values().all(|n| n.provisioned),
        "first fleet not provisioned"
    );
    // Rotate: a new seed replaces the file in place; the nodes now trust only the new key.
    let newdir = run.dir.join("rotated");
    let new_pub = stack::init_signer(&run.bins, &newdir)?;
    // The nodes' provisioning JWTs stay signed by the old key (jwt_verify_cert is unchanged);
    // only the server JWT signing key rotates.
    let prov_signer = run.dir.join("provisioning-signer.seed");
    std::fs::copy(&run.files.signer_seed, &prov_signer)?;
    std::fs::copy(newdir.join("signer.seed"), &run.files.signer_seed)?;
    let flags = vec![
        "--issuer-public".to_string(),
        new_pub,
        "--provisioning-signer".to_string(),
        prov_signer.display().to_string(),
    ];
    let sim = run.start_sim("after", "m", nodes, &flags)?;
    let t = run.wait_metric(
        p,
        "the fleet with the rotated key",
        "choria_provisioner_provisioned",
        2.0 * nodes as f64,
        Duration::from_secs(60),
    )?;
    let new = sim.finish()?;
    for (id, n) in &new {
        ensure!(
            n.provisioned,
            "{id} not provisioned after rotation (its JWT must verify with the new key): {:?}",
            n.problems
        );
    }
    run.stop_all()?;
    Ok(format!(
        "a second fleet trusting only the new key provisioned {:.1}s after the file was replaced, no restart",
        t.as_secs_f64()
    ))
}

/// `jwt_verify_cert` names a file that is damaged while running: a certificate whose DER ends
/// inside its first header (which once made the PEM reader spin, pinning every worker).
fn verify_cert_damaged(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let file = run.dir.join("verify.pub");
    std::fs::write(&file, &run.files.signer_pub)?;
    let yaml = std::fs::read_to_string(&run.files.provisioner_yaml)?;
    let line = format!("jwt_verify_cert: {}\n", run.files.signer_pub);
    ensure!(yaml.contains(&line), "no {line:?} in the provisioner YAML");
    std::fs::write(
        &run.files.provisioner_yaml,
        yaml.replace(&line, &format!("jwt_verify_cert: {}\n", file.display())),
    )?;
    let p = run.start_provisioner("provisioner")?;
    std::fs::write(
        &file,
        "-----BEGIN CERTIFICATE-----\nAQ==\n-----END CERTIFICATE-----\n",
    )?;
    let nodes = 10;
    let sim = run.start_sim("fault", "n", nodes, &[])?;
    let t1 = run.wait_metric(
        p,
        "every node to fail on the damaged certificate",
        "choria_provisioner_provision_errors",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    let busy = run.metric(p, "choria_provisioner_busy_workers");
    let report = sim.finish()?;
    let log = run.log(p);
    for (id, n) in &report {
        ensure_refused(
            id,
            n,
            &log,
            &["configure"],
            &["certificate"],
            "its JWT could not be checked",
        )?;
    }
    std::fs::write(&file, &run.files.signer_pub)?;
    let t2 = run.provision_clear_fleet(p, nodes, &[], "once the file is repaired")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes refused in {:.1}s naming the certificate, none configured, {busy} workers busy after; provisioned {:.1}s after the file was repaired, no restart",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

/// A chain issuer for an Organization Issuer network: a new ed25519 signer in `dir`
/// (`signer.seed`, `signer.pub`) and its client JWT `provisioner.jwt`, issued by the org issuer
/// whose seed is `org_seed`, with the trust chain signature over `<jti>.<public key>` that
/// servers check.
fn make_chain_issuer(run: &Run, org_seed: &Path, dir: &Path, jti: &str) -> Result<()> {
    let chain_pub = stack::init_signer(&run.bins, dir)?;
    let org_pub = &run.files.signer_pub;
    let tcs = eddsa_raw(org_seed, dir, &format!("{jti}.{chain_pub}"))?
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let claims = serde_json::json!({
        "callerid": "up=provisioner",
        "purpose": "choria_client_id",
        "public_key": chain_pub,
        "tcs": tcs,
        "iss": format!("I-{org_pub}"),
        "jti": jti,
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
    });
    let input = format!(
        "{}.{}",
        b64url(br#"{"alg":"EdDSA","typ":"JWT"}"#),
        b64url(claims.to_string().as_bytes())
    );
    let sig = b64url(&eddsa_raw(org_seed, dir, &input)?);
    std::fs::write(dir.join("provisioner.jwt"), format!("{input}.{sig}"))?;
    Ok(())
}

/// Every node of `report` provisioned with a server JWT issued through the chain issuer `jti`.
fn check_chain_jwts(report: &BTreeMap<String, NodeRep>, jti: &str) -> Result<()> {
    for (id, n) in report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.problems);
        let r = n.received.as_ref().context("nothing received")?;
        let iss = r["server_jwt_claims"]["iss"].as_str().unwrap_or_default();
        ensure!(
            iss.starts_with(&format!("C-{jti}.")),
            "{id}: server JWT issuer {iss:?}, expected the chain issuer {jti}"
        );
        ensure!(
            r["server_jwt_trust"] == "chain",
            "{id}: server JWT not verified through the chain: {}",
            r["server_jwt_trust"]
        );
    }
    Ok(())
}

fn signing_token_rotated(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    // The run's signer is the Organization Issuer the nodes trust; the provisioner signs with a
    // chain issuer of its own, as in a real Organization Issuer network.
    let org_seed = run.dir.join("org-issuer.seed");
    std::fs::copy(&run.files.signer_seed, &org_seed)?;
    let chain = run.dir.join("chain");
    make_chain_issuer(&run, &org_seed, &chain, "chainone")?;
    let yaml = std::fs::read_to_string(&run.files.provisioner_yaml)?;
    let key_line = format!("jwt_signing_key: {}\n", run.files.signer_seed.display());
    ensure!(
        yaml.contains(&key_line),
        "no {key_line:?} in the provisioner YAML"
    );
    std::fs::write(
        &run.files.provisioner_yaml,
        yaml.replace(
            &key_line,
            &format!(
                "jwt_signing_key: {}\njwt_signing_token: {}\n",
                chain.join("signer.seed").display(),
                chain.join("provisioner.jwt").display()
            ),
        ),
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 10;
    let sim = run.start_sim("first", "a", nodes, &[])?;
    run.wait_metric(
        p,
        "the fleet with the first chain issuer",
        "choria_provisioner_provisioned",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    check_chain_jwts(&sim.finish()?, "chainone")?;

    // The token file disappears: every node fails with the file named, nothing configured.
    let token = chain.join("provisioner.jwt");
    std::fs::remove_file(&token)?;
    let sim = run.start_sim("removed", "b", nodes, &[])?;
    let t1 = run.wait_metric(
        p,
        "every node to fail without the signing token",
        "choria_provisioner_provision_errors",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    let report = sim.finish()?;
    let log = run.log(p);
    for (id, n) in &report {
        ensure_refused(
            id,
            n,
            &log,
            &["configure"],
            &["provisioner.jwt"],
            "the signing token is missing",
        )?;
    }

    // Another chain issuer's seed and token replace the files: used from the next node on.
    let next = run.dir.join("chain-two");
    make_chain_issuer(&run, &org_seed, &next, "chaintwo")?;
    std::fs::copy(next.join("signer.seed"), chain.join("signer.seed"))?;
    std::fs::copy(next.join("provisioner.jwt"), &token)?;
    let sim = run.start_sim("rotated", "b", nodes, &[])?;
    let t2 = run.wait_metric(
        p,
        "the fleet with the second chain issuer",
        "choria_provisioner_provisioned",
        2.0 * nodes as f64,
        Duration::from_secs(60),
    )?;
    check_chain_jwts(&sim.finish()?, "chaintwo")?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes issued through chain issuer one; with the token removed {nodes} refused in {:.1}s naming the file, none configured; after rotation to chain issuer two {nodes} provisioned {:.1}s later with JWTs through it, no restart",
        t1.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

// ---------------------------------------------------------------------------------------------
// Infrastructure.

fn broker_restart(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 40;
    // Slow nodes keep the run going long enough to pull the broker away mid-run.
    let flags = vec!["--fault-slow".to_string(), "1:300ms".to_string()];
    let sim = run.start_sim("run", "n", nodes, &flags)?;
    run.wait_metric(
        p,
        "a few nodes to be provisioned",
        "choria_provisioner_provisioned",
        5.0,
        Duration::from_secs(60),
    )?;
    let before = run.metric(p, "choria_provisioner_provisioned");
    run.nats.terminate(Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(3));
    run.alive(p)?;
    let during = run.metric(p, "choria_provisioner_provisioned");
    run.nats = stack::start_nats_on(&run.dir, run.nats_port)?;
    let t = run.wait_fleet(
        p,
        &sim,
        "the fleet to finish after the broker came back",
        nodes,
        Duration::from_secs(150),
    )?;
    let counted = run.metric(p, "choria_provisioner_provisioned");
    ensure!(
        counted > during,
        "the provisioner provisioned nothing after the broker came back ({counted})"
    );
    let report = sim.finish()?;
    ensure!(
        report.values().all(|n| n.provisioned),
        "not every node provisioned"
    );
    let log = run.log(p);
    ensure!(
        log.contains("(re)established") || log.to_lowercase().contains("reconnect"),
        "the log does not record the reconnection"
    );
    run.stop_all()?;
    Ok(format!(
        "{before} provisioned before the restart; all {nodes} done {:.1}s after it, {counted} counted by the provisioner (a node restarted while its reply was lost is provisioned but ends as a restart timeout; nodes interrupted mid-cycle come back through the next discovery, at most one 60 s interval)",
        t.as_secs_f64()
    ))
}

fn provisioner_sigkill(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::in_mode(Mode::Ed25519))?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 40;
    let flags = vec!["--fault-slow".to_string(), "1:300ms".to_string()];
    let sim = run.start_sim("run", "n", nodes, &flags)?;
    run.wait_metric(
        p,
        "a few nodes to be provisioned",
        "choria_provisioner_provisioned",
        5.0,
        Duration::from_secs(60),
    )?;
    let before = run.metric(p, "choria_provisioner_provisioned");
    let _ = run.provisioners[p].proc.child.kill();
    let _ = run.provisioners[p].proc.child.wait();
    // The pid file and metrics port are free again; start the same provisioner.
    let old = run.provisioners.remove(p);
    drop(old);
    let q = run.start_provisioner("provisioner")?;
    let t = run.wait_fleet(
        q,
        &sim,
        "the fleet to finish after the restart",
        nodes,
        Duration::from_secs(120),
    )?;
    let counted = run.metric(q, "choria_provisioner_provisioned");
    ensure!(
        counted > 0.0,
        "the restarted provisioner provisioned nothing"
    );
    let report = sim.finish()?;
    let mut twice = 0;
    for (id, n) in &report {
        ensure!(
            n.provisioned,
            "{id} not provisioned (a usable, consistent configuration): {:?} {:?}",
            n.actions,
            n.problems
        );
        if n.ok_count("configure") > 1 {
            twice += 1;
        }
    }
    run.stop_all()?;
    Ok(format!(
        "{before} provisioned before SIGKILL; the restarted provisioner finished the fleet in {:.1}s, {counted} nodes counted by it; {twice} nodes configured twice, each ending with credentials matching its key",
        t.as_secs_f64()
    ))
}

/// Create the election KV bucket's stream over a raw NATS connection (JetStream API).
fn create_election_bucket(port: u16, ttl: Duration) -> Result<()> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = serde_json::json!({
        "name": "KV_CHORIA_LEADER_ELECTION",
        "subjects": ["$KV.CHORIA_LEADER_ELECTION.>"],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs_per_subject": 1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": ttl.as_nanos() as u64,
        "max_msg_size": -1,
        "storage": "file",
        "discard": "new",
        "num_replicas": 1,
        "duplicate_window": 2_000_000_000u64,
        "allow_rollup_hdrs": true,
        "deny_delete": true,
        "deny_purge": false,
        "allow_direct": true,
    })
    .to_string();
    write!(
        s,
        "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":false}}\r\nSUB _INBOX.faults 1\r\nPUB $JS.API.STREAM.CREATE.KV_CHORIA_LEADER_ELECTION _INBOX.faults {}\r\n{req}\r\nPING\r\n",
        req.len()
    )?;
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
        if let Some(i) = got.find("MSG _INBOX.faults") {
            if got[i..].matches("\r\n").count() >= 2 {
                break;
            }
        }
    }
    ensure!(
        got.contains("\"config\"") && !got.contains("\"error\""),
        "creating the election bucket failed: {got}"
    );
    Ok(())
}

fn election_bucket_missing(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(
        env,
        name,
        Setup {
            leader_election: true,
            ..Setup::default()
        },
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 10;
    let sim = run.start_sim("run", "n", nodes, &[])?;
    let t = wait_for(
        "repeated election errors in the log",
        Duration::from_secs(40),
        || {
            run.alive(p)?;
            let log = run.log(p);
            Ok(log
                .lines()
                .filter(|l| l.contains(" ERROR ") && l.contains("leader election"))
                .count()
                >= 2)
        },
    )?;
    ensure!(
        run.metric(p, "choria_provisioner_provisioned") == 0.0,
        "provisioned without an election"
    );
    ensure!(
        run.metric(p, "choria_provisioner_paused") == 1.0,
        "the provisioner is not reported paused"
    );
    let sample = run
        .log(p)
        .lines()
        .find(|l| l.contains(" ERROR ") && l.contains("leader election"))
        .map(|l| l.split_once(" ERROR ").map_or(l, |x| x.1).to_string())
        .unwrap_or_default();
    create_election_bucket(run.nats_port, Duration::from_secs(10))?;
    let t2 = run.wait_metric(
        p,
        "the provisioner to win and provision once the bucket exists",
        "choria_provisioner_provisioned",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    let report = sim.finish()?;
    ensure!(
        report.values().all(|n| n.provisioned),
        "not every node provisioned"
    );
    run.stop_all()?;
    Ok(format!(
        "two errors within {:.1}s, paused=1 (\"{sample}\"); after the bucket was created the fleet was provisioned in {:.1}s",
        t.as_secs_f64(),
        t2.as_secs_f64()
    ))
}

fn ha_leader_killed(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(
        env,
        name,
        Setup {
            leader_election: true,
            ..Setup::default()
        },
    )?;
    create_election_bucket(run.nats_port, Duration::from_secs(10))?;
    let a = run.start_provisioner("provisioner")?;
    let b = run.start_provisioner("provisioner-b")?;
    let leader = |run: &Run| -> Option<usize> {
        [a, b].into_iter().find(|&i| {
            let m = scrape_all(run.provisioners[i].port);
            m.contains("choria_provisioner_paused")
                && metric_sum(&m, "choria_provisioner_paused") == 0.0
        })
    };
    wait_for("a leader", Duration::from_secs(60), || {
        Ok(leader(&run).is_some())
    })?;
    let first = leader(&run).context("leader vanished")?;
    let other = if first == a { b } else { a };
    ensure!(
        run.metric(other, "choria_provisioner_paused") == 1.0,
        "both provisioners are active"
    );
    let nodes = 40;
    let flags = vec!["--fault-slow".to_string(), "1:300ms".to_string()];
    let sim = run.start_sim("run", "n", nodes, &flags)?;
    run.wait_metric(
        first,
        "the leader to provision a few nodes",
        "choria_provisioner_provisioned",
        5.0,
        Duration::from_secs(60),
    )?;
    let before = run.metric(first, "choria_provisioner_provisioned");
    let _ = run.provisioners[first].proc.child.kill();
    let _ = run.provisioners[first].proc.child.wait();
    let killed = Instant::now();
    let took_over = wait_for("the standby to take over", Duration::from_secs(60), || {
        run.alive(other)?;
        Ok(run.metric(other, "choria_provisioner_paused") == 0.0)
    })?;
    // Nodes the dead leader was working on stay locked to it (go-choria's 2 minute lock); the
    // new leader leaves them alone for its 120 s lock hold and finds them again by discovery.
    let t = run.wait_fleet(
        other,
        &sim,
        "the new leader to finish the fleet",
        nodes,
        Duration::from_secs(260),
    )?;
    let counted = run.metric(other, "choria_provisioner_provisioned");
    ensure!(counted > 0.0, "the new leader provisioned nothing");
    let report = sim.finish()?;
    for (id, n) in &report {
        ensure!(
            n.provisioned,
            "{id} not provisioned: {:?} {:?}",
            n.actions,
            n.problems
        );
    }
    ensure!(
        run.log(other).contains("became the leader"),
        "the new leader did not log its election"
    );
    let _ = killed;
    run.stop_all()?;
    Ok(format!(
        "leader killed after {before} nodes; the standby led {:.1}s later and finished the fleet {:.1}s after the kill, {counted} nodes counted by it (nodes locked by the dead leader wait out the 120 s lock hold and the next discovery)",
        took_over.as_secs_f64(),
        t.as_secs_f64() + took_over.as_secs_f64()
    ))
}

// ---------------------------------------------------------------------------------------------
// Secrets: a full provisioning at debug level with every secret set to a unique marker.

fn secrets(env: &Env, name: &str) -> Result<String> {
    let dir = env.base.join(name);
    let inputs = dir.join("helper-inputs");
    std::fs::create_dir_all(&inputs)?;
    // A key the helper supplies for every node (sent to the node encrypted).
    let key = dir.join("helper-key.pem");
    let st = Command::new("openssl")
        .args([
            // PKCS#1, as helpers built on openssl or cfssl print it.
            "genrsa",
            "-traditional",
            "-out",
        ])
        .arg(&key)
        .arg("2048")
        .stderr(Stdio::null())
        .status()
        .context("openssl is needed for the helper-supplied key")?;
    ensure!(st.success(), "openssl genrsa failed");
    // go-choria only takes a key together with a certificate, CA and SSL directory.
    let cert = dir.join("helper-cert.pem");
    let st = Command::new("openssl")
        .args(["req", "-x509", "-days", "1", "-subj", "/CN=secrets", "-key"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()?;
    ensure!(st.success(), "openssl req -x509 failed");
    let key_pem = std::fs::read_to_string(&key)?;
    let key_marker = key_pem.lines().nth(2).context("short key PEM")?.to_string();
    let helper = dir.join("helper.py");
    std::fs::write(
        &helper,
        shipped("record-and-add-key.py")?
            .replace(
                "@DEMO@",
                &env.bins.join("choria-demo-helper").display().to_string(),
            )
            .replace("@INPUTS@", &inputs.display().to_string())
            .replace("@KEY@", &key.display().to_string())
            .replace("@CERT@", &cert.display().to_string()),
    )?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755))?;
    }
    let token = "tok-MARKER-3c9e1f27";
    let broker_pw = "bpw-MARKER-8d41a0c5";
    let node_pw = "npw-MARKER-62f0b9d3";
    let helper_s = helper.display().to_string();
    let extra = format!("broker_provisioning_password: {broker_pw}\n");
    let mut run = setup(
        env,
        name,
        Setup {
            mode: Mode::Ed25519,
            helper: Some(&helper_s),
            extra_yaml: &extra,
            ..Setup::default()
        },
    )?;
    let yaml = std::fs::read_to_string(&run.files.provisioner_yaml)?.replace(
        &format!("token: {}", run.files.token),
        &format!("token: {token}"),
    );
    std::fs::write(&run.files.provisioner_yaml, yaml)?;
    run.files.token = token.to_string();
    run.debug = true;
    let seed = std::fs::read_to_string(&run.files.signer_seed)?
        .trim()
        .to_string();

    // A genuine provisioning JWT carrying the nodes' broker credentials.
    let now = unix_now();
    let head = b64url(br#"{"alg":"EdDSA","typ":"JWT"}"#);
    let claims = serde_json::json!({
        "cht": token, "chs": false, "chu": run.url, "chpd": true,
        "chusr": "nodes", "chpwd": node_pw,
        "extensions": null, "ou": "choria", "purpose": "choria_provisioning",
        "iss": "Choria Tokens Package", "sub": "choria_provisioning",
        "exp": now + 3600, "nbf": now, "iat": now, "jti": "secrets"
    });
    let input = format!("{head}.{}", b64url(claims.to_string().as_bytes()));
    let sig = eddsa_sign(&run, &input)?;
    let prov_jwt = dir.join("provisioning.jwt");
    std::fs::write(&prov_jwt, format!("{input}.{sig}"))?;

    let p = run.start_provisioner("provisioner")?;
    let nodes = 8;
    let flags = vec![
        "--provisioning-jwt".to_string(),
        prov_jwt.display().to_string(),
    ];
    let sim = run.start_sim("run", "n", nodes, &flags)?;
    run.wait_metric(
        p,
        "the fleet",
        "choria_provisioner_provisioned",
        nodes as f64,
        Duration::from_secs(60),
    )?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    let mut server_sigs = Vec::new();
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.problems);
        let r = n.received.as_ref().context("nothing received")?;
        ensure!(
            r["certificate_matches_key"] == Value::Bool(true),
            "{id} did not get the helper's key with its certificate"
        );
        ensure!(
            r["key_received"] == Value::Bool(true),
            "{id} did not receive the helper's key"
        );
        let jwt = r["server_jwt"].as_str().unwrap_or_default();
        server_sigs.push(jwt.rsplit('.').next().unwrap_or_default().to_string());
    }
    run.stop_all()?;
    let check = Command::new(run.bins.join("choria-provisioner"))
        .arg("check")
        .arg("--config")
        .arg(&run.files.provisioner_yaml)
        .arg("--choria-config")
        .arg(&run.files.choria_cfg)
        .output()?;
    let check_out = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let mut markers: Vec<(&str, String)> = vec![
        ("token", token.to_string()),
        ("broker password", broker_pw.to_string()),
        ("node broker password", node_pw.to_string()),
        ("signing key seed", seed.clone()),
        ("helper-supplied key", key_marker),
        ("provisioning JWT", sig),
    ];
    for s in &server_sigs {
        markers.push(("server JWT", s.clone()));
    }
    let places = [
        (
            "the log",
            std::fs::read_to_string(dir.join("provisioner.log"))?,
        ),
        (
            "stdout/stderr",
            std::fs::read_to_string(dir.join("provisioner.out"))?,
        ),
        ("/metrics", metrics),
        ("check", check_out),
    ];
    for (what, text) in &places {
        for (m, v) in &markers {
            ensure!(!text.contains(v.as_str()), "the {m} appears in {what}");
        }
    }
    // The helper receives the token and the nodes' broker password inside the provisioning
    // claims (`jwt.cht`, `jwt.chpwd`, the Go contract) and nothing else secret.
    let mut seen = 0;
    for e in std::fs::read_dir(&inputs)? {
        let text = std::fs::read_to_string(e?.path())?;
        let mut v: Value = serde_json::from_str(&text).context("helper input")?;
        ensure!(
            v["jwt"]["cht"] == token,
            "the helper did not get the token in jwt.cht"
        );
        v["jwt"]["cht"] = Value::Null;
        v["jwt"]["chpwd"] = Value::Null;
        let rest = v.to_string();
        for (m, val) in &markers {
            ensure!(
                !rest.contains(val.as_str()),
                "the {m} appears in the helper input"
            );
        }
        seen += 1;
    }
    ensure!(seen >= nodes, "only {seen} helper inputs recorded");

    // A key file readable by others is reported by `check`.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            &run.files.signer_seed,
            std::fs::Permissions::from_mode(0o644),
        )?;
    }
    let check = Command::new(run.bins.join("choria-provisioner"))
        .arg("check")
        .arg("--config")
        .arg(&run.files.provisioner_yaml)
        .arg("--choria-config")
        .arg(&run.files.choria_cfg)
        .output()?;
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    ensure!(
        out.contains("readable by group or others"),
        "check does not warn about a world-readable signing key: {out}"
    );
    // And so does the daemon at start-up.
    let p = run.start_provisioner("provisioner")?;
    let warned = run
        .log(p)
        .lines()
        .any(|l| l.contains(" WARN ") && l.contains("signer.seed is readable by group or others"));
    run.stop_all()?;
    ensure!(
        warned,
        "the daemon does not warn at start-up about a world-readable signing key"
    );
    Ok(format!(
        "{nodes} nodes provisioned at debug level; {} markers absent from log, output, /metrics, check and {seen} helper inputs (token and node password only inside jwt claims); check and start-up warn on a 0644 key",
        markers.len()
    ))
}

// ---------------------------------------------------------------------------------------------
// Load: discovery and a burst of startup events at the same time.

fn load(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(
        env,
        name,
        Setup {
            workers: 64,
            ..Setup::default()
        },
    )?;
    // 10,000 nodes with release builds; a debug provisioner manages about 2,500 a minute on a
    // busy 2-core machine, so the default run keeps to 2,000.
    let half = if env.release { 5000 } else { 1000 };
    // Already waiting, silent: only discovery finds these.
    let quiet = run.start_sim(
        "discovered",
        "d",
        half,
        &[
            "--startup-rate".into(),
            "0".into(),
            "--exit-when-done".into(),
        ],
    )?;
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    let p = run.start_provisioner("provisioner")?;
    // These arrive all at once through startup events while the first discovery runs.
    let loud = run.start_sim(
        "events",
        "e",
        half,
        &[
            "--startup-rate".into(),
            "20000".into(),
            "--exit-when-done".into(),
        ],
    )?;
    let t = run.wait_metric(
        p,
        "the whole fleet to be provisioned",
        "choria_provisioner_provisioned",
        (2 * half) as f64,
        Duration::from_secs(300),
    )?;
    let metrics = scrape_all(run.provisioners[p].port);
    let discovered = metric_sum(&metrics, "choria_provisioner_discovered");
    let evented = metric_sum(&metrics, "choria_provisioner_event_discovered");
    let errors = metric_sum(&metrics, "choria_provisioner_provision_errors");
    let mut twice = 0;
    for sim in [quiet, loud] {
        for (id, n) in sim.finish()? {
            ensure!(n.provisioned, "{id} not provisioned: {:?}", n.actions);
            if n.ok_count("configure") > 1 {
                twice += 1;
            }
        }
    }
    ensure!(twice == 0, "{twice} nodes configured twice");
    let full = run
        .log(p)
        .lines()
        .filter(|l| l.contains("work queue failed"))
        .count();
    run.stop_all()?;
    let wall = started.elapsed().max(t);
    Ok(format!(
        "{} nodes provisioned {:.1}s after start ({:.0}/min, debug build unless --release), {discovered} queued by discovery, {evented} by events, {errors} errors, {full} queue-full warnings, each node configured once",
        2 * half,
        wall.as_secs_f64(),
        (2 * half) as f64 / wall.as_secs_f64() * 60.0
    ))
}

/// A burst of startup events larger than the work queue: the overflow is dropped with a warning
/// naming each node and queued again by the next discovery; nothing is lost.
fn queue_full(env: &Env, name: &str) -> Result<String> {
    const CAPACITY: usize = 10;
    let mut run = setup(
        env,
        name,
        Setup {
            workers: 2,
            extra_yaml: "work_queue_size: 10\n",
            ..Setup::default()
        },
    )?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 20;
    // Slow replies keep both workers busy while the burst arrives; the first discovery ran
    // before the fleet existed, so only events and the next discovery can find it.
    let flags = vec![
        "--fault-slow".to_string(),
        "1:150ms".to_string(),
        "--startup-rate".to_string(),
        "20000".to_string(),
    ];
    let started = Instant::now();
    let sim = run.start_sim("burst", "n", nodes, &flags)?;
    let mut max_queue = 0.0f64;
    let t = wait_for(
        "the whole fleet, overflow included",
        Duration::from_secs(150),
        || {
            run.alive(p)?;
            let m = scrape_all(run.provisioners[p].port);
            max_queue = max_queue.max(metric_sum(&m, "choria_provisioner_work_queue_entries"));
            Ok(metric_sum(&m, "choria_provisioner_provisioned") >= nodes as f64)
        },
    )?;
    let metrics = scrape_all(run.provisioners[p].port);
    let report = sim.finish()?;
    let log = run.log(p);
    let dropped: std::collections::BTreeSet<String> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("work queue failed"))
        .filter_map(|l| {
            l.split("adding ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .map(str::to_string)
        })
        .collect();
    ensure!(
        !dropped.is_empty(),
        "the burst never filled the queue (no 'work queue failed' warning)"
    );
    ensure!(
        log.contains(&format!("with {CAPACITY} / {CAPACITY} entries")),
        "the warning does not give the queue's size"
    );
    ensure!(
        max_queue <= CAPACITY as f64,
        "work_queue_entries reached {max_queue} with a capacity of {CAPACITY}"
    );
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} lost: {:?} {:?}", n.actions, n.problems);
        ensure!(
            n.ok_count("configure") == 1,
            "{id} configured {} times",
            n.ok_count("configure")
        );
    }
    for id in &dropped {
        ensure!(
            report.contains_key(id),
            "warning names {id}, not a node of the fleet"
        );
    }
    let rediscovered = metric_sum(&metrics, "choria_provisioner_discovered");
    ensure!(
        rediscovered >= dropped.len() as f64,
        "{} nodes dropped but only {rediscovered} queued by discovery",
        dropped.len()
    );
    let cycles = metric_sum(&metrics, "choria_provisioner_discover_cycles");
    run.stop_all()?;
    Ok(format!(
        "{} of {nodes} nodes dropped from a full {CAPACITY}-entry queue with a warning each (the gauge never passed {max_queue}); all {nodes} provisioned once, {:.1}s after the burst, the dropped ones queued again by discovery (cycle {cycles})",
        dropped.len(),
        t.max(started.elapsed()).as_secs_f64()
    ))
}

// ---------------------------------------------------------------------------------------------
// Nodes restarting mid-cycle: the whole simulated fleet is killed and started again.

fn provisioned_in(text: &str) -> std::collections::BTreeSet<String> {
    text.lines()
        .filter(|l| l.contains(" provisioned "))
        .filter_map(|l| l.split("identity=").nth(1))
        .map(|id| id.trim().to_string())
        .collect()
}

fn fleet_restart(env: &Env, name: &str) -> Result<String> {
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let nodes = 30;
    let flags = vec!["--fault-slow".to_string(), "1:300ms".to_string()];
    let sim = run.start_sim("first", "n", nodes, &flags)?;
    run.wait_metric(
        p,
        "a few nodes to be provisioned",
        "choria_provisioner_provisioned",
        5.0,
        Duration::from_secs(60),
    )?;
    // Every node dies at once, mid-cycle for the busy ones, without a report.
    let mut sim = sim;
    let _ = sim.proc.child.kill();
    let _ = sim.proc.child.wait();
    drop(sim);
    std::thread::sleep(Duration::from_secs(1));
    let log_path = run.provisioners[p].log.clone();
    let before = std::fs::read_to_string(&log_path).unwrap_or_default();
    let done_before = provisioned_in(&before);
    let offset = before.len() as u64;
    let sim = run.start_sim("second", "n", nodes, &flags)?;
    let ids = identities("n", nodes);
    let rest: Vec<&String> = ids.iter().filter(|i| !done_before.contains(*i)).collect();
    // Nodes whose old cycle is still waiting on a dead node when their startup event arrives
    // are not queued twice; they come back with the next discovery (one 60 s interval).
    let t = wait_for(
        "every node not provisioned before the restart",
        Duration::from_secs(150),
        || {
            run.alive(p)?;
            let after = provisioned_in(&read_from(&log_path, offset));
            Ok(rest.iter().all(|id| after.contains(*id)))
        },
    )?;
    let report = sim.finish()?;
    for id in &rest {
        let n = report.get(*id).context("missing from the report")?;
        ensure!(
            n.provisioned,
            "{id} not provisioned after the restart: {:?}",
            n.actions
        );
        ensure!(
            n.ok_count("configure") == 1,
            "{id} configured {} times after the restart",
            n.ok_count("configure")
        );
    }
    run.stop_all()?;
    Ok(format!(
        "{} provisioned before every node restarted; the other {} provisioned {:.1}s after the restart",
        done_before.len(),
        rest.len(),
        t.as_secs_f64()
    ))
}

// ---------------------------------------------------------------------------------------------
// The monitor listener under abuse while a fleet is provisioned.

/// The listener's header read timeout and connection cap (crates/metrics/src/http.rs).
const MONITOR_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
const MONITOR_CAP: usize = 256;
/// The longest a scrape may take while the listener is abused.
const SCRAPE_BOUND: Duration = Duration::from_secs(2);

/// Scrapes `/metrics` on `port` every 250 ms until `stop`, recording how long each took and
/// each failure (no complete answer within [`SCRAPE_BOUND`] counts as one).
struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<(Vec<Duration>, Vec<String>)>,
}

impl Scraper {
    fn start(port: u16) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let (mut took, mut failed) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    match timed_scrape(port) {
                        Ok(()) => took.push(t.elapsed()),
                        Err(e) => failed.push(format!("{e:#}")),
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                (took, failed)
            })
        };
        Scraper { stop, handle }
    }

    /// Stop; fail on any failed scrape; the number of scrapes and the slowest.
    fn finish(self) -> Result<(usize, Duration)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (took, failed) = self
            .handle
            .join()
            .map_err(|_| anyhow::anyhow!("the scraper thread panicked"))?;
        ensure!(
            failed.is_empty(),
            "{} of {} scrapes failed, the first: {}",
            failed.len(),
            failed.len() + took.len(),
            failed[0]
        );
        let slowest = took.iter().copied().max().unwrap_or_default();
        Ok((took.len(), slowest))
    }
}

/// One `GET /metrics` answered with 200 and the provisioned counter within [`SCRAPE_BOUND`].
fn timed_scrape(port: u16) -> Result<()> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let start = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, SCRAPE_BOUND)?;
    s.set_read_timeout(Some(SCRAPE_BOUND))?;
    s.set_write_timeout(Some(SCRAPE_BOUND))?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .with_context(|| format!("no complete answer after {:?}", start.elapsed()))?;
    ensure!(
        body.starts_with("HTTP/1.1 200") && body.contains("choria_provisioner_provisioned"),
        "not a metrics page after {:?}: {:.80}",
        start.elapsed(),
        body
    );
    ensure!(
        start.elapsed() <= SCRAPE_BOUND,
        "answered after {:?}",
        start.elapsed()
    );
    Ok(())
}

/// Whether the server closed `s` (end of file or an error on a non-blocking read).
fn closed_by_peer(s: &std::net::TcpStream) -> bool {
    if s.set_nonblocking(true).is_err() {
        return true;
    }
    let mut r = s;
    let mut b = [0u8; 256];
    loop {
        match r.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

/// The descriptor limits of process `pid`: (soft, hard).
fn nofile(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let n = |s: &str| s.parse().unwrap_or(u64::MAX);
    Some((n(w.get(3)?), n(w.get(4)?)))
}

/// Sets process `pid`'s descriptor limits with prlimit (util-linux).
fn set_nofile(pid: u32, soft: u64, hard: u64) -> Result<()> {
    let st = Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--nofile={soft}:{hard}"))
        .status()
        .context("cannot run prlimit (util-linux)")?;
    ensure!(
        st.success(),
        "prlimit --pid {pid} --nofile={soft}:{hard}: {st}"
    );
    Ok(())
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn monitor_slowloris(env: &Env, name: &str) -> Result<String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CLIENTS: usize = 8;
    let nodes = 400;
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let port = run.provisioners[p].port;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    // Each client sends one header byte a second and never finishes its request; when the
    // provisioner closes the connection it notes how long it lasted and starts again.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || -> Result<Vec<Duration>> {
                let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
                let mut lasted = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let s = std::net::TcpStream::connect(("127.0.0.1", port))?;
                    let start = Instant::now();
                    let mut w = &s;
                    for &byte in head.iter().chain(std::iter::repeat(&b'a')) {
                        if stop.load(Ordering::Relaxed) {
                            return Ok(lasted);
                        }
                        if w.write_all(&[byte]).is_err() || closed_by_peer(&s) {
                            lasted.push(start.elapsed());
                            break;
                        }
                        ensure!(
                            start.elapsed() < Duration::from_secs(60),
                            "a slowloris connection was still open after 60 s"
                        );
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
                Ok(lasted)
            })
        })
        .collect();
    // Let the first connections run into the timeout before the fleet starts.
    std::thread::sleep(Duration::from_secs(2));
    let scraper = Scraper::start(port);
    let sim = run.start_sim("fleet", "n", nodes, &[])?;
    let took = run.wait_metric(
        p,
        "the fleet to be provisioned beside the slowloris clients",
        "choria_provisioner_provisioned",
        nodes as f64,
        Duration::from_secs(120),
    )?;
    // Past one more header timeout, so every client has been cut off at least once.
    std::thread::sleep(MONITOR_HEADER_TIMEOUT + Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let (scrapes, slowest) = scraper.finish()?;
    let mut lasted = Vec::new();
    for c in clients {
        lasted.extend(
            c.join()
                .map_err(|_| anyhow::anyhow!("a slowloris thread panicked"))??,
        );
    }
    let report = sim.finish()?;
    ensure!(
        report.values().all(|n| n.provisioned),
        "not every node was provisioned"
    );
    ensure!(
        lasted.len() >= CLIENTS,
        "only {} slowloris connections were closed by the provisioner",
        lasted.len()
    );
    let longest = lasted.iter().copied().max().unwrap_or_default();
    ensure!(
        longest <= MONITOR_HEADER_TIMEOUT + Duration::from_secs(2),
        "a slowloris connection lasted {longest:?}, past the {MONITOR_HEADER_TIMEOUT:?} header timeout"
    );
    run.alive(p)?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes provisioned in {:.1}s beside {CLIENTS} slowloris clients; {} of their connections cut off, the longest after {:.1}s; {scrapes} scrapes, the slowest {} ms",
        took.as_secs_f64(),
        lasted.len(),
        longest.as_secs_f64(),
        slowest.as_millis()
    ))
}

fn monitor_idle_flood(env: &Env, name: &str) -> Result<String> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const FLOOD: usize = 1000;
    let nodes = 400;
    // The flood holds 1,000 sockets in this process.
    let me = std::process::id();
    if let Some((soft, hard)) = nofile(me) {
        if soft < 4096 {
            ensure!(hard >= 4096, "the fault suite needs 4,096 descriptors for this scenario; the hard limit is {hard}");
            set_nofile(me, hard, hard)?;
        }
    }
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let port = run.provisioners[p].port;
    let pid = run.provisioners[p].proc.pid();
    // The limit a service gets without LimitNOFILE (the flood used to exhaust it).
    set_nofile(pid, 1024, 1024)?;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let reopened = std::sync::Arc::new(AtomicUsize::new(0));
    // Keeps FLOOD silent connections open: every half second each one the provisioner closed is
    // opened again.
    let flooder = {
        let stop = std::sync::Arc::clone(&stop);
        let reopened = std::sync::Arc::clone(&reopened);
        std::thread::spawn(move || -> Result<()> {
            let connect = || std::net::TcpStream::connect(("127.0.0.1", port));
            let mut conns = (0..FLOOD)
                .map(|_| connect())
                .collect::<std::io::Result<Vec<_>>>()?;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(500));
                for c in conns.iter_mut() {
                    if closed_by_peer(c) {
                        *c = connect()?;
                        reopened.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(())
        })
    };
    // The flood at its steady state (past one header timeout) before the fleet starts.
    std::thread::sleep(MONITOR_HEADER_TIMEOUT + Duration::from_secs(1));
    let scraper = Scraper::start(port);
    let sim = run.start_sim("fleet", "n", nodes, &[])?;
    let mut most_fds = 0;
    let took = wait_for(
        "the fleet to be provisioned during the flood",
        Duration::from_secs(120),
        || {
            run.alive(p)?;
            most_fds = most_fds.max(open_descriptors(pid));
            Ok(sim.provisioned() >= nodes)
        },
    )?;
    let fleet_count = run.metric(p, "choria_provisioner_provisioned");
    stop.store(true, Ordering::Relaxed);
    flooder
        .join()
        .map_err(|_| anyhow::anyhow!("the flood thread panicked"))??;
    let (scrapes, slowest) = scraper.finish()?;
    let report = sim.finish()?;
    ensure!(
        report.values().all(|n| n.provisioned),
        "not every node was provisioned"
    );
    ensure!(
        fleet_count >= nodes as f64,
        "the provisioner counted {fleet_count} of {nodes} nodes provisioned"
    );
    ensure!(
        most_fds <= MONITOR_CAP + 100,
        "the provisioner held {most_fds} descriptors during the flood (cap {MONITOR_CAP} connections)"
    );
    let log = run.log(p);
    let cap_lines = log
        .lines()
        .filter(|l| l.contains("at the limit of 256 open connections"))
        .count();
    ensure!(
        cap_lines > 0,
        "no log line says the connection limit was reached"
    );
    let accept_lines = log
        .lines()
        .filter(|l| l.contains("accepting a connection"))
        .count();
    ensure!(
        accept_lines == 0,
        "{accept_lines} accept failures logged: the descriptor limit was reached"
    );
    run.alive(p)?;
    run.stop_all()?;
    Ok(format!(
        "{nodes} nodes provisioned in {:.1}s while {FLOOD} idle connections were held (reopened {} times) against a 1024-descriptor limit; the provisioner held at most {most_fds} descriptors; {scrapes} scrapes, the slowest {} ms; {cap_lines} connection-limit log lines",
        took.as_secs_f64(),
        reopened.load(Ordering::Relaxed),
        slowest.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::progress_provisioned;

    #[test]
    fn the_provisioned_count_is_read_from_progress_lines_only() {
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

/// Anyone holding a provisioning JWT can announce nodes: 20,000 startup events for nodes that do
/// not exist (nine in ten valid-looking names, served by nothing that answers; one in ten hostile
/// identities: wildcards, names smuggling certificate names, newlines, 5,000 bytes...), then a
/// real fleet of 200 announcing itself behind them. The real fleet must be provisioned promptly,
/// every hostile identity refused and counted without a request sent for it, and the
/// provisioner's memory and log must stay bounded.
fn event_flood(env: &Env, name: &str) -> Result<String> {
    const BOGUS: usize = 20_000;
    let nodes = 200;
    let mut run = setup(env, name, Setup::default())?;
    let p = run.start_provisioner("provisioner")?;
    let pid = run.provisioners[p].proc.pid();
    let started = Instant::now();
    let sim = run.start_sim(
        "flood",
        "n",
        nodes,
        &["--bogus-events".into(), BOGUS.to_string()],
    )?;
    let took = wait_for(
        "the real fleet behind the flood",
        Duration::from_secs(120),
        || {
            run.alive(p)?;
            Ok(sim.provisioned() >= nodes)
        },
    )?;
    let hostile = (0..BOGUS).filter(|n| n % 10 == 9).count() as f64;
    wait_for(
        "every hostile identity to be refused",
        Duration::from_secs(30),
        || Ok(run.metric(p, "choria_provisioner_invalid_identities") >= hostile),
    )?;
    let refused = run.metric(p, "choria_provisioner_invalid_identities");
    let queued = run.metric(p, "choria_provisioner_event_discovered");
    let hwm_kib = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let report = sim.finish()?;
    let log = run.log(p);
    ensure!(
        refused == hostile,
        "{refused} identities refused, expected {hostile}"
    );
    for (id, n) in &report {
        ensure!(n.provisioned, "{id} not provisioned: {:?}", n.problems);
        let configures = n.ok_count("configure");
        ensure!(configures == 1, "{id} configured {configures} times");
    }
    let lines = log.lines().count();
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    let refusal_lines = log.lines().filter(|l| l.contains("refus")).count();
    ensure!(
        refusal_lines <= 30,
        "{refusal_lines} log lines about refused identities: not summarised"
    );
    ensure!(
        longest < 2048,
        "a log line of {longest} bytes: node text is not bounded"
    );
    ensure!(
        !log.lines().any(|l| l.starts_with("ERROR forged")),
        "a newline in an identity forged a log line"
    );
    ensure!(
        lines < 5_000,
        "{lines} log lines for a flood of {BOGUS}: the log is not bounded"
    );
    ensure!(
        hwm_kib > 0 && hwm_kib < 64 * 1024,
        "provisioner peak RSS {hwm_kib} KiB"
    );
    Ok(format!(
        "{nodes} real nodes provisioned {:.1}s after the flood began ({:.1}s in all); {refused} hostile identities refused and counted, {queued} announcements queued; {lines} log lines ({refusal_lines} about refusals, longest {longest} bytes); provisioner peak RSS {} MiB",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        hwm_kib / 1024
    ))
}
