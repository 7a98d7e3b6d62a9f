//! The test stage of `cargo xtask test`: every test target built once, then the test binaries
//! run side by side (most of their time is spent waiting on a broker, a timer or a child
//! process, not on a core), each from its package's directory as `cargo test` runs it, its
//! output printed whole when it ends. The doctests follow.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One test binary: what `cargo test` would print for it, where it runs from.
struct TestBinary {
    /// `tests/rotation.rs (choria-provisioner)` and the like.
    name: String,
    executable: PathBuf,
    dir: PathBuf,
}

/// How many test binaries run at once: `TEST_JOBS`, else 3 (on two cores the suites are mostly
/// waiting; more than that starts to slow the ones that are not).
fn jobs() -> usize {
    std::env::var("TEST_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .filter(|j: &usize| *j > 0)
        .unwrap_or(3)
}

/// Builds the workspace's test targets with `cargo` and lists their binaries.
fn build(cargo: &str, root: &Path) -> Result<Vec<TestBinary>> {
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["test", "--workspace", "--no-run"])
        .args(["--message-format", "json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --workspace --no-run failed: {}", out.status);
    }
    let mut bins = Vec::new();
    for line in out.stdout.split(|b| *b == b'\n') {
        let Ok(msg) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let (Some(exe), Some(manifest)) =
            (msg["executable"].as_str(), msg["manifest_path"].as_str())
        else {
            continue;
        };
        let dir = Path::new(manifest)
            .parent()
            .context("a manifest path without a directory")?
            .to_path_buf();
        let src = msg["target"]["src_path"].as_str().unwrap_or_default();
        let src = Path::new(src).strip_prefix(&dir).unwrap_or(Path::new(src));
        let package = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        bins.push(TestBinary {
            name: format!("{} ({package})", src.display()),
            executable: exe.into(),
            dir,
        });
    }
    if bins.is_empty() {
        bail!("cargo test --no-run listed no test binaries");
    }
    // The longest suites start first: the binaries' end-to-end tests (real provisioners and
    // fleets), then the other integration tests, then the unit tests.
    let bin_dir = root.join("bin");
    bins.sort_by_key(|b| (!b.dir.starts_with(&bin_dir), !b.name.starts_with("tests/")));
    Ok(bins)
}

/// Builds every test target, runs the binaries [`jobs`] at a time with `NATS_SERVER_BIN` set to
/// `nats`, then the doctests. Fails naming every binary that failed.
pub fn run(cargo: &str, root: &Path, nats: &Path) -> Result<()> {
    let bins = build(cargo, root)?;
    let jobs = jobs().min(bins.len());
    eprintln!(
        "xtask: running {} test binaries, {jobs} at a time",
        bins.len()
    );
    let started = Instant::now();
    let queue = Mutex::new(bins.into_iter().collect::<VecDeque<_>>());
    let failed = Mutex::new(Vec::new());
    let took = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| loop {
                let Some(bin) = queue.lock().ok().and_then(|mut q| q.pop_front()) else {
                    return;
                };
                let t = Instant::now();
                let out = Command::new(&bin.executable)
                    .current_dir(&bin.dir)
                    .env("NATS_SERVER_BIN", nats)
                    .stdin(Stdio::null())
                    .output();
                let elapsed = t.elapsed();
                let ok = matches!(&out, Ok(o) if o.status.success());
                // One binary's whole output at once, as `cargo test` shows it.
                let mut text = format!("     Running {} ({:.1}s)\n", bin.name, secs(elapsed));
                match &out {
                    Ok(o) => {
                        text.push_str(&String::from_utf8_lossy(&o.stdout));
                        if !ok {
                            text.push_str(&String::from_utf8_lossy(&o.stderr));
                            text.push_str(&format!("{} exited with {}\n", bin.name, o.status));
                        }
                    }
                    Err(e) => text.push_str(&format!("cannot start {}: {e}\n", bin.name)),
                }
                print!("{text}");
                if let Ok(mut t) = took.lock() {
                    t.push((elapsed, bin.name.clone()));
                }
                if !ok {
                    if let Ok(mut f) = failed.lock() {
                        f.push(bin.name);
                    }
                }
            });
        }
    });
    let mut took = took.into_inner().unwrap_or_default();
    took.sort_by_key(|t| std::cmp::Reverse(t.0));
    let slowest: Vec<String> = took
        .iter()
        .take(5)
        .map(|(d, n)| format!("{n} {:.0}s", secs(*d)))
        .collect();
    eprintln!(
        "xtask: test binaries ran in {:.0}s; the slowest: {}",
        secs(started.elapsed()),
        slowest.join(", ")
    );
    let failed = failed.into_inner().unwrap_or_default();
    if !failed.is_empty() {
        bail!(
            "{} test binaries failed: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    crate::tools::run(
        Command::new(cargo)
            .current_dir(root)
            .args(["test", "--workspace", "--doc"])
            .env("NATS_SERVER_BIN", nats),
    )
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
