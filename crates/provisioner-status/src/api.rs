//! The read-only JSON API and the status page on the monitor listener:
//!
//! - `GET /api/v1/status`: version, role, paused, queue, in-flight and worker counts, totals,
//!   and what the node history holds and costs;
//! - `GET /api/v1/nodes?state=STATE&offset=N&limit=N`: the nodes held, newest first, paginated
//!   (at most [`MAX_PAGE`] a page);
//! - `GET /api/v1/nodes/{identity}`: one node's history;
//! - `GET /`: the status page ([`crate::page`]).
//!
//! Identities and host names are sensitive: with a token configured every one of these asks
//! for `Authorization: Bearer TOKEN` (compared in constant time); `/metrics`, `/healthz` and
//! `/readyz` never do.

use std::sync::Arc;

use hyper::StatusCode;
use provision_core::NodeState;
use serde_json::{json, Value};

use crate::nodes::NodeTable;
use provisioner_metrics::{Metrics, Role};

/// The most nodes one page of `/api/v1/nodes` holds.
pub const MAX_PAGE: usize = 500;
/// A page's size when `limit` is not given.
pub const DEFAULT_PAGE: usize = 50;
/// The longest identity looked up (longer ones are not valid identities).
const MAX_IDENTITY: usize = 255;

/// What the API and the status page serve, besides the metrics.
pub struct Monitor {
    /// The metrics (counters, gauges, role, connection).
    pub metrics: Arc<Metrics>,
    /// The node history; without one the node endpoints answer 404.
    pub nodes: Option<Arc<NodeTable>>,
    /// The provisioner's version.
    pub version: String,
    /// The provisioner's identity.
    pub identity: String,
    /// The configured number of workers.
    pub workers: usize,
    /// The bearer token the API and the status page ask for, when set.
    pub token: Option<String>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("version", &self.version)
            .field("identity", &self.identity)
            .field("workers", &self.workers)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl Monitor {
    /// A monitor serving `metrics` only (no history, no token).
    pub fn metrics_only(metrics: Arc<Metrics>) -> Self {
        Monitor {
            metrics,
            nodes: None,
            version: String::new(),
            identity: String::new(),
            workers: 0,
            token: None,
        }
    }

    /// Whether `authorization` (the header's value) carries the token, when one is set.
    pub fn authorized(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let Some(given) = authorization.and_then(|a| a.strip_prefix(b"Bearer ")) else {
            return false;
        };
        constant_time_eq(given.trim_ascii(), token.as_bytes())
    }

    /// The role's name.
    pub fn role(&self) -> &'static str {
        match self.metrics.role() {
            Role::Active => "active",
            Role::Leader => "leader",
            Role::Standby => "standby",
        }
    }

    /// `/api/v1/status`.
    pub fn status(&self) -> Value {
        let m = &*self.metrics;
        let gauge = |g: &provisioner_metrics::Gauge| g.get().max(0);
        let history = match &self.nodes {
            Some(n) => {
                n.expire();
                let held = n.len();
                let bytes = n.bytes();
                json!({
                    "nodes": held,
                    "bytes": bytes,
                    "bytes_per_node": bytes.checked_div(held).unwrap_or(0),
                    "max_nodes": n.limits().max_nodes,
                    "max_age_seconds": n.limits().max_age.as_secs(),
                    "states": n.counts(),
                    "outcomes": n.totals(),
                })
            }
            None => Value::Null,
        };
        json!({
            "version": self.version,
            "identity": self.identity,
            "site": m.site(),
            "role": self.role(),
            "connected": m.connected(),
            "paused": m.paused.get() != 0,
            "queue": gauge(&m.work_queue_entries),
            "in_flight": gauge(&m.busy_workers),
            "workers": self.workers,
            "waiting_nodes": gauge(&m.waiting_nodes),
            "totals": {
                "provisioned": m.provisioned.get(),
                "provision_errors": m.provision_errors.get(),
                "discovered": m.discovered.get(),
                "event_discovered": m.event_discovered.get(),
                "discover_cycles": m.discover_cycles.get(),
                "discovery_errors": m.discovery_errors.get(),
                "helper_errors": m.helper_errors.get(),
                "helper_shutdown_requests": m.helper_shutdown_requests.get(),
                "lock_held": m.lock_held.get(),
                "invalid_identities": m.invalid_identities.get(),
                "policy_denied": m.policy_denied.get(),
            },
            "history": history,
        })
    }

    /// Answers an API path (`/api/v1/...`) with its query; `(status, JSON body)`.
    pub fn api(&self, path: &str, query: Option<&str>) -> (StatusCode, Value) {
        let err = |status: StatusCode, msg: String| (status, json!({ "error": msg }));
        match path {
            "/api/v1/status" => (StatusCode::OK, self.status()),
            "/api/v1/nodes" => {
                let Some(nodes) = &self.nodes else {
                    return err(StatusCode::NOT_FOUND, "no node history is kept".into());
                };
                nodes.expire();
                let q = match Query::parse(query.unwrap_or("")) {
                    Ok(q) => q,
                    Err(e) => return err(StatusCode::BAD_REQUEST, e),
                };
                let (total, page) = nodes.list(q.state, q.offset, q.limit);
                let list: Vec<Value> = page.iter().map(|s| s.to_json()).collect();
                (
                    StatusCode::OK,
                    json!({
                        "total": total,
                        "offset": q.offset,
                        "limit": q.limit,
                        "state": q.state.map(|s| s.label()),
                        "nodes": list,
                    }),
                )
            }
            p => match p.strip_prefix("/api/v1/nodes/") {
                Some(raw) => {
                    let Some(nodes) = &self.nodes else {
                        return err(StatusCode::NOT_FOUND, "no node history is kept".into());
                    };
                    let identity = match percent_decode(raw) {
                        Some(i) if !i.is_empty() && i.len() <= MAX_IDENTITY => i,
                        _ => return err(StatusCode::BAD_REQUEST, "not a node identity".into()),
                    };
                    match nodes.node_json(&identity) {
                        Some(v) => (StatusCode::OK, v),
                        None => err(
                            StatusCode::NOT_FOUND,
                            "no history for this node: not seen, or forgotten (see history in \
                             /api/v1/status for what is kept)"
                                .into(),
                        ),
                    }
                }
                None => err(StatusCode::NOT_FOUND, "no such endpoint".into()),
            },
        }
    }
}

/// The query of `/api/v1/nodes`.
#[derive(Debug, PartialEq, Eq)]
struct Query {
    state: Option<NodeState>,
    offset: usize,
    limit: usize,
}

impl Query {
    fn parse(q: &str) -> Result<Query, String> {
        let mut out = Query {
            state: None,
            offset: 0,
            limit: DEFAULT_PAGE,
        };
        for pair in q.split('&').filter(|p| !p.is_empty()).take(16) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v).ok_or("a query value is not valid percent-encoded UTF-8")?;
            match k {
                "state" if v.is_empty() => {}
                "state" => {
                    out.state = Some(NodeState::parse(&v).ok_or_else(|| {
                        let known: Vec<&str> = NodeState::ALL.iter().map(|s| s.label()).collect();
                        format!("unknown state (known: {})", known.join(", "))
                    })?)
                }
                "offset" => {
                    out.offset = v
                        .parse()
                        .map_err(|_| "offset is not a number".to_string())?
                }
                "limit" => {
                    let n: usize = v.parse().map_err(|_| "limit is not a number".to_string())?;
                    out.limit = n.clamp(1, MAX_PAGE);
                }
                _ => return Err("unknown query parameter (known: state, offset, limit)".into()),
            }
        }
        Ok(out)
    }
}

/// Percent-decodes `s` (`+` stays `+`); `None` for a bad escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Percent-encodes everything but unreserved characters (for links to a node).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(c));
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_validated_and_bounded() {
        assert_eq!(
            Query::parse("state=failed&offset=10&limit=100000").unwrap(),
            Query {
                state: Some(NodeState::Failed),
                offset: 10,
                limit: MAX_PAGE
            }
        );
        assert_eq!(Query::parse("").unwrap().limit, DEFAULT_PAGE);
        assert!(Query::parse("state=nope").unwrap_err().contains("known"));
        assert!(Query::parse("limit=-1").is_err());
        assert!(Query::parse("colour=red").is_err());
        assert!(Query::parse("state=%ZZ").is_err());
    }

    #[test]
    fn identities_survive_a_round_trip_through_a_link() {
        for id in ["n1.example.net", "we ird/€", "a%b"] {
            assert_eq!(percent_decode(&percent_encode(id)).unwrap(), id);
        }
        assert_eq!(percent_decode("%ff"), None);
        assert_eq!(percent_decode("%4"), None);
    }

    #[test]
    fn the_token_is_required_when_set() {
        let mut m = Monitor::metrics_only(Metrics::new("s"));
        assert!(m.authorized(None));
        m.token = Some("s3cret".into());
        assert!(!m.authorized(None));
        assert!(!m.authorized(Some(b"Bearer wrong!")));
        assert!(!m.authorized(Some(b"Basic s3cret")));
        assert!(m.authorized(Some(b"Bearer s3cret")));
        assert!(!format!("{m:?}").contains("s3cret"));
    }
}
