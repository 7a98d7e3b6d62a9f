//! The default `workers` follows the CPU quota of the process's cgroup (systemd's `CPUQuota=`,
//! a container's `--cpus`), not the host's CPU count: `check` is run inside a cgroup limited to
//! one CPU and must plan one worker. Needs root and a writable cgroup file system (v1 `cpu`
//! controller or v2 `cpu.max`); elsewhere the test says so and passes, except under CI.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A cgroup limited to one CPU, removed on drop.
struct OneCpu(PathBuf);

impl OneCpu {
    fn create() -> Option<Self> {
        let name = format!("choria-provisioner-test-{}", std::process::id());
        // cgroup v2: cpu.max in a child of the root (the cpu controller must be enabled there).
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        if v2.is_file() {
            let dir = Path::new("/sys/fs/cgroup").join(&name);
            std::fs::create_dir(&dir).ok()?;
            let made = OneCpu(dir.clone());
            std::fs::write(dir.join("cpu.max"), "100000 100000").ok()?;
            return Some(made);
        }
        let dir = Path::new("/sys/fs/cgroup/cpu").join(&name);
        std::fs::create_dir(&dir).ok()?;
        let made = OneCpu(dir.clone());
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").ok()?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), "100000").ok()?;
        Some(made)
    }

    fn procs(&self) -> PathBuf {
        let v2 = self.0.join("cgroup.procs");
        if v2.exists() {
            v2
        } else {
            self.0.join("tasks")
        }
    }
}

impl Drop for OneCpu {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn the_default_workers_follow_the_cgroup_cpu_quota() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    let group = OneCpu::create();
    let Some(group) = group.filter(|_| cpus > 1) else {
        assert!(
            std::env::var_os("CI").is_none() || cpus == 1,
            "cannot create a CPU-limited cgroup here: the quota test must run under CI (as root)"
        );
        eprintln!("skipped: no writable cgroup with a CPU quota here, or one CPU only");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = test_support::write_config(
        dir.path(),
        &format!(
            "helper: {}\ntoken: x\nchoria_insecure: true\n",
            example_helper("helper-plain.py")
        ),
        "identity = p1.example.net\nplugin.choria.middleware_hosts = nats://b.example.net:4222\n",
    )
    .unwrap();
    let check = |limited: bool| -> String {
        // A shell moves itself into the group, then runs check there.
        let script = if limited {
            format!("echo $$ > {} && exec \"$@\"", group.procs().display())
        } else {
            "exec \"$@\"".to_string()
        };
        let out = Ran::of(
            Command::new("sh")
                .args(["-c", &script, "sh", BIN, "check", "--config"])
                .arg(&yaml)
                .arg("--choria-config")
                .arg(&cfg),
        )
        .succeeded("check")
        .stdout;
        out.lines()
            .find(|l| l.trim_start().starts_with("workers: "))
            .unwrap_or_else(|| panic!("{out}"))
            .trim()
            .to_string()
    };
    assert!(check(false).starts_with(&format!("workers: {cpus} ")));
    assert!(check(true).starts_with("workers: 1 "), "{}", check(true));
}
