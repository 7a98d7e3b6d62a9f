//! `choria-demo-helper serve`, the helper as a webhook, asked by the provisioner's own webhook
//! client: over TLS with a client certificate required (h2 by ALPN), signatures checked, and the
//! same replies as a stdin run. Its signed replies are verified by the client, and a reply
//! altered, stripped of its signature or signed by someone without the secret on the way (by a
//! proxy in the middle, written here) is refused; a request sent twice or with an old timestamp
//! is refused by the server; without a secret it listens on loopback alone.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::SystemTime;

use helper_protocol::signature::{self, REPLY_SIGNATURE_HEADER, REQUEST_SIGNATURE_HEADER};
use helper_protocol::webhook::{ReplySignature, REQUEST_ID_HEADER, TIMESTAMP_HEADER};
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

/// Starts `serve --listen LISTEN` with `args`: the child and the first line it prints.
fn start(listen: &str, args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
        .args(["serve", "--listen", listen])
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
    (child, line)
}

/// Starts `serve` on a free port with `args`; its URL from the first line it prints.
fn serve(args: &[&str]) -> Server {
    let (child, line) = start("127.0.0.1:0", args);
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

/// One HTTP/1.1 message as read off the wire: the head (start line and headers) and the body.
struct Message {
    head: String,
    body: Vec<u8>,
}

impl Message {
    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .split("\r\n")
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }

    fn status(&self) -> u16 {
        self.head.split(' ').nth(1).unwrap().parse().unwrap()
    }

    fn write(&self, to: &mut TcpStream) -> std::io::Result<()> {
        to.write_all(self.head.as_bytes())?;
        to.write_all(b"\r\n\r\n")?;
        to.write_all(&self.body)?;
        to.flush()
    }
}

/// Reads one message with a `Content-Length` body (all the demo server and the client send);
/// `None` when the connection ends first.
fn read_message(from: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Message> {
    let mut tmp = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = from.read(&mut tmp).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end + 4);
    let mut m = Message {
        head,
        body: Vec::new(),
    };
    let len: usize = m.header("content-length").map_or(0, |v| v.parse().unwrap());
    while buf.len() < len {
        let n = from.read(&mut tmp).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    m.body = buf.drain(..len).collect();
    Some(m)
}

/// What the proxy in the middle does to each answer.
#[derive(Clone, Copy, Debug)]
enum Meddle {
    /// Changes the node's name in the body (same length), leaving the signature.
    AlterBody,
    /// Removes the reply signature.
    StripSignature,
    /// Changes the body and signs it again, with a secret of its own (it has not the shared one).
    Resign,
}

/// A proxy on a free loopback port passing requests to `upstream` as they are and meddling
/// with every answer; returns the URL a client uses in place of `upstream_url`.
fn meddling_proxy(upstream_url: &str, meddle: Meddle) -> String {
    let rest = upstream_url.strip_prefix("http://").unwrap();
    let (upstream, path) = rest.split_once('/').unwrap();
    let upstream = upstream.to_string();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/{path}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let upstream = upstream.clone();
            std::thread::spawn(move || {
                let mut server = TcpStream::connect(&upstream).unwrap();
                let (mut from_client, mut from_server) = (Vec::new(), Vec::new());
                while let Some(req) = read_message(&mut client, &mut from_client) {
                    req.write(&mut server).unwrap();
                    let Some(mut answer) = read_message(&mut server, &mut from_server) else {
                        return;
                    };
                    let altered = String::from_utf8_lossy(&answer.body)
                        .replace("n1.example.net", "n6.example.net")
                        .into_bytes();
                    let signature_line = answer
                        .head
                        .split("\r\n")
                        .find(|l| {
                            l.to_ascii_lowercase()
                                .starts_with("x-choria-provisioner-reply-signature:")
                        })
                        .map(str::to_string);
                    match meddle {
                        Meddle::AlterBody => answer.body = altered,
                        Meddle::StripSignature => {
                            if let Some(line) = signature_line {
                                answer.head = answer.head.replace(&format!("\r\n{line}"), "");
                            }
                        }
                        Meddle::Resign => {
                            let forged = signature::sign_reply(
                                b"the-proxy-guess",
                                req.header(REQUEST_ID_HEADER).unwrap().as_bytes(),
                                &altered,
                            );
                            if let Some(line) = signature_line {
                                answer.head = answer
                                    .head
                                    .replace(&line, &format!("{REPLY_SIGNATURE_HEADER}: {forged}"));
                            }
                            answer.body = altered;
                        }
                    }
                    if answer.write(&mut client).is_err() {
                        return;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test]
async fn signed_replies_are_verified_and_altered_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shared = secret(dir.path(), "shared", "demo-shared-secret\n");
    let server = serve(&["--secret-file", shared.to_str().unwrap()]);
    let client = |url: &str, mode| {
        WebhookClient::new(&WebhookOptions {
            secret_file: Some(shared.clone()),
            reply_signature: mode,
            ..WebhookOptions::new(url)
        })
        .unwrap()
    };
    use ReplySignature::{Optional, Required};

    // Straight to the server: every answer is signed for its request and verifies.
    let direct = client(&server.url, Required);
    let reply = direct.run(&input()).await.unwrap();
    assert_eq!(reply.configuration.unwrap()["identity"], "n1.example.net");
    let probe = direct.probe().await.unwrap();
    assert_eq!(probe.status, 200);
    assert_eq!(probe.reply_signature, Ok(signature::ReplyCheck::Signed));

    // Altered in the middle, or altered and signed again without the secret: refused whether
    // signatures are required or not, and the altered configuration is never returned.
    for meddle in [Meddle::AlterBody, Meddle::Resign] {
        let url = meddling_proxy(&server.url, meddle);
        for mode in [Optional, Required] {
            let e = client(&url, mode).run(&input()).await.unwrap_err();
            assert_eq!(e.kind(), HelperErrorKind::ReplySignature, "{meddle:?}: {e}");
            assert!(e.to_string().contains("does not match"), "{meddle:?}: {e}");
        }
    }

    // The signature stripped: refused when required; accepted when optional (as from a helper
    // that does not sign), so a site that wants the guarantee sets required.
    let url = meddling_proxy(&server.url, Meddle::StripSignature);
    let e = client(&url, Required).run(&input()).await.unwrap_err();
    assert_eq!(e.kind(), HelperErrorKind::ReplySignature, "{e}");
    assert!(e.to_string().contains("not signed"), "{e}");
    let reply = client(&url, Optional).run(&input()).await.unwrap();
    assert_eq!(reply.configuration.unwrap()["identity"], "n1.example.net");
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// POSTs `body` to `url` with exactly these extra headers, on a connection of its own.
fn raw_post(url: &str, headers: &[(&str, String)], body: &[u8]) -> Message {
    let mut s = test_support::webhook::raw_post(url, headers, body).unwrap();
    read_message(&mut s, &mut Vec::new()).unwrap()
}

/// The headers of a request signed with `secret` at `timestamp` with `id`.
fn signed(secret: &[u8], timestamp: u64, id: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    let ts = timestamp.to_string();
    vec![
        (TIMESTAMP_HEADER, ts.clone()),
        (REQUEST_ID_HEADER, id.to_string()),
        (
            REQUEST_SIGNATURE_HEADER,
            signature::sign_request(secret, ts.as_bytes(), id.as_bytes(), body),
        ),
    ]
}

#[test]
fn replayed_and_stale_requests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shared = secret(dir.path(), "shared", "replay-secret");
    let server = serve(&["--secret-file", shared.to_str().unwrap()]);
    let body = br#"{"identity":"n1.example.net","inventory":"{}"}"#;
    let id = "00112233445566778899aabbccddeeff";

    // A fresh request: answered, and the answer signed for it.
    let first = signed(b"replay-secret", unix_now(), id, body);
    let answer = raw_post(&server.url, &first, body);
    assert_eq!(
        answer.status(),
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let reply_signature = answer.header(REPLY_SIGNATURE_HEADER).unwrap();
    assert_eq!(
        signature::verify_reply(
            b"replay-secret",
            id.as_bytes(),
            &answer.body,
            reply_signature.as_bytes()
        ),
        Ok(())
    );

    // The very same request again, byte for byte: refused as a replay.
    let again = raw_post(&server.url, &first, body);
    assert_eq!(again.status(), 401);
    assert!(String::from_utf8_lossy(&again.body).contains("replayed"));
    assert!(again.header(REPLY_SIGNATURE_HEADER).is_none());

    // Signed correctly but more than five minutes old, or ahead: refused.
    // A minute past the window: the server reads its clock later than this test does.
    for ts in [unix_now() - 360, unix_now() + 360] {
        let id = format!("{ts:032x}");
        let answer = raw_post(&server.url, &signed(b"replay-secret", ts, &id, body), body);
        assert_eq!(answer.status(), 401);
        assert!(
            String::from_utf8_lossy(&answer.body).contains("five minutes"),
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
    }

    // Version 1 alone (ambiguous framing) is refused.
    let ts = unix_now().to_string();
    let id2 = "ffeeddccbbaa99887766554433221100";
    let v1 = helper_protocol::webhook::signature(b"replay-secret", &ts, id2, body);
    let answer = raw_post(
        &server.url,
        &[
            (TIMESTAMP_HEADER, ts.clone()),
            (REQUEST_ID_HEADER, id2.to_string()),
            (helper_protocol::webhook::SIGNATURE_HEADER, v1),
        ],
        body,
    );
    assert_eq!(answer.status(), 401);
    // ...and that refused request did not use up its id.
    let answer = raw_post(
        &server.url,
        &signed(b"replay-secret", unix_now(), id2, body),
        body,
    );
    assert_eq!(answer.status(), 200);
}

#[test]
fn without_a_secret_it_listens_on_loopback_alone() {
    for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:8080"] {
        let o = Command::new(env!("CARGO_BIN_EXE_choria-demo-helper"))
            .args(["serve", "--listen", listen])
            .env("CHORIA_BROKERS", "nats://b1.example.net:4222")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!o.status.success(), "{listen}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("refusing to listen") && err.contains("--secret-file"),
            "{listen}: {err}"
        );
        assert!(o.stdout.is_empty(), "{listen}: it listened");
    }
    // With a secret, every interface is allowed.
    let dir = tempfile::tempdir().unwrap();
    let shared = secret(dir.path(), "shared", "any-interface-secret");
    let (mut child, line) = start("0.0.0.0:0", &["--secret-file", shared.to_str().unwrap()]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with("listening on http://0.0.0.0:"), "{line}");
}
