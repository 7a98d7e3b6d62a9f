//! Rotation campaigns: send go-choria's `choria_provision#reprovision` to provisioned servers on
//! their main collective, in waves, and follow each back through provisioning until the
//! provisioner has provisioned it again.
//!
//! A campaign lives in the `CHORIA_PROVISIONER_CAMPAIGN` key-value bucket of the provisioning
//! account, next to the fleet control bucket:
//!
//! - `campaign` holds the one campaign: who started it, what it selected, its limits (nodes a
//!   minute, nodes in flight, the share of failures that stops it, how long a node may take),
//!   its state (`running`, `paused`, `stopped`, `aborted`, `completed`) and its progress, which
//!   the process driving it rewrites every two seconds with a heartbeat.
//! - `n.<hex of the identity>` holds one node: `pending`, `sent` (the node acknowledged the
//!   reprovision request and is on its way back), `done` or `failed` with why.
//!
//! Whoever drives a campaign holds a lease: the heartbeat. Another process can take over a
//! campaign whose heartbeat is older than [`LEASE`] (its driver was killed or lost the
//! broker), so `rotate resume` continues a campaign from any host, with every node where it
//! was. Writes of the campaign record are compare-and-set on the key's revision, so a pause or
//! an abort from another shell is never overwritten by a heartbeat.
//!
//! A node counts as done when the provisioner records it `provisioned` after it acknowledged
//! the reprovision: read from the audit stream (`audit_stream`), which is durable, so a driver
//! that resumes after a crash reads what it missed; and from the node's `startup` lifecycle
//! event of component `server` on the main collective, which a server publishes when it starts
//! with its new configuration. Records are sealed as fleet control's are (the claims secret):
//! a record that does not verify is ignored.

mod audit;
mod bucket;
mod driver;
mod follow;
mod record;
mod select;
mod text;

pub use audit::*;
pub use bucket::*;
pub use driver::*;
pub use follow::*;
pub use record::*;
pub use select::*;
pub use text::*;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::kv;
use choria_rpc_client::protocol::{FactFilter, Filter};
use choria_rpc_client::rpc::RpcClient;
use choria_rpc_client::streams::{BucketError, StreamsApi};
use futures::StreamExt;
use provision_core::identity::{escaped, IdentityRule};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::control::REQUEST_TIMEOUT;
use crate::seal::Seal;
use crate::{bounded_to as bounded, now_unix};

/// The bucket campaigns live in.
pub const CAMPAIGN_BUCKET: &str = "CHORIA_PROVISIONER_CAMPAIGN";

/// The key of the campaign record.
pub const CAMPAIGN_KEY: &str = "campaign";

/// The prefix of node keys.
pub const NODE_PREFIX: &str = "n.";

/// A driver whose heartbeat is older than this may be replaced.
pub const LEASE: Duration = Duration::from_secs(30);

/// How often the driver writes its progress and heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(2);

/// How long a reprovision request waits for its reply (go-choria's agent timeout).
pub const REPROVISION_TIMEOUT: Duration = Duration::from_secs(20);

/// Tries of a reprovision request that gets no reply before the node is failed.
pub const SEND_TRIES: u32 = 3;

/// The wait before trying a node that did not answer again, times the tries so far (one
/// minute, then two): a node an earlier request reached is in provisioning mode, off the main
/// collective, until it is provisioned again, which may wait out go-choria's two-minute
/// provisioning lock of a killed provisioner and then the next discovery.
pub const RETRY_WAIT: Duration = Duration::from_secs(60);

/// How long after acknowledging a node with no news is asked, on its main collective, when
/// it last started (`rpcutil#daemon_stats`), and how long between such questions.
pub const CHECK_AFTER: Duration = Duration::from_secs(60);

/// How long that question waits for its answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The most such questions on their way at once.
const MAX_CHECKS: usize = 64;

/// Failures kept in the campaign record for `rotate status`.
pub const RECENT_FAILURES: usize = 20;

/// The most nodes one campaign holds.
pub const MAX_TARGETS: usize = 2_000_000;

/// The failure share is judged only once this many nodes have finished.
pub const FAILING_MIN_FINISHED: u64 = 20;

/// The largest identities file read.
const MAX_IDENTITIES_FILE: u64 = 256 * 1024 * 1024;

/// The largest record kept (bytes).
const MAX_RECORD: usize = 64 * 1024;

/// The longest error text kept for a node.
const MAX_ERROR: usize = 512;

/// How many bucket writes run at once when a campaign is created or loaded.
const BULK: usize = 64;

/// Why a campaign could not be started, read or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CampaignError {
    /// Neither route to Choria Streams answered.
    #[error("rotation campaigns need Choria Streams (JetStream), and neither the choria.streams import nor the account's own JetStream answered: {detail}")]
    Unreachable {
        /// What each route said.
        detail: String,
    },
    /// A read or write of the bucket failed.
    #[error("could not {action} in campaign bucket {CAMPAIGN_BUCKET}: {detail}")]
    Request {
        /// What was being done.
        action: String,
        /// The server's answer.
        detail: String,
    },
    /// There is no campaign.
    #[error("there is no rotation campaign; start one with choria-provisioner rotate")]
    NoCampaign,
    /// A campaign is already under way.
    #[error("rotation campaign {id} is {state} ({progress}); abort it before starting another")]
    Exists {
        /// Its id.
        id: String,
        /// Its state.
        state: CampaignState,
        /// Its progress.
        progress: String,
    },
    /// Another process drives the campaign.
    #[error("rotation campaign {id} is driven by {driver} (heartbeat {age}s ago); it can be taken over once its heartbeat is {}s old", LEASE.as_secs())]
    Busy {
        /// Its id.
        id: String,
        /// The driver.
        driver: String,
        /// Seconds since its heartbeat.
        age: i64,
    },
    /// The campaign is not in a state the command applies to.
    #[error("rotation campaign {id} is {state}: {what}")]
    State {
        /// Its id.
        id: String,
        /// Its state.
        state: CampaignState,
        /// What cannot be done.
        what: String,
    },
    /// The selection or the limits are not usable.
    #[error("rotate: {0}")]
    Invalid(String),
    /// The nodes could not be selected.
    #[error("rotate: could not select nodes: {0}")]
    Select(String),
    /// The audit stream could not be read.
    #[error("rotate: could not read audit stream {stream}: {detail}")]
    Audit {
        /// The stream.
        stream: String,
        /// What failed.
        detail: String,
    },
}

fn request(action: impl Into<String>, e: impl std::fmt::Display) -> CampaignError {
    CampaignError::Request {
        action: action.into(),
        detail: e.to_string(),
    }
}

/// Records for the tests of every module of campaigns.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod testing {
    use super::*;

    pub(crate) fn record(total: u64) -> CampaignRecord {
        let mut rec = CampaignRecord::new(
            "c1".into(),
            "ops@admin".into(),
            "--identities x".into(),
            1_000,
            Limits::default(),
            total,
            None,
        );
        rec.state = CampaignState::Running;
        rec.reason.clear();
        rec
    }

    pub(crate) fn node(id: &str, state: NodeRotation) -> NodeRecord {
        NodeRecord {
            identity: id.into(),
            state,
            sent_at: None,
            finished_at: None,
            tries: 0,
            error: String::new(),
            tag: String::new(),
        }
    }
}
