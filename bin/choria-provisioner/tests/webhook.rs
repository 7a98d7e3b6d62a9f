//! The webhook helper end to end: the built provisioner asks the documented Python webhook
//! (`docs/examples/webhook-plain.py`, a real HTTP server) for a simulated fleet's configuration,
//! signed with a shared secret both ways (its replies required to be signed); `check` validates
//! the URL and the secret file's permissions and `check --probe` reaches the webhook.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use choria_fleet_sim::Mode;
use common::*;
use test_support::ProcessGuard;

const SECRET: &str = "e2e-webhook-secret-0123456789";

/// How long a fleet gets to be provisioned.
const WAIT: Duration = Duration::from_secs(60);

/// The secret file, owner-only.
fn secret_file(dir: &Path) -> PathBuf {
    let p = dir.join("helper.secret");
    std::fs::write(&p, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// The documented webhook example listening on `port`, checking `secret`.
fn python_webhook(port: u16, secret: &Path, brokers: &str) -> ProcessGuard {
    let guard = ProcessGuard::spawn(
        "webhook-plain.py",
        Command::new(example_helper("webhook-plain.py"))
            .env("HELPER_LISTEN", format!("127.0.0.1:{port}"))
            .env("HELPER_SECRET_FILE", secret)
            .env("CHORIA_BROKERS", brokers)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )
    .unwrap()
    .drop_grace(Duration::ZERO);
    test_support::ports::wait_port(port, Duration::from_secs(20)).unwrap();
    guard
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_provisions_the_fleet() {
    let env = Env::new();
    let port = test_support::free_port();
    let secret = secret_file(env.path());
    let _webhook = python_webhook(port, &secret, &env.url());
    let fleet = env.fleet(env.fleet_config(12, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("http://127.0.0.1:{port}/provision"))
        .yaml(&format!(
            "helper_secret_file: {}\nhelper_reply_signature: required",
            secret.display()
        ));
    let mut prov = env.start_ready(&opts).await;
    expect_provisioned(&fleet, 12, WAIT, &prov).await;
    prov.assert_provisioned(12.0).await;
    for r in fleet.report() {
        let rec = r.received.as_ref().unwrap();
        assert_eq!(rec.configuration["identity"], r.identity.as_str());
        assert_eq!(
            rec.configuration["plugin.choria.middleware_hosts"],
            env.url()
        );
    }
    assert_eq!(prov.m("helper_errors"), 0.0);
    prov.stop_with("TERM").await;
    let out = prov.output();
    assert!(!out.contains(SECRET), "the webhook secret was logged");
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_refusing_the_signature_is_a_helper_error_and_nothing_is_configured() {
    let env = Env::new();
    let port = test_support::free_port();
    let secret = secret_file(env.path());
    let _webhook = python_webhook(port, &secret, &env.url());
    let wrong = env.path().join("wrong.secret");
    std::fs::write(&wrong, "not-the-secret").unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let fleet = env.fleet(env.fleet_config(3, Mode::Plain)).await;
    let opts = env
        .provisioner(format!("http://127.0.0.1:{port}/provision"))
        .yaml(&format!("helper_secret_file: {}", wrong.display()));
    let mut prov = env.start_ready(&opts).await;
    prov.expect_metric("helper_errors", 3.0, WAIT).await;
    prov.expect_log("answered HTTP 401: bad signature", Duration::from_secs(5))
        .await;
    assert_eq!(prov.m("provisioned"), 0.0);
    assert_eq!(prov.rpc_count("choria_provision#configure"), 0.0);
    finish(&mut prov, fleet).await;
}

fn check(yaml: &Path, cfg: &Path, probe: bool) -> (bool, String) {
    let args: &[&str] = if probe {
        &["check", "--probe"]
    } else {
        &["check"]
    };
    let ran = cli_on(args, yaml, cfg);
    (ran.ok, ran.text())
}

#[test]
fn check_validates_the_secret_file_and_probes_the_webhook() {
    let env = Env::new();
    let port = test_support::free_port();
    let secret = secret_file(env.path());
    let url = format!("http://127.0.0.1:{port}/provision");
    let opts = env
        .provisioner(url.clone())
        .yaml(&format!("helper_secret_file: {}", secret.display()));
    let Launch {
        config: yaml,
        choria_config: cfg,
        ..
    } = env.prepare(&opts);

    // Owner-only: usable; nothing is reached without --probe.
    let (ok, out) = check(&yaml, &cfg, false);
    assert!(ok, "{out}");
    assert!(out.contains(&format!("helper: {url}")), "{out}");

    // Readable by the group: refused, naming the file and the mode.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o640)).unwrap();
    let (ok, out) = check(&yaml, &cfg, false);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!(
            "problem: helper_secret_file {} can be read or written by group or others (mode 640)",
            secret.display()
        )),
        "{out}"
    );
    assert!(!out.contains(SECRET), "{out}");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    // --probe with nothing listening: the refused connection is a problem.
    let (ok, out) = check(&yaml, &cfg, true);
    assert!(!ok, "{out}");
    assert!(
        out.contains("problem: probe: cannot connect to webhook"),
        "{out}"
    );

    // --probe with the webhook up: the signed GET is answered.
    let _webhook = python_webhook(port, &secret, &env.url());
    let (ok, out) = check(&yaml, &cfg, true);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("probe: {url} answered HTTP 200 over HTTP/1.1")),
        "{out}"
    );
    assert!(out.contains("its answer signed with the secret"), "{out}");

    // A wrong secret is a warning from the probe (the webhook answers 401).
    std::fs::write(&secret, "another-secret").unwrap();
    let (ok, out) = check(&yaml, &cfg, true);
    assert!(ok, "{out}");
    assert!(
        out.contains("warning: the webhook refused the signed probe with HTTP 401"),
        "{out}"
    );

    // A URL the client cannot use, and TLS files over plain http.
    let bad = env
        .provisioner("https://user:pw@127.0.0.1/x".to_string())
        .yaml("helper_tls_cert: /nonexistent/cert.pem");
    let Launch {
        config: yaml,
        choria_config: cfg,
        ..
    } = env.prepare(&bad);
    let (ok, out) = check(&yaml, &cfg, false);
    assert!(!ok, "{out}");
    assert!(out.contains("carries credentials"), "{out}");
    assert!(!out.contains("pw@"), "{out}");
    let plain = env.provisioner(url.clone()).yaml(&format!(
        "helper_secret_file: {}\nhelper_tls_ca: /etc/ssl/x.pem",
        secret.display()
    ));
    let Launch {
        config: yaml,
        choria_config: cfg,
        ..
    } = env.prepare(&plain);
    let (_, out) = check(&yaml, &cfg, false);
    assert!(
        out.contains("warning: helper_tls_ca has no effect: the helper URL is plain http"),
        "{out}"
    );
}
