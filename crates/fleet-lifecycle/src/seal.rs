//! The replicas' shared secret over what they write to Choria Streams: claim values of
//! active-active and the fleet records (pause, deny list, approvals, rate, campaigns). With a
//! secret (`claims_secret_file`, else the provisioners' broker password) everything written
//! carries an HMAC-SHA256 tag only the replicas can make, and what does not verify is ignored;
//! without one, values are checked for their form and age only.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

/// The longest claim value read back; anything longer is someone else's garbage.
pub const MAX_CLAIM_VALUE: usize = 1024;

/// How far a value's time may be ahead of this replica's clock, or past its lifetime, and
/// still count: clocks of the replicas differ a little.
pub const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// Seals the values replicas write, and checks what is read back: with a secret every value
/// carries an HMAC-SHA256 tag that only the replicas can make. Without one, values are checked
/// for their form and age only.
#[derive(Clone, Default)]
pub struct Seal(Option<Arc<ring::hmac::Key>>);

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Seal(secret)"
        } else {
            "Seal(none)"
        })
    }
}

/// A value read back from the bucket that a replica wrote: its state and the replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// `claimed`, `done` or `alive`.
    pub state: String,
    /// The replica that wrote it (control characters removed, at most 128 characters).
    pub by: String,
}

impl Seal {
    /// No secret: values are checked for their form and age only.
    pub fn none() -> Self {
        Seal(None)
    }

    /// Values tagged with a key derived from `secret` (shared by every replica, unknown to
    /// nodes).
    pub fn with_secret(secret: &[u8]) -> Self {
        let derived = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"choria-provisioner claims v1"),
            secret,
        );
        Seal(Some(Arc::new(ring::hmac::Key::new(
            ring::hmac::HMAC_SHA256,
            derived.as_ref(),
        ))))
    }

    /// Whether values are tagged.
    pub fn is_sealed(&self) -> bool {
        self.0.is_some()
    }

    /// The tag of a fleet record (pause, deny entry, approval, rate, campaign) stored under
    /// `key`, `None` without a secret. Domain-separated from the claims' tags by its first part.
    pub fn tag_record(&self, key: &str, payload: &[u8]) -> Option<String> {
        let k = self.0.as_ref()?;
        let mut ctx = ring::hmac::Context::with_key(k);
        for part in [b"control v1".as_slice(), key.as_bytes(), payload] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part);
        }
        Some(hex::encode(ctx.sign().as_ref()))
    }

    /// Whether `tag` is the tag of `payload` under `key` (always true without a secret),
    /// compared in constant time.
    pub fn verify_record(&self, key: &str, payload: &[u8], tag: &str) -> bool {
        let Some(k) = self.0.as_ref() else {
            return true;
        };
        let Ok(tag) = hex::decode(tag) else {
            return false;
        };
        let mut msg = Vec::with_capacity(payload.len() + key.len() + 40);
        for part in [b"control v1".as_slice(), key.as_bytes(), payload] {
            msg.extend_from_slice(&(part.len() as u64).to_be_bytes());
            msg.extend_from_slice(part);
        }
        ring::hmac::verify(k, &msg, &tag).is_ok()
    }

    fn tag(key: &ring::hmac::Key, entry: &str, state: &str, replica: &str, at_ms: u64) -> String {
        let mut ctx = ring::hmac::Context::with_key(key);
        // Length-prefixed, so no two different inputs make the same string.
        for part in [entry, state, replica, &at_ms.to_string()] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part.as_bytes());
        }
        hex::encode(&ctx.sign().as_ref()[..16])
    }

    /// The value `state` by `replica` at `at_ms` for the bucket key `entry`.
    pub fn value(&self, entry: &str, state: &str, replica: &str, at_ms: u64) -> Bytes {
        let mut v = format!("{state} {replica} {at_ms}");
        if let Some(key) = &self.0 {
            v.push(' ');
            v.push_str(&Self::tag(key, entry, state, replica, at_ms));
        }
        Bytes::from(v.into_bytes())
    }

    /// What `value` under `entry` says, when a replica wrote it within `lifetime` (plus a
    /// little clock skew) of `now_ms`; `None` for anything else, including anything too long.
    pub fn read(
        &self,
        entry: &str,
        value: &[u8],
        now_ms: u64,
        lifetime: Duration,
    ) -> Option<Sealed> {
        if value.len() > MAX_CLAIM_VALUE {
            return None;
        }
        let text = std::str::from_utf8(value).ok()?;
        let mut words: Vec<&str> = text.split(' ').collect();
        let state = words.first().copied()?;
        if !matches!(state, "claimed" | "done" | "alive") {
            return None;
        }
        let tag = match &self.0 {
            Some(_) => Some(words.pop()?),
            None => None,
        };
        // `<state> <replica>` alone, without a time, is honoured only unsealed.
        let at_ms = match words.last().and_then(|w| w.parse::<u64>().ok()) {
            Some(at) if words.len() >= 3 => {
                words.pop();
                Some(at)
            }
            _ if self.0.is_none() => None,
            _ => return None,
        };
        let replica = words[1..].join(" ");
        if replica.is_empty() {
            return None;
        }
        if let Some(at) = at_ms {
            let skew = u64::try_from(CLOCK_SKEW.as_millis()).unwrap_or(u64::MAX);
            let life = u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX);
            if at > now_ms.saturating_add(skew)
                || now_ms.saturating_sub(at) > life.saturating_add(skew)
            {
                return None;
            }
        }
        if let (Some(key), Some(tag), Some(at)) = (&self.0, tag, at_ms) {
            let want = Self::tag(key, entry, state, &replica, at);
            // Constant time: the tag is a secret's output.
            let same = want.len() == tag.len()
                && want
                    .bytes()
                    .zip(tag.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0;
            if !same {
                return None;
            }
        }
        Some(Sealed {
            state: state.to_string(),
            by: replica
                .chars()
                .filter(|c| !c.is_control())
                .take(128)
                .collect(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sealed(state: &str, by: &str) -> Option<Sealed> {
        Some(Sealed {
            state: state.into(),
            by: by.into(),
        })
    }

    #[test]
    fn unsealed_values_are_parsed_bounded_and_aged() {
        let none = Seal::none();
        let life = Duration::from_secs(30);
        let now = 1_700_000_000_000u64;
        let read = |v: &[u8]| none.read("node.n1", v, now, life);
        // Values without a time.
        assert_eq!(read(b"claimed p1"), sealed("claimed", "p1"));
        assert_eq!(read(b"done p2"), sealed("done", "p2"));
        assert_eq!(read(b"done p\x1b[2"), sealed("done", "p[2"));
        assert_eq!(read(b"other p2"), None);
        assert_eq!(read(&[b'x'; 2000]), None);
        // With a time: current, too old, from the future.
        let v = none.value("node.n1", "claimed", "p1.example.net", now - 5_000);
        assert_eq!(read(&v), sealed("claimed", "p1.example.net"));
        let old = none.value("node.n1", "done", "p1", now - 120_000);
        assert_eq!(read(&old), None);
        let ahead = none.value("node.n1", "done", "p1", now + 120_000);
        assert_eq!(read(&ahead), None);
    }

    #[test]
    fn sealed_values_verify_only_for_their_key_state_writer_and_time() {
        let seal = Seal::with_secret(b"shared by the replicas");
        let other = Seal::with_secret(b"somebody else");
        let life = Duration::from_secs(30);
        let now = 1_700_000_000_000u64;
        let v = seal.value("node.n1", "done", "p1", now);
        assert_eq!(seal.read("node.n1", &v, now, life), sealed("done", "p1"));
        // The same value under another node's key, by another secret, or unsealed: no one's.
        assert_eq!(seal.read("node.n2", &v, now, life), None);
        assert_eq!(other.read("node.n1", &v, now, life), None);
        assert_eq!(seal.read("node.n1", b"done p1", now, life), None);
        let forged = format!("done p1 {now} {}", "0".repeat(32));
        assert_eq!(seal.read("node.n1", forged.as_bytes(), now, life), None);
        // A changed state or writer breaks the tag.
        let text = String::from_utf8_lossy(&v).replacen("done", "claimed", 1);
        assert_eq!(seal.read("node.n1", text.as_bytes(), now, life), None);
        // A replayed value ages out with the lifetime.
        assert_eq!(seal.read("node.n1", &v, now + 120_000, life), None);
        // Heartbeats say who is alive; a replica name with spaces survives the round trip.
        let hb = seal.value("replica.p 2", "alive", "p 2", now);
        assert_eq!(
            seal.read("replica.p 2", &hb, now, life),
            sealed("alive", "p 2")
        );
    }
}
