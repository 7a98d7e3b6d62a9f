//! The installed unit's credentials and file system view, applied to a command without systemd:
//! what the install test runs `check`, the helper and `run` under when systemd is not PID 1.
//!
//! Read from the installed unit and any drop-ins given: `User=`, `Group=`, `Environment=`,
//! `UMask=`, the writable paths (`ReadWritePaths=` and the `*Directory=` entries, which are made
//! and handed to the user as systemd does at start). Applied: a private mount namespace where `/`
//! is read-only but for those paths, `/tmp` and `/var/tmp` private, `/home` and `/root` hidden,
//! `/proc` showing only the user's own processes and nothing but processes
//! (`ProtectProc=invisible`, `ProcSubset=pid`), then the user and group with their supplementary
//! groups, an empty capability bounding set, no new privileges and the environment systemd gives
//! a service. Not applied (systemd alone does these): the system call filter,
//! `MemoryDenyWriteExecute=`, `PrivateUsers=`, `PrivateDevices=`, the IP allow list and the
//! limits.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{bail, Context, Result};
use crate::host::{capture, combined, run, which};
use crate::unit_security::{last, service_directives};
use crate::{GO_LOG, UNIT};

/// What the unit (with its drop-ins) gives the service.
#[derive(Clone, Debug)]
pub struct Sandbox {
    pub user: String,
    pub group: String,
    /// Paths the service may write.
    pub writable: Vec<PathBuf>,
    /// `*Directory=` entries with their mode: made and handed to the user before a start.
    pub directories: Vec<(PathBuf, u32)>,
    pub env: Vec<(String, String)>,
    pub umask: String,
}

/// The `[passwd]` entry of `user`: uid, gid, home.
pub fn account(user: &str) -> Result<(u32, u32, String)> {
    let line = capture(Command::new("getent").args(["passwd", user]))
        .with_context(|| format!("no account {user}"))?;
    let f: Vec<&str> = line.trim().split(':').collect();
    match (f.get(2), f.get(3), f.get(5)) {
        (Some(uid), Some(gid), Some(home)) => Ok((
            uid.parse().context("getent passwd printed no uid")?,
            gid.parse().context("getent passwd printed no gid")?,
            home.to_string(),
        )),
        _ => bail!("getent passwd {user}: {line:?}"),
    }
}

/// The gid of `group`.
pub fn group_id(group: &str) -> Result<u32> {
    let line = capture(Command::new("getent").args(["group", group]))
        .with_context(|| format!("no group {group}"))?;
    line.trim()
        .split(':')
        .nth(2)
        .context("getent group printed no gid")?
        .parse()
        .context("getent group printed no number")
}

impl Sandbox {
    /// The installed unit with `dropins` (the text of each, in order, as files in
    /// `choria-provisioner.service.d/` would be read).
    pub fn of_unit(dropins: &[&str]) -> Result<Sandbox> {
        let mut text = fs::read_to_string(UNIT).with_context(|| format!("cannot read {UNIT}"))?;
        for d in dropins {
            text.push('\n');
            text.push_str(d);
        }
        let d = service_directives(&text);
        // A key set again with an empty value starts over, as systemd reads lists.
        let list = |k: &str| -> Vec<String> {
            let mut out = Vec::new();
            for (key, v) in &d {
                if key == k {
                    if v.is_empty() {
                        out.clear();
                    } else {
                        out.extend(v.split_whitespace().map(str::to_string));
                    }
                }
            }
            out
        };
        let user = match last(&d, "User") {
            "" => "root".to_string(),
            u => u.to_string(),
        };
        let group = match last(&d, "Group") {
            "" => {
                let (_, gid, _) = account(&user)?;
                capture(Command::new("getent").args(["group", &gid.to_string()]))?
                    .split(':')
                    .next()
                    .unwrap_or("root")
                    .to_string()
            }
            g => g.to_string(),
        };
        let caps = list("CapabilityBoundingSet");
        if !caps.is_empty() || !list("AmbientCapabilities").is_empty() {
            bail!("{UNIT} must drop every capability (CapabilityBoundingSet= empty), has {caps:?}");
        }
        for (k, v) in [
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("PrivateDevices", "yes"),
            ("PrivateUsers", "yes"),
        ] {
            if last(&d, k) != v {
                bail!("{UNIT}: {k}={} (expected {v})", last(&d, k));
            }
        }
        let mut writable: Vec<PathBuf> = list("ReadWritePaths")
            .iter()
            .map(|p| PathBuf::from(p.trim_start_matches('-')))
            .collect();
        let mut directories = Vec::new();
        for (k, base, default_mode) in [
            ("LogsDirectory", "/var/log", 0o755),
            ("StateDirectory", "/var/lib", 0o755),
            ("RuntimeDirectory", "/run", 0o755),
        ] {
            let mode = match last(&d, &format!("{k}Mode")) {
                "" => default_mode,
                m => u32::from_str_radix(m, 8).with_context(|| format!("{k}Mode={m}"))?,
            };
            for p in list(k) {
                let path = Path::new(base).join(p);
                writable.push(path.clone());
                directories.push((path, mode));
            }
        }
        if !writable.iter().any(|p| p == Path::new(GO_LOG)) {
            bail!("{UNIT} does not let the service write {GO_LOG} (ReadWritePaths=)");
        }
        let mut env = Vec::new();
        for (k, v) in &d {
            if k == "Environment" {
                for kv in v.split_whitespace() {
                    if let Some((a, b)) = kv.split_once('=') {
                        env.push((a.to_string(), b.to_string()));
                    }
                }
            }
        }
        let umask = match last(&d, "UMask") {
            "" => "0022".to_string(),
            u => u.to_string(),
        };
        Ok(Sandbox {
            user,
            group,
            writable,
            directories,
            env,
            umask,
        })
    }

    /// `check --config YAML --choria-config CFG` of `bin` as the unit runs it: whether it
    /// passed, and its output.
    pub fn check(&self, bin: &Path, yaml: &Path, cfg: &Path) -> Result<(bool, String)> {
        let (y, c) = (yaml.to_string_lossy(), cfg.to_string_lossy());
        let o = self
            .command(bin, &["check", "--config", &y, "--choria-config", &c])?
            .output()?;
        Ok((o.status.success(), combined(&o)))
    }

    /// One line saying what the service runs as and may write.
    pub fn describe(&self) -> String {
        format!(
            "user {} group {}, no capabilities, no new privileges, UMask {}, writable: {}{}",
            self.user,
            self.group,
            self.umask,
            self.writable
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            if self.env.is_empty() {
                String::new()
            } else {
                format!(
                    ", environment: {}",
                    self.env
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            }
        )
    }

    /// What systemd does with the `*Directory=` entries before a start: each is made when
    /// missing, and when its owner is not the unit's user and group it is handed over with
    /// everything in it.
    pub fn prepare_directories(&self) -> Result<()> {
        let owner = format!("{}:{}", self.user, self.group);
        for (dir, mode) in &self.directories {
            if !dir.exists() {
                run(Command::new("install")
                    .arg("-d")
                    .arg("-m")
                    .arg(format!("{mode:o}"))
                    .arg("-o")
                    .arg(&self.user)
                    .arg("-g")
                    .arg(&self.group)
                    .arg(dir))?;
                continue;
            }
            let now = capture(Command::new("stat").args(["-c", "%U:%G"]).arg(dir))?;
            if now.trim() != owner {
                run(Command::new("chown").arg("-R").arg(&owner).arg(dir))?;
            }
        }
        Ok(())
    }

    /// `program args` as the unit runs the service (see the module comment), from its working
    /// directory. The caller adds more environment with `.env()`.
    pub fn command(&self, program: &Path, args: &[&str]) -> Result<Command> {
        self.prepare_directories()?;
        let (uid, _, home) = account(&self.user)?;
        let gid = group_id(&self.group)?;
        let setpriv = which("setpriv")?;
        let unshare = which("unshare")?;
        let mut script = String::from("set -e\nmount --make-rprivate /\n");
        for p in &self.writable {
            if p.exists() {
                let q = shell_quote(&p.to_string_lossy());
                script.push_str(&format!("mount --bind {q} {q}\n"));
            }
        }
        script.push_str("mount -o remount,bind,ro /\n");
        // PrivateTmp=yes: a /tmp and /var/tmp of the service's own.
        script.push_str("mount -t tmpfs tmpfs /tmp\nmount -t tmpfs tmpfs /var/tmp\n");
        // ProtectHome=yes: the home directories are out of reach.
        for d in ["/home", "/root", "/run/user"] {
            if Path::new(d).is_dir() {
                script.push_str(&format!("mount -t tmpfs -o ro,mode=0 tmpfs {d}\n"));
            }
        }
        // ProtectProc=invisible and ProcSubset=pid, where the kernel has them (5.8 and newer).
        script.push_str(
            "mount -t proc -o hidepid=invisible,subset=pid proc /proc 2>/dev/null || \
             echo 'sandbox: this kernel cannot mount /proc with subset=pid' >&2\n",
        );
        script.push_str(&format!(
            "umask {}\ncd /var/lib/choria-provisioner\nexec \"$@\"\n",
            self.umask
        ));
        let mut cmd = Command::new(unshare);
        cmd.args(["--mount", "--", "sh", "-c", &script, "sh"])
            .arg(setpriv)
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={gid}"),
                "--init-groups",
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
            .env("USER", &self.user)
            .env("LOGNAME", &self.user)
            .env("HOME", home)
            .env("SHELL", "/usr/sbin/nologin");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        Ok(cmd)
    }
}

/// `s` quoted for the shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
