//! The package swap from the Go provisioner, checked as far as it can be without systemd
//! running: a configuration copied from a Go deployment (root-only keys, helper and CA, the
//! puppet provider's root.mcollective) under the installed unit's account, which `check` and the
//! upgrade refuse; then under each way docs/service.md gives to run it (the run-as-root drop-in,
//! group permissions with the Go certname, systemd credentials), where `check`, the helper, `run`
//! and the upgrade succeed; and our RPM replacing a Go-style RPM in place and being replaced by
//! it again (the rollback).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use test_support::ca::{self, KeyFormat, TestCa};
use test_support::ProcessGuard;

use crate::build::{rpmbuild, set_mode, write_file};
use crate::error::{bail, Context, Result};
use crate::host::{capture, run, section};
use crate::sandbox::Sandbox;
use crate::targets::Arch;
use crate::{maint, ETC, GO_LOG, NAME, RPM_EPOCH, SERVICE_USER, UNIT};

/// The packaged drop-in that runs the service as root.
const RUN_AS_ROOT: &str = "/usr/share/choria-provisioner/systemd/run-as-root.conf";

/// The drop-in docs/service.md gives to keep the Go provisioner's puppet certname under the
/// service account.
const GO_CERTNAME_DROPIN: &str = "[Service]\nEnvironment=MCOLLECTIVE_CERTNAME=root.mcollective\n";

/// Where systemd puts a unit's credentials (LoadCredential=).
const CREDENTIALS: &str = "/run/credentials/choria-provisioner.service";

fn chown(owner: &str, paths: &[&Path]) -> Result<()> {
    run(Command::new("chown").arg(owner).args(paths))
}

/// The site's helper as a Go deployment has it: it signs each server's CSR with a CA key only
/// root can read.
const HELPER: &str = r#"#!/usr/bin/python3
# Signs the server's CSR with the site CA (key readable by root only).
import json, os, subprocess, sys, tempfile
req = json.load(sys.stdin)
ca = "/etc/choria-provisioner/ca"
with tempfile.TemporaryDirectory() as d:
    csr = os.path.join(d, "csr.pem")
    with open(csr, "w") as f:
        f.write(req["csr"]["csr"])
    cert = subprocess.run(
        ["openssl", "x509", "-req", "-in", csr, "-CA", ca + "/ca.pem", "-CAkey", ca + "/ca-key.pem",
         "-set_serial", "1", "-days", "2"],
        check=True, capture_output=True, text=True).stdout
print(json.dumps({"defer": False, "msg": "", "certificate": cert,
                  "ca": open(ca + "/ca.pem").read(), "configuration": {"identity": req["identity"]}}))
"#;

/// The files of a Go deployment, as [`write_go_deployment`] makes them.
struct GoSite {
    ca: PathBuf,
    ssl: PathBuf,
    key: PathBuf,
    helper: PathBuf,
    yaml: PathBuf,
    cfg: PathBuf,
    port: u16,
}

const CERTNAME: &str = "root.mcollective";

/// A configuration copied from a Go deployment, installed over the packaged one: Go-style keys
/// (`Helper:`, `Features:`) and YAML 1.1 booleans, the Go package's log path, a `choria.cfg`
/// naming no security provider (so `puppet`, with a puppet-style ssldir holding root's
/// `root.mcollective` certificate, as `choria enroll` run by root makes it), and the site's
/// helper reading a root-only CA key; every file root's alone, as on the Go host.
fn write_go_deployment() -> Result<GoSite> {
    let etc = Path::new(ETC);
    let ca = etc.join("ca");
    fs::create_dir_all(&ca)?;
    set_mode(&ca, 0o700)?;
    let site_ca = TestCa::named(&ca, "site-ca", 2)?;
    set_mode(&site_ca.key, 0o600)?;
    set_mode(&site_ca.cert, 0o644)?;

    // The puppet-style ssldir: certs/<certname>.pem, private_keys/<certname>.pem, certs/ca.pem.
    let ssl = etc.join("ssl");
    for sub in ["certs", "private_keys"] {
        fs::create_dir_all(ssl.join(sub))?;
    }
    set_mode(&ssl.join("private_keys"), 0o750)?;
    let client = site_ca.issue(CERTNAME, &[])?;
    let key = ssl.join(format!("private_keys/{CERTNAME}.pem"));
    fs::rename(&client.key, &key)?;
    set_mode(&key, 0o640)?;
    fs::rename(&client.cert, ssl.join(format!("certs/{CERTNAME}.pem")))?;
    fs::copy(&site_ca.cert, ssl.join("certs/ca.pem"))?;

    let helper = etc.join("helper");
    write_file(&helper, HELPER, 0o700)?;
    let yaml = etc.join("choria-provisioner.yaml");
    write_file(
        &yaml,
        &format!(
            "---\n\
             # copied from a Go provisioner host\n\
             workers: 4\n\
             interval: 5m\n\
             logfile: {GO_LOG}\n\
             loglevel: info\n\
             Helper: {helper}\n\
             token: toomanysecrets\n\
             choria_insecure: no\n\
             leader_election: no\n\
             site: TEST\n\
             monitor_port: 0\n\
             Features:\n  PKI: yes\n  JWT: no\n",
            helper = helper.display()
        ),
        0o640,
    )?;
    // A port nothing listens on: the daemon keeps trying the broker (as go-choria does) and
    // logs while it does.
    let port = test_support::free_port();
    let cfg = etc.join("choria.cfg");
    write_file(
        &cfg,
        &format!(
            "identity = provisioner.example.net\n\
             plugin.choria.middleware_hosts = nats://127.0.0.1:{port}\n\
             plugin.choria.ssldir = {}\n",
            ssl.display()
        ),
        0o640,
    )?;
    let root_only: Vec<&Path> = vec![etc, &ca, &ssl, &yaml, &cfg, &helper];
    chown("root:root", &root_only)?;
    run(Command::new("chown")
        .args(["-R", "root:root"])
        .arg(&ca)
        .arg(&ssl))?;
    Ok(GoSite {
        ca,
        ssl,
        key,
        helper,
        yaml,
        cfg,
        port,
    })
}

/// Under `sandbox` (`how` names it): `check` accepts the Go deployment and names the Go
/// certname, the site helper signs a server's CSR with the site's CA key, and `run` writes the
/// Go package's log file. Every step runs even when one fails, so one run reports every problem.
fn go_site_runs(sandbox: &Sandbox, how: &str, bin: &Path, site: &GoSite) -> Result<()> {
    println!("== the Go deployment {how}: {}", sandbox.describe());
    let mut failures = Vec::new();
    let (ok, text) = sandbox.check(bin, &site.yaml, &site.cfg)?;
    section(&format!("check of the Go deployment {how}"), &text);
    if !ok {
        failures.push(format!("check refuses the Go deployment {how}"));
    } else if text.contains("warning: unknown") || text.to_lowercase().contains("unknown key") {
        failures.push("check warns about a Go-style key of the copied configuration".into());
    } else if !text.contains(&format!("caller: choria={CERTNAME}")) {
        failures.push(format!(
            "check does not name the caller choria={CERTNAME} the Go provisioner used as root"
        ));
    } else {
        println!("ok: check accepts the Go deployment {how}, caller choria={CERTNAME}");
    }

    // The helper signs a server's CSR with the site's CA key.
    let node = ca::csr(
        &site.ca,
        "node",
        "/CN=node1.example.net",
        &[],
        KeyFormat::Pkcs8,
    )?;
    let input = serde_json::json!({
        "identity": "node1.example.net",
        "csr": {"csr": fs::read_to_string(&node.csr)?, "public_key": "", "ssldir": "/etc/choria/ssl"},
        "ed25519_pubkey": null,
        "inventory": "{}",
        "jwt": null,
    });
    let _ = fs::remove_file(&node.key);
    let _ = fs::remove_file(&node.csr);
    let mut child = sandbox
        .command(&site.helper, &[])?
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        stdin.write_all(input.to_string().as_bytes())?;
    }
    let o = child.wait_with_output()?;
    let reply: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
    if reply["certificate"]
        .as_str()
        .is_some_and(|c| c.contains("BEGIN CERTIFICATE"))
    {
        println!("ok: the site helper signs with the site's CA key {how}");
    } else {
        failures.push(format!(
            "the site helper {how} signed nothing: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }

    // run writes the Go package's log file.
    let log = Path::new(GO_LOG);
    let before = fs::metadata(log)?.len();
    let out_path = std::env::temp_dir().join("choria-provisioner-go-run.out");
    let out = fs::File::create(&out_path)?;
    let (y, c) = (site.yaml.to_string_lossy(), site.cfg.to_string_lossy());
    let mut cmd = sandbox.command(bin, &["run", "--config", &y, "--choria-config", &c])?;
    let mut daemon = ProcessGuard::spawn("provisioner", cmd.stdout(out.try_clone()?).stderr(out))?;
    let grew =
        test_support::wait_until(Duration::from_secs(10), Duration::from_millis(100), || {
            fs::metadata(log).is_ok_and(|m| m.len() > before) || !daemon.running()
        }) && fs::metadata(log)?.len() > before;
    daemon.terminate(Duration::from_secs(15));
    if grew {
        println!("ok: run {how} writes {GO_LOG} (to port {})", site.port);
    } else {
        section(
            &format!("run {how}: output"),
            &fs::read_to_string(&out_path).unwrap_or_default(),
        );
        failures.push(format!("run {how} wrote nothing to {GO_LOG}"));
    }
    if !failures.is_empty() {
        bail!(
            "the Go deployment {how} failed:\n  {}",
            failures.join("\n  ")
        );
    }
    Ok(())
}

/// The Go deployment through the migration: refused under the service account by `check` and
/// by the upgrade (which leaves the running service alone and says why); then, in the three
/// ways docs/service.md gives, accepted and run, and an upgrade restarts the service.
pub fn go_deployment(bin: &Path, deb: &Path, rpm: &Path) -> Result<()> {
    let account = Sandbox::of_unit(&[])?;
    if account.user != SERVICE_USER || account.group != SERVICE_USER {
        bail!(
            "the installed unit runs as {}:{}, expected {SERVICE_USER}",
            account.user,
            account.group
        );
    }
    let dropin = fs::read_to_string(RUN_AS_ROOT)
        .with_context(|| format!("the package did not install {RUN_AS_ROOT}"))?;
    let as_root = Sandbox::of_unit(&[&dropin])?;
    if as_root.user != "root" {
        bail!("{RUN_AS_ROOT} does not run the service as root");
    }
    let site = write_go_deployment()?;

    // As the package installs the unit, the account cannot read a Go site's root-only files.
    let (ok, text) = account.check(bin, &site.yaml, &site.cfg)?;
    section(
        "check of the Go deployment as the service account (before migrating)",
        &text,
    );
    if ok {
        bail!("check accepts a Go site's root-only files as {SERVICE_USER}: the test is wrong");
    }
    println!("ok: check refuses the unmigrated Go deployment as {SERVICE_USER}");

    // So an upgrade leaves the running service alone and says why, for the .deb and the RPM.
    // dpkg's postinst gives the two configuration files to the account's group, which is not
    // enough: the ssldir is root's and names root.mcollective.
    maint::deb_upgrade(deb, &account)?.refused("the .deb over the Go deployment", "problem: ")?;
    maint::rpm_post_upgrade(rpm, &account)?
        .refused("the RPM over the Go deployment", "problem: ")?;
    println!(
        "ok: upgrading over the unmigrated Go deployment leaves the running service alone and \
         says why (.deb postinst, RPM post-install)"
    );

    // 1. The run-as-root drop-in: the Go deployment as it is.
    go_site_runs(&as_root, "under the run-as-root drop-in", bin, &site)?;
    maint::deb_upgrade(deb, &as_root)?.restarted("the .deb with the run-as-root drop-in")?;

    // 2. Group permissions, as docs/service.md gives them: the helper, the CA key and the
    // ssldir readable by the account's group, and the Go certname in a drop-in.
    let group = format!("root:{SERVICE_USER}");
    run(Command::new("chown")
        .args(["-R", &group])
        .arg(&site.ca)
        .arg(&site.ssl))?;
    chown(&group, &[&site.helper])?;
    set_mode(&site.helper, 0o750)?;
    set_mode(&site.ca, 0o750)?;
    set_mode(&site.ca.join("ca-key.pem"), 0o640)?;
    set_mode(&site.key, 0o640)?;
    let migrated = Sandbox::of_unit(&[GO_CERTNAME_DROPIN])?;
    go_site_runs(
        &migrated,
        "as the service account with group permissions",
        bin,
        &site,
    )?;
    maint::deb_upgrade(deb, &migrated)?.restarted("the .deb after the migration")?;
    maint::rpm_post_upgrade(rpm, &migrated)?.restarted("the RPM after the migration")?;
    println!("ok: after the migration an upgrade restarts the service (.deb and RPM)");

    // 3. systemd credentials: the certificate, key and CA handed over by LoadCredential= (here
    // put where systemd puts them, owned by the account, 0400), read by the file provider.
    credentials(bin, &site)
}

/// The LoadCredential= way of docs/service.md, `check` only: the `file` provider reading the
/// credentials directory, the Go certname from MCOLLECTIVE_CERTNAME.
fn credentials(bin: &Path, site: &GoSite) -> Result<()> {
    let dir = Path::new(CREDENTIALS);
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir)?;
    for (name, from) in [
        (
            "provisioner.pem",
            site.ssl.join(format!("certs/{CERTNAME}.pem")),
        ),
        ("provisioner.key", site.key.clone()),
        ("ca.pem", site.ssl.join("certs/ca.pem")),
    ] {
        let to = dir.join(name);
        fs::copy(&from, &to)?;
        set_mode(&to, 0o400)?;
    }
    let owner = format!("{SERVICE_USER}:{SERVICE_USER}");
    run(Command::new("chown").args(["-R", &owner]).arg(dir))?;
    set_mode(dir, 0o500)?;
    let cfg = Path::new(ETC).join("choria-credentials.cfg");
    write_file(
        &cfg,
        &format!(
            "identity = provisioner.example.net\n\
             plugin.choria.middleware_hosts = nats://127.0.0.1:{}\n\
             plugin.security.provider = file\n\
             plugin.security.file.certificate = {CREDENTIALS}/provisioner.pem\n\
             plugin.security.file.key = {CREDENTIALS}/provisioner.key\n\
             plugin.security.file.ca = {CREDENTIALS}/ca.pem\n",
            site.port
        ),
        0o640,
    )?;
    chown(&format!("root:{SERVICE_USER}"), &[&cfg])?;
    let mut sandbox = Sandbox::of_unit(&[GO_CERTNAME_DROPIN])?;
    sandbox
        .env
        .push(("CREDENTIALS_DIRECTORY".into(), CREDENTIALS.into()));
    let result = sandbox.check(bin, &site.yaml, &cfg);
    let _ = fs::remove_dir_all(dir);
    let _ = fs::remove_file(&cfg);
    let (ok, text) = result?;
    section("check with the key from LoadCredential=", &text);
    if !ok || !text.contains(&format!("caller: choria={CERTNAME}")) {
        bail!("check refuses the LoadCredential= configuration, or names another caller");
    }
    println!("ok: check accepts the key handed over by LoadCredential=, caller choria={CERTNAME}");
    Ok(())
}

/// Removes what [`go_deployment`] added under /etc/choria-provisioner (after the purge, which
/// leaves files it did not install).
pub fn clean_up() {
    for sub in ["ca", "ssl", "fleet", "complete"] {
        let _ = fs::remove_dir_all(Path::new(ETC).join(sub));
    }
    let _ = fs::remove_file(Path::new(ETC).join("helper"));
    let _ = fs::remove_dir_all(CREDENTIALS);
    let _ = fs::remove_dir(ETC);
    // The runtime directory the sandbox made as systemd would (and removes at stop).
    let _ = fs::remove_dir_all("/run/choria-provisioner");
}

/// A stand-in for the Go provisioner's RPM: its name, version and release, and the files its
/// spec installs (a binary, the configuration as %config(noreplace), the logrotate file, the
/// unit running as root, and /var/log/choria-provisioner.log).
const GO_SPEC: &str = r#"%define debug_package %{nil}
Name: choria-provisioner
Version: 0.16.0
Release: 1.el8
Summary: Choria Server Provisioner
License: Apache-2.0
BuildArch: @ARCH@

%description
Stand-in for the Go provisioner's package.

%install
mkdir -p %{buildroot}/usr/sbin %{buildroot}/etc/choria-provisioner %{buildroot}/etc/logrotate.d %{buildroot}/usr/lib/systemd/system %{buildroot}/var/log
printf '#!/bin/sh\necho go provisioner\n' > %{buildroot}/usr/sbin/choria-provisioner
chmod 0755 %{buildroot}/usr/sbin/choria-provisioner
printf 'logfile: /var/log/choria-provisioner.log\nhelper: /etc/choria-provisioner/helper\n' > %{buildroot}/etc/choria-provisioner/choria-provisioner.yaml
printf '/var/log/choria-provisioner.log {\n  copytruncate\n}\n' > %{buildroot}/etc/logrotate.d/choria-provisioner
printf '[Service]\nUser=root\nExecStart=/usr/sbin/choria-provisioner run\n' > %{buildroot}/usr/lib/systemd/system/choria-provisioner.service
touch %{buildroot}/var/log/choria-provisioner.log

%files
%attr(640, root, root) %config(noreplace) /etc/choria-provisioner/choria-provisioner.yaml
/usr/sbin/choria-provisioner
/etc/logrotate.d/choria-provisioner
/usr/lib/systemd/system/choria-provisioner.service
%attr(644, root, root) /var/log/choria-provisioner.log
"#;

/// Our RPM replaces the Go provisioner's in place (`rpm -U`, into a scratch root): the upgrade
/// is accepted, the edited configuration and the log file survive, our files replace theirs;
/// and the Go RPM cannot replace ours back.
pub fn rpm_replaces_go(ours: &Path, out: &Path) -> Result<()> {
    let top = out.join("go-rpm");
    if top.exists() {
        fs::remove_dir_all(&top)?;
    }
    fs::create_dir_all(top.join("SPECS"))?;
    let spec = top.join("SPECS/go.spec");
    let arch = Arch::host()?.rpm();
    fs::write(&spec, GO_SPEC.replace("@ARCH@", arch))?;
    run(rpmbuild(&top, &spec, arch, "go.rpm").stdout(Stdio::null()))?;
    let go_rpm = top.join("RPMS/go.rpm");
    let sysroot = top.join("root");
    fs::create_dir_all(&sysroot)?;
    let rpm = |args: &[&str]| {
        let mut c = Command::new("rpm");
        c.arg("--root").arg(&sysroot).args(args);
        c
    };
    run(&mut rpm(&["--initdb"]))?;
    run(rpm(&["-i", "--nodeps", "--noscripts"]).arg(&go_rpm))?;
    let yaml = sysroot.join("etc/choria-provisioner/choria-provisioner.yaml");
    let mut edited = fs::read_to_string(&yaml)?;
    edited.push_str("# edited on the Go host\n");
    fs::write(&yaml, &edited)?;
    let log = sysroot.join(GO_LOG.trim_start_matches('/'));
    fs::write(&log, "{\"msg\":\"a Go log line\"}\n")?;
    // The Go package ships no choria.cfg: the site's own is on disk, owned by no package.
    let cfg = sysroot.join("etc/choria-provisioner/choria.cfg");
    let site_cfg = "identity = provisioner.example.net\nplugin.choria.srv_domain = example.net\n";
    fs::write(&cfg, site_cfg)?;

    let o = rpm(&["-U", "--nodeps", "--noscripts"]).arg(ours).output()?;
    if !o.status.success() {
        bail!(
            "rpm -U of our package over the Go package failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The epoch, version and release of each installed package of our name.
    let installed = || {
        capture(&mut rpm(&[
            "-q",
            "--queryformat",
            "%{EPOCH}:%{VERSION}-%{RELEASE}\n",
            NAME,
        ]))
    };
    let q = installed()?;
    if !q.trim().starts_with(&format!("{RPM_EPOCH}:")) || q.lines().count() != 1 {
        bail!("after rpm -U the installed {NAME} is {q:?}, expected ours alone");
    }
    if fs::read_to_string(&yaml)? != edited {
        bail!("replacing the Go package lost the edited choria-provisioner.yaml");
    }
    if fs::read_to_string(&cfg)? != site_cfg || !cfg.with_extension("cfg.rpmnew").exists() {
        bail!(
            "replacing the Go package did not keep the site's choria.cfg (packaged one as .rpmnew)"
        );
    }
    if fs::read_to_string(&log).unwrap_or_default() != "{\"msg\":\"a Go log line\"}\n" {
        bail!("replacing the Go package removed or changed {GO_LOG}");
    }
    let unit = fs::read_to_string(sysroot.join(UNIT.trim_start_matches('/')))?;
    if !unit.contains("CapabilityBoundingSet=") {
        bail!("replacing the Go package left the Go unit in place");
    }
    println!("ok: our RPM ({}) replaces the Go 0.16.0-1.el8 RPM in place, keeping the edited configuration, the site's choria.cfg and {GO_LOG}", q.trim());
    let o = rpm(&["-U", "--nodeps", "--noscripts"])
        .arg(&go_rpm)
        .output()?;
    if o.status.success() {
        bail!("the Go RPM replaced ours: its version should be older than ours");
    }
    println!("ok: the Go RPM does not replace ours");

    // The rollback docs/migrating.md gives: a downgrade to the Go RPM (what `dnf downgrade`
    // runs), which epoch 1 makes an explicit --oldpackage.
    let o = rpm(&["-U", "--oldpackage", "--nodeps", "--noscripts"])
        .arg(&go_rpm)
        .output()?;
    if !o.status.success() {
        bail!(
            "rpm -U --oldpackage of the Go RPM over ours failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let q = installed()?;
    if q.trim() != "(none):0.16.0-1.el8" {
        bail!("after the rollback the installed {NAME} is {q:?}, expected the Go 0.16.0-1.el8");
    }
    let mut kept = Vec::new();
    if fs::read_to_string(&yaml)? != edited {
        bail!("the rollback lost the edited choria-provisioner.yaml");
    }
    kept.push("the edited choria-provisioner.yaml");
    // choria.cfg was ours, the Go package has none: rpm saves the site's copy aside.
    let saved = cfg.with_extension("cfg.rpmsave");
    if fs::read_to_string(&saved).ok().as_deref() != Some(site_cfg) || cfg.exists() {
        bail!(
            "the rollback should leave the site's choria.cfg as choria.cfg.rpmsave (as \
             docs/migrating.md says); choria.cfg exists: {}, .rpmsave: {:?}",
            cfg.exists(),
            fs::read_to_string(&saved).ok()
        );
    }
    kept.push("choria.cfg as choria.cfg.rpmsave");
    let unit = fs::read_to_string(sysroot.join(UNIT.trim_start_matches('/')))?;
    if !unit.contains("User=root") || unit.contains("CapabilityBoundingSet=") {
        bail!("the rollback did not put the Go unit back");
    }
    let log_text = fs::read_to_string(&log).unwrap_or_default();
    println!(
        "ok: rpm -U --oldpackage puts the Go RPM back ({}), keeping {}; {GO_LOG} {}",
        q.trim(),
        kept.join(", "),
        if log_text.is_empty() {
            "is emptied (the Go package ships it as a file)"
        } else {
            "is kept"
        }
    );
    fs::remove_dir_all(&top)?;
    Ok(())
}
