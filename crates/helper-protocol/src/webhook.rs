//! Asks a helper over HTTP or HTTPS: the input the process helper reads on stdin is POSTed as
//! the body, byte for byte, and the reply is decoded as the process helper's stdout is.
//!
//! Every request carries `Content-Type: application/json`, a request id, the Unix time it was
//! signed at and, with a secret, two HMAC-SHA256 signatures: version 2 over the length-framed
//! timestamp, request id and body ([`crate::signature`]), and version 1 over
//! `timestamp.request_id.body` ([`signature`]) for receivers not yet moved to version 2. A
//! helper may sign its reply with the same secret; a signed reply is always checked, and with
//! [`ReplySignature::Required`] an unsigned one is refused. One [`WebhookClient`] keeps its
//! connections alive and pooled (HTTP/1.1, and h2 when the server offers it over TLS); how many
//! requests are in flight is up to the caller (the provisioner's workers, one request each). A
//! request is never retried here: a failure to connect ([`HelperError::Connect`]) is the only
//! one after which nothing was sent, and the caller decides whether to try again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::header::{HeaderValue, ACCEPT, CONTENT_TYPE};

use crate::changed_file::ChangedFile;
use crate::error::HelperError;
use crate::exchange;
use crate::signature::{check_reply, ReplyCheck, SignatureError};
use crate::types::{HelperInput, HelperReply};
use crate::{DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT};

pub use crate::signature::{
    ReplySignature, ReplySignatureParseError, REPLY_SIGNATURE_HEADER, REQUEST_SIGNATURE_HEADER,
};

/// The header carrying the version 1 signature: `sha256=` and the lower-case hex HMAC-SHA256 of
/// `timestamp.request_id.body` ([`signature`]). Sent beside [`REQUEST_SIGNATURE_HEADER`] so that
/// receivers written for version 1 keep working; a receiver should check version 2 instead.
pub const SIGNATURE_HEADER: &str = "X-Choria-Provisioner-Signature";
/// The header carrying the Unix time (seconds, decimal) the request was signed at.
pub const TIMESTAMP_HEADER: &str = "X-Choria-Provisioner-Timestamp";
/// The header carrying the request id: 32 lower-case hex characters, new for every request.
pub const REQUEST_ID_HEADER: &str = "X-Choria-Provisioner-Request-Id";

/// The largest secret file read (a secret is a few dozen bytes; a larger file is a mistake).
pub const MAX_SECRET_LEN: u64 = 4096;

/// How much of a non-2xx body's `msg` is kept in the error.
const MAX_STATUS_MSG: usize = 512;

/// How long an idle pooled connection is kept.
const POOL_IDLE: Duration = Duration::from_secs(90);

/// How to reach a webhook helper.
#[derive(Debug, Clone)]
pub struct WebhookOptions {
    /// The `http://` or `https://` URL requests are POSTed to.
    pub url: String,
    /// A file holding the shared secret the body is signed with; none means unsigned requests.
    pub secret_file: Option<PathBuf>,
    /// A PEM client certificate (chain) presented to an `https` webhook, with `client_key`.
    pub client_cert: Option<PathBuf>,
    /// The PEM private key of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// PEM CA certificates that alone are trusted for an `https` webhook; none means the
    /// system's roots.
    pub ca: Option<PathBuf>,
    /// The time limit of one request, connecting to reading the last byte of the reply.
    pub timeout: Duration,
    /// The largest reply accepted, in bytes.
    pub max_reply: usize,
    /// How many idle connections are kept for reuse (the number of workers is a good value).
    pub max_idle: usize,
    /// Whether replies must be signed with the secret; [`ReplySignature::Required`] needs
    /// `secret_file`.
    pub reply_signature: ReplySignature,
}

impl WebhookOptions {
    /// Options for `url` with the process helper's limits (10 s, 1 MiB), no secret and no TLS
    /// files.
    pub fn new(url: impl Into<String>) -> Self {
        WebhookOptions {
            url: url.into(),
            secret_file: None,
            client_cert: None,
            client_key: None,
            ca: None,
            timeout: DEFAULT_TIMEOUT,
            max_reply: DEFAULT_MAX_OUTPUT,
            max_idle: 64,
            reply_signature: ReplySignature::Optional,
        }
    }
}

/// Whether `helper` (the `helper` setting) names a webhook rather than a command.
pub fn is_webhook(helper: &str) -> bool {
    let h = helper.trim_start();
    let lower = |n: usize| h.get(..n).map(str::to_ascii_lowercase);
    lower(7).as_deref() == Some("http://") || lower(8).as_deref() == Some("https://")
}

/// The version 1 signature of one request: `sha256=` followed by the lower-case hex
/// HMAC-SHA256, keyed with `secret`, of the timestamp header's value, `.`, the request id
/// header's value, `.` and the body, exactly as sent. Ambiguous (the dots can move between
/// fields, see [`crate::signature`]); kept for receivers written before version 2.
pub fn signature(secret: &[u8], timestamp: &str, request_id: &str, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(timestamp.as_bytes());
    ctx.update(b".");
    ctx.update(request_id.as_bytes());
    ctx.update(b".");
    ctx.update(body);
    format!("sha256={}", hex::encode(ctx.sign().as_ref()))
}

/// Reads a secret file: at most [`MAX_SECRET_LEN`] bytes, one trailing newline (`\n` or
/// `\r\n`) removed, not empty. The error names the file, never its content.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    ChangedFile::new(path, MAX_SECRET_LEN).get(|b| secret_of(path, b), |e| io_error(path, e))
}

fn io_error(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

/// A secret file's bytes without one trailing newline (`\n` or `\r\n`); empty is an error.
fn secret_of(path: &Path, mut secret: Vec<u8>) -> Result<Vec<u8>, String> {
    if secret.last() == Some(&b'\n') {
        secret.pop();
        if secret.last() == Some(&b'\r') {
            secret.pop();
        }
    }
    if secret.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(secret)
}

/// What one request expects of its answer.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The webhook as errors name it (no credentials, no query).
    pub helper: &'a str,
    /// The id the request was sent with.
    pub request_id: &'a [u8],
    /// The secret the request was signed with, if any.
    pub secret: Option<&'a [u8]>,
    /// Whether the reply must be signed.
    pub reply_signature: ReplySignature,
}

/// A webhook's answer as read off the wire.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The HTTP status.
    pub status: u16,
    /// Every value of [`REPLY_SIGNATURE_HEADER`], in order.
    pub signatures: &'a [&'a [u8]],
    /// The body, at most the reply limit.
    pub body: &'a [u8],
}

/// Whether an answer, read in full, may be decoded as the reply: a 2xx status
/// ([`HelperError::Status`] with the body's `msg` otherwise), a body ([`HelperError::EmptyOutput`])
/// and a signature as `expected.reply_signature` asks ([`HelperError::ReplySignature`]).
pub fn judge_answer(expected: &Expected<'_>, answer: &Answer<'_>) -> Result<(), HelperError> {
    if !(200..300).contains(&answer.status) {
        return Err(HelperError::Status {
            helper: expected.helper.to_string(),
            status: answer.status,
            msg: status_msg(answer.body),
        });
    }
    if answer.body.is_empty() {
        return Err(HelperError::EmptyOutput {
            helper: expected.helper.to_string(),
        });
    }
    check_reply(
        expected.reply_signature,
        expected.secret,
        expected.request_id,
        answer.signatures,
        answer.body,
    )
    .map(drop)
    .map_err(|e| HelperError::ReplySignature {
        helper: expected.helper.to_string(),
        reason: match e {
            SignatureError::Missing => {
                "it is not signed and helper_reply_signature is required".to_string()
            }
            other => other.to_string(),
        },
    })
}

/// Every value of a response's [`REPLY_SIGNATURE_HEADER`], kept before the body is read.
fn reply_signatures(resp: &reqwest::Response) -> Vec<HeaderValue> {
    resp.headers()
        .get_all(REPLY_SIGNATURE_HEADER)
        .iter()
        .cloned()
        .collect()
}

/// One request ready to send: the id it carries and the secret it was signed with.
struct Prepared {
    req: reqwest::RequestBuilder,
    request_id: String,
    secret: Option<Arc<[u8]>>,
}

/// A configured webhook helper; cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct WebhookClient {
    client: reqwest::Client,
    url: reqwest::Url,
    shown: String,
    secret_file: Option<Arc<ChangedFile<Arc<[u8]>>>>,
    timeout: Duration,
    max_reply: usize,
    reply_signature: ReplySignature,
}

impl std::fmt::Debug for WebhookClient {
    // The URL without credentials or query, and the secret file's name: never the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookClient")
            .field("url", &self.shown)
            .field("secret_file", &self.secret_file.as_ref().map(|f| f.path()))
            .field("timeout", &self.timeout)
            .field("max_reply", &self.max_reply)
            .field("reply_signature", &self.reply_signature)
            .finish_non_exhaustive()
    }
}

/// What [`WebhookClient::probe`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The HTTP status of the answer.
    pub status: u16,
    /// The protocol spoken (`HTTP/1.1`, `HTTP/2`).
    pub version: String,
    /// How long the answer took.
    pub elapsed: Duration,
    /// What the answer's signature showed, judged as a reply would be: `Err` for a signature
    /// that does not match, or none where one is required.
    pub reply_signature: Result<ReplyCheck, SignatureError>,
}

/// The URL as it may be shown: scheme, host, port and path, without credentials or query.
pub fn shown(url: &reqwest::Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// A `helper` setting as it may be shown: a webhook URL without credentials or query (also
/// when it does not parse), anything else as it is.
pub fn shown_text(text: &str) -> String {
    let text = text.trim();
    if !is_webhook(text) {
        return text.to_string();
    }
    if let Ok(url) = reqwest::Url::parse(text) {
        return shown(&url);
    }
    let (scheme, rest) = text.split_once("://").unwrap_or(("", text));
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{rest}")
}

/// The URL of a webhook: `http` or `https`, a host, no credentials. The reason is in the
/// words `check` prints.
pub fn parse_url(text: &str) -> Result<reqwest::Url, String> {
    let url = reqwest::Url::parse(text.trim()).map_err(|e| format!("invalid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("scheme {} is not http or https", url.scheme()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "the URL carries credentials; use helper_secret_file and TLS client certificates"
                .into(),
        );
    }
    Ok(url)
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// The error and its causes on one line, without the URL reqwest adds and without the
/// wrappers that say nothing ("error sending request", "client error (Connect)"), so the
/// operator reads the cause: `tcp connect error: Connection refused (os error 111)`.
fn reason(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut parts: Vec<String> = Vec::new();
    let mut next: Option<&dyn std::error::Error> = Some(&e);
    while let Some(err) = next {
        let text = err.to_string();
        let generic = text.starts_with("error sending request")
            || text.starts_with("client error (")
            || text.starts_with("error trying to connect");
        if !generic && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    if parts.is_empty() {
        parts.push(e.to_string());
    }
    parts.join(": ").replace('\n', " ")
}

/// The `msg` of a JSON object body, bounded, control characters escaped; empty otherwise.
fn status_msg(body: &[u8]) -> String {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(body)
    else {
        return String::new();
    };
    // Keys in any case, as Go's encoding/json matches them.
    let Some(msg) = map
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("msg"))
        .filter_map(|(_, v)| v.as_str())
        .next_back()
    else {
        return String::new();
    };
    let mut out = String::new();
    for c in msg.chars() {
        if out.len() >= MAX_STATUS_MSG {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl WebhookClient {
    /// A client for `opts`: the URL checked, the TLS files read and parsed now. The secret file
    /// is read again whenever it changes, so a rotated secret needs no restart.
    pub fn new(opts: &WebhookOptions) -> Result<Self, HelperError> {
        let url = parse_url(&opts.url).map_err(|reason| HelperError::Setup {
            helper: shown_text(&opts.url),
            reason,
        })?;
        let shown = shown(&url);
        let setup = |reason: String| HelperError::Setup {
            helper: shown.clone(),
            reason,
        };
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .user_agent(concat!("choria-provisioner/", env!("CARGO_PKG_VERSION")))
            // A redirect would carry the body and its signature elsewhere; a 3xx is an error.
            .redirect(reqwest::redirect::Policy::none())
            // The helper is reached directly: a proxy from the environment is not used.
            .no_proxy()
            .timeout(opts.timeout)
            .connect_timeout(opts.timeout)
            .pool_max_idle_per_host(opts.max_idle)
            .pool_idle_timeout(POOL_IDLE)
            .tcp_nodelay(true);
        if let Some(ca) = &opts.ca {
            let pem = read_file(ca, "helper_tls_ca").map_err(setup)?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| setup(format!("helper_tls_ca {}: {}", ca.display(), reason(e))))?;
            if certs.is_empty() {
                return Err(setup(format!(
                    "helper_tls_ca {} holds no certificate",
                    ca.display()
                )));
            }
            builder = builder.tls_built_in_root_certs(false);
            for c in certs {
                builder = builder.add_root_certificate(c);
            }
        }
        match (&opts.client_cert, &opts.client_key) {
            (Some(cert), Some(key)) => {
                let mut pem = read_file(cert, "helper_tls_cert").map_err(setup)?;
                pem.push(b'\n');
                pem.extend(read_file(key, "helper_tls_key").map_err(setup)?);
                let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    setup(format!(
                        "helper_tls_cert {} with helper_tls_key {}: {}",
                        cert.display(),
                        key.display(),
                        reason(e)
                    ))
                })?;
                builder = builder.identity(identity);
            }
            (None, None) => {}
            _ => {
                return Err(setup(
                    "helper_tls_cert and helper_tls_key go together: set both or neither".into(),
                ))
            }
        }
        if opts.reply_signature == ReplySignature::Required && opts.secret_file.is_none() {
            return Err(setup(
                "helper_reply_signature is required but there is no helper_secret_file to check \
                 replies with"
                    .into(),
            ));
        }
        let client = builder
            .build()
            .map_err(|e| setup(format!("cannot build the HTTP client: {}", reason(e))))?;
        Ok(WebhookClient {
            client,
            url,
            shown,
            secret_file: opts
                .secret_file
                .as_ref()
                .map(|p| Arc::new(ChangedFile::new(p, MAX_SECRET_LEN))),
            timeout: opts.timeout,
            max_reply: opts.max_reply,
            reply_signature: opts.reply_signature,
        })
    }

    /// The URL as errors and logs show it (no credentials, no query).
    pub fn helper(&self) -> &str {
        &self.shown
    }

    /// Encodes `input`, POSTs it once and decodes the reply (no retry, see [`Self::send`]).
    pub async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        let body = Bytes::from(exchange::input_bytes(input)?);
        let out = self.send(body).await?;
        exchange::decode_reply(&out, &self.shown)
    }

    /// The headers of one request over `body`: content type, request id, timestamp and, with a
    /// secret, both signatures; with the id and the secret its reply is checked against.
    fn request(&self, method: reqwest::Method, body: &[u8]) -> Result<Prepared, HelperError> {
        // A version 4 UUID from the thread's CSPRNG (reseeded from the system): the same ids as
        // `Uuid::new_v4`, without a `getrandom` call for every request.
        let request_id = uuid::Builder::from_random_bytes(rand::random())
            .into_uuid()
            .simple()
            .to_string();
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default()
            .to_string();
        let mut req = self
            .client
            .request(method, self.url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(ACCEPT, HeaderValue::from_static("application/json"))
            .header(REQUEST_ID_HEADER, &request_id)
            .header(TIMESTAMP_HEADER, &timestamp);
        let mut secret = None;
        if let Some(file) = &self.secret_file {
            // Read again only when the file changed: a rotated secret needs no restart.
            let path = file.path();
            let key = file
                .get(|b| secret_of(path, b).map(Arc::from), |e| io_error(path, e))
                .map_err(|e| HelperError::Setup {
                    helper: self.shown.clone(),
                    reason: format!("helper_secret_file {e}"),
                })?;
            req = req
                .header(
                    REQUEST_SIGNATURE_HEADER,
                    crate::signature::sign_request(
                        &key,
                        timestamp.as_bytes(),
                        request_id.as_bytes(),
                        body,
                    ),
                )
                .header(
                    SIGNATURE_HEADER,
                    signature(&key, &timestamp, &request_id, body),
                );
            // The reply is checked with the secret this request was signed with, so a rotation
            // between the two cannot fail a reply the helper signed correctly.
            secret = Some(key);
        }
        Ok(Prepared {
            req,
            request_id,
            secret,
        })
    }

    /// Judges a reply's signatures (every value of [`REPLY_SIGNATURE_HEADER`]) as the
    /// configured [`ReplySignature`] asks, see [`check_reply`].
    fn reply_check(
        &self,
        request_id: &str,
        secret: Option<&[u8]>,
        signatures: &[HeaderValue],
        body: &[u8],
    ) -> Result<ReplyCheck, SignatureError> {
        let signatures: Vec<&[u8]> = signatures.iter().map(HeaderValue::as_bytes).collect();
        check_reply(
            self.reply_signature,
            secret,
            request_id.as_bytes(),
            &signatures,
            body,
        )
    }

    /// POSTs `body` once and returns the reply's body. Within the time limit, from connecting
    /// to the last byte; the reply is read incrementally and dropped as soon as it passes the
    /// size limit. A non-2xx answer is [`HelperError::Status`] with the body's `msg`; a reply
    /// whose signature is wrong, or missing where it is required, is
    /// [`HelperError::ReplySignature`] (see [`judge_answer`]).
    pub async fn send(&self, body: Bytes) -> Result<Vec<u8>, HelperError> {
        let Prepared {
            req,
            request_id,
            secret,
        } = self.request(reqwest::Method::POST, &body)?;
        let req = req.body(body);
        let work = async {
            let resp = req.send().await.map_err(|e| self.error(e))?;
            let status = resp.status().as_u16();
            let signatures = reply_signatures(&resp);
            let out = self.read_limited(resp).await?;
            let signatures: Vec<&[u8]> = signatures.iter().map(HeaderValue::as_bytes).collect();
            judge_answer(
                &Expected {
                    helper: &self.shown,
                    request_id: request_id.as_bytes(),
                    secret: secret.as_deref(),
                    reply_signature: self.reply_signature,
                },
                &Answer {
                    status,
                    signatures: &signatures,
                    body: &out,
                },
            )?;
            Ok(out)
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(HelperError::NoAnswer {
                helper: self.shown.clone(),
                timeout: self.timeout,
            }),
        }
    }

    /// Sends a signed `GET` (of an empty body) to the URL and reports the answer: any HTTP
    /// status means the webhook is reachable and, over TLS, trusted and accepting the client
    /// certificate. Nothing is provisioned.
    pub async fn probe(&self) -> Result<Probe, HelperError> {
        let started = std::time::Instant::now();
        let Prepared {
            req,
            request_id,
            secret,
        } = self.request(reqwest::Method::GET, b"")?;
        let work = async {
            let resp = req.send().await.map_err(|e| self.error(e))?;
            let status = resp.status().as_u16();
            let version = format!("{:?}", resp.version());
            let signatures = reply_signatures(&resp);
            // Read (bounded) so the connection is left clean; only its signature matters.
            let out = self.read_limited(resp).await.unwrap_or_default();
            Ok(Probe {
                status,
                version,
                elapsed: started.elapsed(),
                reply_signature: self.reply_check(
                    &request_id,
                    secret.as_deref(),
                    &signatures,
                    &out,
                ),
            })
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(HelperError::NoAnswer {
                helper: self.shown.clone(),
                timeout: self.timeout,
            }),
        }
    }

    /// Classifies a failed request: nothing sent (connect), out of time, or failed once sent.
    fn error(&self, e: reqwest::Error) -> HelperError {
        let helper = self.shown.clone();
        if e.is_timeout() {
            HelperError::NoAnswer {
                helper,
                timeout: self.timeout,
            }
        } else if e.is_connect() {
            HelperError::Connect {
                helper,
                reason: reason(e),
            }
        } else {
            HelperError::Request {
                helper,
                reason: reason(e),
            }
        }
    }

    /// The body, or [`HelperError::ReplyTooLarge`] as soon as it passes the limit (an
    /// announced length over it is refused before reading).
    async fn read_limited(&self, mut resp: reqwest::Response) -> Result<Vec<u8>, HelperError> {
        let too_large = || HelperError::ReplyTooLarge {
            helper: self.shown.clone(),
            limit: self.max_reply,
        };
        if resp
            .content_length()
            .is_some_and(|n| n > self.max_reply as u64)
        {
            return Err(too_large());
        }
        let mut out = Vec::with_capacity(
            resp.content_length()
                .map_or(4096, |n| n as usize)
                .min(self.max_reply),
        );
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.error(e))? {
            if out.len() + chunk.len() > self.max_reply {
                return Err(too_large());
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_webhook_commands_do_not() {
        for (helper, webhook) in [
            ("http://h/x", true),
            ("HTTPS://h", true),
            ("  https://h:8443/p?q=1", true),
            ("/usr/bin/helper", false),
            ("helper http://x", false),
            ("httpx://h", false),
            ("", false),
            ("http:/h", false),
        ] {
            assert_eq!(is_webhook(helper), webhook, "{helper:?}");
        }
    }

    #[test]
    fn a_shown_url_has_no_credentials_or_query() {
        assert_eq!(
            shown_text("https://u:pw@ca.example.net:8443/p?token=x#f"),
            "https://ca.example.net:8443/p"
        );
        // Also when it does not parse.
        assert_eq!(shown_text("http://u:pw@[bad/p?k=v"), "http://[bad/p");
        assert_eq!(shown_text("/usr/bin/helper --x"), "/usr/bin/helper --x");
    }

    #[test]
    fn the_signature_is_the_hmac_of_timestamp_id_and_body() {
        // Computed independently with Python's hmac module over
        // b'1700000000.0123abcd.{"identity":"n1"}'.
        assert_eq!(
            signature(b"Jefe", "1700000000", "0123abcd", br#"{"identity":"n1"}"#),
            "sha256=ab0a254b9088f58558d52b08153d59e7c0db9b411f1d8e402b9f69a167223e5e"
        );
    }

    #[test]
    fn a_non_2xx_msg_is_bounded_and_escaped() {
        assert_eq!(status_msg(br#"{"msg":"a\u0007b"}"#), "a\\u{7}b");
        assert_eq!(status_msg(b"<html>"), "");
        assert_eq!(status_msg(br#"{"msg":5}"#), "");
        let long = format!(r#"{{"msg":"{}"}}"#, "x".repeat(10_000));
        assert!(status_msg(long.as_bytes()).len() <= MAX_STATUS_MSG + 3);
    }
}
