//! Runs real helper scripts from `testdata/` through the runner.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::input;
use helper_protocol::{HelperErrorKind, HelperRunner};

fn script(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name);
    p.to_string_lossy().into_owned()
}

#[tokio::test]
async fn helper_reply_is_decoded_from_stdout() {
    let r = HelperRunner::new(&script("echo_reply.sh")).unwrap();
    let reply = r.run(&input()).await.unwrap();
    assert_eq!(reply.configuration.unwrap()["identity"], "n1.example.net");
    assert_eq!(reply.msg, "ok");
}

#[tokio::test]
async fn command_is_split_shell_style() {
    let r = HelperRunner::new("sh -c 'printf \"{\\\"msg\\\":\\\"quoted\\\"}\"'").unwrap();
    assert_eq!(r.run(&input()).await.unwrap().msg, "quoted");
}

#[test]
fn unparsable_and_empty_commands_are_refused() {
    assert_eq!(
        HelperRunner::new("helper 'open").unwrap_err().kind(),
        HelperErrorKind::Parse
    );
    assert_eq!(
        HelperRunner::new("   ").unwrap_err().kind(),
        HelperErrorKind::Parse
    );
}

#[tokio::test]
async fn missing_program_fails_to_start() {
    let r = HelperRunner::new("/nonexistent/helper-program").unwrap();
    assert_eq!(
        r.run(&input()).await.unwrap_err().kind(),
        HelperErrorKind::Start
    );
}

#[tokio::test]
async fn timeout_kills_the_helper_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let cmd = format!("{} {}", script("sleeper.sh"), pidfile.display());
    let r = HelperRunner::new(&cmd)
        .unwrap()
        .with_timeout(Duration::from_millis(1500));
    let started = Instant::now();
    let err = r.run(&input()).await.unwrap_err();
    assert_eq!(err.kind(), HelperErrorKind::Timeout, "{err}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let pid = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .to_string();
    // The grandchild must be gone (a zombie is reaped by init quickly; allow a moment).
    let mut alive = true;
    for _ in 0..50 {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = st.rsplit(')').next().unwrap_or("").trim().chars().next();
        if st.is_empty() || state == Some('Z') {
            alive = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!alive, "child {pid} of the helper survived the timeout");
}

#[tokio::test]
async fn non_zero_exit_reports_the_stderr_tail() {
    let r = HelperRunner::new(&script("fail.sh")).unwrap();
    let err = r.run(&input()).await.unwrap_err();
    assert_eq!(err.kind(), HelperErrorKind::NonZeroExit);
    let msg = err.to_string();
    assert!(
        msg.contains("the real reason: no site for this node"),
        "{msg}"
    );
    assert!(!msg.contains("noise line 0\n"), "{msg}");
    assert!(msg.len() < 4096);
}

#[tokio::test]
async fn empty_output_is_an_error() {
    let r = HelperRunner::new(&script("empty.sh")).unwrap();
    assert_eq!(
        r.run(&input()).await.unwrap_err().kind(),
        HelperErrorKind::EmptyOutput
    );
}

#[tokio::test]
async fn garbage_output_names_the_helper() {
    let r = HelperRunner::new(&script("garbage.sh")).unwrap();
    let err = r.run(&input()).await.unwrap_err();
    assert_eq!(err.kind(), HelperErrorKind::InvalidJson);
    assert!(err.to_string().contains("garbage.sh"));
}

#[tokio::test]
async fn oversize_output_is_cut_off() {
    let r = HelperRunner::new(&script("huge.sh"))
        .unwrap()
        .with_max_output(64 * 1024);
    let started = Instant::now();
    let err = r.run(&input()).await.unwrap_err();
    assert_eq!(err.kind(), HelperErrorKind::OutputTooLarge, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "stopped by the size limit, not the timeout"
    );
}
