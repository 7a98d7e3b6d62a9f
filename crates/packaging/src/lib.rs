//! The release packages of each target (tarball, Debian package, RPM) and the container image,
//! built and verified: what `cargo xtask dist` runs.
//!
//! Each architecture's packages are built from one staged file tree under
//! `target/dist/<arch>/stage`, so its three packages hold the same files with the same modes.
//! The Debian package is made with `dpkg-deb`, the RPM with `rpmbuild` (Debian's `rpm` package),
//! the tarball with `tar`; no packaging tool outside Debian is needed. How each target is
//! compiled is in `targets`, the packages in `build`, their checks in `verify`, the install
//! test in `install`, the image in `image`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use test_support::workspace_root as root;

use crate::error::{bail, Context};
pub use crate::error::{Error, Result};

pub mod assets;
mod build;
pub mod contents;
pub mod elf;
pub mod error;
mod fleet;
mod go_deploy;
pub mod host;
mod image;
mod install;
mod maint;
mod qemu;
mod sandbox;
mod targets;
pub mod unit_security;
mod verify;

use targets::{Arch, Target};

const NAME: &str = "choria-provisioner";
/// The fleet simulator, packaged beside the provisioner for load tests (`/usr/bin`).
const FLEET_SIM: &str = "choria-fleet-sim";
/// The demo helper: built with the packaged binaries for the tests that provision a fleet, not
/// packaged.
const DEMO_HELPER: &str = "choria-demo-helper";
const HOMEPAGE: &str = "https://github.com/choria-io/provisioner-rs";
const MAINTAINER_EMAIL: &str = "choria-provisioner@choria.io";

/// The RPM epoch. The Go provisioner's RPMs, also named `choria-provisioner`, carry no epoch and
/// versions up to 0.16.0: with epoch 1 every version of ours is newer than every one of theirs,
/// so installing ours replaces theirs in place and their repository never replaces ours; going
/// back to a Go release is a downgrade (`dnf downgrade`, `rpm -U --oldpackage`), which the
/// install test performs. (The Go provisioner has no Debian package, so the Debian version needs
/// no epoch.)
const RPM_EPOCH: &str = "1";

/// The Go package's log file: named by copied configurations, writable under our unit.
const GO_LOG: &str = "/var/log/choria-provisioner.log";

/// Where the packages install the binary, the configuration and the unit.
const BIN: &str = "/usr/sbin/choria-provisioner";
const ETC: &str = "/etc/choria-provisioner";
const YAML: &str = "/etc/choria-provisioner/choria-provisioner.yaml";
const CFG: &str = "/etc/choria-provisioner/choria.cfg";
const UNIT: &str = "/usr/lib/systemd/system/choria-provisioner.service";

/// The service account and its group, made by the packages from the sysusers.d file.
const SERVICE_USER: &str = "choria-provisioner";

/// The line of the maintainer scripts replaced by packaging/maintainer-functions.sh.
const FUNCTIONS_MARKER: &str = "@MAINTAINER_FUNCTIONS@";

/// What the packages install, relative to `/`: path, mode, whether it is configuration. The man
/// pages and completions come with them ([`assets`]; [`contents::packaged`] lists both).
const LAYOUT: &[(&str, u32, bool)] = &[
    ("usr/sbin/choria-provisioner", 0o755, false),
    ("usr/bin/choria-fleet-sim", 0o755, false),
    (
        "etc/choria-provisioner/choria-provisioner.yaml",
        0o640,
        true,
    ),
    ("etc/choria-provisioner/choria.cfg", 0o640, true),
    ("etc/logrotate.d/choria-provisioner", 0o644, true),
    (
        "usr/lib/systemd/system/choria-provisioner.service",
        0o644,
        false,
    ),
    ("usr/lib/tmpfiles.d/choria-provisioner.conf", 0o644, false),
    ("usr/lib/sysusers.d/choria-provisioner.conf", 0o644, false),
    (
        "usr/share/choria-provisioner/systemd/run-as-root.conf",
        0o644,
        false,
    ),
    (
        "usr/share/choria-provisioner/examples/helper-plain.py",
        0o755,
        false,
    ),
    (
        "usr/share/choria-provisioner/examples/helper-pki.py",
        0o755,
        false,
    ),
    (
        "usr/share/choria-provisioner/examples/helper-ed25519.py",
        0o755,
        false,
    ),
    (
        "usr/share/choria-provisioner/examples/helper-plain.sh",
        0o755,
        false,
    ),
    (
        "usr/share/choria-provisioner/grafana-dashboard.json",
        0o644,
        false,
    ),
    ("usr/share/doc/choria-provisioner/README.md", 0o644, false),
    (
        "usr/share/doc/choria-provisioner/ARCHITECTURE.md",
        0o644,
        false,
    ),
    ("usr/share/doc/choria-provisioner/LICENSE", 0o644, false),
    ("usr/share/doc/choria-provisioner/copyright", 0o644, false),
];

/// `cargo xtask dist`: release packages (tarball, RPM, Debian package) in target/dist/.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Release version (default: the workspace version).
    #[arg(long, value_name = "X.Y.Z")]
    version: Option<String>,
    /// Package release number.
    #[arg(long, value_name = "N", default_value = "1")]
    release: String,
    /// Targets to build and package, comma-separated: x86_64 and aarch64 Linux triples, musl
    /// (static) or gnu with a glibc suffix (`x86_64-unknown-linux-gnu.2.17`) [default: the
    /// host's musl target, x86_64-unknown-linux-musl here].
    #[arg(long, value_name = "TRIPLE,...", value_delimiter = ',')]
    target: Vec<String>,
    /// Package the existing target/TRIPLE/release/choria-provisioner of each target.
    #[arg(long)]
    no_build: bool,
    /// Also build the container image from the host architecture's static binary (buildah or
    /// podman); with --verify, run it under podman and provision a simulated fleet.
    #[arg(long)]
    image: bool,
    /// List and check every package's contents and metadata, systemd-analyze the unit.
    #[arg(long)]
    pub verify: bool,
    /// (root, dpkg) Install the .deb and test it as installed: the service account, owners
    /// and modes, check and a simulated fleet as the unit runs the daemon, the upgrade decision,
    /// a Go deployment's migration; then purge it, and replace a Go-style RPM and back.
    #[arg(long)]
    pub install_test: bool,
}

/// The checked options of a run.
struct Options {
    version: String,
    release: String,
    targets: Vec<Target>,
    build: bool,
    verify: bool,
    image: bool,
    install_test: bool,
}

/// `args` checked: a version and release both RPM and Debian accept, known targets.
fn parse(args: Args) -> Result<Options> {
    let o = Options {
        version: match args.version {
            Some(v) => v,
            None => workspace_version()?,
        },
        release: args.release,
        targets: targets::parse_list(&args.target)?,
        build: !args.no_build,
        verify: args.verify,
        image: args.image,
        install_test: args.install_test,
    };
    // RPM forbids '-' in versions and Debian wants a digit first: keep to what both accept.
    let ok_chars = o
        .version
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~'));
    if o.version.is_empty() || !o.version.starts_with(|c: char| c.is_ascii_digit()) || !ok_chars {
        bail!(
            "invalid version {:?}: use digits, letters, '.', '+' or '~', starting with a digit",
            o.version
        );
    }
    if o.release.is_empty()
        || !o
            .release
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.')
    {
        bail!("invalid release {:?}", o.release);
    }
    Ok(o)
}

/// Builds, packages and checks what `args` asks for (`cargo xtask dist`).
pub fn dist(args: Args) -> Result<()> {
    let o = parse(args)?;
    let root = root();
    let commit = git_commit(&root)?;
    let out = target_dir(&root).join("dist");
    let host = Arch::host()?;
    let mut binaries = Vec::new();
    for target in &o.targets {
        let binary = if o.build {
            targets::build(target, &o.version, &commit)?
        } else {
            target.binary(&root)
        };
        if !binary.is_file() {
            bail!(
                "{} does not exist: build it or drop --no-build",
                binary.display()
            );
        }
        binaries.push((target, binary));
    }
    // The man pages and completions, once for every package: written by the host
    // architecture's binary, else by another one's under qemu-user.
    let (target, binary) = binaries
        .iter()
        .find(|(t, _)| t.arch == host)
        .or(binaries.first())
        .context("no target to package")?;
    let runner = if target.arch == host {
        None
    } else {
        Some(qemu::qemu(target.arch)?)
    };
    let assets = out.join("assets");
    assets::generate(binary, runner.as_deref(), &assets)?;
    let mut sets = Vec::new();
    for (target, binary) in &binaries {
        sets.push(build::package(&root, target, binary, &assets, &o, &out)?);
    }
    // The tests that run a binary, and the image, use the host architecture's package set.
    let native = sets.iter().find(|s| s.target.arch == host);
    let emulated: Vec<&PackageSet> = sets.iter().filter(|s| s.target.arch != host).collect();
    let image = if o.image {
        let set = native.with_context(|| {
            format!(
                "--image needs a {} target, whose binary the image holds",
                host.name()
            )
        })?;
        Some(image::build(&root, set, &o.version, &out)?)
    } else {
        None
    };
    let mut made: Vec<&Path> = sets
        .iter()
        .flat_map(PackageSet::files)
        .map(PathBuf::as_path)
        .collect();
    made.extend(image.as_ref().map(|i| i.archive.as_path()));
    build::write_checksums(&out, &made)?;
    println!("dist: packages in {}", out.display());
    for p in &made {
        println!("  {}", p.display());
    }
    if o.verify {
        for set in &sets {
            verify::verify(set)?;
        }
    }
    // The fleet simulator and the demo helper, for every test that provisions a fleet.
    let fleet_needed = o.install_test || (o.verify && (image.is_some() || !emulated.is_empty()));
    // They run here, so they are built for this architecture: with the native packages' target,
    // else the host's default release target.
    let bins = if fleet_needed {
        let target = match native {
            Some(set) => set.target.clone(),
            None => Target::default_for_host()?,
        };
        // Built with the packaged binary when there is a package set for this architecture.
        fleet_binaries(&root, &target, o.build && native.is_none())?
    } else {
        None
    };
    if o.verify {
        for set in &emulated {
            match &bins {
                Some(bins) => qemu::provision_fleet(&set.binary(), set.target.arch, bins)?,
                None => println!(
                    "skipped: no fleet simulator and demo helper built (--no-build): the {} \
                     binary is not run under qemu-user",
                    set.target.arch.name()
                ),
            }
        }
        if let Some(image) = &image {
            match &bins {
                Some(bins) => image::provision_fleet(image, bins)?,
                None => println!(
                    "skipped: no fleet simulator and demo helper built (--no-build): the image \
                     is not run"
                ),
            }
        }
    }
    if o.install_test {
        let set = native.with_context(|| {
            format!(
                "--install-test installs the {} packages: add a {} target",
                host.name(),
                host.name()
            )
        })?;
        // A binary built earlier (`--no-build`) carries whatever version and commit it was built
        // with; only a build from this run is held to them.
        let expect = o.build.then_some((o.version.as_str(), commit.as_str()));
        install::install_test(&set.deb, &set.rpm, &out, expect, bins.as_deref())?;
    }
    Ok(())
}

/// The fleet simulator and the demo helper the tests provision fleets with: those built with the
/// packaged binary (targets::build), or built here in release for `target` when `build` (no
/// package set of the host's architecture); with `--no-build` whatever release build is there.
fn fleet_binaries(root: &Path, target: &Target, build: bool) -> Result<Option<PathBuf>> {
    let dir = target_dir(root).join(target.triple()).join("release");
    let bins = [FLEET_SIM, DEMO_HELPER];
    if build {
        println!(
            "dist: release build of the fleet simulator and the demo helper for {}",
            target.spec
        );
        targets::cargo_build(target, &bins, &[])?;
    }
    let ok = bins.iter().all(|b| dir.join(b).is_file());
    Ok(ok.then_some(dir))
}

/// The packages of one target, and the staged tree they were made from.
struct PackageSet {
    target: Target,
    tarball: PathBuf,
    deb: PathBuf,
    rpm: PathBuf,
    stage: PathBuf,
}

impl PackageSet {
    fn files(&self) -> [&PathBuf; 3] {
        [&self.tarball, &self.deb, &self.rpm]
    }

    /// The packaged (stripped) binary.
    fn binary(&self) -> PathBuf {
        self.stage.join("usr/sbin").join(NAME)
    }

    /// The packaged (stripped) fleet simulator.
    fn fleet_sim(&self) -> PathBuf {
        self.stage.join("usr/bin").join(FLEET_SIM)
    }
}

/// The cargo that runs this build.
fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The workspace's target directory: `CARGO_TARGET_DIR` (relative to `root`), else
/// `root/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => root.join(d),
        None => root.join("target"),
    }
}

/// `version` of `[workspace.package]` in the workspace's Cargo.toml.
fn workspace_version() -> Result<String> {
    let text = fs::read_to_string(root().join("Cargo.toml")).context("cannot read Cargo.toml")?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
            continue;
        }
        if in_package {
            if let Some(v) = line.strip_prefix("version") {
                let v = v
                    .trim_start()
                    .trim_start_matches('=')
                    .trim()
                    .trim_matches('"');
                return Ok(v.to_string());
            }
        }
    }
    bail!("no version in [workspace.package] of Cargo.toml")
}

/// The short hash of the checked-out commit.
fn git_commit(root: &Path) -> Result<String> {
    let out = host::capture(Command::new("git").current_dir(root).args([
        "rev-parse",
        "--short",
        "HEAD",
    ]))?;
    Ok(out.trim().to_string())
}

/// How `binary` is linked ([`elf::linkage`]).
pub(crate) fn linkage(binary: &Path) -> Result<elf::Linkage> {
    let bytes = fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    elf::linkage(&bytes).map_err(|e| Error::Failed(format!("{}: {e}", binary.display())))
}
