//! The `rego_policy`: a Rego policy, evaluated in process with `regorus`, deciding whether a node
//! that passed the built-in checks may go on to the helper.
//!
//! The policy is one `.rego` file or every `.rego` file of a directory (not its
//! subdirectories). It is compiled at start, where an error is a `check` problem naming the file
//! and line, and compiled again when a file changes ([`RegoPolicy::reload_if_changed`], polled
//! by the daemon every second); a new version that does not compile is logged and the last good
//! one kept. Each evaluation has [`EVAL_TIME_LIMIT`]; the interpreter is built without the
//! `http` and `opa-runtime` builtins, so a policy reaches neither the network nor the
//! environment, and it has no file builtins. A policy that errors, or gives no decision, denies
//! the node with the error as the reason.
//!
//! The rule read is `data.choria.provisioner.decision`, an object
//! `{"allow": bool, "defer": bool, "pending": bool, "reason": string}` (`pending`: the node waits
//! for an operator's approval, see [`fleet_lifecycle::approval`]; a policy without it reads as before);
//! the input is the helper's input with the inventory parsed, the provisioning token removed,
//! `now_ns` (the time of the decision) and `denied: false` (the deny list is checked before the
//! policy, so a denied node never reaches it: the field is there for policies that want to
//! say so, and is always `false`).

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use provision_core::admission::DecisionFuture;
use provision_core::helper_protocol::HelperInput;
use provision_core::identity::escaped;
use provision_core::{Admission, Decision};
use regorus::utils::limits::ExecutionTimerConfig;
use regorus::Engine;
/// The value a policy is evaluated on, from `regorus`.
pub use regorus::Value;
use tracing::{error, info, warn};

/// The package policies are written in.
pub const PACKAGE: &str = "data.choria.provisioner";
/// The rule read for every node.
pub const DECISION_RULE: &str = "data.choria.provisioner.decision";
/// How long one node's evaluation may take; past it the node is denied.
pub const EVAL_TIME_LIMIT: Duration = Duration::from_millis(250);
/// The largest policy file read.
const MAX_POLICY_BYTES: u64 = 1024 * 1024;
/// The most `.rego` files read from a directory.
const MAX_POLICY_FILES: usize = 256;
/// The longest reason kept from a policy's answer.
const MAX_REASON: usize = 512;
/// The most helper inputs `record_helper_inputs` writes.
pub const MAX_RECORDED_INPUTS: usize = 10_000;

/// Why a policy could not be loaded.
#[derive(Debug)]
pub enum PolicyError {
    /// A file or directory could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file did not compile; the message names the file, line and column.
    Compile {
        /// The file.
        path: PathBuf,
        /// The interpreter's message.
        message: String,
    },
    /// No file declares the `choria.provisioner` package's `decision` rule.
    NoDecision(PathBuf),
}

impl std::fmt::Display for PolicyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyError::Read { path, reason } => {
                write!(f, "cannot read rego_policy {}: {reason}", path.display())
            }
            PolicyError::Compile { path, message } => {
                write!(
                    f,
                    "rego_policy {} does not compile: {message}",
                    path.display()
                )
            }
            PolicyError::NoDecision(path) => write!(
                f,
                "rego_policy {} has no rule `decision` in package choria.provisioner",
                path.display()
            ),
        }
    }
}

impl std::error::Error for PolicyError {}

/// What identifies one version of the policy's files: names, sizes and modification times.
type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>)>;

/// A compiled policy.
struct Compiled {
    engine: Engine,
    fingerprint: Fingerprint,
}

/// The `.rego` files of `path`: itself, or a directory's, sorted.
fn policy_files(path: &Path) -> Result<Vec<PathBuf>, PolicyError> {
    let read = |reason: std::io::Error| PolicyError::Read {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(path).map_err(read)? {
        let p = entry.map_err(read)?.path();
        if p.extension().is_some_and(|e| e == "rego") && p.is_file() {
            files.push(p);
            if files.len() > MAX_POLICY_FILES {
                return Err(PolicyError::Read {
                    path: path.to_path_buf(),
                    reason: format!("more than {MAX_POLICY_FILES} .rego files"),
                });
            }
        }
    }
    files.sort();
    Ok(files)
}

fn fingerprint(path: &Path) -> Result<Fingerprint, PolicyError> {
    let mut out = Vec::new();
    for f in policy_files(path)? {
        let meta = std::fs::metadata(&f).map_err(|e| PolicyError::Read {
            path: f.clone(),
            reason: e.to_string(),
        })?;
        out.push((f, meta.len(), meta.modified().ok()));
    }
    Ok(out)
}

/// The interpreter's multi-line message (location, source excerpt, error) as
/// `FILE:LINE:COL: error: MESSAGE`.
fn one_line(message: &str) -> String {
    let at = message
        .lines()
        .find_map(|l| l.trim().strip_prefix("-->").map(str::trim));
    let error = message
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("error:"));
    match (at, error) {
        (Some(at), Some(error)) => format!("{at}: {error}"),
        _ => message
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// Reads and compiles the policy at `path`.
fn compile(path: &Path) -> Result<Compiled, PolicyError> {
    let fingerprint = fingerprint(path)?;
    let mut engine = Engine::new();
    engine.set_strict_builtin_errors(true);
    engine.set_execution_timer_config(ExecutionTimerConfig {
        limit: EVAL_TIME_LIMIT,
        check_interval: NonZeroU32::MIN,
    });
    if fingerprint.is_empty() {
        return Err(PolicyError::NoDecision(path.to_path_buf()));
    }
    for (file, len, _) in &fingerprint {
        if *len > MAX_POLICY_BYTES {
            return Err(PolicyError::Read {
                path: file.clone(),
                reason: format!("larger than {MAX_POLICY_BYTES} bytes"),
            });
        }
        let text = std::fs::read_to_string(file).map_err(|e| PolicyError::Read {
            path: file.clone(),
            reason: e.to_string(),
        })?;
        engine
            .add_policy(file.display().to_string(), text)
            .map_err(|e| PolicyError::Compile {
                path: file.clone(),
                message: one_line(&e.to_string()),
            })?;
    }
    let declared = engine
        .get_packages()
        .map(|p| p.iter().any(|p| p == PACKAGE))
        .unwrap_or(false);
    if !declared {
        return Err(PolicyError::NoDecision(path.to_path_buf()));
    }
    Ok(Compiled {
        engine,
        fingerprint,
    })
}

/// The loaded policy, shared by the workers and the reloader.
pub struct RegoPolicy {
    path: PathBuf,
    current: RwLock<Arc<Compiled>>,
}

impl RegoPolicy {
    /// Loads and compiles the policy at `path`.
    pub fn load(path: impl Into<PathBuf>) -> Result<RegoPolicy, PolicyError> {
        let path = path.into();
        let compiled = compile(&path)?;
        Ok(RegoPolicy {
            path,
            current: RwLock::new(Arc::new(compiled)),
        })
    }

    /// The policy's file or directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn current(&self) -> Arc<Compiled> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Compiles the policy again when its files changed. `Ok(true)` when a new version is in
    /// use; on an error the last good version stays in use.
    pub fn reload_if_changed(&self) -> Result<bool, PolicyError> {
        let now = fingerprint(&self.path)?;
        if now == self.current().fingerprint {
            return Ok(false);
        }
        let compiled = compile(&self.path)?;
        match self.current.write() {
            Ok(mut g) => *g = Arc::new(compiled),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(compiled),
        }
        Ok(true)
    }

    /// Polls the files every `every` until `stop`, logging each reload and keeping the last
    /// good version when a new one does not compile.
    pub async fn watch(
        self: Arc<Self>,
        every: Duration,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut failed: Option<Fingerprint> = None;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            match self.reload_if_changed() {
                Ok(true) => {
                    failed = None;
                    info!("Reloaded rego_policy {}", self.path.display());
                }
                Ok(false) => {}
                Err(e) => {
                    // Logged once per broken version, not every second.
                    let fp = fingerprint(&self.path).ok();
                    if fp != failed || fp.is_none() {
                        error!("Keeping the previous rego_policy: {e}");
                        failed = fp;
                    }
                }
            }
        }
    }

    /// Evaluates the policy for `input` (a helper input as JSON, the inventory parsed). Each
    /// worker thread keeps its own copy of the current version's interpreter, so an evaluation
    /// neither clones the policy nor waits for another worker.
    pub fn evaluate(&self, input: Value) -> Result<Decision, String> {
        thread_local! {
            static ENGINE: std::cell::RefCell<Option<(Arc<Compiled>, Engine)>> =
                const { std::cell::RefCell::new(None) };
        }
        let current = self.current();
        ENGINE.with(|cell| {
            let mut slot = cell.borrow_mut();
            let fresh = match &*slot {
                Some((c, _)) => !Arc::ptr_eq(c, &current),
                None => true,
            };
            if fresh {
                let engine = current.engine.clone();
                *slot = Some((Arc::clone(&current), engine));
            }
            let Some((_, engine)) = slot.as_mut() else {
                return Err("policy error: no interpreter".to_string());
            };
            engine.set_input(input);
            match engine.eval_rule(DECISION_RULE.to_string()) {
                Ok(v) => Ok(decision_of(&v)),
                Err(e) => {
                    // An interrupted evaluation's copy is not used again.
                    *slot = None;
                    Err(format!("policy error: {e}"))
                }
            }
        })
    }

    /// Every rule of the package with its value for `input`: the rules that fired.
    pub fn explain(&self, input: Value) -> Result<Vec<(String, String)>, String> {
        let mut engine = self.current().engine.clone();
        engine.set_input(input);
        let results = engine
            .eval_query(PACKAGE.to_string(), false)
            .map_err(|e| format!("policy error: {e}"))?;
        let mut out = Vec::new();
        for r in &results.result {
            for e in &r.expressions {
                if let Ok(map) = e.value.as_object() {
                    for (k, v) in map.iter() {
                        let name = match k.as_string() {
                            Ok(s) => s.to_string(),
                            Err(_) => k.to_string(),
                        };
                        out.push((name, v.to_json_str().unwrap_or_else(|_| v.to_string())));
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Reads the `decision` object.
fn decision_of(v: &Value) -> Decision {
    if *v == Value::Undefined {
        return Decision::Deny("the policy gave no decision".into());
    }
    let flag = |k: &str| v[k].as_bool().copied().unwrap_or(false);
    let mut reason = match v["reason"].as_string() {
        Ok(s) => s.to_string(),
        Err(_) => String::new(),
    };
    if reason.len() > MAX_REASON {
        let mut cut = MAX_REASON;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    if flag("defer") {
        if reason.is_empty() {
            reason = "deferred by policy".into();
        }
        Decision::Defer(reason)
    } else if flag("pending") {
        if reason.is_empty() {
            reason = "pending by policy".into();
        }
        Decision::Pending(reason)
    } else if flag("allow") {
        Decision::Allow
    } else {
        if reason.is_empty() {
            reason = "not allowed by policy".into();
        }
        Decision::Deny(reason)
    }
}

/// The policy's input for a helper input: its JSON with the inventory parsed (`null` when it is
/// not JSON), the token removed and `now_ns` added.
pub fn input_json(input: &HelperInput, now_ns: i64) -> serde_json::Value {
    let mut v = serde_json::to_value(input).unwrap_or(serde_json::Value::Null);
    if let Some(obj) = v.as_object_mut() {
        let inv = serde_json::from_str::<serde_json::Value>(&input.inventory)
            .unwrap_or(serde_json::Value::Null);
        obj.insert("inventory".into(), inv);
        if let Some(jwt) = obj.get_mut("jwt").and_then(|j| j.as_object_mut()) {
            // The provisioning token and the broker password are secrets: never recorded, never
            // a policy's to see.
            for (k, val) in jwt.iter_mut() {
                if matches!(k.as_str(), "cht" | "token" | "chpwd") {
                    *val = serde_json::Value::String(String::new());
                }
            }
        }
        obj.insert("now_ns".into(), serde_json::Value::from(now_ns));
        // The deny list is checked before the policy: a node reaching it is not denied.
        obj.insert("denied".into(), serde_json::Value::Bool(false));
    }
    v
}

/// A policy input from JSON.
pub fn to_value(json: &serde_json::Value) -> Result<Value, String> {
    serde_json::from_value::<Value>(json.clone()).map_err(|e| format!("invalid input: {e}"))
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The daemon's admission: the policy when one is configured, and the recording of helper
/// inputs when `record_helper_inputs` is set.
pub struct PolicyAdmission {
    policy: Option<Arc<RegoPolicy>>,
    record: Option<PathBuf>,
    recorded: AtomicUsize,
}

impl PolicyAdmission {
    /// An admission with `policy` (none: allow all), recording inputs in `record`.
    pub fn new(policy: Option<Arc<RegoPolicy>>, record: Option<PathBuf>) -> Self {
        PolicyAdmission {
            policy,
            record,
            recorded: AtomicUsize::new(0),
        }
    }

    fn record(&self, identity: &str, json: &serde_json::Value) {
        let Some(dir) = &self.record else { return };
        // The identity rule admits no path separators; checked again as this names a file.
        if identity.contains(['/', '\\']) || identity.starts_with('.') {
            return;
        }
        let file = dir.join(format!("{identity}.json"));
        if !file.exists() && self.recorded.fetch_add(1, Ordering::Relaxed) >= MAX_RECORDED_INPUTS {
            return;
        }
        let text = serde_json::to_vec_pretty(json).unwrap_or_default();
        let written = {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            // The service's alone: a recorded input names a node and what it presented.
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&file)
                .and_then(|mut f| f.write_all(&text))
        };
        if let Err(e) = written {
            warn!(
                identity = %escaped(identity),
                "Could not record the helper input in {}: {e}",
                file.display()
            );
        }
    }
}

impl Admission for PolicyAdmission {
    fn decide<'a>(&'a self, input: &'a HelperInput) -> DecisionFuture<'a> {
        Box::pin(async move {
            let json = input_json(input, now_ns());
            self.record(&input.identity, &json);
            let Some(policy) = self.policy.clone() else {
                return Decision::Allow;
            };
            // Evaluated on the blocking pool, so a slow policy never holds an async worker;
            // the engine stops itself at EVAL_TIME_LIMIT, and the wait is bounded besides.
            let evaluation = tokio::task::spawn_blocking(move || {
                to_value(&json).and_then(|v| policy.evaluate(v))
            });
            match tokio::time::timeout(EVAL_TIME_LIMIT * 4, evaluation).await {
                Ok(Ok(Ok(d))) => d,
                Ok(Ok(Err(e))) => Decision::Deny(e),
                Ok(Err(e)) => Decision::Deny(format!("policy error: evaluation failed: {e}")),
                Err(_) => Decision::Deny(format!(
                    "policy error: no decision within {:?}",
                    EVAL_TIME_LIMIT * 4
                )),
            }
        })
    }
}

/// The admission the configuration asks for (the policy and input recording), and the policy
/// for the daemon to watch. Neither configured: `(None, None)`, every node goes on.
pub fn admission(
    config: &crate::config::Config,
) -> Result<(Option<PolicyAdmission>, Option<Arc<RegoPolicy>>), crate::Error> {
    let policy = if config.rego_policy.is_empty() {
        None
    } else {
        let p = Arc::new(RegoPolicy::load(&config.rego_policy)?);
        info!("Admitting nodes by rego_policy {}", p.path().display());
        Some(p)
    };
    let record = if config.record_helper_inputs.is_empty() {
        None
    } else {
        let dir = PathBuf::from(&config.record_helper_inputs);
        std::fs::create_dir_all(&dir)
            .map_err(|e| crate::Error::file("create", "record_helper_inputs", &dir, e))?;
        Some(dir)
    };
    if policy.is_none() && record.is_none() {
        return Ok((None, None));
    }
    Ok((Some(PolicyAdmission::new(policy.clone(), record)), policy))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write policy");
        p
    }

    const ALLOW_EXAMPLE: &str = r#"package choria.provisioner
default decision := {"allow": false, "reason": "not in example.net"}
decision := {"allow": true} if endswith(input.identity, ".example.net")
"#;

    fn input(identity: &str) -> Value {
        let hi = HelperInput {
            identity: identity.into(),
            inventory: r#"{"facts":{"role":"web"}}"#.into(),
            ..Default::default()
        };
        to_value(&input_json(&hi, 0)).expect("input")
    }

    #[test]
    fn decisions_read_allow_deny_and_defer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(dir.path(), "p.rego", ALLOW_EXAMPLE);
        let pol = RegoPolicy::load(&p).expect("compiles");
        assert_eq!(pol.evaluate(input("a.example.net")), Ok(Decision::Allow));
        assert_eq!(
            pol.evaluate(input("a.example.com")),
            Ok(Decision::Deny("not in example.net".into()))
        );
        assert_eq!(
            decision_of(&Value::from_json_str(r#"{"allow":true,"defer":true}"#).expect("json")),
            Decision::Defer("deferred by policy".into())
        );
        assert_eq!(
            decision_of(&Value::from_json_str(r#"{"pending":true}"#).expect("json")),
            Decision::Pending("pending by policy".into())
        );
        assert_eq!(
            input("a.example.net")["denied"],
            Value::from(false),
            "the deny decision is in the input"
        );
        assert!(matches!(decision_of(&Value::Undefined), Decision::Deny(_)));
    }

    #[test]
    fn syntax_error_names_file_and_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(
            dir.path(),
            "bad.rego",
            "package choria.provisioner\n\ndecision := {\"allow\": true if {\n",
        );
        let e = RegoPolicy::load(&p)
            .err()
            .expect("does not compile")
            .to_string();
        assert!(e.contains("bad.rego"), "{e}");
        assert!(e.contains("bad.rego:3:"), "line 3 named: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
    }

    #[tokio::test]
    async fn erroring_policy_denies_with_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(
            dir.path(),
            "p.rego",
            "package choria.provisioner\ndecision := {\"allow\": to_number(input.identity) > 1}\n",
        );
        let pol = RegoPolicy::load(&p).expect("compiles");
        let hi = HelperInput {
            identity: "n1".into(),
            ..Default::default()
        };
        let adm = PolicyAdmission::new(Some(Arc::new(pol)), None);
        match adm.decide(&hi).await {
            Decision::Deny(r) => assert!(r.contains("policy error"), "{r}"),
            d => panic!("expected a deny, got {d:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_policy_past_the_time_limit_denies_without_holding_a_worker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(
            dir.path(),
            "slow.rego",
            "package choria.provisioner\n\
             n := count([1 | some i in numbers.range(1, 5000); some j in numbers.range(1, 5000)])\n\
             decision := {\"allow\": n > 0}\n",
        );
        let pol = RegoPolicy::load(&p).expect("compiles");
        let adm = PolicyAdmission::new(Some(Arc::new(pol)), None);
        let hi = HelperInput {
            identity: "n1".into(),
            ..Default::default()
        };
        // Stopped by the limit, not after the 25 million iterations; meanwhile the async
        // workers keep running other tasks.
        let ticks = Arc::new(AtomicUsize::new(0));
        let ticker = {
            let ticks = Arc::clone(&ticks);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let decisions = futures::future::join_all((0..4).map(|_| adm.decide(&hi))).await;
        ticker.abort();
        for d in decisions {
            match d {
                Decision::Deny(r) => assert!(r.contains("exceeded time limit"), "{r}"),
                d => panic!("expected a deny, got {d:?}"),
            }
        }
        assert!(
            ticks.load(Ordering::Relaxed) >= 10,
            "the async workers were held: {} ticks",
            ticks.load(Ordering::Relaxed)
        );
    }

    #[tokio::test]
    async fn no_network_or_environment_builtins() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (name, text) in [
            (
                "http.rego",
                "package choria.provisioner\ndecision := {\"allow\": http.send({\"method\": \"get\", \"url\": \"http://127.0.0.1:1/\"}).status_code == 200}\n",
            ),
            (
                "env.rego",
                "package choria.provisioner\ndecision := {\"allow\": opa.runtime().env.HOME != \"\"}\n",
            ),
        ] {
            let p = write(dir.path(), name, text);
            // Either refused when compiled or an error (a deny) when evaluated: never run.
            if let Ok(pol) = RegoPolicy::load(&p) {
                let adm = PolicyAdmission::new(Some(Arc::new(pol)), None);
                let hi = HelperInput {
                    identity: "n1".into(),
                    ..Default::default()
                };
                match adm.decide(&hi).await {
                    Decision::Deny(r) => assert!(r.contains("policy error"), "{name}: {r}"),
                    d => panic!("{name}: expected a deny, got {d:?}"),
                }
            }
        }
    }

    #[test]
    fn reload_keeps_last_good_policy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write(dir.path(), "p.rego", ALLOW_EXAMPLE);
        let pol = RegoPolicy::load(dir.path()).expect("directory compiles");
        assert!(!pol.reload_if_changed().expect("unchanged"));
        write(
            dir.path(),
            "p.rego",
            "package choria.provisioner\ndecision := {\n",
        );
        assert!(pol.reload_if_changed().is_err());
        assert_eq!(pol.evaluate(input("a.example.net")), Ok(Decision::Allow));
        std::fs::write(
            &p,
            "package choria.provisioner\ndecision := {\"allow\": false, \"reason\": \"closed!\"}\n",
        )
        .expect("write");
        assert!(pol.reload_if_changed().expect("new version"));
        assert_eq!(
            pol.evaluate(input("a.example.net")),
            Ok(Decision::Deny("closed!".into()))
        );
    }

    #[tokio::test]
    async fn recorded_input_has_no_secret_is_the_services_alone_and_parses_the_inventory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hi = HelperInput {
            identity: "n1.example.net".into(),
            inventory: r#"{"facts":{"x":1}}"#.into(),
            jwt: Some(provision_core::helper_protocol::ProvisioningClaims {
                token: "s3cret-token".into(),
                prov_nats_pass: "broker-pa55".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let adm = PolicyAdmission::new(None, Some(dir.path().to_path_buf()));
        assert_eq!(adm.decide(&hi).await, Decision::Allow);
        let text =
            std::fs::read_to_string(dir.path().join("n1.example.net.json")).expect("recorded");
        assert!(
            !text.contains("s3cret-token") && !text.contains("broker-pa55"),
            "{text}"
        );
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join("n1.example.net.json"))
                .expect("recorded")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["inventory"]["facts"]["x"], 1);
    }
}
