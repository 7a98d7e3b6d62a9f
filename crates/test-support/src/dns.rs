//! A real DNS server on loopback for SRV tests: Debian's `dnsmasq` (package `dnsmasq-base`)
//! serving only the records a test gives it, on a random port, killed on drop.
//!
//! Without dnsmasq a test either fails (when `CI` is set: CI installs it) or is skipped with a
//! message on standard error ([`DnsServer::start_or_skip`]).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_port, Error, ProcessGuard, Result};

/// One SRV record: `name` (`_service._proto.domain`) pointing at `target:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvRecord {
    /// The owner name, e.g. `_mcollective-server._tcp.example.net`.
    pub name: String,
    /// The target host.
    pub target: String,
    /// The port.
    pub port: u16,
    /// Priority (lower first).
    pub priority: u16,
    /// Weight within a priority.
    pub weight: u16,
}

impl SrvRecord {
    /// A record with priority 0 and weight 0.
    pub fn new(name: &str, target: &str, port: u16) -> Self {
        SrvRecord {
            name: name.into(),
            target: target.into(),
            port,
            priority: 0,
            weight: 0,
        }
    }

    /// Builder: priority and weight.
    pub fn prio(mut self, priority: u16, weight: u16) -> Self {
        self.priority = priority;
        self.weight = weight;
        self
    }

    fn arg(&self) -> String {
        format!(
            "--srv-host={},{},{},{},{}",
            self.name, self.target, self.port, self.priority, self.weight
        )
    }
}

/// The dnsmasq binary: `DNSMASQ_BIN`, else `/usr/sbin/dnsmasq`, else `dnsmasq` on `PATH`.
pub fn dnsmasq_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DNSMASQ_BIN") {
        return Some(PathBuf::from(p));
    }
    let sbin = PathBuf::from("/usr/sbin/dnsmasq");
    if sbin.exists() {
        return Some(sbin);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("dnsmasq"))
            .find(|p| p.exists())
    })
}

/// A dnsmasq serving fixed SRV records on `127.0.0.1:<port>` (UDP and TCP), with no upstream,
/// no hosts file and no configuration file of its own. Killed on drop.
pub struct DnsServer {
    proc: ProcessGuard,
    port: u16,
    _dir: tempfile::TempDir,
}

impl DnsServer {
    /// Start dnsmasq with `records`, waiting until it serves.
    pub fn start(records: &[SrvRecord]) -> Result<Self> {
        let bin = dnsmasq_bin().ok_or_else(|| {
            Error::Failed(
                "dnsmasq not found: install Debian's dnsmasq-base or set DNSMASQ_BIN".into(),
            )
        })?;
        let dir = tempfile::tempdir().map_err(|err| Error::Io {
            what: "creating a temporary directory".into(),
            err,
        })?;
        let port = free_port();
        let mut cmd = Command::new(&bin);
        cmd.arg("--no-daemon")
            .arg("--conf-file=/dev/null")
            .arg(format!("--port={port}"))
            .arg("--listen-address=127.0.0.1")
            .arg("--bind-interfaces")
            .arg("--no-resolv")
            .arg("--no-hosts")
            .arg("--log-facility=-")
            .arg(format!(
                "--pid-file={}",
                dir.path().join("dnsmasq.pid").display()
            ))
            .args(records.iter().map(SrvRecord::arg))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut proc = ProcessGuard::spawn("dnsmasq", &mut cmd)?.drop_grace(Duration::ZERO);
        let log = std::fs::File::create(dir.path().join("dnsmasq.log")).ok();
        let ready = proc.wait_stderr_line("started, version", log, Duration::from_secs(10))?;
        if let Some(st) = proc.exited() {
            return Err(Error::Failed(format!(
                "dnsmasq exited early ({st}); its log is {}",
                dir.path().join("dnsmasq.log").display()
            )));
        }
        if !ready {
            return Err(Error::Failed("dnsmasq did not start within 10s".into()));
        }
        // It has bound its sockets before saying it started; a TCP connect confirms it.
        crate::ports::wait_port(port, Duration::from_secs(5))?;
        Ok(DnsServer {
            proc,
            port,
            _dir: dir,
        })
    }

    /// Start dnsmasq, or, when it is not installed: panic with a clear message when `CI` is
    /// set, else print why the test is skipped and return `None`.
    ///
    /// # Panics
    /// When dnsmasq is installed but does not start, or is missing under CI.
    pub fn start_or_skip(test: &str, records: &[SrvRecord]) -> Option<Self> {
        if dnsmasq_bin().is_none() {
            let msg = format!(
                "{test}: dnsmasq is not installed (Debian package dnsmasq-base; or set DNSMASQ_BIN)"
            );
            crate::skip_unless_ci(&msg);
            return None;
        }
        Some(Self::start(records).unwrap_or_else(|e| panic!("{test}: {e}")))
    }

    /// The port it serves on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, the value of the provisioner's `CHORIA_PROVISIONER_DNS_SERVER`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.proc.running()
    }
}
