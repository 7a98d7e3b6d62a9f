//! `status`, `nodes` and `node`: the JSON API of a running provisioner, read over its monitor
//! listener and printed as aligned tables for people or as JSON (`--json`) for scripts.
//!
//! The listener's address, port and bearer token come from the same YAML the daemon reads
//! (`monitor_address`, `monitor_port`, `monitor_token_file`) unless `--monitor URL` and
//! `--token-file` say otherwise ([`StatusClient::locate`]): a daemon that cannot be reached, or
//! answers something else, is one line on stderr and a non-zero exit.

use anyhow::{bail, Result};
use provisioner::status_client::StatusClient;
use provisioner::text::table;
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

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
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
    let mut rows = vec![
        vec!["Provisioner".into(), text(&s["identity"])],
        vec!["Version".into(), text(&s["version"])],
        vec!["Site".into(), text(&s["site"])],
        vec!["Role".into(), text(&s["role"])],
        vec!["Connected".into(), text(&s["connected"])],
        vec!["Paused".into(), text(&s["paused"])],
        vec![
            "Operator pause".into(),
            match s["pause"].as_object() {
                Some(p) => format!(
                    "by {} at {}: {}",
                    text(&p["by"]),
                    text(&p["at"]),
                    text(&p["reason"])
                ),
                None => "none".into(),
            },
        ],
        vec!["Deny entries".into(), text(&s["deny_entries"])],
        vec!["Pending approval".into(), text(&s["pending_approval"])],
        vec!["Queue".into(), text(&s["queue"])],
        vec![
            "In flight".into(),
            format!(
                "{} of {} workers",
                text(&s["in_flight"]),
                text(&s["workers"])
            ),
        ],
    ];
    if let Some(totals) = s["totals"].as_object() {
        for (k, v) in totals {
            rows.push(vec![k.replace('_', " "), text(v)]);
        }
    }
    let h = &s["history"];
    if h.is_object() {
        rows.push(vec![
            "History".into(),
            format!(
                "{} nodes, {} bytes ({} per node), at most {} nodes for {} s",
                text(&h["nodes"]),
                text(&h["bytes"]),
                text(&h["bytes_per_node"]),
                text(&h["max_nodes"]),
                text(&h["max_age_seconds"])
            ),
        ]);
        if let Some(states) = h["states"].as_object() {
            let held: Vec<String> = states
                .iter()
                .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
                .map(|(k, v)| format!("{k} {}", text(v)))
                .collect();
            rows.push(vec![
                "Nodes held".into(),
                if held.is_empty() {
                    "none".into()
                } else {
                    held.join(", ")
                },
            ]);
        }
    }
    print!("{}", table(&rows));
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
        let mut rows = vec![[
            "IDENTITY",
            "FINGERPRINT",
            "FIRST SEEN",
            "LAST SEEN",
            "FACTS",
        ]
        .map(String::from)
        .to_vec()];
        for n in v["pending"].as_array().into_iter().flatten() {
            let list = |k: &str| n[k].as_array().into_iter().flatten().map(text);
            let facts = n["facts"].as_object().into_iter().flatten().take(4);
            rows.push(vec![
                text(&n["identity"]),
                list("fingerprints").collect::<Vec<_>>().join(","),
                text(&n["first_seen"]),
                text(&n["last_seen"]),
                facts
                    .map(|(k, v)| format!("{k}={}", text(v)))
                    .collect::<Vec<_>>()
                    .join(" "),
            ]);
        }
        print!("{}", table(&rows));
        println!("{} nodes waiting for approval", rows.len() - 1);
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
    let mut rows = vec![vec![
        "IDENTITY".into(),
        "STATE".into(),
        "STEP".into(),
        "UPDATED".into(),
        "CAUSE".into(),
    ]];
    for n in v["nodes"].as_array().into_iter().flatten() {
        rows.push(vec![
            text(&n["identity"]),
            text(&n["state"]),
            text(&n["step"]),
            text(&n["updated"]),
            text(&n["cause"]),
        ]);
    }
    print!("{}", table(&rows));
    let shown = rows.len() - 1;
    let total = v["total"].as_u64().unwrap_or(0);
    if total as usize > shown {
        println!("{shown} of {total} nodes shown (--offset, --limit for more)");
    }
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
    let mut rows = vec![
        vec!["Identity".into(), text(&n["identity"])],
        vec!["State".into(), text(&n["state"])],
        vec!["Step".into(), text(&n["step"])],
        vec!["Cause".into(), text(&n["cause"])],
        vec!["Found by".into(), text(&n["found_by"])],
        vec!["Helper message".into(), text(&n["helper_msg"])],
        vec![
            "Issued".into(),
            if n["issued"].is_null() {
                "-".into()
            } else {
                n["issued"].to_string()
            },
        ],
        vec!["First seen".into(), text(&n["first_seen"])],
        vec!["Updated".into(), text(&n["updated"])],
        vec!["Cycles".into(), text(&n["cycles"])],
    ];
    if !n["upgrade"].is_null() {
        rows.push(vec![
            "Upgrade".into(),
            format!(
                "{} to {}",
                text(&n["upgrade"]["from"]),
                text(&n["upgrade"]["to"])
            ),
        ]);
    }
    print!("{}", table(&rows));
    println!();
    let mut hist = vec![vec![
        "TIME".into(),
        "EVENT".into(),
        "STEP".into(),
        "RESULT".into(),
        "TRIES".into(),
        "MS".into(),
        "DETAIL".into(),
    ]];
    for e in n["history"].as_array().into_iter().flatten() {
        hist.push(vec![
            text(&e["time"]),
            text(&e["event"]),
            text(&e["step"]),
            if e["ok"].as_bool().unwrap_or(false) {
                "ok".into()
            } else {
                "failed".into()
            },
            text(&e["tries"]),
            text(&e["elapsed_ms"]),
            text(&e["detail"]),
        ]);
    }
    print!("{}", table(&hist));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_aligned() {
        let t = table(&[
            vec!["A".into(), "long one".into(), "x".into()],
            vec!["bbb".into(), "c".into(), "y".into()],
        ]);
        assert_eq!(t, "A    long one  x\nbbb  c         y\n");
    }
}
