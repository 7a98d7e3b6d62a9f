//! The approval queue: with `approval: manual` (or a policy's `pending`) a node that passed the
//! deny list and the checks waits, recorded as `pending.<hex of the identity>` in the fleet
//! control bucket, until an operator approves it (`choria-provisioner approve`, or the status
//! page) or rejects it (`reject`: its key fingerprints go on the deny list). [`ApprovalQueue`]
//! is the core's [`Approval`] and the status page's [`FleetControlView`]; the records and their
//! seal are [`crate::control`]'s.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use provision_core::identity::escaped;
use provision_core::{Approval, HoldFuture, PendingNode};
use provisioner_status::control::{
    DecideFuture, Decision, FleetControlView, PauseInfo, PendingInfo,
};

use crate::control::{same_keys, ControlSlot, ControlView, PendingRecord, Selector};
use crate::{now_unix, rfc3339};

/// The most facts kept of a pending node.
pub const MAX_FACTS: usize = 12;
/// The longest fact name or value kept (longer ones are cut).
pub const MAX_FACT: usize = 64;

/// A few facts of a node from its inventory JSON (`facts`, else the top level): the scalar
/// ones, at most [`MAX_FACTS`], names and values cut to [`MAX_FACT`] bytes, control characters
/// removed. The inventory's `version` is kept first when there is one.
pub fn facts(inventory: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(v) = serde_json::from_str::<serde_json::Value>(inventory) else {
        return out;
    };
    let cut = |s: &str| crate::bounded_to(s, MAX_FACT);
    if let Some(ver) = v.get("version").and_then(|x| x.as_str()) {
        out.insert("version".to_string(), cut(ver));
    }
    let Some(map) = v.get("facts").and_then(|f| f.as_object()).or(v.as_object()) else {
        return out;
    };
    for (k, val) in map {
        if out.len() >= MAX_FACTS {
            break;
        }
        let text = match val {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            _ => continue,
        };
        out.insert(cut(k), cut(&text));
    }
    out
}

/// A random token for the status page's forms, made once per process (32 bytes, hex).
pub fn csrf_token() -> String {
    use ring::rand::SecureRandom as _;
    let mut b = [0u8; 32];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // No randomness: a token nobody can guess is still needed; the forms then refuse all.
        return String::new();
    }
    hex::encode(b)
}

/// The approval queue of a replica.
#[derive(Debug)]
pub struct ApprovalQueue {
    view: Arc<ControlView>,
    slot: Arc<ControlSlot>,
    manual: bool,
    expiry: Duration,
    refresh: Duration,
    by: String,
    campaign: Option<Arc<crate::campaign::CampaignSlot>>,
}

impl ApprovalQueue {
    /// Shows the campaign kept in `slot` on the status API and page.
    pub fn with_campaign(mut self, slot: Arc<crate::campaign::CampaignSlot>) -> Self {
        self.campaign = Some(slot);
        self
    }

    /// A queue over `view` (followed by the daemon) writing through `slot`; `manual` for
    /// `approval: manual`; entries and approvals last `expiry`; a node's last-seen time is
    /// written at most every `refresh` (the discovery interval); `by` names the replica.
    pub fn new(
        view: Arc<ControlView>,
        slot: Arc<ControlSlot>,
        manual: bool,
        expiry: Duration,
        refresh: Duration,
        by: &str,
    ) -> Self {
        ApprovalQueue {
            view,
            slot,
            manual,
            expiry,
            refresh,
            by: by.to_string(),
            campaign: None,
        }
    }

    async fn record(&self, node: PendingNode<'_>) -> Result<(), String> {
        let now = now_unix();
        let known = self
            .view
            .pending_of(node.identity)
            .filter(|p| p.expires > now && same_keys(&p.fingerprints, node.keys));
        if let Some(p) = &known {
            let refresh = i64::try_from(self.refresh.as_secs()).unwrap_or(i64::MAX);
            if now.saturating_sub(p.last_seen) < refresh {
                return Ok(());
            }
        }
        let Some(control) = self.slot.get() else {
            return Err("the fleet control bucket has not been reached yet".into());
        };
        let first_seen = known.as_ref().map_or(now, |p| p.first_seen);
        let lasts = i64::try_from(self.expiry.as_secs()).unwrap_or(i64::MAX);
        let mut rec = PendingRecord {
            identity: node.identity.to_string(),
            fingerprints: node.keys.to_vec(),
            reason: node
                .reason
                .chars()
                .take(crate::control::MAX_ENTRY)
                .collect(),
            facts: facts(&node.input.inventory),
            first_seen,
            last_seen: now,
            expires: first_seen.saturating_add(lasts),
            by: self.by.clone(),
            tag: String::new(),
        };
        control
            .put_pending(&mut rec)
            .await
            .map_err(|e| e.to_string())?;
        self.view.note_pending(rec);
        Ok(())
    }
}

impl Approval for ApprovalQueue {
    fn manual(&self) -> bool {
        self.manual
    }

    fn approved(&self, identity: &str, keys: &[String]) -> Option<String> {
        self.view
            .approval_of(identity, keys, now_unix())
            .map(|a| match a.reason.as_str() {
                "" => format!("{} at {}", a.by, rfc3339(a.at)),
                why => format!("{} at {}: {why}", a.by, rfc3339(a.at)),
            })
    }

    fn hold<'a>(&'a self, node: PendingNode<'a>) -> HoldFuture<'a> {
        Box::pin(self.record(node))
    }
}

impl FleetControlView for ApprovalQueue {
    fn pause(&self) -> Option<PauseInfo> {
        self.view.pause().map(|p| PauseInfo {
            by: p.by,
            at: p.at,
            reason: p.reason,
        })
    }

    fn deny_entries(&self) -> usize {
        self.view.deny_count()
    }

    fn campaign(&self) -> Option<provisioner_status::CampaignInfo> {
        self.campaign.as_ref()?.get().map(|r| r.info())
    }

    fn pending(&self) -> Vec<PendingInfo> {
        self.view
            .pending(now_unix())
            .into_iter()
            .map(|p| PendingInfo {
                identity: p.identity,
                fingerprints: p.fingerprints,
                reason: p.reason,
                facts: p.facts,
                first_seen: p.first_seen,
                last_seen: p.last_seen,
                expires: p.expires,
            })
            .collect()
    }

    fn decide<'a>(&'a self, decision: Decision<'a>) -> DecideFuture<'a> {
        let Decision {
            identity,
            approve,
            reason,
            by,
        } = decision;
        Box::pin(async move {
            let Some(control) = self.slot.get() else {
                return Err("the fleet control bucket has not been reached yet".to_string());
            };
            let control = control.acting_as(by);
            let which = Selector::Identity(identity.to_string());
            let shown = escaped(identity);
            if approve {
                let done = control
                    .approve(&which, self.expiry, reason)
                    .await
                    .map_err(|e| e.to_string())?;
                match done.first() {
                    Some(a) => Ok(format!(
                        "Approved {shown} ({}): every replica provisions it now",
                        a.fingerprints.join(", ")
                    )),
                    None => Err(format!("{shown} is not pending (or its entry expired)")),
                }
            } else {
                let done = control
                    .reject(&which, reason)
                    .await
                    .map_err(|e| e.to_string())?;
                match done.first() {
                    Some((_, denied)) => Ok(format!(
                        "Rejected {shown}: denied {}",
                        denied
                            .iter()
                            .map(|d| d.entry.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                    None => Err(format!("{shown} is not pending (or its entry expired)")),
                }
            }
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_few_short_and_scalar() {
        let inv = serde_json::json!({
            "version": "0.29.4",
            "facts": {"os": "linux", "cpus": 4, "nested": {"a": 1}, "long": "x".repeat(500)},
        })
        .to_string();
        let f = facts(&inv);
        assert_eq!(f["version"], "0.29.4");
        assert_eq!(f["cpus"], "4");
        assert!(!f.contains_key("nested"));
        assert_eq!(f["long"].len(), MAX_FACT);
        let many: serde_json::Map<String, serde_json::Value> = (0..100)
            .map(|i| (format!("f{i}"), serde_json::Value::from(i)))
            .collect();
        assert_eq!(
            facts(&serde_json::json!({ "facts": many }).to_string()).len(),
            MAX_FACTS
        );
        assert!(facts("not json").is_empty());
    }
}
