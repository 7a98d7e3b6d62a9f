//! docs/monitoring.md documents every family the exposition carries (provisioner, connector,
//! election and process series) with its type, and documents nothing that is not exported; the
//! shipped dashboard reads only exported families and labels.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use provisioner_metrics::{ElectionSample, Metrics};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The exposition with every family in use: family name to type, and the text.
fn exported() -> (BTreeMap<String, String>, String) {
    let m = Metrics::new("docs");
    let rpc = m.rpc("choria_provision#configure");
    rpc.time.observe(Duration::from_millis(5));
    rpc.errors.inc();
    m.helper_time.observe(Duration::from_millis(5));
    m.set_election_source("provisioner", "p1.example.net", || ElectionSample {
        campaigns_as_candidate: 1,
        campaigns_as_leader: 1,
        leader: Some(true),
        interval: Some(Duration::from_millis(500)),
    });
    let text = m.encode();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            types.insert(w.next().unwrap().to_string(), w.next().unwrap().to_string());
        }
    }
    (types, text)
}

fn is_metric_name(name: &str) -> bool {
    (name.starts_with("choria_") || name.starts_with("process_"))
        && name.bytes().all(|c| c.is_ascii_lowercase() || c == b'_')
}

#[test]
fn the_monitoring_page_documents_every_exported_family_with_its_type() {
    let (types, _) = exported();
    // 28 provisioner, 5 connector, 3 election and 9 process families.
    assert_eq!(types.len(), 45, "{types:?}");
    let page = std::fs::read_to_string(root().join("docs/monitoring.md")).unwrap();
    let mut documented = BTreeMap::new();
    for line in page.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let [_, name, kind, ..] = cells.as_slice() {
            let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`')) else {
                continue;
            };
            if is_metric_name(name) {
                let previous = documented.insert(name.to_string(), kind.to_string());
                assert!(previous.is_none(), "{name} documented twice");
            }
        }
    }
    assert_eq!(
        documented.keys().collect::<Vec<_>>(),
        types.keys().collect::<Vec<_>>(),
        "documented metrics differ from the exported ones"
    );
    for (name, kind) in &types {
        assert_eq!(&documented[name], kind, "{name}: wrong type in the docs");
    }
}

/// Every `"expr"` string of a Grafana dashboard, unescaped (its queries hold no other escape
/// than `\"`).
fn exprs(json: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = json;
    while let Some(i) = rest.find("\"expr\":") {
        rest = rest[i + 7..].trim_start();
        let body = rest.strip_prefix('"').unwrap();
        let mut value = String::new();
        let mut chars = body.char_indices();
        let end = loop {
            match chars.next().unwrap() {
                (i, '"') => break i,
                (_, '\\') => value.push(chars.next().unwrap().1),
                (_, c) => value.push(c),
            }
        };
        out.push(value);
        rest = &body[end + 1..];
    }
    out
}

/// Metric names in a query, `_sum`/`_count` reduced to the family.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        if i == start {
            i += 1;
            continue;
        }
        let word = &expr[start..i];
        if is_metric_name(word) {
            let family = word
                .strip_suffix("_sum")
                .or_else(|| word.strip_suffix("_count"))
                .unwrap_or(word);
            out.insert(family.to_string());
        }
    }
    out
}

#[test]
fn the_dashboard_reads_only_exported_families_and_labels() {
    let (types, text) = exported();
    let all = exprs(&std::fs::read_to_string(root().join("docs/grafana-dashboard.json")).unwrap());
    assert!(all.len() >= 20, "{all:?}");
    let mut read = BTreeSet::new();
    for e in &all {
        for n in names_in(e) {
            assert!(
                types.contains_key(&n),
                "{e} reads {n}, which is not exported"
            );
            read.insert(n);
        }
        if e.contains("choria_election_") {
            for label in ["election=\"provisioner\"", "identity=\"", "state=\""] {
                let family = if label.starts_with("state") {
                    "choria_election_campaigns{"
                } else {
                    "choria_election_leader{"
                };
                assert!(
                    text.lines()
                        .any(|l| l.starts_with(family) && l.contains(label)),
                    "{family} has no {label}"
                );
            }
        }
    }
    for family in [
        "choria_election_leader",
        "choria_connector_reconnections",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(
            read.contains(family),
            "the dashboard does not show {family}"
        );
    }
}
