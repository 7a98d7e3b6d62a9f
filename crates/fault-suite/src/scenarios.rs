//! The table of scenarios: name, what it injects, the function that runs it, and whether it
//! mostly waits out timeouts (run beside the others to keep the suite short).

use anyhow::Result;

use crate::active_active::{
    aa_late_replica, aa_replica_killed, aa_server_stopped, aa_three_replicas,
    ha_cluster_server_killed,
};
use crate::broker::{broker_restart, provisioner_sigkill};
use crate::floods::{audit_flood, event_flood, load, queue_full};
use crate::ha::{election_bucket_missing, ha_leader_killed, lock_held};
use crate::harness::Env;
use crate::helper_faults::{
    helper_bad_upgrade, helper_exit, helper_flood, helper_garbage, helper_hang, helper_silent,
};
use crate::jwt_faults::{jwt_alg_none, jwt_expired, jwt_hs256, jwt_not_yet_valid, jwt_wrong_key};
use crate::keys::{
    signing_key_removed, signing_key_rotated, signing_token_rotated, verify_cert_damaged,
};
use crate::monitor::{monitor_idle_flood, monitor_slowloris};
use crate::node_faults::{
    fleet_restart, node_bad_csr, node_bad_csr_signature, node_bad_nonce, node_configure_fails,
    node_denied_name, node_denied_san, node_duplicate, node_garbage, node_oversize, node_silent,
    node_slow, node_wrong_identity,
};
use crate::rotation::rotation_kills;
use crate::secrets::secrets;
use crate::webhook_faults::webhook_down;

/// One scenario of the suite.
pub struct Scenario {
    /// The name on the command line.
    pub name: &'static str,
    /// What it injects, for `--list` and the log.
    pub about: &'static str,
    /// Runs it in its own directory; a one-line summary of what held.
    pub run: fn(&Env, &str) -> Result<String>,
    /// Mostly waiting out timeouts: run beside the others to keep the suite short.
    pub long: bool,
}

/// Every scenario, in the order of the summary table.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "secrets",
            about: "ed25519 at debug level: no secret reaches a log, metric or helper input",
            run: secrets,
            long: false,
        },
        Scenario {
            name: "node-slow",
            about: "a fifth of the nodes answer after 6 s, past the 4 s inventory timeout",
            run: node_slow,
            long: true,
        },
        Scenario {
            name: "node-silent",
            about: "a fifth of the nodes are discovered but never answer an RPC",
            run: node_silent,
            long: true,
        },
        Scenario {
            name: "node-wrong-identity",
            about: "a fifth of the nodes reply under another identity",
            run: node_wrong_identity,
            long: true,
        },
        Scenario {
            name: "node-garbage",
            about: "a fifth of the nodes answer RPCs with a body that is not JSON",
            run: node_garbage,
            long: false,
        },
        Scenario {
            name: "node-oversize",
            about: "a fifth of the nodes answer RPCs with replies over the 1 MiB limit",
            run: node_oversize,
            long: true,
        },
        Scenario {
            name: "node-duplicate",
            about: "a third of the nodes send every RPC reply twice",
            run: node_duplicate,
            long: false,
        },
        Scenario {
            name: "node-bad-nonce",
            about: "ed25519: a fifth of the nodes sign something other than the nonce",
            run: node_bad_nonce,
            long: false,
        },
        Scenario {
            name: "node-bad-csr",
            about: "pki: a fifth of the nodes send a CSR for another common name",
            run: node_bad_csr,
            long: false,
        },
        Scenario {
            name: "node-bad-csr-signature",
            about: "pki: a fifth of the nodes send a CSR whose signature does not verify",
            run: node_bad_csr_signature,
            long: false,
        },
        Scenario {
            name: "node-denied-san",
            about: "pki: a fifth of the nodes add a DNS name matching cert_deny_list to their CSR",
            run: node_denied_san,
            long: false,
        },
        Scenario {
            name: "node-denied-name",
            about: "pki: nodes named to match cert_deny_list are refused",
            run: node_denied_name,
            long: false,
        },
        Scenario {
            name: "node-configure-fails",
            about: "a fifth of the nodes abort configure",
            run: node_configure_fails,
            long: false,
        },
        Scenario {
            name: "fleet-restart",
            about: "every node restarts (simulator killed and started again) mid-cycle",
            run: fleet_restart,
            long: true,
        },
        Scenario {
            name: "jwt-wrong-key",
            about: "every node serves a provisioning JWT signed by an unknown key",
            run: jwt_wrong_key,
            long: false,
        },
        Scenario {
            name: "jwt-expired",
            about: "every node serves an expired provisioning JWT",
            run: jwt_expired,
            long: false,
        },
        Scenario {
            name: "jwt-not-yet-valid",
            about: "every node serves a provisioning JWT valid only from tomorrow",
            run: jwt_not_yet_valid,
            long: false,
        },
        Scenario {
            name: "jwt-alg-none",
            about: "every node serves an unsigned (alg: none) provisioning JWT",
            run: jwt_alg_none,
            long: false,
        },
        Scenario {
            name: "jwt-hs256",
            about: "every node serves an HS256 JWT keyed with the verification key",
            run: jwt_hs256,
            long: false,
        },
        Scenario {
            name: "lock-held",
            about: "two provisioners without election race for one fleet",
            run: lock_held,
            long: false,
        },
        Scenario {
            name: "helper-hang",
            about: "the helper hangs past its 10 s timeout and leaves a child behind",
            run: helper_hang,
            long: false,
        },
        Scenario {
            name: "helper-exit-1",
            about: "the helper exits non-zero",
            run: helper_exit,
            long: false,
        },
        Scenario {
            name: "helper-silent",
            about: "the helper prints nothing",
            run: helper_silent,
            long: false,
        },
        Scenario {
            name: "webhook-down",
            about: "the helper is a webhook that refuses connections, then comes back",
            run: webhook_down,
            long: false,
        },
        Scenario {
            name: "helper-garbage",
            about: "the helper prints something that is not JSON",
            run: helper_garbage,
            long: false,
        },
        Scenario {
            name: "helper-flood",
            about: "the helper prints 100 MiB",
            run: helper_flood,
            long: false,
        },
        Scenario {
            name: "helper-bad-upgrade",
            about: "the helper asks for an upgrade to an unparsable version",
            run: helper_bad_upgrade,
            long: false,
        },
        Scenario {
            name: "signing-key-removed",
            about: "ed25519: the JWT signing key disappears while running, then returns",
            run: signing_key_removed,
            long: false,
        },
        Scenario {
            name: "signing-key-rotated",
            about: "ed25519: the JWT signing key is replaced while running",
            run: signing_key_rotated,
            long: false,
        },
        Scenario {
            name: "verify-cert-damaged",
            about: "the jwt_verify_cert file is replaced by a truncated certificate while running, then restored",
            run: verify_cert_damaged,
            long: false,
        },
        Scenario {
            name: "signing-token-rotated",
            about: "ed25519 chain issuer: jwt_signing_token removed, then replaced by another issuer's while running",
            run: signing_token_rotated,
            long: false,
        },
        Scenario {
            name: "broker-restart",
            about: "nats-server restarted while the fleet is being provisioned",
            run: broker_restart,
            long: true,
        },
        Scenario {
            name: "provisioner-sigkill",
            about: "ed25519: the provisioner is killed with SIGKILL mid-run and started again",
            run: provisioner_sigkill,
            long: false,
        },
        Scenario {
            name: "load",
            about: "10,000 nodes (2,000 without --release): half found by discovery while the other half announce at once",
            run: load,
            long: false,
        },
        Scenario {
            name: "queue-full",
            about: "a burst of startup events overflows a 10-entry work queue; the dropped nodes come back with the next discovery",
            run: queue_full,
            long: true,
        },
        Scenario {
            name: "election-bucket-missing",
            about: "leader election on without the bucket, then the bucket is created",
            run: election_bucket_missing,
            long: false,
        },
        Scenario {
            name: "ha-leader-killed",
            about: "two provisioners with leader election; the leader is killed mid-run",
            run: ha_leader_killed,
            long: true,
        },
        Scenario {
            name: "monitor-slowloris",
            about: "slowloris clients on the monitor port during a run: /metrics answers, the fleet is provisioned",
            run: monitor_slowloris,
            long: false,
        },
        Scenario {
            name: "monitor-idle-flood",
            about: "1,000 idle connections held on the monitor port (descriptor limit 1024) during a run",
            run: monitor_idle_flood,
            long: false,
        },
        Scenario {
            name: "event-flood",
            about: "20,000 startup events for bogus nodes (a tenth with hostile identities), then a real fleet of 200",
            run: event_flood,
            long: false,
        },
        Scenario {
            name: "audit-flood",
            about: "100,000 startup events for nodes that do not exist with an audit_file: the file stays under 1 MB, the real fleet is recorded",
            run: audit_flood,
            long: true,
        },
        // Active-active on a three-server cluster (active_active.rs).
        Scenario {
            name: "aa-three-replicas",
            about: "three active-active replicas on a 3-server cluster share 2,000 nodes",
            run: aa_three_replicas,
            long: false,
        },
        Scenario {
            name: "aa-replica-killed",
            about: "three active-active replicas; one is SIGKILLed mid-run",
            run: aa_replica_killed,
            long: true,
        },
        Scenario {
            name: "aa-server-stopped",
            about: "three active-active replicas; the nats-server one of them is connected to is stopped mid-run",
            run: aa_server_stopped,
            long: false,
        },
        Scenario {
            name: "aa-late-replica",
            about: "two active-active replicas, a third started mid-run",
            run: aa_late_replica,
            long: false,
        },
        Scenario {
            name: "ha-cluster-server-killed",
            about: "leader election on a 3-server cluster; the leader's server is killed mid-run",
            run: ha_cluster_server_killed,
            long: true,
        },
        // Rotation campaigns (rotation.rs).
        Scenario {
            name: "rotation-kills",
            about: "10,000 provisioned nodes rotated by two active-active replicas; rotate and one replica SIGKILLed a third of the way, rotate resume finishes",
            run: rotation_kills,
            long: true,
        },
    ]
}
