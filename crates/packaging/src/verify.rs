//! The checks of `cargo xtask dist --verify` on each target's packages: the binaries' linkage
//! (static, or glibc 2.17 at most), the contents, metadata, configuration files, owners and
//! modes of the tarball, the .deb and the RPM against [`contents::packaged`] (the files of
//! [`LAYOUT`](crate::LAYOUT), the man pages and completions), their maintainer scripts, the
//! systemd unit (`systemd-analyze verify` and its exposure score) and the logrotate file.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::build::maintainer_functions;
use crate::error::{bail, Context, Result};
use crate::host::{capture, run, section, which};
use crate::targets::Arch;
use crate::{contents, elf, linkage, unit_security, PackageSet, GO_LOG, RPM_EPOCH, SERVICE_USER};

/// The newest glibc a release binary may need: Enterprise Linux 7's. Static binaries need none.
const MAX_GLIBC: (u32, u32) = (2, 17);

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

fn expect_paths(what: &str, listing: &str, prefix: &str) -> Result<()> {
    let missing = contents::missing_from(listing, prefix);
    if !missing.is_empty() {
        bail!("{what} lacks {}", missing.join(", "));
    }
    println!("ok: {what} holds every packaged file");
    Ok(())
}

/// Lists each package's contents and metadata and checks them against
/// [`contents::packaged`], and the binary's linkage.
pub fn verify(files: &PackageSet) -> Result<()> {
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
    for (dest, _, config) in contents::packaged() {
        let listed = conffiles.lines().any(|l| l.trim() == format!("/{dest}"));
        if config != listed {
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
    for (dest, _, config) in contents::packaged() {
        let listed = configs.lines().any(|l| l.trim() == format!("/{dest}"));
        if config != listed {
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
pub fn logrotate_accepts(file: &Path) -> Result<()> {
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
    let functions = maintainer_functions(&crate::root())?;
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
    let user = unit_security::service_user(&text)?;
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
pub fn unit_exposure(unit: &Path) -> Result<Option<u32>> {
    let Ok(analyze) = which("systemd-analyze") else {
        println!("skipped: systemd-analyze is not installed, the unit's exposure is not scored");
        return Ok(None);
    };
    match unit_security::exposure(&analyze, unit)? {
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
pub fn analyze_unit(unit: &Path) -> Result<()> {
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
