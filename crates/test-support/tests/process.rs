//! The process guard stops what it started: a group leader takes its children with it.
#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::Duration;

use test_support::process::alive;
use test_support::{wait_until, ProcessGuard};

#[test]
fn dropping_a_group_guard_stops_the_whole_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let script = format!("sleep 60 & echo $! > {}; wait", pidfile.display());
    let guard = ProcessGuard::spawn_group("sh", Command::new("sh").args(["-c", &script])).unwrap();
    let leader = guard.pid();
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || { std::fs::read_to_string(&pidfile).is_ok_and(|t| t.ends_with('\n')) }
    ));
    let child: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(child));
    drop(guard);
    assert!(!alive(leader));
    assert!(wait_until(
        Duration::from_secs(5),
        Duration::from_millis(20),
        || !alive(child)
    ));
}

#[test]
fn terminate_reports_how_the_process_ended() {
    let mut guard = ProcessGuard::spawn("sleep", Command::new("sleep").arg("60")).unwrap();
    assert!(guard.running());
    let st = guard.terminate(Duration::from_secs(5)).unwrap();
    assert!(!st.success());
    assert!(!guard.running());
    let mut quick = ProcessGuard::spawn("true", &mut Command::new("true")).unwrap();
    assert!(quick
        .wait_exit(Duration::from_secs(5))
        .is_some_and(|s| s.success()));
}
