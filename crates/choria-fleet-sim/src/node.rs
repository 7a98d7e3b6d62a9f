//! One simulated go-choria server in provisioning mode, and, with the fleet's `stay_online`,
//! after it: its small state and the agents it answers (`discovery`, `rpcutil`, `choria_util`,
//! `choria_provision`). Handlers do no I/O: they return the reply body and the lifecycle
//! effects the fleet then carries out.
//!
//! This module holds the node's state and the dispatch (agents, the provisioning lock, faults
//! that drop or misaddress replies); `args` decodes what a request carries, `actions` is the
//! behaviour of each `choria_provision` action and `report` the per-node record.

mod actions;
mod args;
mod report;

use std::time::{Duration, Instant};

use choria_rpc_client::mcorpc::StatusCode;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::config::{is_affected, FaultKind, Mode};
use crate::crypto::{JwtVerifier, PoolKey};

use args::json_type;
pub use report::{ActionSeen, Enrollment, EnrollmentSource, NodeReport, Received};

/// The `choria_provision` actions, in a fixed order used for compact per-node records.
pub const PROVISION_ACTIONS: [&str; 8] = [
    "configure",
    "gen25519",
    "gencsr",
    "jwt",
    "release_update",
    "reprovision",
    "restart",
    "shutdown",
];

/// Agents active on a provisioning-mode server, sorted.
pub const AGENTS: [&str; 4] = ["choria_provision", "choria_util", "discovery", "rpcutil"];

/// Where a node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// In provisioning mode, answering on the `provisioning` collective.
    Provisioning,
    /// Left provisioning mode with a usable configuration.
    Provisioned,
    /// Left provisioning mode with a configuration that cannot work (see the node's problems).
    Broken,
    /// Shut down by the `shutdown` action.
    ShutDown,
}

/// A lifecycle or state effect the fleet must carry out for a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Publish an event of this type (`provisioned`, `shutdown`, `upgraded`...) now.
    Event {
        /// Event type.
        kind: &'static str,
        /// Component (`provision_mode_server` or `server`).
        component: &'static str,
        /// `new_version` of an `upgraded` event.
        new_version: Option<String>,
    },
    /// After the restart delay, restart the node ([`Node::finish_restart`]).
    Restart,
    /// After the restart delay, stop the node ([`Node::finish_shutdown`]).
    Shutdown,
    /// After `after`, return to provisioning mode ([`Node::finish_reprovision`]).
    Reprovision {
        /// The delay announced in the reply.
        after: Duration,
    },
}

/// What a handler produced: the reply body (none: stay silent) and the effects.
#[derive(Debug, Default)]
pub struct NodeOutcome {
    /// Reply body to publish, or `None` to send nothing.
    pub reply: Option<Vec<u8>>,
    /// Effects in order.
    pub effects: Vec<Effect>,
    /// The reply names another sender (fault).
    pub wrong_identity: bool,
}

/// Immutable facts shared by every node's handlers.
pub struct NodeEnv<'a> {
    /// The token (`cht`).
    pub token: &'a str,
    /// The provisioning JWT served by `jwt`.
    pub jwt: &'a str,
    /// Fleet version (a node's own version wins after `release_update`).
    pub version: &'a str,
    /// `release_update` allowed.
    pub upgradable: bool,
    /// Configuration file path shown in messages.
    pub config_file: &'a str,
    /// Directory of the configuration file.
    pub config_dir: &'a str,
    /// Issuer key for server JWTs, and which are checked.
    pub issuer: Option<IssuerCheck<'a>>,
    /// What counts as provisioned.
    pub mode: Mode,
    /// Provisioning lock duration.
    pub lock_window: Duration,
    /// The RSA key to use for this node's CSRs, when the pool is ready.
    pub rsa_key: Option<&'a PoolKey>,
    /// The node's key pairs made at start (`None`: make them when asked).
    pub keys: Option<&'a crate::crypto::NodeKeys>,
    /// Faults.
    pub faults: &'a crate::config::Faults,
    /// Now.
    pub now: Instant,
    /// Now in Unix seconds.
    pub unix_now: i64,
    /// When the fleet started, Unix seconds (`rpcutil#daemon_stats` of a node not restarted
    /// since).
    pub fleet_started: i64,
    /// The collectives of a provisioned, online node, main collective first (`None` in
    /// provisioning mode).
    pub collectives: Option<&'a [String]>,
    /// Fixed delay before `reprovision` takes effect; `None`: go-choria's 2 to 11 s.
    pub reprovision_delay: Option<Duration>,
    /// Provisioned nodes stay online, so their configuration's collectives must be usable.
    pub stay_online: bool,
}

/// One simulated server's state; kept small because there are thousands.
#[derive(Debug)]
pub struct Node {
    /// Life phase.
    pub phase: Phase,
    restart_pending: bool,
    version: Option<Box<str>>,
    lock: Option<(u64, Instant)>,
    ecdh_private: Option<[u8; 32]>,
    ed25519_public: Option<[u8; 32]>,
    csr_cn: Option<Box<str>>,
    drop_once_seen: u8,
    restarts: u16,
    /// When it last restarted, Unix seconds (0: not since the fleet started).
    started: i64,
    /// Times restarted out of provisioning mode with a usable configuration.
    provisions: u16,
    /// Times `reprovision` brought the node back into provisioning mode.
    reprovisions: u16,
    /// The fleet's collective set the node answers on while provisioned and online.
    online: Option<u16>,
    /// The credentials of each enrollment, oldest first (at most [`MAX_ENROLLMENTS`]).
    enrollments: Vec<Enrollment>,
    /// (action index or 255 for others, statuscode) in arrival order, for the report.
    actions: Vec<(u8, u8)>,
    received: Option<Box<Received>>,
    problems: Vec<String>,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            phase: Phase::Provisioning,
            restart_pending: false,
            version: None,
            lock: None,
            ecdh_private: None,
            ed25519_public: None,
            csr_cn: None,
            drop_once_seen: 0,
            restarts: 0,
            started: 0,
            provisions: 0,
            reprovisions: 0,
            online: None,
            enrollments: Vec::new(),
            actions: Vec::new(),
            received: None,
            problems: Vec::new(),
        }
    }
}

/// Which received server JWTs are verified: one in `every` across the fleet, the first always.
#[derive(Clone, Copy)]
pub struct IssuerCheck<'a> {
    /// The issuer (or direct signer) key.
    pub key: &'a JwtVerifier,
    /// Check one in this many.
    pub every: u64,
    /// Server JWTs received so far, fleet-wide.
    pub seen: &'a std::sync::atomic::AtomicU64,
}

impl IssuerCheck<'_> {
    /// Whether this server JWT is one to verify (counts it).
    pub fn due(&self) -> bool {
        self.seen
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .is_multiple_of(self.every.max(1))
    }
}

/// Most enrollments kept per node (the oldest are dropped first).
pub const MAX_ENROLLMENTS: usize = 32;

/// go-choria's `mcorpc.Reply`, fields in its order.
#[derive(Serialize)]
struct ReplyOut<'a> {
    statuscode: u8,
    statusmsg: &'a str,
    data: &'a Value,
    action: &'a str,
}

fn reply_json(action: &str, code: StatusCode, msg: &str, data: Value) -> Vec<u8> {
    sonic_rs::to_vec(&ReplyOut {
        statuscode: code.code(),
        statusmsg: msg,
        data: &data,
        action,
    })
    .unwrap_or_default()
}

fn ok(action: &str, data: Value) -> Vec<u8> {
    reply_json(action, StatusCode::Ok, "OK", data)
}

fn abort(action: &str, msg: &str) -> Vec<u8> {
    reply_json(action, StatusCode::Aborted, msg, json!({}))
}

fn lock_key(sender: &str, caller: &str) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sender.hash(&mut h);
    ".".hash(&mut h);
    caller.hash(&mut h);
    h.finish()
}

/// The parts of a request a handler needs.
pub struct Call<'a> {
    /// The node's identity.
    pub identity: &'a str,
    /// Request sender id.
    pub sender: &'a str,
    /// Request caller id.
    pub caller: &'a str,
    /// The agent payload.
    pub payload: &'a [u8],
}

impl Node {
    /// The node's version: its own after `release_update`, else the fleet's.
    pub fn version<'a>(&'a self, fleet: &'a str) -> &'a str {
        self.version.as_deref().unwrap_or(fleet)
    }

    /// Whether the node still answers on the provisioning collective.
    pub fn answers(&self) -> bool {
        self.phase == Phase::Provisioning
    }

    /// The collective set (fleet index) a provisioned node answers on, if it is online.
    pub fn online(&self) -> Option<u16> {
        self.online.filter(|_| self.phase == Phase::Provisioned)
    }

    /// Put a provisioned node online on collective set `set` (fleet index).
    pub fn set_online(&mut self, set: u16) {
        if self.phase == Phase::Provisioned {
            self.online = Some(set);
        }
    }

    /// Which pool RSA key the node's CSRs use, relative to its own: a node back in
    /// provisioning mode after `reprovision` makes its CSRs with another key.
    pub fn key_generation(&self) -> usize {
        usize::from(self.reprovisions)
    }

    /// A node started already provisioned, online on collective set `set`, holding
    /// `enrollment`.
    pub fn preprovisioned(set: u16, enrollment: Enrollment) -> Node {
        Node {
            phase: Phase::Provisioned,
            online: Some(set),
            enrollments: vec![enrollment],
            ..Node::default()
        }
    }

    /// Mark the node unusable for `problem` (for example a collective it cannot join).
    pub fn break_with(&mut self, problem: String) {
        self.phase = Phase::Broken;
        self.online = None;
        self.problems.push(problem);
    }

    /// The collectives the configuration received sets, main collective first (go-choria's
    /// defaults when unset); `None` when the node received none.
    pub fn configured_collectives(&self) -> Option<Vec<String>> {
        self.received
            .as_deref()
            .map(|r| crate::config::collectives_of(&r.configuration))
    }

    /// A `discovery` request: `pong` when the payload contains `ping`, else silence.
    pub fn discovery(&self, payload: &[u8]) -> NodeOutcome {
        let ping = payload.windows(4).any(|w| w == b"ping");
        NodeOutcome {
            reply: ping.then(|| b"pong".to_vec()),
            ..NodeOutcome::default()
        }
    }

    /// Dispatch an RPC request for `agent`.
    pub fn rpc(&mut self, env: &NodeEnv<'_>, agent: &str, call: &Call<'_>) -> NodeOutcome {
        let (action, data) = match parse_rpc_body(call.payload) {
            Ok(parts) => parts,
            Err(message) => {
                return NodeOutcome {
                    reply: Some(reply_json(
                        "",
                        StatusCode::InvalidData,
                        &format!("Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: {message}"),
                        json!({}),
                    )),
                    ..NodeOutcome::default()
                }
            }
        };
        let action = action.as_str().unwrap_or("");
        let wrong_identity = matches!(agent, "choria_provision" | "rpcutil")
            && is_affected(
                FaultKind::WrongIdentity,
                call.identity,
                env.faults.wrong_identity,
            );
        if is_affected(FaultKind::Drop, call.identity, env.faults.drop) {
            if agent == "choria_provision" {
                self.record(action, None);
            }
            return NodeOutcome::default();
        }
        let mut out = match agent {
            "rpcutil" => NodeOutcome {
                reply: Some(self.rpcutil(env, action, call)),
                ..NodeOutcome::default()
            },
            "choria_util" => NodeOutcome {
                reply: Some(choria_util(action)),
                ..NodeOutcome::default()
            },
            "choria_provision" => self.provision(env, action, &data, call),
            _ => NodeOutcome::default(),
        };
        out.wrong_identity = wrong_identity;
        if agent == "choria_provision" {
            if let Some(idx) = PROVISION_ACTIONS.iter().position(|a| *a == action) {
                let bit = 1u8 << idx;
                if is_affected(FaultKind::DropOnce, call.identity, env.faults.drop_once)
                    && self.drop_once_seen & bit == 0
                {
                    self.drop_once_seen |= bit;
                    out.reply = None;
                }
            }
        }
        out
    }

    fn rpcutil(&self, env: &NodeEnv<'_>, action: &str, _call: &Call<'_>) -> Vec<u8> {
        let provisioning = ["provisioning".to_string()];
        let collectives = env.collectives.unwrap_or(&provisioning);
        let main = collectives
            .first()
            .map(String::as_str)
            .unwrap_or("provisioning");
        match action {
            "inventory" => ok(
                action,
                json!({
                    "agents": AGENTS,
                    "classes": [],
                    "collectives": collectives,
                    "data_plugins": [],
                    "facts": {},
                    "machines": [],
                    "main_collective": main,
                    "version": self.version(env.version),
                    "upgradable": env.upgradable,
                }),
            ),
            "ping" => ok(action, json!({"pong": env.unix_now})),
            // go-choria's DaemonStatsReply; the counters are not simulated.
            "daemon_stats" => ok(
                action,
                json!({
                    "agents": AGENTS,
                    "pid": std::process::id(),
                    "starttime": if self.started > 0 { self.started } else { env.fleet_started },
                    "version": self.version(env.version),
                }),
            ),
            "collective_info" => ok(
                action,
                json!({"main_collective": main, "collectives": collectives}),
            ),
            "get_facts" => ok(action, json!({"values": {}})),
            "get_fact" => ok(action, json!({"fact": "", "value": null})),
            _ => reply_json(
                action,
                StatusCode::UnknownAction,
                &format!("Unknown action {action} for agent rpcutil"),
                json!({}),
            ),
        }
    }

    /// Take or extend the provisioning lock for `sender.caller`, as go-choria's `lockFor`.
    fn lock_for(&mut self, env: &NodeEnv<'_>, sender: &str, caller: &str) -> bool {
        let key = lock_key(sender, caller);
        let until = env.now + env.lock_window;
        match self.lock {
            Some((holder, expiry)) if expiry > env.now && holder != key => false,
            _ => {
                self.lock = Some((key, until));
                true
            }
        }
    }

    fn provision(
        &mut self,
        env: &NodeEnv<'_>,
        action: &str,
        data: &Value,
        call: &Call<'_>,
    ) -> NodeOutcome {
        let locked = matches!(
            action,
            "configure" | "gen25519" | "gencsr" | "jwt" | "release_update"
        );
        let mut out = NodeOutcome::default();
        // A provisioned server keeps the agent while it knows a provisioning token (7.1).
        let online = self.phase == Phase::Provisioned;
        let body = if locked && !self.lock_for(env, call.sender, call.caller) {
            abort(action, "Could not obtain provisioning lock")
        } else if env.faults.fails(call.identity, action) {
            abort(action, &format!("simulated failure of {action}"))
        } else {
            match action {
                "jwt" | "gen25519" | "gencsr" | "configure" if online => abort(
                    action,
                    "Cannot reconfigure a server that is not in provisioning mode",
                ),
                "release_update" if online => abort(
                    action,
                    "Cannot update a server that is not in provisioning mode",
                ),
                "reprovision" if online => self.act_reprovision(env, data, &mut out),
                "jwt" => self.act_jwt(env, data),
                "gen25519" => self.act_gen25519(env, data, call.identity),
                "gencsr" => self.act_gencsr(env, data, call.identity),
                "configure" => self.act_configure(env, data, &mut out),
                "restart" => self.act_restart(env, data, &mut out),
                "shutdown" => self.act_shutdown(env, data, &mut out),
                "reprovision" => abort(
                    action,
                    "Server is already in provisioning mode, cannot enable provisioning mode again",
                ),
                "release_update" => self.act_release_update(env, data, &mut out),
                _ => reply_json(
                    action,
                    StatusCode::UnknownAction,
                    &format!("Unknown action {action} for agent choria_provision"),
                    json!({}),
                ),
            }
        };
        // Only the status code is read back from the reply (the rest is skipped, not built).
        #[derive(serde::Deserialize)]
        struct Status {
            statuscode: Option<u64>,
        }
        let code = sonic_rs::from_slice::<Status>(&body)
            .ok()
            .and_then(|s| s.statuscode)
            .and_then(|c| u8::try_from(c).ok());
        self.record(action, code);
        // An empty body means the server died before replying.
        out.reply = (!body.is_empty()).then_some(body);
        out
    }

    /// Complete a shutdown.
    pub fn finish_shutdown(&mut self) {
        self.phase = Phase::ShutDown;
    }
}

fn choria_util(action: &str) -> Vec<u8> {
    match action {
        "machine_states" => ok(
            action,
            json!({"machine_ids": [], "machine_names": [], "states": Map::new()}),
        ),
        "info" => ok(
            action,
            json!({
                "security": "file",
                "connector": "nats",
                "client_flavour": "nats.go",
                "secure_protocol": false,
                "connector_tls": true,
                "using_srv": false,
                "middleware_servers": [],
            }),
        ),
        _ => reply_json(
            action,
            StatusCode::UnknownAction,
            &format!("Unknown action {action} for agent choria_util"),
            json!({}),
        ),
    }
}

/// The `action` and `data` of an RPC request body; the other fields are skipped, not built.
/// What go-choria's decoder refuses is refused with its words (the body's JSON type, or the
/// parser's message).
fn parse_rpc_body(payload: &[u8]) -> Result<(Value, Value), String> {
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        action: Value,
        #[serde(default)]
        data: Value,
    }
    let object = payload
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'{');
    if object {
        if let Ok(b) = sonic_rs::from_slice::<Body>(payload) {
            return Ok((b.action, b.data));
        }
    }
    // Not an object, or one the typed read refuses (a repeated key, bad JSON): read it whole
    // as before, which keeps the last of a repeated key and words every error.
    match serde_json::from_slice::<Value>(payload) {
        Ok(Value::Object(mut m)) => Ok((
            m.remove("action").unwrap_or(Value::Null),
            m.remove("data").unwrap_or(Value::Null),
        )),
        Ok(other) => Err(format!(
            "json: cannot unmarshal {} into Go value of type mcorpc.Request",
            json_type(&other)
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_rpc_body_gives_its_action_and_data_or_go_choria_s_refusal() {
        let (a, d) = parse_rpc_body(
            br#" {"agent":"choria_provision","action":"gen25519","data":{"nonce":"n1"},"ttl":60}"#,
        )
        .unwrap();
        assert_eq!(a, json!("gen25519"));
        assert_eq!(d, json!({"nonce": "n1"}));
        // No data, and a non-string action, read as before: absent and not a string.
        let (a, d) = parse_rpc_body(br#"{"action":5}"#).unwrap();
        assert_eq!((a, d), (json!(5), Value::Null));
        // A repeated key keeps its last value, as a whole read does.
        let (a, _) = parse_rpc_body(br#"{"action":"jwt","action":"restart"}"#).unwrap();
        assert_eq!(a, json!("restart"));
        assert_eq!(
            parse_rpc_body(br#"["action","jwt"]"#).unwrap_err(),
            "json: cannot unmarshal array into Go value of type mcorpc.Request"
        );
        assert_eq!(
            parse_rpc_body(b"null").unwrap_err(),
            "json: cannot unmarshal null into Go value of type mcorpc.Request"
        );
        assert!(parse_rpc_body(br#"{"action":"jwt""#)
            .unwrap_err()
            .contains("EOF"));
    }

    #[test]
    fn an_idle_node_stays_small() {
        // The fleet holds one `Mutex<Node>` per node; a node started provisioned adds one
        // enrollment record.
        assert!(std::mem::size_of::<std::sync::Mutex<Node>>() <= 256);
        let e = Enrollment {
            source: EnrollmentSource::Preprovisioned,
            at: 0,
            certificate_serial: Some("0".repeat(32)),
            certificate_sha256: None,
            server_jwt_id: None,
            server_jwt_sha256: None,
            expires: Some(0),
        };
        let heap = std::mem::size_of::<Enrollment>() + 32;
        assert!(std::mem::size_of::<std::sync::Mutex<Node>>() + heap <= 1024);
        let n = Node::preprovisioned(0, e);
        assert_eq!(n.online(), Some(0));
    }
}
