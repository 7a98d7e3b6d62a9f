//! A simulated fleet provisioned by the installed package: test-support's nats-server, the
//! fleet simulator, and the installed binary with the packaged paths
//! (/etc/choria-provisioner/choria-provisioner.yaml and choria.cfg, root:choria-provisioner
//! 0640) run as the service account. The helper (the demo helper, signing CSRs in `pki` mode)
//! and the CA key it reads sit in /etc/choria-provisioner/fleet, readable through the account's
//! group. Where systemd is PID 1 the real unit runs it; elsewhere [`Sandbox`] does. The image
//! and qemu tests wait on their fleets with [`SimFleet`] too.

use std::fs;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use test_support::metrics::metric_sum;
use test_support::stack::{write_run_files, RunFiles};
use test_support::{Mode, NatsServer, ProcessGuard};

use crate::error::{bail, Context, Result};
use crate::host::{capture, run, section};
use crate::sandbox::{account, Sandbox};
use crate::{CFG, ETC, SERVICE_USER, YAML};

/// How many simulated servers are provisioned.
const NODES: usize = 40;

const LOG: &str = "/var/log/choria-provisioner/choria-provisioner.log";
const AUDIT: &str = "/var/log/choria-provisioner/audit.jsonl";
/// A runtime drop-in giving the real unit the demo helper's environment.
const DROPIN: &str = "/run/systemd/system/choria-provisioner.service.d/dist-install-test.conf";

/// The fleet simulator of a packaged binary's test: `nodes` servers that it exits on once each
/// is provisioned, or after the time it is given.
pub struct SimFleet {
    sim: ProcessGuard,
    nodes: usize,
    within: Duration,
}

impl SimFleet {
    /// Starts `nodes` simulated servers in `mode` for the run of `files` on `url`, named
    /// `prefix-N`, logging to `log`; they are given `within` to be provisioned.
    pub fn start(
        files: &RunFiles,
        bins: &Path,
        url: &str,
        (nodes, mode, prefix): (usize, Mode, &str),
        log: &Path,
        within: Duration,
    ) -> Result<SimFleet> {
        let mut cmd = files.fleet_sim(bins, url, nodes, mode, prefix, log)?;
        // The simulator gives up a little before the test does, so it reports what it saw.
        let own = within.saturating_sub(Duration::from_secs(30)).as_secs();
        cmd.arg("--exit-when-done")
            .args(["--timeout", &format!("{own}s")]);
        let sim = ProcessGuard::spawn("choria-fleet-sim", &mut cmd)?;
        Ok(SimFleet { sim, nodes, within })
    }

    /// Waits for the simulator to exit, failing once the fleet's time has passed or as soon as
    /// `gone` says the provisioner (`what`: where it runs) has stopped.
    pub fn wait(&mut self, what: &str, mut gone: impl FnMut() -> bool) -> Result<ExitStatus> {
        let deadline = Instant::now() + self.within;
        loop {
            if let Some(st) = self.sim.exited() {
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!(
                    "the fleet was not provisioned {what} within {} s",
                    self.within.as_secs()
                );
            }
            if gone() {
                bail!("the provisioner {what} exited while the fleet waited");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Every node was provisioned: the simulator exited successfully and the provisioner's
    /// `metrics` count them all.
    pub fn check(&self, status: ExitStatus, metrics: &str, what: &str) -> Result<()> {
        let done = metric_sum(metrics, "choria_provisioner_provisioned");
        if !status.success() || done < self.nodes as f64 {
            bail!(
                "the fleet was not fully provisioned {what} ({status}; provisioned {done} of {})",
                self.nodes
            );
        }
        Ok(())
    }
}

/// The real user ids of process `pid` (real, effective, saved, file system), from
/// `/proc/<pid>/status`.
pub fn uids(pid: u32) -> Result<Vec<String>> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is not running"))?;
    Ok(status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
        .unwrap_or_default())
}

/// Whether systemd runs this machine (PID 1), so the real unit can be started.
pub fn systemd_is_pid1() -> bool {
    Path::new("/run/systemd/system").is_dir()
        && fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd")
}

/// Provisions [`NODES`] simulated servers with the installed package as its unit runs it.
/// `bins` holds the fleet simulator and the demo helper.
pub fn provision_fleet(bin: &Path, bins: &Path) -> Result<()> {
    let work = std::env::temp_dir().join(format!("dist-fleet-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let result = fleet(bin, bins, &work);
    if result.is_err() {
        for f in [LOG, &work.join("fleet-sim.log").to_string_lossy()] {
            section(
                &format!("{f} (end)"),
                &test_support::logs::tail(Path::new(f), 30),
            );
        }
    }
    let _ = fs::remove_dir_all(&work);
    result
}

fn fleet(bin: &Path, bins: &Path, work: &Path) -> Result<()> {
    let nats = NatsServer::start_in_free_port(work, "", true)?;
    let url = nats.url();
    // The site's files: the demo helper, the CA it signs with, the provisioning JWT signer.
    let site = Path::new(ETC).join("fleet");
    let _ = fs::remove_dir_all(&site);
    fs::create_dir_all(&site)?;
    let helper = site.join("helper");
    fs::copy(bins.join("choria-demo-helper"), &helper)?;
    let files = write_run_files(&site, bins)?;
    let mut settings = files
        .provisioner(work, &url, &helper.to_string_lossy(), Mode::Pki)
        .yaml(&format!("audit_file: {AUDIT}\n"));
    // The packaged paths, as an operator edits them.
    settings.logfile = Some(LOG.into());
    let monitor_port = settings.monitor_port;
    let (yaml, cfg) = settings.write(work)?;
    fs::copy(&yaml, YAML)?;
    fs::copy(&cfg, CFG)?;
    fs::remove_file(&yaml)?;
    fs::remove_file(&cfg)?;
    // Readable by the account's group and no one else, the CA key included.
    let owner = format!("root:{SERVICE_USER}");
    run(Command::new("chown").args(["-R", &owner]).arg(&site))?;
    run(Command::new("chmod")
        .args(["-R", "u=rwX,g=rX,o="])
        .arg(&site))?;
    run(Command::new("chown").arg(&owner).args([YAML, CFG]))?;
    run(Command::new("chmod").args(["0640", YAML, CFG]))?;

    let helper_env = files.helper_env(&url);
    let sandbox = Sandbox::of_unit(&[])?;

    // check as the unit runs it.
    let (ok, text) = sandbox.check(bin, Path::new(YAML), Path::new(CFG))?;
    section(
        "check of the fleet configuration as the unit runs it",
        &text,
    );
    if !ok {
        bail!("check refuses the fleet configuration as {SERVICE_USER}");
    }

    let mut sim = SimFleet::start(
        &files,
        bins,
        &url,
        (NODES, Mode::Pki, "dist-node"),
        &work.join("fleet-sim.log"),
        Duration::from_secs(180),
    )?;

    let real_unit = systemd_is_pid1();
    let started = Instant::now();
    let (pid, mut guard) = if real_unit {
        println!("dist: systemd is PID 1: the fleet is provisioned by the real unit");
        let env: Vec<String> = helper_env
            .iter()
            .map(|(k, v)| format!("Environment={k}={v}"))
            .collect();
        if let Some(d) = Path::new(DROPIN).parent() {
            fs::create_dir_all(d)?;
        }
        fs::write(DROPIN, format!("[Service]\n{}\n", env.join("\n")))?;
        run(Command::new("systemctl").arg("daemon-reload"))?;
        run(Command::new("systemctl").args(["start", "choria-provisioner.service"]))?;
        let pid = capture(Command::new("systemctl").args([
            "show",
            "--property=MainPID",
            "--value",
            "choria-provisioner.service",
        ]))?
        .trim()
        .parse::<u32>()
        .context("systemctl show names no MainPID")?;
        (pid, None)
    } else {
        println!(
            "dist: systemd is not PID 1 here: the real unit cannot run, so the fleet is \
             provisioned under the unit's account and file system view without systemd ({})",
            sandbox.describe()
        );
        let mut cmd = sandbox.command(bin, &["run", "--config", YAML, "--choria-config", CFG])?;
        for (k, v) in &helper_env {
            cmd.env(k, v);
        }
        let out = fs::File::create(work.join("provisioner.out"))?;
        let err = out.try_clone()?;
        let p = ProcessGuard::spawn("provisioner", cmd.stdout(out).stderr(err))?
            .drop_grace(Duration::from_secs(5));
        (p.pid(), Some(p))
    };
    let result = watch(&mut sim, pid, monitor_port, started);
    if real_unit {
        let _ = Command::new("systemctl")
            .args(["stop", "choria-provisioner.service"])
            .status();
        let _ = fs::remove_file(DROPIN);
        let _ = Command::new("systemctl").arg("daemon-reload").status();
    } else if let Some(p) = guard.as_mut() {
        p.terminate(Duration::from_secs(10));
    }
    result?;

    // What the service wrote is the account's.
    for f in [LOG, AUDIT] {
        let st = capture(Command::new("stat").args(["-c", "%U %G"]).arg(f))
            .with_context(|| format!("the provisioner did not write {f}"))?;
        if st.trim() != format!("{SERVICE_USER} {SERVICE_USER}") {
            bail!("{f} is owned by {st:?}, expected {SERVICE_USER}");
        }
    }
    let audit = fs::read_to_string(AUDIT)?;
    println!(
        "ok: {LOG} and {AUDIT} ({} lines) are the account's",
        audit.lines().count()
    );
    Ok(())
}

/// Waits for the simulator to report every node provisioned, checking that the provisioner runs
/// as the service account.
fn watch(sim: &mut SimFleet, pid: u32, port: u16, started: Instant) -> Result<()> {
    let (uid, _, _) = account(SERVICE_USER)?;
    // The sandbox starts as root (mounts), then execs into the account: wait for the exec.
    let want = uid.to_string();
    let settle = Instant::now() + Duration::from_secs(15);
    let mut now = uids(pid)?;
    while now.iter().any(|u| *u != want) && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(100));
        now = uids(pid)?;
    }
    if now.iter().any(|u| *u != want) {
        bail!("the provisioner runs with uids {now:?}, expected {SERVICE_USER} ({uid})");
    }
    println!("ok: the provisioner runs as {SERVICE_USER} (uid {uid}, pid {pid})");
    let st = sim.wait("as the service account", || {
        !test_support::process::alive(pid)
    })?;
    sim.check(
        st,
        &test_support::metrics::scrape(port),
        "as the service account",
    )?;
    println!(
        "ok: {NODES} simulated servers provisioned ({} x509, by the helper as {SERVICE_USER}) in \
         {:.1}s",
        Mode::Pki.name(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
