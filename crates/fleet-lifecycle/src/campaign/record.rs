//! What a campaign's bucket holds: the campaign record (selection, limits, state, progress,
//! heartbeat) and one record a node, and the states each moves through.

use super::*;

/// Where a campaign is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CampaignState {
    /// Nodes are being sent reprovision requests.
    Running,
    /// An operator paused it; `rotate resume` continues.
    Paused,
    /// It stopped itself: more than `--stop-if-failing` of the finished nodes failed.
    Stopped,
    /// An operator ended it.
    Aborted,
    /// Every node is done or failed.
    Completed,
}

impl CampaignState {
    /// The state's name.
    pub fn label(self) -> &'static str {
        match self {
            CampaignState::Running => "running",
            CampaignState::Paused => "paused",
            CampaignState::Stopped => "stopped",
            CampaignState::Aborted => "aborted",
            CampaignState::Completed => "completed",
        }
    }

    /// Whether the campaign is over.
    pub fn finished(self) -> bool {
        matches!(self, CampaignState::Aborted | CampaignState::Completed)
    }
}

impl std::fmt::Display for CampaignState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// One failed node, as the campaign record keeps the latest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFailure {
    /// The node.
    pub identity: String,
    /// Why.
    pub error: String,
    /// When (Unix seconds).
    pub at: i64,
}

/// The limits of a campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Reprovision requests sent a minute at most.
    pub rate_per_minute: u32,
    /// Nodes between the reprovision request and their new provisioning at most.
    pub max_in_flight: u32,
    /// The campaign stops itself when more than this share (percent) of finished nodes failed.
    pub stop_if_failing: f64,
    /// A node not provisioned again this long after it acknowledged is failed (seconds).
    pub node_timeout_secs: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            rate_per_minute: 500,
            max_in_flight: 100,
            stop_if_failing: 5.0,
            node_timeout_secs: 900,
        }
    }
}

impl Limits {
    /// Checks the limits are usable.
    pub fn validate(&self) -> Result<(), CampaignError> {
        if self.rate_per_minute == 0 {
            return Err(CampaignError::Invalid(
                "--rate must be at least 1/min".into(),
            ));
        }
        if self.max_in_flight == 0 {
            return Err(CampaignError::Invalid(
                "--max-in-flight must be at least 1".into(),
            ));
        }
        if !(0.0..=100.0).contains(&self.stop_if_failing) {
            return Err(CampaignError::Invalid(
                "--stop-if-failing must be a share from 0% to 100%".into(),
            ));
        }
        if self.node_timeout_secs == 0 {
            return Err(CampaignError::Invalid(
                "--node-timeout must be longer than zero".into(),
            ));
        }
        Ok(())
    }
}

/// The campaign, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CampaignRecord {
    /// Its id (time and a random part).
    pub id: String,
    /// Who started it.
    pub by: String,
    /// What selected its nodes, as given.
    pub selector: String,
    /// When it was started (Unix seconds).
    pub created: i64,
    /// Its limits.
    pub limits: Limits,
    /// Its state.
    pub state: CampaignState,
    /// Why it is paused, stopped or aborted, and by whom.
    #[serde(default)]
    pub reason: String,
    /// Nodes in it.
    pub total: u64,
    /// Nodes not yet sent a request.
    pub pending: u64,
    /// Nodes sent a request and not yet provisioned again.
    pub in_flight: u64,
    /// Nodes provisioned again.
    pub done: u64,
    /// Nodes failed.
    pub failed: u64,
    /// Who drives it (empty when nobody does).
    #[serde(default)]
    pub driver: String,
    /// The driver's last heartbeat (Unix seconds).
    #[serde(default)]
    pub heartbeat: i64,
    /// When it is expected to finish at the current pace (Unix seconds).
    #[serde(default)]
    pub eta: Option<i64>,
    /// The latest failures.
    #[serde(default)]
    pub recent_failures: Vec<NodeFailure>,
    /// The first audit stream sequence that can be about this campaign.
    #[serde(default)]
    pub audit_from: Option<u64>,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

impl CampaignRecord {
    /// A new campaign's record: `id`, started by `by` at `created` over `total` nodes with
    /// `limits`, written paused ("recording its nodes") until every node is stored, so a
    /// driver never sees half of them.
    pub fn new(
        id: String,
        by: String,
        selector: String,
        created: i64,
        limits: Limits,
        total: u64,
        audit_from: Option<u64>,
    ) -> Self {
        CampaignRecord {
            id,
            by,
            selector,
            created,
            limits,
            state: CampaignState::Paused,
            reason: "recording its nodes".into(),
            total,
            pending: total,
            in_flight: 0,
            done: 0,
            failed: 0,
            driver: String::new(),
            heartbeat: 0,
            eta: None,
            recent_failures: Vec::new(),
            audit_from,
            tag: String::new(),
        }
    }

    /// `done/total, failed, in flight` in a few words.
    pub fn progress(&self) -> String {
        format!(
            "{} of {} provisioned again, {} failed, {} in flight, {} waiting",
            self.done, self.total, self.failed, self.in_flight, self.pending
        )
    }

    /// Seconds since the driver's heartbeat at `now`.
    pub fn heartbeat_age(&self, now: i64) -> i64 {
        now.saturating_sub(self.heartbeat)
    }

    /// Whether a driver holds the lease at `now`.
    pub fn driven(&self, now: i64) -> bool {
        !self.driver.is_empty()
            && self.heartbeat_age(now) < i64::try_from(LEASE.as_secs()).unwrap_or(i64::MAX)
    }
}

/// Where one node of a campaign is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeRotation {
    /// Not yet sent a request.
    Pending,
    /// Acknowledged the reprovision request.
    Sent,
    /// Provisioned again.
    Done,
    /// Failed.
    Failed,
}

/// One node of a campaign, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The node.
    pub identity: String,
    /// Where it is.
    pub state: NodeRotation,
    /// When it acknowledged the request (Unix seconds).
    #[serde(default)]
    pub sent_at: Option<i64>,
    /// When it was provisioned again or failed (Unix seconds).
    #[serde(default)]
    pub finished_at: Option<i64>,
    /// Requests sent that got no reply.
    #[serde(default)]
    pub tries: u32,
    /// Why it failed.
    #[serde(default)]
    pub error: String,
    /// The HMAC tag (empty without a secret).
    #[serde(default)]
    pub tag: String,
}

/// The bucket key of `identity`.
pub fn node_key(identity: &str) -> String {
    format!("{NODE_PREFIX}{}", hex::encode(identity.as_bytes()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::campaign::testing::*;

    #[test]
    fn limits_refuse_zero_rates_and_shares_out_of_range() {
        assert!(Limits::default().validate().is_ok());
        for bad in [
            Limits {
                rate_per_minute: 0,
                ..Limits::default()
            },
            Limits {
                max_in_flight: 0,
                ..Limits::default()
            },
            Limits {
                stop_if_failing: 150.0,
                ..Limits::default()
            },
            Limits {
                node_timeout_secs: 0,
                ..Limits::default()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_lease_lapses_after_its_heartbeat_ages() {
        let mut rec = record(1);
        rec.driver = "ops pid 1".into();
        rec.heartbeat = 100;
        assert!(rec.driven(100 + 29));
        assert!(!rec.driven(100 + 30));
        rec.driver.clear();
        assert!(!rec.driven(100));
    }
}
