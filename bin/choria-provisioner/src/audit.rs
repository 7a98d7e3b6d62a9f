//! The audit trail: one JSON line per decision (provisioned, upgraded, shut down, lock held,
//! deferred, refused, failed) appended to `audit_file` and, with `audit_stream`, published to a
//! JetStream stream so that every replica writes into one record.
//!
//! The workers never wait for the disk or the broker: a decision is queued (at most
//! [`QUEUE`] records; beyond that a record is dropped, counted and logged at most once a
//! minute) and one writer task appends, `fsync`s each batch, and publishes. A record holds the
//! identity, the decision, the step and cause, the helper's message, and what the node was
//! given by serial, fingerprint or token id: never a certificate, key, token or JWT.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use choria_rpc_client::audit::AuditStream;
use provision_core::{NodeEvent, Observer, Verdict};
use provisioner_metrics::nodes::issued_json;
use serde_json::json;
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

/// Records waiting for the writer at most.
pub const QUEUE: usize = 16_384;
/// Records written (and `fsync`ed) together at most.
const BATCH: usize = 512;
/// At most one log line per this interval about dropped or unwritten records.
const LOG_EVERY: Duration = Duration::from_secs(60);

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
    dropped: AtomicU64,
    last_drop_log: Mutex<Option<Instant>>,
}

/// The writer side, run by [`Writer::run`].
pub struct Writer {
    rx: mpsc::Receiver<Line>,
    file: Option<AuditFile>,
    stream: Option<AuditStream>,
}

/// The audit trail as configured: `Audit` for the observer, `Writer` when a destination is set.
pub fn channel(
    provisioner: &str,
    site: &str,
    file: Option<AuditFile>,
    stream: Option<AuditStream>,
) -> (Audit, Option<Writer>) {
    let on = file.is_some() || stream.is_some();
    let (tx, rx) = mpsc::channel(QUEUE);
    let audit = Audit {
        tx: on.then_some(tx),
        provisioner: provisioner.to_string(),
        site: site.to_string(),
        dropped: AtomicU64::new(0),
        last_drop_log: Mutex::new(None),
    };
    (audit, on.then_some(Writer { rx, file, stream }))
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
        "found_by": match v.source {
            provision_core::Source::Discovery => "discovery",
            provision_core::Source::Event => "event",
        },
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
        let (Some(tx), NodeEvent::Finished(v)) = (&self.tx, event) else {
            return;
        };
        let mut json = record(
            &self.provisioner,
            &self.site,
            identity,
            v,
            chrono::Utc::now(),
        )
        .to_string()
        .into_bytes();
        json.push(b'\n');
        if tx
            .try_send(Line {
                identity: identity.to_string(),
                json,
            })
            .is_err()
        {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            let mut last = self.last_drop_log.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                *last = Some(Instant::now());
                error!("audit: the writer is {QUEUE} records behind, {n} record(s) dropped so far");
            }
        }
    }
}

/// `audit_file`, opened for appending; reopened when logrotate has moved it.
pub struct AuditFile {
    path: PathBuf,
    file: tokio::fs::File,
    inode: u64,
}

impl AuditFile {
    /// Opens (creating, mode 0640) `path` for appending.
    pub fn open(path: &Path) -> Result<AuditFile> {
        use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o640)
            .open(path)
            .with_context(|| format!("cannot open audit_file {}", path.display()))?;
        let inode = file
            .metadata()
            .with_context(|| format!("cannot read audit_file {}", path.display()))?
            .ino();
        Ok(AuditFile {
            path: path.to_path_buf(),
            file: tokio::fs::File::from_std(file),
            inode,
        })
    }

    /// Opens the file again when the path now names another file (or none): logrotate moved it.
    async fn follow_rotation(&mut self) -> Result<()> {
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

    async fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.follow_rotation().await?;
        self.file
            .write_all(bytes)
            .await
            .with_context(|| format!("cannot append to audit_file {}", self.path.display()))?;
        self.file
            .sync_data()
            .await
            .with_context(|| format!("cannot fsync audit_file {}", self.path.display()))
    }
}

impl Writer {
    /// Writes records as they come until `stop` is cancelled, then writes what is still queued
    /// (the workers have stopped by then) and returns.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut last_error: Option<Instant> = None;
        loop {
            let n = tokio::select! {
                n = self.rx.recv_many(&mut batch, BATCH) => n,
                _ = stop.cancelled() => {
                    while let Ok(l) = self.rx.try_recv() {
                        batch.push(l);
                        if batch.len() >= BATCH {
                            self.write(&mut batch, &mut last_error).await;
                        }
                    }
                    self.write(&mut batch, &mut last_error).await;
                    return;
                }
            };
            if n == 0 {
                return;
            }
            self.write(&mut batch, &mut last_error).await;
        }
    }

    async fn write(&mut self, batch: &mut Vec<Line>, last_error: &mut Option<Instant>) {
        if batch.is_empty() {
            return;
        }
        let mut complain = |what: String| {
            if last_error.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
                *last_error = Some(Instant::now());
                error!("audit: {what}");
            }
        };
        if let Some(f) = &mut self.file {
            let bytes: Vec<u8> = batch.iter().flat_map(|l| l.json.iter().copied()).collect();
            if let Err(e) = f.append(&bytes).await {
                complain(format!(
                    "{} record(s) not written: {}",
                    batch.len(),
                    crate::one_line(&e)
                ));
            }
        }
        if let Some(s) = &self.stream {
            for l in batch.iter() {
                let body = l.json.strip_suffix(b"\n").unwrap_or(&l.json).to_vec();
                if let Err(e) = s.publish(&l.identity, body.into()).await {
                    complain(e.to_string());
                }
            }
        }
        batch.clear();
    }
}

/// Opens `name` over the client's connection; a failure is logged and only the file (if any)
/// is written.
pub async fn open_stream(
    name: &str,
    client: &choria_rpc_client::rpc::RpcClient,
) -> Option<AuditStream> {
    match AuditStream::open(client.nats().clone(), name).await {
        Ok(s) => {
            info!(
                "audit: publishing decisions to stream {} through {}",
                s.name(),
                s.api()
            );
            Some(s)
        }
        Err(e) => {
            error!("audit: {e}; decisions are not published to a stream");
            None
        }
    }
}
