//! `choria-demo-helper serve`: the helper as a webhook. The node's input is POSTed as the body
//! and the reply is the answer, exactly as on stdin and stdout; HTTP/1.1 and h2 (over TLS by
//! ALPN, over plain TCP by prior knowledge), keep-alive.
//!
//! ```text
//! choria-demo-helper serve --listen 127.0.0.1:8080 [--secret-file FILE]
//!     [--tls-cert FILE --tls-key FILE [--client-ca FILE]]
//! ```
//!
//! With `--secret-file` every request must carry the provisioner's version 2 signature
//! (`X-Choria-Provisioner-Signature-V2: sha256=<hex>`, the HMAC-SHA256 of the length-framed
//! timestamp, request id and body; docs/helper.md gives the exact bytes), a timestamp within five
//! minutes of this clock and a request id not seen before within that window, else it is
//! answered 401 (the version 1 header is not looked at). Every answer to a request that passed
//! is signed in turn (`X-Choria-Provisioner-Reply-Signature`, over the request id and the
//! answer's body), so a provisioner with `helper_reply_signature: required` can trust it. Without
//! `--secret-file` the server only listens on a loopback address: anywhere else it would answer,
//! and sign certificates for, anyone who reaches it. With `--client-ca` a client certificate
//! issued by that CA is required. A `GET` (the provisioner's `check --probe`) is answered 200
//! when its signature holds. The site settings come from the environment as for a stdin run
//! (`CHORIA_BROKERS`, `CHORIA_CA_CERT`/`CHORIA_CA_KEY`, ...); the CA is read at start. The first
//! line on stdout is `listening on http://ADDR` (or `https://`), with the port bound.

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use crate::Site;

/// The largest request body read (the provisioner's own reply limit).
const MAX_BODY: usize = 1024 * 1024;
/// How far a request's timestamp may be from this clock, either way.
const MAX_SKEW: u64 = 300;
/// How many request ids are remembered at most. An id is only remembered while its timestamp
/// is within [`MAX_SKEW`] of this clock (after that the timestamp alone refuses it again), and
/// only once its signature verified, so only the provisioner can fill this: a million is more
/// than ten minutes of the fastest benchmark.
const MAX_REMEMBERED: usize = 1_000_000;
/// How long a request body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

const SIGNATURE_HEADER: &str = "x-choria-provisioner-signature-v2";
const TIMESTAMP_HEADER: &str = "x-choria-provisioner-timestamp";
const REQUEST_ID_HEADER: &str = "x-choria-provisioner-request-id";
const REPLY_SIGNATURE_HEADER: &str = "x-choria-provisioner-reply-signature";

struct State {
    site: Site,
    secret: Option<Vec<u8>>,
    seen: Mutex<Seen>,
}

/// The request ids accepted recently, each with its request's timestamp, so that a request
/// recorded on the way (or sent again by a proxy) is refused while its timestamp is still
/// within the window.
struct Seen {
    ids: HashSet<u128>,
    by_time: BTreeMap<u64, Vec<u128>>,
    capacity: usize,
}

/// Why a request id was not admitted.
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// It was accepted once already.
    Replayed,
    /// As many ids as can be remembered are still in the window.
    Full,
}

impl Seen {
    fn new(capacity: usize) -> Seen {
        Seen {
            ids: HashSet::new(),
            by_time: BTreeMap::new(),
            capacity,
        }
    }

    /// Remembers `id`, sent at `timestamp`, unless it is remembered already. Ids whose
    /// timestamps have left the window are forgotten first.
    fn admit(&mut self, id: u128, timestamp: u64, now: u64) -> Result<(), Refused> {
        while let Some(oldest) = self.by_time.first_entry() {
            if oldest.key().saturating_add(MAX_SKEW) >= now {
                break;
            }
            for gone in oldest.remove() {
                self.ids.remove(&gone);
            }
        }
        if self.ids.contains(&id) {
            return Err(Refused::Replayed);
        }
        // Full is refused rather than forgetting an id early, which would let it be replayed.
        if self.ids.len() >= self.capacity {
            return Err(Refused::Full);
        }
        self.ids.insert(id);
        self.by_time.entry(timestamp).or_default().push(id);
        Ok(())
    }
}

/// The flags of `serve`.
#[derive(Default)]
struct Flags {
    listen: Option<String>,
    secret_file: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
    client_ca: Option<String>,
}

const USAGE: &str = "usage: choria-demo-helper serve --listen ADDR [--secret-file FILE] \
                     [--tls-cert FILE --tls-key FILE [--client-ca FILE]]";

fn flags(args: &[String]) -> Result<Flags, String> {
    let mut f = Flags::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let slot = match flag.as_str() {
            "--listen" => &mut f.listen,
            "--secret-file" => &mut f.secret_file,
            "--tls-cert" => &mut f.tls_cert,
            "--tls-key" => &mut f.tls_key,
            "--client-ca" => &mut f.client_ca,
            other => return Err(format!("unknown flag {other:?}; {USAGE}")),
        };
        *slot = Some(
            it.next()
                .ok_or_else(|| format!("{flag} needs a value"))?
                .clone(),
        );
    }
    Ok(f)
}

/// Runs the server until the process is stopped.
pub fn main(args: &[String]) -> Result<(), String> {
    let f = flags(args)?;
    let listen: SocketAddr = f
        .listen
        .as_deref()
        .ok_or(USAGE)?
        .parse()
        .map_err(|e| format!("--listen: {e}"))?;
    let secret = f.secret_file.as_deref().map(read_secret).transpose()?;
    if secret.is_none() && !listen.ip().to_canonical().is_loopback() {
        return Err(format!(
            "refusing to listen on {listen} without --secret-file: it would answer anyone who \
             reaches it, signing certificates for them; give --secret-file, or listen on a \
             loopback address such as 127.0.0.1"
        ));
    }
    let tls = match (&f.tls_cert, &f.tls_key) {
        (Some(c), Some(k)) => Some(tls_config(c, k, f.client_ca.as_deref())?),
        (None, None) if f.client_ca.is_none() => None,
        _ => return Err("--tls-cert and --tls-key go together; --client-ca needs both".into()),
    };
    let site = Site::from_env();
    site.load_ca()?;
    let state = Arc::new(State {
        site,
        secret,
        seen: Mutex::new(Seen::new(MAX_REMEMBERED)),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(serve(listen, state, tls))
}

/// The secret file: one trailing newline removed, not empty.
fn read_secret(path: &str) -> Result<Vec<u8>, String> {
    let mut s = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    if s.last() == Some(&b'\n') {
        s.pop();
        if s.last() == Some(&b'\r') {
            s.pop();
        }
    }
    if s.is_empty() {
        return Err(format!("{path} is empty"));
    }
    Ok(s)
}

fn tls_config(
    cert: &str,
    key: &str,
    client_ca: Option<&str>,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {cert}: {e}"))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--tls-key {key}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in
                CertificateDer::pem_file_iter(ca).map_err(|e| format!("--client-ca {ca}: {e}"))?
            {
                roots
                    .add(c.map_err(|e| format!("--client-ca {ca}: {e}"))?)
                    .map_err(|e| format!("--client-ca {ca}: {e}"))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| format!("--client-ca {ca}: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("--tls-cert {cert}: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn serve(
    listen: SocketAddr,
    state: Arc<State>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<(), String> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("listening on {scheme}://{bound}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let mut connections = JoinSet::new();
    loop {
        // Finished connections are reaped as new ones come.
        while connections.try_join_next().is_some() {}
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                eprintln!("choria-demo-helper: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let state = Arc::clone(&state);
        let tls = tls.clone();
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(Arc::clone(&state), req));
            let builder = auto::Builder::new(TokioExecutor::new());
            let result = match tls {
                Some(acceptor) => match acceptor.accept(tcp).await {
                    Ok(stream) => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await
                    }
                    Err(_) => return,
                },
                None => builder.serve_connection(TokioIo::new(tcp), service).await,
            };
            drop(result);
        });
    }
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response<Full<Bytes>> {
    signed_answer(status, body, None)
}

/// An answer; with `key` (the secret and the request id it answers) signed over that id and
/// the body's bytes exactly as sent.
fn signed_answer(
    status: StatusCode,
    body: serde_json::Value,
    key: Option<(&[u8], &str)>,
) -> Response<Full<Bytes>> {
    let body = Bytes::from(body.to_string());
    let signature = key.map(|(secret, request_id)| reply_signature(secret, request_id, &body));
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(value) = signature.and_then(|s| HeaderValue::from_str(&s).ok()) {
        resp.headers_mut().insert(REPLY_SIGNATURE_HEADER, value);
    }
    resp
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    if parts.method != Method::POST && parts.method != Method::GET {
        return Ok(answer(
            StatusCode::METHOD_NOT_ALLOWED,
            json!({"msg": "POST the node's input"}),
        ));
    }
    let body =
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => {
                return Ok(answer(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    json!({"msg": format!("the body is larger than {MAX_BODY} bytes or broken")}),
                ))
            }
            Err(_) => {
                return Ok(answer(
                    StatusCode::REQUEST_TIMEOUT,
                    json!({"msg": "the body did not arrive in time"}),
                ))
            }
        };
    // The request id a verified request carried: its answer is signed for it.
    let mut verified: Option<String> = None;
    if let Some(secret) = &state.secret {
        match verify(secret, &parts.headers, &body, unix_now(), &state.seen) {
            Ok(id) => verified = Some(id),
            Err((status, why)) => return Ok(answer(status, json!({"msg": why}))),
        }
    }
    let key = state.secret.as_deref().zip(verified.as_deref());
    if parts.method == Method::GET {
        return Ok(signed_answer(
            StatusCode::OK,
            json!({"msg": "choria-demo-helper is ready"}),
            key,
        ));
    }
    let json_body = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json_body {
        return Ok(signed_answer(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            json!({"msg": "the body must be application/json"}),
            key,
        ));
    }
    // Signing a CSR takes milliseconds of CPU: off the connection tasks' threads.
    let reply = if body.windows(7).any(|w| w == b"\"csr\":{") {
        let state = Arc::clone(&state);
        tokio::task::spawn_blocking(move || state.site.reply(&body))
            .await
            .unwrap_or_else(|e| Err(format!("the helper failed: {e}")))
    } else {
        state.site.reply(&body)
    };
    Ok(match reply {
        Ok(reply) => signed_answer(StatusCode::OK, reply, key),
        Err(e) => signed_answer(StatusCode::INTERNAL_SERVER_ERROR, json!({"msg": e}), key),
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Appends one field framed by its length: the length in decimal, `:`, the bytes and `\n`.
fn frame(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(field.len().to_string().as_bytes());
    out.push(b':');
    out.extend_from_slice(field);
    out.push(b'\n');
}

/// `sha256=` and the hex HMAC-SHA256 of `v2 reply\n`, the framed request id and the framed body.
fn reply_signature(secret: &[u8], request_id: &str, body: &[u8]) -> String {
    let mut message = b"v2 reply\n".to_vec();
    frame(&mut message, request_id.as_bytes());
    frame(&mut message, body);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    format!(
        "sha256={}",
        hex::encode(ring::hmac::sign(&key, &message).as_ref())
    )
}

/// Checks the provisioner's version 2 signature: the timestamp within [`MAX_SKEW`] of `now`, the
/// request id 32 lower-case hex digits, the HMAC-SHA256 of `v2 request\n` and the framed
/// timestamp, request id and body (compared in constant time), and then the request id not seen
/// before. The request id when it passes; the status and the reason when not.
fn verify(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
    now: u64,
    seen: &Mutex<Seen>,
) -> Result<String, (StatusCode, String)> {
    let refuse = |why: String| (StatusCode::UNAUTHORIZED, why);
    let header = |name: &str| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(v), None) => Ok(v.as_bytes()),
            (None, _) => Err(refuse(format!("the request has no {name} header"))),
            (Some(_), Some(_)) => Err(refuse(format!(
                "the request has more than one {name} header"
            ))),
        }
    };
    let timestamp = header(TIMESTAMP_HEADER)?;
    let request_id = header(REQUEST_ID_HEADER)?;
    let signature = header(SIGNATURE_HEADER)?;
    // Digits alone: a sign, spaces or a fraction would be a second spelling of the same time.
    let sent: u64 = std::str::from_utf8(timestamp)
        .ok()
        .filter(|t| (1..=20).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| refuse("the timestamp is not a number of seconds".into()))?;
    if now.abs_diff(sent) > MAX_SKEW {
        return Err(refuse(
            "the timestamp is more than five minutes away from this server's clock".into(),
        ));
    }
    let id = std::str::from_utf8(request_id)
        .ok()
        .filter(|id| id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .and_then(|id| u128::from_str_radix(id, 16).ok())
        .ok_or_else(|| refuse("the request id is not 32 lower-case hex digits".into()))?;
    let tag = signature
        .strip_prefix(b"sha256=")
        .filter(|h| h.len() == 64)
        .and_then(|h| hex::decode(h).ok())
        .ok_or_else(|| refuse("the signature is not sha256= and 64 hex digits".into()))?;
    let mut message = b"v2 request\n".to_vec();
    frame(&mut message, timestamp);
    frame(&mut message, request_id);
    frame(&mut message, body);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    ring::hmac::verify(&key, &message, &tag)
        .map_err(|_| refuse("the signature does not match".into()))?;
    // Only now, with the signature verified, is the id remembered: nobody without the secret
    // can fill the set.
    let admitted = seen
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .admit(id, sent, now);
    match admitted {
        Ok(()) => Ok(String::from_utf8_lossy(request_id).into_owned()),
        Err(Refused::Replayed) => Err(refuse(
            "the request id was seen already: a replayed request".into(),
        )),
        Err(Refused::Full) => Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests within five minutes to remember their ids; try again later".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef";
    const BODY: &[u8] = br#"{"identity":"n1.example.net"}"#;
    // Computed independently with Python's hmac module over
    // b'v2 request\n10:1700000000\n32:0123456789abcdef0123456789abcdef\n29:{"identity":"n1.example.net"}\n'.
    const SIGNED: &str = "sha256=682b32857a2627a4b6edd9b8522f88e13c299a7053f616847fd41322614df783";

    fn headers(timestamp: &str, id: &str, signature: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in [
            (TIMESTAMP_HEADER, timestamp),
            (REQUEST_ID_HEADER, id),
            (SIGNATURE_HEADER, signature),
        ] {
            h.insert(name, HeaderValue::from_str(value).expect("a test header"));
        }
        h
    }

    fn sign(timestamp: &str, id: &str, body: &[u8]) -> String {
        let mut message = b"v2 request\n".to_vec();
        frame(&mut message, timestamp.as_bytes());
        frame(&mut message, id.as_bytes());
        frame(&mut message, body);
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"Jefe");
        format!(
            "sha256={}",
            hex::encode(ring::hmac::sign(&key, &message).as_ref())
        )
    }

    #[test]
    fn a_signed_request_passes_once() {
        let seen = Mutex::new(Seen::new(16));
        let h = headers("1700000000", ID, SIGNED);
        assert_eq!(
            verify(b"Jefe", &h, BODY, 1_700_000_100, &seen),
            Ok(ID.to_string())
        );
        // The very same request again: refused as a replay, also later within the window.
        for now in [1_700_000_100, 1_700_000_299] {
            let (status, why) = verify(b"Jefe", &h, BODY, now, &seen).unwrap_err();
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert!(why.contains("replayed"), "{why}");
        }
    }

    #[test]
    fn a_timestamp_outside_five_minutes_is_refused() {
        let seen = Mutex::new(Seen::new(16));
        let h = headers("1700000000", ID, SIGNED);
        for now in [1_700_000_301, 1_699_999_699, 0, u64::MAX] {
            let (status, why) = verify(b"Jefe", &h, BODY, now, &seen).unwrap_err();
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert!(why.contains("five minutes"), "{now}: {why}");
        }
        // At the edges it passes.
        assert!(verify(b"Jefe", &h, BODY, 1_700_000_300, &seen).is_ok());
        for ts in ["+1700000000", "1700000000.0", " 1700000000", "", "-1"] {
            let h = headers(ts, ID, &sign(ts, ID, BODY));
            let (_, why) = verify(b"Jefe", &h, BODY, 1_700_000_000, &seen).unwrap_err();
            assert!(why.contains("not a number"), "{ts:?}: {why}");
        }
    }

    #[test]
    fn only_a_version_2_signature_over_these_very_fields_passes() {
        let seen = Mutex::new(Seen::new(16));
        let now = 1_700_000_000;
        // Another body, another secret, or the ambiguous version 1 string: refused.
        let mut v1 = b"1700000000.".to_vec();
        v1.extend_from_slice(ID.as_bytes());
        v1.push(b'.');
        v1.extend_from_slice(BODY);
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"Jefe");
        let v1 = format!(
            "sha256={}",
            hex::encode(ring::hmac::sign(&key, &v1).as_ref())
        );
        for (signature, body, secret) in [
            (
                SIGNED,
                &br#"{"identity":"n2.example.net"}"#[..],
                &b"Jefe"[..],
            ),
            (SIGNED, BODY, b"other"),
            (v1.as_str(), BODY, b"Jefe"),
        ] {
            let h = headers("1700000000", ID, signature);
            let (status, why) = verify(secret, &h, body, now, &seen).unwrap_err();
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert!(why.contains("does not match"), "{why}");
        }
        // The version 1 header alone is not looked at.
        let mut h = headers("1700000000", ID, SIGNED);
        h.remove(SIGNATURE_HEADER);
        h.insert(
            "x-choria-provisioner-signature",
            HeaderValue::from_str(&v1).expect("hex"),
        );
        let (_, why) = verify(b"Jefe", &h, BODY, now, &seen).unwrap_err();
        assert!(
            why.contains("no x-choria-provisioner-signature-v2"),
            "{why}"
        );
        // A request id that is not the provisioner's form, even when signed: refused.
        for id in ["0123", &ID.to_uppercase(), &format!("{ID}0"), "a.b"] {
            let h = headers("1700000000", id, &sign("1700000000", id, BODY));
            let (_, why) = verify(b"Jefe", &h, BODY, now, &seen).unwrap_err();
            assert!(why.contains("32 lower-case hex"), "{id}: {why}");
        }
        // A header given twice is refused rather than one of them picked.
        let mut h = headers("1700000000", ID, SIGNED);
        h.append(REQUEST_ID_HEADER, HeaderValue::from_static(ID));
        let (_, why) = verify(b"Jefe", &h, BODY, now, &seen).unwrap_err();
        assert!(why.contains("more than one"), "{why}");
        // None of the refused ones was remembered: the real request still passes.
        let h = headers("1700000000", ID, SIGNED);
        assert!(verify(b"Jefe", &h, BODY, now, &seen).is_ok());
    }

    #[test]
    fn remembered_ids_are_bounded_and_forgotten_after_the_window() {
        let mut seen = Seen::new(3);
        let now = 10_000;
        for id in 1..=3 {
            assert_eq!(seen.admit(id, now - 200 + id as u64, now), Ok(()));
        }
        assert_eq!(seen.admit(2, now, now), Err(Refused::Replayed));
        // Full: a new id is refused, not admitted by forgetting one that could be replayed.
        assert_eq!(seen.admit(4, now, now), Err(Refused::Full));
        // Once the first one's timestamp has left the window it is forgotten (its timestamp
        // alone refuses it now), and there is room again.
        assert_eq!(seen.admit(4, now, now + 102), Ok(()));
        assert_eq!(seen.ids.len(), 3);
        assert!(!seen.ids.contains(&1));
        assert_eq!(seen.admit(3, now, now + 102), Err(Refused::Replayed));
    }

    #[test]
    fn answers_are_signed_for_the_request_they_answer() {
        // Computed independently with Python's hmac module over
        // b'v2 reply\n32:0123456789abcdef0123456789abcdef\n12:{"msg":"ok"}\n'.
        assert_eq!(
            reply_signature(b"Jefe", ID, br#"{"msg":"ok"}"#),
            "sha256=d084aa218c3b842a59e23383894d7ad831dd68ed6c36bbade655f4a8e8d40788"
        );
        let resp = signed_answer(StatusCode::OK, json!({"msg": "ok"}), Some((b"Jefe", ID)));
        assert_eq!(
            resp.headers()[REPLY_SIGNATURE_HEADER],
            "sha256=d084aa218c3b842a59e23383894d7ad831dd68ed6c36bbade655f4a8e8d40788"
        );
        assert!(answer(StatusCode::OK, json!({}))
            .headers()
            .get(REPLY_SIGNATURE_HEADER)
            .is_none());
    }
}
