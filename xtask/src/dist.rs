//! `cargo xtask dist`: the release build and its packages (tarball, Debian package, RPM), and
//! their verification.
//!
//! Everything is built from one staged file tree under `target/dist/stage`, so the three packages
//! hold the same files with the same modes. The Debian package is made with `dpkg-deb`, the RPM
//! with `rpmbuild` (Debian's `rpm` package), the tarball with `tar`; no packaging tool outside
//! Debian is needed.

use std::fmt::Write as _;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::tools::{root, run, which};

mod go_deploy;

const NAME: &str = "choria-provisioner";
const HOMEPAGE: &str = "https://github.com/choria-io/provisioner-rs";
const MAINTAINER_EMAIL: &str = "choria-provisioner@choria.io";

/// The RPM epoch. The Go provisioner's RPMs, also named `choria-provisioner`, carry no epoch and
/// versions up to 0.16.0: with epoch 1 every version of ours is newer than every one of theirs,
/// so installing ours replaces theirs in place and their repository never replaces ours. (The Go
/// provisioner has no Debian package, so the Debian version needs no epoch.)
const RPM_EPOCH: &str = "1";

/// The Go package's log file: named by copied configurations, writable under our unit.
const GO_LOG: &str = "/var/log/choria-provisioner.log";

/// What the packages install, relative to `/`: path, mode, whether it is configuration.
const LAYOUT: &[(&str, u32, bool)] = &[
    ("usr/sbin/choria-provisioner", 0o755, false),
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
    /// Package the existing target/release/choria-provisioner.
    #[arg(long)]
    no_build: bool,
    /// List and check every package's contents and metadata, systemd-analyze the unit.
    #[arg(long)]
    verify: bool,
    /// (root, dpkg) Install the .deb, run --version and check from it, then purge it.
    #[arg(long)]
    install_test: bool,
}

struct Options {
    version: String,
    release: String,
    build: bool,
    verify: bool,
    install_test: bool,
}

fn parse(args: Args) -> Result<Options> {
    let o = Options {
        version: match args.version {
            Some(v) => v,
            None => workspace_version()?,
        },
        release: args.release,
        build: !args.no_build,
        verify: args.verify,
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
    let binary = target_dir(&root).join("release").join(NAME);
    if o.build {
        println!(
            "dist: release build of {NAME} {} (commit {commit})",
            o.version
        );
        run(Command::new(cargo())
            .current_dir(&root)
            .args(["build", "--release", "-p", NAME])
            .env("CHORIA_PROVISIONER_VERSION", &o.version)
            .env("CHORIA_PROVISIONER_COMMIT", &commit))?;
    }
    if !binary.is_file() {
        bail!(
            "{} does not exist: build it or drop --no-build",
            binary.display()
        );
    }
    let out = target_dir(&root).join("dist");
    let stage = out.join("stage");
    if stage.exists() {
        fs::remove_dir_all(&stage).with_context(|| format!("cannot clear {}", stage.display()))?;
    }
    stage_tree(&root, &binary, &stage)?;
    let files = Packages {
        tarball: out.join(format!(
            "{NAME}-{}-linux-{}.tar.gz",
            o.version,
            std::env::consts::ARCH
        )),
        deb: out.join(format!(
            "{NAME}_{}-{}_{}.deb",
            o.version,
            o.release,
            deb_arch()?
        )),
        rpm: out.join(format!(
            "{NAME}-{}-{}.{}.rpm",
            o.version,
            o.release,
            rpm_arch()?
        )),
    };
    build_tarball(&stage, &o, &files.tarball)?;
    build_deb(&root, &stage, &o, &out, &files.deb)?;
    build_rpm(&root, &stage, &o, &out, &files.rpm)?;
    write_checksums(&out, &files)?;
    println!("dist: packages in {}", out.display());
    for p in [&files.tarball, &files.deb, &files.rpm] {
        println!("  {}", p.display());
    }
    if o.verify {
        verify(&stage, &files)?;
    }
    if o.install_test {
        // A binary built earlier (`--no-build`) carries whatever version and commit it was built
        // with; only a build from this run is held to them.
        let expect = o.build.then_some((o.version.as_str(), commit.as_str()));
        install_test(&files.deb, &files.rpm, &out, expect)?;
    }
    Ok(())
}

struct Packages {
    tarball: PathBuf,
    deb: PathBuf,
    rpm: PathBuf,
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

fn deb_arch() -> Result<&'static str> {
    Ok(match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => bail!("no Debian architecture name known for {other}"),
    })
}

/// `rpmbuild -bb SPEC` building under `top` into `top/RPMS`, the package named by `name_fmt`;
/// no post-install analysis (EL-only helpers that would inspect /bin/sh scripts).
fn rpmbuild(top: &Path, spec: &Path, name_fmt: &str) -> Command {
    let mut cmd = Command::new("rpmbuild");
    cmd.arg("-bb")
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

fn rpm_arch() -> Result<&'static str> {
    Ok(match std::env::consts::ARCH {
        "x86_64" => "x86_64",
        "aarch64" => "aarch64",
        other => bail!("no RPM architecture name known for {other}"),
    })
}

/// Where each installed file comes from in the source tree.
fn source_of(root: &Path, binary: &Path, dest: &str) -> PathBuf {
    let file = dest.rsplit('/').next().unwrap_or(dest);
    match dest {
        "usr/sbin/choria-provisioner" => binary.to_path_buf(),
        "etc/logrotate.d/choria-provisioner" => root.join("packaging/choria-provisioner.logrotate"),
        "usr/lib/tmpfiles.d/choria-provisioner.conf" => {
            root.join("packaging/choria-provisioner.tmpfiles")
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

fn stage_tree(root: &Path, binary: &Path, stage: &Path) -> Result<()> {
    for (dest, mode, _) in LAYOUT {
        let src = source_of(root, binary, dest);
        install_file(&src, &stage.join(dest), *mode)?;
    }
    // The release profile keeps line tables for the developers' backtraces; the packages ship
    // the binary without them (function names stay, so backtraces still name the frames).
    let staged = stage.join("usr/sbin/choria-provisioner");
    match which("strip") {
        Ok(strip) => run(Command::new(strip).arg("--strip-debug").arg(&staged))?,
        Err(_) => println!("dist: strip not found, the packaged binary keeps its debug info"),
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

fn build_deb(root: &Path, stage: &Path, o: &Options, out: &Path, deb: &Path) -> Result<()> {
    which("dpkg-deb")?;
    let tree = out.join("deb-root");
    if tree.exists() {
        fs::remove_dir_all(&tree)?;
    }
    run(Command::new("cp").arg("-a").arg(stage).arg(&tree))?;
    let control_dir = tree.join("DEBIAN");
    fs::create_dir_all(&control_dir)?;
    for script in ["postinst", "prerm", "postrm"] {
        install_file(
            &root.join("packaging/debian").join(script),
            &control_dir.join(script),
            0o755,
        )?;
    }
    install_file(
        &root.join("packaging/debian/conffiles"),
        &control_dir.join("conffiles"),
        0o644,
    )?;
    let binary = stage.join("usr/sbin/choria-provisioner");
    let glibc = min_glibc(&binary)?;
    let depends = match glibc {
        Some(v) => format!("libc6 (>= {v}), passwd"),
        None => "passwd".to_string(),
    };
    let installed_kib = tree_size(stage)?.div_ceil(1024);
    let control = fs::read_to_string(root.join("packaging/debian/control.in"))?
        .replace("@DEB_VERSION@", &format!("{}-{}", o.version, o.release))
        .replace("@DEB_ARCH@", deb_arch()?)
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

fn build_rpm(root: &Path, stage: &Path, o: &Options, out: &Path, rpm: &Path) -> Result<()> {
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
    let spec = fs::read_to_string(root.join("packaging/rpm/choria-provisioner.spec.in"))?
        .replace("@RPM_EPOCH@", RPM_EPOCH)
        .replace("@RPM_VERSION@", &o.version)
        .replace("@RPM_RELEASE@", &o.release)
        .replace("@RPM_ARCH@", rpm_arch()?)
        .replace("@HOMEPAGE@", HOMEPAGE)
        .replace("@STAGE@", &stage.to_string_lossy());
    let spec_file = top.join("SPECS").join(format!("{NAME}.spec"));
    fs::write(&spec_file, spec)?;
    run(&mut rpmbuild(
        &top,
        &spec_file,
        "%%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
    ))?;
    let built = top
        .join("RPMS")
        .join(rpm.file_name().context("rpm path without a name")?);
    fs::rename(&built, rpm)
        .with_context(|| format!("cannot move {} to {}", built.display(), rpm.display()))?;
    Ok(())
}

fn write_checksums(out: &Path, files: &Packages) -> Result<()> {
    let mut cmd = Command::new("sha256sum");
    cmd.current_dir(out);
    for p in [&files.tarball, &files.deb, &files.rpm] {
        cmd.arg(p.file_name().context("package without a name")?);
    }
    let o = cmd.output().context("cannot run sha256sum")?;
    if !o.status.success() {
        bail!("sha256sum failed");
    }
    fs::write(out.join("SHA256SUMS"), &o.stdout)?;
    Ok(())
}

/// The highest `GLIBC_x.y` symbol version the binary names, which is the lowest glibc it runs on.
fn min_glibc(binary: &Path) -> Result<Option<String>> {
    let bytes = fs::read(binary)?;
    let needle = b"GLIBC_";
    let mut best: Option<(u32, u32)> = None;
    let mut i = 0;
    while let Some(pos) = bytes
        .get(i..)
        .and_then(|rest| rest.windows(needle.len()).position(|w| w == needle))
    {
        let start = i + pos + needle.len();
        let tail = bytes.get(start..).unwrap_or_default();
        let len = tail
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .count();
        let text = String::from_utf8_lossy(tail.get(..len).unwrap_or_default()).to_string();
        let mut parts = text.split('.').map(|p| p.parse::<u32>());
        if let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next()) {
            if best.is_none_or(|b| (major, minor) > b) {
                best = Some((major, minor));
            }
        }
        i = start;
    }
    Ok(best.map(|(a, b)| format!("{a}.{b}")))
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

/// Lists each package's contents and metadata and checks them against [`LAYOUT`].
fn verify(stage: &Path, files: &Packages) -> Result<()> {
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
    if !info.contains("Package: choria-provisioner") || !info.contains("Depends: libc6") {
        bail!("deb metadata lacks the package name or the libc6 dependency");
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

    // The systemd unit.
    verify_unit(stage)?;

    // The logrotate file, where logrotate is installed.
    match which("logrotate") {
        Ok(lr) => {
            let state = std::env::temp_dir().join("choria-provisioner-logrotate.state");
            let o = Command::new(lr)
                .arg("--debug")
                .arg("--state")
                .arg(&state)
                .arg(stage.join("etc/logrotate.d/choria-provisioner"))
                .output()?;
            let text = String::from_utf8_lossy(&o.stderr);
            if !o.status.success() || text.contains("error:") {
                bail!("logrotate --debug rejects the logrotate file:\n{text}");
            }
            println!("ok: logrotate --debug accepts the logrotate file");
        }
        Err(_) => {
            println!("skipped: logrotate is not installed, the logrotate file is not checked")
        }
    }
    Ok(())
}

/// `systemd-analyze verify` of the staged unit. systemd 252 checks that `ExecStart` is an
/// executable, so a copy of the unit pointing at the staged binary is verified; the install test
/// verifies the installed unit as it is.
fn verify_unit(stage: &Path) -> Result<()> {
    let unit = stage.join("usr/lib/systemd/system/choria-provisioner.service");
    let staged_bin = stage.join("usr/sbin/choria-provisioner");
    let dir = stage
        .parent()
        .context("stage without a parent")?
        .join("unit-check");
    fs::create_dir_all(&dir)?;
    let copy = dir.join("choria-provisioner.service");
    let text = fs::read_to_string(&unit)?.replace(
        "/usr/sbin/choria-provisioner",
        &staged_bin.to_string_lossy(),
    );
    fs::write(&copy, text)?;
    analyze_unit(&copy)
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

/// Installs the .deb with dpkg, runs the installed binary, installs a configuration copied from
/// a Go deployment and runs it under the unit's credentials and file system view, upgrades over
/// an edited configuration, then purges the package; and replaces a Go-style RPM with ours.
fn install_test(deb: &Path, rpm: &Path, out: &Path, expect: Option<(&str, &str)>) -> Result<()> {
    let deb_result = deb_install_test(deb, expect);
    // The RPM swap runs whatever the .deb test found, so one run reports both.
    let rpm_result = go_deploy::rpm_replaces_go(rpm, out);
    deb_result.and(rpm_result)
}

fn deb_install_test(deb: &Path, expect: Option<(&str, &str)>) -> Result<()> {
    which("dpkg")?;
    run(Command::new("dpkg").arg("-i").arg(deb))?;
    let result = installed_checks(expect)
        .and_then(|()| go_deploy::go_deployment(Path::new("/usr/sbin/choria-provisioner")))
        .and_then(|()| upgrade_keeps_config(deb));
    let purge = run(Command::new("dpkg").args(["--purge", NAME]));
    go_deploy::clean_up();
    result?;
    purge?;
    for left in ["/usr/sbin/choria-provisioner", GO_LOG, go_deploy::ETC] {
        if Path::new(left).exists() {
            bail!("dpkg --purge left {left} behind");
        }
    }
    println!("ok: the .deb installs, runs and purges cleanly");
    Ok(())
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
    let owner = capture(Command::new("stat").args(["-c", "%U %G %a"]).arg(yaml))?;
    if owner.trim() != "root root 640" {
        bail!(
            "{} is {owner:?} after an upgrade, expected root root 640",
            yaml.display()
        );
    }
    println!("ok: an upgrade keeps the edited configuration, root root 640");
    Ok(())
}

fn installed_checks(expect: Option<(&str, &str)>) -> Result<()> {
    analyze_unit(Path::new(
        "/usr/lib/systemd/system/choria-provisioner.service",
    ))?;
    let bin = "/usr/sbin/choria-provisioner";
    let v = capture(Command::new(bin).arg("--version"))?;
    section("installed choria-provisioner --version", &v);
    match expect {
        Some((version, commit)) => {
            if !v.contains(version) || !v.contains(commit) {
                bail!("--version prints {v:?}, expected the version {version} and commit {commit}");
            }
            println!("ok: --version names {version} and commit {commit}");
        }
        None => {
            if !v.starts_with("choria-provisioner ") {
                bail!("--version prints {v:?}");
            }
            println!("ok: --version runs (binary from an earlier build, version not compared)");
        }
    }

    // The configuration the package installs is not runnable until edited (no helper at
    // /etc/choria-provisioner/helper): check must say so and fail.
    let o = Command::new(bin)
        .args([
            "check",
            "--config",
            "/etc/choria-provisioner/choria-provisioner.yaml",
            "--choria-config",
            "/etc/choria-provisioner/choria.cfg",
        ])
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    section("installed check with the packaged configuration", &text);
    if o.status.success() || !text.contains("/etc/choria-provisioner/helper") {
        bail!("check of the packaged configuration should fail naming the missing helper");
    }
    println!("ok: check rejects the unedited packaged configuration and names the helper");

    // A complete plain-mode configuration using the packaged sample helper: check must pass.
    let dir = std::env::temp_dir().join(format!("choria-provisioner-dist-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let result = check_complete_config(bin, &dir);
    let _ = fs::remove_dir_all(&dir);
    result
}

fn check_complete_config(bin: &str, dir: &Path) -> Result<()> {
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
    let cfg = dir.join("choria.cfg");
    fs::write(
        &cfg,
        format!(
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
    let yaml = dir.join("provisioner.yaml");
    fs::write(
        &yaml,
        "workers: 2\ninterval: 5m\nlogfile: stdout\nloglevel: info\n\
         helper: /usr/share/choria-provisioner/examples/helper-plain.py\n\
         token: s3cret\nsite: dist-test\nmonitor_port: 0\n",
    )?;
    let o = Command::new(bin)
        .arg("check")
        .arg("--config")
        .arg(&yaml)
        .arg("--choria-config")
        .arg(&cfg)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    section("installed check with a complete configuration", &text);
    if !o.status.success() {
        bail!("check of a complete configuration failed: {}", o.status);
    }
    println!("ok: check accepts a complete configuration using the packaged sample helper");
    Ok(())
}
