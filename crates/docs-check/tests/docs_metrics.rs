//! The shipped Grafana dashboard and the Go project's dashboard read only the metrics the
//! provisioner really exports, with the `site` and `rpc` labels they filter and group on; and
//! the counts of series the pages give are the exported counts. (Every family's row in
//! docs/monitoring.md, with its type, is checked by provisioner-metrics' tests/docs.rs.)

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use provisioner_metrics::Metrics;
use test_support::workspace_root as root;

/// The real exposition with every family in use.
fn exposition() -> String {
    let m = Metrics::new("docs");
    let rpc = m.rpc("choria_provision#configure");
    rpc.time.observe(Duration::from_millis(5));
    rpc.errors.inc();
    m.helper_time.observe(Duration::from_millis(5));
    m.set_election_source("provisioner", "p1", || {
        provisioner_metrics::ElectionSample {
            campaigns_as_candidate: 1,
            campaigns_as_leader: 1,
            leader: Some(true),
            interval: Some(Duration::from_secs(1)),
        }
    });
    m.encode()
}

/// The metric families an exposition declares (its `# TYPE` lines), in order.
fn families(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

/// `choria_provisioner_*` names in a text, with `_sum`/`_count` reduced to the family.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("choria_provisioner_") {
        let tail = &rest[i..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..len];
        let family = name
            .strip_suffix("_sum")
            .or_else(|| name.strip_suffix("_count"))
            .unwrap_or(name);
        out.insert(family.to_string());
        rest = &tail[len..];
    }
    out
}

/// Every `expr` of every panel (and row) of a Grafana dashboard.
fn exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dashboard];
    while let Some(v) = stack.pop() {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(e)) = map.get("expr") {
                    out.push(e.clone());
                }
                stack.extend(map.values());
            }
            serde_json::Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
    out
}

#[test]
fn the_dashboards_read_only_exported_metrics_and_labels() {
    let text = exposition();
    let types: BTreeSet<&str> = families(&text).into_iter().collect();
    let ours: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("docs/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    let ours = exprs(&ours);
    assert!(ours.len() >= 10, "{ours:?}");
    // The Go project's dashboard queries (github.com/choria-io/provisioner dashboard.json).
    let go = [
        r#"sum(increase(choria_provisioner_provisioned{site="${instance}"}[1h]))"#,
        r#"choria_provisioner_busy_workers{site="${instance}"}"#,
        r#"choria_provisioner_paused{site=~"${instance}"}"#,
        r#"increase(choria_provisioner_discover_cycles{site=~"${instance}"}[1m])"#,
        r#"increase(choria_provisioner_discovered{site=~"${instance}"}[1m])"#,
        r#"increase(choria_provisioner_event_discovered{site=~"${instance}"}[1m])"#,
        r#"sum(rate(choria_provisioner_rpc_time_sum{site=~"${instance}"}[1m])) by (rpc) / sum(rate(choria_provisioner_rpc_time_count{site=~"${instance}"}[1m])) by (rpc)"#,
        r#"sum(rate(choria_provisioner_helper_time_sum{site=~"${instance}"}[1m])) by (rpc) / sum(rate(choria_provisioner_helper_time_count{site=~"${instance}"}[1m])) by (rpc)"#,
        r#"increase(choria_provisioner_rpc_errors{site=~"${instance}"}[5m])"#,
        r#"increase(choria_provisioner_helper_errors{site=~"${instance}"}[1m])"#,
        r#"increase(choria_provisioner_discovery_errors{site=~"${instance}"}[1m])"#,
        r#"increase(choria_provisioner_provision_errors{site=~"${instance}"}[1m])"#,
    ];
    for e in ours.iter().map(String::as_str).chain(go) {
        let names = names_in(e);
        assert!(!names.is_empty(), "{e}");
        for n in names {
            assert!(
                types.contains(n.as_str()),
                "{e} reads {n}, which is not exported"
            );
            // Every sample of the family carries the site label the queries filter on.
            for line in text.lines().filter(|l| l.starts_with(&n)) {
                assert!(line.contains("site=\"docs\""), "{line} has no site label");
            }
            if e.contains("by (rpc)") && n.starts_with("choria_provisioner_rpc_") {
                assert!(
                    text.lines()
                        .any(|l| l.starts_with(&n)
                            && l.contains("rpc=\"choria_provision#configure\"")),
                    "{n} has no rpc label"
                );
            }
        }
    }
}

/// The numbers the pages give for the series: monitoring.md's sentence says how many families
/// `/metrics` serves, by group, and every page that counts series ("fifteen provisioner
/// series", "the ten metrics ...") gives one of the real counts.
#[test]
fn the_counts_the_pages_give_are_the_exported_counts() {
    let text = exposition();
    let families = families(&text);
    let count = |prefix: &str| families.iter().filter(|f| f.starts_with(prefix)).count();
    let (prov, conn, elect, proc_) = (
        count("choria_provisioner_"),
        count("choria_connector_"),
        count("choria_election_"),
        count("process_"),
    );
    assert_eq!(prov + conn + elect + proc_, families.len(), "{families:?}");
    let page = std::fs::read_to_string(root().join("docs/monitoring.md")).unwrap();
    // The Go provisioner's: the table rows not marked as this provisioner's own.
    let go = page
        .lines()
        .filter(|l| l.starts_with("| `choria_provisioner_"))
        .filter(|l| !l.to_lowercase().contains("not in the go provisioner"))
        .count();
    assert_eq!(go, 15, "the Go provisioner exports fifteen series");
    let sentence = format!(
        "`/metrics` serves {} metric families: {prov} provisioner series ({go} of them the Go \
         provisioner's, {} this provisioner's own), {conn} connector series, {elect} election \
         series with `leader_election`, and {proc_} process series.",
        families.len(),
        prov - go
    );
    let flat = page.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&sentence),
        "docs/monitoring.md should say, in its Metrics section:\n{sentence}"
    );

    let words = [
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
    ];
    let allowed = [go, prov - go];
    for file in [
        "ARCHITECTURE.md",
        "README.md",
        "CHANGELOG.md",
        "docs/migrating.md",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let flat: Vec<String> = text
            .split_whitespace()
            .map(|w| {
                w.trim_matches(|c: char| !c.is_alphanumeric())
                    .to_lowercase()
            })
            .collect();
        for pair in flat.windows(3) {
            let n = words
                .iter()
                .position(|w| *w == pair[0])
                .map(|i| i + 1)
                .or_else(|| pair[0].parse().ok());
            let counts_series = ["series", "metrics"].contains(&pair[1].as_str())
                || (pair[1] == "provisioner" && ["series", "metrics"].contains(&pair[2].as_str()));
            if let (Some(n), true) = (n, counts_series) {
                assert!(
                    allowed.contains(&n),
                    "{file} counts {} {} {}: the counts are {go} (the Go provisioner's) and {} (this provisioner's own)",
                    pair[0],
                    pair[1],
                    pair[2],
                    prov - go
                );
            }
        }
    }
}
