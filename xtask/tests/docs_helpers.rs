//! The helper examples of the documentation run and answer what the helper contract allows:
//! every fenced block of `docs/helper.md` and `docs/upgrades.md` that starts with `#!` is run
//! with the documented input (decoded first as the provisioner's own `HelperInput`), and its
//! output must decode as the provisioner's `HelperReply` with a configuration that leaves
//! provisioning mode. Examples whose interpreter (jq, ruby) is missing are reported and skipped;
//! the Python ones always run.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use provision_core::helper_protocol::{HelperInput, HelperReply};

/// A directory removed when the test ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let d = std::env::temp_dir().join(format!("docs-helpers-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Fenced blocks of a Markdown text as (language, body).
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        let t = line.trim_start();
        match current.take() {
            Some((lang, body)) if t.starts_with("```") => out.push((lang, body)),
            Some((lang, body)) => current = Some((lang, body + line + "\n")),
            None if t.starts_with("```") => current = Some((t[3..].to_string(), String::new())),
            None => {}
        }
    }
    out
}

fn has(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(script: &Path, input: &str) -> (bool, String, String) {
    let mut child = Command::new(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A CA and a CSR for the identity, made with openssl, for the x509 example.
fn pki_material(dir: &Path, identity: &str) -> Option<String> {
    if !has("openssl") {
        return None;
    }
    let ssl = |args: &[&str]| {
        let o = Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "openssl {args:?} failed");
    };
    ssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=ca",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca.pem",
    ]);
    let cn = format!("/CN={identity}");
    ssl(&[
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", &cn, "-keyout", "key.pem", "-out",
        "req.pem",
    ]);
    Some(std::fs::read_to_string(dir.join("req.pem")).unwrap())
}

#[test]
fn the_documented_helpers_answer_within_the_contract() {
    let dir = TempDir::new();
    let helper_md = std::fs::read_to_string(root().join("docs/helper.md")).unwrap();
    let upgrades_md = std::fs::read_to_string(root().join("docs/upgrades.md")).unwrap();

    // The documented input is what the provisioner sends.
    let (_, input_text) = blocks(&helper_md)
        .into_iter()
        .find(|(lang, body)| lang == "json" && body.contains("\"inventory\""))
        .expect("helper.md documents an input");
    let input: HelperInput = serde_json::from_str(&input_text).unwrap();
    assert_eq!(input.identity, "node1.example.net");
    let inventory: serde_json::Value = serde_json::from_str(&input.inventory).unwrap();
    assert!(inventory.get("facts").is_some());

    let csr = pki_material(dir.path(), &input.identity);
    let mut ran_python = 0;
    let mut n = 0;
    for (lang, body) in blocks(&helper_md).into_iter().chain(blocks(&upgrades_md)) {
        if !body.starts_with("#!") {
            continue;
        }
        n += 1;
        let needs = match lang.as_str() {
            "sh" => "jq",
            "python" => "python3",
            "ruby" => "ruby",
            other => panic!("helper example in an unexpected language {other}"),
        };
        if !has(needs) {
            println!("skipped the {lang} example {n}: {needs} is not installed");
            continue;
        }
        // The x509 example reads its CA from /etc/choria-provisioner/ca/: use the test's own.
        let body = body.replace(
            "/etc/choria-provisioner/ca/",
            &format!("{}/", dir.path().display()),
        );
        let mut node = input.clone();
        if body.contains("node[\"csr\"]") && !body.contains("\"ed25519_pubkey\"") {
            let Some(csr) = &csr else {
                println!("skipped the x509 example: openssl is not installed");
                continue;
            };
            node.csr = Some(
                serde_json::from_value(serde_json::json!({
                    "csr": csr, "public_key": "", "ssldir": "/etc/choria/ssl"
                }))
                .unwrap(),
            );
        }
        if body.contains("ed25519_pubkey") {
            node.ed25519_pubkey = Some(serde_json::from_value(serde_json::json!({
                "public_key": "ab".repeat(32), "directory": "/etc/choria", "signature": "cd".repeat(64)
            })).unwrap());
        }
        let script = dir.path().join(format!("helper-{n}"));
        std::fs::write(&script, &body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (ok, stdout, stderr) = run(&script, &serde_json::to_string(&node).unwrap());
        assert!(ok, "{lang} example {n} failed: {stderr}");
        let reply: HelperReply = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{lang} example {n} answered {stdout:?}: {e}"));
        assert!(
            !reply.defer && !reply.shutdown,
            "{lang} example {n} deferred: {}",
            reply.msg
        );
        let config = reply.configuration.expect("a configuration");
        assert_eq!(config.get("identity"), Some(&input.identity));
        assert_eq!(
            config
                .get("plugin.choria.server.provision")
                .map(String::as_str),
            Some("false"),
            "{lang} example {n} would provision the server again after its restart"
        );
        if node.csr.is_some() {
            assert!(reply.certificate.contains("BEGIN CERTIFICATE"));
            assert!(reply.ca.contains("BEGIN CERTIFICATE"));
        }
        if node.ed25519_pubkey.is_some() {
            let claims = reply.server_claims.expect("server claims");
            let exp = claims.standard.expires_at.expect("an expiry");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            assert!(
                exp > now + 3600,
                "exp {exp} must be an absolute time in the future"
            );
        }
        if lang == "python" {
            ran_python += 1;
        }
    }
    assert!(n >= 5, "only {n} helper examples found");
    assert!(ran_python >= 2, "the Python examples must run");
}
