//! The read-only JSON API and the status page on the monitor listener:
//!
//! - `GET /api/v1/status`: version, role, paused, queue, in-flight and worker counts, totals,
//!   and what the node history holds and costs;
//! - `GET /api/v1/nodes?state=STATE&offset=N&limit=N`: the nodes held, newest first, paginated
//!   (at most [`MAX_PAGE`] a page);
//! - `GET /api/v1/nodes/{identity}`: one node's history;
//! - `GET /api/v1/pending`: the nodes waiting for an operator's approval (with fleet control);
//! - `GET /`: the status page ([`crate::page`]).
//!
//! Identities and host names are sensitive. Every one of these ([`Monitor::admit`]): answers
//! only a request whose `Host` names loopback, the address the client reached, or one of
//! `monitor_hostnames` (a page in an operator's browser cannot be read by another site through
//! DNS rebinding); without `monitor_token_file` answers loopback clients only; with it asks for
//! `Authorization: Bearer TOKEN` (compared in constant time). `/metrics`, `/healthz` and
//! `/readyz` never ask, for scrapers and supervisors.

use std::sync::Arc;

use hyper::StatusCode;
use provision_core::NodeState;
use serde_json::{json, Value};

use crate::nodes::NodeTable;
use provisioner_metrics::{Metrics, Role};

/// An IPv4-mapped IPv6 address (a dual-stack listener's view of an IPv4 client) as IPv4.
fn canonical(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

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
    /// The bearer token the API and the status page ask for, when set; without one they answer
    /// loopback clients only.
    pub token: Option<String>,
    /// `monitor_hostnames`: names besides loopback and the address reached that a request's
    /// `Host` may give.
    pub hostnames: Vec<String>,
    /// TLS for the listener (`monitor_tls_cert`, `monitor_tls_key`), when set.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Fleet control (`fleet_control`): the pause, the deny entries and the approval queue.
    pub control: Option<crate::control::ControlPanel>,
}

/// Why the API or a page refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// No token is configured and the client is not on loopback.
    #[error("the status API and pages answer loopback clients only: set monitor_token_file to serve them to other hosts with a bearer token")]
    NotLoopback,
    /// The `Host` header names something else (DNS rebinding, a proxy in the way).
    #[error(
        "the Host header {0:?} is not loopback, the address reached, or one of monitor_hostnames"
    )]
    Host(String),
    /// The bearer token is missing or wrong.
    #[error("a bearer token is required (Authorization: Bearer TOKEN)")]
    Token,
}

impl Refusal {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Token => StatusCode::UNAUTHORIZED,
            _ => StatusCode::FORBIDDEN,
        }
    }
}

/// The host of a `Host` header value, without its port or brackets, lower-cased; `None` when it
/// is not one.
fn host_of(value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() || text.len() > 255 {
        return None;
    }
    let host = if let Some(rest) = text.strip_prefix('[') {
        rest.split_once(']')?.0
    } else {
        match text.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            Some(_) => return None,
            None => text,
        }
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("version", &self.version)
            .field("identity", &self.identity)
            .field("workers", &self.workers)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("hostnames", &self.hostnames)
            .field("tls", &self.tls.is_some())
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
            hostnames: Vec::new(),
            tls: None,
            control: None,
        }
    }

    /// Whether a request for the API or a page may be answered: its `Host` names loopback, the
    /// address reached (`local`) or one of `monitor_hostnames`; then a token is asked for when
    /// one is set, and the client must be on loopback when none is.
    pub fn admit(
        &self,
        peer: std::net::IpAddr,
        local: std::net::IpAddr,
        host: Option<&[u8]>,
        authorization: Option<&[u8]>,
    ) -> Result<(), Refusal> {
        let shown = || {
            host.map(|h| String::from_utf8_lossy(&h[..h.len().min(128)]).into_owned())
                .unwrap_or_default()
        };
        let Some(name) = host.and_then(host_of) else {
            return Err(Refusal::Host(shown()));
        };
        let named_ip = name.parse::<std::net::IpAddr>().ok();
        let host_ok = name == "localhost"
            || name.ends_with(".localhost")
            || named_ip.is_some_and(|ip| ip.is_loopback() || canonical(ip) == canonical(local))
            || self
                .hostnames
                .iter()
                .any(|h| h.trim_end_matches('.').eq_ignore_ascii_case(&name));
        if !host_ok {
            return Err(Refusal::Host(shown()));
        }
        if self.token.is_some() {
            return if self.authorized(authorization) {
                Ok(())
            } else {
                Err(Refusal::Token)
            };
        }
        if canonical(peer).is_loopback() {
            Ok(())
        } else {
            Err(Refusal::NotLoopback)
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
        let time =
            |t: i64| crate::nodes::rfc3339(u64::try_from(t).unwrap_or(0).saturating_mul(1000));
        let campaign = self
            .control
            .as_ref()
            .and_then(|c| c.view.campaign())
            .map(|c| {
                json!({
                    "id": c.id,
                    "state": c.state,
                    "reason": c.reason,
                    "by": c.by,
                    "total": c.total,
                    "done": c.done,
                    "failed": c.failed,
                    "in_flight": c.in_flight,
                    "pending": c.pending,
                    "eta": c.eta.map(time),
                    "driver": c.driver,
                    "recent_failures": c.recent_failures.iter().map(|(id, e)| json!({"identity": id, "error": e})).collect::<Vec<_>>(),
                })
            })
            .unwrap_or(Value::Null);
        let (pause, deny_entries, pending) = match &self.control {
            Some(c) => (
                c.view
                    .pause()
                    .map(|p| {
                        json!({"by": p.by, "at": crate::nodes::rfc3339(u64::try_from(p.at).unwrap_or(0).saturating_mul(1000)), "reason": p.reason})
                    })
                    .unwrap_or(Value::Null),
                json!(c.view.deny_entries()),
                json!(c.view.pending().len()),
            ),
            None => (Value::Null, Value::Null, Value::Null),
        };
        json!({
            "version": self.version,
            "identity": self.identity,
            "site": m.site(),
            "role": self.role(),
            "connected": m.connected(),
            "paused": m.paused.get() != 0,
            "pause": pause,
            "deny_entries": deny_entries,
            "pending_approval": pending,
            "campaign": campaign,
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
            "/api/v1/pending" => {
                let Some(c) = &self.control else {
                    return err(
                        StatusCode::NOT_FOUND,
                        "no approval queue: fleet_control is off".into(),
                    );
                };
                let list: Vec<Value> = c.view.pending().iter().map(pending_json).collect();
                (
                    StatusCode::OK,
                    json!({"total": list.len(), "pending": list}),
                )
            }
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

/// One pending node as the API shows it.
pub fn pending_json(p: &crate::control::PendingInfo) -> Value {
    let t = |s: i64| crate::nodes::rfc3339(u64::try_from(s).unwrap_or(0).saturating_mul(1000));
    json!({
        "identity": p.identity,
        "fingerprints": p.fingerprints,
        "reason": p.reason,
        "facts": p.facts,
        "first_seen": t(p.first_seen),
        "last_seen": t(p.last_seen),
        "expires": t(p.expires),
    })
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

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn monitor(token: Option<&str>, hostnames: &[&str]) -> Monitor {
        let mut m = Monitor::metrics_only(Metrics::new(""));
        m.token = token.map(str::to_string);
        m.hostnames = hostnames.iter().map(|h| h.to_string()).collect();
        m
    }

    #[test]
    fn without_a_token_only_loopback_is_answered() {
        let m = monitor(None, &[]);
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let lan: std::net::IpAddr = "10.0.0.7".parse().unwrap();
        let me: std::net::IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(m.admit(lo, lo, Some(b"127.0.0.1:8080"), None), Ok(()));
        assert_eq!(m.admit(lo, lo, Some(b"localhost:8080"), None), Ok(()));
        assert_eq!(
            m.admit(
                "::1".parse().unwrap(),
                "::1".parse().unwrap(),
                Some(b"[::1]:8080"),
                None
            ),
            Ok(())
        );
        // A dual-stack listener sees IPv4 loopback as mapped.
        let mapped: std::net::IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(
            m.admit(mapped, mapped, Some(b"127.0.0.1:8080"), None),
            Ok(())
        );
        assert_eq!(
            m.admit(lan, me, Some(b"10.0.0.5:8080"), None),
            Err(Refusal::NotLoopback)
        );
        assert_eq!(Refusal::NotLoopback.status(), StatusCode::FORBIDDEN);
        assert!(Refusal::NotLoopback
            .to_string()
            .contains("monitor_token_file"));
    }

    #[test]
    fn a_token_opens_the_api_to_other_hosts_and_is_required() {
        let m = monitor(Some("s3cret"), &[]);
        let lan: std::net::IpAddr = "10.0.0.7".parse().unwrap();
        let me: std::net::IpAddr = "10.0.0.5".parse().unwrap();
        assert_eq!(
            m.admit(lan, me, Some(b"10.0.0.5:8080"), Some(b"Bearer s3cret")),
            Ok(())
        );
        assert_eq!(
            m.admit(lan, me, Some(b"10.0.0.5:8080"), Some(b"Bearer nope")),
            Err(Refusal::Token)
        );
        // Loopback needs it too once it is set.
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            m.admit(lo, lo, Some(b"localhost"), None),
            Err(Refusal::Token)
        );
    }

    #[test]
    fn a_foreign_host_header_is_refused_dns_rebinding_included() {
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let m = monitor(None, &["prov1.example.net"]);
        for bad in [
            &b"evil.example.com"[..],
            b"evil.example.com:8080",
            b"127.0.0.2.evil.example.com",
            b"",
            b"prov1.example.net:http",
            b"[::1",
        ] {
            assert!(
                matches!(m.admit(lo, lo, Some(bad), None), Err(Refusal::Host(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(m.admit(lo, lo, None, None), Err(Refusal::Host(_))));
        assert_eq!(
            m.admit(lo, lo, Some(b"PROV1.example.net.:8080"), None),
            Ok(())
        );
        // The address the client reached is a valid Host, whatever it is.
        let m = monitor(Some("t"), &[]);
        let me: std::net::IpAddr = "192.0.2.10".parse().unwrap();
        assert_eq!(
            m.admit(me, me, Some(b"192.0.2.10:8080"), Some(b"Bearer t")),
            Ok(())
        );
        assert!(matches!(
            m.admit(me, me, Some(b"192.0.2.11:8080"), Some(b"Bearer t")),
            Err(Refusal::Host(_))
        ));
    }

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
