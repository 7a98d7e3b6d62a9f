//! [`ProcessGuard`]: a child process that is stopped when its guard drops, so an error or a
//! failed assertion leaves nothing running; and a process's descriptor limits, read and set.

use std::io::Write as _;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{Error, IoContext, Result};

/// A running child process, stopped on drop: SIGTERM, then SIGKILL after the drop grace (3 s
/// unless [`ProcessGuard::drop_grace`] says otherwise; zero kills at once). Started with
/// [`ProcessGuard::spawn_group`] it leads a process group of its own and every signal goes to
/// the whole group (its helpers and other children included).
#[derive(Debug)]
pub struct ProcessGuard {
    name: String,
    /// The process.
    pub child: Child,
    group: bool,
    grace: Duration,
    detached: bool,
}

impl ProcessGuard {
    /// Spawn `cmd` in this process's group (a terminal's Ctrl-C reaches it too), naming it for
    /// messages.
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> Result<Self> {
        Self::start(name.into(), cmd, false)
    }

    /// Spawn `cmd` as the leader of a new process group; signals reach the whole group.
    pub fn spawn_group(name: impl Into<String>, cmd: &mut Command) -> Result<Self> {
        cmd.process_group(0);
        Self::start(name.into(), cmd, true)
    }

    fn start(name: String, cmd: &mut Command, group: bool) -> Result<Self> {
        let child = cmd
            .spawn()
            .ctx(|| format!("cannot start {name}: {cmd:?}"))?;
        Ok(ProcessGuard {
            name,
            child,
            group,
            grace: Duration::from_secs(3),
            detached: false,
        })
    }

    /// How long a drop waits after SIGTERM before SIGKILL (zero: SIGKILL at once).
    pub fn drop_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// Copy its standard error (piped, taken here) line by line into `log` when given, and wait
    /// up to `timeout` until a line holds `ready` or it exits: false when neither happened in
    /// time ([`ProcessGuard::exited`] tells an exit from the line).
    pub fn wait_stderr_line(
        &mut self,
        ready: &str,
        log: Option<std::fs::File>,
        timeout: Duration,
    ) -> Result<bool> {
        use std::io::{BufRead, BufReader, Write};
        let stderr = self
            .child
            .stderr
            .take()
            .ok_or_else(|| Error::Failed(format!("{} has no stderr", self.name)))?;
        let ready = ready.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut log = log;
            let mut sent = false;
            for line in BufReader::new(stderr)
                .lines()
                .map_while(std::io::Result::ok)
            {
                if let Some(f) = log.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                if !sent && line.contains(&ready) {
                    let _ = tx.send(());
                    sent = true;
                }
            }
        });
        Ok(crate::wait_until(
            timeout,
            Duration::from_millis(20),
            || rx.try_recv().is_ok() || !self.running(),
        ))
    }

    /// Its name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, when it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Send a signal by name (`TERM`, `INT`, `KILL`, `STOP`...) to the process, or to its group
    /// when it leads one; whether `kill` accepted it.
    pub fn signal(&self, sig: &str) -> bool {
        signal(self.pid(), self.group, sig)
    }

    /// Wait up to `timeout` for it to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Ask it to stop with SIGTERM and wait up to `grace` before killing it.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if let Some(st) = self.exited() {
            return Some(st);
        }
        if !grace.is_zero() {
            self.signal("TERM");
            if let Some(st) = self.wait_exit(grace) {
                return Some(st);
            }
            eprintln!("{} did not stop within {grace:?}, killing it", self.name);
        }
        self.kill()
    }

    /// Kill it (and its group) now and reap it.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if self.group {
            self.signal("KILL");
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// Leave the process running after the guard is gone; returns its pid.
    pub fn detach(mut self) -> u32 {
        self.detached = true;
        self.pid()
    }
}

impl Drop for ProcessGuard {
    fn drop(&mut self) {
        if !self.detached {
            let grace = self.grace;
            self.terminate(grace);
        }
    }
}

/// Send `sig` to `pid`, or to the process group it leads when `group`; whether `kill` accepted.
pub fn signal(pid: u32, group: bool, sig: &str) -> bool {
    let target = if group {
        format!("-{pid}")
    } else {
        pid.to_string()
    };
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .arg(target)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether a process is alive: it has a /proc entry that is not a zombie.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The descriptor limits of process `pid`: (soft, hard).
pub fn nofile(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let w: Vec<&str> = line.split_whitespace().collect();
    let n = |s: &str| s.parse().unwrap_or(u64::MAX);
    Some((n(w.get(3)?), n(w.get(4)?)))
}

/// Sets process `pid`'s descriptor limits with prlimit (util-linux).
pub fn set_nofile(pid: u32, soft: u64, hard: u64) -> Result<()> {
    let st = Command::new("prlimit")
        .arg("--pid")
        .arg(pid.to_string())
        .arg(format!("--nofile={soft}:{hard}"))
        .status()
        .ctx(|| "cannot run prlimit (util-linux)".to_string())?;
    if !st.success() {
        return Err(Error::Failed(format!(
            "prlimit --pid {pid} --nofile={soft}:{hard}: {st}"
        )));
    }
    Ok(())
}

/// Runs `cmd` to its end with `input` on its standard input and its standard output captured
/// (standard error as `cmd` sets it): a helper program asked once.
pub fn run_with_input(cmd: &mut Command, input: &[u8]) -> Result<Output> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .ctx(|| format!("starting {:?}", cmd.get_program()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(input)
            .ctx(|| format!("writing the input of {:?}", cmd.get_program()))?;
    }
    child
        .wait_with_output()
        .ctx(|| format!("waiting for {:?}", cmd.get_program()))
}
