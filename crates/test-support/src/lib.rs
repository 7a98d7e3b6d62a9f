//! The harness of every process-level test in the workspace, and of `cargo xtask`'s local runs.
//!
//! - [`ports`]: free loopback ports and waiting for a listener.
//! - [`ca`]: the one test certificate authority (openssl): keys, CSRs and certificates, for the
//!   tests and for the go-choria environment alike.
//! - [`process`]: [`ProcessGuard`], a child process stopped (optionally with its whole process
//!   group) when dropped.
//! - [`nats`]: a real `nats-server` ([`NatsServer`]) and a three-server JetStream cluster
//!   ([`NatsCluster`]) on loopback, and one in operator (JWT) mode with credentials files
//!   ([`nats::NatsOperator`]).
//! - [`dns`]: a real DNS server (dnsmasq) on loopback serving a test's SRV records.
//! - [`metrics`]: the Prometheus text parser and a plain HTTP GET for `/metrics`.
//! - [`logs`]: a process's log read from an offset, its length and its tail.
//! - [`provisioner`]: the provisioner as a process, for every caller: its settings and the
//!   configuration files they make, the command started on them, and the running process
//!   (several at once, each with its own name, port and output; output kept across restarts).
//! - [`simulator`]: the fleet simulator as a process, its progress lines and its report.
//! - [`stack`]: the binaries of a local run (built by cargo), the run's signer and CA made by the
//!   demo helper, the run's provisioner settings, and the fleet simulator's command.
//! - [`webhook`]: the demo helper as a webhook (`choria-demo-helper serve`) for a local run.
//! - [`go_env`]: the real go-choria broker and `choria server` processes in provisioning mode
//!   (the peer `cargo xtask peers` builds into `target/peers/bin`).
//!
//! The `nats-server` binary is found, in order, through the `NATS_SERVER_BIN` environment
//! variable, `target/tools/bin/nats-server` in the workspace (where `cargo xtask test` installs
//! it), and `PATH`.
#![deny(missing_docs)]

pub mod ca;
pub mod dns;
pub mod go_env;
pub mod logs;
pub mod metrics;
pub mod nats;
pub mod ports;
pub mod process;
pub mod provisioner;
pub mod simulator;
pub mod stack;
pub mod step;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use nats::{nats_server_bin, NatsCluster, NatsServer};
pub use ports::free_port;
pub use process::ProcessGuard;

/// What failed while setting up or running a process-level test.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or process operation failed.
    #[error("{what}: {err}")]
    Io {
        /// What was being done.
        what: String,
        /// The operating system's error.
        err: std::io::Error,
    },
    /// A process or a condition did not turn out as needed.
    #[error("{0}")]
    Failed(String),
}

/// The result of the harness's fallible operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attach a description to an I/O result.
pub(crate) trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|err| Error::Io { what: what(), err })
    }
}

/// Write a file, naming it on failure.
pub(crate) fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).ctx(|| format!("writing {}", path.display()))
}

/// Write `text` to `path` and make it executable (a helper or script a test runs).
pub fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .ctx(|| format!("making {} executable", path.display()))
}

/// Write a hand-made provisioner configuration into `dir`: `yaml` as `provisioner.yaml` and
/// the Choria client configuration `cfg` as `choria.cfg`; their paths.
pub fn write_config(dir: &Path, yaml: &str, cfg: &str) -> Result<(PathBuf, PathBuf)> {
    let (y, c) = (dir.join("provisioner.yaml"), dir.join("choria.cfg"));
    write(&y, yaml)?;
    write(&c, cfg)?;
    Ok((y, c))
}

/// Create a directory and its parents, naming it on failure.
pub(crate) fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).ctx(|| format!("creating {}", path.display()))
}

/// Insists `text` contains each of `parts`, naming the first one missing and showing `text`.
///
/// # Panics
/// When a part is missing.
pub fn assert_contains_all<S: AsRef<str>>(text: &str, parts: &[S]) {
    for part in parts {
        let part = part.as_ref();
        assert!(text.contains(part), "{part:?} missing from:\n{text}");
    }
}

/// The first of `names` found in a directory of `PATH`, or else in `/usr/bin` or `/usr/sbin`.
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/sbin"].map(PathBuf::from))
        .collect();
    names
        .iter()
        .find_map(|name| dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()))
}

/// Skips what needs `missing` (this says so), except under CI (`CI` set), where everything a
/// test needs is required.
///
/// # Panics
/// When `CI` is set.
pub fn skip_unless_ci(missing: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{missing}: required under CI"
    );
    eprintln!("SKIPPED {missing}");
}

/// An optional tool a test needs: the first of `names` found by [`find_program`], or `None`
/// when none is and the test is skipped ([`skip_unless_ci`], naming `missing`).
///
/// # Panics
/// When none of `names` is found and `CI` is set.
pub fn tool_or_skip(names: &[&str], missing: &str) -> Option<PathBuf> {
    let found = find_program(names);
    if found.is_none() {
        skip_unless_ci(missing);
    }
    found
}

/// The workspace root, derived from this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

/// How a run enrolls its nodes: the three modes of the provisioner, the simulator and the Go
/// environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// x509 / protocol v1 without CSRs: the helper's configuration only.
    #[default]
    Plain,
    /// As `Plain`, with CSRs signed by the helper (`features.pki`).
    Pki,
    /// Issuer-based protocol v2: ed25519 keys and server JWTs (`features.ed25519`).
    Ed25519,
}

impl Mode {
    /// Every mode, in order.
    pub const ALL: [Mode; 3] = [Mode::Plain, Mode::Pki, Mode::Ed25519];

    /// The name on command lines: `plain`, `pki` or `ed25519`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Pki => "pki",
            Mode::Ed25519 => "ed25519",
        }
    }

    /// The provisioner's `features` switched on in this mode.
    pub fn features(self) -> &'static [&'static str] {
        match self {
            Mode::Plain => &["jwt"],
            Mode::Pki => &["jwt", "pki"],
            Mode::Ed25519 => &["jwt", "ed25519"],
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "plain" | "jwt" => Ok(Mode::Plain),
            "pki" => Ok(Mode::Pki),
            "ed25519" => Ok(Mode::Ed25519),
            other => Err(Error::Failed(format!(
                "unknown mode {other:?}: plain, pki or ed25519"
            ))),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Poll `f` every `every` until it returns true or `timeout` passes; whether it did.
pub fn wait_until(timeout: Duration, every: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// Poll `f` every 250 ms until it returns true, returning how long that took; fail as soon as
/// `f` fails, or with "timed out after ... waiting for `what`" once `timeout` has passed.
pub fn wait_for<E: From<Error>>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<bool, E>,
) -> Result<Duration, E> {
    let start = std::time::Instant::now();
    loop {
        if f()? {
            return Ok(start.elapsed());
        }
        if start.elapsed() > timeout {
            return Err(
                Error::Failed(format!("timed out after {timeout:?} waiting for {what}")).into(),
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Make `path` readable and writable by its owner only (mode 0600), as the provisioner asks of
/// files holding secrets.
pub fn owner_only(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .ctx(|| format!("cannot restrict {}", path.display()))
}

/// Runs `f` on a thread of its own and returns its result, panicking with `what` if it has not
/// returned within `timeout`: a test for "refused promptly" fails rather than hang the suite
/// (a function that spins is left running until the test process exits).
pub fn returns_within<T: Send + 'static>(
    what: &str,
    timeout: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(timeout) {
        Ok(v) => v,
        Err(_) => panic!("{what} did not return within {timeout:?}"),
    }
}
