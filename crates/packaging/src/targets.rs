//! The release targets `cargo xtask dist` builds for, and how each is built.
//!
//! The default is the host architecture's musl target: a static binary (no dynamic loader, no
//! glibc version), so one x86_64 build runs on Enterprise Linux 7, 8 and 9 and on every Debian
//! and Ubuntu alike. Rust's musl targets bring their own C library and start files; only the C in
//! `ring` and `mimalloc` needs a C compiler for the target:
//!
//! - `x86_64-unknown-linux-musl` on an x86_64 host: Debian's `musl-gcc` (package `musl-tools`),
//!   which the `cc` crate picks for that target by itself, and the host's linker.
//! - Anything else (`aarch64-unknown-linux-musl`, or a glibc target with a version suffix such as
//!   `x86_64-unknown-linux-gnu.2.17`): `cargo zigbuild`, with Zig as C compiler and linker. Zig
//!   ships the C headers and libraries of every target, so no cross toolchain is needed; Zig and
//!   cargo-zigbuild come from PyPI into `target/tools/zig-venv`, pinned.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{bail, Context, Result};
use crate::host::{apt_install, capture, run, which};
use crate::{cargo, root, target_dir, DEMO_HELPER, FLEET_SIM, NAME};

/// The pinned Zig toolchain (PyPI's `ziglang`) and cargo-zigbuild that cross builds use.
const ZIG_PACKAGES: &[&str] = &["ziglang==0.17.1", "cargo-zigbuild==0.24.1"];

/// An architecture packages are made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    Aarch64,
}

impl Arch {
    /// The kernel's name (`uname -m`), used in the tarball's name and by RPM.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// Debian's name.
    pub fn deb(self) -> &'static str {
        match self {
            Arch::X86_64 => "amd64",
            Arch::Aarch64 => "arm64",
        }
    }

    /// RPM's name.
    pub fn rpm(self) -> &'static str {
        self.name()
    }

    /// The architecture of this machine.
    pub fn host() -> Result<Arch> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Arch::X86_64),
            "aarch64" => Ok(Arch::Aarch64),
            other => bail!("no packages can be made on {other}: only x86_64 and aarch64 hosts"),
        }
    }
}

/// One release target: a Rust target triple, with cargo-zigbuild's optional glibc suffix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// As given: `aarch64-unknown-linux-musl`, `x86_64-unknown-linux-gnu.2.17`.
    pub spec: String,
    pub arch: Arch,
}

impl Target {
    pub fn parse(spec: &str) -> Result<Target> {
        let spec = spec.trim();
        let triple = spec.split_once(".").map_or(spec, |(t, _)| t);
        let arch = match triple.split('-').next() {
            Some("x86_64") => Arch::X86_64,
            Some("aarch64") => Arch::Aarch64,
            _ => bail!("unsupported target {spec:?}: use an x86_64 or aarch64 Linux target"),
        };
        let env = triple.rsplit('-').next().unwrap_or_default();
        if !triple.contains("-linux-") || !matches!(env, "musl" | "gnu") {
            bail!(
                "unsupported target {spec:?}: use {}-unknown-linux-musl or -gnu",
                arch.name()
            );
        }
        if spec != triple && env != "gnu" {
            bail!("unsupported target {spec:?}: only glibc targets take a version suffix");
        }
        Ok(Target {
            spec: spec.to_string(),
            arch,
        })
    }

    /// The host architecture's musl target: a static binary.
    pub fn default_for_host() -> Result<Target> {
        Target::parse(&format!("{}-unknown-linux-musl", Arch::host()?.name()))
    }

    /// The Rust target triple (without a glibc suffix), which names its build directory.
    pub fn triple(&self) -> &str {
        self.spec.split_once('.').map_or(&self.spec, |(t, _)| t)
    }

    pub fn is_musl(&self) -> bool {
        self.triple().ends_with("-musl")
    }

    /// The release binary this target's build leaves.
    pub fn binary(&self, root: &Path) -> PathBuf {
        target_dir(root)
            .join(self.triple())
            .join("release")
            .join(NAME)
    }

    /// Built by plain cargo with the host's compilers, rather than by cargo-zigbuild.
    fn native(&self) -> Result<bool> {
        let host = Arch::host()?;
        Ok(self.arch == host
            && self.spec == self.triple()
            && (self.is_musl() && host == Arch::X86_64 || self.triple() == host_triple()?))
    }
}

/// Parses `--target`'s list; two targets of one architecture would make packages of one name.
pub fn parse_list(specs: &[String]) -> Result<Vec<Target>> {
    if specs.is_empty() {
        return Ok(vec![Target::default_for_host()?]);
    }
    let mut out: Vec<Target> = Vec::new();
    for spec in specs.iter().filter(|s| !s.trim().is_empty()) {
        let t = Target::parse(spec)?;
        if let Some(other) = out.iter().find(|o| o.arch == t.arch) {
            bail!(
                "--target names two {} targets ({} and {}): their packages would have the same names",
                t.arch.name(),
                other.spec,
                t.spec
            );
        }
        out.push(t);
    }
    if out.is_empty() {
        bail!("--target names no target");
    }
    Ok(out)
}

/// The host's Rust target triple, as rustc names it.
fn host_triple() -> Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    capture(Command::new(rustc).arg("-vV"))?
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .context("rustc -vV names no host triple")
}

/// The target's Rust standard library, added with rustup when missing.
fn ensure_rust_target(triple: &str) -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match installed {
        Ok(o) if o.status.success() => {
            if String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == triple)
            {
                return Ok(());
            }
        }
        // Without rustup the toolchain must already have the target; cargo says if it does not.
        _ => return Ok(()),
    }
    println!("dist: rustup target add {triple}");
    run(Command::new("rustup").args(["target", "add", triple]))
        .with_context(|| format!("rustup could not install the {triple} target"))
}

fn ensure_musl_gcc() -> Result<()> {
    if which("musl-gcc").is_ok() {
        return Ok(());
    }
    println!("dist: musl-gcc not found, installing Debian's musl-tools");
    if !apt_install(&["musl-tools"], true) || which("musl-gcc").is_err() {
        bail!("musl-gcc not found and could not be installed: apt-get install musl-tools");
    }
    Ok(())
}

/// The directory holding cargo-zigbuild and the Python with Zig, installed from PyPI when
/// missing.
pub fn ensure_zig() -> Result<PathBuf> {
    let venv = root().join("target/tools/zig-venv");
    let bin = venv.join("bin");
    let ready = || {
        bin.join("cargo-zigbuild").is_file()
            && Command::new(bin.join("python3"))
                .args(["-m", "ziglang", "version"])
                .output()
                .is_ok_and(|o| o.status.success())
    };
    if ready() {
        return Ok(bin);
    }
    println!(
        "dist: installing Zig and cargo-zigbuild from PyPI into {}",
        venv.display()
    );
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
        .context("cannot make a Python venv for Zig (python3 -m venv)")?;
    run(Command::new(bin.join("pip"))
        .args(["install", "--quiet"])
        .args(ZIG_PACKAGES))
    .context("cannot install Zig and cargo-zigbuild from PyPI")?;
    if !ready() {
        bail!(
            "Zig or cargo-zigbuild is still missing from {}",
            venv.display()
        );
    }
    Ok(bin)
}

/// Builds the release binaries for `target` (the provisioner, the fleet simulator and the demo
/// helper) with the version and commit compiled in; the provisioner's path.
pub fn build(target: &Target, version: &str, commit: &str) -> Result<PathBuf> {
    println!(
        "dist: release build of {NAME} {version} (commit {commit}) for {}",
        target.spec
    );
    let env = [
        ("CHORIA_PROVISIONER_VERSION", version),
        ("CHORIA_PROVISIONER_COMMIT", commit),
    ];
    // One build: the fleet simulator (packaged too) and the demo helper (for the tests that
    // provision a fleet) share the provisioner's build of their dependencies, with the
    // features the three need together.
    cargo_build(target, &[NAME, FLEET_SIM, DEMO_HELPER], &env)?;
    Ok(target.binary(&root()))
}

/// `cargo build --release --target` of `packages`, with plain cargo or cargo-zigbuild as
/// [`Target`] says; prints how long it took.
pub fn cargo_build(target: &Target, packages: &[&str], env: &[(&str, &str)]) -> Result<()> {
    ensure_rust_target(target.triple())?;
    let mut cmd = if target.native()? {
        if target.is_musl() {
            ensure_musl_gcc()?;
        }
        let mut cmd = Command::new(cargo());
        cmd.arg("build");
        cmd
    } else {
        let zig = ensure_zig()?;
        let mut cmd = Command::new(zig.join("cargo-zigbuild"));
        // cargo-zigbuild runs Zig as `python3 -m ziglang`: the venv's Python first on PATH.
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![zig];
        dirs.extend(std::env::split_paths(&path));
        cmd.arg("zigbuild")
            .env("PATH", std::env::join_paths(dirs).context("PATH")?)
            .env("CARGO", cargo());
        cmd
    };
    // Run from `cargo run`, this process has xtask's CARGO_MANIFEST_DIR, which ring's build
    // script watches: left in, every build after a plain `cargo build` would rebuild ring.
    cmd.current_dir(root())
        .env_remove("CARGO_MANIFEST_DIR")
        .args(["--release", "--target", &target.spec]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = std::time::Instant::now();
    run(&mut cmd)?;
    println!(
        "dist: {} for {} built in {:.0}s",
        packages.join(", "),
        target.spec,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
