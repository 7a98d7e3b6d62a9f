//! The per-node history behind the JSON API and the status page: for every node seen recently,
//! how it was found, each step with its time and result, and how its last cycle ended.
//!
//! It is fed through the core's [`Observer::node_event`] and bounded three ways: at most
//! [`HistoryLimits::max_nodes`] nodes (the least recently updated is forgotten first), none
//! older than [`HistoryLimits::max_age`] since its last update, and per node at most
//! [`MAX_EVENTS`] events and [`MAX_TEXT`] bytes of each text. What it holds is counted
//! ([`NodeTable::bytes`]) from the sizes of what it allocates, so the cost per node can be read
//! on `/api/v1/status` and by the waiting-node bench.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use provision_core::{Issued, NodeEvent, NodeState, Observer, Source, Verdict};
use serde_json::{json, Value};

/// The most events kept per node (the oldest are dropped first): a whole cycle is about ten.
/// A power of two, so the event buffer never grows past it.
pub const MAX_EVENTS: usize = 16;
/// The most bytes kept of a node's cause and helper message, cut at a character.
pub const MAX_TEXT: usize = 512;
/// The most bytes kept of one event's detail.
pub const MAX_DETAIL: usize = 256;
/// The most a node's record can cost ([`NodeTable::bytes`] counts it): every event with a detail
/// at its limit, the cause and the message at theirs, and a long identity. Checked by a test.
pub const MAX_BYTES_PER_NODE: usize = 8 * 1024;
/// Minutes of throughput kept for the status page's sparkline.
pub const THROUGHPUT_MINUTES: usize = 60;

/// How much history is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryLimits {
    /// Nodes kept at most.
    pub max_nodes: usize,
    /// A node not updated for this long is forgotten.
    pub max_age: Duration,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        HistoryLimits {
            max_nodes: 10_000,
            max_age: Duration::from_secs(3600),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    Queued,
    Started,
    Step,
    Finished,
}

impl EventKind {
    const fn label(self) -> &'static str {
        match self {
            EventKind::Queued => "queued",
            EventKind::Started => "started",
            EventKind::Step => "step",
            EventKind::Finished => "finished",
        }
    }
}

#[derive(Debug)]
struct Event {
    at_ms: u64,
    kind: EventKind,
    /// The step, or the state for `finished`.
    step: &'static str,
    ok: bool,
    tries: u32,
    elapsed_ms: u64,
    detail: Box<str>,
}

#[derive(Debug)]
struct Record {
    seq: u64,
    first_seen_ms: u64,
    updated_ms: u64,
    source: Source,
    state: NodeState,
    step: &'static str,
    cause: Box<str>,
    helper_msg: Box<str>,
    issued: Issued,
    upgrade: Option<Box<(String, String)>>,
    cycles: u32,
    events: VecDeque<Event>,
    /// The bytes of the events' details, kept as events come and go so that accounting for an
    /// update does not walk the history.
    detail_bytes: usize,
}

impl Record {
    /// The bytes this record and its entries in the table's maps take, from the sizes of what
    /// is allocated for it (the maps' own slack not included).
    fn bytes(&self, identity: &str) -> usize {
        let issued = match &self.issued.certificate {
            Some(Ok(c)) => c.serial.capacity() + c.sha256.capacity(),
            Some(Err(e)) => e.capacity(),
            None => 0,
        } + self
            .issued
            .server_jwt
            .as_ref()
            .map_or(0, |j| j.id.capacity());
        let upgrade = self.upgrade.as_ref().map_or(0, |u| {
            std::mem::size_of::<(String, String)>() + u.0.capacity() + u.1.capacity()
        });
        let events: usize =
            self.events.capacity() * std::mem::size_of::<Event>() + self.detail_bytes;
        // The identity is one Arc<str> (two counters and the text) shared by both maps; the
        // hash map holds (key, record) plus a control byte, the order map (seq, key).
        let arc = 2 * std::mem::size_of::<usize>() + identity.len();
        let entries =
            std::mem::size_of::<(Arc<str>, Record)>() + 1 + std::mem::size_of::<(u64, Arc<str>)>();
        arc + entries + self.cause.len() + self.helper_msg.len() + issued + upgrade + events
    }
}

#[derive(Debug, Default)]
struct Inner {
    nodes: HashMap<Arc<str>, Record>,
    /// Identities, with the time of their last update, by the sequence number of that update,
    /// oldest first.
    order: BTreeMap<u64, (Arc<str>, u64)>,
    seq: u64,
    bytes: usize,
    /// Cycles ended since start, by terminal state.
    totals: BTreeMap<&'static str, u64>,
    /// (minute since the epoch, provisioned, problems), oldest first.
    minutes: VecDeque<(u64, u32, u32)>,
}

/// The history of the nodes seen recently; an [`Observer`] of node events only.
#[derive(Debug)]
pub struct NodeTable {
    limits: HistoryLimits,
    inner: Mutex<Inner>,
}

/// One node as listed by [`NodeTable::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSummary {
    /// The node identity.
    pub identity: String,
    /// Its state.
    pub state: NodeState,
    /// The step its last cycle ended at (or is at).
    pub step: &'static str,
    /// The cause of its last failure (empty when none).
    pub cause: String,
    /// When it was last updated (Unix milliseconds).
    pub updated_ms: u64,
    /// How it was found.
    pub source: Source,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `text` cut to at most [`MAX_TEXT`] bytes at a character boundary, marked when cut.
fn bounded(text: &str) -> Box<str> {
    bounded_to(text, MAX_TEXT)
}

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
fn bounded_to(text: &str, max: usize) -> Box<str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into_boxed_str()
}

fn source_label(s: Source) -> &'static str {
    s.name()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl NodeTable {
    /// An empty table kept within `limits`.
    pub fn new(limits: HistoryLimits) -> Arc<Self> {
        Arc::new(NodeTable {
            limits: HistoryLimits {
                max_nodes: limits.max_nodes.max(1),
                max_age: limits.max_age,
            },
            inner: Mutex::new(Inner::default()),
        })
    }

    /// The limits.
    pub fn limits(&self) -> HistoryLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `event` for `identity` at `at_ms` (Unix milliseconds).
    pub fn record_at(&self, identity: &str, event: &NodeEvent<'_>, at_ms: u64) {
        let mut t = self.lock();
        let t = &mut *t;
        t.seq += 1;
        let seq = t.seq;
        // One lookup for a node already held: its name is taken back from the update order.
        let (key, before, rec) = match t.nodes.get_mut(identity) {
            Some(r) => {
                let key = match t.order.remove(&r.seq) {
                    Some((k, _)) => k,
                    None => Arc::from(identity),
                };
                let before = r.bytes(identity);
                (key, before, r)
            }
            None => {
                let key: Arc<str> = Arc::from(identity);
                let rec = t.nodes.entry(Arc::clone(&key)).or_insert_with(|| Record {
                    seq,
                    first_seen_ms: at_ms,
                    updated_ms: at_ms,
                    source: Source::Discovery,
                    state: NodeState::Queued,
                    step: "queue",
                    cause: "".into(),
                    helper_msg: "".into(),
                    issued: Issued::default(),
                    upgrade: None,
                    cycles: 0,
                    events: VecDeque::new(),
                    detail_bytes: 0,
                });
                (key, 0, rec)
            }
        };
        rec.seq = seq;
        rec.updated_ms = at_ms;
        let ev = match *event {
            NodeEvent::Queued { source } => {
                rec.source = source;
                rec.state = NodeState::Queued;
                rec.step = "queue";
                Event {
                    at_ms,
                    kind: EventKind::Queued,
                    step: source_label(source),
                    ok: true,
                    tries: 0,
                    elapsed_ms: 0,
                    detail: "".into(),
                }
            }
            NodeEvent::Started { source } => {
                rec.source = source;
                rec.state = NodeState::Working;
                rec.step = "start";
                rec.cycles = rec.cycles.saturating_add(1);
                Event {
                    at_ms,
                    kind: EventKind::Started,
                    step: source_label(source),
                    ok: true,
                    tries: 0,
                    elapsed_ms: 0,
                    detail: "".into(),
                }
            }
            NodeEvent::Step {
                step,
                ok,
                tries,
                elapsed,
                detail,
            } => {
                rec.step = step;
                Event {
                    at_ms,
                    kind: EventKind::Step,
                    step,
                    ok,
                    tries,
                    elapsed_ms: millis(elapsed),
                    detail: bounded_to(detail, MAX_DETAIL),
                }
            }
            NodeEvent::Finished(v) => {
                Self::finish(rec, v);
                let label = v.state.label();
                *t.totals.entry(label).or_insert(0) += 1;
                let minute = at_ms / 60_000;
                match t.minutes.back_mut() {
                    Some(m) if m.0 == minute => {
                        if v.state == NodeState::Provisioned {
                            m.1 = m.1.saturating_add(1);
                        } else if v.state.is_problem() {
                            m.2 = m.2.saturating_add(1);
                        }
                    }
                    _ => {
                        t.minutes.push_back((
                            minute,
                            u32::from(v.state == NodeState::Provisioned),
                            u32::from(v.state.is_problem()),
                        ));
                        while t.minutes.len() > THROUGHPUT_MINUTES {
                            t.minutes.pop_front();
                        }
                    }
                }
                Event {
                    at_ms,
                    kind: EventKind::Finished,
                    step: label,
                    ok: !v.state.is_problem(),
                    tries: 0,
                    elapsed_ms: millis(v.elapsed),
                    detail: bounded_to(&v.cause, MAX_DETAIL),
                }
            }
            // An event this history does not know yet is not recorded.
            _ => return,
        };
        if rec.events.len() >= MAX_EVENTS {
            if let Some(old) = rec.events.pop_front() {
                rec.detail_bytes = rec.detail_bytes.saturating_sub(old.detail.len());
            }
        }
        rec.detail_bytes += ev.detail.len();
        rec.events.push_back(ev);
        let after = rec.bytes(identity);
        t.bytes = t.bytes.saturating_sub(before).saturating_add(after);
        t.order.insert(seq, (key, at_ms));
        self.prune(t, at_ms);
    }

    fn finish(rec: &mut Record, v: &Verdict) {
        rec.source = v.source;
        rec.state = v.state;
        rec.step = v.step;
        rec.cause = bounded(&v.cause);
        rec.helper_msg = bounded(&v.helper_msg);
        rec.issued = Issued {
            certificate: v.issued.certificate.as_ref().map(|c| match c {
                Ok(c) => Ok(provision_core::CertificateId {
                    serial: bounded_to(&c.serial, 128).into(),
                    sha256: bounded_to(&c.sha256, 128).into(),
                    not_after: c.not_after,
                }),
                Err(e) => Err(bounded_to(e, MAX_DETAIL).into()),
            }),
            server_jwt: v
                .issued
                .server_jwt
                .as_ref()
                .map(|j| provision_core::ServerJwtId {
                    id: bounded_to(&j.id, 128).into(),
                    expires: j.expires,
                }),
        };
        rec.upgrade = v
            .upgrade
            .as_ref()
            .map(|(f, t)| Box::new((bounded_to(f, 128).into(), bounded_to(t, 128).into())));
    }

    /// Forgets the least recently updated nodes over the count and those older than the age.
    fn prune(&self, t: &mut Inner, now_ms: u64) {
        let oldest_kept = now_ms.saturating_sub(millis(self.limits.max_age));
        while let Some((&seq, (id, updated_ms))) = t.order.first_key_value() {
            let too_many = t.nodes.len() > self.limits.max_nodes;
            let too_old = *updated_ms < oldest_kept;
            if !too_many && !too_old {
                break;
            }
            let id = Arc::clone(id);
            t.order.remove(&seq);
            if let Some(r) = t.nodes.remove(&id) {
                t.bytes = t.bytes.saturating_sub(r.bytes(&id));
            }
        }
        if t.nodes.is_empty() {
            t.nodes.shrink_to(1024);
        }
    }

    /// Forgets nodes past their age now (also done on every update).
    pub fn expire(&self) {
        let mut t = self.lock();
        self.prune(&mut t, now_ms());
    }

    /// Nodes held.
    pub fn len(&self) -> usize {
        self.lock().nodes.len()
    }

    /// Whether no node is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes the history holds, counted from what it allocates per node.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Nodes held by current state.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let t = self.lock();
        let mut out: BTreeMap<&'static str, usize> =
            NodeState::ALL.iter().map(|s| (s.label(), 0)).collect();
        for r in t.nodes.values() {
            *out.entry(r.state.label()).or_insert(0) += 1;
        }
        out
    }

    /// Cycles ended since start, by terminal state.
    pub fn totals(&self) -> BTreeMap<&'static str, u64> {
        let t = self.lock();
        let mut out: BTreeMap<&'static str, u64> = NodeState::ALL
            .iter()
            .filter(|s| s.is_terminal())
            .map(|s| (s.label(), 0))
            .collect();
        for (k, v) in &t.totals {
            out.insert(k, *v);
        }
        out
    }

    /// Provisioned and problem cycles per minute over the last [`THROUGHPUT_MINUTES`]
    /// minutes up to `now_ms`, oldest first, a zero for each minute without any.
    pub fn throughput(&self, now_ms: u64) -> Vec<(u32, u32)> {
        let t = self.lock();
        let now = now_ms / 60_000;
        let first = now.saturating_sub(THROUGHPUT_MINUTES as u64 - 1);
        let mut out = vec![(0, 0); THROUGHPUT_MINUTES];
        for &(m, p, f) in &t.minutes {
            if m >= first && m <= now {
                let i = usize::try_from(m - first).unwrap_or(0);
                out[i] = (p, f);
            }
        }
        out
    }

    /// The nodes in `state` (every node for `None`), most recently updated first: the total
    /// and the page from `offset` of at most `limit`.
    pub fn list(
        &self,
        state: Option<NodeState>,
        offset: usize,
        limit: usize,
    ) -> (usize, Vec<NodeSummary>) {
        let t = self.lock();
        let mut total = 0;
        let mut page = Vec::new();
        for (id, _) in t.order.values().rev() {
            let Some(r) = t.nodes.get(id) else { continue };
            if state.is_some_and(|s| s != r.state) {
                continue;
            }
            if total >= offset && page.len() < limit {
                page.push(NodeSummary::of(id, r));
            }
            total += 1;
        }
        (total, page)
    }

    /// The most recent nodes whose last cycle refused, deferred or failed them, newest first.
    pub fn recent_problems(&self, limit: usize) -> Vec<NodeSummary> {
        let t = self.lock();
        t.order
            .values()
            .rev()
            .filter_map(|(id, _)| {
                let r = t.nodes.get(id)?;
                r.state.is_problem().then(|| NodeSummary::of(id, r))
            })
            .take(limit)
            .collect()
    }

    /// One node with its history as the API shows it, `None` when not held.
    pub fn node_json(&self, identity: &str) -> Option<Value> {
        let t = self.lock();
        let r = t.nodes.get(identity)?;
        let history: Vec<Value> = r
            .events
            .iter()
            .map(|e| {
                json!({
                    "time": rfc3339(e.at_ms),
                    "event": e.kind.label(),
                    "step": e.step,
                    "ok": e.ok,
                    "tries": e.tries,
                    "elapsed_ms": e.elapsed_ms,
                    "detail": &*e.detail,
                })
            })
            .collect();
        Some(json!({
            "identity": identity,
            "state": r.state.label(),
            "step": r.step,
            "cause": &*r.cause,
            "found_by": source_label(r.source),
            "first_seen": rfc3339(r.first_seen_ms),
            "updated": rfc3339(r.updated_ms),
            "cycles": r.cycles,
            "helper_msg": &*r.helper_msg,
            "issued": issued_json(&r.issued),
            "upgrade": r.upgrade.as_ref().map(|u| json!({"from": u.0, "to": u.1})),
            "history": history,
        }))
    }
}

/// What a node was given, as the API and the audit trail show it: `null`, or an object with
/// `certificate` (`serial`, `sha256`, `not_after`; or `error`) and/or `server_jwt` (`id`,
/// `expires`).
pub fn issued_json(issued: &Issued) -> Value {
    let time = |s: i64| rfc3339(u64::try_from(s).unwrap_or(0).saturating_mul(1000));
    let mut out = serde_json::Map::new();
    match &issued.certificate {
        Some(Ok(c)) => {
            out.insert(
                "certificate".into(),
                json!({"serial": c.serial, "sha256": c.sha256, "not_after": time(c.not_after)}),
            );
        }
        Some(Err(e)) => {
            out.insert("certificate".into(), json!({ "error": e }));
        }
        None => {}
    }
    if let Some(j) = &issued.server_jwt {
        out.insert(
            "server_jwt".into(),
            json!({"id": j.id, "expires": j.expires.map(time)}),
        );
    }
    if out.is_empty() {
        Value::Null
    } else {
        Value::Object(out)
    }
}

impl NodeSummary {
    /// The summary of node `identity` from its record.
    fn of(identity: &str, r: &Record) -> Self {
        NodeSummary {
            identity: identity.to_string(),
            state: r.state,
            step: r.step,
            cause: r.cause.to_string(),
            updated_ms: r.updated_ms,
            source: r.source,
        }
    }

    /// The summary as the API lists it.
    pub fn to_json(&self) -> Value {
        json!({
            "identity": self.identity,
            "state": self.state.label(),
            "step": self.step,
            "cause": self.cause,
            "found_by": source_label(self.source),
            "updated": rfc3339(self.updated_ms),
        })
    }
}

impl Observer for NodeTable {
    fn node_event(&self, identity: &str, event: &NodeEvent<'_>) {
        self.record_at(identity, event, now_ms());
    }
}

/// Unix milliseconds as an RFC 3339 UTC time with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn finished(state: NodeState, cause: &str) -> Verdict {
        Verdict {
            state,
            step: "choria_provision#jwt",
            cause: cause.into(),
            source: Source::Discovery,
            helper_msg: String::new(),
            issued: Issued::default(),
            upgrade: None,
            elapsed: Duration::from_millis(5),
            answered: true,
        }
    }

    #[test]
    fn rfc3339_matches_known_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(2_111_480_794_000), "2036-11-28T10:26:34.000Z");
    }

    #[test]
    fn a_node_keeps_its_steps_and_verdict() {
        let t = NodeTable::new(HistoryLimits::default());
        let id = "n1.example.net";
        t.record_at(
            id,
            &NodeEvent::Queued {
                source: Source::Event,
            },
            1_000,
        );
        t.record_at(
            id,
            &NodeEvent::Started {
                source: Source::Event,
            },
            2_000,
        );
        t.record_at(
            id,
            &NodeEvent::Step {
                step: "choria_provision#jwt",
                ok: false,
                tries: 3,
                elapsed: Duration::from_millis(30_500),
                detail: "timeout",
            },
            3_000,
        );
        let v = finished(
            NodeState::Failed,
            "could not fetch and validate JWT: timeout",
        );
        t.record_at(id, &NodeEvent::Finished(&v), 4_000);
        let j = t.node_json(id).unwrap();
        assert_eq!(j["state"], "failed");
        assert_eq!(j["step"], "choria_provision#jwt");
        assert_eq!(j["cause"], "could not fetch and validate JWT: timeout");
        assert_eq!(j["found_by"], "discovery");
        assert_eq!(j["cycles"], 1);
        let h = j["history"].as_array().unwrap();
        let kinds: Vec<&str> = h.iter().map(|e| e["event"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["queued", "started", "step", "finished"]);
        assert_eq!(h[2]["tries"], 3);
        assert_eq!(h[2]["elapsed_ms"], 30_500);
        assert_eq!(h[2]["ok"], false);
        assert_eq!(t.totals()["failed"], 1);
        let (total, page) = t.list(Some(NodeState::Failed), 0, 10);
        assert_eq!((total, page.len()), (1, 1));
        assert_eq!(t.list(Some(NodeState::Provisioned), 0, 10).0, 0);
        assert_eq!(t.recent_problems(5)[0].identity, id);
    }

    /// The running count of the details' bytes is what walking the history gives, as events
    /// of every length come and the oldest go.
    #[test]
    fn the_details_count_follows_the_history() {
        let t = NodeTable::new(HistoryLimits::default());
        for i in 0..(3 * MAX_EVENTS) {
            let detail = "d".repeat(i * 37 % (MAX_DETAIL + 50));
            t.record_at(
                "n1.example.net",
                &NodeEvent::Step {
                    step: "choria_provision#jwt",
                    ok: i % 2 == 0,
                    tries: 1,
                    elapsed: Duration::from_millis(1),
                    detail: &detail,
                },
                1_000 + i as u64,
            );
            let inner = t.lock();
            let rec = &inner.nodes["n1.example.net"];
            let walked: usize = rec.events.iter().map(|e| e.detail.len()).sum();
            assert_eq!(rec.detail_bytes, walked, "after {} events", i + 1);
            assert_eq!(inner.bytes, rec.bytes("n1.example.net"));
        }
    }

    #[test]
    fn the_table_is_bounded_by_count_age_events_and_text() {
        let t = NodeTable::new(HistoryLimits {
            max_nodes: 100,
            max_age: Duration::from_secs(60),
        });
        for i in 0..250 {
            t.record_at(
                &format!("n{i}"),
                &NodeEvent::Queued {
                    source: Source::Discovery,
                },
                1_000 + i,
            );
        }
        assert_eq!(t.len(), 100);
        // The least recently updated went first.
        assert!(t.node_json("n149").is_none());
        assert!(t.node_json("n150").is_some());
        let per_node = t.bytes() / t.len();
        // A node with one event: a few hundred bytes, not kilobytes.
        assert!((200..1000).contains(&per_node), "{per_node} bytes per node");

        // Events per node are capped; texts are cut.
        let long = "x".repeat(10 * MAX_TEXT);
        for i in 0..(3 * MAX_EVENTS as u64) {
            t.record_at(
                "n249",
                &NodeEvent::Step {
                    step: "helper",
                    ok: false,
                    tries: 1,
                    elapsed: Duration::ZERO,
                    detail: &long,
                },
                2_000 + i,
            );
        }
        let j = t.node_json("n249").unwrap();
        let h = j["history"].as_array().unwrap();
        assert_eq!(h.len(), MAX_EVENTS);
        assert!(h[0]["detail"].as_str().unwrap().len() <= MAX_DETAIL);
        let most = MAX_EVENTS * (MAX_TEXT + std::mem::size_of::<Event>()) + 1024;
        assert!(t.bytes() < 99 * 1000 + most, "{}", t.bytes());

        // A minute later every node not updated since is forgotten.
        t.record_at(
            "late",
            &NodeEvent::Queued {
                source: Source::Event,
            },
            2_000 + 61_000,
        );
        assert_eq!(t.len(), 1, "{:?}", t.list(None, 0, 5));
        assert!(t.bytes() < 1000, "{}", t.bytes());
    }

    #[test]
    fn a_node_at_every_limit_costs_at_most_max_bytes_per_node() {
        let t = NodeTable::new(HistoryLimits::default());
        let id = format!("{}.example.net", "x".repeat(240));
        let long = "é".repeat(4 * MAX_TEXT);
        for i in 0..(2 * MAX_EVENTS as u64) {
            t.record_at(
                &id,
                &NodeEvent::Step {
                    step: "choria_provision#configure",
                    ok: false,
                    tries: 5,
                    elapsed: Duration::from_secs(20),
                    detail: &long,
                },
                i,
            );
        }
        let mut v = finished(NodeState::Failed, &long);
        v.helper_msg = long.clone();
        v.upgrade = Some((long.clone(), long.clone()));
        v.issued = Issued {
            certificate: Some(Err(long.clone())),
            server_jwt: Some(provision_core::ServerJwtId {
                id: long.clone(),
                expires: Some(1),
            }),
        };
        t.record_at(&id, &NodeEvent::Finished(&v), 1_000);
        let bytes = t.bytes();
        assert!(
            bytes <= MAX_BYTES_PER_NODE,
            "{bytes} bytes for one node at every limit"
        );
        // And the count follows the node out.
        t.record_at(
            "other",
            &NodeEvent::Queued {
                source: Source::Event,
            },
            1_000 + 3_600_001,
        );
        assert!(t.bytes() < 1000, "{}", t.bytes());
    }

    #[test]
    fn pages_are_newest_first() {
        let t = NodeTable::new(HistoryLimits::default());
        for i in 0..10u64 {
            t.record_at(
                &format!("n{i}"),
                &NodeEvent::Queued {
                    source: Source::Discovery,
                },
                i,
            );
        }
        let (total, page) = t.list(None, 2, 3);
        assert_eq!(total, 10);
        let ids: Vec<&str> = page.iter().map(|s| s.identity.as_str()).collect();
        assert_eq!(ids, ["n7", "n6", "n5"]);
        assert_eq!(t.counts()["queued"], 10);
    }

    #[test]
    fn throughput_counts_per_minute() {
        let t = NodeTable::new(HistoryLimits::default());
        let minute = 60_000u64;
        let base = 1_000 * minute;
        let ok = finished(NodeState::Provisioned, "");
        let bad = finished(NodeState::Refused, "no");
        t.record_at("a", &NodeEvent::Finished(&ok), base);
        t.record_at("b", &NodeEvent::Finished(&ok), base + 10);
        t.record_at("c", &NodeEvent::Finished(&bad), base + 2 * minute);
        let tp = t.throughput(base + 2 * minute);
        assert_eq!(tp.len(), THROUGHPUT_MINUTES);
        assert_eq!(tp[THROUGHPUT_MINUTES - 3], (2, 0));
        assert_eq!(tp[THROUGHPUT_MINUTES - 1], (0, 1));
    }
}
