//! A replica's view of the fleet control bucket ([`ControlView`]): every change the watch
//! delivers applied to the deny list, the operator's pause, the pending nodes and the
//! approvals; the view is the core's [`provision_core::Revocation`].

use super::*;

/// What every replica knows of fleet control: the operator's pause and the deny list. It is the
/// provisioner's [`Revocation`].
#[derive(Debug, Default)]
pub struct ControlView {
    inner: RwLock<View>,
}

#[derive(Debug, Default)]
pub(super) struct View {
    pause: Option<PauseRecord>,
    /// By bucket key.
    deny: HashMap<String, (DenyRecord, Matcher)>,
    identities: HashMap<String, String>,
    keys: HashMap<String, String>,
    patterns: Vec<(String, regex::Regex)>,
    /// By identity.
    pending: HashMap<String, PendingRecord>,
    /// By identity.
    approved: HashMap<String, ApprovalRecord>,
}

impl View {
    fn reindex(&mut self) {
        self.identities.clear();
        self.keys.clear();
        self.patterns.clear();
        for (key, (_, m)) in &self.deny {
            match m {
                Matcher::Identity(i) => {
                    self.identities.insert(i.clone(), key.clone());
                }
                Matcher::Key(k) => {
                    self.keys.insert(k.clone(), key.clone());
                }
                Matcher::Pattern(re) => self.patterns.push((key.clone(), re.clone())),
            }
        }
    }
}

impl ControlView {
    /// An empty view: nothing paused, nothing denied.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The operator's pause, if on.
    pub fn pause(&self) -> Option<PauseRecord> {
        self.read().pause.clone()
    }

    /// The deny entries followed.
    pub fn deny_entries(&self) -> Vec<DenyRecord> {
        let mut v: Vec<_> = self.read().deny.values().map(|(r, _)| r.clone()).collect();
        v.sort_by(|a, b| a.entry.cmp(&b.entry));
        v
    }

    /// The number of deny entries followed.
    pub fn deny_count(&self) -> usize {
        self.read().deny.len()
    }

    /// The pending nodes followed that have not expired at `now`, sorted by identity.
    pub fn pending(&self, now: i64) -> Vec<PendingRecord> {
        let mut v: Vec<_> = self
            .read()
            .pending
            .values()
            .filter(|r| r.expires > now)
            .cloned()
            .collect();
        v.sort_by(|a, b| a.identity.cmp(&b.identity));
        v
    }

    /// The pending record of `identity`, expired or not.
    pub fn pending_of(&self, identity: &str) -> Option<PendingRecord> {
        self.read().pending.get(identity).cloned()
    }

    /// The approval of `identity` presenting `keys` that applies at `now`.
    pub fn approval_of(&self, identity: &str, keys: &[String], now: i64) -> Option<ApprovalRecord> {
        self.read()
            .approved
            .get(identity)
            .filter(|a| a.expires > now && same_keys(&a.fingerprints, keys))
            .cloned()
    }

    pub(crate) fn note_pending(&self, rec: PendingRecord) {
        let mut v = self.write();
        if v.pending.len() < MAX_PENDING || v.pending.contains_key(&rec.identity) {
            v.pending.insert(rec.identity.clone(), rec);
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }
}

impl Revocation for ControlView {
    fn denied(&self, identity: &str, keys: &[String]) -> Option<String> {
        let v = self.read();
        if v.deny.is_empty() {
            return None;
        }
        let now = now_unix();
        let why = |key: &String| {
            v.deny
                .get(key)
                .filter(|(r, _)| r.active(now))
                .map(|(r, _)| format!("{} ({}, by {})", r.entry, r.reason, r.by))
        };
        if let Some(w) = v.identities.get(identity).and_then(why) {
            return Some(w);
        }
        for k in keys {
            if let Some(w) = v.keys.get(k).and_then(why) {
                return Some(w);
            }
        }
        v.patterns
            .iter()
            .filter(|(_, re)| re.is_match(identity))
            .find_map(|(key, _)| why(key))
    }
}

/// The identity a key's hex part names.
fn unhex(hexed: &str) -> Option<String> {
    hex::decode(hexed)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
}

/// Applies a change of a `pending.` or `approved.` key; whether a node was approved.
pub(super) fn apply_approval(
    seal: &Seal,
    view: &ControlView,
    key: &str,
    removed: bool,
    value: &[u8],
) -> bool {
    let mut v = view.write();
    if let Some(hexed) = key.strip_prefix(PENDING_PREFIX) {
        if removed {
            if let Some(i) = unhex(hexed) {
                v.pending.remove(&i);
            }
            return false;
        }
        match decode_pending(seal, key, value) {
            Some(r) if v.pending.len() < MAX_PENDING || v.pending.contains_key(&r.identity) => {
                v.pending.insert(r.identity.clone(), r);
            }
            Some(r) => error!(
                "approval queue: more than {MAX_PENDING} pending nodes, ignoring {}",
                escaped(&r.identity)
            ),
            None => warn!("fleet control: ignoring pending record {}: malformed or not signed with the provisioners' secret", escaped(key)),
        }
        return false;
    }
    if removed {
        if let Some(i) = key.strip_prefix(APPROVED_PREFIX).and_then(unhex) {
            v.approved.remove(&i);
        }
        return false;
    }
    match decode_approval(seal, key, value) {
        Some(r) if v.approved.len() < MAX_PENDING || v.approved.contains_key(&r.identity) => {
            info!(
                "approval queue: {} approved by {} at {}",
                escaped(&r.identity),
                escaped(&r.by),
                rfc3339(r.at)
            );
            v.pending.remove(&r.identity);
            v.approved.insert(r.identity.clone(), r);
            true
        }
        Some(r) => {
            error!(
                "approval queue: more than {MAX_PENDING} approvals, ignoring {}",
                escaped(&r.identity)
            );
            false
        }
        None => {
            warn!("fleet control: ignoring approval {}: malformed or not signed with the provisioners' secret", escaped(key));
            false
        }
    }
}

/// Applies one change of the bucket to `view` and `pause`; whether a node was approved.
pub(super) fn apply(
    seal: &Seal,
    view: &ControlView,
    pause: &PauseState,
    key: &str,
    op: Operation,
    value: &[u8],
) -> bool {
    let removed = !matches!(op, Operation::Put);
    if key.starts_with(PENDING_PREFIX) || key.starts_with(APPROVED_PREFIX) {
        return apply_approval(seal, view, key, removed, value);
    }
    if key == PAUSE_KEY {
        let rec = if removed {
            None
        } else {
            match decode_pause(seal, value) {
                Some(r) => Some(r),
                None => {
                    warn!("fleet control: ignoring a pause record that is malformed or not signed with the provisioners' secret");
                    return false;
                }
            }
        };
        match &rec {
            Some(r) => warn!(
                "Provisioning paused by {} at {}: {}; nodes in flight finish, nothing new starts until choria-provisioner resume",
                escaped(&r.by),
                rfc3339(r.at),
                escaped(&r.reason)
            ),
            None if view.pause().is_some() => info!("Provisioning resumed: the operator's pause was lifted"),
            None => {}
        }
        pause.hold(rec.is_some());
        view.write().pause = rec;
        return false;
    }
    if !key.starts_with(DENY_PREFIX) {
        return false;
    }
    let mut v = view.write();
    if removed {
        if let Some((r, _)) = v.deny.remove(key) {
            info!("deny list: {} removed", escaped(&r.entry));
        }
    } else {
        match decode_deny(seal, key, value) {
            Some((r, m)) => {
                if v.deny.len() >= MAX_DENY_ENTRIES && !v.deny.contains_key(key) {
                    error!(
                        "deny list: more than {MAX_DENY_ENTRIES} entries, ignoring {}",
                        escaped(&r.entry)
                    );
                    return false;
                }
                info!(
                    "deny list: {} denied by {}: {}",
                    escaped(&r.entry),
                    escaped(&r.by),
                    escaped(&r.reason)
                );
                v.deny.insert(key.to_string(), (r, m));
            }
            None => {
                warn!("fleet control: ignoring deny entry {}: malformed or not signed with the provisioners' secret", escaped(key));
                return false;
            }
        }
    }
    v.reindex();
    false
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn put(view: &ControlView, pause: &PauseState, seal: &Seal, key: &str, rec: &DenyRecord) {
        put_signed(view, pause, seal, seal, key, rec)
    }

    /// Signed with `signer`, read by a replica whose secret gives `seal`.
    fn put_signed(
        view: &ControlView,
        pause: &PauseState,
        seal: &Seal,
        signer: &Seal,
        key: &str,
        rec: &DenyRecord,
    ) {
        let mut r = rec.clone();
        r.tag.clear();
        r.tag = signer
            .tag_record(key, &serde_json::to_vec(&r).unwrap())
            .unwrap_or_default();
        apply(
            seal,
            view,
            pause,
            key,
            Operation::Put,
            &serde_json::to_vec(&r).unwrap(),
        );
    }

    fn record(entry: &str) -> DenyRecord {
        DenyRecord {
            entry: entry.into(),
            reason: "stolen".into(),
            by: "ops".into(),
            at: 1,
            expires: None,
            tag: String::new(),
        }
    }

    #[test]
    fn identities_patterns_and_key_fingerprints_are_denied() {
        let view = ControlView::new();
        let pause = PauseState::default();
        let seal = Seal::with_secret(b"s");
        let fp = format!("sha256:{}", "ab".repeat(32));
        for e in ["n1.example.net", "/^lab-/", fp.as_str()] {
            put(&view, &pause, &seal, &deny_key(e), &record(e));
        }
        assert!(view
            .denied("n1.example.net", &[])
            .unwrap()
            .contains("stolen"));
        assert!(view.denied("lab-7", &[]).is_some());
        assert!(view
            .denied("n2.example.net", std::slice::from_ref(&fp))
            .is_some());
        assert!(view.denied("n2.example.net", &[]).is_none());
        // Removed: not denied.
        apply(
            &seal,
            &view,
            &pause,
            &deny_key("n1.example.net"),
            Operation::Delete,
            b"",
        );
        assert!(view.denied("n1.example.net", &[]).is_none());
    }

    #[test]
    fn expired_and_forged_entries_deny_nothing() {
        let view = ControlView::new();
        let pause = PauseState::default();
        let seal = Seal::with_secret(b"s");
        let mut old = record("old");
        old.expires = Some(2);
        put(&view, &pause, &seal, &deny_key("old"), &old);
        assert!(view.denied("old", &[]).is_none());
        // Signed with another secret, or under another key: ignored.
        put_signed(
            &view,
            &pause,
            &seal,
            &Seal::with_secret(b"other"),
            &deny_key("n1"),
            &record("n1"),
        );
        assert!(view.denied("n1", &[]).is_none());
        put(&view, &pause, &seal, &deny_key("n2"), &record("n1"));
        assert!(view.denied("n1", &[]).is_none());
        // A forged pause does not hold the fleet.
        let forged = serde_json::to_vec(&PauseRecord {
            by: "x".into(),
            reason: "y".into(),
            at: 1,
            tag: "00".into(),
        })
        .unwrap();
        apply(&seal, &view, &pause, PAUSE_KEY, Operation::Put, &forged);
        assert!(!pause.paused());
    }

    fn sealed<T: Serialize + Clone>(
        seal: &Seal,
        key: &str,
        rec: &T,
        tag: fn(&mut T) -> &mut String,
    ) -> Vec<u8> {
        let mut r = rec.clone();
        tag(&mut r).clear();
        *tag(&mut r) = seal
            .tag_record(key, &serde_json::to_vec(&r).unwrap())
            .unwrap_or_default();
        serde_json::to_vec(&r).unwrap()
    }

    #[test]
    fn approvals_bind_the_key_and_forged_ones_approve_nothing() {
        let view = ControlView::new();
        let pause = PauseState::default();
        let seal = Seal::with_secret(b"s");
        let fp = format!("sha256:{}", "ab".repeat(32));
        let pending = PendingRecord {
            identity: "n1".into(),
            fingerprints: vec![fp.clone()],
            reason: "approval: manual".into(),
            facts: Default::default(),
            first_seen: 1,
            last_seen: 1,
            expires: i64::MAX,
            by: "prov1".into(),
            tag: String::new(),
        };
        let bytes = sealed(&seal, &pending_key("n1"), &pending, |r| &mut r.tag);
        assert!(!apply(
            &seal,
            &view,
            &pause,
            &pending_key("n1"),
            Operation::Put,
            &bytes
        ));
        assert_eq!(view.pending(now_unix()).len(), 1);
        // Expired entries are not listed.
        assert!(view.pending(i64::MAX).is_empty());
        let approval = ApprovalRecord {
            identity: "n1".into(),
            fingerprints: vec![fp.clone()],
            by: "ops".into(),
            at: 1,
            expires: i64::MAX,
            reason: String::new(),
            tag: String::new(),
        };
        // Signed with another secret: ignored.
        let forged = sealed(
            &Seal::with_secret(b"x"),
            &approved_key("n1"),
            &approval,
            |r| &mut r.tag,
        );
        assert!(!apply(
            &seal,
            &view,
            &pause,
            &approved_key("n1"),
            Operation::Put,
            &forged
        ));
        assert!(view
            .approval_of("n1", std::slice::from_ref(&fp), now_unix())
            .is_none());
        // Under another identity's key: ignored.
        let elsewhere = sealed(&seal, &approved_key("n2"), &approval, |r| &mut r.tag);
        assert!(!apply(
            &seal,
            &view,
            &pause,
            &approved_key("n2"),
            Operation::Put,
            &elsewhere
        ));
        let good = sealed(&seal, &approved_key("n1"), &approval, |r| &mut r.tag);
        assert!(
            apply(
                &seal,
                &view,
                &pause,
                &approved_key("n1"),
                Operation::Put,
                &good
            ),
            "an approval triggers discovery"
        );
        assert!(view
            .approval_of("n1", std::slice::from_ref(&fp), now_unix())
            .is_some());
        assert!(
            view.pending(now_unix()).is_empty(),
            "the pending entry goes"
        );
        // Another key under the same name is not approved; nor after the approval expires.
        let other = format!("sha256:{}", "cd".repeat(32));
        assert!(view.approval_of("n1", &[other], now_unix()).is_none());
        assert!(view.approval_of("n1", &[fp], i64::MAX).is_none());
    }
}
