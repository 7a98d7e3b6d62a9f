//! What the status API and page show of fleet control, and the approval queue's buttons: the
//! operator's pause, the number of deny entries, the nodes waiting for approval, and the
//! decision of an operator on one of them. The daemon implements [`FleetControlView`] over its
//! fleet control bucket; this crate knows no broker.

use std::collections::BTreeMap;

/// The operator's pause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseInfo {
    /// Who paused.
    pub by: String,
    /// When (Unix seconds).
    pub at: i64,
    /// Why.
    pub reason: String,
}

/// A node waiting for an operator's approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingInfo {
    /// The node's identity.
    pub identity: String,
    /// The fingerprints of the keys it presented.
    pub fingerprints: Vec<String>,
    /// Why it waits.
    pub reason: String,
    /// A few of its facts, values shortened.
    pub facts: BTreeMap<String, String>,
    /// First seen waiting (Unix seconds).
    pub first_seen: i64,
    /// Last seen (Unix seconds).
    pub last_seen: i64,
    /// When the entry expires (Unix seconds).
    pub expires: i64,
}

/// A rotation campaign, as the provisioners follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CampaignInfo {
    /// Its id.
    pub id: String,
    /// `running`, `paused`, `stopped`, `aborted` or `completed`.
    pub state: String,
    /// Why it is paused, stopped or aborted.
    pub reason: String,
    /// Who started it.
    pub by: String,
    /// Nodes in it.
    pub total: u64,
    /// Provisioned again.
    pub done: u64,
    /// Failed.
    pub failed: u64,
    /// Sent a request and not yet provisioned again.
    pub in_flight: u64,
    /// Not yet sent a request.
    pub pending: u64,
    /// When it is expected to finish (Unix seconds).
    pub eta: Option<i64>,
    /// Who drives it, empty when nobody does.
    pub driver: String,
    /// The latest failures: identity and why.
    pub recent_failures: Vec<(String, String)>,
}

/// An operator's decision on a pending node: approve it, or reject it with a reason, in the
/// name of `by`.
#[derive(Debug, Clone, Copy)]
pub struct Decision<'a> {
    /// The pending node.
    pub identity: &'a str,
    /// Approve (true) or reject (false).
    pub approve: bool,
    /// Why; required for a rejection.
    pub reason: &'a str,
    /// Who decided (recorded in the audit trail).
    pub by: &'a str,
}

/// An operator's decision on its way: what was done, or why it failed.
pub type DecideFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send + 'a>>;

/// Fleet control as the monitor sees it.
pub trait FleetControlView: Send + Sync + 'static {
    /// The operator's pause, if on.
    fn pause(&self) -> Option<PauseInfo>;
    /// The number of deny entries followed.
    fn deny_entries(&self) -> usize;
    /// The nodes waiting for approval (expired entries left out), sorted by identity.
    fn pending(&self) -> Vec<PendingInfo>;
    /// The rotation campaign, when one exists (default: none).
    fn campaign(&self) -> Option<CampaignInfo> {
        None
    }
    /// Carries out `decision` on its pending node.
    fn decide<'a>(&'a self, decision: Decision<'a>) -> DecideFuture<'a>;
}

/// Fleet control on the monitor: the view, and the per-process token the status page embeds
/// in its approve and reject forms (cross-site request forgery protection).
#[derive(Clone)]
pub struct ControlPanel {
    /// The view.
    pub view: std::sync::Arc<dyn FleetControlView>,
    /// A random token made at start, required in the body of every form POST.
    pub csrf: String,
}

impl std::fmt::Debug for ControlPanel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPanel").finish_non_exhaustive()
    }
}

/// `application/x-www-form-urlencoded` pairs (at most 16), decoded; `None` when not valid.
pub fn form_pairs(body: &[u8]) -> Option<BTreeMap<String, String>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut out = BTreeMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()).take(16) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = crate::api::percent_decode(&k.replace('+', " "))?;
        let v = crate::api::percent_decode(&v.replace('+', " "))?;
        out.insert(k, v);
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode_plus_and_percent() {
        let f = form_pairs(b"identity=n1.example.net&reason=not+ours%21&csrf=ab").unwrap();
        assert_eq!(f["identity"], "n1.example.net");
        assert_eq!(f["reason"], "not ours!");
        assert!(form_pairs(b"a=%ff").is_none());
    }
}
