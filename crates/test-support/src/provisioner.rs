//! The provisioner as a process: its YAML and Choria configuration files, and a guard over the
//! running binary with its output, its monitoring port and its metrics.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::{logs, metrics, Error, IoContext, ProcessGuard, Result};

/// The settings of one provisioner, rendered into its YAML and Choria configuration.
#[derive(Clone, Debug)]
pub struct ProvisionerConfig {
    /// Choria identity (also its election identity); names the files.
    pub identity: String,
    /// The broker URL(s) of the Choria configuration.
    pub broker: String,
    /// `workers`.
    pub workers: usize,
    /// `loglevel`.
    pub loglevel: String,
    /// `logfile`, when not standard output.
    pub logfile: Option<PathBuf>,
    /// The helper command line.
    pub helper: String,
    /// `token`.
    pub token: String,
    /// `site`.
    pub site: String,
    /// `monitor_port`.
    pub monitor_port: u16,
    /// `jwt_verify_cert`: a public key in hex or a file.
    pub jwt_verify_cert: String,
    /// `jwt_signing_key`, when servers get JWTs signed.
    pub jwt_signing_key: Option<PathBuf>,
    /// `leader_election`.
    pub leader_election: bool,
    /// `features` switched on.
    pub features: Vec<String>,
    /// More top-level YAML, written before `features`.
    pub extra_yaml: String,
}

impl ProvisionerConfig {
    /// A provisioner called `identity` on `broker` with `helper`, verifying provisioning JWTs
    /// with `verify`: four workers, `debug` logs to standard output, site `testsite`, the `jwt`
    /// feature, a free monitoring port.
    pub fn new(identity: &str, broker: &str, helper: &str, token: &str, verify: &str) -> Self {
        ProvisionerConfig {
            identity: identity.into(),
            broker: broker.into(),
            workers: 4,
            loglevel: "debug".into(),
            logfile: None,
            helper: helper.into(),
            token: token.into(),
            site: "testsite".into(),
            monitor_port: crate::free_port(),
            jwt_verify_cert: verify.into(),
            jwt_signing_key: None,
            leader_election: false,
            features: vec!["jwt".into()],
            extra_yaml: String::new(),
        }
    }

    /// The YAML configuration (`--config`).
    pub fn yaml(&self) -> String {
        let logfile = match &self.logfile {
            Some(p) => format!("logfile: {}\n", p.display()),
            None => String::new(),
        };
        let signing = match &self.jwt_signing_key {
            Some(p) => format!("jwt_signing_key: {}\n", p.display()),
            None => String::new(),
        };
        let mut extra = self.extra_yaml.clone();
        if !extra.is_empty() && !extra.ends_with('\n') {
            extra.push('\n');
        }
        let features: String = self
            .features
            .iter()
            .map(|f| format!("  {f}: true\n"))
            .collect();
        format!(
            "workers: {workers}\n\
             interval: 1m\n\
             {logfile}\
             loglevel: {loglevel}\n\
             helper: {helper}\n\
             token: {token}\n\
             site: {site}\n\
             choria_insecure: true\n\
             monitor_port: {port}\n\
             jwt_verify_cert: {verify}\n\
             {signing}\
             leader_election: {le}\n\
             {extra}\
             features:\n{features}",
            workers = self.workers,
            loglevel = self.loglevel,
            helper = self.helper,
            token = self.token,
            site = self.site,
            port = self.monitor_port,
            verify = self.jwt_verify_cert,
            le = self.leader_election,
        )
    }

    /// The Choria client configuration (`--choria-config`).
    pub fn choria_config(&self) -> String {
        format!(
            "identity = {}\nplugin.choria.middleware_hosts = {}\nplugin.choria.use_srv = false\nplugin.security.provider = file\n",
            self.identity, self.broker
        )
    }

    /// Write `<identity>.yaml` and `<identity>.cfg` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        let yaml = dir.join(format!("{}.yaml", self.identity));
        crate::write(&yaml, &self.yaml())?;
        let cfg = dir.join(format!("{}.cfg", self.identity));
        crate::write(&cfg, &self.choria_config())?;
        Ok((yaml, cfg))
    }
}

/// A running provisioner (any compatible program), killed when dropped, with standard output
/// and error in one file. Several run side by side with distinct names, ports and files.
pub struct ProvisionerProcess {
    /// The process.
    pub proc: ProcessGuard,
    /// Its name in messages.
    pub name: String,
    /// Standard output and error.
    pub out: PathBuf,
    /// Where its log lines go: its `logfile`, or `out` when it has none
    /// ([`ProvisionerProcess::with_log`]).
    pub log: PathBuf,
    /// The monitoring port.
    pub port: u16,
}

/// How a provisioner's output file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Emptied first, so waiting for a line never finds an earlier run's.
    Truncate,
    /// Appended to, so one file holds every run of a provisioner that is restarted.
    Append,
}

impl ProvisionerProcess {
    /// Start `cmd` (program and arguments set), its output in `out` (emptied first, so waiting
    /// for a line never finds an earlier run's). A drop kills it with SIGKILL at once; `grace`
    /// lets it drain on SIGTERM first.
    pub fn spawn(
        name: &str,
        cmd: &mut Command,
        out: &Path,
        port: u16,
        grace: Duration,
    ) -> Result<Self> {
        Self::spawn_with(name, cmd, out, Output::Truncate, port, grace)
    }

    /// As [`ProvisionerProcess::spawn`], with the output file opened as `output` says.
    pub fn spawn_with(
        name: &str,
        cmd: &mut Command,
        out: &Path,
        output: Output,
        port: u16,
        grace: Duration,
    ) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(output == Output::Append)
            .truncate(output == Output::Truncate)
            .open(out)
            .ctx(|| format!("creating {}", out.display()))?;
        let err = file
            .try_clone()
            .ctx(|| format!("opening {}", out.display()))?;
        let proc = ProcessGuard::spawn(name, cmd.stdout(file).stderr(err))?.drop_grace(grace);
        Ok(ProvisionerProcess {
            proc,
            name: name.to_string(),
            out: out.to_path_buf(),
            log: out.to_path_buf(),
            port,
        })
    }

    /// Its log lines go to `log` (its `logfile`) rather than its output.
    pub fn with_log(mut self, log: &Path) -> Self {
        self.log = log.to_path_buf();
        self
    }

    /// The command line `program [args] --config yaml --choria-config cfg`.
    pub fn command(program: &Path, args: &[String], yaml: &Path, cfg: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .arg("--config")
            .arg(yaml)
            .arg("--choria-config")
            .arg(cfg);
        cmd
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Everything it printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    /// Its exit status, when it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.proc.exited()
    }

    /// Everything in its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fail, with the last lines of its output, when it is no longer running.
    pub fn alive(&mut self) -> Result<()> {
        if !self.proc.running() {
            return Err(Error::Failed(format!(
                "{} exited: {}",
                self.name,
                logs::tail(&self.out, 20)
            )));
        }
        Ok(())
    }

    /// Wait until its log from byte `offset` on holds `needle`, failing as soon as it exits;
    /// how long that took. Take `offset` ([`logs::len`]) before starting it to skip an earlier
    /// run's lines.
    pub fn wait_log_from(
        &mut self,
        needle: &str,
        offset: u64,
        what: &str,
        timeout: Duration,
    ) -> Result<Duration> {
        let log = self.log.clone();
        crate::wait_for(what, timeout, || {
            self.alive()?;
            Ok(logs::read_from(&log, offset).contains(needle))
        })
    }

    /// Stop it with SIGTERM, waiting up to `grace`, and insist on a clean exit (status 0); one
    /// that has already exited is left alone.
    pub fn stop_cleanly(&mut self, grace: Duration) -> Result<()> {
        if !self.proc.running() {
            return Ok(());
        }
        let st = self.proc.terminate(grace);
        if !st.is_some_and(|s| s.success()) {
            return Err(Error::Failed(format!(
                "{} did not stop cleanly on SIGTERM: {st:?}",
                self.name
            )));
        }
        Ok(())
    }

    /// Fail, with the last lines of its output, when its output or log shows a panic.
    pub fn ensure_no_panic(&self) -> Result<()> {
        if self.output().contains("panicked") || self.log_text().contains("panicked") {
            return Err(Error::Failed(format!(
                "{} panicked: {}",
                self.name,
                logs::tail(&self.out, 20)
            )));
        }
        Ok(())
    }

    /// GET `path` from the monitoring port: (status, body).
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        metrics::http_get(self.port, path)
    }

    /// The `/metrics` text (empty when it cannot be reached).
    pub fn metrics(&self) -> String {
        metrics::scrape(self.port)
    }

    /// One sample of `/metrics`: `name` with `label` when given.
    pub fn metric(&self, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        metrics::metric(&self.metrics(), name, label)
    }

    /// The sum of every sample of `name`, 0 when absent.
    pub fn metric_sum(&self, name: &str) -> f64 {
        metrics::metric_sum(&self.metrics(), name)
    }

    /// Send a signal by name (`TERM`, `INT`, `KILL`); whether `kill` accepted it.
    pub fn signal(&self, sig: &str) -> bool {
        self.proc.signal(sig)
    }
}
