//! The audit trail under attack and on a full disk, through the library's own writer: a flood
//! of cycles that never reached a node costs a few summary lines, and a file system that fills
//! up never leaves part of a line, counts what it lost, and takes records again once there is
//! room.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use provision_core::events::{NodeEvent, NodeState, Verdict};
use provision_core::{Issued, Observer as _, Source};
use provisioner::audit::{channel, AuditFile};
use provisioner_metrics::Metrics;
use tokio_util::sync::CancellationToken;

fn verdict(answered: bool) -> Verdict {
    Verdict {
        state: if answered {
            NodeState::Provisioned
        } else {
            NodeState::Failed
        },
        step: if answered {
            "done"
        } else {
            "choria_provision#jwt"
        },
        cause: if answered {
            String::new()
        } else {
            "did not answer its first request".into()
        },
        source: if answered {
            Source::Discovery
        } else {
            Source::Event
        },
        helper_msg: String::new(),
        issued: Issued::default(),
        upgrade: None,
        elapsed: Duration::from_millis(3),
        answered,
    }
}

/// An audit channel of `p1.example.net` writing to the file `path`, its writer running until
/// the token is cancelled.
fn file_writer(
    path: &Path,
    metrics: &Arc<Metrics>,
) -> (
    provisioner::audit::Audit,
    CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let (audit, writer) = channel(
        "p1.example.net",
        "lab",
        Arc::clone(metrics),
        Some(AuditFile::open(path).unwrap()),
        None,
    );
    let stop = CancellationToken::new();
    let run = tokio::spawn(writer.unwrap().run(stop.clone()));
    (audit, stop, run)
}

/// `count` nodes named `PREFIX-N.example.net` finished with `verdict`.
fn finish(audit: &provisioner::audit::Audit, prefix: &str, count: usize, verdict: &Verdict) {
    for n in 0..count {
        audit.node_event(
            &format!("{prefix}-{n}.example.net"),
            &NodeEvent::Finished(verdict),
        );
    }
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "a partial last line"
    );
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_nodes_that_never_answered_costs_a_few_summary_lines() {
    // The packaged unit's umask: the file is still created 0640.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let metrics = Metrics::new("lab");
    let (audit, stop, run) = file_writer(&path, &metrics);
    let forged = verdict(false);
    finish(&audit, "forged", 100_000, &forged);
    let real = verdict(true);
    finish(&audit, "real", 10, &real);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    run.await.unwrap();

    let meta = std::fs::metadata(&path).unwrap();
    let size = meta.len();
    assert!(size < 1_000_000, "{size} bytes");
    // Readable by the service's group, not by everyone (docs/configuration.md, audit_file).
    use std::os::unix::fs::MetadataExt as _;
    assert_eq!(meta.mode() & 0o777, 0o640);
    assert_eq!(meta.gid(), rustix::process::getegid().as_raw());
    let records = lines(&path);
    let real: Vec<_> = records
        .iter()
        .filter(|r| r["decision"] == "provisioned")
        .collect();
    assert_eq!(real.len(), 10);
    let summaries: Vec<_> = records
        .iter()
        .filter(|r| r["decision"] == "undecided")
        .collect();
    assert_eq!(summaries.len(), 1, "{records:?}");
    assert_eq!(summaries[0]["count"], 100_000);
    assert_eq!(summaries[0]["found_by"], "event");
    // The first ten names as examples, no more.
    let examples = summaries[0]["examples"].as_array().unwrap();
    assert_eq!(examples.len(), provisioner::audit::SUMMARY_EXAMPLES);
    assert!(examples
        .iter()
        .all(|e| e.as_str().is_some_and(|e| e.starts_with("forged-"))));
    assert_eq!(
        summaries[0].to_string().matches("forged-").count(),
        provisioner::audit::SUMMARY_EXAMPLES
    );
    assert_eq!(metrics.audit_dropped.get(), 0);
}

/// A small tmpfs, mounted for the test (root, as CI runs); `None` where that is not allowed.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            test_support::skip_unless_ci("cannot mount a tmpfs for the full-disk test (not root?)");
            return None;
        }
        Some(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_loses_whole_batches_counted_never_part_of_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_tmpfs) = Tmpfs::mount(dir.path(), "64k") else {
        return;
    };
    let path = dir.path().join("audit.jsonl");
    // Most of the space taken by something else.
    let filler = dir.path().join("filler");
    std::fs::write(&filler, vec![b'x'; 40 * 1024]).unwrap();
    let metrics = Metrics::new("lab");
    let (audit, stop, run) = file_writer(&path, &metrics);
    let real = verdict(true);
    for round in 0..40 {
        for n in 0..20 {
            audit.node_event(
                &format!("n{round}-{n}.example.net"),
                &NodeEvent::Finished(&real),
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        metrics.audit_write_errors.get() > 0,
        "the disk never filled: {} bytes written",
        std::fs::metadata(&path).unwrap().len()
    );
    let before = lines(&path).len();
    assert!(before > 0);

    // Room again: records are taken again, after whole lines.
    std::fs::remove_file(&filler).unwrap();
    finish(&audit, "after", 5, &real);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    run.await.unwrap();
    let after = lines(&path);
    assert!(
        after
            .iter()
            .filter(|r| r["identity"]
                .as_str()
                .is_some_and(|i| i.starts_with("after-")))
            .count()
            == 5,
        "{} lines",
        after.len()
    );
}
