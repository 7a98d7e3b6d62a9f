//! `choria-demo-helper serve`, the helper as a webhook, asked by the provisioner's own webhook
//! client: over TLS with a client certificate required (h2 by ALPN), signatures checked, and the
//! same replies as a stdin run.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use helper_protocol::{HelperErrorKind, HelperInput, WebhookClient, WebhookOptions};

/// The server, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `serve` on a free port with `args`; its URL from the first line it prints.
fn serve(args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("CHORIA_BROKERS", "nats://b1.example.net:4222")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    Server {
        child,
        url: format!("{url}/provision"),
    }
}

fn tls(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../crates/choria-rpc-client/testdata/tls")
        .join(name)
}

fn input() -> HelperInput {
    HelperInput {
        identity: "n1.example.net".into(),
        inventory: "{}".into(),
        ..Default::default()
    }
}

fn secret(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[tokio::test]
async fn mutual_tls_h2_and_signatures() {
    let dir = tempfile::tempdir().unwrap();
    let shared = secret(dir.path(), "shared", "demo-shared-secret\n");
    let server = serve(&[
        "--secret-file",
        shared.to_str().unwrap(),
        "--tls-cert",
        tls("broker.pem").to_str().unwrap(),
        "--tls-key",
        tls("broker_key.pem").to_str().unwrap(),
        "--client-ca",
        tls("ca.pem").to_str().unwrap(),
    ]);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let good = WebhookOptions {
        secret_file: Some(shared.clone()),
        ca: Some(tls("ca.pem")),
        client_cert: Some(tls("provisioner.pem")),
        client_key: Some(tls("provisioner_key.pem")),
        ..WebhookOptions::new(&server.url)
    };
    let client = WebhookClient::new(&good).unwrap();
    let probe = client.probe().await.unwrap();
    assert_eq!(probe.status, 200);
    assert_eq!(probe.version, "HTTP/2.0");
    let reply = client.run(&input()).await.unwrap();
    let config = reply.configuration.unwrap();
    assert_eq!(config["identity"], "n1.example.net");
    assert_eq!(
        config["plugin.choria.middleware_hosts"],
        "nats://b1.example.net:4222"
    );
    assert_eq!(reply.msg, "configured n1.example.net");

    // Many requests at once share the h2 connection; each gets its own node's reply.
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..40 {
        let client = client.clone();
        tasks.spawn(async move {
            let node = HelperInput {
                identity: format!("n{n}.example.net"),
                ..input()
            };
            let reply = client.run(&node).await.unwrap();
            assert_eq!(reply.configuration.unwrap()["identity"], node.identity);
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }

    // A hostile identity is deferred, as on stdin.
    let hostile = HelperInput {
        identity: "evil.example.net,DNS:admin.privileged.mcollective".into(),
        ..input()
    };
    let reply = client.run(&hostile).await.unwrap();
    assert!(
        reply.defer && reply.msg.starts_with("refused: "),
        "{}",
        reply.msg
    );

    // Another secret, or none: 401 with the reason.
    let other = secret(dir.path(), "other", "another-secret");
    for secret_file in [Some(other), None] {
        let c = WebhookClient::new(&WebhookOptions {
            secret_file,
            ..good.clone()
        })
        .unwrap();
        let e = c.run(&input()).await.unwrap_err();
        assert_eq!(e.kind(), HelperErrorKind::Status, "{e}");
        assert!(e.to_string().contains("HTTP 401"), "{e}");
    }

    // No client certificate: the handshake is refused, nothing is answered.
    let e = WebhookClient::new(&WebhookOptions {
        client_cert: None,
        client_key: None,
        ..good.clone()
    })
    .unwrap()
    .run(&input())
    .await
    .unwrap_err();
    assert!(
        matches!(
            e.kind(),
            HelperErrorKind::Connect | HelperErrorKind::Request
        ),
        "{e}"
    );
}

#[tokio::test]
async fn plain_http_without_a_secret_answers_as_a_stdin_run() {
    let server = serve(&[]);
    assert!(
        server.url.starts_with("http://127.0.0.1:"),
        "{}",
        server.url
    );
    let client = WebhookClient::new(&WebhookOptions::new(&server.url)).unwrap();
    let p = client.probe().await.unwrap();
    assert_eq!((p.status, p.version.as_str()), (200, "HTTP/1.1"));
    let reply = client.run(&input()).await.unwrap();
    assert_eq!(reply.configuration.unwrap()["identity"], "n1.example.net");
    // A body that is not JSON is the helper's failure: 500 with the reason.
    let e = client
        .send(bytes::Bytes::from_static(b"{not json"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("HTTP 500: invalid input"), "{e}");
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    for (args, why) in [
        (&["serve"][..], "usage"),
        (&["serve", "--listen", "nowhere"][..], "--listen"),
        (
            &["serve", "--listen", "127.0.0.1:0", "--tls-cert", "x.pem"][..],
            "go together",
        ),
        (
            &[
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--secret-file",
                "/nonexistent",
            ][..],
            "/nonexistent",
        ),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
    }
}
