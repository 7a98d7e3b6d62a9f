//! The audit trail: one JSON line per decision (provisioned, upgraded, shut down, lock held,
//! deferred, refused, failed) appended to `audit_file` and, with `audit_stream`, published to a
//! JetStream stream so that every replica writes into one record.
//!
//! The workers never wait for the disk or the broker: a decision is queued (at most
//! [`QUEUE`] records; beyond that a record is dropped, counted in
//! `choria_provisioner_audit_dropped` and logged at most once a minute) and one writer task
//! appends, `fsync`s each batch, and publishes. The stream is opened by the writer and, while it
//! cannot be opened or a record cannot be stored, tried again with a backoff of up to
//! [`RETRY_MAX`]; meanwhile the file is written as usual and the records wait for the stream
//! (at most [`BACKLOG`]; beyond that the oldest is dropped, counted and logged). Failed
//! attempts are counted in `choria_provisioner_audit_stream_errors`. A record holds the
//! identity, the decision, the step and cause, the helper's message, and what the node was
//! given by serial, fingerprint or token id: never a certificate, key, token or JWT.
//!
//! A cycle that ended without the node ever answering (nothing serves the name, it never
//! replied, it waited too long in the queue) decided nothing about a node that may not exist,
//! and anyone with a provisioning JWT can announce such nodes by the hundred thousand: those are
//! counted per state, step and source and written as one summary record per kind every
//! [`SUMMARY_EVERY`], so a flood costs a bounded number of lines. A batch the file cannot take
//! (a full disk) is cut back to the last whole line, counted in
//! `choria_provisioner_audit_write_errors` and logged at most once a minute.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::audit_stream::AuditStream;
use crate::Error;
use choria_rpc_client::rpc::RpcClient;
use provision_core::{NodeEvent, Observer, Verdict};
use provisioner_metrics::Metrics;
use provisioner_status::nodes::issued_json;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Records waiting for the writer at most.
pub const QUEUE: usize = 16_384;
/// Records waiting for the stream (while it cannot be reached) at most.
pub const BACKLOG: usize = 16_384;
/// The first wait before the stream is tried again.
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// The longest wait before the stream is tried again.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Records written (and `fsync`ed) together at most.
const BATCH: usize = 512;
/// At most one log line per this interval about dropped or unwritten records.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// How often the cycles that reached no decision are written as one summary record per kind.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(60);

/// How many names of silent nodes each summary record carries as examples.
pub const SUMMARY_EXAMPLES: usize = 10;

/// Cycles that reached no decision, by (state, step, source), since the last summary: their
/// count and the first few names.
type Undecided = Mutex<
    std::collections::BTreeMap<(&'static str, &'static str, &'static str), (u64, Vec<String>)>,
>;

/// One record waiting to be written: the node and its JSON line (with its newline).
struct Line {
    identity: String,
    json: Vec<u8>,
}

/// The observer side: turns each finished cycle into a record for the writer.
pub struct Audit {
    tx: Option<mpsc::Sender<Line>>,
    provisioner: String,
    site: String,
    metrics: Arc<Metrics>,
    last_drop_log: Mutex<Option<Instant>>,
    undecided: Arc<Undecided>,
}

/// The writer side, run by [`Writer::run`].
pub struct Writer {
    rx: mpsc::Receiver<Line>,
    file: Option<AuditFile>,
    stream: Option<StreamSink>,
    metrics: Arc<Metrics>,
    last_error: Option<Instant>,
    undecided: Arc<Undecided>,
    provisioner: String,
    site: String,
}

/// Where the stream is opened from: its name and the provisioner's connection.
pub struct StreamTarget {
    /// `audit_stream`.
    pub name: String,
    /// The connection it is reached over.
    pub client: RpcClient,
    /// What a stream created here keeps.
    pub limits: crate::audit_stream::StreamLimits,
}

/// The audit trail as configured: `Audit` for the observer, `Writer` when a destination is set.
pub fn channel(
    provisioner: &str,
    site: &str,
    metrics: Arc<Metrics>,
    file: Option<AuditFile>,
    stream: Option<StreamTarget>,
) -> (Audit, Option<Writer>) {
    channel_sized(provisioner, site, metrics, file, stream, QUEUE)
}

fn channel_sized(
    provisioner: &str,
    site: &str,
    metrics: Arc<Metrics>,
    file: Option<AuditFile>,
    stream: Option<StreamTarget>,
    queue: usize,
) -> (Audit, Option<Writer>) {
    let on = file.is_some() || stream.is_some();
    let (tx, rx) = mpsc::channel(queue);
    let undecided = Arc::new(Undecided::default());
    let audit = Audit {
        tx: on.then_some(tx),
        provisioner: provisioner.to_string(),
        site: site.to_string(),
        metrics: Arc::clone(&metrics),
        last_drop_log: Mutex::new(None),
        undecided: Arc::clone(&undecided),
    };
    let stream = stream.map(|t| StreamSink {
        target: t,
        open: None,
        backlog: Backlog::new(BACKLOG),
        retry_at: Instant::now(),
        delay: RETRY_MIN,
        last_overflow_log: None,
    });
    (
        audit,
        on.then_some(Writer {
            rx,
            file,
            stream,
            metrics,
            last_error: None,
            undecided,
            provisioner: provisioner.to_string(),
            site: site.to_string(),
        }),
    )
}

/// The JSON record of `verdict` for `identity`, decided at `now` by `provisioner` of `site`.
pub fn record(
    provisioner: &str,
    site: &str,
    identity: &str,
    v: &Verdict,
    now: chrono::DateTime<chrono::Utc>,
) -> serde_json::Value {
    let mut r = json!({
        "time": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "provisioner": provisioner,
        "site": site,
        "identity": identity,
        "decision": v.state.label(),
        "step": v.step,
        "cause": v.cause,
        "found_by": v.source.name(),
        "helper_msg": v.helper_msg,
        "elapsed_ms": u64::try_from(v.elapsed.as_millis()).unwrap_or(u64::MAX),
    });
    if let (Some(obj), serde_json::Value::Object(issued)) =
        (r.as_object_mut(), issued_json(&v.issued))
    {
        obj.extend(issued);
    }
    if let (Some(obj), Some((from, to))) = (r.as_object_mut(), &v.upgrade) {
        obj.insert("upgrade".into(), json!({"from": from, "to": to}));
    }
    r
}

impl Observer for Audit {
    fn node_event(&self, identity: &str, event: &NodeEvent<'_>) {
        let Some(tx) = &self.tx else {
            return;
        };
        let v = match event {
            NodeEvent::Finished(v) => *v,
            // An operator's approval applied: the decision that let the node go on.
            NodeEvent::Step {
                step: "approval",
                ok: true,
                detail,
                ..
            } => {
                let r = json!({
                    "time": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    "provisioner": self.provisioner,
                    "site": self.site,
                    "identity": identity,
                    "decision": "approved",
                    "step": "approval",
                    "cause": detail,
                });
                self.send(tx, identity, r);
                return;
            }
            _ => return,
        };
        if !v.answered {
            // Summed up by the writer: a flood of announced names costs a few lines.
            let mut u = self.undecided.lock().unwrap_or_else(|e| e.into_inner());
            let (n, names) = u
                .entry((v.state.label(), v.step, v.source.name()))
                .or_default();
            *n = n.saturating_add(1);
            if names.len() < SUMMARY_EXAMPLES {
                names.push(identity.to_string());
            }
            return;
        }
        let r = record(
            &self.provisioner,
            &self.site,
            identity,
            v,
            chrono::Utc::now(),
        );
        self.send(tx, identity, r);
    }
}

impl Audit {
    fn send(&self, tx: &mpsc::Sender<Line>, identity: &str, r: serde_json::Value) {
        let mut json = r.to_string().into_bytes();
        json.push(b'\n');
        if tx
            .try_send(Line {
                identity: identity.to_string(),
                json,
            })
            .is_err()
        {
            self.metrics.audit_dropped.inc();
            let n = self.metrics.audit_dropped.get();
            let mut last = self.last_drop_log.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                *last = Some(Instant::now());
                error!(
                    "audit: the writer is {} records behind, {n} record(s) dropped so far",
                    tx.max_capacity()
                );
            }
        }
    }
}

/// `audit_file`, opened for appending; reopened when logrotate has moved it.
pub struct AuditFile {
    path: PathBuf,
    file: Arc<std::fs::File>,
    inode: u64,
}

impl AuditFile {
    /// Opens `path` for appending, creating it mode 0640 whatever the umask (the packaged
    /// unit's is 0077), so the service's group can read it; an existing file keeps its mode.
    pub fn open(path: &Path) -> Result<AuditFile, Error> {
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
        let fail = |e| Error::file("open", "audit_file", path, e);
        let file = match std::fs::OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o640)
            .open(path)
        {
            Ok(created) => {
                created
                    .set_permissions(std::fs::Permissions::from_mode(0o640))
                    .map_err(fail)?;
                created
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(fail)?,
            Err(e) => return Err(fail(e)),
        };
        let inode = file
            .metadata()
            .map_err(|e| Error::file("read", "audit_file", path, e))?
            .ino();
        Ok(AuditFile {
            path: path.to_path_buf(),
            file: Arc::new(file),
            inode,
        })
    }

    /// Opens the file again when the path now names another file (or none): logrotate moved it.
    async fn follow_rotation(&mut self) -> Result<(), Error> {
        use std::os::unix::fs::MetadataExt as _;
        let moved = match tokio::fs::metadata(&self.path).await {
            Ok(m) => m.ino() != self.inode,
            Err(_) => true,
        };
        if moved {
            *self = AuditFile::open(&self.path)?;
            info!("audit: reopened {} after rotation", self.path.display());
        }
        Ok(())
    }

    /// Appends whole lines and syncs them, off the async workers; a write that fails part way
    /// (a full disk) is cut back to where it started, so the file never ends in part of a line.
    async fn append(&mut self, bytes: Vec<u8>) -> Result<(), Error> {
        use std::io::Write as _;
        self.follow_rotation().await?;
        let file = Arc::clone(&self.file);
        let done = tokio::task::spawn_blocking(move || {
            let before = file.metadata()?.len();
            let written = (&*file).write_all(&bytes).and_then(|()| file.sync_data());
            if let Err(e) = written {
                // Whatever part of the batch reached the file is removed; it is counted lost.
                let _ = file.set_len(before);
                let _ = file.sync_data();
                return Err(e);
            }
            Ok(())
        })
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        done.map_err(|e| Error::file("append to", "audit_file", &self.path, e))
    }
}

impl Writer {
    /// Writes records as they come until `stop` is cancelled, then writes what is still queued
    /// (the workers have stopped by then), tries the stream once more, and returns. The stream
    /// is opened here, and tried again while records wait for it.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut summary = tokio::time::interval_at(Instant::now() + SUMMARY_EVERY, SUMMARY_EVERY);
        summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wake = self.stream.as_ref().and_then(StreamSink::wake_at);
            let n = tokio::select! {
                n = self.rx.recv_many(&mut batch, BATCH) => n,
                _ = sleep_until(wake), if wake.is_some() => {
                    self.flush_stream(false).await;
                    continue;
                }
                _ = summary.tick() => {
                    self.summarise(&mut batch);
                    self.write(&mut batch).await;
                    continue;
                }
                _ = stop.cancelled() => {
                    while let Ok(l) = self.rx.try_recv() {
                        batch.push(l);
                        if batch.len() >= BATCH {
                            self.write(&mut batch).await;
                        }
                    }
                    self.summarise(&mut batch);
                    self.write(&mut batch).await;
                    self.finish().await;
                    return;
                }
            };
            if n == 0 {
                self.summarise(&mut batch);
                self.write(&mut batch).await;
                self.finish().await;
                return;
            }
            self.write(&mut batch).await;
        }
    }

    /// One record per kind of cycle that reached no decision since the last summary, with its
    /// count; nothing when there were none.
    fn summarise(&mut self, batch: &mut Vec<Line>) {
        let counts = std::mem::take(&mut *self.undecided.lock().unwrap_or_else(|e| e.into_inner()));
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        for ((state, step, found_by), (count, examples)) in counts {
            let mut json = json!({
                "time": time,
                "provisioner": self.provisioner,
                "site": self.site,
                "decision": "undecided",
                "state": state,
                "step": step,
                "found_by": found_by,
                "count": count,
                "examples": examples,
                "window_seconds": SUMMARY_EVERY.as_secs(),
                "cause": "the node never answered: nothing was decided about it",
            })
            .to_string()
            .into_bytes();
            json.push(b'\n');
            batch.push(Line {
                identity: String::new(),
                json,
            });
        }
    }

    fn complain(&mut self, what: String) {
        if self.last_error.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            self.last_error = Some(Instant::now());
            error!("audit: {what}");
        }
    }

    async fn write(&mut self, batch: &mut Vec<Line>) {
        if batch.is_empty() {
            return;
        }
        if let Some(f) = &mut self.file {
            let bytes: Vec<u8> = batch.iter().flat_map(|l| l.json.iter().copied()).collect();
            if let Err(e) = f.append(bytes).await {
                self.metrics.audit_write_errors.inc();
                let what = format!(
                    "{} record(s) not written: {}",
                    batch.len(),
                    crate::one_line(&e)
                );
                self.complain(what);
            }
        }
        if let Some(s) = &mut self.stream {
            let mut dropped = 0u64;
            for l in batch.drain(..) {
                if s.backlog.push(l) {
                    dropped += 1;
                }
            }
            if dropped > 0 {
                self.metrics.audit_dropped.inc_by(dropped);
                if s.last_overflow_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                    s.last_overflow_log = Some(Instant::now());
                    error!(
                        "audit: stream {} unreachable and {} records waiting for it, the most it keeps: the oldest are dropped ({} so far); audit_file still has them",
                        s.target.name,
                        s.backlog.cap,
                        s.backlog.dropped
                    );
                }
            }
            self.flush_stream(false).await;
        }
        batch.clear();
    }

    /// Opens the stream if it is not open and publishes what waits for it, unless the last
    /// failure asks to wait longer (`now` ignores that wait).
    async fn flush_stream(&mut self, now: bool) {
        let Some(s) = &mut self.stream else {
            return;
        };
        if !now && Instant::now() < s.retry_at {
            return;
        }
        let stream = match &s.open {
            Some(open) => open.clone(),
            None => match AuditStream::open(
                s.target.client.nats().clone(),
                &s.target.name,
                s.target.limits,
            )
            .await
            {
                Ok(open) => {
                    info!(
                        "audit: publishing decisions to stream {} through {}{}",
                        open.name(),
                        open.api(),
                        match s.backlog.len() {
                            0 => String::new(),
                            n => format!(", {n} record(s) waiting for it"),
                        }
                    );
                    s.open = Some(open.clone());
                    open
                }
                Err(e) => {
                    self.metrics.audit_stream_errors.inc();
                    s.failed();
                    // One line per attempt: the backoff bounds them.
                    error!(
                        "audit: {e}; {} record(s) kept for it (at most {}), audit_file is written meanwhile, trying again in {:?}",
                        s.backlog.len(),
                        s.backlog.cap,
                        s.delay_before_retry()
                    );
                    return;
                }
            },
        };
        while let Some(l) = s.backlog.front() {
            let body = l.json.strip_suffix(b"\n").unwrap_or(&l.json).to_vec();
            match stream.publish(&l.identity, body.into()).await {
                Ok(()) => {
                    s.backlog.pop();
                }
                Err(e) => {
                    self.metrics.audit_stream_errors.inc();
                    // Opened again before the next attempt: the stream may have been deleted.
                    s.open = None;
                    s.failed();
                    let what = format!(
                        "{e}; {} record(s) kept for the stream, trying again in {:?}",
                        s.backlog.len(),
                        s.delay_before_retry()
                    );
                    self.complain(what);
                    return;
                }
            }
        }
        s.delay = RETRY_MIN;
    }

    /// The last attempt at the stream before the process ends; what is left is said.
    async fn finish(&mut self) {
        self.flush_stream(true).await;
        if let Some(s) = &self.stream {
            if s.backlog.len() > 0 {
                warn!(
                    "audit: {} record(s) never reached stream {}; audit_file has them if it is set",
                    s.backlog.len(),
                    s.target.name
                );
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The stream side of the writer: the target, the handle once open, the records waiting.
struct StreamSink {
    target: StreamTarget,
    open: Option<AuditStream>,
    backlog: Backlog,
    retry_at: Instant,
    delay: Duration,
    last_overflow_log: Option<Instant>,
}

impl StreamSink {
    /// When the writer should try the stream without a new record: while it is not open, or
    /// records wait for it.
    fn wake_at(&self) -> Option<Instant> {
        (self.open.is_none() || self.backlog.len() > 0).then_some(self.retry_at)
    }

    /// After a failed attempt: the next one waits `delay`, which doubles up to [`RETRY_MAX`].
    fn failed(&mut self) {
        self.retry_at = Instant::now() + self.delay;
        self.delay = (self.delay * 2).min(RETRY_MAX);
    }

    fn delay_before_retry(&self) -> Duration {
        self.retry_at.saturating_duration_since(Instant::now())
    }
}

/// Records waiting for the stream, at most `cap`: the oldest goes when a new one would not fit.
struct Backlog {
    lines: VecDeque<Line>,
    cap: usize,
    dropped: u64,
}

impl Backlog {
    fn new(cap: usize) -> Backlog {
        Backlog {
            lines: VecDeque::new(),
            cap,
            dropped: 0,
        }
    }

    /// Keeps `l`; true when the oldest record was dropped for it.
    fn push(&mut self, l: Line) -> bool {
        let full = self.lines.len() >= self.cap;
        if full {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back(l);
        full
    }

    fn front(&self) -> Option<&Line> {
        self.lines.front()
    }

    fn pop(&mut self) {
        self.lines.pop_front();
    }

    fn len(&self) -> usize {
        self.lines.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn line(n: usize) -> Line {
        Line {
            identity: format!("n{n}.example.net"),
            json: format!("{{\"n\":{n}}}\n").into_bytes(),
        }
    }

    #[test]
    fn the_backlog_keeps_the_newest_records_up_to_its_bound_and_counts_the_rest() {
        let mut b = Backlog::new(3);
        let dropped: Vec<bool> = (0..5).map(|n| b.push(line(n))).collect();
        assert_eq!(dropped, [false, false, false, true, true]);
        assert_eq!(b.len(), 3);
        assert_eq!(b.dropped, 2);
        assert_eq!(
            b.front().map(|l| l.identity.as_str()),
            Some("n2.example.net")
        );
        b.pop();
        assert_eq!(
            b.front().map(|l| l.identity.as_str()),
            Some("n3.example.net")
        );
    }

    #[test]
    fn records_the_writer_has_no_room_for_are_counted_in_the_dropped_metric() {
        let metrics = Metrics::new("lon");
        let dir = tempfile::tempdir().unwrap();
        let file = AuditFile::open(&dir.path().join("audit.jsonl")).unwrap();
        // The writer is never run, so the queue of 4 fills and the rest are dropped.
        let (audit, _writer) = channel_sized("p", "lon", Arc::clone(&metrics), Some(file), None, 4);
        let v = Verdict {
            state: provision_core::NodeState::Provisioned,
            step: "done",
            cause: String::new(),
            source: provision_core::Source::Discovery,
            helper_msg: String::new(),
            issued: provision_core::Issued::default(),
            upgrade: None,
            elapsed: Duration::from_millis(5),
            answered: true,
        };
        for n in 0..10 {
            audit.node_event(&format!("n{n}.example.net"), &NodeEvent::Finished(&v));
        }
        assert_eq!(metrics.audit_dropped.get(), 6);
        assert!(metrics
            .encode()
            .contains("choria_provisioner_audit_dropped{site=\"lon\"} 6\n"));
    }
}
