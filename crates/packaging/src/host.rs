//! The programs of the machine packages are built and checked on: finding one on `PATH`,
//! running one (its output shown, or captured), and installing Debian packages when one is
//! missing. `cargo xtask` installs what its tests need with the same functions.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::error::{bail, Context, Result};

/// Looks a program up on `PATH`.
pub fn which(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{name} not found on PATH"))
}

/// Runs a command with its output shown, failing with its name when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

/// Runs a command and returns its standard output, failing with its standard error.
pub fn capture(cmd: &mut Command) -> Result<String> {
    Ok(test_support::stack::run(cmd)?)
}

/// A finished command's standard output followed by its standard error, as one text.
pub fn combined(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Prints `body` under a `== title` line.
pub fn section(title: &str, body: &str) {
    println!("\n== {title}\n{}", body.trim_end());
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Installs Debian packages with apt-get (as root, with their recommendations when
/// `recommends`), updating the lists once if the first try fails; false when that is not
/// possible here or did not work.
pub fn apt_install(packages: &[&str], recommends: bool) -> bool {
    if !is_root() || which("apt-get").is_err() {
        return false;
    }
    let quiet = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let mut install = vec!["install", "-y", "-qq"];
    if !recommends {
        install.push("--no-install-recommends");
    }
    install.extend_from_slice(packages);
    quiet(&install) || (quiet(&["update", "-qq"]) && quiet(&install))
}
