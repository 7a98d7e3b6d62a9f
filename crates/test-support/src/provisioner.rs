//! The provisioner as a process, for every test, scenario and local run that starts one.
//!
//! - [`Provisioner`]: the settings of one provisioner (its YAML, its Choria configuration and
//!   how its process runs), written into a directory as `<identity>.yaml` and `<identity>.cfg`.
//! - [`Launch`]: a program started on configuration files, whether a [`Provisioner`] wrote them
//!   or a test wrote them by hand; its name, arguments, environment, output file, log and port.
//! - [`ProvisionerProcess`]: the running process with its output, log, monitoring port and
//!   metrics; restarted, it keeps its output.
//!
//! Several provisioners run side by side, each with its own identity, port and files
//! ([`Provisioner::for_identity`]).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::{logs, metrics, Error, IoContext, ProcessGuard, Result};

/// The line a provisioner logs once it is connected and listens for startup events.
pub const READY: &str = "listening for startup events";

/// One provisioner: the settings rendered into its YAML and Choria configuration, and how its
/// process is started.
#[derive(Clone, Debug)]
pub struct Provisioner {
    /// Choria identity (also its election identity); names its files and its process.
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
    /// `choria_insecure`: connect without TLS.
    pub choria_insecure: bool,
    /// `features` switched on.
    pub features: Vec<String>,
    /// More top-level YAML, written before `features`.
    pub extra_yaml: String,
    /// The whole Choria configuration, when a test writes its own in place of the generated one.
    pub choria_config: Option<String>,
    /// Arguments before the generated `--config` and `--choria-config` (`--debug`, `run`...).
    pub args: Vec<String>,
    /// `--pid FILE`.
    pub pid_file: Option<PathBuf>,
    /// Environment of the process and so of its helper; a later entry wins over an earlier one.
    pub env: Vec<(String, String)>,
    /// How its output file is opened.
    pub output: Output,
    /// How long a drop waits after SIGTERM before SIGKILL (zero: SIGKILL at once).
    pub grace: Duration,
}

impl Provisioner {
    /// A provisioner called `identity` on `broker` with `helper`, checking `token` and verifying
    /// provisioning JWTs with `verify`: four workers, `debug` logs to standard output, site
    /// `testsite`, insecure, the `jwt` feature, a free monitoring port, no arguments beyond the
    /// files, its output emptied at start and the process killed at once when dropped.
    pub fn new(identity: &str, broker: &str, helper: &str, token: &str, verify: &str) -> Self {
        Provisioner {
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
            choria_insecure: true,
            features: vec!["jwt".into()],
            extra_yaml: String::new(),
            choria_config: None,
            args: Vec::new(),
            pid_file: None,
            env: Vec::new(),
            output: Output::Truncate,
            grace: Duration::ZERO,
        }
    }

    /// With `extra` added to the top-level YAML (a line break is added when it lacks one).
    pub fn yaml(mut self, extra: &str) -> Self {
        if !extra.is_empty() {
            self.extra_yaml.push_str(extra);
            if !extra.ends_with('\n') {
                self.extra_yaml.push('\n');
            }
        }
        self
    }

    /// With the environment variable `key` set for the process and so for its helper.
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_string(), value.into()));
        self
    }

    /// With exactly `features` switched on.
    pub fn features(mut self, features: &[&str]) -> Self {
        self.features = features.iter().map(|f| f.to_string()).collect();
        self
    }

    /// The same settings for another provisioner beside this one: `identity`, a free monitoring
    /// port, and its `logfile` (when it has one) `<identity>.log` in the same directory.
    pub fn for_identity(&self, identity: &str) -> Self {
        let mut other = self.clone();
        other.identity = identity.to_string();
        other.monitor_port = crate::free_port();
        other.logfile = self
            .logfile
            .as_ref()
            .map(|l| l.with_file_name(format!("{identity}.log")));
        other
    }

    /// The YAML configuration (`--config`).
    pub fn yaml_text(&self) -> String {
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
             choria_insecure: {insecure}\n\
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
            insecure = self.choria_insecure,
            port = self.monitor_port,
            verify = self.jwt_verify_cert,
            le = self.leader_election,
        )
    }

    /// The Choria client configuration (`--choria-config`): [`Provisioner::choria_config`] when
    /// set, else the identity, the broker, no SRV lookups and the `file` security provider.
    pub fn choria_config_text(&self) -> String {
        match &self.choria_config {
            Some(text) => text.clone(),
            None => format!(
                "identity = {}\nplugin.choria.middleware_hosts = {}\nplugin.choria.use_srv = false\nplugin.security.provider = file\n",
                self.identity, self.broker
            ),
        }
    }

    /// Write `<identity>.yaml` (owner-only, as the provisioner asks of a file holding its token)
    /// and `<identity>.cfg` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        let yaml = dir.join(format!("{}.yaml", self.identity));
        crate::write(&yaml, &self.yaml_text())?;
        crate::owner_only(&yaml)?;
        let cfg = dir.join(format!("{}.cfg", self.identity));
        crate::write(&cfg, &self.choria_config_text())?;
        Ok((yaml, cfg))
    }

    /// Write its files into `dir` and say how `program` is started on them: named after the
    /// identity, its output in `<dir>/<identity>.out`, its log in its `logfile` or that output.
    pub fn prepare(&self, program: &Path, dir: &Path) -> Result<Launch> {
        let (yaml, cfg) = self.write(dir)?;
        let out = dir.join(format!("{}.out", self.identity));
        let mut launch = Launch::new(&self.identity, program, &yaml, &cfg, &out);
        launch.args = self.args.clone();
        launch.pid_file = self.pid_file.clone();
        launch.env = self.env.clone();
        launch.output = self.output;
        launch.log = self.logfile.clone();
        launch.port = self.monitor_port;
        launch.grace = self.grace;
        Ok(launch)
    }

    /// Write its files into `dir` and start `program` on them ([`Provisioner::prepare`]).
    pub fn start(&self, program: &Path, dir: &Path) -> Result<ProvisionerProcess> {
        self.prepare(program, dir)?.spawn()
    }
}

/// How a provisioner's output file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Output {
    /// Emptied first, so waiting for a line never finds an earlier run's.
    #[default]
    Truncate,
    /// Appended to, so one file holds every run of a provisioner that is restarted.
    Append,
}

/// A provisioner (or any compatible program) to start on its configuration files: the command
/// line `program [args] --config <config> --choria-config <choria_config> [--pid <pid_file>]`,
/// its environment, and where its output and log go.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Its name in messages.
    pub name: String,
    /// The program.
    pub program: PathBuf,
    /// Arguments before the generated ones.
    pub args: Vec<String>,
    /// The YAML configuration.
    pub config: PathBuf,
    /// The Choria configuration.
    pub choria_config: PathBuf,
    /// `--pid FILE`.
    pub pid_file: Option<PathBuf>,
    /// Environment variables set; a later entry wins over an earlier one.
    pub env: Vec<(String, String)>,
    /// Environment variables removed.
    pub env_remove: Vec<String>,
    /// Standard output and error.
    pub out: PathBuf,
    /// How `out` is opened.
    pub output: Output,
    /// Where its log lines go, when not to `out` (its `logfile`).
    pub log: Option<PathBuf>,
    /// The monitoring port (0 when it has none).
    pub port: u16,
    /// How long a drop waits after SIGTERM before SIGKILL (zero: SIGKILL at once).
    pub grace: Duration,
}

impl Launch {
    /// `program` named `name` on `config` and `choria_config`, its output in `out` (emptied
    /// first), without a monitoring port, killed at once when dropped.
    pub fn new(
        name: &str,
        program: &Path,
        config: &Path,
        choria_config: &Path,
        out: &Path,
    ) -> Self {
        Launch {
            name: name.to_string(),
            program: program.to_path_buf(),
            args: Vec::new(),
            config: config.to_path_buf(),
            choria_config: choria_config.to_path_buf(),
            pid_file: None,
            env: Vec::new(),
            env_remove: Vec::new(),
            out: out.to_path_buf(),
            output: Output::Truncate,
            log: None,
            port: 0,
            grace: Duration::ZERO,
        }
    }

    /// Its command line, with its environment.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        self.files_and_env(&mut cmd);
        if let Some(pid) = &self.pid_file {
            cmd.arg("--pid").arg(pid);
        }
        cmd
    }

    /// `program <subcommand> --config <config> --choria-config <choria_config>` with its
    /// environment, as for `check`.
    pub fn command_for(&self, subcommand: &str) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.arg(subcommand);
        self.files_and_env(&mut cmd);
        cmd
    }

    fn files_and_env(&self, cmd: &mut Command) {
        cmd.arg("--config")
            .arg(&self.config)
            .arg("--choria-config")
            .arg(&self.choria_config);
        for key in &self.env_remove {
            cmd.env_remove(key);
        }
        for (key, value) in &self.env {
            cmd.env(key, value);
        }
    }

    /// Start it, its standard output and error in `out`.
    pub fn spawn(&self) -> Result<ProvisionerProcess> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(self.output == Output::Append)
            .truncate(self.output == Output::Truncate)
            .open(&self.out)
            .ctx(|| format!("creating {}", self.out.display()))?;
        let err = file
            .try_clone()
            .ctx(|| format!("opening {}", self.out.display()))?;
        let log = self.log.clone().unwrap_or_else(|| self.out.clone());
        // Waiting for a line of this run skips what an earlier run left in the log.
        let log_start = logs::len(&log);
        let mut cmd = self.command();
        let proc =
            ProcessGuard::spawn(&self.name, cmd.stdout(file).stderr(err))?.drop_grace(self.grace);
        Ok(ProvisionerProcess {
            proc,
            name: self.name.clone(),
            out: self.out.clone(),
            log,
            port: self.port,
            log_start,
            launch: self.clone(),
        })
    }
}

/// A running provisioner (or any compatible program), stopped when dropped as its
/// [`Launch::grace`] says, with standard output and error in one file.
pub struct ProvisionerProcess {
    /// The process.
    pub proc: ProcessGuard,
    /// Its name in messages.
    pub name: String,
    /// Standard output and error.
    pub out: PathBuf,
    /// Where its log lines go: its `logfile`, or `out` when it has none.
    pub log: PathBuf,
    /// The monitoring port.
    pub port: u16,
    /// The length of the log when this run started.
    log_start: u64,
    /// How it was started, for a restart.
    launch: Launch,
}

impl ProvisionerProcess {
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

    /// Fail, with the last lines of its output, when it has stopped running.
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
    /// how long that took. Take `offset` ([`logs::len`]) before a phase to skip earlier lines.
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

    /// Wait until this run logs [`READY`] (lines of an earlier run do not count), failing as
    /// soon as it exits; how long that took.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Duration> {
        let what = format!("{} to listen for startup events", self.name);
        self.wait_log_from(READY, self.log_start, &what, timeout)
    }

    /// Kill it (when it still runs) and start it again the same way, its output appended to
    /// the earlier runs'.
    pub fn restart(&mut self) -> Result<()> {
        self.proc.kill();
        let mut launch = self.launch.clone();
        launch.output = Output::Append;
        *self = launch.spawn()?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Provisioner {
        Provisioner::new("p1", "nats://127.0.0.1:4222", "/bin/helper", "tok", "ab12")
    }

    #[test]
    fn the_yaml_holds_every_setting_and_ends_with_the_features() {
        let mut p = sample().yaml("a: 1").yaml("").yaml("b: 2\n");
        p.logfile = Some("/tmp/p1.log".into());
        p.jwt_signing_key = Some("/tmp/signer.seed".into());
        p.choria_insecure = false;
        let p = p.features(&["jwt", "pki"]);
        let yaml = p.yaml_text();
        for line in [
            "workers: 4",
            "logfile: /tmp/p1.log",
            "loglevel: debug",
            "helper: /bin/helper",
            "token: tok",
            "choria_insecure: false",
            &format!("monitor_port: {}", p.monitor_port),
            "jwt_verify_cert: ab12",
            "jwt_signing_key: /tmp/signer.seed",
            "leader_election: false",
        ] {
            assert!(yaml.lines().any(|l| l == line), "{line:?} missing:\n{yaml}");
        }
        assert!(
            yaml.ends_with("a: 1\nb: 2\nfeatures:\n  jwt: true\n  pki: true\n"),
            "{yaml}"
        );
        assert!(p
            .choria_config_text()
            .contains("plugin.choria.middleware_hosts = nats://127.0.0.1:4222\n"));
    }

    #[test]
    fn another_identity_gets_its_own_port_and_log() {
        let mut p = sample();
        p.logfile = Some("/run/x/p1.log".into());
        let q = p.for_identity("p2");
        assert_eq!(q.identity, "p2");
        assert_ne!(q.monitor_port, p.monitor_port);
        assert_eq!(q.logfile, Some(PathBuf::from("/run/x/p2.log")));
        assert!(q.choria_config_text().starts_with("identity = p2\n"));
    }

    #[test]
    fn the_files_are_written_and_named_on_the_command_line() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let mut p = sample().env("A", "1").env("A", "2");
        p.args = vec!["--debug".into(), "run".into()];
        p.pid_file = Some(dir.path().join("p1.pid"));
        let launch = p
            .prepare(Path::new("/bin/prov"), dir.path())
            .expect("files");
        assert_eq!(
            std::fs::read_to_string(&launch.config).expect("yaml"),
            p.yaml_text()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&launch.config)
            .expect("yaml")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(launch.out, dir.path().join("p1.out"));
        assert_eq!(launch.port, p.monitor_port);
        let cmd = launch.command();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let (yaml, cfg, pid) = (
            launch.config.display().to_string(),
            launch.choria_config.display().to_string(),
            dir.path().join("p1.pid").display().to_string(),
        );
        assert_eq!(
            args,
            [
                "--debug",
                "run",
                "--config",
                &yaml,
                "--choria-config",
                &cfg,
                "--pid",
                &pid
            ]
        );
        let a = cmd
            .get_envs()
            .find(|(k, _)| *k == "A")
            .and_then(|(_, v)| v)
            .map(|v| v.to_string_lossy().into_owned());
        assert_eq!(a.as_deref(), Some("2"));
    }

    #[test]
    fn a_restart_keeps_the_output_and_waits_for_its_own_lines() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let script = dir.path().join("fake.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"{READY}\"\nexec sleep 60\n"),
        )
        .expect("writing the script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .expect("making it executable");
        let mut p = sample();
        p.output = Output::Append;
        let mut proc = p.start(&script, dir.path()).expect("started");
        proc.wait_ready(Duration::from_secs(10)).expect("ready");
        proc.restart().expect("restarted");
        proc.wait_ready(Duration::from_secs(10))
            .expect("ready again");
        assert_eq!(proc.output().matches(READY).count(), 2);
    }
}
