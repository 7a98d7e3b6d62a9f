//! Active-active (`active_active: true`): every replica provisions, coordinated through the
//! claims bucket on Choria Streams ([`choria_rpc_client::claims`]).
//!
//! - [`ReplicaClaims`] is the core's [`Claims`] over the bucket: a node is claimed before
//!   anything is sent to it. A node this replica is the first choice for is claimed with a
//!   create (one write); any other node is read first (one read) and claimed only when free.
//! - [`Spreader`] decides when a found node is queued: at once when this replica is its first
//!   choice (rendezvous hashing over the live replicas), after [`Spreader::takeover_after`]
//!   otherwise, so the replicas do not all chase the same node. Nodes held by another replica's
//!   unfinished claim, and nodes whose claim failed, are looked at again after a short delay,
//!   which is how a dead replica's nodes are taken over once its claims expire. Both waits are
//!   bounded by the work queue's size.
//! - [`keep_alive`] writes this replica's heartbeat and reads the live replicas every third of
//!   the claim lifetime; while the bucket does not answer, no new node is claimed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use choria_rpc_client::claims::{Claim, ClaimStats, ClaimStore};
use provision_core::claims::{ClaimFuture, ClaimOutcome, Claims, Ticket};
use provision_core::identity::escaped;
use provision_core::{AddResult, ClaimError, Config, Fleet, Source};
use provisioner_metrics::Metrics;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// How often the delayed nodes are looked at.
const TICK: Duration = Duration::from_millis(250);

/// The core's [`Claims`] over the bucket.
pub struct ReplicaClaims {
    store: ClaimStore,
    spreader: Arc<Spreader>,
}

impl ReplicaClaims {
    /// Claims in `store`; nodes to look at again go to `spreader`.
    pub fn new(store: ClaimStore, spreader: Arc<Spreader>) -> Self {
        ReplicaClaims { store, spreader }
    }
}

fn core_error(
    e: choria_rpc_client::claims::ClaimsError,
    identity: &str,
    action: &'static str,
) -> ClaimError {
    ClaimError {
        identity: identity.to_string(),
        action,
        detail: e.to_string(),
    }
}

impl Claims for ReplicaClaims {
    fn claim<'a>(&'a self, identity: &'a str) -> ClaimFuture<'a, Result<ClaimOutcome, ClaimError>> {
        Box::pin(async move {
            let first = self.store.first_choice(identity);
            let waited = self.spreader.take_released(identity);
            if !first && !waited {
                // Queued while this replica saw fewer replicas (at start): leave it to its
                // first choice for now, as if it had been found now.
                self.spreader.delay_takeover(identity);
                return Ok(ClaimOutcome::Taken {
                    by: "its first choice".to_string(),
                    done: false,
                });
            }
            match self.store.claim(identity, first).await {
                Ok(Claim::Won { key, revision }) => Ok(ClaimOutcome::Claimed(Ticket {
                    identity: identity.to_string(),
                    key,
                    revision,
                })),
                Ok(Claim::Taken { by, done }) => {
                    if !done {
                        // Look again later: if its holder dies, the claim expires and is ours.
                        self.spreader.again(identity);
                    }
                    Ok(ClaimOutcome::Taken { by, done })
                }
                Err(e) => {
                    self.spreader.again(identity);
                    Err(core_error(e, identity, "claim"))
                }
            }
        })
    }

    fn keep<'a>(&'a self, ticket: &'a mut Ticket) -> ClaimFuture<'a, Result<(), ClaimError>> {
        Box::pin(async move {
            ticket.revision = self
                .store
                .keep(&ticket.identity, &ticket.key, ticket.revision)
                .await
                .map_err(|e| core_error(e, &ticket.identity, "keep"))?;
            Ok(())
        })
    }

    fn done(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>> {
        Box::pin(async move {
            self.store
                .done(&ticket.identity, &ticket.key, ticket.revision)
                .await
                .map(|_| ())
                .map_err(|e| core_error(e, &ticket.identity, "done"))
        })
    }

    fn release(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>> {
        Box::pin(async move {
            self.store
                .release(&ticket.identity, &ticket.key, ticket.revision)
                .await
                .map_err(|e| core_error(e, &ticket.identity, "release"))
        })
    }

    fn keep_every(&self) -> Duration {
        self.store.keep_every()
    }
}

/// When found nodes are queued: at once for this replica's first choices, later for the rest.
pub struct Spreader {
    store: ClaimStore,
    config: Arc<Config>,
    later: Mutex<HashMap<Arc<str>, (Instant, Source)>>,
    /// Nodes queued after their wait: claimed even when another replica is their first choice.
    released: Mutex<std::collections::HashSet<Arc<str>>>,
    capacity: usize,
    takeover_after: Duration,
    again_after: Duration,
}

impl Spreader {
    /// Spreading over `store`'s live replicas; at most the work queue's size of nodes wait.
    pub fn new(store: ClaimStore, config: Arc<Config>) -> Self {
        let lifetime = store.lifetime();
        Spreader {
            capacity: config.work_queue_size,
            config,
            later: Mutex::new(HashMap::new()),
            released: Mutex::new(std::collections::HashSet::new()),
            takeover_after: Self::takeover_after(lifetime),
            again_after: Self::again_after(lifetime),
            store,
        }
    }

    /// How long another replica's first choice waits before this one takes it: a third of the
    /// claim lifetime.
    pub fn takeover_after(lifetime: Duration) -> Duration {
        lifetime / 3
    }

    /// How long a node held by an unfinished claim (or whose claim failed) waits before it is
    /// looked at again: a sixth of the claim lifetime, at least a second.
    pub fn again_after(lifetime: Duration) -> Duration {
        (lifetime / 6).max(Duration::from_secs(1))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, (Instant, Source)>> {
        self.later.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A node found by discovery or an event: queued now when this replica is its first choice
    /// (or the identity is refused, which the fleet counts), else kept for later.
    pub fn offer<R, H, O, C>(
        &self,
        fleet: &Fleet<R, H, O, C>,
        identity: &str,
        source: Source,
    ) -> AddResult
    where
        R: provision_core::NodeRpc,
        H: provision_core::Helper,
        O: provision_core::Observer,
        C: provision_core::Clock,
    {
        if self.config.identity_rule.check(identity).is_err() || fleet.is_known(identity) {
            return fleet.add(identity, source);
        }
        if !self.store.healthy() {
            // Cut off from the bucket: nothing is claimed, so nothing is queued either.
            self.delay(identity, source, self.again_after);
        } else if self.store.first_choice(identity) {
            return fleet.add(identity, source);
        } else {
            self.delay(identity, source, self.takeover_after);
        }
        AddResult::Known
    }

    /// Whether `identity` was queued after waiting here (and forget it).
    pub fn take_released(&self, identity: &str) -> bool {
        self.released
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(identity)
    }

    /// Queue `identity` again after [`Self::takeover_after`], as another replica's first choice.
    pub fn delay_takeover(&self, identity: &str) {
        self.delay(identity, Source::Discovery, self.takeover_after);
    }

    /// Look at `identity` again after [`Self::again_after`].
    pub fn again(&self, identity: &str) {
        self.delay(identity, Source::Discovery, self.again_after);
    }

    fn delay(&self, identity: &str, source: Source, after: Duration) {
        let mut later = self.lock();
        if later.contains_key(identity) {
            return;
        }
        if later.len() >= self.capacity {
            debug!(
                "not keeping \"{}\" for later: {} nodes already wait; discovery finds it again",
                escaped(identity),
                later.len()
            );
            return;
        }
        later.insert(Arc::from(identity), (Instant::now() + after, source));
    }

    /// Queue the nodes whose time has come, every [`TICK`], until `shutdown`.
    pub async fn run<R, H, O, C>(
        self: Arc<Self>,
        fleet: Arc<Fleet<R, H, O, C>>,
        shutdown: CancellationToken,
    ) where
        R: provision_core::NodeRpc,
        H: provision_core::Helper,
        O: provision_core::Observer,
        C: provision_core::Clock,
    {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.cancelled() => return,
            }
            if !self.store.healthy() {
                // Nothing can be claimed: the nodes wait here, bounded, until the bucket answers.
                continue;
            }
            let now = Instant::now();
            let due: Vec<(Arc<str>, Source)> = {
                let mut later = self.lock();
                let due: Vec<(Arc<str>, Source)> = later
                    .iter()
                    .filter(|(_, (at, _))| *at <= now)
                    .map(|(id, (_, source))| (Arc::clone(id), *source))
                    .collect();
                for (id, _) in &due {
                    later.remove(id);
                }
                due
            };
            for (id, source) in due {
                {
                    let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
                    if released.len() < self.capacity {
                        released.insert(Arc::clone(&id));
                    }
                }
                // Already queued: that entry takes the mark when it is claimed.
                fleet.add(&id, source);
            }
        }
    }
}

/// Write the heartbeat and read the live replicas every third of the claim lifetime, logging
/// when the bucket stops or starts answering and when the replica count changes; copy the
/// store's counters into the metrics every second. Until `shutdown`.
pub async fn keep_alive(store: ClaimStore, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    let every = store.keep_every();
    let mut next_beat = Instant::now();
    let mut healthy = true;
    let mut replicas = 0usize;
    let mut seen = ClaimStats::default();
    loop {
        if Instant::now() >= next_beat {
            next_beat = Instant::now() + every;
            match store.heartbeat().await {
                Ok(n) => {
                    if !healthy {
                        info!(
                            "claims bucket {} answers again: taking new nodes",
                            store.bucket()
                        );
                    }
                    healthy = true;
                    if n != replicas {
                        info!(
                            "{n} active-active replicas live in claims bucket {}",
                            store.bucket()
                        );
                        replicas = n;
                    }
                }
                Err(e) => {
                    if healthy {
                        error!(
                            "claims bucket unreachable, taking no new node until it answers: {e}"
                        );
                    } else {
                        warn!("claims bucket still unreachable: {e}");
                    }
                    healthy = false;
                    replicas = 1;
                }
            }
        }
        let now = store.stats();
        metrics
            .claim_operations
            .inc_by(now.node_operations.saturating_sub(seen.node_operations));
        metrics
            .active_replicas
            .set(i64::try_from(now.live_replicas).unwrap_or(i64::MAX));
        seen = now;
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1).min(every)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}
