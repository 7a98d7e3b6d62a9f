//! The status page at `/` and a node's page at `/nodes/{identity}`: small server-rendered HTML
//! with inline styles, no script and nothing loaded from anywhere else. Every text that came
//! from a node, a helper or the broker is HTML-escaped. With fleet control and a token, the
//! pending nodes carry Approve and Reject forms posting to this listener.

use std::fmt::Write as _;

use serde_json::Value;

use crate::api::{percent_encode, Monitor};
use crate::nodes::{rfc3339, THROUGHPUT_MINUTES};

/// Recent failures listed on the status page.
pub const RECENT_FAILURES: usize = 20;
/// Pending nodes listed on the status page (the API and `nodes --pending` list them all).
pub const PENDING_SHOWN: usize = 200;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}\
.spark{background:#fff;border:1px solid #ddd}\
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}\
.meta{color:#555}.cards{display:flex;flex-wrap:wrap;gap:.6em}\
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.5em .8em;min-width:9em}\
.card b{display:block;font-size:1.5em}table{border-collapse:collapse;background:#fff}\
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;font-size:.92em;vertical-align:top}\
th{background:#f0f0f0}.nw{white-space:nowrap}.bad{color:#b00020}.ok{color:#1b5e20}code{font-size:.92em}";

/// `s` safe inside HTML text and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn head(out: &mut String, title: &str, refresh: bool) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">{}\
         <title>{}</title><style>{STYLE}</style></head><body>",
        if refresh {
            "<meta http-equiv=\"refresh\" content=\"10\">"
        } else {
            ""
        },
        escape(title)
    );
}

/// An inline SVG sparkline of provisioned (green) and failed (red) nodes per minute.
fn sparkline(points: &[(u32, u32)]) -> String {
    let (w, h) = (360.0_f64, 60.0_f64);
    let max = points
        .iter()
        .map(|&(p, f)| p.max(f))
        .max()
        .unwrap_or(0)
        .max(1);
    let line = |pick: fn(&(u32, u32)) -> u32| {
        let step = w / (points.len().max(2) - 1) as f64;
        points
            .iter()
            .enumerate()
            .map(|(i, pt)| {
                let y = h - 2.0 - f64::from(pick(pt)) / f64::from(max) * (h - 4.0);
                format!("{:.1},{:.1}", i as f64 * step, y)
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!(
        "<svg role=\"img\" aria-label=\"nodes per minute\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" class=\"spark\">\
         <polyline fill=\"none\" stroke=\"#1b5e20\" stroke-width=\"2\" points=\"{}\"/>\
         <polyline fill=\"none\" stroke=\"#b00020\" stroke-width=\"1.5\" points=\"{}\"/></svg>",
        line(|p| p.0),
        line(|p| p.1)
    )
}

/// The status page.
pub fn status_page(m: &Monitor, now_ms: u64) -> String {
    let s = m.status();
    let num = |v: &Value| {
        v.as_u64()
            .or_else(|| v.as_i64().map(|x| x.max(0) as u64))
            .unwrap_or(0)
    };
    let mut out = String::with_capacity(8192);
    let pending = m
        .control
        .as_ref()
        .map(|c| c.view.pending())
        .unwrap_or_default();
    // A page with forms to fill is not reloaded under the operator's hands.
    let forms = m.token.is_some() && !pending.is_empty();
    head(&mut out, "Choria Provisioner status", !forms);
    let _ = write!(
        out,
        "<h1>Choria Provisioner</h1><p class=\"meta\">{} · version {} · site {} · role <b>{}</b> · {} · {}</p>",
        escape(&m.identity),
        escape(&m.version),
        escape(m.metrics.site()),
        m.role(),
        if m.metrics.connected() { "connected" } else { "<span class=\"bad\">not connected</span>" },
        if s["paused"].as_bool().unwrap_or(false) { "<span class=\"bad\">paused</span>" } else { "provisioning" },
    );
    if let Some(p) = s["pause"].as_object() {
        let text = |k: &str| escape(p.get(k).and_then(|v| v.as_str()).unwrap_or(""));
        let _ = write!(
            out,
            "<p class=\"bad\">Paused by {} at {}: {} (lift it with <code>choria-provisioner resume</code>)</p>",
            text("by"),
            text("at"),
            text("reason")
        );
    }
    if let Some(n) = s["deny_entries"].as_u64() {
        let _ = write!(
            out,
            "<p class=\"meta\">Deny list: {n} entries (<code>choria-provisioner deny ls</code>)</p>"
        );
    }
    if let Some(c) = s["campaign"].as_object() {
        let text = |k: &str| escape(c.get(k).and_then(|v| v.as_str()).unwrap_or(""));
        let num = |k: &str| c.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
        let (total, done, failed) = (num("total"), num("done"), num("failed"));
        let eta = c
            .get("eta")
            .and_then(|v| v.as_str())
            .map(|t| format!(", expected to finish at {}", escape(t)))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<h2>Rotation campaign</h2><p>{} <b>{}</b>{}: {done} of {total} provisioned again, <span class=\"{}\">{failed} failed</span>, {} in flight, {} waiting{eta} (<code>choria-provisioner rotate status</code>)</p><progress max=\"{}\" value=\"{}\"></progress>",
            text("id"),
            text("state"),
            if text("reason").is_empty() { String::new() } else { format!(" ({})", text("reason")) },
            if failed > 0 { "bad" } else { "meta" },
            num("in_flight"),
            num("pending"),
            total.max(1),
            done + failed,
        );
        if let Some(f) = c
            .get("recent_failures")
            .and_then(|v| v.as_array())
            .filter(|f| !f.is_empty())
        {
            out.push_str("<ul class=\"meta\">");
            for e in f {
                let _ = write!(
                    out,
                    "<li>{}: {}</li>",
                    escape(e["identity"].as_str().unwrap_or("")),
                    escape(e["error"].as_str().unwrap_or(""))
                );
            }
            out.push_str("</ul>");
        }
    }
    if let Some(c) = &m.control {
        pending_section(&mut out, &pending, m.token.is_some(), &c.csrf);
    }
    let t = &s["totals"];
    out.push_str("<h2>Counters</h2><div class=\"cards\">");
    for (label, v) in [
        ("Provisioned", num(&t["provisioned"])),
        ("Provision errors", num(&t["provision_errors"])),
        ("Queue", num(&s["queue"])),
        ("In flight", num(&s["in_flight"])),
        ("Workers", num(&s["workers"])),
        ("Discovered", num(&t["discovered"])),
        ("Announced", num(&t["event_discovered"])),
        ("Helper errors", num(&t["helper_errors"])),
        ("Lock held", num(&t["lock_held"])),
        ("Policy denied", num(&t["policy_denied"])),
        ("Invalid identities", num(&t["invalid_identities"])),
    ] {
        let _ = write!(out, "<div class=\"card\">{label}<b>{v}</b></div>");
    }
    out.push_str("</div>");
    if let Some(nodes) = &m.nodes {
        let tp = nodes.throughput(now_ms);
        let last: u32 = tp.iter().rev().take(5).map(|p| p.0).sum();
        let _ = write!(
            out,
            "<h2>Throughput</h2><p>{} <span class=\"meta\">provisioned (green) and failed (red) per \
             minute over the last {THROUGHPUT_MINUTES} minutes; {last} provisioned in the last 5</span></p>",
            sparkline(&tp)
        );
        out.push_str("<h2>Queue and nodes</h2><table><tr>");
        let counts = nodes.counts();
        for k in counts.keys() {
            let _ = write!(out, "<th>{k}</th>");
        }
        out.push_str("</tr><tr>");
        for (k, v) in &counts {
            let _ = write!(out, "<td><a href=\"/api/v1/nodes?state={k}\">{v}</a></td>");
        }
        let h = &s["history"];
        let _ = write!(
            out,
            "</tr></table><p class=\"meta\">{} nodes held in the history ({} bytes, about {} \
             per node; at most {} nodes, each forgotten {} s after its last update)</p>",
            num(&h["nodes"]),
            num(&h["bytes"]),
            num(&h["bytes_per_node"]),
            num(&h["max_nodes"]),
            num(&h["max_age_seconds"]),
        );
        out.push_str("<h2>Recent failures</h2>");
        let problems = nodes.recent_problems(RECENT_FAILURES);
        if problems.is_empty() {
            out.push_str("<p class=\"ok\">No recent failures.</p>");
        } else {
            out.push_str(
                "<table><tr><th>Node</th><th>State</th><th>Step</th><th>Cause</th><th>When</th></tr>",
            );
            for p in problems {
                let _ = write!(
                    out,
                    "<tr><td class=\"nw\"><a href=\"/nodes/{}\">{}</a></td><td class=\"bad\">{}</td><td class=\"nw\"><code>{}</code></td><td>{}</td><td class=\"nw\">{}</td></tr>",
                    percent_encode(&p.identity),
                    escape(&p.identity),
                    p.state,
                    escape(p.step),
                    escape(&p.cause),
                    rfc3339(p.updated_ms),
                );
            }
            out.push_str("</table>");
        }
    }
    out.push_str(
        "<p class=\"meta\">JSON: <a href=\"/api/v1/status\">/api/v1/status</a> · \
         <a href=\"/api/v1/nodes\">/api/v1/nodes</a> · <a href=\"/metrics\">/metrics</a></p></body></html>\n",
    );
    out
}

/// The nodes waiting for approval, with Approve and Reject forms when the API has a token
/// (the forms carry `csrf` and ask for the token).
fn pending_section(
    out: &mut String,
    pending: &[crate::control::PendingInfo],
    forms: bool,
    csrf: &str,
) {
    let _ = write!(out, "<h2>Pending approval ({})</h2>", pending.len());
    if pending.is_empty() {
        out.push_str("<p class=\"ok\">No node waits for approval.</p>");
        return;
    }
    if !forms {
        out.push_str(
            "<p class=\"meta\">Decide with <code>choria-provisioner approve ID</code> or \
             <code>reject ID --reason TEXT</code>; the buttons need <code>monitor_token_file</code>.</p>",
        );
    }
    out.push_str("<table><tr><th>Node</th><th>Key fingerprints</th><th>Reason</th><th>Facts</th><th>First seen</th><th>Last seen</th>");
    if forms {
        out.push_str("<th>Decision</th>");
    }
    out.push_str("</tr>");
    let t = |s: i64| rfc3339(u64::try_from(s).unwrap_or(0).saturating_mul(1000));
    for p in pending.iter().take(PENDING_SHOWN) {
        let facts: Vec<String> = p
            .facts
            .iter()
            .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
            .collect();
        let _ = write!(
            out,
            "<tr><td class=\"nw\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"nw\">{}</td><td class=\"nw\">{}</td>",
            escape(&p.identity),
            p.fingerprints.iter().map(|f| escape(f)).collect::<Vec<_>>().join("<br>"),
            escape(&p.reason),
            facts.join("<br>"),
            t(p.first_seen),
            t(p.last_seen),
        );
        if forms {
            let hidden = format!(
                "<input type=\"hidden\" name=\"csrf\" value=\"{}\"><input type=\"hidden\" name=\"identity\" value=\"{}\">\
                 <input type=\"password\" name=\"token\" placeholder=\"API token\" autocomplete=\"off\" required>",
                escape(csrf),
                escape(&p.identity)
            );
            let _ = write!(
                out,
                "<td class=\"nw\"><form method=\"post\" action=\"/pending/approve\">{hidden}<button type=\"submit\">Approve</button></form>\
                 <form method=\"post\" action=\"/pending/reject\">{hidden}<input name=\"reason\" placeholder=\"reason\" required maxlength=\"512\">\
                 <button type=\"submit\">Reject</button></form></td>"
            );
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
    if pending.len() > PENDING_SHOWN {
        let _ = write!(
            out,
            "<p class=\"meta\">{} more: <code>choria-provisioner nodes --pending</code> lists them all.</p>",
            pending.len() - PENDING_SHOWN
        );
    }
}

/// The small page answering a form's decision.
pub fn decision_page(ok: bool, text: &str) -> String {
    let mut out = String::with_capacity(1024);
    head(&mut out, "Choria Provisioner approval", false);
    let _ = writeln!(
        out,
        "<p class=\"{}\">{}</p><p><a href=\"/\">← status</a></p></body></html>",
        if ok { "ok" } else { "bad" },
        escape(text)
    );
    out
}

/// A node's page: its state and history, or `None` when it is not held.
pub fn node_page(m: &Monitor, identity: &str) -> Option<String> {
    let n = m.nodes.as_ref()?.node_json(identity)?;
    let text = |v: &Value| escape(v.as_str().unwrap_or(""));
    let mut out = String::with_capacity(4096);
    head(
        &mut out,
        &format!("{identity}: provisioning history"),
        false,
    );
    let _ = write!(
        out,
        "<p><a href=\"/\">← status</a></p><h1>{}</h1><table>\
         <tr><th>State</th><td class=\"{}\">{}</td></tr><tr><th>Step</th><td><code>{}</code></td></tr>\
         <tr><th>Cause</th><td>{}</td></tr><tr><th>Found by</th><td>{}</td></tr>\
         <tr><th>Helper message</th><td>{}</td></tr><tr><th>Issued</th><td><code>{}</code></td></tr>\
         <tr><th>First seen</th><td>{}</td></tr><tr><th>Updated</th><td>{}</td></tr>\
         <tr><th>Cycles</th><td>{}</td></tr></table><h2>History</h2><table>\
         <tr><th>Time</th><th>Event</th><th>Step</th><th>Result</th><th>Tries</th><th>ms</th><th>Detail</th></tr>",
        escape(identity),
        if provision_core::NodeState::parse(n["state"].as_str().unwrap_or("")).is_some_and(|s| s.is_problem()) { "bad" } else { "ok" },
        text(&n["state"]),
        text(&n["step"]),
        text(&n["cause"]),
        text(&n["found_by"]),
        text(&n["helper_msg"]),
        escape(&n["issued"].to_string()),
        text(&n["first_seen"]),
        text(&n["updated"]),
        n["cycles"],
    );
    for e in n["history"].as_array().into_iter().flatten() {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            text(&e["time"]),
            text(&e["event"]),
            text(&e["step"]),
            if e["ok"].as_bool().unwrap_or(false) { "ok" } else { "bad" },
            if e["ok"].as_bool().unwrap_or(false) { "ok" } else { "failed" },
            e["tries"],
            e["elapsed_ms"],
            text(&e["detail"]),
        );
    }
    let _ = writeln!(
        out,
        "</table><p class=\"meta\">JSON: <a href=\"/api/v1/nodes/{0}\">/api/v1/nodes/{0}</a></p></body></html>",
        percent_encode(identity)
    );
    Some(out)
}

/// The pages' Content-Security-Policy: nothing may load or run but the one stylesheet they
/// carry, named by its hash; no frame may hold them and their forms post to this listener only.
pub fn content_security_policy() -> String {
    static CSP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CSP.get_or_init(|| {
        use base64::Engine as _;
        use sha2::Digest as _;
        let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(STYLE));
        format!(
            "default-src 'none'; style-src 'sha256-{hash}'; img-src 'none'; base-uri 'none'; \
             form-action 'self'; frame-ancestors 'none'"
        )
    })
    .clone()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::nodes::{HistoryLimits, NodeTable};
    use provision_core::{Issued, NodeEvent, NodeState, Source, Verdict};
    use provisioner_metrics::Metrics;
    use std::time::Duration;

    #[test]
    fn node_text_is_escaped_and_failures_link_to_their_history() {
        let nodes = NodeTable::new(HistoryLimits::default());
        let id = "evil<script>.example.net";
        let v = Verdict {
            state: NodeState::Refused,
            step: "csr_check",
            cause: "invalid CSR: <b>bold</b> & \"quoted\"".into(),
            source: Source::Discovery,
            helper_msg: String::new(),
            issued: Issued::default(),
            upgrade: None,
            elapsed: Duration::ZERO,
            answered: true,
        };
        let now = crate::nodes::now_ms();
        nodes.record_at(id, &NodeEvent::Finished(&v), now);
        let mut m = Monitor::metrics_only(Metrics::new("s"));
        m.nodes = Some(nodes);
        let page = status_page(&m, now);
        assert!(!page.contains("<script>"), "{page}");
        assert!(!page.contains("<b>bold"), "{page}");
        assert!(page.contains("evil&lt;script&gt;.example.net"));
        assert!(page.contains("href=\"/nodes/evil%3Cscript%3E.example.net\""));
        assert!(page.contains("Recent failures"));
        assert!(!page.to_lowercase().contains("<script"), "no script at all");
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "nothing from elsewhere"
        );
        let node = node_page(&m, id).unwrap();
        assert!(node.contains("csr_check") && node.contains("&amp; &quot;quoted&quot;"));
        assert!(node_page(&m, "unknown").is_none());
    }
}
