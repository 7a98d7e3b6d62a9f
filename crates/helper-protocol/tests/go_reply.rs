//! Real helper processes answering the way helpers written for the Go provisioner may: keys in
//! any case, decoded as Go's `encoding/json` decodes them.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::input;
use helper_protocol::{HelperErrorKind, HelperRunner};

/// Writes a helper script into `dir` that keeps its input in `input.json` and prints `reply`,
/// and returns its command line (run by `sh`: executing a file just written can fail with
/// "text file busy" while another test thread forks).
fn helper(dir: &Path, reply: &str) -> String {
    let path = dir.join("helper.sh");
    let script = format!(
        "#!/bin/sh\ncat > '{}'\ncat <<'REPLY'\n{reply}\nREPLY\n",
        dir.join("input.json").display()
    );
    std::fs::write(&path, script).unwrap();
    format!("sh {}", path.display())
}

#[tokio::test]
async fn a_reply_with_go_style_keys_configures_as_in_go() {
    let dir = tempfile::tempdir().unwrap();
    let script = helper(
        dir.path(),
        r#"{"Defer": false, "MSG": "configured", "Configuration": {"identity": "n1.example.net", "plugin.choria.srv_domain": "example.net"}, "Server_Claims": {"OU": "choria", "Collectives": ["c1", "c2"], "Permissions": {"Streams": true}}, "Upgrade": "0.30.0", "SSLDir": "/etc/ssl"}"#,
    );
    let runner = HelperRunner::new(&script).unwrap();
    let reply = runner.run(&input()).await.unwrap();
    assert!(!reply.defer);
    assert_eq!(reply.msg, "configured");
    let conf = reply.configuration.unwrap();
    assert_eq!(conf["identity"], "n1.example.net");
    assert_eq!(conf["plugin.choria.srv_domain"], "example.net");
    let claims = reply.server_claims.unwrap();
    assert_eq!(claims.organization_unit, "choria");
    assert_eq!(claims.collectives, vec!["c1".to_string(), "c2".to_string()]);
    assert!(claims.permissions.unwrap().streams);
    assert_eq!(reply.upgrade, "0.30.0");
    assert_eq!(reply.ssldir, "/etc/ssl");
    // The helper was given the node's document.
    let given = std::fs::read_to_string(dir.path().join("input.json")).unwrap();
    assert!(given.contains(r#""identity":"n1.example.net""#), "{given}");
}

#[tokio::test]
async fn a_deferring_helper_in_capitals_defers() {
    let dir = tempfile::tempdir().unwrap();
    let script = helper(dir.path(), r#"{"DEFER": true, "Msg": "not yet"}"#);
    let reply = common::run(&script).await.unwrap();
    assert!(reply.defer);
    assert_eq!(reply.msg, "not yet");
    assert!(reply.configuration.is_none());
}

#[tokio::test]
async fn a_value_of_the_wrong_type_names_the_helper_and_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let script = helper(
        dir.path(),
        r#"{"Defer": "yes", "Key": "-----BEGIN PRIVATE KEY-----"}"#,
    );
    let err = common::run(&script).await.unwrap_err();
    assert_eq!(err.kind(), HelperErrorKind::InvalidJson, "{err}");
    let text = err.to_string();
    assert!(text.starts_with("cannot decode output from sh: "), "{text}");
    assert!(
        text.contains("defer: expected a boolean, found a string"),
        "{text}"
    );
    assert!(!text.contains("PRIVATE"), "{text}");
}
