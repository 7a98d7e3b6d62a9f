//! The "Lines to alert on" table of docs/logs.md, checked against real runs: every row is read
//! from the page, and each must match a line (level, component, message) that a real
//! provisioner wrote while a broker went away and came back, a node failed, the work queue
//! overflowed and leader election failed, waited, won and lost. A row no run produced fails the
//! test, so the table cannot promise a line the binary does not write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use choria_fleet_sim::Mode;
use common::*;
use serde_json::Value;
use test_support::provisioner::READY;

const WAIT: Duration = Duration::from_secs(60);

/// One row of the table.
#[derive(Debug)]
struct Row {
    level: String,
    component: String,
    message: String,
}

fn documented_rows() -> Vec<Row> {
    let page = std::fs::read_to_string(workspace().join("docs/logs.md")).unwrap();
    let section = &page[page.find("## Lines to alert on").expect("the section")..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |i| i + 3)];
    let rows: Vec<Row> = section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| level"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").map(|c| c.trim_matches('|').trim()).collect();
            Row {
                level: cells[0].to_string(),
                component: cells[1].to_string(),
                message: cells[2].trim_matches('`').to_string(),
            }
        })
        .collect();
    assert!(rows.len() >= 10, "{rows:?}");
    rows
}

/// Whether `text` matches `pattern`, where `…` stands for any text.
fn matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let Some(mut rest) = text.strip_prefix(parts[0]) else {
        return false;
    };
    let Some((last, middle)) = parts[1..].split_last() else {
        // No `…`: the whole message.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Every JSON line of a log file.
fn log_lines(path: &Path) -> Vec<serde_json::Map<String, Value>> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| match serde_json::from_str(l) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_alert_line_is_written_by_a_real_run() {
    let rows = documented_rows();
    let mut env = Env::new();
    let mut logs = Vec::new();
    let mut stderr = String::new();

    // 1. The broker is down at start, a node fails, the queue overflows, the broker restarts.
    env.nats.stop();
    let main_log = env.path().join("main.log");
    let mut opts = env.provisioner(format!("{} slow 0.2", test_helper("scenario.py")));
    opts.logfile = Some(main_log.clone());
    opts.loglevel = "info".into();
    opts.workers = 1;
    let opts = opts.yaml("work_queue_size: 3");
    let mut main = env.start(&opts);
    expect_in_file(&main_log, "Initial connection to the Broker failed", WAIT).await;
    env.nats.start_again().unwrap();
    expect_in_file(&main_log, READY, WAIT).await;
    let mut broken_cfg = env.fleet_config(1, Mode::Plain);
    broken_cfg.identity_prefix = "broken".into();
    broken_cfg.faults.fail_action = vec![("jwt".into(), 1.0)];
    let broken = env.fleet(broken_cfg).await;
    let fleet = env.fleet(env.fleet_config(8, Mode::Plain)).await;
    expect_in_file(&main_log, "Could not provision broken", WAIT).await;
    expect_in_file(&main_log, "Adding host to work queue failed", WAIT).await;
    env.nats.restart();
    expect_in_file(
        &main_log,
        "NATS client reconnected after a previous disconnection",
        WAIT,
    )
    .await;
    finish(&mut main, fleet).await;
    broken.shutdown().await;
    logs.extend(log_lines(&main_log));

    // 2. Leader election without its bucket: the daemon stops.
    let election_log = env.path().join("election.log");
    let mut opts = env.plain();
    opts.identity = "provisioner-e".into();
    opts.leader_election = true;
    opts.logfile = Some(election_log.clone());
    opts.loglevel = "info".into();
    let mut stopping = env.start(&opts);
    let status = stopping.wait_exit(WAIT).await.expect("it stops");
    assert_eq!(status.code(), Some(1));
    stderr.push_str(&stopping.output());
    logs.extend(log_lines(&election_log));

    // 3. The same with leader_election_wait: it waits, wins once the bucket exists, and loses
    // when another candidate takes the key.
    let wait_log = env.path().join("wait.log");
    let mut opts = env.plain().yaml("leader_election_wait: true");
    opts.identity = "provisioner-w".into();
    opts.leader_election = true;
    opts.logfile = Some(wait_log.clone());
    opts.loglevel = "info".into();
    let mut waiting = env.start(&opts);
    expect_in_file(&wait_log, READY, WAIT).await;
    expect_in_file(&wait_log, "provisioning stays paused", WAIT).await;
    let kv = create_election_bucket(&env.url()).await;
    expect_in_file(&wait_log, "Became leader", WAIT).await;
    kv.put("provisioner", "intruder".into()).await.unwrap();
    expect_in_file(&wait_log, "Lost leadership", WAIT).await;
    waiting.stop_with("TERM").await;
    logs.extend(log_lines(&wait_log));

    let field = |m: &serde_json::Map<String, Value>, k: &str| {
        m.get(k).and_then(Value::as_str).unwrap_or("").to_string()
    };
    let mut missing = Vec::new();
    for row in &rows {
        let found = if row.component == "stderr" {
            stderr.lines().any(|l| matches(&row.message, l))
        } else {
            logs.iter().any(|m| {
                let component = field(m, "component");
                let component_ok = match row.component.as_str() {
                    // A node's own lines carry its identity as the component.
                    "the node" => component == field(m, "identity") && !component.is_empty(),
                    c => component == c,
                };
                field(m, "level") == row.level
                    && component_ok
                    && matches(&row.message, &field(m, "msg"))
            })
        };
        if !found {
            missing.push(row);
        }
    }
    assert!(
        missing.is_empty(),
        "documented alert lines no run wrote: {missing:#?}\n\nstderr:\n{stderr}"
    );
}

#[test]
fn the_pattern_matcher_treats_the_ellipsis_as_any_text() {
    assert!(matches(
        "Could not provision …: …",
        "Could not provision a.b: timeout"
    ));
    assert!(!matches("Could not provision …: …", "Could not parse a.b"));
    assert!(matches(
        "Lost leadership: pausing and clearing … queued nodes",
        "Lost leadership: pausing and clearing 0 queued nodes"
    ));
    assert!(!matches(
        "Lost leadership: pausing and clearing … queued nodes",
        "Lost leadership: pausing and clearing 0 queued nodes now"
    ));
    assert!(matches(
        "Became leader after winning election",
        "Became leader after winning election"
    ));
    assert!(!matches(
        "Became leader after winning election",
        "Became leader after winning election!"
    ));
}
