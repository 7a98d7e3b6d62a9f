//! `choria-demo-helper serve`: the helper as a webhook. The node's input is POSTed as the body
//! and the reply is the answer, exactly as on stdin and stdout; HTTP/1.1 and h2 (over TLS by
//! ALPN, over plain TCP by prior knowledge), keep-alive.
//!
//! ```text
//! choria-demo-helper serve --listen 127.0.0.1:8080 [--secret-file FILE]
//!     [--tls-cert FILE --tls-key FILE [--client-ca FILE]]
//! ```
//!
//! With `--secret-file` every request must carry the provisioner's signature
//! (`X-Choria-Provisioner-Signature: sha256=<hex>`, the HMAC-SHA256 of `timestamp.request_id.body`)
//! and a timestamp within five minutes, else it is answered 401. With `--client-ca` a client
//! certificate issued by that CA is required. A `GET` (the provisioner's `check --probe`) is
//! answered 200 when its signature holds. The site settings come from the environment as for a
//! stdin run (`CHORIA_BROKERS`, `CHORIA_CA_CERT`/`CHORIA_CA_KEY`, ...); the CA is read at start.
//! The first line on stdout is `listening on http://ADDR` (or `https://`), with the port bound.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
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
/// How far a request's timestamp may be from this clock.
const MAX_SKEW: u64 = 300;
/// How long a request body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

const SIGNATURE_HEADER: &str = "x-choria-provisioner-signature";
const TIMESTAMP_HEADER: &str = "x-choria-provisioner-timestamp";
const REQUEST_ID_HEADER: &str = "x-choria-provisioner-request-id";

struct State {
    site: Site,
    secret: Option<Vec<u8>>,
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
    let tls = match (&f.tls_cert, &f.tls_key) {
        (Some(c), Some(k)) => Some(tls_config(c, k, f.client_ca.as_deref())?),
        (None, None) if f.client_ca.is_none() => None,
        _ => return Err("--tls-cert and --tls-key go together; --client-ca needs both".into()),
    };
    let site = Site::from_env();
    site.load_ca()?;
    let state = Arc::new(State { site, secret });
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
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
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
    if let Some(secret) = &state.secret {
        if let Err(why) = verify(secret, &parts.headers, &body) {
            return Ok(answer(StatusCode::UNAUTHORIZED, json!({"msg": why})));
        }
    }
    if parts.method == Method::GET {
        return Ok(answer(
            StatusCode::OK,
            json!({"msg": "choria-demo-helper is ready"}),
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
        return Ok(answer(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            json!({"msg": "the body must be application/json"}),
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
        Ok(reply) => answer(StatusCode::OK, reply),
        Err(e) => answer(StatusCode::INTERNAL_SERVER_ERROR, json!({"msg": e})),
    })
}

/// Checks the provisioner's signature: the timestamp within [`MAX_SKEW`] of this clock, and
/// the HMAC-SHA256 of `timestamp.request_id.body` (compared in constant time).
fn verify(secret: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), String> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| format!("the request has no {name} header"))
    };
    let timestamp = header(TIMESTAMP_HEADER)?;
    let request_id = header(REQUEST_ID_HEADER)?;
    let signature = header(SIGNATURE_HEADER)?;
    let sent: u64 = timestamp
        .parse()
        .map_err(|_| "the timestamp is not a number".to_string())?;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    if now.abs_diff(sent) > MAX_SKEW {
        return Err("the timestamp is more than five minutes away".into());
    }
    let tag = signature
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or_else(|| "the signature is not sha256=<hex>".to_string())?;
    let mut signed = Vec::with_capacity(timestamp.len() + request_id.len() + body.len() + 2);
    signed.extend_from_slice(timestamp.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(request_id.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    ring::hmac::verify(&key, &signed, &tag).map_err(|_| "the signature does not match".to_string())
}
