//! The work queue and host table (the Go `hosts` package): nodes come in from discovery and
//! startup events, wait in a bounded queue, are provisioned by a pool of workers, and are held
//! for a while after success so their restart does not queue them again.
//!
//! Anyone holding a provisioning JWT can publish startup events, so the queue keeps two lanes:
//! nodes found by discovery, and nodes that only announced themselves. The event lane may hold
//! at most half the queue and keep at most half the workers busy, and workers take from the two
//! lanes in turn, so a flood of bogus startup events can slow other announced nodes but never
//! starve the nodes discovery found. The event lane's share of the workers is halved each time
//! one of its nodes leaves its first request unanswered until the timeout and grows by one for
//! each that answers, so a flood of names that something subscribes to but nothing answers ends
//! up holding a single worker (names nothing serves fail at once and cost nothing). An announced node that discovery also finds moves to the
//! discovery lane. Every identity is checked ([`crate::identity`]) before it is queued.
//!
//! An announced node that answered but whose cycle failed for a reason that may pass (an RPC
//! failure, a helper error or deferral) is kept and tried again after a backoff, until
//! discovery finds it again or it has had [`ANNOUNCED_TRIES`] tries: a node that no discovery
//! reaches is not left to a single try. A node that never answered is not kept (anyone can
//! announce names by the thousand).

use std::collections::hash_map::RandomState;
use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info};

use crate::events::{NodeEvent, Verdict};
use crate::identity::{escaped, IdentityError, LogSummary};
use crate::observer::Observer;
use crate::provision::{Host, Outcome, ProvisionErrorKind, Provisioner};

mod names;
mod table;

use names::{Name, NameQueue, Names};
use table::{After, Entry, State, Table};

/// The work queue's default capacity (`work_queue_size`). The Go provisioner stops at 50,000;
/// a waiting node costs a few hundred bytes here, so a quarter of a million nodes announcing
/// themselves at once still fits in a bounded queue.
pub const DEFAULT_QUEUE_CAPACITY: usize = 250_000;

/// Nodes found by discovery while the work queue is full wait in a backlog of identities (tens
/// of bytes a node) up to this many times the queue's capacity, and move into the queue as it
/// drains, so a fleet larger than the queue is provisioned without waiting an interval for the
/// next discovery. Each discovery replaces the backlog with what it found.
pub const BACKLOG_FACTOR: usize = 4;

/// How long a provisioned or shut-down node stays known.
pub const SUCCESS_HOLD: Duration = Duration::from_secs(60);

/// How long a node whose lock another provisioner holds is left alone (go-choria's lock time).
pub const LOCK_HOLD: Duration = Duration::from_secs(120);

/// How many tries an announced node that discovery does not find again gets before it is
/// forgotten.
pub const ANNOUNCED_TRIES: u8 = 5;

/// The wait before an announced node's second try; it doubles for every further try, at most
/// one discovery interval.
pub const ANNOUNCED_RETRY: Duration = Duration::from_secs(30);

/// Where a node came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// Broadcast discovery.
    Discovery,
    /// A startup lifecycle event.
    Event,
}

impl Source {
    /// The source's name in the status API and the audit trail: `discovery` or `event`.
    pub const fn name(self) -> &'static str {
        match self {
            Source::Discovery => "discovery",
            Source::Event => "event",
        }
    }

    /// How the source is named in log lines.
    pub const fn label(self) -> &'static str {
        match self {
            Source::Discovery => "discovery",
            Source::Event => "a startup event",
        }
    }
}

/// One busy worker, counted (and the gauge set) until dropped, also when its cycle is abandoned
/// at shutdown.
struct Busy<'a> {
    count: &'a AtomicUsize,
    observer: &'a dyn Observer,
}

impl<'a> Busy<'a> {
    fn enter(count: &'a AtomicUsize, observer: &'a dyn Observer) -> Self {
        observer.busy_workers(count.fetch_add(1, Ordering::Relaxed) + 1);
        Busy { count, observer }
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.observer
            .busy_workers(self.count.fetch_sub(1, Ordering::Relaxed).saturating_sub(1));
    }
}

/// What [`Fleet::add`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AddResult {
    /// Queued for provisioning.
    Queued,
    /// Already known (queued within the interval, being provisioned, or held).
    Known,
    /// Found by discovery while the queue is full: kept in the discovery backlog and queued
    /// as the queue drains ([`BACKLOG_FACTOR`]).
    Backlogged,
    /// The queue (and for discovery, the backlog) is full; the node was dropped and will be
    /// found by a later discovery.
    QueueFull,
    /// The identity is not valid; nothing is done for it.
    Refused(IdentityError),
    /// Provisioning is paused (or the fleet is draining for shutdown): nothing is queued.
    Paused,
}

/// The host table, the work queue and the workers that drain it.
pub struct Fleet {
    provisioner: Arc<Provisioner>,
    table: Mutex<Table>,
    wake: Notify,
    capacity: usize,
    busy: AtomicUsize,
    /// The cycles in flight, one token each, taken with the node off the queue.
    in_flight: TaskTracker,
    /// How many workers may be busy with announced-only nodes at once (half of them).
    event_workers: AtomicUsize,
    /// How many of those they may keep busy now: halved each time an announced node leaves its
    /// first request unanswered until the timeout, one more for each that answers. A flood of announcements of
    /// nodes that do not exist ends up holding one worker, while a storm of real restarts
    /// earns its half back.
    event_allowance: AtomicUsize,
    refusals: LogSummary,
    full: LogSummary,
    unanswered: LogSummary,
    unclaimed: LogSummary,
    backlogged: LogSummary,
}

impl Fleet {
    /// A fleet with the default queue capacity.
    pub fn new(provisioner: Provisioner) -> Arc<Self> {
        Self::with_capacity(provisioner, DEFAULT_QUEUE_CAPACITY)
    }

    /// A fleet whose queue holds at most `capacity` nodes.
    pub fn with_capacity(provisioner: Provisioner, capacity: usize) -> Arc<Self> {
        Arc::new(Fleet {
            provisioner: Arc::new(provisioner),
            table: Mutex::new(Table::default()),
            wake: Notify::new(),
            capacity,
            busy: AtomicUsize::new(0),
            in_flight: TaskTracker::new(),
            event_workers: AtomicUsize::new(1),
            event_allowance: AtomicUsize::new(1),
            refusals: LogSummary::new("node identities refused"),
            full: LogSummary::new("nodes dropped from a full work queue"),
            unanswered: LogSummary::new("announced nodes that no server serves (no responders)"),
            unclaimed: LogSummary::new("nodes not started because their claim failed"),
            backlogged: LogSummary::new(
                "discovered nodes kept in the discovery backlog of a full work queue",
            ),
        })
    }

    /// The provisioner the workers run.
    pub fn provisioner(&self) -> &Provisioner {
        &self.provisioner
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the table inconsistent in a way that
        // matters more than stopping provisioning, so a poisoned lock is used as is.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn report(&self, t: &Table) {
        let o = self.provisioner.observer();
        o.work_queue_entries(t.queued());
        o.waiting_nodes(t.len + t.backlog.len());
    }

    /// Queues `identity` unless it is already known or not a valid identity. A node still
    /// waiting in its lane is renewed in place (its wait counts from now) and is
    /// [`AddResult::Known`]; a node being provisioned or held after success is never queued
    /// twice. An announced node still waiting that discovery now finds moves to the discovery
    /// lane.
    ///
    /// An invalid identity is refused (counted by [`Observer::invalid_identity`], logged escaped
    /// in a bounded summary) and never queued. Nothing is queued (or counted) while provisioning
    /// is paused or the fleet is draining: [`AddResult::Paused`].
    pub fn add(&self, identity: &str, source: Source) -> AddResult {
        if self.provisioner.pause_state().paused() {
            // The Go provisioner warns for every event while paused; announcements can come by
            // the thousand, so here it is a debug line (the paused gauge and the election's own
            // lines say that provisioning is paused).
            match source {
                Source::Event => debug!(
                    "Skipping event processing while paused: \"{}\"",
                    escaped(identity)
                ),
                Source::Discovery => debug!(
                    "ignoring \"{}\" from {} while paused",
                    escaped(identity),
                    source.label()
                ),
            }
            return AddResult::Paused;
        }
        if let Err(why) = self.provisioner.config().identity_rule().check(identity) {
            self.provisioner.observer().invalid_identity();
            self.refusals.record(|| {
                format!(
                    "refusing node identity \"{}\" from {}: {why}",
                    escaped(identity),
                    source.label()
                )
            });
            return AddResult::Refused(why);
        }
        let mut t = self.lock();
        if t.draining {
            return AddResult::Paused;
        }
        let now = t.clock.stamp(Instant::now());
        let mut promote = false;
        if let Some(e) = t.get_mut(identity) {
            // Found again while it waits in its lane: renewed in place, silently (it keeps its
            // place, so a full queue does not matter, and its wait counts from now, so a queue
            // longer than two intervals of work does not drop a node that still answers).
            if e.state == State::Queued && e.lane == source {
                e.time = now;
                return AddResult::Known;
            }
            let known = match e.state {
                State::Working => true,
                State::Held => e.time > now,
                // A discovered node's startup event does not move it to the event lane.
                State::Queued => e.lane == Source::Discovery && source == Source::Event,
                // A node waiting for its next try is queued at once when discovery finds it or
                // it announces itself again (a restarted server).
                State::Retry => false,
            };
            promote =
                e.state == State::Queued && e.lane == Source::Event && source == Source::Discovery;
            if known && !promote {
                return AddResult::Known;
            }
        }
        let lane_cap = match source {
            Source::Discovery => self.capacity,
            Source::Event => (self.capacity / 2).max(1),
        };
        if !promote && (t.queued() >= self.capacity || t.live(source) >= lane_cap) {
            let (queued, capacity) = (t.queued(), self.capacity);
            let backlog_cap = self.capacity.saturating_mul(BACKLOG_FACTOR);
            if source == Source::Discovery && t.backlog.len() < backlog_cap {
                t.backlog.push_back(identity);
                let backlog = t.backlog.len();
                self.report(&t);
                drop(t);
                self.backlogged.record(|| {
                    format!(
                        "The work queue is full with {queued} / {capacity} entries: {identity} \
                         waits in the discovery backlog ({backlog} nodes) and is queued as \
                         the queue drains"
                    )
                });
                let o = self.provisioner.observer();
                o.discovered();
                o.node_event(identity, &NodeEvent::Queued { source });
                return AddResult::Backlogged;
            }
            self.report(&t);
            drop(t);
            self.full.record(|| {
                format!(
                    "Adding host to work queue failed with {queued} / {capacity} entries: \
                     {identity} dropped, found again by a later discovery"
                )
            });
            return AddResult::QueueFull;
        }
        t.next_generation = t.next_generation.wrapping_add(1);
        let generation = t.next_generation;
        // A promoted node keeps the time it was first announced (staleness counts from then).
        let (added, replaced) = match t.get(identity) {
            Some(e) if promote => (e.time, Some(e.lane)),
            _ => (now, None),
        };
        if let Some(lane) = replaced {
            t.retire(lane);
        }
        let slot = t.set(
            identity,
            Entry {
                time: added,
                generation,
                state: State::Queued,
                lane: source,
                tries: 0,
            },
        );
        t.lane(source).push_back((slot, generation));
        let queued = t.queued();
        self.report(&t);
        drop(t);
        if promote {
            debug!(
                "{identity} was announced and is now discovered, moving it to the discovery lane"
            );
            self.wake.notify_one();
            return AddResult::Known;
        }
        // Announced-only nodes are logged at debug: anyone with a provisioning JWT can announce
        // thousands of them.
        match source {
            Source::Discovery => {
                info!("Adding {identity} to the work queue with {queued} entries")
            }
            Source::Event => {
                debug!("Adding {identity} to the work queue with {queued} entries")
            }
        }
        let o = self.provisioner.observer();
        match source {
            Source::Discovery => {
                o.discovered();
                o.node_event(identity, &NodeEvent::Queued { source });
            }
            // A node known only from its announcement is recorded when a worker starts it:
            // anyone can announce names by the million, and recording each as it is queued
            // would push the real fleet out of the bounded node history.
            Source::Event => o.event_discovered(),
        }
        self.wake.notify_one();
        AddResult::Queued
    }

    /// A new discovery's nodes are about to be added: the backlog of the previous one is
    /// dropped (every node in it that still waits has answered the new discovery too).
    pub fn new_discovery(&self) {
        let mut t = self.lock();
        t.end_backlog();
        self.report(&t);
    }

    /// Nodes waiting in the discovery backlog (found while the queue was full).
    pub fn backlog(&self) -> usize {
        self.lock().backlog.len()
    }

    /// Forgets `identity`.
    pub fn remove(&self, identity: &str) {
        let mut t = self.lock();
        if let Some(e) = t.remove(identity) {
            if e.state == State::Queued {
                t.retire(e.lane);
            }
        }
        self.report(&t);
    }

    /// Forgets every node and empties the queue (on loss of leadership).
    pub fn clear(&self) {
        let mut t = self.lock();
        Self::forget_all(&mut t);
        self.report(&t);
    }

    fn forget_all(t: &mut Table) {
        t.clear();
    }

    /// Nodes being provisioned right now.
    pub fn busy(&self) -> usize {
        self.busy.load(Ordering::Relaxed)
    }

    /// Stops provisioning for shutdown and lets the nodes in flight finish: empties the queue
    /// and the host table (from now on nothing is queued or started, [`Fleet::add`] answers
    /// [`AddResult::Paused`]), then waits until every cycle in flight has ended, `grace` has
    /// passed or `force` is cancelled, whichever comes first. Returns how many cycles were
    /// still in flight; they end when the token given to [`Fleet::run`] is cancelled, and the
    /// nodes are found again by a later discovery.
    ///
    /// Pausing instead would make every cycle in flight fail at its next step, which is an
    /// abort rather than a drain.
    pub async fn drain(&self, grace: Duration, force: &CancellationToken) -> usize {
        {
            let mut t = self.lock();
            t.draining = true;
            Self::forget_all(&mut t);
            self.report(&t);
        }
        // Every node taken off the queue took its token under the table's lock, so once the
        // queue is closed above the tracker counts every cycle that can still run.
        self.in_flight.close();
        tokio::select! {
            _ = self.in_flight.wait() => {}
            _ = tokio::time::sleep(grace) => {}
            _ = force.cancelled() => {}
        }
        self.in_flight.len()
    }

    /// Nodes in the host table.
    pub fn known(&self) -> usize {
        self.lock().len
    }

    /// Entries in the work queue (both lanes).
    pub fn queued(&self) -> usize {
        self.lock().queued()
    }

    /// How long the oldest node still waiting in the event lane has waited (`None` when the
    /// lane is empty): a long wait means announced nodes are not being taken fast enough.
    pub fn announced_oldest_wait(&self) -> Option<Duration> {
        let t = self.lock();
        t.announced
            .iter()
            .find(|&&ticket| t.current(ticket))
            .and_then(|&(slot, _)| t.slot(slot))
            .map(|x| t.clock.at(x.entry.time).elapsed())
    }

    /// Entries waiting in the event lane (nodes only known from startup events).
    pub fn announced_backlog(&self) -> usize {
        self.lock().live(Source::Event)
    }

    /// Whether `identity` is in the host table.
    pub fn is_known(&self, identity: &str) -> bool {
        self.lock().find(identity).is_some()
    }

    /// Takes the next current entry off the queue, marking it as being worked on, with the
    /// token that counts its cycle as in flight. Entries of replaced or removed nodes are
    /// skipped; a node that has waited more than two intervals is dropped (counted as a failed
    /// node and logged, as go-choria does) and found again by a later discovery. The lanes take
    /// turns; the event lane is skipped while half the workers are busy with announced-only
    /// nodes. Nothing is taken while draining.
    fn next(&self) -> Option<(Host, TaskTrackerToken)> {
        let mut stale = Vec::new();
        let next = self.take_next(&mut stale);
        let o = self.provisioner.observer();
        for (identity, waited, lane) in stale {
            o.provision_error();
            let kind = ProvisionErrorKind::Stale(waited);
            error!(identity = %identity, "Could not provision {identity}: {kind}");
            o.node_event(
                &identity,
                &NodeEvent::Finished(&Verdict::stale(lane, waited)),
            );
        }
        next
    }

    fn take_next(
        &self,
        stale: &mut Vec<(Arc<str>, Duration, Source)>,
    ) -> Option<(Host, TaskTrackerToken)> {
        let mut t = self.lock();
        if t.draining {
            return None;
        }
        let now = Instant::now();
        let clock = t.clock;
        t.refill(self.capacity, now);
        let max_wait = self.provisioner.config().interval() * 2;
        let event_workers = self.event_allowance.load(Ordering::Relaxed);
        let order = if t.event_turn {
            [Source::Event, Source::Discovery]
        } else {
            [Source::Discovery, Source::Event]
        };
        t.event_turn = !t.event_turn;
        for lane in order {
            if lane == Source::Event && t.event_busy >= event_workers {
                continue;
            }
            while let Some(ticket) = t.lane(lane).pop_front() {
                if !t.current(ticket) {
                    let n = t.stale(lane);
                    *n = n.saturating_sub(1);
                    continue;
                }
                let Some(x) = t.slots[ticket.0 as usize].as_mut() else {
                    continue;
                };
                let added = clock.at(x.entry.time);
                let waited = now.duration_since(added);
                if waited > max_wait {
                    let id = t.name(ticket.0).map(Arc::from);
                    if let (Some(id), Some(_)) = (id, t.remove_slot(ticket.0)) {
                        stale.push((id, waited, lane));
                    }
                    continue;
                }
                x.entry.state = State::Working;
                let name = x.name;
                let id: Arc<str> = Arc::from(t.names.get(name));
                if lane == Source::Event {
                    t.event_busy += 1;
                }
                self.report(&t);
                let token = self.in_flight.token();
                return Some((Host::new(id, added).found_by(lane), token));
            }
        }
        self.report(&t);
        None
    }

    fn finish(&self, identity: &str, source: Source, after: After) {
        let mut t = self.lock();
        if source == Source::Event {
            t.event_busy = t.event_busy.saturating_sub(1);
        }
        let interval = self.provisioner.config().interval();
        let clock = t.clock;
        let mut retry = None;
        let mut held = false;
        if let Some(e) = t.get_mut(identity) {
            if e.state == State::Working {
                match after {
                    After::Hold(d) => {
                        e.state = State::Held;
                        e.time = clock.stamp(Instant::now() + d);
                        held = true;
                    }
                    After::Retry if e.tries + 1 < ANNOUNCED_TRIES => {
                        e.tries += 1;
                        let wait = ANNOUNCED_RETRY
                            .saturating_mul(1 << (e.tries - 1))
                            .min(interval.max(ANNOUNCED_RETRY));
                        e.state = State::Retry;
                        e.time = clock.stamp(Instant::now() + wait);
                        retry = Some((e.tries, wait));
                    }
                    After::Retry | After::Forget => {
                        t.remove(identity);
                    }
                }
            }
        }
        if held {
            t.remember_done(identity);
        }
        if let Some((tries, wait)) = retry {
            debug!(
                identity = %identity,
                "{identity} was announced by a startup event and not found by discovery: trying it again in {wait:?} (try {} of {ANNOUNCED_TRIES})",
                tries + 1
            );
        }
        let more_events = source == Source::Event && t.live(Source::Event) > 0;
        self.report(&t);
        drop(t);
        if more_events {
            // A worker may have skipped the event lane while it was at its share.
            self.wake.notify_one();
        }
    }

    /// Drops held entries whose time is up.
    fn sweep(&self) {
        let mut t = self.lock();
        let now = t.clock.stamp(Instant::now());
        let mut due = Vec::new();
        let mut over = Vec::new();
        for (s, x) in t.slots.iter().enumerate() {
            let Some(x) = x else { continue };
            match x.entry.state {
                State::Held if x.entry.time <= now => over.push(s as u32),
                State::Retry if x.entry.time <= now => due.push(s as u32),
                _ => {}
            }
        }
        for s in over {
            t.remove_slot(s);
        }
        // Announced nodes whose next try is due go back to the event lane while it has room;
        // the rest are forgotten (discovery finds a real node again).
        let lane_cap = (self.capacity / 2).max(1);
        let mut requeued = Vec::new();
        for s in due {
            let room =
                !t.draining && t.queued() < self.capacity && t.live(Source::Event) < lane_cap;
            if !room {
                t.remove_slot(s);
                continue;
            }
            t.next_generation = t.next_generation.wrapping_add(1);
            let generation = t.next_generation;
            if let Some(x) = t.slots[s as usize].as_mut() {
                x.entry.state = State::Queued;
                x.entry.time = now;
                x.entry.generation = generation;
                x.entry.lane = Source::Event;
                let name = x.name;
                requeued.push(Arc::<str>::from(t.names.get(name)));
            }
            t.announced.push_back((s, generation));
        }
        self.report(&t);
        drop(t);
        let o = self.provisioner.observer();
        for id in &requeued {
            o.node_event(
                id,
                &NodeEvent::Queued {
                    source: Source::Event,
                },
            );
            self.wake.notify_one();
        }
        self.refusals.flush();
        self.full.flush();
        self.unanswered.flush();
        self.unclaimed.flush();
        self.backlogged.flush();
    }

    /// Provisions `host`; `_in_flight` counts the cycle for [`Fleet::drain`] until it ends.
    async fn work_one(&self, mut host: Host, _in_flight: TaskTrackerToken) {
        let o = self.provisioner.observer();
        // Announced-only nodes at debug, as when they are queued.
        match host.source() {
            Source::Discovery => info!(
                identity = host.identity(),
                "Provisioning {}",
                host.identity()
            ),
            Source::Event => debug!(
                identity = host.identity(),
                "Provisioning {}",
                host.identity()
            ),
        }
        o.node_event(
            host.identity(),
            &NodeEvent::Started {
                source: host.source(),
            },
        );
        let busy = Busy::enter(&self.busy, o);
        let began = Instant::now();
        let res = self.provisioner.provision(&mut host).await;
        drop(busy);
        let verdict = Verdict::of(&res, &host, began.elapsed());
        let id = host.identity();
        let source = host.source();
        if source == Source::Event {
            // A node nothing serves fails at once and costs its worker nothing: only a first
            // request left unanswered until its timeout shrinks the lane.
            match &res {
                Err(e) if e.kind.is_unserved() => {}
                Err(e) if matches!(e.kind, ProvisionErrorKind::FirstContact(_)) => {
                    self.adapt_event_allowance(false)
                }
                _ => self.adapt_event_allowance(true),
            }
        }
        let after = match res {
            Ok(Outcome::Provisioned) | Ok(Outcome::ShutDown) => {
                o.provisioned();
                info!(identity = %id, "Provisioned {id}");
                After::Hold(SUCCESS_HOLD)
            }
            Ok(Outcome::Upgraded { from, to }) => {
                o.provisioned();
                info!(
                    identity = %id,
                    "Provisioned {id}: update from {} to {} requested, the node will be provisioned again when it restarts",
                    escaped(&from),
                    escaped(&to)
                );
                After::Forget
            }
            // Judged and left alone: not judged again until the hold is over.
            Ok(Outcome::DryRun { .. }) => After::Hold(SUCCESS_HOLD),
            // Waiting for an operator: forgotten, and found again by the next discovery or
            // startup event (by then it may be approved).
            Ok(Outcome::Pending { .. }) => After::Forget,
            Ok(Outcome::LockHeld { action }) => {
                o.lock_held();
                info!(identity = %id, "{action}: provisioning lock held by another provisioner, leaving {id} to it");
                After::Hold(LOCK_HOLD)
            }
            // Active-active: nothing was sent to the node. A finished one restarts; an
            // unfinished one is forgotten (the claims store decides when it is tried again).
            Ok(Outcome::ClaimedElsewhere { by, done }) => {
                o.claim_taken();
                debug!(identity = %id, "{id} is claimed by {}{}, leaving it", escaped(&by), if done { " (done)" } else { "" });
                if done {
                    After::Hold(SUCCESS_HOLD)
                } else {
                    After::Forget
                }
            }
            Err(e)
                if matches!(
                    e.kind,
                    ProvisionErrorKind::Claim(_) | ProvisionErrorKind::ClaimLost(_)
                ) =>
            {
                // A claims store that stops answering fails every node taken meanwhile.
                o.claim_error();
                self.unclaimed
                    .record(|| format!("Could not provision {id}: {}", e.kind));
                After::Forget
            }
            // Nothing at all serves an announced node's subject: no server of that name is
            // connected. Anyone can announce such nodes by the thousand, so these are
            // summarised; a node that is there but did not answer gets its own error line
            // (the event lane gives those one worker at a time once they pile up).
            Err(e) if source == Source::Event && e.kind.is_unserved() => {
                o.provision_error();
                self.unanswered
                    .record(|| format!("Could not provision {id}: {}", e.kind));
                After::Forget
            }
            Err(e) => {
                o.provision_error();
                error!(identity = %id, "Could not provision {id}: {}", e.kind);
                if source == Source::Event && e.kind.may_pass() {
                    After::Retry
                } else {
                    After::Forget
                }
            }
        };
        // Recorded before the node may be queued again.
        o.node_event(id, &NodeEvent::Finished(&verdict));
        self.finish(id, source, after);
    }

    /// Halve the announced lane's workers when one of its nodes left its first request
    /// unanswered until the timeout, or give it one more (up to half the workers) when one
    /// answered.
    fn adapt_event_allowance(&self, answered: bool) {
        let max = self.event_workers.load(Ordering::Relaxed);
        let _ = self
            .event_allowance
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(if answered {
                    (n + 1).min(max)
                } else {
                    (n / 2).max(1)
                })
            });
    }

    /// How many workers announced-only nodes may keep busy now (see the module
    /// documentation): half the workers at most, one at least.
    pub fn event_workers(&self) -> usize {
        self.event_allowance.load(Ordering::Relaxed)
    }

    /// Runs `workers` workers, the hold sweeper and the paused-gauge follower until `shutdown`
    /// is cancelled; in-flight
    /// cycles are abandoned at that point (the nodes are found again by a later discovery).
    pub async fn run(self: Arc<Self>, workers: usize, shutdown: CancellationToken) {
        let half = (workers.max(1) / 2).max(1);
        self.event_workers.store(half, Ordering::Relaxed);
        self.event_allowance.store(half, Ordering::Relaxed);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..workers.max(1) {
            let fleet = self.clone();
            let stop = shutdown.clone();
            set.spawn(async move {
                let mut pause = fleet.provisioner.pause_state().subscribe();
                loop {
                    // While paused, nodes stay queued rather than failing one by one; those that
                    // wait too long are dropped as they leave the queue once provisioning resumes.
                    if *pause.borrow_and_update() {
                        tokio::select! {
                            _ = pause.wait_for(|p| !*p) => {}
                            _ = stop.cancelled() => return,
                        }
                        continue;
                    }
                    let notified = fleet.wake.notified();
                    tokio::pin!(notified);
                    notified.as_mut().enable();
                    if let Some((host, in_flight)) = fleet.next() {
                        // Another worker may be waiting too; pass the wake-up along.
                        fleet.wake.notify_one();
                        tokio::select! {
                            _ = fleet.work_one(host, in_flight) => {}
                            _ = stop.cancelled() => return,
                        }
                        continue;
                    }
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = stop.cancelled() => return,
                    }
                }
            });
        }
        // The paused gauge follows the pause state.
        let fleet = self.clone();
        let stop = shutdown.clone();
        set.spawn(async move {
            let mut rx = fleet.provisioner.pause_state().subscribe();
            loop {
                let paused = *rx.borrow_and_update();
                fleet.provisioner.observer().paused(paused);
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    _ = stop.cancelled() => return,
                }
            }
        });
        let fleet = self.clone();
        let stop = shutdown.clone();
        set.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => fleet.sweep(),
                    _ = stop.cancelled() => return,
                }
            }
        });
        while set.join_next().await.is_some() {}
    }
}

#[cfg(test)]
mod tests {
    use super::table::{Clock, Slot};
    use super::*;

    #[test]
    fn a_slot_is_twenty_four_bytes() {
        // A million waiting nodes: 24 MB of slots (32 when an entry's time was an `Instant`,
        // 40 when each slot held a pointer to its identity, 56 when each entry held two times).
        assert_eq!(std::mem::size_of::<Entry>(), 16);
        assert_eq!(std::mem::size_of::<Option<Slot>>(), 24);
    }

    #[test]
    fn the_table_clock_keeps_order_and_round_trips() {
        let clock = Clock::default();
        let later = clock.0 + Duration::from_millis(1500);
        assert_eq!(clock.at(clock.stamp(later)), later);
        assert!(clock.stamp(later) > clock.stamp(clock.0 + Duration::from_millis(1499)));
        // Before the table's start counts as its start.
        assert_eq!(clock.stamp(clock.0 - Duration::from_secs(1)), 0);
    }

    #[test]
    fn identities_outlive_the_compaction_of_their_buffer() {
        let now = Instant::now();
        let mut t = Table::default();
        let id = |i: usize| format!("node-{i:07}.example.net");
        for i in 0..200_000 {
            assert!(t.queue_discovered(&id(i), now));
        }
        let full = t.names.bytes();
        // Forget every node but each tenth: the dead bytes become the majority on the way and
        // the buffer is compacted, while the slots, the index and the lanes stay as they are.
        for i in (0..200_000).filter(|i| i % 10 != 0) {
            assert!(t.remove(&id(i)).is_some());
        }
        assert!(
            t.names.bytes() < full / 2,
            "compacted: {} of {full}",
            t.names.bytes()
        );
        for i in 0..200_000 {
            assert_eq!(t.find(&id(i)).is_some(), i % 10 == 0, "{}", id(i));
        }
        let queued: Vec<String> = t
            .discovered
            .iter()
            .filter(|&&e| t.current(e))
            .filter_map(|&(s, _)| t.name(s).map(String::from))
            .collect();
        assert_eq!(queued, (0..200_000).step_by(10).map(id).collect::<Vec<_>>());
        // Added after the compaction, found beside the ones kept.
        assert!(t.queue_discovered("late.example.net", now));
        assert!(t.find("late.example.net").is_some() && t.find(&id(10)).is_some());
    }

    #[test]
    fn a_backlog_entry_of_a_node_done_meanwhile_is_skipped() {
        let now = Instant::now();
        let mut t = Table::default();
        // Nothing is remembered without a backlog.
        t.remember_done("x");
        assert_eq!(t.done.len(), 0);
        for id in ["a", "b", "c"] {
            t.backlog.push_back(id);
        }
        // "b" announced itself, was provisioned and its hold is over (forgotten): its backlog
        // entry is stale.
        t.remember_done("b");
        t.refill(10, now);
        let queued: Vec<&str> = t
            .discovered
            .iter()
            .filter_map(|&(s, _)| t.name(s))
            .collect();
        assert_eq!(queued, ["a", "c"]);
        // The backlog is done: so is what was remembered beside it.
        assert!(t.backlog.is_empty() && t.done.is_empty());
    }

    #[test]
    fn slots_are_reused_and_the_index_follows_them() {
        let now = Instant::now();
        let mut t = Table::default();
        for id in ["a", "b", "c"] {
            assert!(t.queue_discovered(id, now));
        }
        assert!(!t.queue_discovered("b", now), "already queued");
        let b = t.find("b").unwrap_or(u32::MAX);
        assert!(t.remove("b").is_some());
        assert_eq!((t.len, t.find("b")), (2, None));
        assert!(t.queue_discovered("d", now));
        assert_eq!(t.find("d"), Some(b), "the freed slot is used again");
        assert_eq!(t.get("a").map(|e| e.lane), Some(Source::Discovery));
        assert_eq!(t.len, 3);
    }
}
