//! The packages' upgrade decision (issue: never restart into a configuration `check` refuses),
//! observed without systemd: the .deb installed again over itself (an upgrade, for dpkg) and the
//! RPM's post-install scriptlet run on this host with `$1 = 2`, each with a `systemctl` first on
//! `PATH` that reports the service running as the unit (and a drop-in) would run it and records
//! what it is asked. The real `systemctl` is never reached, so this works whether or not systemd
//! is PID 1 and never restarts a real service.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build::write_file;
use crate::error::{bail, Context, Result};
use crate::host::{capture, combined, section};
use crate::sandbox::Sandbox;
use crate::unit_security::{last, service_directives};
use crate::UNIT;

/// What an upgrade did: its output and whether it asked for `try-restart`.
pub struct Upgrade {
    pub output: String,
    pub restarted: bool,
}

impl Upgrade {
    /// The upgrade left the running service alone and said why (the one message the scripts
    /// print), naming `expect` among the problems.
    pub fn refused(&self, what: &str, expect: &str) -> Result<()> {
        if self.restarted {
            bail!(
                "{what}: the service was restarted into a configuration check refuses:\n{}",
                self.output
            );
        }
        if !self.output.contains("was NOT restarted") || !self.output.contains(expect) {
            bail!(
                "{what}: the service was left alone, but the message does not say why (expected \
                 {expect:?}):\n{}",
                self.output
            );
        }
        Ok(())
    }

    /// The upgrade restarted the running service, printing no refusal.
    pub fn restarted(&self, what: &str) -> Result<()> {
        if !self.restarted || self.output.contains("was NOT restarted") {
            bail!(
                "{what}: check should pass and the service be restarted:\n{}",
                self.output
            );
        }
        Ok(())
    }
}

const STUB: &str = r#"#!/bin/sh
# Stands in for systemctl: records every call, reports choria-provisioner.service running.
echo "$*" >> "$STUB_SYSTEMCTL_LOG"
case "$1" in
    is-active) exit 0 ;;
    show)
        case "$*" in
            *--property=User*) echo "User=$STUB_USER" ;;
            *--property=Group*) echo "Group=$STUB_GROUP" ;;
            *--property=Environment*) echo "Environment=$STUB_ENVIRONMENT" ;;
            *--property=ExecStart*)
                echo "ExecStart={ path=/usr/sbin/choria-provisioner ; argv[]=$STUB_EXEC_START ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }" ;;
        esac ;;
esac
exit 0
"#;

/// A directory holding the stand-in `systemctl` and its call log.
struct Stub {
    dir: PathBuf,
}

impl Stub {
    fn new() -> Result<Stub> {
        let dir = std::env::temp_dir().join(format!("dist-systemctl-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir)?;
        }
        fs::create_dir_all(&dir)?;
        write_file(&dir.join("systemctl"), STUB, 0o755)?;
        Ok(Stub { dir })
    }

    fn log(&self) -> PathBuf {
        self.dir.join("calls")
    }

    /// `cmd` with the stand-in first on PATH, answering that the service runs as `running`
    /// (its user, group and environment).
    fn apply<'c>(&self, cmd: &'c mut Command, running: &Sandbox) -> Result<&'c mut Command> {
        let unit = fs::read_to_string(UNIT)?;
        let exec_start = last(&service_directives(&unit), "ExecStart").to_string();
        let path = format!(
            "{}:{}",
            self.dir.display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
        );
        let env: Vec<String> = running
            .env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        Ok(cmd
            .env("PATH", path)
            .env("STUB_SYSTEMCTL_LOG", self.log())
            .env("STUB_USER", &running.user)
            .env("STUB_GROUP", &running.group)
            .env("STUB_ENVIRONMENT", env.join(" "))
            .env("STUB_EXEC_START", exec_start))
    }

    fn finish(&self, o: std::process::Output, what: &str) -> Result<Upgrade> {
        let output = combined(&o);
        if !o.status.success() {
            bail!("{what} failed ({}):\n{output}", o.status);
        }
        let calls = fs::read_to_string(self.log()).unwrap_or_default();
        section(&format!("{what}: output"), &output);
        section(&format!("{what}: systemctl calls"), &calls);
        let _ = fs::remove_dir_all(&self.dir);
        Ok(Upgrade {
            restarted: calls
                .lines()
                .any(|l| l.starts_with("try-restart choria-provisioner.service")),
            output,
        })
    }
}

/// `dpkg -i DEB` over the installed package (configure with the installed version: an upgrade) while
/// the service runs as `running` says.
pub fn deb_upgrade(deb: &Path, running: &Sandbox) -> Result<Upgrade> {
    let stub = Stub::new()?;
    let mut cmd = Command::new("dpkg");
    cmd.args(["-i", "--force-confold"]).arg(deb);
    let o = stub
        .apply(&mut cmd, running)?
        .output()
        .context("cannot run dpkg")?;
    stub.finish(
        o,
        &format!("dpkg -i over the installed package ({})", running.user),
    )
}

/// The RPM's post-install scriptlet as an upgrade runs it (`$1 = 2`), on this host with the .deb
/// installed (the same paths), while the service runs as `running` says.
pub fn rpm_post_upgrade(rpm: &Path, running: &Sandbox) -> Result<Upgrade> {
    let script = capture(
        Command::new("rpm")
            .args(["-qp", "--queryformat", "%{POSTIN}"])
            .arg(rpm),
    )?;
    let stub = Stub::new()?;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script, "sh", "2"]);
    let o = stub.apply(&mut cmd, running)?.output()?;
    stub.finish(
        o,
        &format!(
            "the RPM's post-install scriptlet, upgrading ({})",
            running.user
        ),
    )
}
