//! `max_per_minute` shared by every replica: a token bucket kept under the `rate` key of the
//! fleet control bucket.
//!
//! The record holds the tokens left and when they were counted. A replica takes a batch of
//! tokens at a time (half a second's worth, at least one) with a compare-and-set on the key's
//! revision, refilling by the time passed at the configured rate and up to one second's worth,
//! and hands them to its workers one node at a time. Replicas that race retry on the new
//! revision, so together they never pass more than the rate plus one batch each. The record
//! is sealed like the other control records; one that does not verify is replaced by a full
//! bucket. While the bucket cannot be reached the replica paces itself alone at the same rate
//! ([`provision_core::LocalBucket`]) and says so once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use provision_core::pacing::{PaceFuture, Pacer};
use provision_core::LocalBucket;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;
use tracing::warn;

use crate::seal::Seal;

/// The key of the shared bucket in the fleet control bucket.
pub const RATE_KEY: &str = "rate";

/// The bucket as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct RateRecord {
    /// Tokens left when counted.
    tokens: f64,
    /// When they were counted (Unix milliseconds).
    at_ms: i64,
    /// The rate it was written at (a changed rate starts a full bucket).
    per_minute: u32,
    #[serde(default)]
    tag: String,
}

/// `max_per_minute` shared through the fleet control bucket.
pub struct SharedBucket {
    client: async_nats::Client,
    by: String,
    seal: Seal,
    per_minute: u32,
    batch: f64,
    state: Mutex<State>,
    fallback: LocalBucket,
    warned: AtomicBool,
}

struct State {
    /// Tokens taken from the shared bucket and not yet used.
    local: f64,
    /// The bucket, once opened.
    store: Option<kv::Store>,
    /// When opening it may be tried again.
    retry_at: Instant,
}

/// How long after a failed attempt the bucket is opened again.
const REOPEN: Duration = Duration::from_secs(10);

impl std::fmt::Debug for SharedBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBucket")
            .field("per_minute", &self.per_minute)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl SharedBucket {
    /// A bucket of `per_minute` nodes a minute in the fleet control bucket, reached over
    /// `client` (opened on first use) and sealed with `seal`; `by` names this replica.
    pub fn new(client: async_nats::Client, by: &str, seal: Seal, per_minute: u32) -> Self {
        let per_minute = per_minute.max(1);
        SharedBucket {
            client,
            by: by.to_string(),
            seal,
            per_minute,
            batch: (f64::from(per_minute) / 120.0).max(1.0).floor(),
            state: Mutex::new(State {
                local: 0.0,
                store: None,
                retry_at: Instant::now(),
            }),
            fallback: LocalBucket::new(per_minute),
            warned: AtomicBool::new(false),
        }
    }

    async fn store(&self, state: &mut State) -> Result<kv::Store, String> {
        if let Some(s) = &state.store {
            return Ok(s.clone());
        }
        if Instant::now() < state.retry_at {
            return Err("the fleet control bucket is not open yet".into());
        }
        state.retry_at = Instant::now() + REOPEN;
        let control =
            crate::control::Control::open(self.client.clone(), &self.by, self.seal.clone(), true)
                .await
                .map_err(|e| e.to_string())?;
        let store = control.store().clone();
        state.store = Some(store.clone());
        Ok(store)
    }

    fn capacity(&self) -> f64 {
        (f64::from(self.per_minute) / 60.0).max(1.0).max(self.batch)
    }

    fn encode(&self, rec: &RateRecord) -> Option<Vec<u8>> {
        let mut bare = rec.clone();
        bare.tag.clear();
        let unsigned = serde_json::to_vec(&bare).ok()?;
        bare.tag = self
            .seal
            .tag_record(RATE_KEY, &unsigned)
            .unwrap_or_default();
        serde_json::to_vec(&bare).ok()
    }

    fn decode(&self, bytes: &[u8]) -> Option<RateRecord> {
        if bytes.len() > 4096 {
            return None;
        }
        let mut rec: RateRecord = serde_json::from_slice(bytes).ok()?;
        let tag = std::mem::take(&mut rec.tag);
        let unsigned = serde_json::to_vec(&rec).ok()?;
        (self.seal.verify_record(RATE_KEY, &unsigned, &tag)
            && rec.tokens.is_finite()
            && rec.per_minute == self.per_minute)
            .then_some(rec)
    }

    /// Takes a batch from the shared bucket: the tokens taken, or how long until there are
    /// enough.
    async fn take(&self, store: &kv::Store) -> Result<Result<f64, Duration>, String> {
        for _ in 0..16 {
            let entry = store.entry(RATE_KEY).await.map_err(|e| e.to_string())?;
            let now = now_ms();
            let (mut rec, revision) = match entry {
                Some(e) if e.operation == kv::Operation::Put => {
                    (self.decode(&e.value), Some(e.revision))
                }
                Some(e) => (None, Some(e.revision)),
                None => (None, None),
            };
            let stored = rec.take().map(|mut r| {
                let elapsed = (now.saturating_sub(r.at_ms)).max(0) as f64 / 1000.0;
                r.tokens =
                    (r.tokens + elapsed * f64::from(self.per_minute) / 60.0).min(self.capacity());
                r
            });
            let mut next = stored.unwrap_or(RateRecord {
                tokens: self.capacity(),
                at_ms: now,
                per_minute: self.per_minute,
                tag: String::new(),
            });
            next.at_ms = now;
            let want = self.batch.min(next.tokens.floor()).max(0.0);
            if want < 1.0 {
                let missing = 1.0 - next.tokens;
                return Ok(Err(Duration::from_secs_f64(
                    (missing * 60.0 / f64::from(self.per_minute)).max(0.005),
                )));
            }
            next.tokens -= want;
            let Some(bytes) = self.encode(&next) else {
                return Err("cannot encode the rate record".into());
            };
            let written = match revision {
                Some(r) => store
                    .update(RATE_KEY, bytes.into(), r)
                    .await
                    .map_err(|e| e.to_string()),
                None => store
                    .create(RATE_KEY, bytes.into())
                    .await
                    .map_err(|e| e.to_string()),
            };
            match written {
                Ok(_) => return Ok(Ok(want)),
                Err(e) if e.contains("wrong last sequence") || e.contains("key exists") => continue,
                Err(e) => return Err(e),
            }
        }
        // Lost every race: another replica is taking tokens as fast as they come.
        Ok(Err(Duration::from_millis(50)))
    }
}

impl Pacer for SharedBucket {
    fn admit<'a>(&'a self, _identity: &'a str) -> PaceFuture<'a> {
        Box::pin(async move {
            loop {
                let mut state = self.state.lock().await;
                if state.local >= 1.0 {
                    state.local -= 1.0;
                    return;
                }
                let taken = match self.store(&mut state).await {
                    Ok(store) => self.take(&store).await,
                    Err(e) => Err(e),
                };
                match taken {
                    Ok(Ok(n)) => {
                        state.local += n - 1.0;
                        return;
                    }
                    Ok(Err(wait)) => {
                        drop(state);
                        tokio::time::sleep(wait).await;
                    }
                    Err(e) => {
                        drop(state);
                        if !self.warned.swap(true, Ordering::Relaxed) {
                            warn!("max_per_minute: the shared rate in the fleet control bucket cannot be used ({e}); this replica paces itself alone at {}/min until it can", self.per_minute);
                        }
                        while let Err(wait) = self.fallback.try_take(Instant::now()) {
                            tokio::time::sleep(wait).await;
                        }
                        return;
                    }
                }
            }
        })
    }
}
