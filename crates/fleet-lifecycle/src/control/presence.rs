//! Who follows the bucket: every replica that follows fleet control keeps a presence record
//! (`replica.<hex of its identity>`: identity, version, when last seen, the highest bucket
//! revision it has applied), written every [`PRESENCE_EVERY`] and soon after each change it
//! applies, and deleted when it stops. An operator's command reads them after its change to
//! say which replicas applied it ([`Control::reach`]), and fails when none follows the bucket.

use std::sync::atomic::Ordering;

use super::*;

/// The prefix of the replicas' presence records.
pub const PRESENCE_PREFIX: &str = "replica.";

/// How often a following replica writes its presence record when nothing changes.
pub const PRESENCE_EVERY: Duration = Duration::from_secs(10);

/// A presence record older than this is a replica that stopped (killed, or cut off).
pub const PRESENCE_FRESH: Duration = Duration::from_secs(30);

/// How soon after applying a change a replica says so: changes that come together (the
/// bucket's history when the watch starts) are acknowledged in one write.
const ACK_DELAY: Duration = Duration::from_millis(100);

/// How long an operator's change waits for the running replicas to apply it.
pub const REACH_WAIT: Duration = Duration::from_secs(5);

/// The most presence records read.
const MAX_REPLICAS: usize = 1_000;

/// A replica's presence, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresenceRecord {
    /// The replica's identity.
    pub identity: String,
    /// Its version.
    pub version: String,
    /// When it wrote this record (Unix seconds).
    pub last_seen: i64,
    /// The highest bucket revision it has applied.
    pub seen_revision: u64,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

impl PresenceRecord {
    /// Whether the replica wrote it within [`PRESENCE_FRESH`] of `now`.
    pub fn fresh(&self, now: i64) -> bool {
        now.saturating_sub(self.last_seen) <= PRESENCE_FRESH.as_secs() as i64
    }
}

/// The presence key of `identity`.
pub(super) fn presence_key(identity: &str) -> String {
    format!("{PRESENCE_PREFIX}{}", hex::encode(identity.as_bytes()))
}

pub(super) fn decode_presence(seal: &Seal, key: &str, bytes: &[u8]) -> Option<PresenceRecord> {
    decode_sealed(
        seal,
        key,
        bytes,
        |r: &PresenceRecord| presence_key(&r.identity),
        |r| &mut r.tag,
    )
}

/// What an operator's change reached: the running replicas that applied it, and those that
/// had not within the wait.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reach {
    /// Replicas that applied the change, sorted.
    pub reached: Vec<String>,
    /// Running replicas that had not applied it when the wait ended, sorted.
    pub missing: Vec<String>,
}

impl Reach {
    /// Every running replica that follows the bucket.
    pub fn replicas(&self) -> usize {
        self.reached.len() + self.missing.len()
    }

    /// `reached 2 of 2 replicas (prov1, prov2)`, and those not reached.
    pub fn line(&self) -> String {
        let mut s = format!(
            "reached {} of {} replica{} ({})",
            self.reached.len(),
            self.replicas(),
            if self.replicas() == 1 { "" } else { "s" },
            self.reached.join(", ")
        );
        if !self.missing.is_empty() {
            s.push_str(&format!(
                "; not yet: {} (see their logs for fleet control errors)",
                self.missing.join(", ")
            ));
        }
        s
    }

    /// What to tell the operator: the reach line, or the error of a change that reached no
    /// replica. With `no_replicas_ok`, a bucket no running replica follows is not an error.
    pub fn verdict(&self, no_replicas_ok: bool) -> Result<String, ControlError> {
        if self.replicas() == 0 {
            if no_replicas_ok {
                return Ok("No running provisioner follows the fleet control bucket yet; the change applies when one starts with fleet_control: true".into());
            }
            return Err(ControlError::NoReplicas);
        }
        if self.reached.is_empty() {
            return Err(ControlError::NotApplied {
                missing: self.missing.join(", "),
            });
        }
        Ok(self.line())
    }
}

impl Control {
    /// The highest bucket revision this handle has written (0 before its first write).
    pub fn last_write(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    pub(super) fn wrote(&self, revision: u64) {
        self.written.fetch_max(revision, Ordering::Relaxed);
    }

    /// The presence records of the running replicas (fresh, verified), sorted by identity.
    pub async fn replicas(&self) -> Result<Vec<PresenceRecord>, ControlError> {
        let (mut out, _) = self
            .list(
                "list the replicas",
                PRESENCE_PREFIX,
                MAX_REPLICAS,
                decode_presence,
            )
            .await?;
        let now = now_unix();
        out.retain(|r| r.fresh(now));
        out.sort_by(|a, b| a.identity.cmp(&b.identity));
        Ok(out)
    }

    /// Waits up to `wait` for every running replica to apply this handle's writes, and says
    /// which did.
    pub async fn reach(&self, wait: Duration) -> Result<Reach, ControlError> {
        let want = self.last_write();
        let until = tokio::time::Instant::now() + wait;
        loop {
            let replicas = self.replicas().await?;
            let (reached, missing): (Vec<_>, Vec<_>) =
                replicas.into_iter().partition(|r| r.seen_revision >= want);
            // Names as the bucket holds them are escaped before they reach a terminal.
            let names = |rs: Vec<PresenceRecord>| {
                rs.iter()
                    .map(|r| escaped(&r.identity).to_string())
                    .collect()
            };
            let reach = Reach {
                reached: names(reached),
                missing: names(missing),
            };
            if reach.missing.is_empty() && !reach.reached.is_empty()
                || tokio::time::Instant::now() >= until
            {
                return Ok(reach);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Writes this replica's presence, having applied up to `seen`.
    pub(super) async fn put_presence(&self, seen: u64) -> Result<(), ControlError> {
        let key = presence_key(&self.by);
        let mut rec = PresenceRecord {
            identity: self.by.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            last_seen: now_unix(),
            seen_revision: seen,
            tag: String::new(),
        };
        self.put_sealed("write this replica's presence", &key, &mut rec, |r| {
            &mut r.tag
        })
        .await
    }

    /// Removes this replica's presence (it stops following).
    pub(super) async fn remove_presence(&self) {
        let _ = self.store.delete(presence_key(&self.by)).await;
    }
}

/// When a following replica writes its presence next: [`ACK_DELAY`] after a change it
/// applied, else [`PRESENCE_EVERY`] after its last write.
#[derive(Debug)]
pub(super) struct Heartbeat {
    pub(super) seen: u64,
    due: tokio::time::Instant,
    failing: bool,
}

impl Heartbeat {
    pub(super) fn new() -> Self {
        Heartbeat {
            seen: 0,
            due: tokio::time::Instant::now(),
            failing: false,
        }
    }

    /// An entry of `revision` was applied (`change`: not a presence record).
    pub(super) fn saw(&mut self, revision: u64, change: bool) {
        self.seen = self.seen.max(revision);
        if change {
            self.due = self.due.min(tokio::time::Instant::now() + ACK_DELAY);
        }
    }

    pub(super) fn due(&self) -> tokio::time::Instant {
        self.due
    }

    /// Writes the presence; a failure is logged once until a write succeeds again.
    pub(super) async fn beat(&mut self, control: &Control) {
        self.due = tokio::time::Instant::now() + PRESENCE_EVERY;
        match control.put_presence(self.seen).await {
            Ok(()) => self.failing = false,
            Err(e) if !self.failing => {
                warn!("fleet control: {e}; operators' commands may not count this replica");
                self.failing = true;
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reach_line_names_every_replica() {
        let r = Reach {
            reached: vec!["prov1".into(), "prov2".into()],
            missing: vec![],
        };
        assert_eq!(r.line(), "reached 2 of 2 replicas (prov1, prov2)");
        let r = Reach {
            reached: vec!["prov1".into()],
            missing: vec!["prov3".into()],
        };
        assert_eq!(
            r.line(),
            "reached 1 of 2 replicas (prov1); not yet: prov3 (see their logs for fleet control errors)"
        );
        assert_eq!(r.verdict(false).unwrap(), r.line());
        let none = Reach::default();
        assert_eq!(none.replicas(), 0);
        assert!(matches!(none.verdict(false), Err(ControlError::NoReplicas)));
        assert!(none
            .verdict(true)
            .unwrap()
            .contains("No running provisioner"));
        let stuck = Reach {
            reached: vec![],
            missing: vec!["prov1".into()],
        };
        let e = stuck.verdict(false).unwrap_err().to_string();
        assert!(e.contains("prov1") && e.contains("5s"), "{e}");
    }

    #[test]
    fn a_presence_older_than_thirty_seconds_is_a_stopped_replica() {
        let rec = PresenceRecord {
            identity: "prov1".into(),
            version: "0".into(),
            last_seen: 1_000,
            seen_revision: 1,
            tag: String::new(),
        };
        assert!(rec.fresh(1_030));
        assert!(!rec.fresh(1_031));
    }

    #[test]
    fn presence_is_bound_to_its_key_and_sealed() {
        let seal = Seal::with_secret(b"secret");
        let mut rec = PresenceRecord {
            identity: "prov1".into(),
            version: "0".into(),
            last_seen: 1,
            seen_revision: 7,
            tag: String::new(),
        };
        let key = presence_key("prov1");
        let bare = serde_json::to_vec(&rec).unwrap();
        rec.tag = seal.tag_record(&key, &bare).unwrap_or_default();
        let bytes = serde_json::to_vec(&rec).unwrap();
        assert_eq!(decode_presence(&seal, &key, &bytes), Some(rec.clone()));
        assert_eq!(decode_presence(&seal, &presence_key("prov2"), &bytes), None);
        let unsealed = Seal::with_secret(b"other");
        assert_eq!(decode_presence(&unsealed, &key, &bytes), None);
    }
}
