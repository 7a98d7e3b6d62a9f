//! The packages of one target: its staged file tree (the files of [`LAYOUT`], the man pages and
//! completions ([`crate::assets`]) and the documentation, the binaries stripped of their line
//! tables), and the tarball, the Debian
//! package and the RPM made from it, their maintainer scripts sharing
//! packaging/maintainer-functions.sh.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{bail, Context, Result};
use crate::host::{apt_install, capture, run, which};
use crate::targets::{Arch, Target};
use crate::{
    linkage, Options, PackageSet, FLEET_SIM, FUNCTIONS_MARKER, HOMEPAGE, LAYOUT, MAINTAINER_EMAIL,
    NAME, RPM_EPOCH, SERVICE_USER,
};

/// Stages `binary` for `target` under `out/<arch>/stage`, with the man pages and completions
/// [`crate::assets::generate`] wrote under `assets`, and makes its tarball, .deb and RPM in
/// `out`.
pub fn package(
    root: &Path,
    target: &Target,
    binary: &Path,
    assets: &Path,
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
    crate::assets::stage(assets, &stage)?;
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

/// `rpmbuild -bb SPEC` building under `top` into `top/RPMS` for `arch`, the package named by
/// `name_fmt`; no post-install analysis (EL-only helpers that would inspect /bin/sh scripts).
/// Nothing is compiled, so `--target` only names the architecture, which lets an x86_64 host
/// make the aarch64 package.
pub fn rpmbuild(top: &Path, spec: &Path, arch: &str, name_fmt: &str) -> Command {
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
        apt_install(&[&package], true);
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

/// Copies `src` to `dest` (making its directory) with `mode`.
pub fn install_file(src: &Path, dest: &Path, mode: u32) -> Result<()> {
    make_parent(dest)?;
    fs::copy(src, dest)
        .with_context(|| format!("cannot copy {} to {}", src.display(), dest.display()))?;
    set_mode(dest, mode)
}

/// Writes `text` to `path` (making its directory) with `mode`.
pub fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    make_parent(path)?;
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    set_mode(path, mode)
}

fn make_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) => {
            fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
        }
        None => Ok(()),
    }
}

/// Sets the permission bits of `path`.
pub fn set_mode(path: &Path, mode: u32) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
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
    write_file(&control_dir.join("postinst"), &postinst, 0o755)?;
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
        let rel = file
            .strip_prefix(stage)
            .unwrap_or(&file)
            .to_string_lossy()
            .to_string();
        if rel.starts_with("etc/") {
            continue;
        }
        let text = capture(Command::new("md5sum").arg(&file))?;
        let sum = text
            .split_whitespace()
            .next()
            .context("md5sum said nothing")?;
        sums.push_str(&format!("{sum}  {rel}\n"));
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
        if !apt_install(&["rpm"], false) {
            bail!("rpmbuild not found and could not be installed: apt-get install rpm");
        }
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
pub fn maintainer_functions(root: &Path) -> Result<String> {
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

/// `SHA256SUMS` in `out`, for `files` there.
pub fn write_checksums(out: &Path, files: &[&Path]) -> Result<()> {
    let mut cmd = Command::new("sha256sum");
    cmd.current_dir(out);
    for p in files {
        cmd.arg(p.file_name().context("package without a name")?);
    }
    fs::write(out.join("SHA256SUMS"), capture(&mut cmd)?)?;
    Ok(())
}

/// Every file under `dir`, sorted.
pub fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
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

/// The bytes of every file under `dir`.
fn tree_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for f in walk(dir)? {
        total += fs::metadata(&f)?.len();
    }
    Ok(total)
}
