//! The high-availability alert that docs/high-availability.md recommends, evaluated by a real
//! Prometheus (Debian's `prometheus`) scraping real provisioners: it fires while a pair has no
//! leader (no election bucket yet, both waiting with `leader_election_wait`), clears once one of
//! them leads, and fires again when a third provisioner leads on another broker (two leaders).
//! The expression is read from the page, so the docs cannot drift from what is tested. Without
//! Prometheus the test says so and passes, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::Value;
use test_support::ProcessGuard;

const ALERT: &str = "ProvisionerLeaderCount";

/// Prometheus, or None (the test is skipped) when it is not installed.
fn prometheus() -> Option<PathBuf> {
    test_support::tool_or_skip(
        &["prometheus"],
        "prometheus is not installed (apt-get install prometheus)",
    )
}

/// The alert expression high-availability.md gives: its `text` block on `choria_election_leader`.
fn documented_alert() -> String {
    let page = std::fs::read_to_string(workspace().join("docs/high-availability.md")).unwrap();
    page.split("```text\n")
        .skip(1)
        .filter_map(|b| b.split_once("```").map(|(code, _)| code.trim()))
        .find(|code| code.contains("choria_election_leader"))
        .expect("an alert on choria_election_leader in high-availability.md")
        .to_string()
}

/// A Prometheus scraping `targets` every second and evaluating the alert every second.
fn start_prometheus(
    bin: &PathBuf,
    dir: &std::path::Path,
    targets: &[u16],
    expr: &str,
) -> (ProcessGuard, u16) {
    let rules = dir.join("rules.yml");
    std::fs::write(
        &rules,
        format!(
            "groups:\n  - name: provisioner\n    rules:\n      - alert: {ALERT}\n        expr: '{}'\n",
            expr.replace('\'', "''")
        ),
    )
    .unwrap();
    let list: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: ['{}']\n\
             scrape_configs:\n  - job_name: provisioner\n    static_configs:\n      - targets: [{}]\n",
            rules.display(),
            list.join(", ")
        ),
    )
    .unwrap();
    let port = test_support::free_port();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let guard = ProcessGuard::spawn(
        "prometheus",
        Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log),
    )
    .unwrap();
    (guard, port)
}

/// The alert's state in Prometheus (`firing`, `pending`) or `None` when it is not active.
fn alert_state(port: u16) -> Option<String> {
    let (_, body) = test_support::metrics::http_get(port, "/api/v1/alerts")?;
    let v: Value = serde_json::from_str(&body).ok()?;
    v["data"]["alerts"]
        .as_array()?
        .iter()
        .find(|a| a["labels"]["alertname"] == ALERT)
        .and_then(|a| a["state"].as_str().map(str::to_string))
}

/// `sum(choria_election_leader{election="provisioner"})` as Prometheus has it.
fn leaders(port: u16) -> Option<f64> {
    let q = "/api/v1/query?query=sum(choria_election_leader%7Belection%3D%22provisioner%22%7D)";
    let (_, body) = test_support::metrics::http_get(port, q)?;
    let v: Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

async fn wait_for(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    assert!(wait_until(timeout, f).await, "timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_alert_fires_for_no_leader_and_for_two() {
    let Some(bin) = prometheus() else {
        return;
    };
    let expr = documented_alert();
    let env = Env::new();
    let other = Env::new();
    let pair = |env: &Env, name: &str| {
        env.ha_provisioner(name, example_helper("helper-plain.py"))
            .yaml("leader_election_wait: true")
    };
    let a = pair(&env, "provisioner-a");
    let b = pair(&env, "provisioner-b");
    let c = pair(&other, "provisioner-c");
    let prom_dir = env.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let (_prometheus, prom) = start_prometheus(
        &bin,
        &prom_dir,
        &[a.monitor_port, b.monitor_port, c.monitor_port],
        &expr,
    );

    // No leader: a pair on a broker without the election bucket.
    let mut pa = env.start(&a);
    let mut pb = env.start(&b);
    pa.wait_ready().await;
    pb.wait_ready().await;
    wait_for(
        "the alert to fire while nobody leads",
        Duration::from_secs(60),
        || alert_state(prom).as_deref() == Some("firing"),
    )
    .await;
    assert_eq!(leaders(prom), Some(0.0));

    // One leader once the bucket exists: the alert clears.
    create_election_bucket(&env.url()).await;
    wait_for(
        "the alert to clear with one leader",
        Duration::from_secs(90),
        || leaders(prom) == Some(1.0) && alert_state(prom).is_none(),
    )
    .await;

    // Two leaders: a third provisioner leads on another broker's bucket.
    create_election_bucket(&other.url()).await;
    let mut pc = other.start_ready(&c).await;
    wait_for(
        "the alert to fire with two leaders",
        Duration::from_secs(60),
        || leaders(prom) == Some(2.0) && alert_state(prom).as_deref() == Some("firing"),
    )
    .await;

    pc.stop_with("TERM").await;
    pb.stop_with("TERM").await;
    pa.stop_with("TERM").await;
}
