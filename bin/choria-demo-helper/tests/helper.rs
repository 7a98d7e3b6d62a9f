//! Runs the built helper as the provisioner does: JSON on stdin, reply on stdout.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use test_support::ca::KeyFormat;

fn run(input: &Value, envs: &[(&str, &str)]) -> Value {
    let out = test_support::process::run_with_input(
        Command::new(env!("CARGO_BIN_EXE_choria-demo-helper")).envs(envs.iter().copied()),
        input.to_string().as_bytes(),
    )
    .unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn plain_reply_configures_the_identity_and_leaves_provisioning() {
    let input = json!({"identity": "n1.example.net", "csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
    let reply = run(&input, &[("CHORIA_BROKERS", "nats://b1:4222")]);
    assert_eq!(reply["configuration"]["identity"], "n1.example.net");
    assert_eq!(
        reply["configuration"]["plugin.choria.server.provision"],
        "false"
    );
    assert_eq!(
        reply["configuration"]["plugin.choria.middleware_hosts"],
        "nats://b1:4222"
    );
    assert!(reply.get("certificate").is_none());
}

#[test]
fn defer_and_upgrade_switches() {
    let input = json!({"identity": "slow-1", "csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
    assert_eq!(run(&input, &[("CHORIA_DEFER", "slow")])["defer"], true);
    assert_eq!(
        run(&input, &[("CHORIA_UPGRADE_TO", "0.31.0")])["upgrade"],
        "0.31.0"
    );
}

#[test]
fn delay_and_record_switches() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("runs.txt");
    let record = record.to_str().unwrap();
    for id in ["a-1.example.net", "b-2.example.net"] {
        let input = json!({"identity": id, "csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
        let started = std::time::Instant::now();
        let reply = run(
            &input,
            &[
                ("CHORIA_HELPER_DELAY_MS", "300"),
                ("CHORIA_HELPER_RECORD", record),
            ],
        );
        assert!(started.elapsed() >= std::time::Duration::from_millis(300));
        assert_eq!(reply["configuration"]["identity"], id);
    }
    assert_eq!(
        std::fs::read_to_string(record).unwrap(),
        "a-1.example.net\nb-2.example.net\n"
    );
}

#[test]
fn pki_reply_carries_a_certificate_signed_by_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
        .args(["init-ca", d])
        .output()
        .unwrap();
    assert!(st.status.success());
    let csr = request(dir.path(), "/CN=n2.example.net", &[]);
    let input = json!({"identity": "n2.example.net", "csr": {"csr": csr, "public_key": "", "ssldir": "/srv/ssl"},
        "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
    let ca = format!("{d}/ca.pem");
    let key = format!("{d}/ca-key.pem");
    let reply = run(&input, &[("CHORIA_CA_CERT", &ca), ("CHORIA_CA_KEY", &key)]);
    std::fs::write(
        format!("{d}/cert.pem"),
        reply["certificate"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(reply["ssldir"], "/srv/ssl");
    assert_eq!(
        reply["configuration"]["plugin.security.file.ca"],
        "/srv/ssl/ca.pem"
    );
    test_support::stack::run(Command::new("openssl").args([
        "verify",
        "-CAfile",
        &ca,
        &format!("{d}/cert.pem"),
    ]))
    .unwrap();
}

/// The hostile identities every shipped helper must refuse.
fn hostile_identities() -> Vec<String> {
    vec![
        "evil.example.net,DNS:admin.privileged.mcollective,DNS:x".into(),
        "*.example.net".into(),
        ">".into(),
        "node1.example.net\nforged log line".into(),
        "node1.example.net\n".into(),
        "a".repeat(5000),
        "admin.privileged.mcollective".into(),
    ]
}

/// A CSR for `subject` (as openssl writes it) made in `dir` by the test CA's recipe, asking for
/// `sans` as its subjectAltName extension when there are any; its PEM.
fn request(dir: &Path, subject: &str, sans: &[&str]) -> String {
    let req = test_support::ca::csr(dir, "req", subject, sans, KeyFormat::Pkcs8).unwrap();
    std::fs::read_to_string(req.csr).unwrap()
}

/// A test CA made by the helper itself, and a CSR for `subject` asking for `sans`.
fn ca_and_csr(d: &str, subject: &str, sans: &[&str]) -> String {
    let st = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
        .args(["init-ca", &format!("{d}/ca")])
        .output()
        .unwrap();
    assert!(st.status.success());
    request(Path::new(d), subject, sans)
}

fn snapshot(dir: &Path) -> BTreeMap<String, (u64, std::time::SystemTime)> {
    test_support::ca::files_snapshot(dir).unwrap()
}

fn sans(d: &str, cert: &str) -> Vec<String> {
    test_support::ca::cert_sans(Path::new(d), cert).unwrap()
}

fn assert_refused(reply: &Value, what: &str, why: &str) {
    assert_eq!(reply["defer"], true, "{what}: {reply}");
    assert!(
        reply["msg"].as_str().unwrap().contains(why),
        "{what}: {}",
        reply["msg"]
    );
    for field in ["certificate", "configuration", "server_claims", "ca"] {
        assert!(reply.get(field).is_none(), "{what}: {field} in {reply}");
    }
}

#[test]
fn hostile_identities_are_deferred_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let csr = ca_and_csr(d, "/CN=node1.example.net", &[]);
    let ca_dir = dir.path().join("ca");
    let before = snapshot(&ca_dir);
    let ca = format!("{d}/ca/ca.pem");
    let key = format!("{d}/ca/ca-key.pem");
    let envs = [("CHORIA_CA_CERT", ca.as_str()), ("CHORIA_CA_KEY", &key)];
    for identity in hostile_identities() {
        let plain = json!({"identity": identity, "csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
        let pki = json!({"identity": identity, "csr": {"csr": csr, "public_key": "", "ssldir": "/etc/choria/ssl"},
            "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
        let ed = json!({"identity": identity, "csr": null, "inventory": "{}", "jwt": null,
            "ed25519_pubkey": {"public_key": "ab".repeat(32), "directory": "/etc/choria", "signature": ""}});
        for (mode, input) in [("plain", plain), ("pki", pki), ("ed25519", ed)] {
            let reply = run(&input, &envs);
            assert_refused(
                &reply,
                &format!("{mode} {identity:?}"),
                "refused: the identity",
            );
        }
    }
    for not_a_string in [json!(null), json!(42), json!(["node1.example.net"])] {
        let input = json!({"identity": not_a_string, "csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
        assert_refused(&run(&input, &[]), "identity {not_a_string}", "not a string");
    }
    let input = json!({"csr": null, "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
    assert_refused(&run(&input, &[]), "no identity", "no identity");
    assert_eq!(
        snapshot(&ca_dir),
        before,
        "something was written under the CA directory"
    );
}

#[test]
fn pki_certificate_names_the_identity_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // The CSR asks for a privileged name besides its own: it is not copied.
    let csr = ca_and_csr(
        d,
        "/CN=n3.example.net/O=Example",
        &["admin.privileged.mcollective", "n3.example.net", "10.0.0.1"],
    );
    let ca = format!("{d}/ca/ca.pem");
    let key = format!("{d}/ca/ca-key.pem");
    let envs = [("CHORIA_CA_CERT", ca.as_str()), ("CHORIA_CA_KEY", &key)];
    let input = json!({"identity": "n3.example.net", "csr": {"csr": csr, "public_key": "", "ssldir": "/srv/ssl"},
        "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
    let reply = run(&input, &envs);
    let cert = reply["certificate"].as_str().unwrap();
    assert_eq!(sans(d, cert), ["DNS:n3.example.net"]);

    // A CSR whose common name is not the identity, or that holds two, is not signed.
    for subject in [
        "/CN=other.example.net",
        "/CN=n3.example.net/CN=admin.privileged.mcollective",
        "/O=Example",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();
        let csr = ca_and_csr(d, subject, &[]);
        let ca = format!("{d}/ca/ca.pem");
        let key = format!("{d}/ca/ca-key.pem");
        let envs = [("CHORIA_CA_CERT", ca.as_str()), ("CHORIA_CA_KEY", &key)];
        let input = json!({"identity": "n3.example.net", "csr": {"csr": csr, "public_key": "", "ssldir": "/srv/ssl"},
            "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
        assert_refused(&run(&input, &envs), subject, "common name");
    }
}

#[test]
fn hostile_directories_are_deferred() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let csr = ca_and_csr(d, "/CN=n4.example.net", &[]);
    let ca = format!("{d}/ca/ca.pem");
    let key = format!("{d}/ca/ca-key.pem");
    let envs = [("CHORIA_CA_CERT", ca.as_str()), ("CHORIA_CA_KEY", &key)];
    for bad in [
        json!("/etc/choria/ssl\nplugin.security.provider = none"),
        json!("relative/ssl"),
        json!("/etc/choria/../../root"),
        json!(["/etc/choria/ssl"]),
    ] {
        let pki = json!({"identity": "n4.example.net", "csr": {"csr": csr, "public_key": "", "ssldir": bad},
            "ed25519_pubkey": null, "inventory": "{}", "jwt": null});
        assert_refused(&run(&pki, &envs), &format!("ssldir {bad}"), "SSL directory");
        let ed = json!({"identity": "n4.example.net", "csr": null, "inventory": "{}", "jwt": null,
            "ed25519_pubkey": {"public_key": "ab".repeat(32), "directory": bad, "signature": ""}});
        assert_refused(&run(&ed, &[]), &format!("directory {bad}"), "key directory");
    }
}
