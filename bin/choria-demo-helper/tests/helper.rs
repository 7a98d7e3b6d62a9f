//! Runs the built helper as the provisioner does: JSON on stdin, reply on stdout.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn run(input: &Value, envs: &[(&str, &str)]) -> Value {
    let mut child = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
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
fn pki_reply_carries_a_certificate_signed_by_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
        .args(["init-ca", d])
        .output()
        .unwrap();
    assert!(st.status.success());
    let ok = Command::new("openssl")
        .args([
            "req",
            "-new",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=n2.example.net",
        ])
        .args([
            "-keyout",
            &format!("{d}/k.pem"),
            "-out",
            &format!("{d}/req.pem"),
        ])
        .output()
        .unwrap();
    assert!(ok.status.success());
    let csr = std::fs::read_to_string(format!("{d}/req.pem")).unwrap();
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
    let verify = Command::new("openssl")
        .args(["verify", "-CAfile", &ca, &format!("{d}/cert.pem")])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
}
