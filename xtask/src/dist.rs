//! `cargo xtask dist`: the release build of each target and its packages (tarball, Debian
//! package, RPM), the container image, and their verification.
//!
//! Each architecture's packages are built from one staged file tree under
//! `target/dist/<arch>/stage`, so its three packages hold the same files with the same modes.
//! The Debian package is made with `dpkg-deb`, the RPM with `rpmbuild` (Debian's `rpm` package),
//! the tarball with `tar`; no packaging tool outside Debian is needed. How each target is
//! compiled is in [`targets`], the image in [`image`].

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::tools::{root, run, which};

mod elf;
mod fleet;
mod go_deploy;
mod image;
mod maint;
mod qemu;
mod sandbox;
mod targets;
mod unit_security;

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

/// The service account and its group, made by the packages from the sysusers.d file.
const SERVICE_USER: &str = "choria-provisioner";

/// The line of the maintainer scripts replaced by packaging/maintainer-functions.sh.
const FUNCTIONS_MARKER: &str = "@MAINTAINER_FUNCTIONS@";

/// What the packages install, relative to `/`: path, mode, whether it is configuration.
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
    verify: bool,
    /// (root, dpkg) Install the .deb and test it as installed: the service account, owners
    /// and modes, check and a simulated fleet as the unit runs the daemon, the upgrade decision,
    /// a Go deployment's migration; then purge it, and replace a Go-style RPM and back.
    #[arg(long)]
    install_test: bool,
}

struct Options {
    version: String,
    release: String,
    targets: Vec<Target>,
    build: bool,
    verify: bool,
    image: bool,
    install_test: bool,
}

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

/// `cargo xtask dist`.
pub fn main(args: Args) -> Result<()> {
    let o = parse(args)?;
    let root = root();
    let commit = git_commit(&root)?;
    let out = target_dir(&root).join("dist");
    let host = Arch::host()?;
    let mut sets = Vec::new();
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
        sets.push(package(&root, target, &binary, &o, &out)?);
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
    write_checksums(&out, &made)?;
    println!("dist: packages in {}", out.display());
    for p in &made {
        println!("  {}", p.display());
    }
    if o.verify {
        for set in &sets {
            verify(set)?;
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
        install_test(&set.deb, &set.rpm, &out, expect, bins.as_deref())?;
    }
    Ok(())
}

/// Stages `binary` for `target` under `out/<arch>/stage` and makes its tarball, .deb and RPM in
/// `out`.
fn package(
    root: &Path,
    target: &Target,
    binary: &Path,
    o: &Options,
    out: &Path,
) -> Result<PackageSet> {
    let arch = target.arch;
    let work = out.join(arch.name());
    let stage = work.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("cannot clear {}", stage.display()))?;
    }
    stage_tree(root, binary, arch, &stage)?;
    let set = PackageSet {
        target: target.clone(),
        tarball: out.join(format!("{NAME}-{}-linux-{}.tar.gz", o.version, arch.name())),
        deb: out.join(format!(
            "{NAME}_{}-{}_{}.deb",
            o.version,
            o.release,
            arch.deb()
        )),
        rpm: out.join(format!(
            "{NAME}-{}-{}.{}.rpm",
            o.version,
            o.release,
            arch.rpm()
        )),
        stage,
    };
    build_tarball(&set.stage, o, &set.tarball)?;
    build_deb(root, &set.stage, arch, o, &work, &set.deb)?;
    build_rpm(root, &set.stage, arch, o, &work, &set.rpm)?;
    Ok(set)
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

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => root.join(d),
        None => root.join("target"),
    }
}

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

fn git_commit(root: &Path) -> Result<String> {
    let out = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .context("cannot run git rev-parse")?;
    if !out.status.success() {
        bail!("git rev-parse --short HEAD failed");
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `rpmbuild -bb SPEC` building under `top` into `top/RPMS` for `arch`, the package named by
/// `name_fmt`; no post-install analysis (EL-only helpers that would inspect /bin/sh scripts).
/// Nothing is compiled, so `--target` only names the architecture, which lets an x86_64 host
/// make the aarch64 package.
fn rpmbuild(top: &Path, spec: &Path, arch: &str, name_fmt: &str) -> Command {
    let mut cmd = Command::new("rpmbuild");
    cmd.arg("-bb")
        .arg("--target")
        .arg(arch)
        .arg("--define")
        .arg(format!("_topdir {}", top.display()))
        .arg("--define")
        .arg(format!("_rpmdir {}", top.join("RPMS").display()))
        .arg("--define")
        .arg(format!("_build_name_fmt {name_fmt}"))
        .arg("--define")
        .arg("__os_install_post %{nil}")
        .arg(spec);
    cmd
}

/// Where each installed file comes from in the source tree.
fn source_of(root: &Path, binary: &Path, dest: &str) -> PathBuf {
    let file = dest.rsplit('/').next().unwrap_or(dest);
    match dest {
        "usr/sbin/choria-provisioner" => binary.to_path_buf(),
        // Built beside the provisioner, in the same build (targets::build).
        "usr/bin/choria-fleet-sim" => binary.with_file_name(FLEET_SIM),
        "etc/logrotate.d/choria-provisioner" => root.join("packaging/choria-provisioner.logrotate"),
        "usr/lib/tmpfiles.d/choria-provisioner.conf" => {
            root.join("packaging/choria-provisioner.tmpfiles")
        }
        "usr/lib/sysusers.d/choria-provisioner.conf" => {
            root.join("packaging/choria-provisioner.sysusers")
        }
        "usr/share/choria-provisioner/systemd/run-as-root.conf" => {
            root.join("packaging/run-as-root.conf")
        }
        d if d.starts_with("etc/choria-provisioner/") || d.ends_with(".service") => {
            root.join("packaging").join(file)
        }
        d if d.contains("/examples/") => root.join("docs/examples").join(file),
        "usr/share/choria-provisioner/grafana-dashboard.json" => {
            root.join("docs/grafana-dashboard.json")
        }
        "usr/share/doc/choria-provisioner/copyright" => root.join("LICENSE"),
        _ => root.join(file),
    }
}

fn stage_tree(root: &Path, binary: &Path, arch: Arch, stage: &Path) -> Result<()> {
    for (dest, mode, _) in LAYOUT {
        let src = source_of(root, binary, dest);
        install_file(&src, &stage.join(dest), *mode)?;
    }
    // The release profile keeps line tables for the developers' backtraces; the packages ship
    // the binary without them (function names stay, so backtraces still name the frames). The
    // host's strip reads only its own architecture: another one's binary is stripped by the
    // strip of Debian's binutils for that architecture (binutils-aarch64-linux-gnu).
    let staged = [
        stage.join("usr/sbin/choria-provisioner"),
        stage.join("usr/bin").join(FLEET_SIM),
    ];
    let (strip, package) = if arch == Arch::host()? {
        ("strip".to_string(), "binutils".to_string())
    } else {
        let gnu = format!("{}-linux-gnu", arch.name());
        (
            format!("{gnu}-strip"),
            format!("binutils-{}", gnu.replace('_', "-")),
        )
    };
    if which(&strip).is_err() {
        println!("dist: {strip} not found, installing Debian's {package}");
        targets::apt_install(&[&package]);
    }
    match which(&strip) {
        Ok(strip) => run(Command::new(strip).arg("--strip-debug").args(&staged))?,
        Err(_) => println!(
            "dist: {strip} not found and could not be installed (apt-get install {package}): the \
             packaged binaries keep their debug info"
        ),
    }
    // The documentation as Markdown, with the files its pages link to (the dashboard and the
    // sample helpers) so every link works in the installed copy too.
    let docs = stage.join("usr/share/doc/choria-provisioner/docs");
    for sub in ["", "examples"] {
        let dir = root.join("docs").join(sub);
        for entry in fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let path = entry?.path();
            let linked =
                sub == "examples" || path.extension().is_some_and(|e| e == "md" || e == "json");
            if !path.is_file() || !linked {
                continue;
            }
            let name = path.file_name().context("docs entry without a name")?;
            let mode = if sub == "examples" { 0o755 } else { 0o644 };
            install_file(&path, &docs.join(sub).join(name), mode)?;
        }
    }
    Ok(())
}

fn install_file(src: &Path, dest: &Path, mode: u32) -> Result<()> {
    if let Some(dir) = dest.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::copy(src, dest)
        .with_context(|| format!("cannot copy {} to {}", src.display(), dest.display()))?;
    fs::set_permissions(dest, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", dest.display()))?;
    Ok(())
}

fn build_tarball(stage: &Path, o: &Options, out: &Path) -> Result<()> {
    // One top directory holding the file system tree, so
    // `tar -xzf X --strip-components=1 -C /` installs it.
    let top = format!("{NAME}-{}", o.version);
    run(Command::new("tar")
        .arg("-czf")
        .arg(out)
        .args(["--owner=0", "--group=0", "--numeric-owner", "--sort=name"])
        .arg(format!("--transform=s,^\\.,{top},"))
        .arg("-C")
        .arg(stage)
        .arg("."))
}

fn build_deb(
    root: &Path,
    stage: &Path,
    arch: Arch,
    o: &Options,
    out: &Path,
    deb: &Path,
) -> Result<()> {
    which("dpkg-deb")?;
    let tree = out.join("deb-root");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    run(Command::new("cp").arg("-a").arg(stage).arg(&tree))?;
    let control_dir = tree.join("DEBIAN");
    fs::create_dir_all(&control_dir)?;
    for script in ["prerm", "postrm"] {
        install_file(
            &root.join("packaging/debian").join(script),
            &control_dir.join(script),
            0o755,
        )?;
    }
    let postinst = with_functions(
        root,
        &fs::read_to_string(root.join("packaging/debian/postinst.in"))?,
    )?;
    fs::write(control_dir.join("postinst"), postinst)?;
    fs::set_permissions(
        control_dir.join("postinst"),
        fs::Permissions::from_mode(0o755),
    )?;
    install_file(
        &root.join("packaging/debian/conffiles"),
        &control_dir.join("conffiles"),
        0o644,
    )?;
    let binary = stage.join("usr/sbin/choria-provisioner");
    // A static binary needs no C library; a glibc one names the oldest it runs on.
    let depends = match linkage(&binary)?.glibc_text() {
        Some(v) => format!("libc6 (>= {v}), passwd"),
        None => "passwd".to_string(),
    };
    let installed_kib = tree_size(stage)?.div_ceil(1024);
    let control = fs::read_to_string(root.join("packaging/debian/control.in"))?
        .replace("@DEB_VERSION@", &format!("{}-{}", o.version, o.release))
        .replace("@DEB_ARCH@", arch.deb())
        .replace("@MAINTAINER_EMAIL@", MAINTAINER_EMAIL)
        .replace("@INSTALLED_SIZE@", &installed_kib.to_string())
        .replace("@DEPENDS@", &depends)
        .replace("@HOMEPAGE@", HOMEPAGE);
    fs::write(control_dir.join("control"), control)?;
    // md5sums of every non-configuration file, as dpkg --verify uses them.
    let mut sums = String::new();
    for file in walk(stage)? {
        let rel = file.strip_prefix(stage)?.to_string_lossy().to_string();
        if rel.starts_with("etc/") {
            continue;
        }
        let out = Command::new("md5sum")
            .arg(&file)
            .output()
            .context("cannot run md5sum")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let sum = text
            .split_whitespace()
            .next()
            .context("md5sum said nothing")?;
        writeln!(sums, "{sum}  {rel}")?;
    }
    fs::write(control_dir.join("md5sums"), sums)?;
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&tree)
        .arg(deb))
}

fn build_rpm(
    root: &Path,
    stage: &Path,
    arch: Arch,
    o: &Options,
    out: &Path,
    rpm: &Path,
) -> Result<()> {
    if which("rpmbuild").is_err() {
        // Debian's `rpm` package provides rpmbuild; only installed when missing.
        println!("dist: rpmbuild not found, installing Debian's rpm package");
        run(Command::new("apt-get").args(["install", "-y", "--no-install-recommends", "rpm"]))?;
    }
    let top = out.join("rpmbuild");
    if top.exists() {
        fs::remove_dir_all(&top)?;
    }
    fs::create_dir_all(top.join("SPECS"))?;
    let spec = with_functions(
        root,
        &fs::read_to_string(root.join("packaging/rpm/choria-provisioner.spec.in"))?,
    )?
    .replace("@SYSUSERS_LINE@", &sysusers_line(root)?)
    .replace("@RPM_EPOCH@", RPM_EPOCH)
    .replace("@RPM_VERSION@", &o.version)
    .replace("@RPM_RELEASE@", &o.release)
    .replace("@HOMEPAGE@", HOMEPAGE)
    .replace("@STAGE@", &stage.to_string_lossy());
    let spec_file = top.join("SPECS").join(format!("{NAME}.spec"));
    fs::write(&spec_file, spec)?;
    run(&mut rpmbuild(
        &top,
        &spec_file,
        arch.rpm(),
        "%%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
    ))?;
    let built = top
        .join("RPMS")
        .join(rpm.file_name().context("rpm path without a name")?);
    fs::rename(&built, rpm)
        .with_context(|| format!("cannot move {} to {}", built.display(), rpm.display()))?;
    Ok(())
}

/// The shared shell functions of the maintainer scripts (packaging/maintainer-functions.sh).
fn maintainer_functions(root: &Path) -> Result<String> {
    let path = root.join("packaging/maintainer-functions.sh");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    // rpm expands macros in scriptlets, so a percent sign would not reach the shell as written.
    if text.contains('%') {
        bail!(
            "{} holds a percent sign, which rpm would expand",
            path.display()
        );
    }
    Ok(text.trim_end().to_string())
}

/// `script` with each line that is [`FUNCTIONS_MARKER`] alone replaced by the shared functions.
fn with_functions(root: &Path, script: &str) -> Result<String> {
    let functions = maintainer_functions(root)?;
    if !script.lines().any(|l| l.trim() == FUNCTIONS_MARKER) {
        bail!("a maintainer script template has no {FUNCTIONS_MARKER} line");
    }
    let mut out = String::new();
    for line in script.lines() {
        if line.trim() == FUNCTIONS_MARKER {
            out.push_str(&functions);
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    Ok(out)
}

/// The one entry of packaging/choria-provisioner.sysusers, which the RPM's pre-install scriptlet
/// hands to systemd-sysusers before the file itself is unpacked.
fn sysusers_line(root: &Path) -> Result<String> {
    let path = root.join("packaging/choria-provisioner.sysusers");
    let text =
        fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    match lines.as_slice() {
        [line] if line.starts_with(&format!("u {SERVICE_USER} ")) && !line.contains('\'') => {
            Ok(line.to_string())
        }
        _ => bail!(
            "{} should hold one `u {SERVICE_USER} ...` line without single quotes, holds {lines:?}",
            path.display()
        ),
    }
}

fn write_checksums(out: &Path, files: &[&Path]) -> Result<()> {
    let mut cmd = Command::new("sha256sum");
    cmd.current_dir(out);
    for p in files {
        cmd.arg(p.file_name().context("package without a name")?);
    }
    let o = cmd.output().context("cannot run sha256sum")?;
    if !o.status.success() {
        bail!("sha256sum failed");
    }
    fs::write(out.join("SHA256SUMS"), &o.stdout)?;
    Ok(())
}

/// The newest glibc a release binary may need: Enterprise Linux 7's. Static binaries need none.
const MAX_GLIBC: (u32, u32) = (2, 17);

/// How `binary` is linked ([`elf::linkage`]).
fn linkage(binary: &Path) -> Result<elf::Linkage> {
    let bytes = fs::read(binary).with_context(|| format!("cannot read {}", binary.display()))?;
    elf::linkage(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", binary.display()))
}

/// The packaged binary is for the target's architecture and runs on every supported system:
/// static, or needing glibc [`MAX_GLIBC`] at most.
fn verify_linkage(set: &PackageSet) -> Result<elf::Linkage> {
    let machine = match set.target.arch {
        Arch::X86_64 => elf::Machine::X86_64,
        Arch::Aarch64 => elf::Machine::Aarch64,
    };
    // The packaged fleet simulator is held to what the provisioner is.
    let sim = set.fleet_sim();
    let sim_linkage = linkage(&sim)?;
    let binary = set.binary();
    let l = linkage(&binary)?;
    if sim_linkage != l {
        bail!(
            "{} is {sim_linkage}, not {l} as {} is",
            sim.display(),
            binary.display()
        );
    }
    if l.machine != machine {
        bail!(
            "{} is {l}, not {}",
            binary.display(),
            set.target.arch.name()
        );
    }
    if let Some(v) = l.glibc.filter(|v| *v > MAX_GLIBC) {
        bail!(
            "{} needs glibc {}.{}, newer than {}.{} (Enterprise Linux 7): build a musl target",
            binary.display(),
            v.0,
            v.1,
            MAX_GLIBC.0,
            MAX_GLIBC.1
        );
    }
    println!("ok: the {} binary is {l}", set.target.spec);
    Ok(l)
}

fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d).with_context(|| format!("cannot read {}", d.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn tree_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for f in walk(dir)? {
        total += fs::metadata(&f)?.len();
    }
    Ok(total)
}

/// Runs a command and returns its standard output, failing with its standard error.
fn capture(cmd: &mut Command) -> Result<String> {
    let o = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !o.status.success() {
        bail!(
            "{cmd:?} failed: {}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn expect_paths(what: &str, listing: &str, prefix: &str) -> Result<()> {
    let mut missing = Vec::new();
    for (dest, _, _) in LAYOUT {
        let want = format!("{prefix}{dest}");
        if !listing.lines().any(|l| l.trim_end().ends_with(&want)) {
            missing.push(want);
        }
    }
    if !missing.is_empty() {
        bail!("{what} lacks {}", missing.join(", "));
    }
    println!("ok: {what} holds every packaged file");
    Ok(())
}

fn section(title: &str, body: &str) {
    println!("\n== {title}\n{}", body.trim_end());
}

/// Lists each package's contents and metadata and checks them against [`LAYOUT`], and the
/// binary's linkage.
fn verify(files: &PackageSet) -> Result<()> {
    let stage = files.stage.as_path();
    println!("\n== {} packages", files.target.spec);
    let linked = verify_linkage(files)?;
    // Tarball.
    let tar = capture(Command::new("tar").arg("-tvzf").arg(&files.tarball))?;
    section("tarball contents", &tar);
    expect_paths("tarball", &tar, "/")?;

    // Debian package.
    let info = capture(Command::new("dpkg-deb").arg("--info").arg(&files.deb))?;
    section("deb metadata", &info);
    let contents = capture(Command::new("dpkg-deb").arg("--contents").arg(&files.deb))?;
    section("deb contents", &contents);
    expect_paths("deb", &contents, "./")?;
    let conffiles = capture(
        Command::new("dpkg-deb")
            .arg("--info")
            .arg(&files.deb)
            .arg("conffiles"),
    )?;
    section("deb conffiles", &conffiles);
    for (dest, _, config) in LAYOUT {
        let listed = conffiles.lines().any(|l| l.trim() == format!("/{dest}"));
        if *config != listed {
            bail!("deb conffiles: /{dest} should be listed: {config}, is listed: {listed}");
        }
    }
    if !info.contains("Package: choria-provisioner")
        || !info.contains(&format!("Architecture: {}", files.target.arch.deb()))
    {
        bail!("deb metadata lacks the package name or the architecture");
    }
    let libc = match linked.glibc_text() {
        Some(v) => format!("libc6 (>= {v})"),
        None => "libc6".into(),
    };
    let depends = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends:"))
        .unwrap_or_default();
    if depends.contains("libc6") != linked.glibc.is_some()
        || (linked.glibc.is_some() && !depends.contains(&libc))
    {
        bail!("deb Depends: {depends:?} does not match the binary ({linked})");
    }
    println!("ok: deb metadata and conffiles");

    // RPM.
    let info = capture(Command::new("rpm").arg("-qip").arg(&files.rpm))?;
    section("rpm metadata", &info);
    let list = capture(Command::new("rpm").arg("-qlvp").arg(&files.rpm))?;
    section("rpm contents", &list);
    expect_paths("rpm", &list, "/")?;
    let configs = capture(Command::new("rpm").arg("-qcp").arg(&files.rpm))?;
    section("rpm config files", &configs);
    for (dest, _, config) in LAYOUT {
        let listed = configs.lines().any(|l| l.trim() == format!("/{dest}"));
        if *config != listed {
            bail!("rpm config files: /{dest} should be listed: {config}, is listed: {listed}");
        }
    }
    let noreplace = capture(
        Command::new("rpm")
            .args([
                "-qp",
                "--queryformat",
                "[%{FILENAMES} %{FILEFLAGS:fflags}\\n]",
            ])
            .arg(&files.rpm),
    )?;
    for line in noreplace.lines().filter(|l| l.starts_with("/etc/")) {
        if line.ends_with("/etc/choria-provisioner") {
            continue;
        }
        if !line.contains('n') || !line.contains('c') {
            bail!("rpm: {line}: configuration not marked %config(noreplace)");
        }
    }
    let scripts = capture(
        Command::new("rpm")
            .arg("-qp")
            .arg("--scripts")
            .arg(&files.rpm),
    )?;
    section("rpm scripts", &scripts);
    println!("ok: rpm metadata and %config(noreplace) files");
    let rpm_arch = capture(
        Command::new("rpm")
            .args(["-qp", "--queryformat", "%{ARCH}"])
            .arg(&files.rpm),
    )?;
    if rpm_arch.trim() != files.target.arch.rpm() {
        bail!(
            "rpm: architecture {rpm_arch:?}, expected {}",
            files.target.arch.rpm()
        );
    }
    let evr = capture(
        Command::new("rpm")
            .args(["-qp", "--queryformat", "%{EPOCH}"])
            .arg(&files.rpm),
    )?;
    if evr.trim() != RPM_EPOCH {
        bail!("rpm: epoch {evr:?}, expected {RPM_EPOCH} (above the Go provisioner's RPMs)");
    }
    let ghost = format!("{GO_LOG} ");
    if !noreplace
        .lines()
        .any(|l| l.starts_with(&ghost) && l[ghost.len()..].contains('g'))
    {
        bail!("rpm: {GO_LOG} is not owned as %ghost (replacing the Go package would delete it)");
    }
    println!("ok: rpm epoch {RPM_EPOCH}, {GO_LOG} owned as %ghost");

    // Owners and modes the RPM installs with (the .deb's files are root's, its postinst gives
    // the configuration to the account's group).
    let owners = capture(
        Command::new("rpm")
            .args([
                "-qp",
                "--queryformat",
                "[%{FILENAMES} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILEMODES:octal}\\n]",
            ])
            .arg(&files.rpm),
    )?;
    let service = format!("{SERVICE_USER} {SERVICE_USER}");
    for (path, owner, mode) in [
        ("/etc/choria-provisioner", "root choria-provisioner", "0750"),
        (
            "/etc/choria-provisioner/choria-provisioner.yaml",
            "root choria-provisioner",
            "0640",
        ),
        (
            "/etc/choria-provisioner/choria.cfg",
            "root choria-provisioner",
            "0640",
        ),
        (GO_LOG, service.as_str(), "0660"),
    ] {
        let line = owners
            .lines()
            .find(|l| l.split_whitespace().next() == Some(path))
            .with_context(|| format!("rpm: {path} is not in the package"))?;
        let f: Vec<&str> = line.split_whitespace().collect();
        let got_mode = f.get(3).map(|m| &m[m.len().saturating_sub(4)..]);
        if f.get(1..3).map(|o| o.join(" ")).as_deref() != Some(owner) || got_mode != Some(mode) {
            bail!("rpm: {line}: expected {owner} {mode}");
        }
    }
    println!("ok: rpm owners: the configuration root:{SERVICE_USER} (0750, 0640), {GO_LOG} the account's");
    verify_scripts(files)?;

    // The systemd unit.
    verify_unit(stage)?;

    // The logrotate file, where logrotate is installed.
    logrotate_accepts(&stage.join("etc/logrotate.d/choria-provisioner"))
}

/// `logrotate --debug FILE` reports no error. logrotate looks up the users its `su` lines name,
/// so where the service account does not exist (a build host) a copy naming root is read and
/// the account is checked by the install test.
fn logrotate_accepts(file: &Path) -> Result<()> {
    let Ok(lr) = which("logrotate") else {
        println!("skipped: logrotate is not installed, the logrotate file is not checked");
        return Ok(());
    };
    let account = Command::new("getent")
        .args(["passwd", SERVICE_USER])
        .output()
        .is_ok_and(|o| o.status.success());
    let dir = std::env::temp_dir().join(format!("dist-logrotate-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let checked = if account {
        file.to_path_buf()
    } else {
        let copy = dir.join("choria-provisioner");
        let text = fs::read_to_string(file)?
            .replace(&format!("su {SERVICE_USER} {SERVICE_USER}"), "su root root");
        fs::write(&copy, text)?;
        copy
    };
    let o = Command::new(lr)
        .arg("--debug")
        .arg("--state")
        .arg(dir.join("state"))
        .arg(&checked)
        .output();
    let _ = fs::remove_dir_all(&dir);
    let o = o?;
    let text = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() || text.contains("error:") {
        bail!("logrotate --debug rejects {}:\n{text}", file.display());
    }
    if account {
        println!("ok: logrotate --debug accepts {}", file.display());
    } else {
        println!(
            "ok: logrotate --debug accepts {} (its su lines read as root: no {SERVICE_USER} \
             account here)",
            file.display()
        );
    }
    Ok(())
}

/// Every maintainer script parses (`sh -n`), and those that make the account and restart the
/// service hold the shared functions exactly as written (rpm expands macros in scriptlets).
fn verify_scripts(files: &PackageSet) -> Result<()> {
    let functions = maintainer_functions(&crate::tools::root())?;
    let parses = |what: &str, script: &str| -> Result<()> {
        let dir = std::env::temp_dir().join(format!("dist-scripts-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let file = dir.join("script");
        fs::write(&file, script)?;
        let o = Command::new("sh").arg("-n").arg(&file).output()?;
        let _ = fs::remove_dir_all(&dir);
        if !o.status.success() {
            bail!(
                "{what} does not parse: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(())
    };
    let holds_functions = |what: &str, script: &str| -> Result<()> {
        for line in functions.lines().filter(|l| !l.trim().is_empty()) {
            if !script.lines().any(|s| s == line) {
                bail!("{what} lacks the maintainer function line {line:?}");
            }
        }
        Ok(())
    };
    for (tag, shared) in [
        ("PREIN", true),
        ("POSTIN", true),
        ("PREUN", false),
        ("POSTUN", false),
    ] {
        let script = capture(
            Command::new("rpm")
                .args(["-qp", "--queryformat", &format!("%{{{tag}}}")])
                .arg(&files.rpm),
        )?;
        let what = format!("the rpm's {tag} scriptlet");
        parses(&what, &script)?;
        if shared {
            holds_functions(&what, &script)?;
        }
    }
    let control = std::env::temp_dir().join(format!("dist-control-{}", std::process::id()));
    if control.exists() {
        fs::remove_dir_all(&control)?;
    }
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(&files.deb)
        .arg(&control))?;
    let result = (|| -> Result<()> {
        for script in ["postinst", "prerm", "postrm"] {
            let text = fs::read_to_string(control.join(script))?;
            let what = format!("the deb's {script}");
            parses(&what, &text)?;
            if script == "postinst" {
                holds_functions(&what, &text)?;
            }
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&control);
    result?;
    println!("ok: the maintainer scripts parse and hold the shared functions as written");
    Ok(())
}

/// `systemd-analyze verify` of the staged unit, alone and with the run-as-root drop-in, and its
/// security: a service account, never root, and an exposure of at most 1.0
/// ([`unit_security`]). systemd 252 checks that `ExecStart` is an executable, so copies of the
/// unit pointing at the staged binary are verified; the install test verifies the installed unit
/// as it is.
fn verify_unit(stage: &Path) -> Result<()> {
    let unit = stage.join("usr/lib/systemd/system/choria-provisioner.service");
    let staged_bin = stage.join("usr/sbin/choria-provisioner");
    let text = fs::read_to_string(&unit)?;
    let user = unit_security::service_user(&text).map_err(anyhow::Error::msg)?;
    if user != SERVICE_USER {
        bail!("the unit runs as {user:?}, not the packages' account {SERVICE_USER}");
    }
    println!("ok: the unit runs as {SERVICE_USER}");
    let check_dir = stage
        .parent()
        .context("stage without a parent")?
        .join("unit-check");
    let text = text.replace(
        "/usr/sbin/choria-provisioner",
        &staged_bin.to_string_lossy(),
    );
    let mut scores = Vec::new();
    for with_root in [false, true] {
        let dir = check_dir.join(if with_root { "run-as-root" } else { "unit" });
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        let copy = dir.join("choria-provisioner.service");
        fs::write(&copy, &text)?;
        if with_root {
            let d = dir.join("choria-provisioner.service.d");
            fs::create_dir_all(&d)?;
            fs::copy(
                stage.join("usr/share/choria-provisioner/systemd/run-as-root.conf"),
                d.join("run-as-root.conf"),
            )?;
        }
        analyze_unit(&copy)?;
        scores.push(unit_exposure(&copy)?);
    }
    if let [Some(unit), Some(root)] = scores.as_slice() {
        if *unit > unit_security::MAX_EXPOSURE_TENTHS {
            bail!(
                "systemd-analyze security rates the unit {}, above {}",
                unit_security::format_tenths(*unit),
                unit_security::format_tenths(unit_security::MAX_EXPOSURE_TENTHS)
            );
        }
        println!(
            "ok: systemd-analyze security --offline=true rates the unit {} (at most {}), {} \
             with the run-as-root drop-in",
            unit_security::format_tenths(*unit),
            unit_security::format_tenths(unit_security::MAX_EXPOSURE_TENTHS),
            unit_security::format_tenths(*root)
        );
    }
    Ok(())
}

/// `systemd-analyze security --offline=true` of `unit` (drop-ins beside it included), printed;
/// `None` when no systemd-analyze here can score a unit file.
fn unit_exposure(unit: &Path) -> Result<Option<u32>> {
    let Ok(analyze) = which("systemd-analyze") else {
        println!("skipped: systemd-analyze is not installed, the unit's exposure is not scored");
        return Ok(None);
    };
    match unit_security::exposure(&analyze, unit).map_err(anyhow::Error::msg)? {
        Ok((tenths, report)) => {
            section(
                &format!("systemd-analyze security --offline=true {}", unit.display()),
                &report,
            );
            Ok(Some(tenths))
        }
        Err(why) => {
            println!("skipped: {why}, the unit's exposure is not scored");
            Ok(None)
        }
    }
}

/// Runs `systemd-analyze verify` on `unit`; any line naming the unit is a problem (unknown
/// keys only produce such a line, not a failing exit status).
fn analyze_unit(unit: &Path) -> Result<()> {
    let analyze = match which("systemd-analyze") {
        Ok(p) => p,
        Err(_) => {
            println!("skipped: systemd-analyze is not installed, the unit is not verified");
            return Ok(());
        }
    };
    let o = Command::new(&analyze)
        .arg("verify")
        .arg(unit)
        .output()
        .context("cannot run systemd-analyze")?;
    let text = String::from_utf8_lossy(&o.stderr).to_string();
    section(&format!("systemd-analyze verify {}", unit.display()), &text);
    if !o.status.success() || mentions_unit_problem(&text) {
        bail!("systemd-analyze verify reports problems with the unit:\n{text}");
    }
    println!("ok: systemd-analyze verify accepts {}", unit.display());
    Ok(())
}

/// Whether systemd-analyze's output names our unit: every complaint about it does (it may also
/// print complaints about the host's own units, which are not ours to fix).
fn mentions_unit_problem(text: &str) -> bool {
    text.lines()
        .any(|l| l.contains("choria-provisioner.service"))
}

/// Installs the .deb with dpkg and checks it as installed: the service account, ownership and
/// modes, the installed unit, `check` as the unit runs it, the upgrade decision over a good and
/// a refused configuration, a Go deployment through its migration, an upgrade over an edited
/// configuration, and a simulated fleet provisioned by the package; then purges it. Then our
/// RPM replaces a Go-style RPM, and the Go RPM replaces ours again (the rollback).
fn install_test(
    deb: &Path,
    rpm: &Path,
    out: &Path,
    expect: Option<(&str, &str)>,
    bins: Option<&Path>,
) -> Result<()> {
    let deb_result = deb_install_test(deb, rpm, expect, bins);
    // The RPM swap runs whatever the .deb test found, so one run reports both.
    let rpm_result = go_deploy::rpm_replaces_go(rpm, out);
    deb_result.and(rpm_result)
}

fn deb_install_test(
    deb: &Path,
    rpm: &Path,
    expect: Option<(&str, &str)>,
    bins: Option<&Path>,
) -> Result<()> {
    which("dpkg")?;
    let bin = Path::new("/usr/sbin/choria-provisioner");
    let o = Command::new("dpkg").arg("-i").arg(deb).output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    section("dpkg -i (first install)", &text);
    if !o.status.success() {
        bail!("dpkg -i failed: {}", o.status);
    }
    let result = installed_checks(expect)
        .and_then(|()| upgrade_over_good_config(deb, rpm))
        .and_then(|()| go_deploy::go_deployment(bin, deb, rpm))
        .and_then(|()| upgrade_keeps_config(deb))
        .and_then(|()| match bins {
            Some(bins) => fleet::provision_fleet(bin, bins),
            None => {
                println!(
                    "skipped: no fleet simulator and demo helper built (--no-build): no fleet \
                     is provisioned under the unit's account"
                );
                Ok(())
            }
        });
    let purge = run(Command::new("dpkg").args(["--purge", NAME]));
    go_deploy::clean_up();
    result?;
    purge?;
    for left in ["/usr/sbin/choria-provisioner", GO_LOG, go_deploy::ETC] {
        if Path::new(left).exists() {
            bail!("dpkg --purge left {left} behind");
        }
    }
    println!(
        "ok: the .deb installs, runs and purges cleanly (the {SERVICE_USER} account stays, as \
         Debian packages leave theirs)"
    );
    Ok(())
}

/// `stat` of `path`: owner, group, octal mode.
fn stat(path: &str) -> Result<String> {
    Ok(
        capture(Command::new("stat").args(["-c", "%U %G %a"]).arg(path))
            .with_context(|| format!("{path} does not exist"))?
            .trim()
            .to_string(),
    )
}

/// The service account and the owners and modes the package leaves.
fn account_and_ownership() -> Result<()> {
    let passwd = capture(Command::new("getent").args(["passwd", SERVICE_USER]))
        .with_context(|| format!("the package made no {SERVICE_USER} account"))?;
    let f: Vec<&str> = passwd.trim().split(':').collect();
    let uid: u32 = f.get(2).and_then(|u| u.parse().ok()).unwrap_or(u32::MAX);
    let group = capture(Command::new("getent").args(["group", SERVICE_USER]))
        .with_context(|| format!("the package made no {SERVICE_USER} group"))?;
    let gid = group.split(':').nth(2).unwrap_or("");
    let login_denied = f
        .get(6)
        .is_some_and(|s| s.ends_with("nologin") || s.ends_with("false"));
    if uid == 0
        || uid >= 1000
        || f.get(3) != Some(&gid)
        || f.get(5) != Some(&"/var/lib/choria-provisioner")
        || !login_denied
    {
        bail!(
            "{SERVICE_USER} should be a system account (uid below 1000) with its own group, home \
             /var/lib/choria-provisioner and no login shell: {}",
            passwd.trim()
        );
    }
    println!(
        "ok: the {SERVICE_USER} account and group exist: {}",
        passwd.trim()
    );
    let service = format!("{SERVICE_USER} {SERVICE_USER}");
    for (path, want) in [
        ("/etc/choria-provisioner", "root choria-provisioner 750"),
        (
            "/etc/choria-provisioner/choria-provisioner.yaml",
            "root choria-provisioner 640",
        ),
        (
            "/etc/choria-provisioner/choria.cfg",
            "root choria-provisioner 640",
        ),
        (GO_LOG, &format!("{service} 660")),
        ("/var/lib/choria-provisioner", &format!("{service} 750")),
        ("/var/log/choria-provisioner", &format!("{service} 755")),
        (
            "/usr/lib/sysusers.d/choria-provisioner.conf",
            "root root 644",
        ),
        (
            "/usr/share/choria-provisioner/systemd/run-as-root.conf",
            "root root 644",
        ),
        ("/usr/sbin/choria-provisioner", "root root 755"),
    ] {
        let got = stat(path)?;
        if got != want {
            bail!("{path} is {got}, expected {want}");
        }
        println!("ok: {path} {got}");
    }
    Ok(())
}

fn installed_checks(expect: Option<(&str, &str)>) -> Result<()> {
    let unit = Path::new("/usr/lib/systemd/system/choria-provisioner.service");
    analyze_unit(unit)?;
    let user =
        unit_security::service_user(&fs::read_to_string(unit)?).map_err(anyhow::Error::msg)?;
    if user != SERVICE_USER {
        bail!("the installed unit runs as {user}");
    }
    if let Some(t) = unit_exposure(unit)? {
        if t > unit_security::MAX_EXPOSURE_TENTHS {
            bail!(
                "systemd-analyze security rates the installed unit {}",
                unit_security::format_tenths(t)
            );
        }
        println!(
            "ok: the installed unit runs as {SERVICE_USER}, exposure {}",
            unit_security::format_tenths(t)
        );
    }
    account_and_ownership()?;
    logrotate_accepts(Path::new("/etc/logrotate.d/choria-provisioner"))?;

    let bin = "/usr/sbin/choria-provisioner";
    let v = capture(Command::new(bin).arg("--version"))?;
    section("installed choria-provisioner --version", &v);
    // The bare version, as the Go provisioner prints it; `check` names the commit.
    match expect {
        Some((version, _)) => {
            if v.trim() != version {
                bail!("--version prints {v:?}, expected {version}");
            }
            println!("ok: --version prints {version}");
        }
        None => {
            if v.trim().is_empty() || v.contains(' ') {
                bail!("--version prints {v:?}");
            }
            println!("ok: --version runs (binary from an earlier build, version not compared)");
        }
    }

    // The configuration the package installs is not runnable until edited (no helper at
    // /etc/choria-provisioner/helper): check, as the unit runs it, must read it, say so and
    // fail.
    let sandbox = sandbox::Sandbox::of_unit(&[])?;
    let o = sandbox
        .command(
            Path::new(bin),
            &[
                "check",
                "--config",
                "/etc/choria-provisioner/choria-provisioner.yaml",
                "--choria-config",
                "/etc/choria-provisioner/choria.cfg",
            ],
        )?
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    section(
        "check with the packaged configuration, as the unit runs it",
        &text,
    );
    if o.status.success() || !text.contains("/etc/choria-provisioner/helper") {
        bail!("check of the packaged configuration should fail naming the missing helper");
    }
    if let Some((version, commit)) = expect {
        let first = text.lines().next().unwrap_or("");
        if first != format!("choria-provisioner {version} (commit {commit})") {
            bail!("check's first line is {first:?}, expected the version {version} and commit {commit}");
        }
        println!("ok: check names {version} and commit {commit}");
    }
    println!(
        "ok: as {SERVICE_USER}, check reads the packaged configuration, rejects it and names \
         the helper"
    );

    // A complete plain-mode configuration in the packaged paths, using the packaged sample
    // helper: check, as the unit runs it, must pass.
    check_complete_config(Path::new(bin), &sandbox)
}

/// The packaged paths' contents are replaced, their owners and modes kept, as an operator
/// edits them.
fn write_keeping_owner(path: &str, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("cannot write {path}"))
}

fn check_complete_config(bin: &Path, sandbox: &sandbox::Sandbox) -> Result<()> {
    let dir = Path::new("/etc/choria-provisioner/complete");
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    // x509 material for the client configuration's file provider.
    let ssl =
        |args: &[&str]| capture(Command::new("openssl").current_dir(dir).args(args)).map(drop);
    ssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
    ])?;
    ssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=provisioner.mcollective",
        "-keyout",
        "key.pem",
        "-out",
        "req.pem",
    ])?;
    ssl(&[
        "x509",
        "-req",
        "-in",
        "req.pem",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        "cert.pem",
    ])?;
    fs::remove_file(dir.join("ca-key.pem"))?;
    // The client's key readable through the account's group, the rest of the directory too.
    run(Command::new("chown")
        .args(["-R", &format!("root:{SERVICE_USER}")])
        .arg(dir))?;
    run(Command::new("chmod").args(["-R", "u=rwX,g=rX,o="]).arg(dir))?;
    write_keeping_owner(
        "/etc/choria-provisioner/choria.cfg",
        &format!(
            "identity = provisioner.example.net\n\
             plugin.choria.middleware_hosts = nats://127.0.0.1:4222\n\
             plugin.choria.use_srv = false\n\
             plugin.security.provider = file\n\
             plugin.security.file.certificate = {d}/cert.pem\n\
             plugin.security.file.key = {d}/key.pem\n\
             plugin.security.file.ca = {d}/ca.pem\n",
            d = dir.display()
        ),
    )?;
    write_keeping_owner(
        "/etc/choria-provisioner/choria-provisioner.yaml",
        "workers: 2\ninterval: 5m\nlogfile: /var/log/choria-provisioner/choria-provisioner.log\n\
         loglevel: info\nhelper: /usr/share/choria-provisioner/examples/helper-plain.py\n\
         token: s3cret\nsite: dist-test\nmonitor_port: 0\n\
         audit_file: /var/log/choria-provisioner/audit.jsonl\n",
    )?;
    let o = sandbox
        .command(
            bin,
            &[
                "check",
                "--config",
                "/etc/choria-provisioner/choria-provisioner.yaml",
                "--choria-config",
                "/etc/choria-provisioner/choria.cfg",
            ],
        )?
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    section(
        "check with a complete configuration in the packaged paths, as the unit runs it",
        &text,
    );
    if !o.status.success() {
        bail!(
            "check of a complete configuration failed as {SERVICE_USER}: {}",
            o.status
        );
    }
    println!(
        "ok: as {SERVICE_USER}, check accepts a complete configuration in the packaged paths \
         (the client key read through the group)"
    );
    Ok(())
}

/// An upgrade over the complete configuration [`check_complete_config`] left: check passes, so
/// the running service is restarted (.deb postinst and RPM post-install).
fn upgrade_over_good_config(deb: &Path, rpm: &Path) -> Result<()> {
    let running = sandbox::Sandbox::of_unit(&[])?;
    maint::deb_upgrade(deb, &running)?.restarted("the .deb over a good configuration")?;
    maint::rpm_post_upgrade(rpm, &running)?.restarted("the RPM over a good configuration")?;
    println!(
        "ok: upgrading over a configuration check accepts restarts the running service (.deb \
         postinst, RPM post-install)"
    );
    account_and_ownership()
}

/// Installing the package again over an edited configuration (an upgrade, for dpkg) keeps the
/// operator's file, its owner and its mode.
fn upgrade_keeps_config(deb: &Path) -> Result<()> {
    let yaml = Path::new("/etc/choria-provisioner/choria-provisioner.yaml");
    let mut text = fs::read_to_string(yaml)?;
    text.push_str("# edited by the operator\n");
    fs::write(yaml, &text)?;
    run(Command::new("dpkg")
        .args(["-i", "--force-confold"])
        .arg(deb))?;
    let after = fs::read_to_string(yaml)?;
    if after != text {
        bail!(
            "reinstalling the package replaced the edited {}",
            yaml.display()
        );
    }
    let owner = stat(&yaml.to_string_lossy())?;
    if owner != "root choria-provisioner 640" {
        bail!(
            "{} is {owner:?} after an upgrade, expected root choria-provisioner 640",
            yaml.display()
        );
    }
    println!("ok: an upgrade keeps the edited configuration, root choria-provisioner 640");
    Ok(())
}
