//! The host table's identities, stored end to end in one buffer rather than one allocation
//! each.
//!
//! A million waiting nodes would otherwise be a million small allocations (a 33-byte identity
//! costs 64 bytes of heap with its reference counts), made while the startup events that name
//! them pass through the same allocator: the pages those events used then stay resident for
//! the few identities placed among them. Here an identity costs its own bytes and an 8-byte
//! [`Name`]. Removed identities leave dead bytes behind; the table compacts the buffer once
//! they outnumber the live ones ([`Names::wants_compaction`]), so the buffer stays within
//! twice the live identities at O(1) amortised cost a removal.

use std::collections::VecDeque;

/// Where an identity is in [`Names`]: its offset (48 bits) and length (16 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Name(u64);

/// The longest identity stored whole. [`crate::fleet::Fleet::add`] checks every identity
/// against [`crate::identity::MAX_IDENTITY_LEN`] before it reaches the table or the backlog,
/// so none is longer; one that were would be cut at a character boundary (and so not found
/// again) rather than refused, so that storing never fails.
const MAX_LEN: usize = u16::MAX as usize;
const _: () = assert!(crate::identity::MAX_IDENTITY_LEN <= MAX_LEN);

impl Name {
    fn at(self) -> usize {
        (self.0 >> 16) as usize
    }

    fn len(self) -> usize {
        (self.0 & 0xffff) as usize
    }
}

/// Identities end to end, and how many of their bytes belong to removed ones.
#[derive(Default)]
pub(super) struct Names {
    text: String,
    dead: usize,
}

/// Dead bytes below this are never worth a compaction.
const COMPACT_MIN: usize = 1 << 20;

impl Names {
    /// Stores `identity`.
    pub(super) fn add(&mut self, identity: &str) -> Name {
        let mut len = identity.len().min(MAX_LEN);
        while !identity.is_char_boundary(len) {
            len -= 1;
        }
        let at = self.text.len() as u64;
        self.text.push_str(&identity[..len]);
        Name((at << 16) | len as u64)
    }

    /// The identity stored as `name`.
    pub(super) fn get(&self, name: Name) -> &str {
        self.text
            .get(name.at()..name.at() + name.len())
            .unwrap_or_default()
    }

    /// Counts `name`'s bytes as dead (the table forgot it).
    pub(super) fn remove(&mut self, name: Name) {
        self.dead += name.len();
    }

    /// Whether dead bytes are the majority (and many): the caller then calls
    /// [`Names::compact`] with every live name.
    pub(super) fn wants_compaction(&self) -> bool {
        self.dead > COMPACT_MIN && self.dead > self.text.len() - self.dead
    }

    /// Stores the `live` identities again, without the dead bytes between them, in a buffer
    /// sized for them, and points each name at its new place.
    pub(super) fn compact<'a>(&mut self, live: impl IntoIterator<Item = &'a mut Name>) {
        let mut fresh = Names {
            text: String::with_capacity(self.text.len() - self.dead),
            dead: 0,
        };
        for name in live {
            *name = fresh.add(self.get(*name));
        }
        *self = fresh;
    }

    /// Bytes held, live and dead.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.text.len()
    }
}

/// A first-in, first-out queue of identities in one [`Names`] buffer: the discovery backlog,
/// up to four times the work queue's capacity in identities, at their own bytes and 8 more
/// each. Taken identities' bytes are dead until the buffer is compacted, as in the table.
#[derive(Default)]
pub(super) struct NameQueue {
    names: Names,
    order: VecDeque<Name>,
}

impl NameQueue {
    pub(super) fn push_back(&mut self, identity: &str) {
        let name = self.names.add(identity);
        self.order.push_back(name);
    }

    pub(super) fn pop_front(&mut self) -> Option<Box<str>> {
        let name = self.order.pop_front()?;
        let identity = Box::from(self.names.get(name));
        self.names.remove(name);
        if self.names.wants_compaction() {
            self.names.compact(&mut self.order);
        }
        Some(identity)
    }

    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_come_back_as_stored() {
        let mut n = Names::default();
        let a = n.add("web1.example.net");
        let b = n.add("");
        let c = n.add("ünïcode.example.net");
        assert_eq!(n.get(a), "web1.example.net");
        assert_eq!(n.get(b), "");
        assert_eq!(n.get(c), "ünïcode.example.net");
        assert_eq!(std::mem::size_of::<Name>(), 8);
    }

    #[test]
    fn an_overlong_identity_is_cut_at_a_character_boundary() {
        let mut n = Names::default();
        let long = "é".repeat(40_000);
        let name = n.add(&long);
        let got = n.get(name);
        assert!(got.len() <= MAX_LEN && got.len() > MAX_LEN - 2);
        assert!(long.starts_with(got));
    }

    #[test]
    fn a_name_queue_gives_back_what_it_was_given_in_order_across_compactions() {
        let mut q = NameQueue::default();
        let id = |i: usize| format!("node-{i:07}.example.net");
        let (mut pushed, mut popped) = (0, 0);
        // Push and take in turns, so that the taken bytes become the majority and the buffer
        // is compacted several times with identities still waiting.
        for round in 0..6 {
            for _ in 0..100_000 {
                q.push_back(&id(pushed));
                pushed += 1;
            }
            for _ in 0..(90_000 + round * 1000) {
                assert_eq!(q.pop_front().as_deref(), Some(id(popped).as_str()));
                popped += 1;
            }
            assert!(
                q.names.bytes() < 3 * 100_000 * 23,
                "compacted: {}",
                q.names.bytes()
            );
        }
        assert_eq!(q.len(), pushed - popped);
        while let Some(x) = q.pop_front() {
            assert_eq!(&*x, id(popped));
            popped += 1;
        }
        assert!(q.is_empty() && popped == pushed);
    }

    #[test]
    fn compaction_is_wanted_once_dead_bytes_are_many_and_the_majority() {
        // A majority of few dead bytes: not worth it.
        let mut few = Names::default();
        let names: Vec<Name> = (0..1000).map(|i| few.add(&format!("n{i:09}"))).collect();
        names[..900].iter().for_each(|&x| few.remove(x));
        assert!(!few.wants_compaction());
        // Many dead bytes, not the majority: not yet; then the majority: wanted.
        let mut n = Names::default();
        let names: Vec<Name> = (0..300_000).map(|i| n.add(&format!("n{i:09}"))).collect();
        names[..140_000].iter().for_each(|&x| n.remove(x));
        assert!(!n.wants_compaction());
        names[140_000..160_000].iter().for_each(|&x| n.remove(x));
        assert!(n.wants_compaction());
        let mut live = names[160_000..].to_vec();
        n.compact(&mut live);
        assert!(n.text.capacity() >= 140_000 * 10 && n.bytes() == 140_000 * 10);
        assert_eq!(n.get(live[0]), "n000160000");
    }
}
