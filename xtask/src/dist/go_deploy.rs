//! The package swap from the Go provisioner, checked as far as it can be without systemd
//! running: the installed unit's credentials and sandbox, a configuration copied from a Go
//! deployment run under them, and our RPM replacing a Go-style RPM in place.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{capture, section, GO_LOG, NAME, RPM_EPOCH};
use crate::tools::{run, which};

const UNIT: &str = "/usr/lib/systemd/system/choria-provisioner.service";
pub(super) const ETC: &str = "/etc/choria-provisioner";

/// The directives of the installed unit's `[Service]` section, in order (a key may repeat).
fn service_directives(text: &str) -> Vec<(String, String)> {
    let mut in_service = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
            continue;
        }
        if !in_service || line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// What the unit gives the service: its user, the paths it may write, and whether it keeps any
/// capability.
struct Sandbox {
    user: String,
    writable: Vec<PathBuf>,
}

fn unit_sandbox() -> Result<Sandbox> {
    let text = fs::read_to_string(UNIT).with_context(|| format!("cannot read {UNIT}"))?;
    let d = service_directives(&text);
    let get = |k: &'static str| {
        d.iter()
            .filter(move |(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    let last = |k: &'static str| get(k).next_back().unwrap_or("");
    let user = match last("User") {
        "" => "root".to_string(),
        u => u.to_string(),
    };
    // Drop-in compatibility: the Go package's unit runs as root, so a copied configuration
    // keeps its certname, ssldir and root-owned helper inputs.
    if user != "root" {
        bail!("{UNIT} runs as {user:?}; a copied Go deployment expects root");
    }
    // ...and root here holds no capability and gains none.
    let caps: Vec<&str> = get("CapabilityBoundingSet").collect();
    if caps.last().is_none_or(|c| !c.is_empty()) || !get("AmbientCapabilities").all(str::is_empty) {
        bail!("{UNIT} must drop every capability (CapabilityBoundingSet= empty), has {caps:?}");
    }
    for (k, v) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("PrivateDevices", "yes"),
    ] {
        if last(k) != v {
            bail!("{UNIT}: {k}={} (expected {v})", last(k));
        }
    }
    let mut writable = Vec::new();
    for p in get("ReadWritePaths").flat_map(str::split_whitespace) {
        writable.push(PathBuf::from(p.trim_start_matches('-')));
    }
    for (k, base) in [
        ("LogsDirectory", "/var/log"),
        ("StateDirectory", "/var/lib"),
        ("RuntimeDirectory", "/run"),
    ] {
        for p in get(k).flat_map(str::split_whitespace) {
            writable.push(Path::new(base).join(p));
        }
    }
    if !writable.iter().any(|p| p == Path::new(GO_LOG)) {
        bail!("{UNIT} does not let the service write {GO_LOG} (ReadWritePaths=)");
    }
    println!(
        "ok: the unit runs as root with no capabilities, NoNewPrivileges, ProtectSystem=strict; \
         writable: {}",
        writable
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    Ok(Sandbox { user, writable })
}

/// A command run as the unit runs the service: a private mount namespace where `/` is read-only
/// but for the unit's writable paths, then the unit's user with an empty capability bounding
/// set, no new privileges and the environment systemd gives a service with `User=`.
fn as_the_unit(sandbox: &Sandbox, program: &Path, args: &[&str]) -> Result<Command> {
    let setpriv = which("setpriv")?;
    let unshare = which("unshare")?;
    let mut script = String::from("set -e\nmount --make-rprivate /\n");
    for p in &sandbox.writable {
        let q = shell_quote(&p.to_string_lossy());
        // The unit's *Directory= entries are created by systemd before the start.
        if !p.exists() {
            script.push_str(&format!("mkdir -p {q}\n"));
        }
        script.push_str(&format!("mount --bind {q} {q}\n"));
    }
    script.push_str("mount -o remount,bind,ro /\n");
    // PrivateTmp=yes: a /tmp and /var/tmp of the service's own.
    script.push_str("mount -t tmpfs tmpfs /tmp\nmount -t tmpfs tmpfs /var/tmp\n");
    script.push_str("cd /var/lib/choria-provisioner\nexec \"$@\"\n");
    let mut cmd = Command::new(unshare);
    cmd.args(["--mount", "--", "sh", "-c", &script, "sh"])
        .arg(setpriv)
        .args([
            &format!("--reuid={}", sandbox.user),
            &format!("--regid={}", sandbox.user),
            "--clear-groups",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
        ])
        .arg(program)
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("USER", &sandbox.user)
        .env("LOGNAME", &sandbox.user)
        .env("HOME", "/root")
        .env("SHELL", "/bin/sh");
    Ok(cmd)
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    capture(Command::new("openssl").current_dir(dir).args(args)).map(drop)
}

fn write_mode(path: &Path, text: &str, mode: u32) -> Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
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

/// A configuration copied from a Go deployment, installed over the packaged one: Go-style keys
/// (`Helper:`, `Features:`) and YAML 1.1 booleans, the Go package's log path, a `choria.cfg`
/// naming no security provider (so `puppet`, with a puppet-style ssldir holding root's
/// `root.mcollective` certificate, as `choria enroll` run by root makes it), and the site's
/// helper reading a root-only CA key. `check` must accept it under the unit's credentials, the
/// helper must sign with the CA key there, and `run` must write the Go log path there.
pub(super) fn go_deployment(bin: &Path) -> Result<()> {
    let sandbox = unit_sandbox()?;
    let log = Path::new(GO_LOG);
    let st = capture(Command::new("stat").args(["-c", "%U %G %a"]).arg(log))
        .with_context(|| format!("the package did not create {GO_LOG}"))?;
    if st.trim() != "root root 640" {
        bail!("{GO_LOG} is {st:?}, expected root root 640");
    }
    println!("ok: {GO_LOG} exists, root root 640");

    let etc = Path::new(ETC);
    let ca = etc.join("ca");
    fs::create_dir_all(&ca)?;
    fs::set_permissions(&ca, fs::Permissions::from_mode(0o700))?;
    openssl(
        &ca,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=site-ca",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca.pem",
        ],
    )?;
    fs::set_permissions(ca.join("ca-key.pem"), fs::Permissions::from_mode(0o600))?;
    fs::set_permissions(ca.join("ca.pem"), fs::Permissions::from_mode(0o644))?;

    // The puppet-style ssldir: certs/<certname>.pem, private_keys/<certname>.pem, certs/ca.pem.
    let ssl = etc.join("ssl");
    for sub in ["certs", "private_keys"] {
        fs::create_dir_all(ssl.join(sub))?;
    }
    fs::set_permissions(ssl.join("private_keys"), fs::Permissions::from_mode(0o750))?;
    let certname = "root.mcollective";
    let key = ssl.join(format!("private_keys/{certname}.pem"));
    let csr = ca.join("client.csr");
    openssl(
        &ca,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={certname}"),
            "-keyout",
            &key.to_string_lossy(),
            "-out",
            &csr.to_string_lossy(),
        ],
    )?;
    fs::set_permissions(&key, fs::Permissions::from_mode(0o640))?;
    openssl(
        &ca,
        &[
            "x509",
            "-req",
            "-in",
            &csr.to_string_lossy(),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-set_serial",
            "2",
            "-days",
            "2",
            "-out",
            &ssl.join(format!("certs/{certname}.pem")).to_string_lossy(),
        ],
    )?;
    fs::copy(ca.join("ca.pem"), ssl.join("certs/ca.pem"))?;

    let helper = etc.join("helper");
    write_mode(&helper, HELPER, 0o700)?;
    let yaml = etc.join("choria-provisioner.yaml");
    write_mode(
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
    write_mode(
        &cfg,
        &format!(
            "identity = provisioner.example.net\n\
             plugin.choria.middleware_hosts = nats://127.0.0.1:{port}\n\
             plugin.choria.ssldir = {}\n",
            ssl.display()
        ),
        0o640,
    )?;
    let (yaml_s, cfg_s) = (yaml.to_string_lossy(), cfg.to_string_lossy());
    let files = ["--config", &yaml_s, "--choria-config", &cfg_s];

    // check, as the unit runs the daemon.
    let o = as_the_unit(&sandbox, bin, &[&["check"], &files[..]].concat())?.output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    section(
        "check of a Go deployment's configuration, as the unit runs it",
        &text,
    );
    // Every step runs even when one fails, so one run reports every problem.
    let mut failures = Vec::new();
    if !o.status.success() {
        failures.push(format!(
            "check refuses the Go deployment's configuration under the unit: {}",
            o.status
        ));
    } else if text.contains("warning: unknown") || text.to_lowercase().contains("unknown key") {
        failures.push("check warns about a Go-style key of the copied configuration".into());
    } else if !text.contains(certname) {
        failures.push(format!(
            "check does not name the certname {certname} the Go provisioner used as root"
        ));
    } else {
        println!(
            "ok: check accepts the Go deployment's configuration under the unit's credentials"
        );
    }

    // The helper, as the unit runs it, signs a server's CSR with the root-only CA key.
    let node_key = ca.join("node.key");
    let node_csr = ca.join("node.csr");
    openssl(
        &ca,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=node1.example.net",
            "-keyout",
            &node_key.to_string_lossy(),
            "-out",
            &node_csr.to_string_lossy(),
        ],
    )?;
    let input = serde_json::json!({
        "identity": "node1.example.net",
        "csr": {"csr": fs::read_to_string(&node_csr)?, "public_key": "", "ssldir": "/etc/choria/ssl"},
        "ed25519_pubkey": null,
        "inventory": "{}",
        "jwt": null,
    });
    let mut child = as_the_unit(&sandbox, &helper, &[])?
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        use std::io::Write as _;
        stdin.write_all(input.to_string().as_bytes())?;
    }
    let o = child.wait_with_output()?;
    let reply: serde_json::Value = serde_json::from_slice(&o.stdout).with_context(|| {
        format!(
            "the site helper under the unit printed no JSON: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    })?;
    if reply["certificate"]
        .as_str()
        .is_some_and(|c| c.contains("BEGIN CERTIFICATE"))
    {
        println!("ok: the site helper reads the root-only CA key under the unit's credentials");
    } else {
        failures.push(format!(
            "the site helper under the unit signed nothing: {reply}"
        ));
    }

    // run, as the unit runs it, writes the Go package's log file.
    let before = fs::metadata(log)?.len();
    let out = fs::File::create(std::env::temp_dir().join("choria-provisioner-go-run.out"))?;
    let mut child = as_the_unit(&sandbox, bin, &[&["run"], &files[..]].concat())?
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut grew = false;
    while Instant::now() < deadline {
        if fs::metadata(log)?.len() > before {
            grew = true;
            break;
        }
        if child.try_wait()?.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while child.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if child.try_wait()?.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let logged = fs::read_to_string(log).unwrap_or_default();
    section(&format!("{GO_LOG} after run under the unit"), &logged);
    if grew {
        println!("ok: run under the unit's sandbox writes {GO_LOG}");
    } else {
        failures.push(format!("run under the unit wrote nothing to {GO_LOG}"));
    }
    if !failures.is_empty() {
        bail!(
            "the Go deployment case failed:\n  {}",
            failures.join("\n  ")
        );
    }
    Ok(())
}

/// Removes what [`go_deployment`] added under /etc/choria-provisioner (after the purge, which
/// leaves files it did not install).
pub(super) fn clean_up() {
    for sub in ["ca", "ssl"] {
        let _ = fs::remove_dir_all(Path::new(ETC).join(sub));
    }
    let _ = fs::remove_file(Path::new(ETC).join("helper"));
    let _ = fs::remove_dir(ETC);
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
pub(super) fn rpm_replaces_go(ours: &Path, out: &Path) -> Result<()> {
    let top = out.join("go-rpm");
    if top.exists() {
        fs::remove_dir_all(&top)?;
    }
    fs::create_dir_all(top.join("SPECS"))?;
    let spec = top.join("SPECS/go.spec");
    fs::write(&spec, GO_SPEC.replace("@ARCH@", super::rpm_arch()?))?;
    run(super::rpmbuild(&top, &spec, "go.rpm").stdout(Stdio::null()))?;
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
    let q = capture(&mut rpm(&[
        "-q",
        "--queryformat",
        "%{EPOCH}:%{VERSION}-%{RELEASE}\n",
        NAME,
    ]))?;
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
    fs::remove_dir_all(&top)?;
    Ok(())
}
