//! `status`, `nodes` and `node`: the JSON API of a running provisioner, read over its monitor
//! listener and printed as aligned tables for people or as JSON (`--json`) for scripts.
//!
//! The listener's address, port and bearer token come from the same YAML the daemon reads
//! (`monitor_address`, `monitor_port`, `monitor_token_file`) unless `--monitor URL` and
//! `--token-file` say otherwise ([`StatusClient::locate`]): a daemon that cannot be reached, or
//! answers something else, is one line on stderr and a non-zero exit.

use anyhow::{bail, Result};
use provisioner::status_client::StatusClient;
use provisioner::status_text;
use serde_json::Value;

use crate::cli::{ApiArgs, NodeArgs, NodesArgs};

/// Where the API is: `--config`, else the packaged configuration when it exists; `--monitor`
/// and `--token-file` override what it says.
fn target(args: &ApiArgs) -> Result<StatusClient> {
    let default = std::path::Path::new(crate::cli::DEFAULT_CONFIG);
    let config = match (&args.config, &args.monitor) {
        (Some(p), _) => Some(p.as_path()),
        (None, None) if default.is_file() => Some(default),
        _ => None,
    };
    Ok(StatusClient::locate(
        config,
        args.monitor.as_deref(),
        args.token_file.as_deref(),
    )?)
}

/// GETs `path` and returns the JSON of a 200 answer.
fn get(client: &StatusClient, path: &str) -> Result<Value> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(client.get(path))?)
}

fn print_json(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// `choria-provisioner status`.
pub fn status(args: &ApiArgs) -> Result<()> {
    let t = target(args)?;
    let s = get(&t, "/api/v1/status")?;
    if args.json {
        return print_json(&s);
    }
    print!("{}", status_text::status(&s));
    Ok(())
}

/// `choria-provisioner nodes`.
pub fn nodes(args: &NodesArgs) -> Result<()> {
    let t = target(&args.api)?;
    if args.pending {
        let v = get(&t, "/api/v1/pending")?;
        if args.api.json {
            return print_json(&v);
        }
        print!("{}", status_text::pending(&v));
        return Ok(());
    }
    let mut q = format!("/api/v1/nodes?offset={}&limit={}", args.offset, args.limit);
    if let Some(s) = &args.state {
        if provisioner::provision_core::NodeState::parse(s).is_none() {
            let known: Vec<&str> = provisioner::provision_core::NodeState::ALL
                .iter()
                .map(|s| s.label())
                .collect();
            bail!("unknown state {s:?} (known: {})", known.join(", "));
        }
        q.push_str(&format!("&state={s}"));
    }
    let v = get(&t, &q)?;
    if args.api.json {
        return print_json(&v);
    }
    print!("{}", status_text::nodes(&v));
    Ok(())
}

/// `choria-provisioner node IDENTITY`.
pub fn node(args: &NodeArgs) -> Result<()> {
    let t = target(&args.api)?;
    let path = format!(
        "/api/v1/nodes/{}",
        provisioner::provisioner_status::api::percent_encode(&args.identity)
    );
    let n = get(&t, &path)?;
    if args.api.json {
        return print_json(&n);
    }
    print!("{}", status_text::node(&n));
    Ok(())
}
