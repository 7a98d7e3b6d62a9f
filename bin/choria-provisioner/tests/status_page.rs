//! The status page in a real browser: headless Chromium (Debian's `chromium`) loads `/` during
//! an end-to-end run, and the rendered page and a screenshot are checked. Without Chromium the
//! test says so and passes, except under CI (`CI` set), where a missing browser fails it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use choria_fleet_sim::{Mode, ProvisioningJwt};
use common::*;

/// Headless Chromium, or None (the test is skipped) when it is not installed.
fn chromium() -> Option<PathBuf> {
    test_support::tool_or_skip(
        &["chromium", "chromium-browser", "google-chrome"],
        "chromium is not installed (apt-get install chromium)",
    )
}

/// Runs headless Chromium on `url` with `args`; insists it succeeds.
fn browse(browser: &PathBuf, profile: &std::path::Path, args: &[String], url: &str) -> Ran {
    Ran::of(
        Command::new(browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .arg(url),
    )
    .succeeded("chromium")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_the_status_page_with_counters_and_failures() {
    let Some(browser) = chromium() else {
        return;
    };
    let env = Env::new();
    let fleet = env.fleet(env.fleet_config(6, Mode::Plain)).await;
    let stranger_dir = env.path().join("stranger");
    std::fs::create_dir_all(&stranger_dir).unwrap();
    let stranger = Signer::new(&stranger_dir);
    let mut bad = env.fleet_config(2, Mode::Plain);
    bad.identities = Some(vec![
        "rogue-1.example.net".into(),
        "rogue-2.example.net".into(),
    ]);
    bad.provisioning_jwt = ProvisioningJwt::Sign(stranger.jwt_signer());
    let bad = env.fleet(bad).await;
    let mut prov = env.start_ready(&env.plain()).await;
    assert!(fleet.wait_provisioned(6, Duration::from_secs(60)).await);
    prov.expect_metric("provision_errors", 2.0, Duration::from_secs(60))
        .await;
    prov.assert_provisioned(6.0).await;

    let url = format!("http://127.0.0.1:{}/", prov.port);
    let profile = env.path().join("chromium-profile");
    let dom = browse(&browser, &profile, &["--dump-dom".into()], &url).stdout;
    test_support::assert_contains_all(
        &dom,
        &[
            "Choria Provisioner",
            "role <b>active</b>",
            "Provisioned<b>6</b>",
            "Provision errors<b>2</b>",
            "Recent failures",
            "rogue-1.example.net",
            "rogue-2.example.net",
            "jwt_check",
            "could not validate JWT",
            "<svg",
        ],
    );
    // Each failure links to its node's page, which renders its history.
    let node = browse(
        &browser,
        &profile,
        &["--dump-dom".into()],
        &format!("{url}nodes/rogue-1.example.net"),
    )
    .stdout;
    assert!(
        node.contains("refused") && node.contains("History"),
        "{node}"
    );

    // The screenshot the docs show: a PNG of the window's size.
    let shot = workspace().join("target/status-page.png");
    let _ = std::fs::remove_file(&shot);
    browse(
        &browser,
        &profile,
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1100,900".into(),
        ],
        &url,
    );
    let png = std::fs::read(&shot).expect("no screenshot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
    assert_eq!((width, height), (1100, 900));
    assert!(
        png.len() > 10_000,
        "a blank screenshot ({} bytes)",
        png.len()
    );

    finish(&mut prov, fleet).await;
    bad.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_the_pause_and_the_pending_nodes_without_errors() {
    let Some(browser) = chromium() else {
        return;
    };
    let env = Env::new();
    let p = env.plain().yaml("fleet_control: true\napproval: manual\n");
    let launch = env.prepare(&p);
    let mut prov = Prov::launch(&launch);
    prov.wait_ready().await;
    prov.expect_log("fleet control: following bucket", Duration::from_secs(30))
        .await;
    let fleet = env.fleet(env.fleet_config(3, Mode::Plain)).await;
    prov.expect_output_count(
        "waits for an operator's approval",
        3,
        Duration::from_secs(60),
    )
    .await;
    control(&launch, &["pause", "--reason", "rack <b>7</b> rewiring"]);
    prov.expect_log("Provisioning paused by", Duration::from_secs(5))
        .await;
    let url = format!("http://127.0.0.1:{}/", prov.port);
    let profile = env.path().join("chromium-profile");
    let out = browse(
        &browser,
        &profile,
        &[
            "--enable-logging=stderr".into(),
            "--v=0".into(),
            "--dump-dom".into(),
        ],
        &url,
    );
    let (dom, log) = (out.stdout, out.stderr);
    test_support::assert_contains_all(
        &dom,
        &[
            "Paused by",
            "rack &lt;b&gt;7&lt;/b&gt; rewiring",
            "Deny list: 0 entries",
            "Pending approval (3)",
            "node-1.example.net",
            "choria-provisioner approve ID",
        ],
    );
    for bad in ["Content Security Policy", "Uncaught", "Refused to"] {
        assert!(!log.contains(bad), "{bad:?} in chromium's log:\n{log}");
    }
    finish(&mut prov, fleet).await;
}
