//! Fleet control on Choria Streams: the `CHORIA_PROVISIONER_CONTROL` key-value bucket through
//! which an operator pauses every replica (the kill switch) and denies nodes, by identity, by a
//! pattern of identities or by the fingerprint of a key, on every replica at once.
//!
//! - `pause` holds who paused provisioning, when and why; while it is there no replica queues or
//!   starts a node (cycles in flight finish). Deleting it resumes.
//! - `deny.<hex of the entry>` holds one deny entry: an identity (`n1.example.net`), a regular
//!   expression between slashes (`/^lab-/`) or a key fingerprint (`sha256:` and 64 hex digits,
//!   of a CSR's public key or an ed25519 key), with a reason, who added it, when, and when it
//!   expires. A denied node never reaches the admission policy or the helper
//!   ([`provision_core::Revocation`]).
//!
//! - `pending.<hex of the identity>` holds a node waiting for an operator's approval
//!   (`approval: manual`, or the policy's `pending`): its identity, the fingerprints of its
//!   keys, a few facts, when it was first and last seen and when the entry expires
//!   (the approval queue).
//! - `approved.<hex of the identity>` holds an operator's approval of that identity with the
//!   key fingerprints it had when pending; a node presenting other keys is not approved.
//! - `replica.<hex of the identity>` holds a following replica's presence: when it was last
//!   seen and the highest revision it has applied, so that an operator's command can say which
//!   replicas its change reached ([`presence`]).
//!
//! Every replica follows the bucket with a watch, so a change takes effect within the time the
//! broker takes to deliver it (milliseconds). Records are JSON; with a shared secret (the
//! claims' [`Seal`]: `claims_secret_file`, else the provisioners' broker password) each carries
//! an HMAC-SHA256 tag, and a record that does not verify is ignored and logged: a client that
//! can write the bucket without the secret can neither pause the fleet nor deny a node. Without
//! a secret records are taken as they are, and the bucket's NATS permissions are the control.
//!
//! The bucket is reached as the claims and the election reach theirs (the `choria.streams`
//! import first, else the account's own JetStream), and created by the daemon when the account
//! may (history 1, no expiry, replicas 3 when the cluster has them).

mod follow;
pub mod presence;
mod records;
mod view;

pub use follow::*;
pub use presence::{PresenceRecord, Reach};
pub use records::*;
pub use view::*;

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::kv::{self, Operation};
use futures::StreamExt;
use provision_core::identity::escaped;
use provision_core::{PauseState, Revocation};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use choria_rpc_client::streams::{BucketError, StreamsApi};

use crate::seal::Seal;
use crate::{bounded_to, now_unix, rfc3339};

/// The bucket fleet control lives in.
pub const CONTROL_BUCKET: &str = "CHORIA_PROVISIONER_CONTROL";

/// The key of the operator's pause.
pub const PAUSE_KEY: &str = "pause";

const DENY_PREFIX: &str = "deny.";

const PENDING_PREFIX: &str = "pending.";

const APPROVED_PREFIX: &str = "approved.";

/// The most pending nodes and approvals followed each; more are ignored and logged.
pub const MAX_PENDING: usize = 10_000;

/// Bound on every JetStream request of fleet control.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest record kept or read back.
const MAX_RECORD: usize = 4096;

/// The longest deny entry or reason.
pub const MAX_ENTRY: usize = 512;

/// The most deny entries followed; more are ignored and logged.
pub const MAX_DENY_ENTRIES: usize = 100_000;

/// Why fleet control could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// Neither route to Choria Streams answered.
    #[error("fleet control needs Choria Streams (JetStream), and neither the choria.streams import nor the account's own JetStream answered: {detail}")]
    Unreachable {
        /// What each route said.
        detail: String,
    },
    /// The bucket is missing and could not be created.
    #[error("the fleet control bucket {bucket} is missing and could not be created ({detail}); create it with: nats kv add {bucket} --history 1 --replicas 3 --storage file")]
    BucketMissing {
        /// The bucket.
        bucket: String,
        /// The server's answer.
        detail: String,
    },
    /// A read or write of the bucket failed.
    #[error("could not {action} in fleet control bucket {CONTROL_BUCKET}: {detail}")]
    Request {
        /// What was being done.
        action: &'static str,
        /// The server's answer.
        detail: String,
    },
    /// A change was stored, but no running provisioner follows the bucket.
    #[error("no running provisioner follows the fleet control bucket {CONTROL_BUCKET}, so the change reached nothing (it is stored, and applies when one does): set fleet_control: true in each provisioner's YAML and restart it, or pass --no-replicas-ok to prepare changes before the first start")]
    NoReplicas,
    /// Replicas follow the bucket, but none applied the change within [`presence::REACH_WAIT`].
    #[error("no running replica applied the change within {}s ({missing} follow the bucket): see their logs for fleet control errors", presence::REACH_WAIT.as_secs())]
    NotApplied {
        /// The replicas that follow the bucket.
        missing: String,
    },
    /// `approve` or `reject` found no pending node to act on.
    #[error("no pending node matches {pattern} (see choria-provisioner nodes --pending)")]
    NothingPending {
        /// The identity or pattern given.
        pattern: String,
    },
    /// A deny entry or reason that cannot be used.
    #[error("invalid deny entry {entry:?}: {reason}")]
    InvalidEntry {
        /// The entry as given.
        entry: String,
        /// Why.
        reason: String,
    },
}

/// Fleet control over one route to the bucket.
#[derive(Debug, Clone)]
pub struct Control {
    store: kv::Store,
    api: StreamsApi,
    seal: Seal,
    by: String,
    /// The highest revision written through this handle and its clones.
    written: Arc<AtomicU64>,
}

impl Control {
    /// Opens the bucket over whichever route answers, creating it when `create` and the
    /// account may. `by` names whoever writes (the operator's or the replica's identity).
    pub async fn open(
        client: async_nats::Client,
        by: &str,
        seal: Seal,
        create: bool,
    ) -> Result<Control, ControlError> {
        let description = "Choria provisioner fleet control: pause and deny list";
        let opened = match crate::open_bucket(
            &client,
            CONTROL_BUCKET,
            description,
            MAX_RECORD,
            create,
        )
        .await
        {
            Ok((api, _, opened)) => (api, opened),
            Err(crate::NotOpened::Refused(BucketError::Missing)) => {
                return Err(ControlError::BucketMissing {
                    bucket: CONTROL_BUCKET.to_string(),
                    detail: "no provisioner with fleet_control has created it yet".to_string(),
                })
            }
            Err(crate::NotOpened::Refused(BucketError::Create(detail))) => {
                return Err(ControlError::BucketMissing {
                    bucket: CONTROL_BUCKET.to_string(),
                    detail,
                })
            }
            Err(crate::NotOpened::Refused(e)) => {
                return Err(ControlError::Request {
                    action: "open the bucket",
                    detail: e.to_string(),
                })
            }
            Err(crate::NotOpened::Unreachable(detail)) => {
                return Err(ControlError::Unreachable { detail })
            }
        };
        let (api, opened) = opened;
        Ok(Control {
            store: opened.store,
            api,
            seal,
            by: by.to_string(),
            written: Arc::default(),
        })
    }

    /// The bucket, for the shared rate limit.
    pub(crate) fn store(&self) -> &kv::Store {
        &self.store
    }

    /// The same bucket, writing in the name of `by`.
    pub fn acting_as(&self, by: &str) -> Control {
        Control {
            by: by.to_string(),
            ..self.clone()
        }
    }

    /// The route the bucket was reached through.
    pub fn api(&self) -> StreamsApi {
        self.api
    }

    fn encode<T: Serialize>(record: &T) -> Result<Vec<u8>, ControlError> {
        serde_json::to_vec(record).map_err(|e| ControlError::Request {
            action: "encode a record",
            detail: e.to_string(),
        })
    }

    async fn put(
        &self,
        action: &'static str,
        key: &str,
        bytes: Vec<u8>,
    ) -> Result<(), ControlError> {
        let revision =
            self.store
                .put(key, bytes.into())
                .await
                .map_err(|e| ControlError::Request {
                    action,
                    detail: e.to_string(),
                })?;
        self.wrote(revision);
        Ok(())
    }

    /// Pauses every replica: nothing new is queued or started until [`Control::resume`].
    pub async fn pause(&self, reason: &str) -> Result<PauseRecord, ControlError> {
        let mut rec = PauseRecord {
            by: self.by.clone(),
            reason: bounded(reason),
            at: now_unix(),
            tag: String::new(),
        };
        self.put_sealed("pause", PAUSE_KEY, &mut rec, |r| &mut r.tag)
            .await?;
        Ok(rec)
    }

    /// Lifts the operator's pause; returns the pause it lifted, if any.
    pub async fn resume(&self) -> Result<Option<PauseRecord>, ControlError> {
        let was = self.read_pause().await?;
        self.delete("resume", PAUSE_KEY).await?;
        Ok(was)
    }

    /// The operator's pause as stored (verified), if any.
    pub async fn read_pause(&self) -> Result<Option<PauseRecord>, ControlError> {
        let got = self
            .store
            .get(PAUSE_KEY)
            .await
            .map_err(|e| ControlError::Request {
                action: "read the pause",
                detail: e.to_string(),
            })?;
        Ok(got.and_then(|b| decode_pause(&self.seal, &b)))
    }

    /// Denies `entry` on every replica, for `expires` if given.
    pub async fn deny(
        &self,
        entry: &str,
        reason: &str,
        expires: Option<Duration>,
    ) -> Result<DenyRecord, ControlError> {
        let m = matcher(entry)?;
        let entry = match m {
            Matcher::Key(k) => k,
            _ => entry.to_string(),
        };
        let at = now_unix();
        let key = deny_key(&entry);
        let mut rec = DenyRecord {
            entry,
            reason: bounded(reason),
            by: self.by.clone(),
            at,
            expires: expires
                .map(|d| at.saturating_add(i64::try_from(d.as_secs()).unwrap_or(i64::MAX))),
            tag: String::new(),
        };
        self.put_sealed("add a deny entry", &key, &mut rec, |r| &mut r.tag)
            .await?;
        Ok(rec)
    }

    /// Removes a deny entry; whether it was there.
    pub async fn undeny(&self, entry: &str) -> Result<bool, ControlError> {
        let entry = match matcher(entry)? {
            Matcher::Key(k) => k,
            _ => entry.to_string(),
        };
        let key = deny_key(&entry);
        let there = self
            .store
            .get(&key)
            .await
            .map_err(|e| ControlError::Request {
                action: "read a deny entry",
                detail: e.to_string(),
            })?
            .is_some();
        if there {
            self.delete("remove a deny entry", &key).await?;
        }
        Ok(there)
    }

    /// Every deny entry stored, verified ones only, sorted by entry; and how many did not
    /// verify.
    pub async fn deny_list(&self) -> Result<(Vec<DenyRecord>, usize), ControlError> {
        let (mut out, forged) = self
            .list(
                "list the deny entries",
                DENY_PREFIX,
                MAX_DENY_ENTRIES,
                |seal, k, b| decode_deny(seal, k, b).map(|(r, _)| r),
            )
            .await?;
        out.sort_by(|a, b| a.entry.cmp(&b.entry));
        Ok((out, forged))
    }

    /// The records under `prefix` that `decode` accepts, at most `max`, and how many it
    /// refused.
    async fn list<T>(
        &self,
        action: &'static str,
        prefix: &str,
        max: usize,
        decode: impl Fn(&Seal, &str, &[u8]) -> Option<T>,
    ) -> Result<(Vec<T>, usize), ControlError> {
        let fail = |e: String| ControlError::Request { action, detail: e };
        let mut keys = self.store.keys().await.map_err(|e| fail(e.to_string()))?;
        let mut out = Vec::new();
        let mut forged = 0;
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| fail(e.to_string()))?;
            if !k.starts_with(prefix) {
                continue;
            }
            let got = self.store.get(&k).await.map_err(|e| fail(e.to_string()))?;
            if let Some(b) = got {
                match decode(&self.seal, &k, &b) {
                    Some(r) => out.push(r),
                    None => forged += 1,
                }
            }
            if out.len() >= max {
                break;
            }
        }
        Ok((out, forged))
    }

    async fn put_sealed<T: Serialize>(
        &self,
        action: &'static str,
        key: &str,
        rec: &mut T,
        tag: fn(&mut T) -> &mut String,
    ) -> Result<(), ControlError> {
        tag(rec).clear();
        let unsigned = Self::encode(rec)?;
        *tag(rec) = self.seal.tag_record(key, &unsigned).unwrap_or_default();
        let bytes = Self::encode(rec)?;
        if bytes.len() > MAX_RECORD {
            return Err(ControlError::Request {
                action,
                detail: format!(
                    "the record is {} bytes, more than {MAX_RECORD}",
                    bytes.len()
                ),
            });
        }
        self.put(action, key, bytes).await
    }

    /// Deletes `key`, noting the revision of its delete marker.
    async fn delete(&self, action: &'static str, key: &str) -> Result<(), ControlError> {
        let fail = |detail: String| ControlError::Request { action, detail };
        self.store
            .delete(key)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let marker = self
            .store
            .entry(key)
            .await
            .map_err(|e| fail(e.to_string()))?;
        if let Some(e) = marker {
            self.wrote(e.revision);
        }
        Ok(())
    }

    /// Records a node as pending (written by a replica).
    pub async fn put_pending(&self, rec: &mut PendingRecord) -> Result<(), ControlError> {
        let key = pending_key(&rec.identity);
        self.put_sealed("record a pending node", &key, rec, |r| &mut r.tag)
            .await
    }

    /// The pending nodes `which` selects that have not expired.
    async fn pending_selected(&self, which: &Selector) -> Result<Vec<PendingRecord>, ControlError> {
        let now = now_unix();
        let (pending, _) = self.pending_list().await?;
        Ok(pending
            .into_iter()
            .filter(|p| p.expires > now && which.selects(&p.identity))
            .collect())
    }

    /// Every pending node stored, verified ones only, sorted by identity (expired ones
    /// included: see [`PendingRecord::expires`]); and how many did not verify.
    pub async fn pending_list(&self) -> Result<(Vec<PendingRecord>, usize), ControlError> {
        let (mut out, forged) = self
            .list(
                "list the pending nodes",
                PENDING_PREFIX,
                MAX_PENDING,
                decode_pending,
            )
            .await?;
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        Ok((out, forged))
    }

    /// Approves the pending nodes `which` selects (expired entries excepted): each approval is
    /// bound to the identity and the key fingerprints recorded while it was pending, lasts
    /// `lasts`, carries `reason`, and removes the pending entry. Every replica provisions the nodes at once.
    pub async fn approve(
        &self,
        which: &Selector,
        lasts: Duration,
        reason: &str,
    ) -> Result<Vec<ApprovalRecord>, ControlError> {
        let now = now_unix();
        let mut out = Vec::new();
        for p in self.pending_selected(which).await? {
            let mut rec = ApprovalRecord {
                identity: p.identity.clone(),
                fingerprints: p.fingerprints.clone(),
                by: self.by.clone(),
                at: now,
                expires: now.saturating_add(i64::try_from(lasts.as_secs()).unwrap_or(i64::MAX)),
                reason: bounded(reason),
                tag: String::new(),
            };
            self.put_sealed(
                "approve a node",
                &approved_key(&p.identity),
                &mut rec,
                |r| &mut r.tag,
            )
            .await?;
            self.delete("remove a pending node", &pending_key(&p.identity))
                .await?;
            out.push(rec);
        }
        Ok(out)
    }

    /// `approve ID|--matching RE` (`approve`) or `reject ... --reason`, as an operator runs
    /// them: a line for each node acted on (and the count with `matching`), or why nothing was
    /// done. Approvals last `lasts`.
    pub async fn decide(
        &self,
        pattern: &str,
        matching: bool,
        approve: bool,
        reason: &str,
        lasts: Duration,
    ) -> Result<String, ControlError> {
        let which = Selector::new(pattern, matching)?;
        if !approve && reason.trim().is_empty() {
            return Err(ControlError::InvalidEntry {
                entry: escaped(pattern).to_string(),
                reason: "--reason must say why it is rejected".into(),
            });
        }
        let mut out = String::new();
        let names: Vec<String> = if approve {
            let done = self.approve(&which, lasts, reason).await?;
            for a in &done {
                out.push_str(&format!(
                    "Approved {} ({}) until {}\n",
                    a.identity,
                    a.fingerprints.join(", "),
                    rfc3339(a.expires)
                ));
            }
            done.into_iter().map(|a| a.identity).collect()
        } else {
            let done = self.reject(&which, reason).await?;
            for (p, denied) in &done {
                let entries: Vec<&str> = denied.iter().map(|d| d.entry.as_str()).collect();
                out.push_str(&format!(
                    "Rejected {}: denied {}\n",
                    p.identity,
                    entries.join(", ")
                ));
            }
            done.into_iter().map(|(p, _)| p.identity).collect()
        };
        if names.is_empty() {
            return Err(ControlError::NothingPending {
                pattern: escaped(pattern).to_string(),
            });
        }
        if matching {
            let verb = if approve { "approved" } else { "rejected" };
            out.push_str(&format!(
                "{} nodes {verb}: {}\n",
                names.len(),
                names.join(", ")
            ));
        }
        Ok(out)
    }

    /// Rejects the pending nodes `which` selects (expired entries excepted): each key
    /// fingerprint it presented goes on the deny list with `reason` (its identity when it
    /// presented no key), and the pending entry and any approval of the identity are removed.
    pub async fn reject(
        &self,
        which: &Selector,
        reason: &str,
    ) -> Result<Vec<(PendingRecord, Vec<DenyRecord>)>, ControlError> {
        let mut out = Vec::new();
        for p in self.pending_selected(which).await? {
            let why = format!(
                "rejected while pending approval as {}: {reason}",
                p.identity
            );
            let mut denied = Vec::new();
            if p.fingerprints.is_empty() {
                denied.push(self.deny(&p.identity, &why, None).await?);
            }
            for fp in &p.fingerprints {
                denied.push(self.deny(fp, &why, None).await?);
            }
            self.delete("remove a pending node", &pending_key(&p.identity))
                .await?;
            self.delete("remove an approval", &approved_key(&p.identity))
                .await?;
            out.push((p, denied));
        }
        Ok(out)
    }

    /// Follows the bucket into `view` and the operator's hold of `pause` until `stop`: every
    /// current record first, then every change as it is written.
    pub async fn follow(
        &self,
        view: &ControlView,
        pause: &PauseState,
        resumed: &tokio::sync::Notify,
        stop: &CancellationToken,
    ) -> Result<(), ControlError> {
        let mut watch =
            self.store
                .watch_with_history(">")
                .await
                .map_err(|e| ControlError::Request {
                    action: "watch",
                    detail: e.to_string(),
                })?;
        info!(
            "fleet control: following bucket {CONTROL_BUCKET} through {}",
            self.api
        );
        let mut heartbeat = presence::Heartbeat::new();
        loop {
            let entry = tokio::select! {
                e = watch.next() => e,
                _ = tokio::time::sleep_until(heartbeat.due()) => {
                    heartbeat.beat(self).await;
                    continue;
                }
                _ = stop.cancelled() => {
                    self.remove_presence().await;
                    return Ok(());
                }
            };
            let Some(entry) = entry else {
                return Err(ControlError::Request {
                    action: "watch",
                    detail: "the watch ended".into(),
                });
            };
            let entry = entry.map_err(|e| ControlError::Request {
                action: "watch",
                detail: e.to_string(),
            })?;
            let change = entry.key == PAUSE_KEY
                || [DENY_PREFIX, PENDING_PREFIX, APPROVED_PREFIX]
                    .iter()
                    .any(|p| entry.key.starts_with(p));
            heartbeat.saw(entry.revision, change);
            let was_held = pause.held();
            let approved = apply(
                &self.seal,
                view,
                pause,
                &entry.key,
                entry.operation,
                &entry.value,
            );
            if approved || (was_held && !pause.held()) {
                // Announcements were ignored while paused, or a node was approved: look for
                // the nodes now.
                resumed.notify_one();
            }
        }
    }
}

/// Parses `deny add --expires` (`30d`, `12h`, `90m`): a duration longer than zero.
pub fn parse_expiry(text: &str) -> Result<Duration, ControlError> {
    let invalid = |reason: String| ControlError::InvalidEntry {
        entry: format!("--expires {}", escaped(text)),
        reason,
    };
    match choria_rpc_client::duration::parse(text) {
        Ok(d) if d.is_zero() => Err(invalid("it must be longer than zero".into())),
        Ok(d) => Ok(d),
        Err(e) => Err(invalid(e.to_string())),
    }
}
