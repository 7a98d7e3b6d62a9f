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

/// Where an identity is in [`Names`]: its offset (48 bits) and length (16 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Name(u64);

/// The longest identity stored whole. Identities are checked before they reach the table
/// ([`crate::identity::MAX_IDENTITY_LEN`] is far below this); a longer one is cut at a
/// character boundary rather than refused, so that storing never fails.
const MAX_LEN: usize = u16::MAX as usize;

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

    /// Whether dead bytes are the majority (and many): the caller then stores every live
    /// identity again in a fresh [`Names`] and takes it in place of this one.
    pub(super) fn wants_compaction(&self) -> bool {
        self.dead > COMPACT_MIN && self.dead > self.text.len() - self.dead
    }

    /// An empty buffer sized for what is live here, for the compaction.
    pub(super) fn for_live(&self) -> Names {
        Names {
            text: String::with_capacity(self.text.len() - self.dead),
            dead: 0,
        }
    }

    /// Bytes held, live and dead.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.text.len()
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
        assert!(n.for_live().text.capacity() >= 140_000 * 10);
    }
}
