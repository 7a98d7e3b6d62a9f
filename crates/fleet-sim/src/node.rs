//! One simulated go-choria server in provisioning mode: its small state and the agents it
//! answers (`discovery`, `rpcutil`, `choria_util`, `choria_provision`). Handlers do no I/O:
//! they return the reply body and the lifecycle effects the fleet then carries out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use choria_rpc_client::mcorpc::StatusCode;
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::config::{is_affected, FaultKind, Mode};
use crate::crypto::{self, JwtVerifier, PoolKey, TrustPath};

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

/// What `configure` delivered.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Received {
    /// The configuration settings.
    pub configuration: BTreeMap<String, String>,
    /// Certificate PEM.
    pub certificate: String,
    /// CA PEM.
    pub ca: String,
    /// SSL directory.
    pub ssldir: String,
    /// Whether an encrypted private key was sent (and decrypted).
    pub key_received: bool,
    /// The decrypted key's public half matches the certificate, when both exist.
    pub certificate_matches_key: Option<bool>,
    /// Server JWT, compact form.
    pub server_jwt: String,
    /// Its claims (decoded; verified when an issuer key is configured).
    pub server_jwt_claims: Option<Value>,
    /// How the server JWT was verified, when it was.
    pub server_jwt_trust: Option<TrustPath>,
    /// Action policies by file name.
    pub action_policies: BTreeMap<String, String>,
    /// Open Policy Agent policies by file name.
    pub opa_policies: BTreeMap<String, String>,
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
    /// Issuer key for server JWTs.
    pub issuer: Option<&'a JwtVerifier>,
    /// What counts as provisioned.
    pub mode: Mode,
    /// Provisioning lock duration.
    pub lock_window: Duration,
    /// The RSA key to use for this node's CSRs, when the pool is ready.
    pub rsa_key: Option<&'a PoolKey>,
    /// Faults.
    pub faults: &'a crate::config::Faults,
    /// Now.
    pub now: Instant,
    /// Now in Unix seconds.
    pub unix_now: i64,
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
            actions: Vec::new(),
            received: None,
            problems: Vec::new(),
        }
    }
}

/// A node's record for `--report`.
#[derive(Debug, Clone, Serialize)]
pub struct NodeReport {
    /// Identity.
    pub identity: String,
    /// Phase at report time.
    pub phase: Phase,
    /// Configured and restarted out of provisioning mode with a usable configuration.
    pub provisioned: bool,
    /// Reported version.
    pub version: String,
    /// `choria_provision` actions seen, in order, with the statuscode answered.
    pub actions: Vec<ActionSeen>,
    /// How often the node restarted.
    pub restarts: u16,
    /// The common name of the last CSR made.
    pub csr_cn: Option<String>,
    /// Hex ed25519 public key made by `gen25519`.
    pub ed25519_public_key: Option<String>,
    /// What `configure` delivered (the last successful call).
    pub received: Option<Received>,
    /// Why the node is not usable, or looped back into provisioning.
    pub problems: Vec<String>,
}

/// One action in a report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ActionSeen {
    /// Action name.
    pub action: String,
    /// Statuscode answered.
    pub statuscode: u8,
}

fn reply_json(action: &str, code: StatusCode, msg: &str, data: Value) -> Vec<u8> {
    // Field order as go-choria's mcorpc.Reply marshals it.
    serde_json::to_vec(&json!({
        "statuscode": code.code(),
        "statusmsg": msg,
        "data": data,
        "action": action,
    }))
    .unwrap_or_default()
}

fn ok(action: &str, data: Value) -> Vec<u8> {
    reply_json(action, StatusCode::Ok, "OK", data)
}

fn abort(action: &str, msg: &str) -> Vec<u8> {
    reply_json(action, StatusCode::Aborted, msg, json!({}))
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go field kinds the provisioning request structs use.
#[derive(Clone, Copy)]
enum GoKind {
    Str,
    Int,
    StrMap,
}

/// Request data decoded the way Go's `encoding/json` fills a struct: keys matched exactly,
/// else case-insensitively; unknown keys ignored; `null` leaves the zero value; a type
/// mismatch is an error worded like Go's.
struct GoData {
    values: Vec<Option<Value>>,
}

impl GoData {
    fn parse(data: &Value, go_struct: &str, fields: &[(&str, GoKind)]) -> Result<Self, String> {
        let mut values = vec![None; fields.len()];
        let obj = match data {
            Value::Object(m) => m,
            Value::Null => return Ok(GoData { values }),
            other => {
                return Err(format!(
                    "json: cannot unmarshal {} into Go value of type provision.{go_struct}",
                    json_type(other)
                ))
            }
        };
        let mut first_err = None;
        for (key, v) in obj {
            let idx = fields
                .iter()
                .position(|(f, _)| *f == key)
                .or_else(|| fields.iter().position(|(f, _)| f.eq_ignore_ascii_case(key)));
            let Some(idx) = idx else { continue };
            let (name, kind) = fields[idx];
            if v.is_null() {
                continue;
            }
            let err = |t: &str, go: &str| {
                format!("json: cannot unmarshal {t} into Go struct field {go_struct}.{name} of type {go}")
            };
            let valid = match kind {
                GoKind::Str => v
                    .is_string()
                    .then_some(())
                    .ok_or_else(|| err(json_type(v), "string")),
                GoKind::Int => match v {
                    Value::Number(n) if n.is_i64() => Ok(()),
                    Value::Number(n) => Err(err(&format!("number {n}"), "int")),
                    other => Err(err(json_type(other), "int")),
                },
                GoKind::StrMap => match v {
                    Value::Object(m) => m
                        .values()
                        .find(|x| !x.is_string() && !x.is_null())
                        .map_or(Ok(()), |x| Err(err(json_type(x), "string"))),
                    other => Err(err(json_type(other), "map[string]string")),
                },
            };
            match valid {
                Ok(()) => values[idx] = Some(v.clone()),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(GoData { values }),
        }
    }

    fn str(&self, i: usize) -> &str {
        self.values
            .get(i)
            .and_then(|v| v.as_ref())
            .and_then(|v| v.as_str())
            .unwrap_or("")
    }

    fn int(&self, i: usize) -> i64 {
        self.values
            .get(i)
            .and_then(|v| v.as_ref())
            .and_then(|v| v.as_i64())
            .unwrap_or(0)
    }

    fn map(&self, i: usize) -> BTreeMap<String, String> {
        self.values
            .get(i)
            .and_then(|v| v.as_ref())
            .and_then(|v| v.as_object())
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Go's boolean parsing for configuration values.
fn config_bool(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "yes" | "true" | "y" | "t"
    )
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
        let body: Value = match serde_json::from_slice(call.payload) {
            Ok(v @ Value::Object(_)) => v,
            Ok(other) => {
                return NodeOutcome {
                    reply: Some(reply_json(
                        "",
                        StatusCode::InvalidData,
                        &format!("Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: json: cannot unmarshal {} into Go value of type mcorpc.Request", json_type(&other)),
                        json!({}),
                    )),
                    ..NodeOutcome::default()
                }
            }
            Err(e) => {
                return NodeOutcome {
                    reply: Some(reply_json(
                        "",
                        StatusCode::InvalidData,
                        &format!("Could not process request: could not parse incoming message as a MCollective SimpleRPC Request: {e}"),
                        json!({}),
                    )),
                    ..NodeOutcome::default()
                }
            }
        };
        let action = body.get("action").and_then(|a| a.as_str()).unwrap_or("");
        let data = body.get("data").cloned().unwrap_or(Value::Null);
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

    fn record(&mut self, action: &str, code: Option<u8>) {
        let idx = PROVISION_ACTIONS
            .iter()
            .position(|a| *a == action)
            .and_then(|i| u8::try_from(i).ok())
            .unwrap_or(255);
        self.actions.push((idx, code.unwrap_or(255)));
    }

    fn rpcutil(&self, env: &NodeEnv<'_>, action: &str, _call: &Call<'_>) -> Vec<u8> {
        match action {
            "inventory" => ok(
                action,
                json!({
                    "agents": AGENTS,
                    "classes": [],
                    "collectives": ["provisioning"],
                    "data_plugins": [],
                    "facts": {},
                    "machines": [],
                    "main_collective": "provisioning",
                    "version": self.version(env.version),
                    "upgradable": env.upgradable,
                }),
            ),
            "ping" => ok(action, json!({"pong": env.unix_now})),
            "collective_info" => ok(
                action,
                json!({"main_collective": "provisioning", "collectives": ["provisioning"]}),
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
        let body = if locked && !self.lock_for(env, call.sender, call.caller) {
            abort(action, "Could not obtain provisioning lock")
        } else if env.faults.fails(call.identity, action) {
            abort(action, &format!("simulated failure of {action}"))
        } else {
            match action {
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
        let code = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("statuscode").and_then(|c| c.as_u64()))
            .and_then(|c| u8::try_from(c).ok());
        self.record(action, code);
        // An empty body means the server died before replying.
        out.reply = (!body.is_empty()).then_some(body);
        out
    }

    /// Parse `data` and check the token; `Err` carries the failure reply.
    fn args(
        env: &NodeEnv<'_>,
        action: &str,
        data: &Value,
        go_struct: &str,
        fields: &[(&str, GoKind)],
    ) -> Result<GoData, Vec<u8>> {
        let args = GoData::parse(data, go_struct, fields).map_err(|e| {
            reply_json(
                action,
                StatusCode::InvalidData,
                &format!("Could not parse request data for choria_provision#{action}: {e}"),
                json!({}),
            )
        })?;
        // Token is always field 0.
        if args.str(0) != env.token {
            return Err(abort(action, "Incorrect provision token supplied"));
        }
        Ok(args)
    }

    fn act_jwt(&mut self, env: &NodeEnv<'_>, data: &Value) -> Vec<u8> {
        if let Err(r) = Self::args(env, "jwt", data, "JWTRequest", &[("token", GoKind::Str)]) {
            return r;
        }
        let (private, public) = crypto::x25519_pair();
        self.ecdh_private = Some(private);
        ok(
            "jwt",
            json!({"jwt": env.jwt, "ecdh_public": hex::encode(public)}),
        )
    }

    fn act_gen25519(&mut self, env: &NodeEnv<'_>, data: &Value, identity: &str) -> Vec<u8> {
        let args = match Self::args(
            env,
            "gen25519",
            data,
            "ED25519Request",
            &[("token", GoKind::Str), ("nonce", GoKind::Str)],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
        let public = key.verifying_key().to_bytes();
        let signed: Vec<u8> = if is_affected(FaultKind::BadNonce, identity, env.faults.bad_nonce) {
            format!("not-{}", args.str(1)).into_bytes()
        } else {
            args.str(1).as_bytes().to_vec()
        };
        let (public_hex, signature) = choria_crypto::nonce::sign_nonce(&key, &signed);
        self.ed25519_public = Some(public);
        ok(
            "gen25519",
            json!({
                "public_key": public_hex,
                "directory": env.config_dir,
                "signature": signature,
            }),
        )
    }

    fn act_gencsr(&mut self, env: &NodeEnv<'_>, data: &Value, identity: &str) -> Vec<u8> {
        let args = match Self::args(
            env,
            "gencsr",
            data,
            "CSRRequest",
            &[
                ("token", GoKind::Str),
                ("cn", GoKind::Str),
                ("C", GoKind::Str),
                ("L", GoKind::Str),
                ("O", GoKind::Str),
                ("OU", GoKind::Str),
                ("ST", GoKind::Str),
            ],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let Some(key) = env.rsa_key else {
            return abort("gencsr", "Could not create private key: no key available");
        };
        let mut cn = if args.str(1).is_empty() {
            identity.to_string()
        } else {
            args.str(1).to_string()
        };
        if is_affected(FaultKind::BadCsr, identity, env.faults.bad_csr) {
            cn = format!("bogus-{cn}");
        }
        let mut dns_names = Vec::new();
        if is_affected(FaultKind::DeniedSan, identity, env.faults.denied_san) {
            let label = identity.split('.').next().unwrap_or(identity);
            dns_names.push(format!("{label}.privileged.choria"));
        }
        match key.csr(
            &cn,
            args.str(2),
            args.str(3),
            args.str(4),
            args.str(5),
            &dns_names,
        ) {
            Ok(csr) => {
                let csr = if is_affected(
                    FaultKind::BadCsrSignature,
                    identity,
                    env.faults.bad_csr_signature,
                ) {
                    choria_crypto::pem::break_signature(&csr).unwrap_or(csr)
                } else {
                    csr
                };
                self.csr_cn = Some(cn.into_boxed_str());
                ok(
                    "gencsr",
                    json!({
                        "csr": csr,
                        "public_key": key.public_pem,
                        "ssldir": format!("{}/ssl", env.config_dir),
                    }),
                )
            }
            Err(e) => abort("gencsr", &format!("Could not create CSR bytes: {e}")),
        }
    }

    fn act_configure(&mut self, env: &NodeEnv<'_>, data: &Value, out: &mut NodeOutcome) -> Vec<u8> {
        const A: &str = "configure";
        let args = match Self::args(
            env,
            A,
            data,
            "ConfigureRequest",
            &[
                ("token", GoKind::Str),
                ("config", GoKind::Str),
                ("key", GoKind::Str),
                ("certificate", GoKind::Str),
                ("ca", GoKind::Str),
                ("ssldir", GoKind::Str),
                ("ecdh_public", GoKind::Str),
                ("server_jwt", GoKind::Str),
                ("action_policies", GoKind::StrMap),
                ("opa_policies", GoKind::StrMap),
            ],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let (config, key, cert, ca, ssldir, ecdh, server_jwt) = (
            args.str(1),
            args.str(2),
            args.str(3),
            args.str(4),
            args.str(5),
            args.str(6),
            args.str(7),
        );
        if config.is_empty() {
            return abort(
                A,
                "Did not receive any configuration to write, cannot write a empty configuration file",
            );
        }
        if !key.is_empty() && ecdh.is_empty() {
            return abort(
                A,
                "EDCH Public Key not supplied while providing a private key",
            );
        }
        let settings: BTreeMap<String, String> = match serde_json::from_str::<Value>(config) {
            Ok(Value::Object(m)) => {
                let mut s = BTreeMap::new();
                for (k, v) in m {
                    match v {
                        Value::String(v) => {
                            s.insert(k, v);
                        }
                        Value::Null => {
                            s.insert(k, String::new());
                        }
                        other => {
                            return abort(
                                A,
                                &format!(
                                    "Could not decode configuration data: json: cannot unmarshal {} into Go value of type string",
                                    json_type(&other)
                                ),
                            )
                        }
                    }
                }
                s
            }
            Ok(other) => {
                return abort(
                    A,
                    &format!(
                        "Could not decode configuration data: json: cannot unmarshal {} into Go value of type map[string]string",
                        json_type(&other)
                    ),
                )
            }
            Err(e) => return abort(A, &format!("Could not decode configuration data: {e}")),
        };
        let mut received = Received {
            configuration: settings,
            ..Received::default()
        };
        if !cert.is_empty() && !ssldir.is_empty() && !ca.is_empty() {
            received.certificate = cert.to_string();
            received.ca = ca.to_string();
            received.ssldir = ssldir.to_string();
            if !key.is_empty() {
                let Some(private) = self.ecdh_private else {
                    return abort(
                        A,
                        "TLS Setup Failed: could not decrypt private key: private key not set",
                    );
                };
                let plain = crypto::x25519_shared(&private, ecdh)
                    .and_then(|secret| crypto::decrypt_legacy_pem(key, &secret));
                match plain {
                    Ok(pem_text) => {
                        received.key_received = true;
                        received.certificate_matches_key = Some(cert_matches_key(cert, &pem_text));
                    }
                    Err(e) => {
                        return abort(
                            A,
                            &format!("TLS Setup Failed: could not decrypt private key: {e}"),
                        )
                    }
                }
            } else if let Some(k) = env.rsa_key.filter(|_| self.csr_cn.is_some()) {
                received.certificate_matches_key =
                    Some(cert_spki(cert).as_deref() == Some(&k.spki_der[..]));
            }
        }
        if !server_jwt.is_empty() {
            received.server_jwt = server_jwt.to_string();
            match env.issuer {
                Some(issuer) => match crypto::verify_server_jwt(server_jwt, issuer, env.unix_now) {
                    Ok((claims, trust)) => {
                        received.server_jwt_claims = Some(claims);
                        received.server_jwt_trust = Some(trust);
                    }
                    Err(e) => {
                        return abort(
                            A,
                            &format!("JWT Setup Failed: server JWT does not verify: {e}"),
                        )
                    }
                },
                None => received.server_jwt_claims = crypto::jwt_claims_unverified(server_jwt).ok(),
            }
        }
        let ap = args.map(8);
        let op = args.map(9);
        if let Some(k) = ap.keys().find(|k| !k.ends_with(".policy")) {
            return abort(
                A,
                &format!(
                    "Could not save Action Policies: expected {k:?} to have .policy extension"
                ),
            );
        }
        if let Some(k) = op.keys().find(|k| !k.ends_with(".rego")) {
            return abort(
                A,
                &format!("Could not save Open Policy Agent Policies: expected {k:?} to have .rego extension"),
            );
        }
        received.action_policies = ap;
        received.opa_policies = op;
        // go-choria counts every setting written plus the comment line.
        let written = received.configuration.len() + 1;
        self.received = Some(Box::new(received));
        out.effects.push(Effect::Event {
            kind: "provisioned",
            component: "provision_mode_server",
            new_version: None,
        });
        ok(
            A,
            json!({"message": format!("Wrote {written} lines to {}", env.config_file)}),
        )
    }

    fn act_restart(&mut self, env: &NodeEnv<'_>, data: &Value, out: &mut NodeOutcome) -> Vec<u8> {
        const A: &str = "restart";
        let args = match Self::args(
            env,
            A,
            data,
            "RestartRequest",
            &[("token", GoKind::Str), ("splay", GoKind::Int)],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let Some(received) = &self.received else {
            return abort(
                A,
                &format!(
                    "Configuration {f} could not be parsed, restart cannot continue: open {f}: no such file or directory",
                    f = env.config_file
                ),
            );
        };
        if received
            .configuration
            .get("plugin.choria.server.provision")
            .is_some_and(|v| config_bool(v))
        {
            return abort(
                A,
                &format!(
                    "Configuration {} enables provisioning, restart cannot continue",
                    env.config_file
                ),
            );
        }
        let splay = match args.int(1) {
            0 => 10,
            n => n,
        };
        if splay < 0 {
            // go-choria's rand.N panics here and the server dies without replying.
            self.phase = Phase::ShutDown;
            self.problems.push(format!(
                "restart with negative splay {splay} crashed the server"
            ));
            return Vec::new();
        }
        let secs = rand::Rng::gen_range(&mut rand::thread_rng(), 0..splay) + 2;
        if !self.restart_pending {
            self.restart_pending = true;
            out.effects.push(Effect::Event {
                kind: "shutdown",
                component: "provision_mode_server",
                new_version: None,
            });
            out.effects.push(Effect::Restart);
        }
        ok(
            A,
            json!({"message": format!("Restarting Choria Server after {secs}s")}),
        )
    }

    fn act_shutdown(&mut self, env: &NodeEnv<'_>, data: &Value, out: &mut NodeOutcome) -> Vec<u8> {
        if let Err(r) = Self::args(
            env,
            "shutdown",
            data,
            "ShutdownRequest",
            &[("token", GoKind::Str)],
        ) {
            return r;
        }
        let secs = rand::Rng::gen_range(&mut rand::thread_rng(), 0..10);
        out.effects.push(Effect::Shutdown);
        ok(
            "shutdown",
            json!({"message": format!("Shutting Choria Server down after {secs}s")}),
        )
    }

    fn act_release_update(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        out: &mut NodeOutcome,
    ) -> Vec<u8> {
        const A: &str = "release_update";
        if !env.upgradable {
            return abort(A, "Version updates is not enabled in the configuration");
        }
        let args = match Self::args(
            env,
            A,
            data,
            "ReleaseUpdateRequest",
            &[
                ("token", GoKind::Str),
                ("repository", GoKind::Str),
                ("version", GoKind::Str),
            ],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let (repo, version) = (args.str(1), args.str(2));
        if !(repo.starts_with("http://") || repo.starts_with("https://")) || version.is_empty() {
            return abort(
                A,
                &format!(
                    "Update to version {version} failed, release rolled back: invalid repository {repo:?} or version"
                ),
            );
        }
        self.version = Some(version.into());
        out.effects.push(Effect::Event {
            kind: "upgraded",
            component: "provision_mode_server",
            new_version: Some(version.to_string()),
        });
        if !self.restart_pending {
            self.restart_pending = true;
            out.effects.push(Effect::Event {
                kind: "shutdown",
                component: "provision_mode_server",
                new_version: None,
            });
            out.effects.push(Effect::Restart);
        }
        ok(A, json!({"message": "Restarting Choria Server after 2s"}))
    }

    /// Complete a restart: the server comes back with the configuration it was given. Returns
    /// the component of its startup event (`None`: it does not come up).
    pub fn finish_restart(&mut self, env: &NodeEnv<'_>, identity: &str) -> Option<&'static str> {
        self.restart_pending = false;
        self.restarts = self.restarts.saturating_add(1);
        self.lock = None;
        self.ecdh_private = None;
        let Some(received) = &self.received else {
            // A restart from release_update before any configure: still provisioning.
            self.phase = Phase::Provisioning;
            return Some("provision_mode_server");
        };
        let cfg = &received.configuration;
        let provision_off = cfg
            .get("plugin.choria.server.provision")
            .is_some_and(|v| !config_bool(v));
        if !provision_off {
            self.problems.push(
                "configuration does not set plugin.choria.server.provision=false: provisioning again"
                    .into(),
            );
            self.phase = Phase::Provisioning;
            return Some("provision_mode_server");
        }
        let choria_provider =
            cfg.get("plugin.security.provider").map(String::as_str) == Some("choria");
        if env.mode == Mode::Ed25519 || choria_provider {
            if let Err(e) = self.check_server_jwt(identity) {
                self.problems
                    .push(format!("{e}: token and seed removed, provisioning again"));
                self.phase = Phase::Provisioning;
                return Some("provision_mode_server");
            }
        }
        if env.mode == Mode::Pki {
            if let Err(e) = self.check_pki() {
                self.problems.push(e);
                self.phase = Phase::Broken;
                return None;
            }
        }
        self.phase = Phase::Provisioned;
        Some("server")
    }

    fn check_server_jwt(&self, identity: &str) -> Result<(), String> {
        let r = self.received.as_deref().ok_or("no configuration")?;
        if r.server_jwt.is_empty() {
            return Err("no server JWT received".into());
        }
        let claims = r
            .server_jwt_claims
            .as_ref()
            .ok_or("server JWT cannot be decoded")?;
        let id = claims
            .get("identity")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if id != identity {
            return Err(format!("server JWT identity {id:?} is not {identity:?}"));
        }
        let pk = claims
            .get("public_key")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        match self.ed25519_public {
            Some(k) if hex::encode(k) == pk => Ok(()),
            _ => Err("server JWT public_key does not match server.seed".into()),
        }
    }

    fn check_pki(&self) -> Result<(), String> {
        let r = self.received.as_deref().ok_or("no configuration")?;
        if r.certificate.is_empty() || r.ca.is_empty() || r.ssldir.is_empty() {
            return Err("no certificate, ca and ssldir received".into());
        }
        match r.certificate_matches_key {
            Some(true) => Ok(()),
            Some(false) => Err("certificate does not match the private key".into()),
            None => Err("no private key for the certificate (no CSR made, no key sent)".into()),
        }
    }

    /// Complete a shutdown.
    pub fn finish_shutdown(&mut self) {
        self.phase = Phase::ShutDown;
    }

    /// The node's report record.
    pub fn report(&self, identity: &str, fleet_version: &str) -> NodeReport {
        NodeReport {
            identity: identity.to_string(),
            phase: self.phase,
            provisioned: self.phase == Phase::Provisioned,
            version: self.version(fleet_version).to_string(),
            actions: self
                .actions
                .iter()
                .map(|&(a, c)| ActionSeen {
                    action: PROVISION_ACTIONS
                        .get(usize::from(a))
                        .copied()
                        .unwrap_or("unknown")
                        .to_string(),
                    statuscode: c,
                })
                .collect(),
            restarts: self.restarts,
            csr_cn: self.csr_cn.as_deref().map(str::to_string),
            ed25519_public_key: self.ed25519_public.map(hex::encode),
            received: self.received.as_deref().cloned(),
            problems: self.problems.clone(),
        }
    }
}

fn cert_spki(cert_pem: &str) -> Option<Vec<u8>> {
    use der::Encode as _;
    let cert = choria_crypto::pem::certificate(cert_pem).ok()?;
    cert.tbs_certificate.subject_public_key_info.to_der().ok()
}

fn cert_matches_key(cert_pem: &str, key_pem: &str) -> bool {
    use rsa::pkcs1::DecodeRsaPrivateKey as _;
    use rsa::pkcs8::EncodePublicKey as _;
    let Ok(key) = rsa::RsaPrivateKey::from_pkcs1_pem(key_pem) else {
        return false;
    };
    let Ok(spki) = key.to_public_key().to_public_key_der() else {
        return false;
    };
    cert_spki(cert_pem).as_deref() == Some(spki.as_bytes())
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
