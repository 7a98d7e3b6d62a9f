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
//!   ([`crate::approval`]).
//! - `approved.<hex of the identity>` holds an operator's approval of that identity with the
//!   key fingerprints it had when pending; a node presenting other keys is not approved.
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

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv::{self, Operation};
use futures::StreamExt;
use provision_core::identity::escaped;
use provision_core::{PauseState, Revocation};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use choria_rpc_client::streams::{
    first_answering, open_bucket, route_errors, BucketError, Probe, StreamsApi,
};

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

/// The operator's pause, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseRecord {
    /// Who paused (the operator's identity in the Choria configuration).
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (Unix seconds).
    pub at: i64,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// One deny entry, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DenyRecord {
    /// The entry as given: an identity, `/REGEX/` or `sha256:HEX`.
    pub entry: String,
    /// Why.
    pub reason: String,
    /// Who added it.
    pub by: String,
    /// When (Unix seconds).
    pub at: i64,
    /// When it stops applying (Unix seconds), if ever.
    #[serde(default)]
    pub expires: Option<i64>,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// A node waiting for an operator's approval, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRecord {
    /// The node's identity.
    pub identity: String,
    /// The fingerprints of the keys it presented (`sha256:HEX`), as the deny list takes them.
    pub fingerprints: Vec<String>,
    /// Why it waits: `approval: manual` or the policy's reason.
    pub reason: String,
    /// A few facts from its inventory, each value shortened ([`crate::approval::facts`]).
    #[serde(default)]
    pub facts: std::collections::BTreeMap<String, String>,
    /// When it was first seen waiting (Unix seconds).
    pub first_seen: i64,
    /// When it was last seen (Unix seconds), written at most once per `interval`.
    pub last_seen: i64,
    /// When the entry stops applying (Unix seconds): the node is recorded anew when next seen.
    pub expires: i64,
    /// The replica that recorded it.
    pub by: String,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// An operator's approval, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    /// The node's identity.
    pub identity: String,
    /// The fingerprints of the keys it presented when pending: only these are approved.
    pub fingerprints: Vec<String>,
    /// Who approved it.
    pub by: String,
    /// When (Unix seconds).
    pub at: i64,
    /// When the approval stops applying (Unix seconds).
    pub expires: i64,
    /// Why (may be empty).
    #[serde(default)]
    pub reason: String,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// Which pending nodes an `approve` or `reject` acts on.
#[derive(Debug, Clone)]
pub enum Selector {
    /// One identity.
    Identity(String),
    /// Every pending identity the regular expression matches.
    Matching(regex::Regex),
}

impl Selector {
    /// `ID`, or with `matching` a regular expression of identities.
    pub fn new(text: &str, matching: bool) -> Result<Selector, ControlError> {
        if !matching {
            return Ok(Selector::Identity(text.to_string()));
        }
        regex::RegexBuilder::new(text)
            .size_limit(1 << 20)
            .build()
            .map(Selector::Matching)
            .map_err(|e| ControlError::InvalidEntry {
                entry: escaped(text).to_string(),
                reason: format!("not a regular expression: {e}"),
            })
    }

    fn selects(&self, identity: &str) -> bool {
        match self {
            Selector::Identity(i) => i == identity,
            Selector::Matching(re) => re.is_match(identity),
        }
    }
}

/// The same set of fingerprints, in any order.
pub fn same_keys(a: &[String], b: &[String]) -> bool {
    let mut a: Vec<&String> = a.iter().collect();
    let mut b: Vec<&String> = b.iter().collect();
    a.sort();
    b.sort();
    a == b
}

impl DenyRecord {
    /// Whether the entry applies at `now` (Unix seconds).
    pub fn active(&self, now: i64) -> bool {
        self.expires.is_none_or(|e| now < e)
    }
}

/// What a deny entry matches.
#[derive(Debug, Clone)]
enum Matcher {
    Identity(String),
    Pattern(regex::Regex),
    Key(String),
}

/// Parses a deny entry: `sha256:` and 64 hex digits, `/REGEX/`, or an identity.
fn matcher(entry: &str) -> Result<Matcher, ControlError> {
    let invalid = |reason: String| ControlError::InvalidEntry {
        entry: escaped(entry).to_string(),
        reason,
    };
    if entry.is_empty() || entry.len() > MAX_ENTRY {
        return Err(invalid(format!("it must be 1 to {MAX_ENTRY} bytes")));
    }
    if entry.chars().any(char::is_control) {
        return Err(invalid("it has control characters".into()));
    }
    if let Some(hex) = entry.strip_prefix("sha256:") {
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid(
                "a key fingerprint is sha256: and 64 hexadecimal digits".into(),
            ));
        }
        return Ok(Matcher::Key(format!("sha256:{}", hex.to_ascii_lowercase())));
    }
    if entry.len() >= 2 && entry.starts_with('/') && entry.ends_with('/') {
        let re = regex::RegexBuilder::new(&entry[1..entry.len() - 1])
            .size_limit(1 << 20)
            .build()
            .map_err(|e| invalid(format!("not a regular expression: {e}")))?;
        return Ok(Matcher::Pattern(re));
    }
    Ok(Matcher::Identity(entry.to_string()))
}

/// Checks a deny entry as `deny add` takes it.
pub fn check_entry(entry: &str) -> Result<(), ControlError> {
    matcher(entry).map(|_| ())
}

fn deny_key(entry: &str) -> String {
    format!("{DENY_PREFIX}{}", hex::encode(entry.as_bytes()))
}

/// What every replica knows of fleet control: the operator's pause and the deny list. It is the
/// provisioner's [`Revocation`].
#[derive(Debug, Default)]
pub struct ControlView {
    inner: RwLock<View>,
}

#[derive(Debug, Default)]
struct View {
    pause: Option<PauseRecord>,
    /// By bucket key.
    deny: HashMap<String, (DenyRecord, Matcher)>,
    identities: HashMap<String, String>,
    keys: HashMap<String, String>,
    patterns: Vec<(String, regex::Regex)>,
    /// By identity.
    pending: HashMap<String, PendingRecord>,
    /// By identity.
    approved: HashMap<String, ApprovalRecord>,
}

impl View {
    fn reindex(&mut self) {
        self.identities.clear();
        self.keys.clear();
        self.patterns.clear();
        for (key, (_, m)) in &self.deny {
            match m {
                Matcher::Identity(i) => {
                    self.identities.insert(i.clone(), key.clone());
                }
                Matcher::Key(k) => {
                    self.keys.insert(k.clone(), key.clone());
                }
                Matcher::Pattern(re) => self.patterns.push((key.clone(), re.clone())),
            }
        }
    }
}

impl ControlView {
    /// An empty view: nothing paused, nothing denied.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The operator's pause, if on.
    pub fn pause(&self) -> Option<PauseRecord> {
        self.read().pause.clone()
    }

    /// The deny entries followed.
    pub fn deny_entries(&self) -> Vec<DenyRecord> {
        let mut v: Vec<_> = self.read().deny.values().map(|(r, _)| r.clone()).collect();
        v.sort_by(|a, b| a.entry.cmp(&b.entry));
        v
    }

    /// The number of deny entries followed.
    pub fn deny_count(&self) -> usize {
        self.read().deny.len()
    }

    /// The pending nodes followed that have not expired at `now`, sorted by identity.
    pub fn pending(&self, now: i64) -> Vec<PendingRecord> {
        let mut v: Vec<_> = self
            .read()
            .pending
            .values()
            .filter(|r| r.expires > now)
            .cloned()
            .collect();
        v.sort_by(|a, b| a.identity.cmp(&b.identity));
        v
    }

    /// The pending record of `identity`, expired or not.
    pub fn pending_of(&self, identity: &str) -> Option<PendingRecord> {
        self.read().pending.get(identity).cloned()
    }

    /// The approval of `identity` presenting `keys` that applies at `now`.
    pub fn approval_of(&self, identity: &str, keys: &[String], now: i64) -> Option<ApprovalRecord> {
        self.read()
            .approved
            .get(identity)
            .filter(|a| a.expires > now && same_keys(&a.fingerprints, keys))
            .cloned()
    }

    pub(crate) fn note_pending(&self, rec: PendingRecord) {
        let mut v = self.write();
        if v.pending.len() < MAX_PENDING || v.pending.contains_key(&rec.identity) {
            v.pending.insert(rec.identity.clone(), rec);
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl Revocation for ControlView {
    fn denied(&self, identity: &str, keys: &[String]) -> Option<String> {
        let v = self.read();
        if v.deny.is_empty() {
            return None;
        }
        let now = now_unix();
        let why = |key: &String| {
            v.deny
                .get(key)
                .filter(|(r, _)| r.active(now))
                .map(|(r, _)| format!("{} ({}, by {})", r.entry, r.reason, r.by))
        };
        if let Some(w) = v.identities.get(identity).and_then(why) {
            return Some(w);
        }
        for k in keys {
            if let Some(w) = v.keys.get(k).and_then(why) {
                return Some(w);
            }
        }
        v.patterns
            .iter()
            .filter(|(_, re)| re.is_match(identity))
            .find_map(|(key, _)| why(key))
    }
}

/// Fleet control over one route to the bucket.
#[derive(Debug, Clone)]
pub struct Control {
    store: kv::Store,
    api: StreamsApi,
    seal: Seal,
    by: String,
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
        let config = kv::Config {
            bucket: CONTROL_BUCKET.to_string(),
            description: "Choria provisioner fleet control: pause and deny list".to_string(),
            history: 1,
            max_value_size: MAX_RECORD as i32,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        let probe = first_answering(
            |api| {
                let config = &config;
                let js = api.context(client.clone(), REQUEST_TIMEOUT);
                async move { open_bucket(&js, config, create).await }
            },
            BucketError::unreachable,
        )
        .await;
        let (api, opened) = match probe {
            Probe::Opened(api, opened) => (api, opened),
            Probe::Answered(_, BucketError::Missing) => {
                return Err(ControlError::BucketMissing {
                    bucket: CONTROL_BUCKET.to_string(),
                    detail: "no provisioner with fleet_control has created it yet".to_string(),
                })
            }
            Probe::Answered(_, BucketError::Create(detail)) => {
                return Err(ControlError::BucketMissing {
                    bucket: CONTROL_BUCKET.to_string(),
                    detail,
                })
            }
            Probe::Answered(_, e) => {
                return Err(ControlError::Request {
                    action: "open the bucket",
                    detail: e.to_string(),
                })
            }
            Probe::Unreachable(errors) => {
                return Err(ControlError::Unreachable {
                    detail: route_errors(&errors),
                })
            }
        };
        if let Some(replicas) = opened.created {
            info!("created fleet control bucket {CONTROL_BUCKET} with {replicas} replicas");
        }
        Ok(Control {
            store: opened.store,
            api,
            seal,
            by: by.to_string(),
        })
    }

    /// The bucket, for the shared rate limit ([`crate::pacing`]).
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
        self.store
            .put(key, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| ControlError::Request {
                action,
                detail: e.to_string(),
            })
    }

    /// Pauses every replica: nothing new is queued or started until [`Control::resume`].
    pub async fn pause(&self, reason: &str) -> Result<PauseRecord, ControlError> {
        let mut rec = PauseRecord {
            by: self.by.clone(),
            reason: bounded(reason),
            at: now_unix(),
            tag: String::new(),
        };
        let unsigned = Self::encode(&rec)?;
        rec.tag = self
            .seal
            .tag_record(PAUSE_KEY, &unsigned)
            .unwrap_or_default();
        let bytes = Self::encode(&rec)?;
        self.put("pause", PAUSE_KEY, bytes).await?;
        Ok(rec)
    }

    /// Lifts the operator's pause; returns the pause it lifted, if any.
    pub async fn resume(&self) -> Result<Option<PauseRecord>, ControlError> {
        let was = self.read_pause().await?;
        self.store
            .delete(PAUSE_KEY)
            .await
            .map_err(|e| ControlError::Request {
                action: "resume",
                detail: e.to_string(),
            })?;
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
        let unsigned = Self::encode(&rec)?;
        rec.tag = self.seal.tag_record(&key, &unsigned).unwrap_or_default();
        let bytes = Self::encode(&rec)?;
        self.put("add a deny entry", &key, bytes).await?;
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
            self.store
                .delete(&key)
                .await
                .map_err(|e| ControlError::Request {
                    action: "remove a deny entry",
                    detail: e.to_string(),
                })?;
        }
        Ok(there)
    }

    /// Every deny entry stored, verified ones only, sorted by entry; and how many did not
    /// verify.
    pub async fn deny_list(&self) -> Result<(Vec<DenyRecord>, usize), ControlError> {
        let fail = |e: String| ControlError::Request {
            action: "list the deny entries",
            detail: e,
        };
        let mut keys = self.store.keys().await.map_err(|e| fail(e.to_string()))?;
        let mut out = Vec::new();
        let mut forged = 0;
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| fail(e.to_string()))?;
            if !k.starts_with(DENY_PREFIX) {
                continue;
            }
            let got = self.store.get(&k).await.map_err(|e| fail(e.to_string()))?;
            if let Some(b) = got {
                match decode_deny(&self.seal, &k, &b) {
                    Some((r, _)) => out.push(r),
                    None => forged += 1,
                }
            }
        }
        out.sort_by(|a, b| a.entry.cmp(&b.entry));
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

    async fn delete(&self, action: &'static str, key: &str) -> Result<(), ControlError> {
        self.store
            .delete(key)
            .await
            .map_err(|e| ControlError::Request {
                action,
                detail: e.to_string(),
            })
    }

    /// Records a node as pending (written by a replica).
    pub async fn put_pending(&self, rec: &mut PendingRecord) -> Result<(), ControlError> {
        let key = pending_key(&rec.identity);
        self.put_sealed("record a pending node", &key, rec, |r| &mut r.tag)
            .await
    }

    /// Every pending node stored, verified ones only, sorted by identity (expired ones
    /// included: see [`PendingRecord::expires`]); and how many did not verify.
    pub async fn pending_list(&self) -> Result<(Vec<PendingRecord>, usize), ControlError> {
        let fail = |e: String| ControlError::Request {
            action: "list the pending nodes",
            detail: e,
        };
        let mut keys = self.store.keys().await.map_err(|e| fail(e.to_string()))?;
        let mut out = Vec::new();
        let mut forged = 0;
        while let Some(k) = keys.next().await {
            let k = k.map_err(|e| fail(e.to_string()))?;
            if !k.starts_with(PENDING_PREFIX) {
                continue;
            }
            let got = self.store.get(&k).await.map_err(|e| fail(e.to_string()))?;
            if let Some(b) = got {
                match decode_pending(&self.seal, &k, &b) {
                    Some(r) => out.push(r),
                    None => forged += 1,
                }
            }
            if out.len() >= MAX_PENDING {
                break;
            }
        }
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
        let (pending, _) = self.pending_list().await?;
        let mut out = Vec::new();
        for p in pending
            .into_iter()
            .filter(|p| p.expires > now && which.selects(&p.identity))
        {
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
        let now = now_unix();
        let (pending, _) = self.pending_list().await?;
        let mut out = Vec::new();
        for p in pending
            .into_iter()
            .filter(|p| p.expires > now && which.selects(&p.identity))
        {
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
        loop {
            let entry = tokio::select! {
                e = watch.next() => e,
                _ = stop.cancelled() => return Ok(()),
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

/// At most [`MAX_ENTRY`] bytes of `text`, control characters removed.
fn bounded(text: &str) -> String {
    bounded_to(text, MAX_ENTRY)
}

fn verified<T: Serialize + Clone>(
    seal: &Seal,
    key: &str,
    rec: &T,
    tag: &str,
    untagged: impl FnOnce(&mut T),
) -> bool {
    let mut bare = rec.clone();
    untagged(&mut bare);
    match serde_json::to_vec(&bare) {
        Ok(b) => seal.verify_record(key, &b, tag),
        Err(_) => false,
    }
}

fn decode_pause(seal: &Seal, bytes: &[u8]) -> Option<PauseRecord> {
    if bytes.len() > MAX_RECORD {
        return None;
    }
    let rec: PauseRecord = serde_json::from_slice(bytes).ok()?;
    verified(seal, PAUSE_KEY, &rec, &rec.tag, |r| r.tag.clear()).then_some(rec)
}

fn pending_key(identity: &str) -> String {
    format!("{PENDING_PREFIX}{}", hex::encode(identity.as_bytes()))
}

fn approved_key(identity: &str) -> String {
    format!("{APPROVED_PREFIX}{}", hex::encode(identity.as_bytes()))
}

fn decode_pending(seal: &Seal, key: &str, bytes: &[u8]) -> Option<PendingRecord> {
    if bytes.len() > MAX_RECORD {
        return None;
    }
    let rec: PendingRecord = serde_json::from_slice(bytes).ok()?;
    if pending_key(&rec.identity) != key {
        return None;
    }
    verified(seal, key, &rec, &rec.tag, |r| r.tag.clear()).then_some(rec)
}

fn decode_approval(seal: &Seal, key: &str, bytes: &[u8]) -> Option<ApprovalRecord> {
    if bytes.len() > MAX_RECORD {
        return None;
    }
    let rec: ApprovalRecord = serde_json::from_slice(bytes).ok()?;
    if approved_key(&rec.identity) != key {
        return None;
    }
    verified(seal, key, &rec, &rec.tag, |r| r.tag.clear()).then_some(rec)
}

/// Applies a change of a `pending.` or `approved.` key; whether a node was approved.
fn apply_approval(seal: &Seal, view: &ControlView, key: &str, removed: bool, value: &[u8]) -> bool {
    let mut v = view.write();
    if let Some(hexed) = key.strip_prefix(PENDING_PREFIX) {
        if removed {
            let identity = hex::decode(hexed)
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            if let Some(i) = identity {
                v.pending.remove(&i);
            }
            return false;
        }
        match decode_pending(seal, key, value) {
            Some(r) if v.pending.len() < MAX_PENDING || v.pending.contains_key(&r.identity) => {
                v.pending.insert(r.identity.clone(), r);
            }
            Some(r) => error!(
                "approval queue: more than {MAX_PENDING} pending nodes, ignoring {}",
                escaped(&r.identity)
            ),
            None => warn!("fleet control: ignoring pending record {}: malformed or not signed with the provisioners' secret", escaped(key)),
        }
        return false;
    }
    if removed {
        let identity = key
            .strip_prefix(APPROVED_PREFIX)
            .and_then(|h| hex::decode(h).ok())
            .and_then(|b| String::from_utf8(b).ok());
        if let Some(i) = identity {
            v.approved.remove(&i);
        }
        return false;
    }
    match decode_approval(seal, key, value) {
        Some(r) if v.approved.len() < MAX_PENDING || v.approved.contains_key(&r.identity) => {
            info!(
                "approval queue: {} approved by {} at {}",
                escaped(&r.identity),
                escaped(&r.by),
                rfc3339(r.at)
            );
            v.pending.remove(&r.identity);
            v.approved.insert(r.identity.clone(), r);
            true
        }
        Some(r) => {
            error!(
                "approval queue: more than {MAX_PENDING} approvals, ignoring {}",
                escaped(&r.identity)
            );
            false
        }
        None => {
            warn!("fleet control: ignoring approval {}: malformed or not signed with the provisioners' secret", escaped(key));
            false
        }
    }
}

fn decode_deny(seal: &Seal, key: &str, bytes: &[u8]) -> Option<(DenyRecord, Matcher)> {
    if bytes.len() > MAX_RECORD {
        return None;
    }
    let rec: DenyRecord = serde_json::from_slice(bytes).ok()?;
    if deny_key(&rec.entry) != key || rec.reason.len() > MAX_ENTRY {
        return None;
    }
    if !verified(seal, key, &rec, &rec.tag, |r| r.tag.clear()) {
        return None;
    }
    let m = matcher(&rec.entry).ok()?;
    Some((rec, m))
}

/// Applies one change of the bucket to `view` and `pause`; whether a node was approved.
fn apply(
    seal: &Seal,
    view: &ControlView,
    pause: &PauseState,
    key: &str,
    op: Operation,
    value: &[u8],
) -> bool {
    let removed = !matches!(op, Operation::Put);
    if key.starts_with(PENDING_PREFIX) || key.starts_with(APPROVED_PREFIX) {
        return apply_approval(seal, view, key, removed, value);
    }
    if key == PAUSE_KEY {
        let rec = if removed {
            None
        } else {
            match decode_pause(seal, value) {
                Some(r) => Some(r),
                None => {
                    warn!("fleet control: ignoring a pause record that is malformed or not signed with the provisioners' secret");
                    return false;
                }
            }
        };
        match &rec {
            Some(r) => warn!(
                "Provisioning paused by {} at {}: {}; nodes in flight finish, nothing new starts until choria-provisioner resume",
                escaped(&r.by),
                rfc3339(r.at),
                escaped(&r.reason)
            ),
            None if view.pause().is_some() => info!("Provisioning resumed: the operator's pause was lifted"),
            None => {}
        }
        pause.hold(rec.is_some());
        view.write().pause = rec;
        return false;
    }
    if !key.starts_with(DENY_PREFIX) {
        return false;
    }
    let mut v = view.write();
    if removed {
        if let Some((r, _)) = v.deny.remove(key) {
            info!("deny list: {} removed", escaped(&r.entry));
        }
    } else {
        match decode_deny(seal, key, value) {
            Some((r, m)) => {
                if v.deny.len() >= MAX_DENY_ENTRIES && !v.deny.contains_key(key) {
                    error!(
                        "deny list: more than {MAX_DENY_ENTRIES} entries, ignoring {}",
                        escaped(&r.entry)
                    );
                    return false;
                }
                info!(
                    "deny list: {} denied by {}: {}",
                    escaped(&r.entry),
                    escaped(&r.by),
                    escaped(&r.reason)
                );
                v.deny.insert(key.to_string(), (r, m));
            }
            None => {
                warn!("fleet control: ignoring deny entry {}: malformed or not signed with the provisioners' secret", escaped(key));
                return false;
            }
        }
    }
    v.reindex();
    false
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

/// The daemon's side: opens (creating) the bucket and follows it for as long as `stop` allows,
/// opening it again after `retry` whenever it cannot be reached; `resumed` is notified when the
/// operator's pause is lifted. Errors are logged once per
/// kind of failure in a row.
/// What the daemon follows the bucket with ([`Follower::run`]).
#[derive(Debug)]
pub struct Follower {
    /// The broker connection.
    pub client: async_nats::Client,
    /// The replica's identity.
    pub by: String,
    /// Checks the records' tags.
    pub seal: Seal,
    /// Where the deny list goes.
    pub view: Arc<ControlView>,
    /// Where the operator's pause goes.
    pub pause: PauseState,
    /// Notified when the pause is lifted.
    pub resumed: Arc<tokio::sync::Notify>,
    /// How long to wait before opening the bucket again after a failure.
    pub retry: Duration,
    /// Where the bucket goes once opened, for the approval queue's writes.
    pub slot: Arc<crate::approval::ControlSlot>,
}

impl Follower {
    /// Follows until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let Follower {
            client,
            by,
            seal,
            view,
            pause,
            resumed,
            retry,
            slot,
        } = self;
        let mut last_error = String::new();
        loop {
            let res = match Control::open(client.clone(), &by, seal.clone(), true).await {
                Ok(c) => {
                    last_error.clear();
                    slot.set(c.clone());
                    c.follow(&view, &pause, &resumed, &stop).await
                }
                Err(e) => Err(e),
            };
            if stop.is_cancelled() {
                return;
            }
            if let Err(e) = res {
                let text = e.to_string();
                if text != last_error {
                    error!("fleet control: {text}; pause and deny list changes are not seen until this is fixed (the last ones seen still apply)");
                    last_error = text;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn put(view: &ControlView, pause: &PauseState, seal: &Seal, key: &str, rec: &DenyRecord) {
        put_signed(view, pause, seal, seal, key, rec)
    }

    /// Signed with `signer`, read by a replica whose secret gives `seal`.
    fn put_signed(
        view: &ControlView,
        pause: &PauseState,
        seal: &Seal,
        signer: &Seal,
        key: &str,
        rec: &DenyRecord,
    ) {
        let mut r = rec.clone();
        r.tag.clear();
        r.tag = signer
            .tag_record(key, &serde_json::to_vec(&r).unwrap())
            .unwrap_or_default();
        apply(
            seal,
            view,
            pause,
            key,
            Operation::Put,
            &serde_json::to_vec(&r).unwrap(),
        );
    }

    fn record(entry: &str) -> DenyRecord {
        DenyRecord {
            entry: entry.into(),
            reason: "stolen".into(),
            by: "ops".into(),
            at: 1,
            expires: None,
            tag: String::new(),
        }
    }

    #[test]
    fn identities_patterns_and_key_fingerprints_are_denied() {
        let view = ControlView::new();
        let pause = PauseState::default();
        let seal = Seal::with_secret(b"s");
        let fp = format!("sha256:{}", "ab".repeat(32));
        for e in ["n1.example.net", "/^lab-/", fp.as_str()] {
            put(&view, &pause, &seal, &deny_key(e), &record(e));
        }
        assert!(view
            .denied("n1.example.net", &[])
            .unwrap()
            .contains("stolen"));
        assert!(view.denied("lab-7", &[]).is_some());
        assert!(view
            .denied("n2.example.net", std::slice::from_ref(&fp))
            .is_some());
        assert!(view.denied("n2.example.net", &[]).is_none());
        // Removed: no longer denied.
        apply(
            &seal,
            &view,
            &pause,
            &deny_key("n1.example.net"),
            Operation::Delete,
            b"",
        );
        assert!(view.denied("n1.example.net", &[]).is_none());
    }

    #[test]
    fn expired_and_forged_entries_deny_nothing() {
        let view = ControlView::new();
        let pause = PauseState::default();
        let seal = Seal::with_secret(b"s");
        let mut old = record("old");
        old.expires = Some(2);
        put(&view, &pause, &seal, &deny_key("old"), &old);
        assert!(view.denied("old", &[]).is_none());
        // Signed with another secret, or under another key: ignored.
        put_signed(
            &view,
            &pause,
            &seal,
            &Seal::with_secret(b"other"),
            &deny_key("n1"),
            &record("n1"),
        );
        assert!(view.denied("n1", &[]).is_none());
        put(&view, &pause, &seal, &deny_key("n2"), &record("n1"));
        assert!(view.denied("n1", &[]).is_none());
        // A forged pause does not hold the fleet.
        let forged = serde_json::to_vec(&PauseRecord {
            by: "x".into(),
            reason: "y".into(),
            at: 1,
            tag: "00".into(),
        })
        .unwrap();
        apply(&seal, &view, &pause, PAUSE_KEY, Operation::Put, &forged);
        assert!(!pause.paused());
    }

    fn sealed<T: Serialize + Clone>(
        seal: &Seal,
        key: &str,
        rec: &T,
        tag: fn(&mut T) -> &mut String,
    ) -> Vec<u8> {
        let mut r = rec.clone();
        tag(&mut r).clear();
        *tag(&mut r) = seal
            .tag_record(key, &serde_json::to_vec(&r).unwrap())
            .unwrap_or_default();
        serde_json::to_vec(&r).unwrap()
    }

    #[test]
    fn approvals_bind_the_key_and_forged_ones_approve_nothing() {
        let view = ControlView::new();
        let pause = PauseState::default();
        let seal = Seal::with_secret(b"s");
        let fp = format!("sha256:{}", "ab".repeat(32));
        let pending = PendingRecord {
            identity: "n1".into(),
            fingerprints: vec![fp.clone()],
            reason: "approval: manual".into(),
            facts: Default::default(),
            first_seen: 1,
            last_seen: 1,
            expires: i64::MAX,
            by: "prov1".into(),
            tag: String::new(),
        };
        let bytes = sealed(&seal, &pending_key("n1"), &pending, |r| &mut r.tag);
        assert!(!apply(
            &seal,
            &view,
            &pause,
            &pending_key("n1"),
            Operation::Put,
            &bytes
        ));
        assert_eq!(view.pending(now_unix()).len(), 1);
        // Expired entries are not listed.
        assert!(view.pending(i64::MAX).is_empty());
        let approval = ApprovalRecord {
            identity: "n1".into(),
            fingerprints: vec![fp.clone()],
            by: "ops".into(),
            at: 1,
            expires: i64::MAX,
            reason: String::new(),
            tag: String::new(),
        };
        // Signed with another secret: ignored.
        let forged = sealed(
            &Seal::with_secret(b"x"),
            &approved_key("n1"),
            &approval,
            |r| &mut r.tag,
        );
        assert!(!apply(
            &seal,
            &view,
            &pause,
            &approved_key("n1"),
            Operation::Put,
            &forged
        ));
        assert!(view
            .approval_of("n1", std::slice::from_ref(&fp), now_unix())
            .is_none());
        // Under another identity's key: ignored.
        let elsewhere = sealed(&seal, &approved_key("n2"), &approval, |r| &mut r.tag);
        assert!(!apply(
            &seal,
            &view,
            &pause,
            &approved_key("n2"),
            Operation::Put,
            &elsewhere
        ));
        let good = sealed(&seal, &approved_key("n1"), &approval, |r| &mut r.tag);
        assert!(
            apply(
                &seal,
                &view,
                &pause,
                &approved_key("n1"),
                Operation::Put,
                &good
            ),
            "an approval triggers discovery"
        );
        assert!(view
            .approval_of("n1", std::slice::from_ref(&fp), now_unix())
            .is_some());
        assert!(
            view.pending(now_unix()).is_empty(),
            "the pending entry goes"
        );
        // Another key under the same name is not approved; nor after the approval expires.
        let other = format!("sha256:{}", "cd".repeat(32));
        assert!(view.approval_of("n1", &[other], now_unix()).is_none());
        assert!(view.approval_of("n1", &[fp], i64::MAX).is_none());
    }

    #[test]
    fn entries_are_checked() {
        assert!(check_entry("sha256:12").is_err());
        assert!(check_entry("/(/").is_err());
        assert!(check_entry("").is_err());
        assert!(check_entry("a\nb").is_err());
        assert!(check_entry(&"x".repeat(MAX_ENTRY + 1)).is_err());
        assert!(check_entry("n1.example.net").is_ok());
    }
}
