//! The default identity under the packaged unit: `ProcSubset=pid` hides `/proc/sys`, and
//! systemd sets no `HOSTNAME`, so a name read from either was `localhost` on every replica.
//! Here the binary runs in a mount namespace whose `/proc` is mounted `subset=pid`, without
//! `HOSTNAME`, with no `identity` configured: `check` and the daemon must both say the host's
//! real name (what `hostname -f` says), which the caller id, the election candidate and the
//! active-active replica id are made from.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_choria-provisioner");

/// `sh -c SCRIPT` in a new mount namespace whose `/proc` shows processes only; `None` where
/// namespaces or the mount are not allowed (not root).
fn under_subset_pid(script: &str) -> Option<Command> {
    let probe = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--fork", "--"])
        .args([
            "sh",
            "-c",
            "mount -t proc -o subset=pid proc /proc && test ! -e /proc/sys",
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !probe {
        test_support::skip_unless_ci("cannot mount /proc with subset=pid here (not root?)");
        return None;
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--fork", "--"])
        .args([
            "sh",
            "-c",
            &format!("mount -t proc -o subset=pid proc /proc && exec {script}"),
        ])
        .env_remove("HOSTNAME");
    Some(cmd)
}

fn expected_name() -> String {
    let out = Command::new("hostname").arg("-f").output().unwrap();
    let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !name.is_empty() && name != "localhost",
        "this host has no name"
    );
    name
}

fn files(dir: &std::path::Path, broker: &str) -> (String, String) {
    let helper = dir.join("helper.sh");
    test_support::write_executable(&helper, "#!/bin/sh\necho '{}'\n").unwrap();
    let (yaml, cfg) = test_support::write_config(
        dir,
        &format!(
            "helper: {}\nchoria_insecure: true\nloglevel: info\nlogfile: {}/prov.log\n",
            helper.display(),
            dir.display()
        ),
        // No identity: the default is what is tested.
        &format!("plugin.choria.middleware_hosts = {broker}\n"),
    )
    .unwrap();
    (yaml.display().to_string(), cfg.display().to_string())
}

#[test]
fn without_proc_sys_or_hostname_check_and_the_daemon_use_the_real_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let nats = test_support::NatsServer::start();
    let (yaml, cfg) = files(dir.path(), &nats.url());
    let want = expected_name();

    let Some(mut check) = under_subset_pid(&format!(
        "{BIN} check --config {yaml} --choria-config {cfg}"
    )) else {
        return;
    };
    let out = check.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.trim() == format!("identity: {want}")),
        "{text}"
    );
    assert!(!text.contains("identity is \"localhost\""), "{text}");

    let Some(mut run) =
        under_subset_pid(&format!("{BIN} run --config {yaml} --choria-config {cfg}"))
    else {
        return;
    };
    let mut child = run
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = dir.path().join("prov.log");
    let started = Instant::now();
    let mut seen = String::new();
    while started.elapsed() < Duration::from_secs(20) {
        seen = std::fs::read_to_string(&log).unwrap_or_default();
        if seen.contains("connected to the broker as") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // unshare waits for the daemon, its child, and leaves signals to it.
    let _ = Command::new("pkill")
        .args(["-TERM", "-P", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let line = seen
        .lines()
        .find(|l| l.contains("connected to the broker as"))
        .unwrap_or_else(|| panic!("the daemon never connected:\n{seen}"));
    assert!(
        line.contains(&format!(
            "connected to the broker as {want} (caller choria={want}"
        )) || line.contains(&format!("connected to the broker as {want} (caller")),
        "{line}"
    );
    assert!(!line.contains("as localhost"), "{line}");
}
