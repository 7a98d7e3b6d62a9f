//! The webhook client against real HTTP servers on loopback: a small HTTP/1.1 server written
//! here (plain or TLS with rustls) whose every answer a test chooses, so that signatures,
//! mutual TLS, timeouts, oversized and slow-drip replies, non-2xx answers, refused connections
//! and pooling are each checked on the wire, and signed replies, altered ones and unsigned ones
//! are judged as `helper_reply_signature` asks.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use helper_protocol::webhook::{
    read_secret, ReplySignature, REPLY_SIGNATURE_HEADER, REQUEST_ID_HEADER,
    REQUEST_SIGNATURE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use helper_protocol::{
    input_bytes, HelperError, HelperErrorKind, HelperInput, WebhookClient, WebhookOptions,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as the server read it.
#[derive(Debug, Clone)]
struct Received {
    request_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the server does with a request.
#[derive(Clone)]
enum Answer {
    /// A complete response with this status and body.
    Full(u16, &'static str, Vec<u8>),
    /// Headers announcing `len` bytes, then one byte every `every`.
    Drip { len: usize, every: Duration },
    /// A chunked body that never ends, 16 KiB a chunk.
    Endless,
    /// Read the request, then nothing at all.
    Hang,
    /// Read the request, then close the connection without answering.
    Close,
    /// A 200 with this body, its reply signature made with `secret` for the request's id and
    /// then spoilt as `spoil` says.
    Signed {
        secret: &'static [u8],
        body: Vec<u8>,
        spoil: Spoil,
    },
}

/// How a signed reply is spoilt on its way.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Spoil {
    /// Not at all.
    Nothing,
    /// The body is changed after signing, as a proxy in the middle would.
    Body,
    /// Signed for another request id: a reply recorded earlier and sent again.
    OtherRequest,
    /// The signature header twice.
    Twice,
}

#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    requests: Mutex<Vec<Received>>,
}

/// A server on a free loopback port answering every request with `answer`; with `tls`, over
/// TLS. Returns its base URL and what it saw.
async fn server(answer: Answer, tls: Option<tokio_rustls::TlsAcceptor>) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let s = Arc::clone(&seen);
    let scheme = if tls.is_some() { "https" } else { "http" };
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            s.connections.fetch_add(1, Ordering::SeqCst);
            let s = Arc::clone(&s);
            let answer = answer.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(tcp).await {
                            connection(stream, answer, s).await;
                        }
                    }
                    None => connection(tcp, answer, s).await,
                }
            });
        }
    });
    (format!("{scheme}://127.0.0.1:{port}/provision"), seen)
}

/// Serves requests on one connection until the client closes it.
async fn connection<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, answer: Answer, seen: Arc<Seen>) {
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut s, &mut buf).await else {
            return;
        };
        seen.requests.lock().unwrap().push(req.clone());
        match &answer {
            Answer::Full(status, reason, body) => {
                let head = format!(
                    "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                if s.write_all(head.as_bytes()).await.is_err() || s.write_all(body).await.is_err() {
                    return;
                }
            }
            Answer::Drip { len, every } => {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
                let _ = s.write_all(head.as_bytes()).await;
                for _ in 0..*len {
                    tokio::time::sleep(*every).await;
                    if s.write_all(b" ").await.is_err() {
                        return;
                    }
                    let _ = s.flush().await;
                }
            }
            Answer::Endless => {
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    .await;
                let chunk = format!("4000\r\n{}\r\n", " ".repeat(0x4000));
                for _ in 0..100_000 {
                    if s.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                }
                return;
            }
            Answer::Hang => {
                tokio::time::sleep(Duration::from_secs(60)).await;
                return;
            }
            Answer::Close => return,
            Answer::Signed {
                secret,
                body,
                spoil,
            } => {
                let id = req
                    .header(REQUEST_ID_HEADER)
                    .unwrap_or_default()
                    .to_string();
                let signed_id = if *spoil == Spoil::OtherRequest {
                    "0123456789abcdef0123456789abcdef".to_string()
                } else {
                    id
                };
                let signature = reply_signature_by_hand(secret, &signed_id, body);
                let mut sent = body.clone();
                if *spoil == Spoil::Body {
                    // The same length, so the framing of HTTP is untouched.
                    sent = String::from_utf8_lossy(&sent)
                        .replace("n1.example.net", "n6.example.net")
                        .into_bytes();
                }
                let mut head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{REPLY_SIGNATURE_HEADER}: {signature}\r\n",
                    sent.len()
                );
                if *spoil == Spoil::Twice {
                    head.push_str(&format!("{REPLY_SIGNATURE_HEADER}: {signature}\r\n"));
                }
                head.push_str("\r\n");
                if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&sent).await.is_err()
                {
                    return;
                }
            }
        }
        let _ = s.flush().await;
    }
}

/// Reads one request (head and `Content-Length` body); `None` when the connection ends.
async fn read_request<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> Option<Received> {
    let mut tmp = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.drain(..end + 4);
    let mut lines = head.split("\r\n");
    let request_line = lines.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, v)| v.parse().unwrap());
    while buf.len() < len {
        let n = s.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    let body = buf.drain(..len).collect();
    Some(Received {
        request_line,
        headers,
        body,
    })
}

fn input() -> HelperInput {
    HelperInput {
        identity: "n1.example.net".into(),
        inventory: r#"{"facts":{"role":"<web>&"}}"#.into(),
        ..Default::default()
    }
}

fn reply(msg: &str) -> Vec<u8> {
    format!(r#"{{"msg":"{msg}","configuration":{{"identity":"n1.example.net"}}}}"#).into_bytes()
}

fn options(url: &str) -> WebhookOptions {
    WebhookOptions::new(url)
}

/// The file `secret` in `dir` holding `text`.
fn secret_in(dir: &std::path::Path, text: &str) -> PathBuf {
    let p = dir.join("secret");
    std::fs::write(&p, text).unwrap();
    p
}

/// A client of `url` signing its requests with `secret`, kept in the file `secret` of a
/// scratch directory: the directory, the file and the client.
fn signing_client(url: &str, secret: &str) -> (tempfile::TempDir, PathBuf, WebhookClient) {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = secret_in(dir.path(), secret);
    let client = WebhookClient::new(&WebhookOptions {
        secret_file: Some(secret_file.clone()),
        ..options(url)
    })
    .unwrap();
    (dir, secret_file, client)
}

/// A request to `url` that must time out after `limit`: the error and how long it took.
async fn timed_out(url: &str, limit: Duration) -> (HelperError, Duration) {
    let client = WebhookClient::new(&WebhookOptions {
        timeout: limit,
        ..options(url)
    })
    .unwrap();
    let started = Instant::now();
    let e = client.run(&input()).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.kind(), HelperErrorKind::Timeout, "{e}");
    (e, took)
}

/// The reply a new client with `opts` gets for `input()`.
async fn reply_with(opts: &WebhookOptions) -> helper_protocol::HelperReply {
    WebhookClient::new(opts)
        .unwrap()
        .run(&input())
        .await
        .unwrap()
}

/// The error a new client with `opts` gets for `input()`.
async fn error_with(opts: &WebhookOptions) -> HelperError {
    WebhookClient::new(opts)
        .unwrap()
        .run(&input())
        .await
        .unwrap_err()
}

/// The TLS material of the workspace's tests (a CA, a server certificate for 127.0.0.1 and a
/// client certificate), kept once in choria-rpc-client's testdata.
fn tls_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../choria-rpc-client/testdata/tls")
        .join(name)
}

/// A TLS acceptor with the test server certificate, requiring a client certificate of the test
/// CA when `mutual`.
fn acceptor(mutual: bool) -> tokio_rustls::TlsAcceptor {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<_> = CertificateDer::pem_file_iter(tls_file("broker.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(tls_file("broker_key.pem")).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if mutual {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(tls_file("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(certs, key).unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn hmac_hex(secret: &[u8], message: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    hex::encode(ring::hmac::sign(&key, message).as_ref())
}

/// The documented version 2 message, written out here rather than taken from the crate, so a
/// change of the framing on one side fails these tests: the first line, then each field as its
/// length in decimal, `:`, the bytes and a newline.
fn framed(first_line: &str, fields: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("{first_line}\n").into_bytes();
    for f in fields {
        out.extend_from_slice(format!("{}:", f.len()).as_bytes());
        out.extend_from_slice(f);
        out.push(b'\n');
    }
    out
}

fn reply_signature_by_hand(secret: &[u8], request_id: &str, body: &[u8]) -> String {
    format!(
        "sha256={}",
        hmac_hex(secret, &framed("v2 reply", &[request_id.as_bytes(), body]))
    )
}

#[tokio::test]
async fn the_body_is_the_stdin_bytes_and_the_signature_verifies() {
    let (url, seen) = server(Answer::Full(200, "OK", reply("signed")), None).await;
    let (_dir, _, client) = signing_client(&url, "0123456789abcdef-shared\n");
    let reply = client.run(&input()).await.unwrap();
    assert_eq!(reply.msg, "signed");
    assert_eq!(reply.configuration.unwrap()["identity"], "n1.example.net");

    let got = seen.requests.lock().unwrap()[0].clone();
    assert_eq!(got.request_line, "POST /provision HTTP/1.1");
    // The very bytes the process helper reads on stdin (Go's HTML escaping included).
    let stdin_bytes = input_bytes(&input()).unwrap();
    assert_eq!(got.body, stdin_bytes);
    assert!(String::from_utf8_lossy(&got.body).contains(r"\u003cweb\u003e\u0026"));
    assert_eq!(got.header("content-type"), Some("application/json"));
    let id = got.header(REQUEST_ID_HEADER).unwrap();
    assert_eq!(id.len(), 32);
    assert!(id
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    // A random (version 4, RFC 4122 variant) UUID.
    let parsed = uuid::Uuid::parse_str(id).unwrap();
    assert_eq!(parsed.get_version(), Some(uuid::Version::Random));
    assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
    let ts: u64 = got.header(TIMESTAMP_HEADER).unwrap().parse().unwrap();
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(ts) <= 5, "timestamp {ts}, now {now}");
    // Verified as a helper would: HMAC-SHA256 of "timestamp.request_id.body" with the file's
    // content less its newline.
    let mut message = format!("{ts}.{id}.").into_bytes();
    message.extend_from_slice(&got.body);
    assert_eq!(
        got.header(SIGNATURE_HEADER).unwrap(),
        format!("sha256={}", hmac_hex(b"0123456789abcdef-shared", &message))
    );
    // Version 2: the same secret over the framed timestamp, request id and body.
    let ts_text = got.header(TIMESTAMP_HEADER).unwrap();
    assert_eq!(
        got.header(REQUEST_SIGNATURE_HEADER).unwrap(),
        format!(
            "sha256={}",
            hmac_hex(
                b"0123456789abcdef-shared",
                &framed(
                    "v2 request",
                    &[ts_text.as_bytes(), id.as_bytes(), &got.body]
                )
            )
        )
    );
    // A second request has its own id, and a tampered body would not verify.
    client.run(&input()).await.unwrap();
    let second = seen.requests.lock().unwrap()[1].clone();
    assert_ne!(second.header(REQUEST_ID_HEADER), Some(id));
    let mut tampered = format!("{ts}.{id}.").into_bytes();
    tampered.extend_from_slice(&got.body[1..]);
    assert_ne!(
        got.header(SIGNATURE_HEADER).unwrap(),
        format!("sha256={}", hmac_hex(b"0123456789abcdef-shared", &tampered))
    );
    // The secret never shows in the client's Debug.
    let shown = format!("{client:?}");
    assert!(!shown.contains("0123456789abcdef"), "{shown}");
    assert!(shown.contains("secret"), "{shown}");
}

#[tokio::test]
async fn a_rotated_secret_is_used_without_a_new_client() {
    let (url, seen) = server(Answer::Full(200, "OK", reply("ok")), None).await;
    let (dir, secret_file, client) = signing_client(&url, "first-secret");
    client.run(&input()).await.unwrap();
    std::fs::write(&secret_file, "second-secret\r\n").unwrap();
    // A rotated file is looked at again once the last look is older than the window.
    tokio::time::sleep(helper_protocol::changed_file::RECHECK).await;
    client.run(&input()).await.unwrap();
    let reqs = seen.requests.lock().unwrap().clone();
    for (req, secret) in reqs.iter().zip(["first-secret", "second-secret"]) {
        let mut message = format!(
            "{}.{}.",
            req.header(TIMESTAMP_HEADER).unwrap(),
            req.header(REQUEST_ID_HEADER).unwrap()
        )
        .into_bytes();
        message.extend_from_slice(&req.body);
        assert_eq!(
            req.header(SIGNATURE_HEADER).unwrap(),
            format!("sha256={}", hmac_hex(secret.as_bytes(), &message))
        );
    }
    // An empty secret file fails the request before anything is sent, naming the file only.
    std::fs::write(&secret_file, "\n").unwrap();
    tokio::time::sleep(helper_protocol::changed_file::RECHECK).await;
    let e = client.run(&input()).await.unwrap_err();
    assert_eq!(e.kind(), HelperErrorKind::Setup, "{e}");
    assert!(e.to_string().contains("is empty"), "{e}");
    assert_eq!(seen.requests.lock().unwrap().len(), 2);
    assert!(read_secret(&dir.path().join("missing")).is_err());
}

#[tokio::test]
async fn mutual_tls_with_the_configured_ca_and_client_certificate() {
    let (url, seen) = server(Answer::Full(200, "OK", reply("mtls")), Some(acceptor(true))).await;
    let with_cert = WebhookOptions {
        ca: Some(tls_file("ca.pem")),
        client_cert: Some(tls_file("provisioner.pem")),
        client_key: Some(tls_file("provisioner_key.pem")),
        ..options(&url)
    };
    let reply = reply_with(&with_cert).await;
    assert_eq!(reply.msg, "mtls");
    assert_eq!(seen.requests.lock().unwrap().len(), 1);

    // Without a client certificate the server refuses the handshake: no request is read.
    let no_cert = WebhookOptions {
        ca: Some(tls_file("ca.pem")),
        ..options(&url)
    };
    let e = error_with(&no_cert).await;
    assert!(
        matches!(
            e.kind(),
            HelperErrorKind::Connect | HelperErrorKind::Request
        ),
        "{e}"
    );
    // Without the site's CA the server's certificate is not trusted: nothing is sent.
    let system_roots = WebhookOptions {
        client_cert: Some(tls_file("provisioner.pem")),
        client_key: Some(tls_file("provisioner_key.pem")),
        ..options(&url)
    };
    let e = error_with(&system_roots).await;
    assert_eq!(e.kind(), HelperErrorKind::Connect, "{e}");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    assert_eq!(seen.requests.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn tls_files_are_checked_when_the_client_is_built() {
    let url = "https://127.0.0.1:1/provision";
    let cert_only = WebhookOptions {
        client_cert: Some(tls_file("provisioner.pem")),
        ..options(url)
    };
    let e = WebhookClient::new(&cert_only).unwrap_err();
    assert_eq!(e.kind(), HelperErrorKind::Setup);
    assert!(e.to_string().contains("go together"), "{e}");
    let missing_ca = WebhookOptions {
        ca: Some(PathBuf::from("/nonexistent/ca.pem")),
        ..options(url)
    };
    let e = WebhookClient::new(&missing_ca).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    let not_a_key = WebhookOptions {
        client_cert: Some(tls_file("provisioner.pem")),
        client_key: Some(tls_file("ca.pem")),
        ..options(url)
    };
    assert_eq!(
        WebhookClient::new(&not_a_key).unwrap_err().kind(),
        HelperErrorKind::Setup
    );
    for bad in [
        "ftp://example.net/",
        "http://",
        "http://user:pass@example.net/",
        "not a url",
    ] {
        let e = WebhookClient::new(&options(bad)).unwrap_err();
        assert_eq!(e.kind(), HelperErrorKind::Setup, "{bad}: {e}");
        assert!(!e.to_string().contains("pass@"), "{e}");
    }
}

#[tokio::test]
async fn a_helper_that_does_not_answer_is_abandoned_at_the_time_limit() {
    let (url, seen) = server(Answer::Hang, None).await;
    let (e, took) = timed_out(&url, Duration::from_millis(700)).await;
    assert!(matches!(e, HelperError::NoAnswer { .. }), "{e}");
    assert!(
        took >= Duration::from_millis(650) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(seen.requests.lock().unwrap().len(), 1, "no retry once sent");
}

#[tokio::test]
async fn a_slow_drip_body_still_ends_at_the_time_limit() {
    // 100 bytes at one per 50 ms would take 5 s; the limit is 1 s, from connect to last byte.
    let (url, _) = server(
        Answer::Drip {
            len: 100,
            every: Duration::from_millis(50),
        },
        None,
    )
    .await;
    let (_, took) = timed_out(&url, Duration::from_secs(1)).await;
    assert!(
        took >= Duration::from_millis(950) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[tokio::test]
async fn an_oversized_reply_is_refused_while_it_is_read() {
    // Announced: refused before reading.
    let big = vec![b' '; 2 * 1024 * 1024];
    let (url, _) = server(Answer::Full(200, "OK", big), None).await;
    let e = error_with(&options(&url)).await;
    assert_eq!(e.kind(), HelperErrorKind::OutputTooLarge, "{e}");
    assert!(e.to_string().contains("1048576"), "{e}");

    // Not announced (chunked, without end): cut at the limit, long before the stream would end.
    let (url, _) = server(Answer::Endless, None).await;
    let client = WebhookClient::new(&WebhookOptions {
        max_reply: 64 * 1024,
        ..options(&url)
    })
    .unwrap();
    let started = Instant::now();
    let e = client.run(&input()).await.unwrap_err();
    assert!(
        matches!(e, HelperError::ReplyTooLarge { limit: 65536, .. }),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_non_2xx_answer_is_an_error_with_the_status_and_msg() {
    let (url, _) = server(
        Answer::Full(
            503,
            "Service Unavailable",
            br#"{"MSG":"CA offline\nERROR forged line","defer":false}"#.to_vec(),
        ),
        None,
    )
    .await;
    let e = error_with(&options(&url)).await;
    assert_eq!(e.kind(), HelperErrorKind::Status);
    match &e {
        HelperError::Status { status, msg, .. } => {
            assert_eq!(*status, 503);
            assert_eq!(msg, "CA offline\\nERROR forged line");
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        e.to_string(),
        format!("webhook {url} answered HTTP 503: CA offline\\nERROR forged line")
    );

    // A body that is not JSON gives the status alone; a redirect is not followed.
    let (url, seen) = server(Answer::Full(302, "Found", b"<html>".to_vec()), None).await;
    let e = error_with(&options(&url)).await;
    assert!(
        matches!(e, HelperError::Status { status: 302, ref msg, .. } if msg.is_empty()),
        "{e}"
    );
    assert_eq!(seen.requests.lock().unwrap().len(), 1);

    // A 2xx with an empty body is the process helper's "zero bytes received".
    let (url, _) = server(Answer::Full(200, "OK", Vec::new()), None).await;
    let e = error_with(&options(&url)).await;
    assert_eq!(e.kind(), HelperErrorKind::EmptyOutput, "{e}");
    // Undecodable JSON fails as the process helper's does.
    let (url, _) = server(Answer::Full(200, "OK", b"{not json".to_vec()), None).await;
    let e = error_with(&options(&url)).await;
    assert_eq!(e.kind(), HelperErrorKind::InvalidJson, "{e}");
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error_and_nothing_was_sent() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/provision");
    let started = Instant::now();
    let e = error_with(&options(&url)).await;
    assert_eq!(e.kind(), HelperErrorKind::Connect, "{e}");
    assert!(e.to_string().to_lowercase().contains("refused"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_connection_closed_after_the_request_is_not_retried() {
    let (url, seen) = server(Answer::Close, None).await;
    let e = error_with(&options(&url)).await;
    assert_eq!(e.kind(), HelperErrorKind::Request, "{e}");
    assert_eq!(seen.requests.lock().unwrap().len(), 1, "sent exactly once");
}

#[tokio::test]
async fn connections_are_kept_alive_and_reused() {
    let (url, seen) = server(Answer::Full(200, "OK", reply("pooled")), None).await;
    let client = WebhookClient::new(&options(&url)).unwrap();
    for _ in 0..5 {
        assert_eq!(client.run(&input()).await.unwrap().msg, "pooled");
    }
    assert_eq!(seen.requests.lock().unwrap().len(), 5);
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
    // Clones share the pool.
    let clone = client.clone();
    clone.run(&input()).await.unwrap();
    assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_probe_sends_a_signed_get_and_reports_the_status() {
    let (url, seen) = server(Answer::Full(405, "Method Not Allowed", Vec::new()), None).await;
    let (_dir, _, client) = signing_client(&url, "probe-secret");
    let p = client.probe().await.unwrap();
    assert_eq!(p.status, 405);
    assert_eq!(p.version, "HTTP/1.1");
    let got = seen.requests.lock().unwrap()[0].clone();
    assert_eq!(got.request_line, "GET /provision HTTP/1.1");
    let message = format!(
        "{}.{}.",
        got.header(TIMESTAMP_HEADER).unwrap(),
        got.header(REQUEST_ID_HEADER).unwrap()
    );
    assert_eq!(
        got.header(SIGNATURE_HEADER).unwrap(),
        format!("sha256={}", hmac_hex(b"probe-secret", message.as_bytes()))
    );
}

#[tokio::test]
async fn a_signed_reply_is_checked_and_a_required_one_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_in(dir.path(), "reply-secret\n");
    let client = |url: &str, mode| {
        WebhookClient::new(&WebhookOptions {
            secret_file: Some(secret.clone()),
            reply_signature: mode,
            ..options(url)
        })
        .unwrap()
    };
    let signed = |spoil| Answer::Signed {
        secret: b"reply-secret",
        body: reply("signed reply"),
        spoil,
    };
    use ReplySignature::{Optional, Required};

    // Signed with the secret, for this request: used, in either mode.
    let (url, _) = server(signed(Spoil::Nothing), None).await;
    for mode in [Optional, Required] {
        let reply = client(&url, mode).run(&input()).await.unwrap();
        assert_eq!(reply.msg, "signed reply");
    }

    // Altered on the way, signed for another request, or signed twice: refused in either mode,
    // and nothing of the reply is used.
    for spoil in [Spoil::Body, Spoil::OtherRequest, Spoil::Twice] {
        let (url, seen) = server(signed(spoil), None).await;
        for mode in [Optional, Required] {
            let e = client(&url, mode).run(&input()).await.unwrap_err();
            assert_eq!(e.kind(), HelperErrorKind::ReplySignature, "{spoil:?}: {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("refused the reply of webhook {url}: ")),
                "{e}"
            );
        }
        assert_eq!(seen.requests.lock().unwrap().len(), 2, "never retried");
    }

    // Signed with another secret: refused.
    let (url, _) = server(
        Answer::Signed {
            secret: b"another-secret",
            body: reply("forged"),
            spoil: Spoil::Nothing,
        },
        None,
    )
    .await;
    let e = client(&url, Optional).run(&input()).await.unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");

    // Unsigned: accepted when optional, refused when required.
    let (url, _) = server(Answer::Full(200, "OK", reply("unsigned")), None).await;
    assert_eq!(
        client(&url, Optional).run(&input()).await.unwrap().msg,
        "unsigned"
    );
    let e = client(&url, Required).run(&input()).await.unwrap_err();
    assert_eq!(e.kind(), HelperErrorKind::ReplySignature, "{e}");
    assert!(
        e.to_string()
            .ends_with("it is not signed and helper_reply_signature is required"),
        "{e}"
    );

    // A non-2xx answer stays a status error: its body is not used anyway.
    let (url, _) = server(
        Answer::Full(503, "Unavailable", br#"{"msg":"busy"}"#.to_vec()),
        None,
    )
    .await;
    let e = client(&url, Required).run(&input()).await.unwrap_err();
    assert_eq!(e.kind(), HelperErrorKind::Status, "{e}");

    // Required without a secret to check with: refused when the client is built.
    let e = WebhookClient::new(&WebhookOptions {
        reply_signature: Required,
        ..options(&url)
    })
    .unwrap_err();
    assert_eq!(e.kind(), HelperErrorKind::Setup, "{e}");
    assert!(e.to_string().contains("helper_secret_file"), "{e}");
}

#[tokio::test]
async fn the_probe_reports_how_its_answer_was_signed() {
    let dir = tempfile::tempdir().unwrap();
    let secret = secret_in(dir.path(), "probe-secret");
    let probe = |url: &str| {
        let client = WebhookClient::new(&WebhookOptions {
            secret_file: Some(secret.clone()),
            reply_signature: ReplySignature::Required,
            ..options(url)
        })
        .unwrap();
        async move { client.probe().await.unwrap().reply_signature }
    };
    let (url, _) = server(
        Answer::Signed {
            secret: b"probe-secret",
            body: b"{}".to_vec(),
            spoil: Spoil::Nothing,
        },
        None,
    )
    .await;
    assert_eq!(
        probe(&url).await,
        Ok(helper_protocol::signature::ReplyCheck::Signed)
    );
    let (url, _) = server(Answer::Full(200, "OK", b"{}".to_vec()), None).await;
    assert_eq!(
        probe(&url).await,
        Err(helper_protocol::signature::SignatureError::Missing)
    );
}
