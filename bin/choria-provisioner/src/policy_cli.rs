//! `choria-provisioner policy eval`: the configured `rego_policy` against a recorded helper
//! input, offline: the decision and reason, and with `--explain` every rule that produced a
//! value.

use anyhow::{bail, Context, Result};
use provisioner::config::Config;
use provisioner::provision_core::Decision;

use crate::cli::PolicyEvalArgs;
use provisioner::rego::{self, RegoPolicy};

/// The largest input file read.
const MAX_INPUT_BYTES: u64 = 4 * 1024 * 1024;

/// Prints `decision: allow|deny|defer`, `reason: ...` and, with `--explain`, `rule NAME = VALUE`
/// lines. Exits with success whatever the decision; an unreadable input or policy fails.
pub fn eval(args: &PolicyEvalArgs) -> Result<()> {
    let loaded = Config::load(&args.config)
        .with_context(|| format!("cannot load {}", args.config.display()))?;
    let cfg = loaded.config;
    if cfg.rego_policy.is_empty() {
        bail!("{} sets no rego_policy", args.config.display());
    }
    let policy = RegoPolicy::load(&cfg.rego_policy)?;
    let len = std::fs::metadata(&args.input)
        .with_context(|| format!("cannot read input {}", args.input.display()))?
        .len();
    if len > MAX_INPUT_BYTES {
        bail!(
            "input {} is larger than {MAX_INPUT_BYTES} bytes",
            args.input.display()
        );
    }
    let text = std::fs::read_to_string(&args.input)
        .with_context(|| format!("cannot read input {}", args.input.display()))?;
    let mut json: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("input {} is not JSON", args.input.display()))?;
    // An input recorded from a helper's stdin carries the inventory as a string.
    if let Some(obj) = json.as_object_mut() {
        if let Some(inv) = obj.get("inventory").and_then(|i| i.as_str()) {
            let parsed = serde_json::from_str(inv).unwrap_or(serde_json::Value::Null);
            obj.insert("inventory".into(), parsed);
        }
        if !obj.contains_key("now_ns") {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as i64)
                .unwrap_or(0);
            obj.insert("now_ns".into(), now.into());
        }
    }
    let value = rego::to_value(&json).map_err(anyhow::Error::msg)?;
    let decision = match policy.evaluate(value.clone()) {
        Ok(d) => d,
        Err(e) => Decision::Deny(e),
    };
    println!("decision: {}", decision.label());
    println!("reason: {}", decision.reason());
    if args.explain {
        match policy.explain(value) {
            Ok(rules) => {
                for (name, v) in rules {
                    println!("rule {name} = {v}");
                }
            }
            Err(e) => println!("explain: {e}"),
        }
    }
    Ok(())
}
