//! The host table: every known node in a slab of slots found through a hash index, its
//! identity in one buffer of names, and the two lanes of the work queue as slot numbers.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Queued,
    Working,
    Held,
    /// An announced node waiting for its next try.
    Retry,
}

#[derive(Debug)]
pub(super) struct Entry {
    /// When it was queued (`Queued`; what staleness and the wait count from), until when it is
    /// held (`Held`), or when its next try is due (`Retry`): one time, on the table's
    /// [`Clock`], so that an entry is 16 bytes.
    pub(super) time: u64,
    pub(super) generation: u32,
    pub(super) state: State,
    pub(super) lane: Source,
    /// Tries an announced node has had (0 for a discovered one).
    pub(super) tries: u8,
}

/// What becomes of a node's entry when its cycle ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// Forgotten: found again by a later discovery.
    Forget,
    /// Kept (not queued again) for this long.
    Hold(Duration),
    /// An announced node: kept and tried again after a backoff, if it has tries left.
    Retry,
}

/// The table's times: nanoseconds since the table was made, 8 bytes where an [`Instant`] takes
/// 16 (a million waiting nodes hold a million of them). Times before the table's start are its
/// start; 2^64 nanoseconds are centuries.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock(pub(super) Instant);

impl Default for Clock {
    fn default() -> Self {
        Clock(Instant::now())
    }
}

impl Clock {
    pub(super) fn stamp(self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.0).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn at(self, stamp: u64) -> Instant {
        self.0 + Duration::from_nanos(stamp)
    }
}

/// A known node: its identity (in [`Table::names`]) and its entry.
pub(super) struct Slot {
    pub(super) name: Name,
    pub(super) entry: Entry,
}

/// A queue entry: a node's slot and the generation it was queued with.
pub(super) type LaneEntry = (u32, u32);

/// The host table and the two lanes of the queue.
///
/// Nodes live in a slab of slots found by identity through a hash index of slot numbers, and
/// the lanes hold slot numbers: a waiting node costs its identity's bytes (kept end to end in
/// [`Names`], not allocated one by one), one slot and a few bytes of index and lane (about 77
/// bytes a node with a 33-character identity: a 24-byte slot, the identity, the index and a
/// lane entry), so a queue sized to a million-node fleet fits in a bounded, predictable amount
/// of memory. The index hashes with a
/// per-process random key, since identities come from the network.
///
/// A lane may hold stale entries (a node queued again, promoted to the discovery lane, or
/// forgotten); they are counted as they appear, skipped when taken, and compacted away only
/// once they outnumber the live ones, so every operation is O(1) amortised however full the
/// queue is.
#[derive(Default)]
pub(super) struct Table {
    pub(super) slots: Vec<Option<Slot>>,
    /// The slots' identities.
    pub(super) names: Names,
    /// What the entries' times count from.
    pub(super) clock: Clock,
    /// Slots freed by forgotten nodes, used again first.
    pub(super) free: Vec<u32>,
    /// Slot numbers by identity.
    pub(super) index: hashbrown::HashTable<u32>,
    pub(super) hasher: RandomState,
    /// Nodes in the table.
    pub(super) len: usize,
    /// Nodes found by discovery (or found by it after announcing themselves).
    pub(super) discovered: VecDeque<LaneEntry>,
    /// Nodes only known from a startup event.
    pub(super) announced: VecDeque<LaneEntry>,
    /// Nodes the latest discovery found while the queue was full, not in the table yet.
    pub(super) backlog: NameQueue,
    /// Keyed hashes of the nodes whose cycle ended held (provisioned, say) while a backlog
    /// waits: a backlog entry of such a node, reached after its hold is over, is stale (the
    /// node announced itself and was provisioned meanwhile) and is skipped. Emptied with the
    /// backlog.
    pub(super) done: hashbrown::HashTable<u64>,
    /// Stale entries in `discovered` and `announced`.
    pub(super) stale_discovered: usize,
    pub(super) stale_announced: usize,
    /// Generations tell a node's current queue entry from its stale ones; they wrap, and a
    /// stale entry lives at most until the next compaction, far fewer than 2^32 adds later.
    pub(super) next_generation: u32,
    /// Workers busy with a node from the event lane.
    pub(super) event_busy: usize,
    /// The event lane's turn comes next.
    pub(super) event_turn: bool,
    /// [`Fleet::drain`] has begun: nothing is queued or started any more.
    pub(super) draining: bool,
}

impl Table {
    pub(super) fn find(&self, identity: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(identity);
        let (slots, names) = (&self.slots, &self.names);
        self.index
            .find(hash, |&s| {
                slots[s as usize]
                    .as_ref()
                    .is_some_and(|x| names.get(x.name) == identity)
            })
            .copied()
    }

    /// The identity in `slot`.
    pub(super) fn name(&self, slot: u32) -> Option<&str> {
        self.slot(slot).map(|x| self.names.get(x.name))
    }

    pub(super) fn get(&self, identity: &str) -> Option<&Entry> {
        let s = self.find(identity)?;
        self.slots[s as usize].as_ref().map(|x| &x.entry)
    }

    pub(super) fn get_mut(&mut self, identity: &str) -> Option<&mut Entry> {
        let s = self.find(identity)?;
        self.slots[s as usize].as_mut().map(|x| &mut x.entry)
    }

    pub(super) fn slot(&self, slot: u32) -> Option<&Slot> {
        self.slots.get(slot as usize).and_then(Option::as_ref)
    }

    /// Whether `ticket` is its node's current queue entry.
    pub(super) fn current(&self, (slot, generation): LaneEntry) -> bool {
        self.slot(slot)
            .is_some_and(|x| x.entry.generation == generation && x.entry.state == State::Queued)
    }

    /// Sets `identity`'s entry, adding the node if it is not known; returns its slot.
    pub(super) fn set(&mut self, identity: &str, entry: Entry) -> u32 {
        if let Some(s) = self.find(identity) {
            if let Some(x) = self.slots[s as usize].as_mut() {
                x.entry = entry;
            }
            return s;
        }
        let slot = Slot {
            name: self.names.add(identity),
            entry,
        };
        let s = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(slot);
                s
            }
            None => {
                // A table never holds 2^32 nodes: the queue and the holds are bounded far
                // below that by memory.
                let s = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(Some(slot));
                s
            }
        };
        let Table {
            index,
            slots,
            names,
            hasher,
            ..
        } = self;
        let hash = hasher.hash_one(identity);
        index.insert_unique(hash, s, |&k| {
            slots[k as usize]
                .as_ref()
                .map_or(0, |x| hasher.hash_one(names.get(x.name)))
        });
        self.len += 1;
        s
    }

    /// Forgets the node in `slot`, returning its entry.
    pub(super) fn remove_slot(&mut self, slot: u32) -> Option<Entry> {
        let x = self.slots.get_mut(slot as usize)?.take()?;
        let hash = self.hasher.hash_one(self.names.get(x.name));
        if let Ok(found) = self.index.find_entry(hash, |&k| k == slot) {
            found.remove();
        }
        self.names.remove(x.name);
        if self.names.wants_compaction() {
            // The slots keep their numbers, so the index and the lanes stay as they are.
            let live = self.slots.iter_mut().flatten().map(|x| &mut x.name);
            self.names.compact(live);
        }
        self.free.push(slot);
        self.len -= 1;
        Some(x.entry)
    }

    /// Forgets `identity`, returning its entry.
    pub(super) fn remove(&mut self, identity: &str) -> Option<Entry> {
        let s = self.find(identity)?;
        self.remove_slot(s)
    }

    /// Forgets every node and empties both lanes.
    pub(super) fn clear(&mut self) {
        self.slots.clear();
        self.names = Names::default();
        self.free.clear();
        self.index.clear();
        self.discovered.clear();
        self.announced.clear();
        self.backlog = NameQueue::default();
        self.done = hashbrown::HashTable::new();
        self.slots.shrink_to(1024);
        self.free.shrink_to(1024);
        self.index.shrink_to(1024, |_| 0);
        self.discovered.shrink_to(1024);
        self.announced.shrink_to(1024);
        self.len = 0;
        self.stale_discovered = 0;
        self.stale_announced = 0;
    }

    /// Queues a node found by discovery: a new entry in the discovery lane, or an announced
    /// node still waiting (or waiting for its next try) moved there. Returns false when the
    /// node is already queued by discovery, being provisioned or held.
    pub(super) fn queue_discovered(&mut self, identity: &str, now: Instant) -> bool {
        let now = self.clock.stamp(now);
        let added = match self.get(identity) {
            None => now,
            Some(e) if e.state == State::Queued && e.lane == Source::Event => {
                let added = e.time;
                self.retire(Source::Event);
                added
            }
            Some(e) if e.state == State::Retry => now,
            Some(_) => return false,
        };
        self.next_generation = self.next_generation.wrapping_add(1);
        let generation = self.next_generation;
        let slot = self.set(
            identity,
            Entry {
                time: added,
                generation,
                state: State::Queued,
                lane: Source::Discovery,
                tries: 0,
            },
        );
        self.discovered.push_back((slot, generation));
        true
    }

    /// Moves nodes from the discovery backlog into the queue while it has room, at most 64 a
    /// call (each call takes one node off the queue, so the queue stays full).
    pub(super) fn refill(&mut self, capacity: usize, now: Instant) {
        let mut moved = 0;
        while moved < 64 && self.queued() < capacity {
            let Some(id) = self.backlog.pop_front() else {
                break;
            };
            let hash = self.hasher.hash_one(&*id);
            if self.done.find(hash, |&h| h == hash).is_some() {
                continue;
            }
            if self.queue_discovered(&id, now) {
                moved += 1;
            }
        }
        if self.backlog.is_empty() {
            self.end_backlog();
        }
    }

    /// Drops the backlog and what was remembered beside it.
    pub(super) fn end_backlog(&mut self) {
        self.backlog = NameQueue::default();
        self.done = hashbrown::HashTable::new();
    }

    /// Remembers that `identity`'s cycle ended held, while a backlog waits.
    pub(super) fn remember_done(&mut self, identity: &str) {
        if self.backlog.is_empty() {
            return;
        }
        let hash = self.hasher.hash_one(identity);
        if self.done.find(hash, |&h| h == hash).is_none() {
            self.done.insert_unique(hash, hash, |&h| h);
        }
    }

    pub(super) fn lane(&mut self, source: Source) -> &mut VecDeque<LaneEntry> {
        match source {
            Source::Discovery => &mut self.discovered,
            Source::Event => &mut self.announced,
        }
    }

    pub(super) fn stale(&mut self, source: Source) -> &mut usize {
        match source {
            Source::Discovery => &mut self.stale_discovered,
            Source::Event => &mut self.stale_announced,
        }
    }

    /// Nodes waiting in `source`'s lane.
    pub(super) fn live(&self, source: Source) -> usize {
        match source {
            Source::Discovery => self.discovered.len() - self.stale_discovered,
            Source::Event => self.announced.len() - self.stale_announced,
        }
    }

    /// Nodes waiting in both lanes.
    pub(super) fn queued(&self) -> usize {
        self.live(Source::Discovery) + self.live(Source::Event)
    }

    /// The queue entry of a node still waiting becomes stale (the node is queued again, moves
    /// lane or is forgotten): counted, and the lanes compacted once stale entries are the
    /// majority, which bounds the lanes to twice the waiting nodes at O(1) amortised cost.
    pub(super) fn retire(&mut self, lane: Source) {
        *self.stale(lane) += 1;
        let stale = self.stale_discovered + self.stale_announced;
        if stale > 1024 && stale > self.discovered.len() + self.announced.len() - stale {
            self.compact();
        }
    }

    /// Drops queue entries left behind by replaced or removed nodes.
    pub(super) fn compact(&mut self) {
        let mut discovered = std::mem::take(&mut self.discovered);
        let mut announced = std::mem::take(&mut self.announced);
        discovered.retain(|&t| self.current(t));
        announced.retain(|&t| self.current(t));
        self.discovered = discovered;
        self.announced = announced;
        self.stale_discovered = 0;
        self.stale_announced = 0;
    }
}
