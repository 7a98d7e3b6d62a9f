//! Active-active (`active_active: true`): every replica provisions, coordinated through the
//! claims bucket on Choria Streams ([`choria_rpc_client::claims`]).
//!
//! - The fleet is split by rendezvous hashing over the live replicas: a replica provisions only
//!   the nodes it is the first choice for, so the replicas never chase the same node and each
//!   node costs one create to claim. A replica that falls behind keeps its share (its queue
//!   bounds it); nothing is taken from a live replica.
//! - [`ReplicaClaims`] is the core's [`Claims`] over the bucket: a node is claimed before
//!   anything is sent to it, which settles the moments when two replicas' views of the live set
//!   differ (one joining or leaving): the server accepts one create.
//! - [`Spreader`] holds the found nodes that are another replica's, for one claim lifetime
//!   (a sighting older than that may be a node its owner finished, whose done mark has aged
//!   out), and queues those that become this replica's when the live set changes. Nodes held by
//!   another replica's unfinished claim, and nodes whose claim failed, are looked at again
//!   after a short delay, which is how a dead replica's claims are taken over once they expire.
//! - [`keep_alive`] writes this replica's heartbeat every third of the claim lifetime and reads
//!   the live replicas every second; while the bucket does not answer, no new node is claimed. When a
//!   replica leaves the live set, a discovery is asked for at once, so its unfinished share is
//!   found fresh by the survivors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::claims::{Claim, ClaimStats, ClaimStore};
use provision_core::claims::{ClaimFuture, ClaimOutcome, Claims, Ticket};
use provision_core::identity::escaped;
use provision_core::{AddResult, ClaimError, Fleet, Source};

use crate::config::Config;
use provisioner_metrics::Metrics;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

/// The seal of the claims bucket's values: `claims_secret_file` when set, else the provisioners'
/// broker password (which every replica has and no node does), else none.
pub fn seal(config: &Config) -> Result<fleet_lifecycle::seal::Seal, crate::Error> {
    if !config.claims_secret_file.is_empty() {
        let secret = std::fs::read(&config.claims_secret_file).map_err(|e| {
            crate::Error::file("read", "claims_secret_file", &config.claims_secret_file, e)
        })?;
        let secret = secret.trim_ascii();
        if secret.is_empty() {
            return Err(crate::Error::EmptyFile {
                what: "claims_secret_file",
                path: config.claims_secret_file.clone().into(),
            });
        }
        return Ok(fleet_lifecycle::seal::Seal::with_secret(secret));
    }
    if !config.broker_provisioning_password.is_empty() {
        return Ok(fleet_lifecycle::seal::Seal::with_secret(
            config.broker_provisioning_password.as_bytes(),
        ));
    }
    Ok(fleet_lifecycle::seal::Seal::none())
}

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

fn core_error(e: crate::claims::ClaimsError, identity: &str, action: &'static str) -> ClaimError {
    ClaimError {
        identity: identity.to_string(),
        action,
        detail: e.to_string(),
    }
}

impl Claims for ReplicaClaims {
    fn claim<'a>(&'a self, identity: &'a str) -> ClaimFuture<'a, Result<ClaimOutcome, ClaimError>> {
        Box::pin(async move {
            if !self.store.first_choice(identity) {
                // Queued before the live set changed: the node is another replica's now. Keep
                // it in case the set changes back within the claim lifetime.
                self.spreader.hold(identity, Source::Discovery);
                return Ok(ClaimOutcome::Taken {
                    by: "its first choice".to_string(),
                    done: false,
                });
            }
            match self.store.claim(identity, true).await {
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

/// One node waiting in the spreader.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    source: Source,
    /// When it may be queued (if it is ours then); `None`: when the live set makes it ours.
    due: Option<Instant>,
    /// When the sighting is too old to act on.
    expires: Instant,
}

/// Which found nodes are queued: this replica's share at once, the rest held for a lifetime.
pub struct Spreader {
    store: ClaimStore,
    config: Arc<Config>,
    waiting: Mutex<HashMap<Arc<str>, Waiting>>,
    capacity: usize,
    lifetime: Duration,
    again_after: Duration,
}

impl Spreader {
    /// Spreading over `store`'s live replicas; at most the work queue's size of nodes wait.
    pub fn new(store: ClaimStore, config: Arc<Config>) -> Self {
        let lifetime = store.lifetime();
        Spreader {
            capacity: config.work_queue_size,
            config,
            waiting: Mutex::new(HashMap::new()),
            lifetime,
            again_after: Self::again_after(lifetime),
            store,
        }
    }

    /// How long a node held by an unfinished claim (or whose claim failed) waits before it is
    /// looked at again: a sixth of the claim lifetime, at least a second.
    pub fn again_after(lifetime: Duration) -> Duration {
        (lifetime / 6).max(Duration::from_secs(1))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A node found by discovery or an event: queued now when it is this replica's share (or
    /// the identity is refused, which the fleet counts), else held for a claim lifetime.
    pub fn offer(&self, fleet: &Fleet, identity: &str, source: Source) -> AddResult {
        if self
            .config
            .provision
            .identity_rule()
            .check(identity)
            .is_err()
            || fleet.is_known(identity)
        {
            return fleet.add(identity, source);
        }
        if !self.store.healthy() {
            // Cut off from the bucket: nothing is claimed, so nothing is queued either; the
            // node is looked at again as soon as the bucket answers.
            self.hold(identity, source);
        } else if self.store.first_choice(identity) {
            self.lock().remove(identity);
            return fleet.add(identity, source);
        } else {
            self.hold(identity, source);
        }
        AddResult::Known
    }

    /// Hold `identity`, another replica's share, until the live set makes it ours or the
    /// sighting ages out.
    pub fn hold(&self, identity: &str, source: Source) {
        self.keep(identity, source, None);
    }

    /// Look at `identity` again after [`Self::again_after`].
    pub fn again(&self, identity: &str) {
        self.keep(
            identity,
            Source::Discovery,
            Some(Instant::now() + self.again_after),
        );
    }

    fn keep(&self, identity: &str, source: Source, due: Option<Instant>) {
        let now = Instant::now();
        let waiting = Waiting {
            source,
            due,
            expires: now + self.lifetime + due.map_or(Duration::ZERO, |d| d - now),
        };
        let mut map = self.lock();
        if let Some(w) = map.get_mut(identity) {
            // A fresh sighting replaces the earlier one; a pending look keeps its time.
            *w = Waiting {
                due: w.due.or(waiting.due),
                ..waiting
            };
            return;
        }
        if map.len() >= self.capacity {
            debug!(
                "not holding \"{}\": {} nodes already wait; discovery finds it again",
                escaped(identity),
                map.len()
            );
            return;
        }
        map.insert(Arc::from(identity), waiting);
    }

    /// Every [`TICK`] until `shutdown`: forget sightings that aged out, and queue the waiting
    /// nodes that are this replica's share now (those due, and all of them after the live set
    /// changed).
    pub async fn run(self: Arc<Self>, fleet: Arc<Fleet>, shutdown: CancellationToken) {
        let mut seen_live = Vec::new();
        let mut was_healthy = true;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = shutdown.cancelled() => return,
            }
            if !self.store.healthy() {
                // Nothing can be claimed: the nodes wait here, bounded, until the bucket answers.
                was_healthy = false;
                continue;
            }
            let live = self.store.live();
            // Back from an outage, or a replica joined or left: every waiting node is looked at.
            let changed = live != seen_live || !was_healthy;
            seen_live = live;
            was_healthy = true;
            let now = Instant::now();
            let ours: Vec<(Arc<str>, Source)> = {
                let mut map = self.lock();
                map.retain(|_, w| w.expires > now);
                let ours: Vec<(Arc<str>, Source)> = map
                    .iter()
                    .filter(|(_, w)| changed || w.due.is_some_and(|d| d <= now))
                    .filter(|(id, _)| self.store.first_choice(id))
                    .map(|(id, w)| (Arc::clone(id), w.source))
                    .collect();
                for (id, _) in &ours {
                    map.remove(id);
                }
                // Looked at and still another replica's: wait for the live set to change.
                for w in map.values_mut() {
                    if w.due.is_some_and(|d| d <= now) {
                        w.due = None;
                    }
                }
                ours
            };
            for (id, source) in ours {
                fleet.add(&id, source);
            }
        }
    }
}

/// Write the heartbeat every third of the claim lifetime and read the live replicas every
/// second, logging
/// when the bucket stops or starts answering and when the replica count changes, and asking
/// `discover_now` for a discovery when a replica left (its unfinished share is ours to find);
/// copy the store's counters into the metrics every second. Until `shutdown`.
pub async fn keep_alive(
    store: ClaimStore,
    metrics: Arc<Metrics>,
    discover_now: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let every = store.keep_every();
    let mut next_beat = Instant::now();
    let mut healthy = true;
    let mut replicas = 0usize;
    let mut members: Vec<String> = Vec::new();
    let mut seen = ClaimStats::default();
    loop {
        if Instant::now() >= next_beat {
            next_beat = Instant::now() + every;
            match store.heartbeat().await {
                Ok(_) => {
                    if !healthy {
                        info!(
                            "claims bucket {} answers again: taking new nodes",
                            store.bucket()
                        );
                    }
                    healthy = true;
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
                    // Cut off: try again every second rather than every third of the lifetime.
                    next_beat = Instant::now() + Duration::from_secs(1).min(every);
                }
            }
        } else if healthy {
            // Between heartbeats the live set is read every second: a replica that joins
            // is given its share, and one that left is noticed, within a second.
            if let Err(e) = store.refresh().await {
                debug!("{e}");
            }
        }
        if healthy {
            let live = store.live();
            let left = members.iter().filter(|m| !live.contains(m)).count();
            if left > 0 {
                info!(
                    "{left} active-active replicas left claims bucket {}: discovering their unfinished nodes",
                    store.bucket()
                );
                discover_now.notify_one();
            }
            if live.len() != replicas {
                info!(
                    "{} active-active replicas live in claims bucket {}",
                    live.len(),
                    store.bucket()
                );
                replicas = live.len();
            }
            members = live;
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
