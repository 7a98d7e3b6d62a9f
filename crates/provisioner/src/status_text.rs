//! The JSON API's answers as aligned tables for people: what `choria-provisioner status`,
//! `nodes` and `node` print (with `--json` they print the JSON itself). Text from the API is
//! shown with control characters replaced.

use serde_json::Value;

use fleet_lifecycle::control::DenyRecord;
use fleet_lifecycle::rfc3339;

use crate::text::table;

/// A JSON value as one cell: strings without control characters, `-` for null.
pub fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

/// `/api/v1/status`.
pub fn status(s: &Value) -> String {
    let text = cell;
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
    ];
    if let Some(c) = s["campaign"].as_object() {
        rows.push(vec![
            "Rotation campaign".into(),
            format!(
                "{} {}: {} of {} done, {} failed, {} in flight, {} waiting",
                text(&c["id"]),
                text(&c["state"]),
                text(&c["done"]),
                text(&c["total"]),
                text(&c["failed"]),
                text(&c["in_flight"]),
                text(&c["pending"])
            ),
        ]);
    }
    rows.push(vec!["Queue".into(), text(&s["queue"])]);
    rows.push(vec![
        "In flight".into(),
        format!(
            "{} of {} workers",
            text(&s["in_flight"]),
            text(&s["workers"])
        ),
    ]);
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
    table(&rows)
}

/// `/api/v1/pending`.
pub fn pending(v: &Value) -> String {
    let text = cell;
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
    format!(
        "{}{} nodes waiting for approval\n",
        table(&rows),
        rows.len() - 1
    )
}

/// `/api/v1/nodes`.
pub fn nodes(v: &Value) -> String {
    let text = cell;
    let mut rows = vec![["IDENTITY", "STATE", "STEP", "UPDATED", "CAUSE"]
        .map(String::from)
        .to_vec()];
    for n in v["nodes"].as_array().into_iter().flatten() {
        rows.push(vec![
            text(&n["identity"]),
            text(&n["state"]),
            text(&n["step"]),
            text(&n["updated"]),
            text(&n["cause"]),
        ]);
    }
    let mut out = table(&rows);
    let shown = rows.len() - 1;
    let total = v["total"].as_u64().unwrap_or(0);
    if total as usize > shown {
        out.push_str(&format!(
            "{shown} of {total} nodes shown (--offset, --limit for more)\n"
        ));
    }
    out
}

/// `/api/v1/nodes/ID`: the node, then its history.
pub fn node(n: &Value) -> String {
    let text = cell;
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
    let mut hist = vec![["TIME", "EVENT", "STEP", "RESULT", "TRIES", "MS", "DETAIL"]
        .map(String::from)
        .to_vec()];
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
    format!("{}\n{}", table(&rows), table(&hist))
}

/// What `status`, `nodes` and `node` ask a running provisioner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// `status`.
    Status,
    /// `nodes --pending`.
    Pending,
    /// `nodes [--state S] [--offset N] [--limit N]`.
    Nodes {
        /// The first node shown.
        offset: usize,
        /// How many are shown.
        limit: usize,
        /// Only this state.
        state: Option<String>,
    },
    /// `node IDENTITY`.
    Node(String),
}

impl Query {
    /// The API path, or why the query cannot be asked (an unknown state).
    pub fn path(&self) -> Result<String, String> {
        Ok(match self {
            Query::Status => "/api/v1/status".into(),
            Query::Pending => "/api/v1/pending".into(),
            Query::Nodes {
                offset,
                limit,
                state,
            } => {
                let mut q = format!("/api/v1/nodes?offset={offset}&limit={limit}");
                if let Some(s) = state {
                    if provision_core::NodeState::parse(s).is_none() {
                        let known: Vec<&str> = provision_core::NodeState::ALL
                            .iter()
                            .map(|s| s.label())
                            .collect();
                        return Err(format!("unknown state {s:?} (known: {})", known.join(", ")));
                    }
                    q.push_str(&format!("&state={s}"));
                }
                q
            }
            Query::Node(id) => format!(
                "/api/v1/nodes/{}",
                provisioner_status::api::percent_encode(id)
            ),
        })
    }

    /// The answer as printed: JSON with `json`, else the table.
    pub fn render(&self, v: &Value, json: bool) -> String {
        if json {
            return serde_json::to_string_pretty(v).unwrap_or_default() + "\n";
        }
        match self {
            Query::Status => status(v),
            Query::Pending => pending(v),
            Query::Nodes { .. } => nodes(v),
            Query::Node(_) => node(v),
        }
    }
}

/// The deny entries as a table for people, expired ones marked.
pub fn deny_table(entries: &[DenyRecord], now: i64) -> String {
    if entries.is_empty() {
        return "No deny entries\n".to_string();
    }
    let mut rows = vec![["ENTRY", "BY", "ADDED", "EXPIRES", "REASON"]
        .map(String::from)
        .to_vec()];
    for e in entries {
        let expires = match e.expires {
            None => "never".into(),
            Some(x) if x <= now => format!("{} (expired)", rfc3339(x)),
            Some(x) => rfc3339(x),
        };
        rows.push(vec![
            e.entry.clone(),
            e.by.clone(),
            rfc3339(e.at),
            expires,
            e.reason.clone(),
        ]);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cells_hide_control_characters() {
        assert_eq!(cell(&json!("a\nb\u{1b}[31m")), "a?b?[31m");
        assert_eq!(cell(&Value::Null), "-");
        assert_eq!(cell(&json!(3)), "3");
    }

    #[test]
    fn status_shows_the_pause_and_the_campaign() {
        let s = json!({
            "identity": "p1", "pause": {"by": "ops", "at": "t", "reason": "incident"},
            "campaign": {"id": "c1", "state": "running", "done": 3, "total": 10, "failed": 0,
                         "in_flight": 2, "pending": 5},
        });
        let t = status(&s);
        assert!(t.contains("by ops at t: incident"), "{t}");
        assert!(
            t.contains("c1 running: 3 of 10 done, 0 failed, 2 in flight, 5 waiting"),
            "{t}"
        );
    }

    #[test]
    fn lists_say_how_many_are_not_shown() {
        let v = json!({"total": 5, "nodes": [{"identity": "n1", "state": "failed"}]});
        assert!(nodes(&v).contains("1 of 5 nodes shown"));
        let p = json!({"pending": [{"identity": "n2", "fingerprints": ["sha256:ab"], "facts": {"os": "linux"}}]});
        let t = pending(&p);
        assert!(t.contains("sha256:ab") && t.contains("os=linux"), "{t}");
        assert!(t.ends_with("1 nodes waiting for approval\n"), "{t}");
    }
}
