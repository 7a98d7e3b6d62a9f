//! Active-active claims on Choria Streams: the `CHORIA_PROVISIONER_CLAIMS` key-value bucket in
//! which provisioner replicas claim a node before provisioning it.
//!
//! - A node's key is `node.<identity>` (identities a KV key cannot carry are hex-encoded under
//!   `hex.`). A replica claims it by writing `claimed <replica>` expecting no entry (a KV
//!   create, one JetStream publish): the server accepts exactly one such write, so exactly one
//!   replica runs the node's helper. The claim is kept by rewriting it at its revision every
//!   third of the bucket's max age, written `done <replica>` after a successful cycle (the
//!   others leave the restarting node alone until the entry ages out), and deleted at its
//!   revision after a failed one. A loser reads the entry once to learn whether the node is
//!   done. Claims of a dead replica simply age out (the bucket's max age is the claim lifetime).
//! - Each replica writes `replica.<replica>` on the same period: the live replicas are the
//!   `replica.*` subjects still in the stream (one stream-info request with a subject filter).
//!   Spreading uses rendezvous hashing of (replica, identity) over them: every replica agrees
//!   which one should take a node first, and the others take it only after a delay.
//! - Every JetStream request and publish made for nodes is counted
//!   ([`ClaimStats::node_operations`]), heartbeats apart.
//!
//! - Every value a replica writes says who wrote it and when (`claimed|done|alive <replica>
//!   <unix ms>`), and with a shared secret ([`Seal`]: `claims_secret_file`, else the
//!   provisioners' broker password) it carries an HMAC-SHA256 tag over the key, the state, the
//!   replica and the time. A value that does not verify, or is older than the claim lifetime,
//!   is someone else's: a forged claim is taken over at its revision, a forged `done` mark is
//!   ignored, and a forged heartbeat never enters the live set, so a client that can write the
//!   bucket cannot shrink the share of the replicas that really renew.
//!
//! The bucket is reached as the election reaches its own: through the `choria.streams` import
//! of the provisioning account first, else the account's own JetStream. It is created when the
//! account may (replicas 3, else 1; history 1; max age = the claim lifetime), otherwise
//! [`ClaimsError::BucketMissing`] gives the `nats` command that creates it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::kv::{self, Operation};
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use choria_rpc_client::election::backoff::Policy;
use choria_rpc_client::streams::{
    first_answering, open_bucket, BucketError, Probe, StreamsApi, MAX_BUCKET_REPLICAS,
};
use fleet_lifecycle::seal::{Seal, MAX_CLAIM_VALUE};

/// The bucket active-active replicas share.
pub const CLAIMS_BUCKET: &str = "CHORIA_PROVISIONER_CLAIMS";

/// Bound on every JetStream request and publish acknowledgement of the claims.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

const NODE_PREFIX: &str = "node.";
const HEX_PREFIX: &str = "hex.";
const REPLICA_PREFIX: &str = "replica.";
/// The most replicas read from the bucket: more are ignored (and logged once per refresh).
const MAX_REPLICAS: usize = 64;

/// Unix milliseconds now.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Counters of one replica's claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimStats {
    /// JetStream requests and publishes made for nodes (claims, reads, keeps, done, release).
    pub node_operations: u64,
    /// Claims won.
    pub won: u64,
    /// Claims found held by another replica (or done).
    pub taken: u64,
    /// Claim operations that failed (unreachable, timed out, lost).
    pub errors: u64,
    /// Heartbeats written.
    pub heartbeats: u64,
    /// Replicas alive at the last refresh, this one included.
    pub live_replicas: u64,
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Ours, at this revision.
    Won {
        /// The node's key.
        key: String,
        /// The revision written.
        revision: u64,
    },
    /// Another replica's.
    Taken {
        /// The replica named in the entry (sanitised, bounded).
        by: String,
        /// The other replica finished the node.
        done: bool,
    },
}

/// Errors of the claims store; each names the replica, the action and the node or bucket.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClaimsError {
    /// The bucket does not exist and could not be created: the operator must create it.
    #[error("claims as {replica}: bucket {bucket} does not exist and could not be created ({detail}); create it with: {command}")]
    BucketMissing {
        /// Our replica identity.
        replica: String,
        /// Bucket name.
        bucket: String,
        /// Why creating it failed.
        detail: String,
        /// The `nats` CLI command that creates it.
        command: String,
    },
    /// The bucket exists but cannot hold claims.
    #[error(
        "claims as {replica}: bucket {bucket} is unusable: {reason}; recreate it with: {command}"
    )]
    BadBucket {
        /// Our replica identity.
        replica: String,
        /// Bucket name.
        bucket: String,
        /// What is wrong.
        reason: String,
        /// The `nats` CLI command that creates a usable one.
        command: String,
    },
    /// Choria Streams does not answer on this connection.
    #[error(
        "claims as {replica}: choria streams unreachable for bucket {bucket} on {api}: {detail}"
    )]
    Unreachable {
        /// Our replica identity.
        replica: String,
        /// Bucket name.
        bucket: String,
        /// The JetStream API prefix asked.
        api: String,
        /// What failed.
        detail: String,
    },
    /// One claim operation failed.
    #[error("claims as {replica}: {action} {identity}: {detail}")]
    Operation {
        /// Our replica identity.
        replica: String,
        /// The node.
        identity: String,
        /// `claim`, `keep`, `done`, `release`.
        action: &'static str,
        /// What failed.
        detail: String,
    },
    /// A name is not usable.
    #[error("claims as {replica}: invalid {what} {value:?}")]
    InvalidName {
        /// Our replica identity.
        replica: String,
        /// Which name.
        what: &'static str,
        /// The value.
        value: String,
    },
}

/// The `nats` CLI command creating the bucket for `lifetime` with `replicas`.
pub fn create_command(bucket: &str, lifetime: Duration, replicas: usize) -> String {
    format!(
        "nats kv add {bucket} --history 1 --ttl {}s --replicas {replicas} --storage file",
        lifetime.as_secs()
    )
}

/// One replica's handle on the claims bucket. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ClaimStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    js: jetstream::Context,
    api: String,
    store: kv::Store,
    bucket: String,
    replica: String,
    /// The replica's own heartbeat key (`replica.<encoded>`).
    replica_key: String,
    lifetime: Duration,
    seal: Seal,
    /// Heartbeat keys whose value verified, and when: each is read again once its last proof
    /// is a third of the lifetime old.
    proven: std::sync::Mutex<HashMap<String, std::time::Instant>>,
    /// Values read that no replica wrote (a bad seal, a wrong form, too old), since start.
    forged: AtomicU64,
    live: RwLock<Vec<String>>,
    healthy: AtomicBool,
    node_ops: AtomicU64,
    won: AtomicU64,
    taken: AtomicU64,
    errors: AtomicU64,
    heartbeats: AtomicU64,
}

impl ClaimStore {
    /// Open the bucket (creating it when it is missing and the account may) over whichever
    /// JetStream API answers: the `choria.streams` import first, then the account's own. While
    /// neither answers or the bucket is missing, each failure goes to `on_error` and both are
    /// asked again after `retry`'s delay. `None` when `cancel` fires first.
    pub async fn choose(
        client: async_nats::Client,
        replica: &str,
        lifetime: Duration,
        seal: Seal,
        retry: &Policy,
        cancel: &CancellationToken,
        mut on_error: impl FnMut(&ClaimsError),
    ) -> Result<Option<ClaimStore>, ClaimsError> {
        if replica.is_empty() {
            return Err(ClaimsError::InvalidName {
                replica: replica.to_string(),
                what: "replica identity",
                value: replica.to_string(),
            });
        }
        let mut failures = 0usize;
        loop {
            let probe = tokio::select! {
                p = first_answering(
                    |api| {
                        Self::open(
                            client.clone(),
                            api,
                            CLAIMS_BUCKET,
                            replica,
                            lifetime,
                            seal.clone(),
                        )
                    },
                    |e| matches!(e, ClaimsError::Unreachable { .. }),
                ) => p,
                _ = cancel.cancelled() => return Ok(None),
            };
            match probe {
                Probe::Opened(_, store) => return Ok(Some(store)),
                // The API answered: the problem is the bucket, not the route.
                Probe::Answered(_, e) => on_error(&e),
                Probe::Unreachable(mut errors) => {
                    if let Some((_, e)) = errors.pop() {
                        on_error(&e);
                    }
                }
            }
            failures = failures.saturating_add(1);
            if !retry.sleep(failures, cancel).await {
                return Ok(None);
            }
        }
    }

    /// Open `bucket` through `api`, creating it when missing; values sealed with `seal`.
    pub async fn open(
        client: async_nats::Client,
        api: StreamsApi,
        bucket: &str,
        replica: &str,
        lifetime: Duration,
        seal: Seal,
    ) -> Result<ClaimStore, ClaimsError> {
        let js = api.context(client, REQUEST_TIMEOUT);
        let api = api.subject_prefix().to_string();
        let command = create_command(bucket, lifetime, MAX_BUCKET_REPLICAS);
        let config = kv::Config {
            bucket: bucket.to_string(),
            description: "Choria provisioner active-active claims".to_string(),
            history: 1,
            max_age: lifetime,
            max_value_size: MAX_CLAIM_VALUE as i32,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        let opened = open_bucket(&js, &config, true).await.map_err(|e| match e {
            BucketError::Create(detail) => ClaimsError::BucketMissing {
                replica: replica.to_string(),
                bucket: bucket.to_string(),
                detail,
                command: command.clone(),
            },
            BucketError::NotKeyValue => ClaimsError::BadBucket {
                replica: replica.to_string(),
                bucket: bucket.to_string(),
                reason: BucketError::NotKeyValue.to_string(),
                command: command.clone(),
            },
            other => ClaimsError::Unreachable {
                replica: replica.to_string(),
                bucket: bucket.to_string(),
                api: api.clone(),
                detail: other.to_string(),
            },
        })?;
        if let Some(replicas) = opened.created {
            tracing::info!("created claims bucket {bucket} with {replicas} replicas and a claim lifetime of {lifetime:?}");
        }
        let store = opened.store;
        let c = &store.stream.cached_info().config;
        let reason = if c.max_age.is_zero() {
            Some("it has no max age, so a dead replica's claims would never expire".to_string())
        } else if c.max_age < Duration::from_secs(6) || c.max_age > Duration::from_secs(3600) {
            Some(format!("its max age {:?} is outside 6s to 1h", c.max_age))
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(ClaimsError::BadBucket {
                replica: replica.to_string(),
                bucket: bucket.to_string(),
                reason,
                command,
            });
        }
        if c.max_age != lifetime {
            tracing::warn!(
                "claims bucket {bucket} has a max age of {:?}: using it as the claim lifetime instead of the configured {lifetime:?}",
                c.max_age
            );
        }
        let lifetime = store.stream.cached_info().config.max_age;
        let replica_key = format!("{REPLICA_PREFIX}{}", encode(replica));
        Ok(ClaimStore {
            inner: Arc::new(Inner {
                js,
                api,
                store,
                bucket: bucket.to_string(),
                replica: replica.to_string(),
                live: RwLock::new(vec![replica_key.clone()]),
                replica_key,
                lifetime,
                seal,
                proven: std::sync::Mutex::new(HashMap::new()),
                forged: AtomicU64::new(0),
                healthy: AtomicBool::new(true),
                node_ops: AtomicU64::new(0),
                won: AtomicU64::new(0),
                taken: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                heartbeats: AtomicU64::new(0),
            }),
        })
    }

    /// Our replica identity.
    pub fn replica(&self) -> &str {
        &self.inner.replica
    }

    /// The bucket name.
    pub fn bucket(&self) -> &str {
        &self.inner.bucket
    }

    /// The JetStream API prefix in use.
    pub fn api(&self) -> &str {
        &self.inner.api
    }

    /// The claim lifetime: the bucket's max age.
    pub fn lifetime(&self) -> Duration {
        self.inner.lifetime
    }

    /// How often claims and heartbeats are rewritten: a third of the lifetime.
    pub fn keep_every(&self) -> Duration {
        self.inner.lifetime / 3
    }

    /// Whether the last heartbeat went through. While it does not, claims are refused at once:
    /// a replica cut off from JetStream takes no new node.
    pub fn healthy(&self) -> bool {
        self.inner.healthy.load(Ordering::Acquire)
    }

    /// The counters so far.
    pub fn stats(&self) -> ClaimStats {
        let i = &self.inner;
        ClaimStats {
            node_operations: i.node_ops.load(Ordering::Relaxed),
            won: i.won.load(Ordering::Relaxed),
            taken: i.taken.load(Ordering::Relaxed),
            errors: i.errors.load(Ordering::Relaxed),
            heartbeats: i.heartbeats.load(Ordering::Relaxed),
            live_replicas: self.live().len() as u64,
        }
    }

    /// The live replicas' keys (ours included), sorted.
    pub fn live(&self) -> Vec<String> {
        self.inner
            .live
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether this replica should take `identity` first: rendezvous hashing over the live
    /// replicas, so all of them agree and a replica that joins or leaves moves only its share.
    pub fn first_choice(&self, identity: &str) -> bool {
        let live = self.inner.live.read().unwrap_or_else(|e| e.into_inner());
        owner(&live, identity).is_none_or(|o| o == self.inner.replica_key)
    }

    /// Write our heartbeat and read the live replicas: one publish and one stream-info request.
    /// Marks the store unhealthy when either fails.
    pub async fn heartbeat(&self) -> Result<usize, ClaimsError> {
        let i = &self.inner;
        let res = self.heartbeat_once().await;
        i.healthy.store(res.is_ok(), Ordering::Release);
        if res.is_err() {
            // Only ourselves: spreading never waits on replicas we cannot see.
            *i.live.write().unwrap_or_else(|e| e.into_inner()) = vec![i.replica_key.clone()];
        }
        res
    }

    /// An error of this replica's own `action` (a heartbeat, reading the live replicas).
    fn own_error(&self, action: &'static str, detail: String) -> ClaimsError {
        ClaimsError::Operation {
            replica: self.inner.replica.clone(),
            identity: self.inner.replica.clone(),
            action,
            detail,
        }
    }

    async fn heartbeat_once(&self) -> Result<usize, ClaimsError> {
        let i = &self.inner;
        i.heartbeats.fetch_add(1, Ordering::Relaxed);
        let value = i.seal.value(&i.replica_key, "alive", &i.replica, now_ms());
        i.store
            .put(&i.replica_key, value)
            .await
            .map_err(|e| self.own_error("heartbeat", e.to_string()))?;
        self.read_live().await
    }

    /// Read the live replicas again without writing our heartbeat (one stream-info request),
    /// so a replica joining or leaving is seen within a second rather than a third of the
    /// lifetime. Leaves the health and the live set as they were when it fails.
    pub async fn refresh(&self) -> Result<usize, ClaimsError> {
        self.read_live().await
    }

    async fn read_live(&self) -> Result<usize, ClaimsError> {
        let i = &self.inner;
        let op_err = |detail: String| self.own_error("read the live replicas", detail);
        #[derive(serde::Deserialize)]
        struct State {
            #[serde(default)]
            subjects: Option<HashMap<String, u64>>,
        }
        #[derive(serde::Deserialize)]
        struct Info {
            state: State,
        }
        let filter = format!("$KV.{}.{REPLICA_PREFIX}>", i.bucket);
        let response: jetstream::response::Response<Info> =
            i.js.request(
                format!("STREAM.INFO.KV_{}", i.bucket),
                &serde_json::json!({ "subjects_filter": filter }),
            )
            .await
            .map_err(|e| op_err(e.to_string()))?;
        let info = match response {
            jetstream::response::Response::Ok(info) => info,
            jetstream::response::Response::Err { error } => return Err(op_err(error.to_string())),
        };
        let prefix = format!("$KV.{}.", i.bucket);
        let mut live: Vec<String> = info
            .state
            .subjects
            .unwrap_or_default()
            .into_keys()
            .filter_map(|s| s.strip_prefix(&prefix).map(str::to_string))
            .filter(|k| k.len() <= MAX_CLAIM_VALUE && k.starts_with(REPLICA_PREFIX))
            .collect();
        live.sort();
        if i.seal.is_sealed() {
            live = self.proven_replicas(live).await;
        }
        live.truncate(MAX_REPLICAS);
        if !live.contains(&i.replica_key) {
            live.push(i.replica_key.clone());
            live.sort();
        }
        let n = live.len();
        *i.live.write().unwrap_or_else(|e| e.into_inner()) = live;
        Ok(n)
    }

    /// The heartbeat keys among `keys` whose value a replica wrote, read again once their last
    /// proof is a third of the lifetime old (one read per replica per period); the others are
    /// forged and left out of the live set.
    async fn proven_replicas(&self, keys: Vec<String>) -> Vec<String> {
        let i = &self.inner;
        let every = i.lifetime / 3;
        let mut live = Vec::with_capacity(keys.len().min(MAX_REPLICAS));
        for key in keys.into_iter().take(MAX_REPLICAS * 4) {
            if key == i.replica_key {
                live.push(key);
                continue;
            }
            let fresh = {
                let proven = i.proven.lock().unwrap_or_else(|e| e.into_inner());
                proven.get(&key).is_some_and(|t| t.elapsed() < every)
            };
            if fresh {
                live.push(key);
                continue;
            }
            let ok = match i.store.entry(key.clone()).await {
                Ok(Some(e)) if e.operation == Operation::Put => i
                    .seal
                    .read(&key, &e.value, now_ms(), i.lifetime)
                    .is_some_and(|v| {
                        v.state == "alive" && format!("{REPLICA_PREFIX}{}", encode(&v.by)) == key
                    }),
                _ => false,
            };
            let mut proven = i.proven.lock().unwrap_or_else(|e| e.into_inner());
            if ok {
                proven.insert(key.clone(), std::time::Instant::now());
                live.push(key);
            } else {
                proven.remove(&key);
                i.forged.fetch_add(1, Ordering::Relaxed);
            }
            if live.len() >= MAX_REPLICAS {
                break;
            }
        }
        live
    }

    /// Values read back that no replica wrote (a bad seal, a wrong form, too old), since start.
    pub fn forged(&self) -> u64 {
        self.inner.forged.load(Ordering::Relaxed)
    }

    /// What a claim entry under `key` says, when a replica wrote it: `(by, done)`.
    fn holder(&self, key: &str, value: &[u8]) -> Option<(String, bool)> {
        let i = &self.inner;
        match i.seal.read(key, value, now_ms(), i.lifetime) {
            Some(v) if v.state == "claimed" || v.state == "done" => Some((v.by, v.state == "done")),
            _ => {
                i.forged.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Claim `identity`. A `first_choice` node is claimed with a create (one publish when it
    /// is free; a loser then reads the entry once to tell a node in progress from a finished
    /// one). Any other node is read first (one request) and created only when free, so a
    /// replica coming late to a node another one finished costs one read. A claim left by an
    /// earlier life of this replica (same identity), or a released one, is taken at its
    /// revision; a race for it is settled by the server.
    pub async fn claim(&self, identity: &str, first_choice: bool) -> Result<Claim, ClaimsError> {
        let i = &self.inner;
        let err = |detail: String| {
            i.errors.fetch_add(1, Ordering::Relaxed);
            ClaimsError::Operation {
                replica: i.replica.clone(),
                identity: identity.to_string(),
                action: "claim",
                detail,
            }
        };
        if !self.healthy() {
            return Err(err(
                "the claims bucket did not answer the last heartbeat, taking no new node".into(),
            ));
        }
        let key = node_key(identity);
        let value = self.value(&key, "claimed");
        let mut create_failed = None;
        if first_choice {
            match self.write(&key, value.clone(), 0).await {
                Ok(revision) => return Ok(Claim::Won { key, revision }),
                Err(e) => create_failed = Some(e),
            }
        }
        i.node_ops.fetch_add(1, Ordering::Relaxed);
        let entry = i.store.entry(key.clone()).await.map_err(|e| {
            err(match &create_failed {
                Some(first) => format!("{first}; reading the claim: {e}"),
                None => format!("reading the claim: {e}"),
            })
        })?;
        let expected = match entry {
            // The create failed and nothing is there: the store did not take it.
            None if create_failed.is_some() => {
                return Err(err(create_failed.unwrap_or_default()));
            }
            None => 0,
            Some(entry) => {
                // A value no replica wrote holds nothing: it is taken over at its revision.
                let holder = (entry.operation == Operation::Put)
                    .then(|| self.holder(&key, &entry.value))
                    .flatten();
                match holder {
                    Some((by, done)) if by != i.replica || done => {
                        i.taken.fetch_add(1, Ordering::Relaxed);
                        return Ok(Claim::Taken { by, done });
                    }
                    _ => entry.revision,
                }
            }
        };
        match self.write(&key, value, expected).await {
            Ok(revision) => Ok(Claim::Won { key, revision }),
            // Another replica got there between the read and the write (or the write could
            // not be confirmed): either way the node is not ours now.
            Err(_) => {
                i.taken.fetch_add(1, Ordering::Relaxed);
                Ok(Claim::Taken {
                    by: "another replica".to_string(),
                    done: false,
                })
            }
        }
    }

    /// One counted write of `value` expecting revision `expected` (0: no entry).
    async fn write(&self, key: &str, value: Bytes, expected: u64) -> Result<u64, String> {
        let i = &self.inner;
        i.node_ops.fetch_add(1, Ordering::Relaxed);
        match i.store.update(key, value, expected).await {
            Ok(revision) => {
                i.won.fetch_add(1, Ordering::Relaxed);
                Ok(revision)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// Rewrite our claim at `revision`; the new revision. Fails when the claim moved on.
    pub async fn keep(&self, identity: &str, key: &str, revision: u64) -> Result<u64, ClaimsError> {
        self.rewrite(identity, key, revision, "keep", "claimed")
            .await
    }

    /// Mark the node done at `revision`. When the claim aged out meanwhile (a JetStream outage
    /// longer than the keeps could bridge) and nobody took the node, the mark is written anyway,
    /// so the others do not start a node that is restarting.
    pub async fn done(&self, identity: &str, key: &str, revision: u64) -> Result<u64, ClaimsError> {
        let first = match self.rewrite(identity, key, revision, "done", "done").await {
            Ok(rev) => return Ok(rev),
            Err(e) => e,
        };
        let i = &self.inner;
        i.node_ops.fetch_add(1, Ordering::Relaxed);
        let expected = match i.store.entry(key.to_string()).await {
            Ok(None) => 0,
            Ok(Some(e)) if e.operation != Operation::Put => e.revision,
            _ => return Err(first),
        };
        self.rewrite(identity, key, expected, "done", "done")
            .await
            .map_err(|_| first)
    }

    /// Delete our claim at `revision` so any replica may take the node.
    pub async fn release(
        &self,
        identity: &str,
        key: &str,
        revision: u64,
    ) -> Result<(), ClaimsError> {
        let i = &self.inner;
        i.node_ops.fetch_add(1, Ordering::Relaxed);
        i.store
            .delete_expect_revision(key, Some(revision))
            .await
            .map_err(|e| self.failed(identity, "release", e.to_string()))
    }

    /// A claim operation that failed, counted.
    fn failed(&self, identity: &str, action: &'static str, detail: String) -> ClaimsError {
        let i = &self.inner;
        i.errors.fetch_add(1, Ordering::Relaxed);
        ClaimsError::Operation {
            replica: i.replica.clone(),
            identity: identity.to_string(),
            action,
            detail,
        }
    }

    async fn rewrite(
        &self,
        identity: &str,
        key: &str,
        revision: u64,
        action: &'static str,
        state: &str,
    ) -> Result<u64, ClaimsError> {
        let i = &self.inner;
        i.node_ops.fetch_add(1, Ordering::Relaxed);
        i.store
            .update(key, self.value(key, state), revision)
            .await
            .map_err(|e| self.failed(identity, action, format!("at revision {revision}: {e}")))
    }

    fn value(&self, key: &str, state: &str) -> Bytes {
        let i = &self.inner;
        i.seal.value(key, state, &i.replica, now_ms())
    }
}

/// A KV key for `identity`: `node.<identity>` when the identity is made of key characters
/// (no empty label), else `hex.<hex of the bytes>`.
pub fn node_key(identity: &str) -> String {
    format!("{NODE_PREFIX}{}", encode(identity))
}

fn encode(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= 200
        && name.split('.').all(|l| !l.is_empty())
        && name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'=' | b'.'));
    if plain {
        name.to_string()
    } else if name.is_empty() {
        // Never a node's (identities are checked first), but still one valid key.
        format!("{HEX_PREFIX}-")
    } else {
        format!("{HEX_PREFIX}{}", hex::encode(name.as_bytes()))
    }
}

/// The live replica (a `replica.*` key) that takes `identity` first: the highest
/// `hash(replica, identity)`.
pub fn owner<'a>(live: &'a [String], identity: &str) -> Option<&'a str> {
    live.iter()
        .max_by_key(|r| score(r, identity))
        .map(String::as_str)
}

/// FNV-1a over `replica \0 identity`, finished with splitmix64 so close names spread.
fn score(replica: &str, identity: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in replica
        .bytes()
        .chain(std::iter::once(0))
        .chain(identity.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_plain_for_dns_names_and_hex_otherwise() {
        assert_eq!(node_key("n-1.example.net"), "node.n-1.example.net");
        assert_eq!(node_key("a..b"), "node.hex.612e2e62");
        assert_eq!(node_key("a b"), "node.hex.612062");
        assert_eq!(node_key("x*"), "node.hex.782a");
        assert_eq!(node_key(""), "node.hex.-");
    }

    #[test]
    fn hostile_values_and_identities_stay_bounded() {
        let long_name = format!("claimed {}", "\u{7}é".repeat(300));
        let inputs: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"claimed ".to_vec(),
            b"done \x00\x1b\n".to_vec(),
            long_name.into_bytes(),
            vec![0xff, 0xfe, b' ', b'x'],
            b"a.b..c\n*>\n".to_vec(),
        ];
        let now = now_ms();
        for data in &inputs {
            for seal in [Seal::none(), Seal::with_secret(b"s")] {
                if let Some(v) = seal.read("node.x", data, now, Duration::from_secs(30)) {
                    assert!(v.by.chars().count() <= 128 && !v.by.chars().any(char::is_control));
                }
            }
            let text = String::from_utf8_lossy(data);
            let key = node_key(&text);
            assert!(key.split('.').all(|l| !l.is_empty()), "{key:?}");
            assert!(key
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'=' | b'.')));
            let mut live: Vec<String> = text.split('\n').map(str::to_string).collect();
            let a = owner(&live, &text).map(str::to_string);
            live.reverse();
            assert_eq!(a, owner(&live, &text).map(str::to_string));
        }
    }

    /// Every replica agrees on one owner, the load spreads about evenly, and a replica leaving
    /// moves only its own nodes.
    #[test]
    fn rendezvous_spreads_and_moves_only_the_leavers_share() {
        let three: Vec<String> = ["replica.a", "replica.b", "replica.c"]
            .map(String::from)
            .to_vec();
        let two: Vec<String> = vec![three[0].clone(), three[2].clone()];
        let mut counts = HashMap::new();
        for n in 0..3000 {
            let id = format!("n-{n:04}.fleet.example.net");
            let o = owner(&three, &id).map(str::to_string);
            let o2 = owner(&two, &id).map(str::to_string);
            if o.as_deref() != Some("replica.b") {
                assert_eq!(o, o2, "{id} moved although its owner stayed");
            }
            *counts.entry(o.unwrap_or_default()).or_insert(0) += 1;
        }
        for (r, c) in &counts {
            assert!((850..=1150).contains(c), "{r} owns {c} of 3000: {counts:?}");
        }
        assert_eq!(owner(&[], "x"), None);
    }
}
