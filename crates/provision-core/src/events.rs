//! What the cycle and the work queue report about each node, through
//! [`Observer::node_event`](crate::Observer::node_event), so that a node history, a status page
//! or an audit trail can be kept outside the core: when a node was queued and how it was found,
//! each step with its time and result, and how its cycle ended ([`Verdict`]).
//!
//! The core keeps none of it: an embedder that records nothing pays nothing.

use std::time::Duration;

use crate::fleet::Source;
use crate::provision::{Host, Outcome, ProvisionError, ProvisionErrorKind};

/// Where a node stands, as a node history shows it. The first two are passing states; the
/// others end a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeState {
    /// Waiting in the work queue.
    Queued,
    /// A worker is provisioning it.
    Working,
    /// Configured and restarted.
    Provisioned,
    /// Asked to upgrade; it comes back after its restart.
    Upgraded,
    /// Shut down on the helper's request.
    ShutDown,
    /// Left to another provisioner that holds its provisioning lock.
    LockHeld,
    /// The helper or the admission policy deferred it.
    Deferred,
    /// A check refused it (identity, provisioning JWT, ed25519 proof, CSR, policy).
    Refused,
    /// Something failed on the way (an RPC, the helper, enrolment, waiting too long).
    Failed,
    /// `dry_run`: judged by the policy and the helper, and left as it was.
    DryRun,
    /// Waiting for an operator's approval, left in provisioning mode (not a failure).
    Pending,
}

impl NodeState {
    /// Every state, in the order above.
    pub const ALL: [NodeState; 11] = [
        NodeState::Queued,
        NodeState::Working,
        NodeState::Provisioned,
        NodeState::Upgraded,
        NodeState::ShutDown,
        NodeState::LockHeld,
        NodeState::Deferred,
        NodeState::Refused,
        NodeState::Failed,
        NodeState::DryRun,
        NodeState::Pending,
    ];

    /// The state's name in the API, the CLI and the audit trail.
    pub const fn label(self) -> &'static str {
        match self {
            NodeState::Queued => "queued",
            NodeState::Working => "working",
            NodeState::Provisioned => "provisioned",
            NodeState::Upgraded => "upgraded",
            NodeState::ShutDown => "shut_down",
            NodeState::LockHeld => "lock_held",
            NodeState::Deferred => "deferred",
            NodeState::Refused => "refused",
            NodeState::Failed => "failed",
            NodeState::DryRun => "dry_run",
            NodeState::Pending => "pending",
        }
    }

    /// The state named `label` (as [`NodeState::label`] writes it).
    pub fn parse(label: &str) -> Option<NodeState> {
        NodeState::ALL.into_iter().find(|s| s.label() == label)
    }

    /// Whether the state ends a cycle.
    pub const fn is_terminal(self) -> bool {
        !matches!(self, NodeState::Queued | NodeState::Working)
    }

    /// Whether the state is a failure of some kind (refused, deferred or failed): what a status
    /// page lists as needing attention.
    pub const fn is_problem(self) -> bool {
        matches!(
            self,
            NodeState::Refused | NodeState::Deferred | NodeState::Failed
        )
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// What a node was given: the certificate the helper supplied (pki, or with a helper `key`)
/// and the server JWT this provisioner signed (ed25519), each by what identifies it. Never the
/// certificate, key or token itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Issued {
    /// The helper's certificate as sent to the node, or why it could not be read (it was still
    /// sent: the node judges it).
    pub certificate: Option<Result<CertificateId, String>>,
    /// The server JWT signed for the node.
    pub server_jwt: Option<ServerJwtId>,
}

/// What identifies a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateId {
    /// The serial number, lower-case hex of its DER integer.
    pub serial: String,
    /// The SHA-256 fingerprint of the certificate's DER, lower-case hex.
    pub sha256: String,
    /// When it expires (Unix seconds).
    pub not_after: i64,
}

/// What identifies a server JWT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerJwtId {
    /// Its `jti`.
    pub id: String,
    /// Its `exp` (Unix seconds).
    pub expires: Option<i64>,
}

/// How a node's cycle ended: the state, the step it ended at, the cause, and what it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The terminal state.
    pub state: NodeState,
    /// The step the cycle ended at: an `agent#action` label, or `identity`, `queue`,
    /// `jwt_check`, `ed25519_check`, `csr_check`, `policy`, `helper`, `enroll`, `upgrade`,
    /// `paused`; `done` when it was provisioned.
    pub step: &'static str,
    /// The error with its cause (empty on success), as the error log line words it.
    pub cause: String,
    /// How the node was found.
    pub source: Source,
    /// The helper's `msg`, when it ran.
    pub helper_msg: String,
    /// What the node was given.
    pub issued: Issued,
    /// The upgrade asked for, `(from, to)`.
    pub upgrade: Option<(String, String)>,
    /// How long the cycle took.
    pub elapsed: Duration,
    /// Whether the node answered any request: a cycle that ends without an answer (nothing
    /// serves the name, it never replied, it waited too long in the queue) reached no decision
    /// about a node that may not exist, and an audit trail may count such cycles rather than
    /// record each.
    pub answered: bool,
}

impl Verdict {
    /// The verdict on `host` after its cycle returned `result` in `elapsed`.
    pub fn of(result: &Result<Outcome, ProvisionError>, host: &Host, elapsed: Duration) -> Verdict {
        let mut v = Verdict {
            state: NodeState::Provisioned,
            step: "done",
            cause: String::new(),
            source: host.source(),
            helper_msg: host.helper_msg().to_string(),
            issued: host.issued().clone(),
            upgrade: None,
            elapsed,
            answered: host.answered(),
        };
        match result {
            Ok(Outcome::Provisioned) => {}
            Ok(Outcome::ShutDown) => {
                v.state = NodeState::ShutDown;
                v.step = crate::rpc::Action::Shutdown.label();
            }
            Ok(Outcome::Upgraded { from, to }) => {
                v.state = NodeState::Upgraded;
                v.step = crate::rpc::Action::ReleaseUpdate.label();
                v.upgrade = Some((from.clone(), to.clone()));
            }
            Ok(Outcome::LockHeld { action }) => {
                v.state = NodeState::LockHeld;
                v.step = action.label();
                v.cause = format!("provisioning lock held by another provisioner during {action}");
            }
            Ok(Outcome::DryRun { would }) => {
                v.state = NodeState::DryRun;
                v.step = "helper";
                v.cause = format!("dry run: would {would}");
            }
            Ok(Outcome::Pending { reason }) => {
                v.state = NodeState::Pending;
                v.step = "approval";
                v.cause = format!("waiting for approval: {reason}");
            }
            // Active-active: another replica holds the node's claim; it is left to it, as to
            // the holder of its provisioning lock.
            Ok(Outcome::ClaimedElsewhere { by, done }) => {
                v.state = NodeState::LockHeld;
                v.step = "claim";
                v.cause = format!(
                    "claimed by replica {}{}",
                    crate::identity::escaped(by),
                    if *done { ", which finished it" } else { "" }
                );
            }
            Err(e) => {
                let (state, step) = e.kind.state_and_step();
                v.state = state;
                v.step = step;
                v.cause = e.kind.to_string();
            }
        }
        v
    }

    /// The verdict on a node dropped from the queue after waiting `waited`.
    pub fn stale(source: Source, waited: Duration) -> Verdict {
        let kind = ProvisionErrorKind::Stale(waited);
        let (state, step) = kind.state_and_step();
        Verdict {
            state,
            step,
            cause: kind.to_string(),
            source,
            helper_msg: String::new(),
            issued: Issued::default(),
            upgrade: None,
            elapsed: Duration::ZERO,
            answered: false,
        }
    }
}

/// One thing that happened to a node.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum NodeEvent<'a> {
    /// Queued for provisioning, found by `source`.
    Queued {
        /// How it was found.
        source: Source,
    },
    /// A worker took it off the queue.
    Started {
        /// How it was found.
        source: Source,
    },
    /// A step ended: an RPC after its tries, a check, the policy, the helper.
    Step {
        /// The step: an `agent#action` label, `policy` or `helper`.
        step: &'static str,
        /// Whether it succeeded.
        ok: bool,
        /// The tries it took (1 for a step that is not an RPC).
        tries: u32,
        /// How long it took, tries and back-off included.
        elapsed: Duration,
        /// The error or the message (the helper's `msg`, the policy's reason); may be empty.
        /// Node- and helper-supplied text: escape it before it reaches a log or a page.
        detail: &'a str,
    },
    /// The cycle ended.
    Finished(&'a Verdict),
}

impl ProvisionErrorKind {
    /// The state a failure leaves the node in and the step it happened at.
    pub fn state_and_step(&self) -> (NodeState, &'static str) {
        use ProvisionErrorKind as K;
        match self {
            K::Identity(_) => (NodeState::Refused, "identity"),
            K::FirstContact(e) => (NodeState::Failed, e.action.label()),
            K::Stale(_) => (NodeState::Failed, "queue"),
            K::Paused(_) => (NodeState::Failed, "paused"),
            K::Rpc(e) => (NodeState::Failed, e.action.label()),
            K::Jwt(_) => (NodeState::Refused, "jwt_check"),
            K::Ed25519(_) => (NodeState::Refused, "ed25519_check"),
            K::Csr(_) => (NodeState::Refused, "csr_check"),
            K::Helper(_) | K::EmptyConfiguration => (NodeState::Failed, "helper"),
            K::Deferred(_) => (NodeState::Deferred, "helper"),
            K::Denied(_) => (NodeState::Refused, "policy"),
            K::Revoked(_) => (NodeState::Refused, "deny_list"),
            K::ServerJwt(_) | K::KeyEncryption(_) => (NodeState::Failed, "enroll"),
            K::Upgrade { .. } => (NodeState::Failed, "upgrade"),
            K::LockHeld(a) => (NodeState::LockHeld, a.label()),
            K::Approval(_) => (NodeState::Failed, "approval"),
            K::Claim(_) | K::ClaimLost(_) => (NodeState::Failed, "claim"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_labels_round_trip_and_classify() {
        for s in NodeState::ALL {
            assert_eq!(NodeState::parse(s.label()), Some(s));
        }
        assert_eq!(NodeState::parse("FAILED"), None);
        assert!(!NodeState::Queued.is_terminal());
        assert!(NodeState::LockHeld.is_terminal());
        assert!(NodeState::Refused.is_problem());
        assert!(!NodeState::Provisioned.is_problem());
    }

    #[test]
    fn failures_map_to_their_state_and_step() {
        use crate::policy::PolicyError;
        use crate::rpc::{Action, RpcError, RpcErrorKind};
        let rpc = ProvisionErrorKind::Rpc(RpcError::new(
            "n1",
            Action::Configure,
            RpcErrorKind::Timeout,
        ));
        assert_eq!(
            rpc.state_and_step(),
            (NodeState::Failed, "choria_provision#configure")
        );
        assert_eq!(
            ProvisionErrorKind::Csr(PolicyError::NoCsr).state_and_step(),
            (NodeState::Refused, "csr_check")
        );
        assert_eq!(
            ProvisionErrorKind::Deferred("later".into()).state_and_step(),
            (NodeState::Deferred, "helper")
        );
        assert_eq!(
            ProvisionErrorKind::Denied("no".into()).state_and_step(),
            (NodeState::Refused, "policy")
        );
        let v = Verdict::stale(Source::Event, Duration::from_secs(200));
        assert_eq!((v.state, v.step), (NodeState::Failed, "queue"));
        assert!(v.cause.contains("waiting"), "{}", v.cause);
    }
}
