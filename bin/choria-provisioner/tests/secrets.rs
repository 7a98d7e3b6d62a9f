//! Files holding secrets that someone other than the service can read: `check` lists them as
//! warnings and the daemon logs them at start, without ever printing the secret itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use common::*;

const TOKEN_VALUE: &str = "tok-4f1e9a-secret";
const BROKER_PASSWORD: &str = "bpw-0c7d2b-secret";
const NATS_PASSWORD: &str = "nats-93ab51-secret";

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p.display().to_string()
}

fn chmod(path: &str, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A usable plain-mode YAML with `secrets` (YAML lines) added, and a Choria configuration with
/// `cfg_extra` added.
fn setup(dir: &Path, secrets: &str, cfg_extra: &str) -> (String, String) {
    let signer = Signer::new(dir);
    let yaml = write(
        dir,
        "provisioner.yaml",
        &format!(
            "helper: {}\nchoria_insecure: true\nsite: lab\njwt_verify_cert: {}\n{secrets}\
             features:\n  jwt: true\n",
            example_helper("helper-plain.py"),
            signer.public_hex
        ),
        0o600,
    );
    let cfg = write(
        dir,
        "choria.cfg",
        &format!(
            "identity = prov1.example.net\nplugin.choria.middleware_hosts = nats://broker.example.net:4222\n{cfg_extra}"
        ),
        0o600,
    );
    (yaml, cfg)
}

/// `check`'s output; the run must succeed (warnings never fail it) and no secret may appear.
fn check(yaml: &str, cfg: &str) -> String {
    let out = check_files(yaml, cfg).succeeded("check").text();
    for secret in [TOKEN_VALUE, BROKER_PASSWORD, NATS_PASSWORD] {
        assert!(!out.contains(secret), "{secret} printed by check:\n{out}");
    }
    out
}

fn warnings_naming<'a>(out: &'a str, file: &str) -> Vec<&'a str> {
    out.lines()
        .filter(|l| l.starts_with("warning:") && l.contains(file))
        .collect()
}

#[test]
fn check_warns_about_a_provisioner_yaml_holding_the_token_that_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = setup(dir.path(), &format!("token: {TOKEN_VALUE}\n"), "");

    chmod(&yaml, 0o644);
    let out = check(&yaml, &cfg);
    let w = warnings_naming(&out, &yaml);
    assert_eq!(w.len(), 1, "{out}");
    assert!(
        w[0].contains("holds token") && w[0].contains("every local user") && w[0].contains("644"),
        "{}",
        w[0]
    );

    // The owner alone, or the owner and the group the service runs as (here: the group this
    // test runs as, which owns the file), is how it should be.
    for mode in [0o600, 0o640, 0o400] {
        chmod(&yaml, mode);
        let out = check(&yaml, &cfg);
        assert!(
            warnings_naming(&out, &yaml).is_empty(),
            "mode {mode:o}:\n{out}"
        );
    }
}

#[test]
fn check_warns_about_the_broker_password_in_the_yaml_and_not_about_a_yaml_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = setup(
        dir.path(),
        &format!("broker_provisioning_password: {BROKER_PASSWORD}\n"),
        "",
    );
    chmod(&yaml, 0o604);
    let out = check(&yaml, &cfg);
    let w = warnings_naming(&out, &yaml);
    assert_eq!(w.len(), 1, "{out}");
    assert!(
        w[0].contains("holds broker_provisioning_password"),
        "{}",
        w[0]
    );
    assert!(!w[0].contains("holds token"), "{}", w[0]);

    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = setup(dir.path(), "", "");
    chmod(&yaml, 0o644);
    let out = check(&yaml, &cfg);
    assert!(warnings_naming(&out, &yaml).is_empty(), "{out}");
}

#[test]
fn check_warns_about_a_choria_cfg_holding_the_nats_password_that_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = setup(
        dir.path(),
        "",
        &format!("plugin.nats.user = prov\nplugin.nats.pass = {NATS_PASSWORD}\n"),
    );
    chmod(&cfg, 0o644);
    let out = check(&yaml, &cfg);
    let w = warnings_naming(&out, &cfg);
    assert_eq!(w.len(), 1, "{out}");
    assert!(
        w[0].contains("the Choria configuration") && w[0].contains("holds plugin.nats.pass"),
        "{}",
        w[0]
    );
    chmod(&cfg, 0o640);
    assert!(warnings_naming(&check(&yaml, &cfg), &cfg).is_empty());

    // Without a password in it, the client configuration is no secret.
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = setup(dir.path(), "", "plugin.nats.user = prov\n");
    chmod(&cfg, 0o644);
    assert!(warnings_naming(&check(&yaml, &cfg), &cfg).is_empty());
}

/// A gid no group has, so neither this process's nor the service's.
fn foreign_gid() -> u32 {
    let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
    (47000..48000)
        .find(|g| {
            !groups
                .lines()
                .any(|l| l.split(':').nth(2) == Some(&g.to_string()))
        })
        .unwrap()
}

#[test]
fn check_warns_about_a_yaml_readable_by_a_group_other_than_the_services() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml, cfg) = setup(dir.path(), &format!("token: {TOKEN_VALUE}\n"), "");
    chmod(&yaml, 0o640);
    assert!(warnings_naming(&check(&yaml, &cfg), &yaml).is_empty());
    let gid = foreign_gid();
    match std::os::unix::fs::chown(&yaml, None, Some(gid)) {
        Ok(()) => {
            let out = check(&yaml, &cfg);
            let w = warnings_naming(&out, &yaml);
            assert_eq!(w.len(), 1, "{out}");
            assert!(
                w[0].contains(&format!("group {gid} (not the service's group)")),
                "{}",
                w[0]
            );
        }
        // Only root may give a file to a group it is not in.
        Err(e) => eprintln!("not run as root ({e}): the foreign-group case is not checked"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_logs_the_same_warnings_at_start() {
    let env = Env::new();
    let opts = env.plain();
    let launch = env.prepare(&opts);
    let (yaml, cfg) = (&launch.config, &launch.choria_config);
    let cfg_text = std::fs::read_to_string(cfg).unwrap();
    std::fs::write(
        cfg,
        format!("{cfg_text}plugin.nats.pass = {NATS_PASSWORD}\n"),
    )
    .unwrap();
    chmod(&yaml.display().to_string(), 0o644);
    chmod(&cfg.display().to_string(), 0o644);
    let mut prov = Prov::launch(&launch);
    prov.expect_log("starting using configuration file", Duration::from_secs(20))
        .await;
    let yaml_warning = format!(
        "the provisioner configuration {} holds token and is readable by every local user",
        yaml.display()
    );
    let cfg_warning = format!(
        "the Choria configuration {} holds plugin.nats.pass and is readable by every local user",
        cfg.display()
    );
    prov.expect_log(&yaml_warning, Duration::from_secs(10))
        .await;
    prov.expect_output(&cfg_warning);
    let out = prov.output();
    assert!(!out.contains(TOKEN), "{out}");
    assert!(!out.contains(NATS_PASSWORD), "{out}");
    prov.stop_with("TERM").await;
}
