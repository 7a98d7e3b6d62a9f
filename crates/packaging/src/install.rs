//! `cargo xtask dist --install-test`: the .deb installed on this machine (as root) and checked
//! as installed, then purged; and our RPM swapped in place of a Go-style RPM and back. What a
//! Go deployment does through the swap is in `go_deploy`, the upgrade decision in `maint`, a
//! fleet provisioned by the installed package in `fleet`.

use std::fs;
use std::path::Path;
use std::process::Command;

use test_support::ca::TestCa;

use crate::error::{bail, Context, Result};
use crate::host::{capture, combined, run, section, which};
use crate::sandbox::Sandbox;
use crate::verify::{analyze_unit, logrotate_accepts, unit_exposure};
use crate::{
    fleet, go_deploy, maint, unit_security, BIN, CFG, ETC, GO_LOG, NAME, SERVICE_USER, UNIT, YAML,
};

/// Installs the .deb with dpkg and checks it as installed: the service account, ownership and
/// modes, the installed unit, `check` as the unit runs it, the upgrade decision over a good and
/// a refused configuration, a Go deployment through its migration, an upgrade over an edited
/// configuration, and a simulated fleet provisioned by the package; then purges it. Then our
/// RPM replaces a Go-style RPM, and the Go RPM replaces ours again (the rollback).
pub fn install_test(
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

/// The .deb's part of [`install_test`].
fn deb_install_test(
    deb: &Path,
    rpm: &Path,
    expect: Option<(&str, &str)>,
    bins: Option<&Path>,
) -> Result<()> {
    which("dpkg")?;
    let bin = Path::new(BIN);
    let o = Command::new("dpkg").arg("-i").arg(deb).output()?;
    section("dpkg -i (first install)", &combined(&o));
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
    for left in [BIN, GO_LOG, ETC] {
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
        (ETC, "root choria-provisioner 750"),
        (YAML, "root choria-provisioner 640"),
        (CFG, "root choria-provisioner 640"),
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
        (BIN, "root root 755"),
    ] {
        let got = stat(path)?;
        if got != want {
            bail!("{path} is {got}, expected {want}");
        }
        println!("ok: {path} {got}");
    }
    Ok(())
}

/// The installed package: its unit, account, owners and modes, logrotate file, `--version`,
/// and `check` of the packaged and of a complete configuration as the unit runs it.
fn installed_checks(expect: Option<(&str, &str)>) -> Result<()> {
    let unit = Path::new(UNIT);
    analyze_unit(unit)?;
    let user = unit_security::service_user(&fs::read_to_string(unit)?)?;
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

    let v = capture(Command::new(BIN).arg("--version"))?;
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
    let sandbox = Sandbox::of_unit(&[])?;
    let (ok, text) = sandbox.check(Path::new(BIN), Path::new(YAML), Path::new(CFG))?;
    section(
        "check with the packaged configuration, as the unit runs it",
        &text,
    );
    if ok || !text.contains("/etc/choria-provisioner/helper") {
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
    check_complete_config(Path::new(BIN), &sandbox)
}

/// A complete plain-mode configuration written into the packaged paths (their owners and modes
/// kept, as an operator edits them), with a client certificate of the test CA for the file
/// provider and the packaged sample helper: `check`, as the unit runs it, must pass.
fn check_complete_config(bin: &Path, sandbox: &Sandbox) -> Result<()> {
    let dir = Path::new(ETC).join("complete");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let ca = TestCa::new(&dir)?;
    let client = ca.issue("provisioner.mcollective", &[])?;
    fs::remove_file(&ca.key)?;
    // The client's key readable through the account's group, the rest of the directory too.
    run(Command::new("chown")
        .args(["-R", &format!("root:{SERVICE_USER}")])
        .arg(&dir))?;
    run(Command::new("chmod")
        .args(["-R", "u=rwX,g=rX,o="])
        .arg(&dir))?;
    let cfg = format!(
        "identity = provisioner.example.net\n\
         plugin.choria.middleware_hosts = nats://127.0.0.1:4222\n\
         plugin.choria.use_srv = false\n\
         plugin.security.provider = file\n\
         plugin.security.file.certificate = {}\n\
         plugin.security.file.key = {}\n\
         plugin.security.file.ca = {}\n",
        client.cert.display(),
        client.key.display(),
        ca.cert.display()
    );
    fs::write(CFG, cfg).with_context(|| format!("cannot write {CFG}"))?;
    let yaml =
        "workers: 2\ninterval: 5m\nlogfile: /var/log/choria-provisioner/choria-provisioner.log\n\
                loglevel: info\nhelper: /usr/share/choria-provisioner/examples/helper-plain.py\n\
                token: s3cret\nsite: dist-test\nmonitor_port: 0\n\
                audit_file: /var/log/choria-provisioner/audit.jsonl\n";
    fs::write(YAML, yaml).with_context(|| format!("cannot write {YAML}"))?;
    let (ok, text) = sandbox.check(bin, Path::new(YAML), Path::new(CFG))?;
    section(
        "check with a complete configuration in the packaged paths, as the unit runs it",
        &text,
    );
    if !ok {
        bail!("check of a complete configuration failed as {SERVICE_USER}");
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
    let running = Sandbox::of_unit(&[])?;
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
    let yaml = Path::new(YAML);
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
