//! The log file as the Go provisioner writes it: with `logfile` naming a file every line is a
//! logrus JSON object (`component`, `level`, `msg`, `time`, the record's fields, keys sorted),
//! levels by logrus' names, and the messages operators match in the Go provisioner's words.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use choria_fleet_sim::Mode;
use common::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// Every line of the file, parsed; fails on a line that is not one JSON object.
fn lines(path: &Path) -> Vec<(String, serde_json::Map<String, Value>)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => (l.to_string(), m),
            other => panic!("not a JSON object line: {l:?} ({other:?})\n{text}"),
        })
        .collect()
}

/// `2006-01-02T15:04:05Z07:00`: RFC 3339, whole seconds, `Z` or a `+hh:mm`/`-hh:mm` offset.
fn is_go_rfc3339(t: &str) -> bool {
    let b = t.as_bytes();
    let digits = |r: std::ops::Range<usize>| r.into_iter().all(|i| b[i].is_ascii_digit());
    let head = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    let zone = &t[19.min(t.len())..];
    let zb = zone.as_bytes();
    head && (zone == "Z"
        || (zb.len() == 6
            && (zb[0] == b'+' || zb[0] == b'-')
            && zb[1..3].iter().all(u8::is_ascii_digit)
            && zb[3] == b':'
            && zb[4..6].iter().all(u8::is_ascii_digit)))
}

fn s<'a>(m: &'a serde_json::Map<String, Value>, k: &str) -> &'a str {
    m.get(k).and_then(Value::as_str).unwrap_or_default()
}

#[test]
fn the_time_check_accepts_go_layouts_only() {
    assert!(is_go_rfc3339("2026-12-01T06:00:00Z"));
    assert!(is_go_rfc3339("2026-12-01T07:00:00+01:00"));
    assert!(is_go_rfc3339("2026-12-01T01:00:00-05:00"));
    assert!(!is_go_rfc3339("2026-12-01T06:00:00.123Z"));
    assert!(!is_go_rfc3339("2026-12-01 06:00:00Z"));
    assert!(!is_go_rfc3339("2026-12-01T06:00:00"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_file_is_logrus_json_with_the_go_messages() {
    let env = Env::new();
    let logfile = env.path().join("provisioner.log");

    let good = env.fleet(env.fleet_config(3, Mode::Plain)).await;
    // One node that refuses the provisioning JWT request every time.
    let mut broken_cfg = env.fleet_config(1, Mode::Plain);
    broken_cfg.identity_prefix = "broken".into();
    broken_cfg.faults.fail_action = vec![("jwt".into(), 1.0)];
    let broken = env.fleet(broken_cfg).await;
    let broken_id = broken.identities()[0].clone();
    let good_ids = good.identities();

    let mut opts = env.plain();
    opts.logfile = Some(logfile.clone());
    opts.loglevel = "info".into();
    let mut prov = env.start(&opts);
    let port = prov.port;

    assert!(
        good.wait_provisioned(3, WAIT).await,
        "only {} of 3 provisioned\n{}",
        good.provisioned(),
        std::fs::read_to_string(&logfile).unwrap_or_default()
    );
    let failed = format!("Could not provision {broken_id}: ");
    expect_in_file(&logfile, &failed, WAIT).await;
    prov.stop_with("TERM").await;
    good.shutdown().await;
    broken.shutdown().await;

    let all = lines(&logfile);
    assert!(all.len() > 10, "{all:?}");
    let text = std::fs::read_to_string(&logfile).unwrap();
    for (raw, m) in &all {
        // logrus' keys, always; its level names; Go's time layout.
        for k in ["component", "level", "msg", "time"] {
            assert!(m.get(k).is_some_and(Value::is_string), "no {k}: {raw}");
        }
        assert!(
            ["info", "warning", "error"].contains(&s(m, "level")),
            "a level logrus does not write at info: {raw}"
        );
        assert!(is_go_rfc3339(s(m, "time")), "time layout: {raw}");
        // Keys in sorted order, as Go's encoding/json writes a map.
        let mut keys: Vec<&String> = m.keys().collect();
        keys.sort();
        let positions: Vec<usize> = keys
            .iter()
            .map(|k| raw.find(&format!("\"{k}\":")).unwrap())
            .collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "key order: {raw}"
        );
        assert!(!raw.contains('\u{1b}'), "a colour code in the file: {raw}");
    }

    let find = |msg: &str| -> Vec<&serde_json::Map<String, Value>> {
        all.iter()
            .map(|(_, m)| m)
            .filter(|m| s(m, "msg").starts_with(msg))
            .collect()
    };
    let one = |msg: &str| -> &serde_json::Map<String, Value> {
        let found = find(msg);
        assert!(!found.is_empty(), "no line starting {msg:?}:\n{text}");
        found[0]
    };

    // The good nodes: queued, provisioned, each by the Go provisioner's words and level.
    for id in &good_ids {
        let added = one(&format!("Adding {id} to the work queue with "));
        assert_eq!(s(added, "level"), "info");
        assert_eq!(s(added, "component"), "hosts");
        let started = one(&format!("Provisioning {id}"));
        assert_eq!(s(started, "level"), "info");
        let fetching = find("Fetching JWT")
            .into_iter()
            .find(|m| s(m, "component") == id);
        assert!(fetching.is_some(), "no Fetching JWT under {id}:\n{text}");
        let done = one(&format!("Provisioned {id}"));
        assert_eq!(s(done, "msg"), format!("Provisioned {id}"));
        assert_eq!(s(done, "level"), "info");
        assert_eq!(s(done, "component"), "hosts");
        assert_eq!(s(done, "identity"), id);
        let configured = find("Configure response: ")
            .into_iter()
            .find(|m| s(m, "component") == id);
        assert!(configured.is_some(), "no Configure response for {id}");
    }

    // The broken node: every try of the RPC at error under the node's name, the give-up line,
    // then one "Could not provision" line from the work queue.
    let tries: Vec<_> = find("rpc handler for choria_provision#jwt failed: ")
        .into_iter()
        .filter(|m| s(m, "component") == broken_id)
        .collect();
    assert_eq!(tries.len(), 3, "Go tries the jwt action 3 times:\n{text}");
    for t in &tries {
        assert_eq!(s(t, "level"), "error");
        assert!(s(t, "msg").contains("simulated failure of jwt"), "{t:?}");
    }
    let max = one("Maximum 3 tries reached for action choria_provision#jwt");
    assert_eq!(s(max, "level"), "error");
    assert_eq!(s(max, "component"), broken_id);
    let failed = one(&failed);
    assert_eq!(s(failed, "level"), "error");
    assert_eq!(s(failed, "component"), "hosts");
    assert!(
        s(failed, "msg").contains("could not fetch and validate JWT: "),
        "{failed:?}"
    );
    assert!(find(&format!("Provisioned {broken_id}")).is_empty());

    // The start-up lines.
    let start = one("Choria Provisioner starting using configuration file ");
    assert!(
        s(start, "msg").ends_with(". Discovery interval 1m using 4 workers"),
        "{start:?}"
    );
    assert_eq!(s(start, "level"), "info");
    assert_eq!(s(start, "component"), "hosts");
    let listening = one(&format!("Listening for /metrics on {port}"));
    assert_eq!(s(listening, "component"), "provisioner");
    let looking = one("Looking for provisionable hosts");
    assert_eq!(s(looking, "level"), "info");
    for id in &good_ids {
        one(&format!(
            "Adding {id} to the provision list after discovering it"
        ));
    }

    // No secret reaches the log: the token, the signer's seed, a JWT.
    assert!(!text.contains(TOKEN), "the token was logged");
    assert!(!text.contains(&env.signer.seed_hex), "the seed was logged");
    assert!(!text.contains("eyJ"), "a JWT was logged");
    // And nothing went to standard output.
    prov.expect_not_in_output("Provisioned", "logs went to standard output too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_loglevel_logs_warnings_only_as_go_does() {
    let env = Env::new();
    let logfile = env.path().join("quiet.log");
    let fleet = env.fleet(env.fleet_config(2, Mode::Plain)).await;
    let mut opts = env.plain();
    opts.logfile = Some(logfile.clone());
    // `loglevel: ""` (what a file without `loglevel` gives): go-choria's default, warning.
    opts.loglevel = "\"\"".into();
    // Something to warn about at start: an unknown key.
    opts = opts.yaml("no_such_key: 1");
    let mut prov = env.start(&opts);
    assert!(
        fleet.wait_provisioned(2, WAIT).await,
        "{}",
        std::fs::read_to_string(&logfile).unwrap_or_default()
    );
    finish(&mut prov, fleet).await;
    let all = lines(&logfile);
    assert!(
        all.iter()
            .any(|(_, m)| s(m, "level") == "warning" && s(m, "msg").contains("no_such_key")),
        "{all:?}"
    );
    for (raw, m) in &all {
        assert!(
            ["warning", "error"].contains(&s(m, "level")),
            "below warning with no loglevel: {raw}"
        );
    }
}
