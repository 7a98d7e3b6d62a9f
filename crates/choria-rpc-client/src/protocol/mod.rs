//! Choria protocol envelopes (version 1 and version 2), encoded and decoded in both directions.
//!
//! A Choria message is four nested documents: a transport (NATS payload) whose `data` is the
//! base64 of a secure request/reply, whose message is a request/reply envelope, whose message is
//! the agent payload. The client side builds requests ([`encode_request`]) and parses replies
//! ([`parse_reply`]); the server side parses requests ([`ServerRequest::parse`]) and builds
//! replies ([`build_reply`]). Signatures and hashes are always computed over the exact bytes that
//! get embedded, never over a re-serialisation.

mod b64;
pub mod filter;
pub mod security;

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use md5::{Digest as _, Md5};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

pub use filter::{FactFilter, Filter, Matcher, NodeInfo};
pub use security::{RequestSecurity, Security, SecurityError};

/// Protocol string of a version 1 transport.
pub const V1_TRANSPORT: &str = "choria:transport:1";
/// Protocol string of a version 1 secure request.
pub const V1_SECURE_REQUEST: &str = "choria:secure:request:1";
/// Protocol string of a version 1 request.
pub const V1_REQUEST: &str = "choria:request:1";
/// Protocol string of a version 1 reply.
pub const V1_REPLY: &str = "choria:reply:1";
/// Protocol string of a version 1 secure reply.
pub const V1_SECURE_REPLY: &str = "choria:secure:reply:1";
/// Protocol string of a version 2 transport.
pub const V2_TRANSPORT: &str = "io.choria.protocol.v2.transport";
/// Protocol string of a version 2 secure request.
pub const V2_SECURE_REQUEST: &str = "io.choria.protocol.v2.secure_request";
/// Protocol string of a version 2 request.
pub const V2_REQUEST: &str = "io.choria.protocol.v2.request";
/// Protocol string of a version 2 reply.
pub const V2_REPLY: &str = "io.choria.protocol.v2.reply";
/// Protocol string of a version 2 secure reply.
pub const V2_SECURE_REPLY: &str = "io.choria.protocol.v2.secure_reply";

/// The payload of a broadcast discovery request: the text `cGluZw==` (base64 of `ping`).
pub const DISCOVERY_PING: &[u8] = b"cGluZw==";
/// The body a server answers discovery with.
pub const DISCOVERY_PONG: &[u8] = b"pong";

/// Which generation of the Choria protocol a message uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolVersion {
    /// `choria:*:1`, x509 security (or insecure).
    V1,
    /// `io.choria.protocol.v2.*`, ed25519 and JWT security.
    V2,
}

/// Why a message could not be encoded, decoded or trusted.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A layer is not valid JSON or does not have the expected shape.
    #[error("invalid {layer} json: {source}")]
    Json {
        /// The layer that failed (`transport`, `secure request`, ...).
        layer: &'static str,
        /// The decoder's error.
        #[source]
        source: JsonError,
    },
    /// A layer carries a protocol string this layer does not accept.
    #[error("unexpected protocol {found:?} in {layer}")]
    Protocol {
        /// The layer.
        layer: &'static str,
        /// The protocol string found.
        found: String,
    },
    /// A base64 field could not be decoded.
    #[error("invalid base64 in {layer}")]
    Base64 {
        /// The layer.
        layer: &'static str,
    },
    /// A field holding text is not UTF-8.
    #[error("{layer} is not valid utf-8")]
    Utf8 {
        /// The layer.
        layer: &'static str,
    },
    /// A layer violates the go-choria JSON schema.
    #[error("{layer} failed schema validation: {reason}")]
    Schema {
        /// The layer.
        layer: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The secure reply's hash does not match its message.
    #[error("reply hash does not match its message")]
    HashMismatch,
    /// A signature or certificate check failed, or signing was impossible.
    #[error("security check failed: {0}")]
    Security(String),
}

/// What the JSON decoder said about a message, in one line of at most [`JsonError::MAX`] bytes.
///
/// The decoder's own message goes on to quote the input around the fault (a request's token,
/// a node's facts): only its first line, the fault and its position, is kept, so that a hostile
/// message can neither leak a secret into a log nor flood it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct JsonError(String);

impl JsonError {
    /// The longest message kept, in bytes.
    pub const MAX: usize = 200;
}

impl From<&sonic_rs::Error> for JsonError {
    fn from(e: &sonic_rs::Error) -> Self {
        let full = e.to_string();
        let line = full.lines().next().unwrap_or_default();
        let mut end = line.len().min(Self::MAX);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        JsonError(line[..end].to_string())
    }
}

impl ProtocolError {
    fn json(layer: &'static str) -> impl FnOnce(sonic_rs::Error) -> Self {
        move |e| ProtocolError::Json {
            layer,
            source: JsonError::from(&e),
        }
    }

    fn schema(layer: &'static str, reason: impl Into<String>) -> Self {
        ProtocolError::Schema {
            layer,
            reason: reason.into(),
        }
    }
}

/// A fresh request id: a v4 UUID without dashes (32 lower-case hex characters), as go-choria
/// makes for v1 and as v2 accepts.
pub fn new_request_id() -> String {
    random_uuid().simple().to_string()
}

/// A v4 UUID from the thread's CSPRNG (ChaCha, seeded and reseeded from the OS) rather than a
/// system call per id: ids are made for every request and every event.
pub fn random_uuid() -> uuid::Uuid {
    uuid::Builder::from_random_bytes(rand::random()).into_uuid()
}

/// Lower-case hex MD5 of a caller id, the `H` of reply subjects.
pub fn caller_hash(caller_id: &str) -> String {
    hex::encode(Md5::digest(caller_id.as_bytes()))
}

/// `<collective>.reply.<md5hex(caller_id)>`: the prefix under which all of a caller's replies
/// arrive.
pub fn reply_prefix(collective: &str, caller_id: &str) -> String {
    format!("{collective}.reply.{}", caller_hash(caller_id))
}

/// `<collective>.reply.<md5hex(caller_id)>.<request_id>`: where servers publish a request's
/// replies.
pub fn reply_subject(collective: &str, caller_id: &str, request_id: &str) -> String {
    format!("{}.{request_id}", reply_prefix(collective, caller_id))
}

/// `<collective>.node.<identity>`: subject of a directed request.
pub fn directed_subject(collective: &str, identity: &str) -> String {
    format!("{collective}.node.{identity}")
}

/// `<collective>.broadcast.agent.<agent>`: subject of a broadcast request.
pub fn broadcast_subject(collective: &str, agent: &str) -> String {
    format!("{collective}.broadcast.agent.{agent}")
}

fn unix_nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

fn v1_time(t: SystemTime) -> i64 {
    unix_nanos(t).div_euclid(1_000_000_000)
}

// ---------------------------------------------------------------------------------------------
// Wire structs (field order follows go-choria's structs so output matches byte for byte).

/// The transport envelope as serde writes it: only the tests use it, to check [`transport_json`].
#[cfg(test)]
#[derive(Serialize)]
struct TransportOut<'a, H: Serialize> {
    protocol: &'static str,
    data: &'a str,
    headers: H,
}

#[derive(Serialize, Default, Clone, Copy)]
struct V1HeadersOut<'a> {
    #[serde(rename = "reply-to", skip_serializing_if = "Option::is_none")]
    reply_to: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mc_sender: Option<&'a str>,
}

#[derive(Serialize, Default, Clone, Copy)]
struct V2HeadersOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    reply: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sender: Option<&'a str>,
}

#[derive(Deserialize)]
struct TransportIn<'a> {
    #[serde(borrow = "'a")]
    protocol: Text<'a>,
    #[serde(borrow = "'a")]
    data: Text<'a>,
    #[serde(default)]
    headers: Option<HeadersIn>,
}

/// A JSON string read in place when it holds no escape (the transport's base64, protocol names,
/// hashes), copied only when it must be unescaped. Every reply is decoded in three layers, so
/// this saves an allocation and a copy of each large field of each layer.
struct Text<'a>(std::borrow::Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visitor<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Owned(v)))
            }
        }
        d.deserialize_str(Visitor(std::marker::PhantomData))
    }
}

impl Text<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }

    fn into_string(self) -> String {
        self.0.into_owned()
    }
}

/// The secure layer of a reply (v1 `message`, v2 `reply`), read in place where it can be.
#[derive(Deserialize)]
struct SecureReplyIn<'a> {
    #[serde(default, borrow = "'a")]
    protocol: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    message: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    reply: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    hash: Option<Text<'a>>,
}

/// Whether `hash` is the standard base64 of the SHA-256 digest of `data`, without allocating.
fn hash_matches(data: &[u8], hash: &str) -> bool {
    b64::is_encoding_of(&Sha256::digest(data), hash.as_bytes())
}

#[derive(Deserialize, Default)]
struct HeadersIn {
    #[serde(rename = "reply-to", default)]
    reply_to: Option<String>,
    #[serde(default)]
    mc_sender: Option<String>,
    #[serde(default)]
    reply: Option<String>,
    #[serde(default)]
    sender: Option<String>,
}

#[derive(Serialize)]
struct V1SecureRequestOut<'a> {
    protocol: &'static str,
    message: &'a str,
    signature: &'a str,
    pubcert: &'a str,
}

#[derive(Serialize)]
struct V1RequestOut<'a> {
    protocol: &'static str,
    message: &'a str,
    envelope: V1RequestEnvelopeOut<'a>,
}

#[derive(Serialize)]
struct V1RequestEnvelopeOut<'a> {
    requestid: &'a str,
    senderid: &'a str,
    callerid: &'a str,
    collective: &'a str,
    agent: &'a str,
    ttl: u32,
    time: i64,
    filter: &'a Filter,
}

#[derive(Serialize)]
struct V2SecureRequestOut<'a> {
    protocol: &'static str,
    request: &'a str,
    signature: &'a str,
    caller: &'a str,
}

#[derive(Serialize)]
struct V2RequestOut<'a> {
    protocol: &'static str,
    message: &'a str,
    id: &'a str,
    sender: &'a str,
    caller: &'a str,
    collective: &'a str,
    agent: &'a str,
    ttl: u32,
    time: i64,
    filter: &'a Filter,
}

#[derive(Serialize)]
struct V1ReplyOut<'a> {
    protocol: &'static str,
    message: &'a str,
    envelope: V1ReplyEnvelopeOut<'a>,
}

#[derive(Serialize)]
struct V1ReplyEnvelopeOut<'a> {
    requestid: &'a str,
    senderid: &'a str,
    agent: &'a str,
    time: i64,
}

#[derive(Serialize)]
struct V1SecureReplyOut<'a> {
    protocol: &'static str,
    message: &'a str,
    hash: &'a str,
}

#[derive(Serialize)]
struct V2ReplyOut<'a> {
    protocol: &'static str,
    message: &'a str,
    request: &'a str,
    sender: &'a str,
    agent: &'a str,
    time: i64,
}

#[derive(Serialize)]
struct V2SecureReplyOut<'a> {
    protocol: &'static str,
    reply: &'a str,
    hash: &'a str,
}

/// The secure layer of a request (replies have [`SecureReplyIn`]), read in place where it can
/// be (v1's `message` is JSON in a string, so it is unescaped into a copy).
#[derive(Deserialize)]
struct SecureIn<'a> {
    #[serde(default, borrow = "'a")]
    protocol: Option<Text<'a>>,
    // v1: the inner JSON as a string; v2: `request`.
    #[serde(default, borrow = "'a")]
    message: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    request: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    signature: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    pubcert: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    caller: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    signer: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct V1RequestIn<'a> {
    #[serde(default, borrow = "'a")]
    protocol: Option<Text<'a>>,
    /// The agent payload's base64, read in place.
    #[serde(default, borrow = "'a")]
    message: Option<Text<'a>>,
    envelope: Option<V1RequestEnvelopeIn>,
}

#[derive(Deserialize)]
struct V1RequestEnvelopeIn {
    requestid: Option<String>,
    senderid: Option<String>,
    callerid: Option<String>,
    collective: Option<String>,
    agent: Option<String>,
    ttl: Option<i64>,
    time: Option<i64>,
    filter: Option<filter::FilterIn>,
}

#[derive(Deserialize)]
struct V2RequestIn<'a> {
    #[serde(default, borrow = "'a")]
    protocol: Option<Text<'a>>,
    #[serde(default, borrow = "'a")]
    message: Option<Text<'a>>,
    id: Option<String>,
    sender: Option<String>,
    caller: Option<String>,
    collective: Option<String>,
    agent: Option<String>,
    ttl: Option<i64>,
    time: Option<i64>,
    filter: Option<filter::FilterIn>,
}

#[derive(Deserialize)]
struct V1ReplyIn<'a> {
    #[serde(borrow = "'a")]
    protocol: Text<'a>,
    message: String,
    envelope: V1ReplyEnvelopeIn,
}

#[derive(Deserialize)]
struct V1ReplyEnvelopeIn {
    requestid: String,
    senderid: String,
    #[serde(default)]
    agent: String,
    time: i64,
}

#[derive(Deserialize)]
struct V2ReplyIn<'a> {
    #[serde(borrow = "'a")]
    protocol: Text<'a>,
    #[serde(borrow = "'a")]
    message: Text<'a>,
    request: String,
    sender: String,
    #[serde(default)]
    agent: String,
    time: i64,
}

fn b64_decode(layer: &'static str, s: &str) -> Result<Vec<u8>, ProtocolError> {
    b64::decode(s.as_bytes()).ok_or(ProtocolError::Base64 { layer })
}

/// `v` as JSON, in a buffer made `capacity` bytes large at once: the envelopes' sizes are
/// known within a few hundred bytes, so they are written without growing (and copying) it.
/// sonic-rs asks for [`string_room`] of every string before writing it, so that is what a
/// capacity counts for each.
fn to_json_sized<T: Serialize>(
    layer: &'static str,
    v: &T,
    capacity: usize,
) -> Result<Vec<u8>, ProtocolError> {
    let mut out = Vec::with_capacity(capacity);
    sonic_rs::to_writer(&mut out, v).map_err(ProtocolError::json(layer))?;
    Ok(out)
}

/// Room for an envelope's own fields beside its largest value.
const ENVELOPE_SLACK: usize = 512;

/// The room sonic-rs makes sure of before it writes a string of `len` bytes: every byte escaped
/// as `\u00XX`, and the quotes. A buffer with less left grows first, copying what it holds; the
/// envelopes' buffers are dropped once the next layer is written, so the room costs no memory
/// that stays.
fn string_room(len: usize) -> usize {
    len.saturating_mul(6).saturating_add(35)
}

/// The transport envelope `{"protocol":..,"data":..,"headers":..}` with `data` the base64 of
/// `secure`, written straight into the one buffer: the same bytes as serialising
/// [`TransportOut`] (base64 needs no JSON escaping), without the intermediate base64 string
/// and its escaping pass. `headers_room` is the [`string_room`] of the headers' strings.
fn transport_json<H: Serialize>(
    protocol: &'static str,
    secure: &[u8],
    headers: &H,
    headers_room: usize,
) -> Result<Vec<u8>, ProtocolError> {
    let encoded = b64::encoded_len(secure.len()).ok_or_else(|| {
        ProtocolError::schema(
            "transport",
            "secure request too large to encode".to_string(),
        )
    })?;
    let mut out = Vec::with_capacity(encoded + headers_room + ENVELOPE_SLACK);
    out.extend_from_slice(b"{\"protocol\":");
    sonic_rs::to_writer(&mut out, protocol).map_err(ProtocolError::json("transport"))?;
    out.extend_from_slice(b",\"data\":\"");
    b64::encode_into(secure, &mut out);
    out.extend_from_slice(b"\",\"headers\":");
    sonic_rs::to_writer(&mut out, headers).map_err(ProtocolError::json("transport"))?;
    out.push(b'}');
    Ok(out)
}

fn non_empty(layer: &'static str, field: &str, v: Option<String>) -> Result<String, ProtocolError> {
    match v {
        Some(s) if !s.is_empty() => Ok(s),
        Some(_) => Err(ProtocolError::schema(layer, format!("{field} is empty"))),
        None => Err(ProtocolError::schema(layer, format!("{field} is required"))),
    }
}

/// [`non_empty`] for a field read in place.
fn non_empty_text<'a>(
    layer: &'static str,
    field: &str,
    v: Option<Text<'a>>,
) -> Result<Text<'a>, ProtocolError> {
    match v {
        Some(s) if !s.as_str().is_empty() => Ok(s),
        Some(_) => Err(ProtocolError::schema(layer, format!("{field} is empty"))),
        None => Err(ProtocolError::schema(layer, format!("{field} is required"))),
    }
}

fn required<T>(layer: &'static str, field: &str, v: Option<T>) -> Result<T, ProtocolError> {
    v.ok_or_else(|| ProtocolError::schema(layer, format!("{field} is required")))
}

fn parse_transport(bytes: &[u8]) -> Result<(ProtocolVersion, Vec<u8>, HeadersIn), ProtocolError> {
    let t: TransportIn<'_> =
        sonic_rs::from_slice(bytes).map_err(ProtocolError::json("transport"))?;
    let version = match t.protocol.as_str() {
        V1_TRANSPORT => ProtocolVersion::V1,
        V2_TRANSPORT => ProtocolVersion::V2,
        other => {
            return Err(ProtocolError::Protocol {
                layer: "transport",
                found: crate::text::bounded(other),
            })
        }
    };
    let data = b64_decode("transport", t.data.as_str())?;
    Ok((version, data, t.headers.unwrap_or_default()))
}

fn check_protocol(
    layer: &'static str,
    found: Option<&str>,
    want: &str,
) -> Result<(), ProtocolError> {
    match found {
        Some(p) if p == want => Ok(()),
        Some(p) => Err(ProtocolError::Protocol {
            layer,
            found: crate::text::bounded(p),
        }),
        None => Err(ProtocolError::schema(layer, "protocol is required")),
    }
}

// ---------------------------------------------------------------------------------------------
// Client side: requests out.

/// What a client wants to send; the protocol layers are added by [`encode_request`].
#[derive(Debug, Clone, Copy)]
pub struct OutgoingRequest<'a> {
    /// Target agent (`rpcutil`, `choria_provision`, `discovery`...).
    pub agent: &'a str,
    /// Collective the request is published in.
    pub collective: &'a str,
    /// The agent payload: MCollective RPC JSON, or [`DISCOVERY_PING`].
    pub payload: &'a [u8],
    /// Which nodes should act on it.
    pub filter: &'a Filter,
    /// Request time to live in seconds (v1 requires at least 30).
    pub ttl: u32,
    /// The sender's configured identity.
    pub sender: &'a str,
    /// Request id, see [`new_request_id`].
    pub id: &'a str,
    /// Reply subject, see [`reply_subject`].
    pub reply_to: &'a str,
}

/// Encode a request in the protocol version `security` selects, signing the exact request bytes
/// that are embedded. `now` becomes the request time.
pub fn encode_request(
    security: &Security,
    req: &OutgoingRequest<'_>,
    now: SystemTime,
) -> Result<Bytes, ProtocolError> {
    match security.version() {
        ProtocolVersion::V1 => {
            let message = std::str::from_utf8(req.payload)
                .map_err(|_| ProtocolError::Utf8 { layer: "request" })?;
            let request = to_json_sized(
                "request",
                &V1RequestOut {
                    protocol: V1_REQUEST,
                    message,
                    envelope: V1RequestEnvelopeOut {
                        requestid: req.id,
                        senderid: req.sender,
                        callerid: security.caller_id(),
                        collective: req.collective,
                        agent: req.agent,
                        ttl: req.ttl,
                        time: v1_time(now),
                        filter: req.filter,
                    },
                },
                string_room(message.len()) + ENVELOPE_SLACK,
            )?;
            let (signature, pubcert) = security.sign_v1(req.agent, &request)?;
            // serde_json output is always UTF-8.
            let request_str = std::str::from_utf8(&request)
                .map_err(|_| ProtocolError::Utf8 { layer: "request" })?;
            let secure = to_json_sized(
                "secure request",
                &V1SecureRequestOut {
                    protocol: V1_SECURE_REQUEST,
                    message: request_str,
                    signature: &signature,
                    pubcert,
                },
                string_room(request_str.len())
                    + string_room(signature.len())
                    + string_room(pubcert.len())
                    + ENVELOPE_SLACK,
            )?;
            let t = transport_json(
                V1_TRANSPORT,
                &secure,
                &V1HeadersOut {
                    reply_to: Some(req.reply_to),
                    mc_sender: Some(req.sender),
                },
                string_room(req.reply_to.len()) + string_room(req.sender.len()),
            )?;
            Ok(Bytes::from(t))
        }
        ProtocolVersion::V2 => {
            let message = b64::encode(req.payload);
            let request = to_json_sized(
                "request",
                &V2RequestOut {
                    protocol: V2_REQUEST,
                    message: &message,
                    id: req.id,
                    sender: req.sender,
                    caller: security.caller_id(),
                    collective: req.collective,
                    agent: req.agent,
                    ttl: req.ttl,
                    time: unix_nanos(now),
                    filter: req.filter,
                },
                string_room(message.len()) + ENVELOPE_SLACK,
            )?;
            let (signature, jwt) = security.sign_v2(&request)?;
            let request_b64 = b64::encode(&request);
            let signature_b64 = b64::encode(&signature);
            let secure = to_json_sized(
                "secure request",
                &V2SecureRequestOut {
                    protocol: V2_SECURE_REQUEST,
                    request: &request_b64,
                    signature: &signature_b64,
                    caller: jwt,
                },
                string_room(request_b64.len())
                    + string_room(signature_b64.len())
                    + string_room(jwt.len())
                    + ENVELOPE_SLACK,
            )?;
            let t = transport_json(
                V2_TRANSPORT,
                &secure,
                &V2HeadersOut {
                    reply: Some(req.reply_to),
                    sender: Some(req.sender),
                },
                string_room(req.reply_to.len()) + string_room(req.sender.len()),
            )?;
            Ok(Bytes::from(t))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Client side: replies in.

/// A decoded and hash-checked reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Protocol generation of the reply.
    pub version: ProtocolVersion,
    /// The request id the reply answers.
    pub request_id: String,
    /// The replying server's identity from the reply envelope.
    pub sender: String,
    /// The transport header sender (`mc_sender` / `sender`), if any.
    pub transport_sender: Option<String>,
    /// Agent that replied.
    pub agent: String,
    /// Reply time (v1: Unix seconds, v2: Unix nanoseconds).
    pub time: i64,
    /// The agent's reply body (RPC reply JSON, or `pong` for discovery).
    pub body: Vec<u8>,
}

/// Decode a reply transport, verify the secure reply's SHA-256 hash and return the reply.
pub fn parse_reply(bytes: &[u8]) -> Result<Reply, ProtocolError> {
    let (version, data, headers) = parse_transport(bytes)?;
    let secure: SecureReplyIn<'_> =
        sonic_rs::from_slice(&data).map_err(ProtocolError::json("secure reply"))?;
    let protocol = secure.protocol.as_ref().map(Text::as_str);
    match version {
        ProtocolVersion::V1 => {
            check_protocol("secure reply", protocol, V1_SECURE_REPLY)?;
            let message = required("secure reply", "message", secure.message)?;
            let hash = required("secure reply", "hash", secure.hash)?;
            if !hash_matches(message.as_str().as_bytes(), hash.as_str()) {
                return Err(ProtocolError::HashMismatch);
            }
            let r: V1ReplyIn<'_> =
                sonic_rs::from_str(message.as_str()).map_err(ProtocolError::json("reply"))?;
            check_protocol("reply", Some(r.protocol.as_str()), V1_REPLY)?;
            Ok(Reply {
                version,
                request_id: r.envelope.requestid,
                sender: r.envelope.senderid,
                transport_sender: headers.mc_sender,
                agent: r.envelope.agent,
                time: r.envelope.time,
                body: r.message.into_bytes(),
            })
        }
        ProtocolVersion::V2 => {
            check_protocol("secure reply", protocol, V2_SECURE_REPLY)?;
            let reply_b64 = required("secure reply", "reply", secure.reply)?;
            let hash = required("secure reply", "hash", secure.hash)?;
            let reply = b64_decode("secure reply", reply_b64.as_str())?;
            if !hash_matches(&reply, hash.as_str()) {
                return Err(ProtocolError::HashMismatch);
            }
            let r: V2ReplyIn<'_> =
                sonic_rs::from_slice(&reply).map_err(ProtocolError::json("reply"))?;
            check_protocol("reply", Some(r.protocol.as_str()), V2_REPLY)?;
            Ok(Reply {
                version,
                request_id: r.request,
                sender: r.sender,
                transport_sender: headers.sender,
                agent: r.agent,
                time: r.time,
                body: b64_decode("reply", r.message.as_str())?,
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Server side: requests in.

/// Entry point for the server side of the protocol.
pub struct ServerRequest;

impl ServerRequest {
    /// Parse and schema-check a request transport the way a go-choria server does (§2.8 steps
    /// 1, 3 and 5): the security check, the filter match and the TTL window are left to the
    /// caller ([`Request::verify`], [`Filter::matches`], [`Request::is_fresh`]).
    pub fn parse(bytes: &[u8]) -> Result<Request, ProtocolError> {
        let (version, data, headers) = parse_transport(bytes)?;
        let secure: SecureIn =
            sonic_rs::from_slice(&data).map_err(ProtocolError::json("secure request"))?;
        match version {
            ProtocolVersion::V1 => parse_v1_request(secure, headers),
            ProtocolVersion::V2 => parse_v2_request(secure, headers),
        }
    }
}

/// A request as a server sees it after parsing and schema validation.
#[derive(Debug, Clone)]
pub struct Request {
    /// Protocol generation.
    pub version: ProtocolVersion,
    /// Request id (32 characters in v1).
    pub id: String,
    /// Target agent.
    pub agent: String,
    /// Collective the request was sent in.
    pub collective: String,
    /// Caller id (`choria=<certname>` in v1 x509, the JWT `callerid` in v2).
    pub caller: String,
    /// The sending client's identity.
    pub sender: String,
    /// Where the reply must be published; a request without it cannot be answered.
    pub reply_to: Option<String>,
    /// Time to live in seconds.
    pub ttl: i64,
    /// Request time: Unix seconds in v1, Unix nanoseconds in v2.
    pub time: i64,
    /// The node filter.
    pub filter: Filter,
    /// The agent payload after the base64 step of go-choria (discovery's `cGluZw==` becomes
    /// `ping`, RPC JSON passes through unchanged).
    pub payload: Vec<u8>,
    /// The exact request JSON bytes the signature covers.
    pub signed_bytes: Vec<u8>,
    /// Signature material carried by the secure request.
    pub security: RequestSecurity,
}

impl Request {
    /// Request time in Unix nanoseconds, whatever the version.
    pub fn time_nanos(&self) -> i64 {
        match self.version {
            ProtocolVersion::V1 => self.time.saturating_mul(1_000_000_000),
            ProtocolVersion::V2 => self.time,
        }
    }

    /// go-choria's TTL window: `now - ttl < time < now + ttl`, both bounds exclusive.
    pub fn is_fresh(&self, now: SystemTime) -> bool {
        let now = unix_nanos(now);
        let ttl = self.ttl.saturating_mul(1_000_000_000);
        let t = self.time_nanos();
        now.saturating_sub(ttl) < t && t < now.saturating_add(ttl)
    }

    /// Verify the request's signature: v1 x509 (RSA PKCS#1 v1.5 SHA-256 with the embedded
    /// certificate's key), v2 ed25519 with the caller JWT's `public_key` claim. Certificate
    /// chains and JWT issuers are not checked (see [`security`] for what is and is not).
    pub fn verify(&self) -> Result<(), ProtocolError> {
        security::verify_request(self)
    }

    /// The first `ping`/RPC body decoded as UTF-8, lossily, for logging.
    pub fn payload_lossy(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.payload)
    }
}

/// go-choria's payload step: the base64 decoding of a message if it is valid standard base64
/// and not empty; `None` when the message is to be used as it is.
fn decode_payload(message: &[u8]) -> Option<Vec<u8>> {
    if message.is_empty() {
        return None;
    }
    b64::decode(message)
}

fn parse_v1_request(secure: SecureIn<'_>, headers: HeadersIn) -> Result<Request, ProtocolError> {
    const SL: &str = "secure request";
    check_protocol(
        SL,
        secure.protocol.as_ref().map(Text::as_str),
        V1_SECURE_REQUEST,
    )?;
    let message = non_empty_text(SL, "message", secure.message)?.into_string();
    let signature = non_empty_text(SL, "signature", secure.signature)?.into_string();
    let pubcert = non_empty_text(SL, "pubcert", secure.pubcert)?.into_string();

    const L: &str = "request";
    let r: V1RequestIn<'_> = sonic_rs::from_str(&message).map_err(ProtocolError::json(L))?;
    check_protocol(L, r.protocol.as_ref().map(Text::as_str), V1_REQUEST)?;
    let body = non_empty_text(L, "message", r.message)?;
    let payload = decode_payload(body.as_str().as_bytes())
        .unwrap_or_else(|| body.as_str().as_bytes().to_vec());
    let env = required(L, "envelope", r.envelope)?;
    let id = required(L, "envelope.requestid", env.requestid)?;
    if id.chars().count() != 32 {
        return Err(ProtocolError::schema(
            L,
            format!(
                "requestid must be 32 characters, got {}",
                id.chars().count()
            ),
        ));
    }
    let sender = required(L, "envelope.senderid", env.senderid)?;
    let caller = non_empty(L, "envelope.callerid", env.callerid)?;
    let collective = non_empty(L, "envelope.collective", env.collective)?;
    let agent = non_empty(L, "envelope.agent", env.agent)?;
    let ttl = required(L, "envelope.ttl", env.ttl)?;
    if ttl < 30 {
        return Err(ProtocolError::schema(L, format!("ttl {ttl} is below 30")));
    }
    let time = required(L, "envelope.time", env.time)?;
    let filter = required(L, "envelope.filter", env.filter)?.into_filter(L)?;

    Ok(Request {
        version: ProtocolVersion::V1,
        id,
        agent,
        collective,
        caller,
        sender,
        reply_to: headers.reply_to.filter(|s| !s.is_empty()),
        ttl,
        time,
        filter,
        payload,
        signed_bytes: message.into_bytes(),
        security: RequestSecurity::V1 { signature, pubcert },
    })
}

fn parse_v2_request(secure: SecureIn<'_>, headers: HeadersIn) -> Result<Request, ProtocolError> {
    const SL: &str = "secure request";
    check_protocol(
        SL,
        secure.protocol.as_ref().map(Text::as_str),
        V2_SECURE_REQUEST,
    )?;
    let request = b64_decode(SL, non_empty_text(SL, "request", secure.request)?.as_str())?;
    let signature = b64_decode(
        SL,
        non_empty_text(SL, "signature", secure.signature)?.as_str(),
    )?;
    if signature.is_empty() {
        return Err(ProtocolError::schema(SL, "signature is empty"));
    }
    let caller_jwt = non_empty_text(SL, "caller", secure.caller)?.into_string();

    const L: &str = "request";
    let r: V2RequestIn<'_> = sonic_rs::from_slice(&request).map_err(ProtocolError::json(L))?;
    check_protocol(L, r.protocol.as_ref().map(Text::as_str), V2_REQUEST)?;
    let body = b64_decode(L, required(L, "message", r.message)?.as_str())?;
    let id = non_empty(L, "id", r.id)?;
    let sender = required(L, "sender", r.sender)?;
    let caller = non_empty(L, "caller", r.caller)?;
    let collective = non_empty(L, "collective", r.collective)?;
    let agent = non_empty(L, "agent", r.agent)?;
    let ttl = required(L, "ttl", r.ttl)?;
    if ttl < 1 {
        return Err(ProtocolError::schema(L, format!("ttl {ttl} is below 1")));
    }
    let time = required(L, "time", r.time)?;
    let filter = match r.filter {
        Some(f) => f.into_filter(L)?,
        None => Filter::default(),
    };

    Ok(Request {
        version: ProtocolVersion::V2,
        id,
        agent,
        collective,
        caller,
        sender,
        reply_to: headers.reply.filter(|s| !s.is_empty()),
        ttl,
        time,
        filter,
        payload: decode_payload(&body).unwrap_or(body),
        signed_bytes: request,
        security: RequestSecurity::V2 {
            signature,
            caller_jwt,
            signer_jwt: secure
                .signer
                .map(Text::into_string)
                .filter(|s| !s.is_empty()),
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Server side: replies out.

/// Build the reply transport a go-choria server would publish for `request`, with
/// `sender_identity` as the replying node and `body` as the agent's reply (RPC reply JSON or
/// [`DISCOVERY_PONG`]), in the request's protocol version. Replies are hashed, not signed.
pub fn build_reply(
    request: &Request,
    sender_identity: &str,
    body: &[u8],
) -> Result<Bytes, ProtocolError> {
    build_reply_at(request, sender_identity, body, SystemTime::now())
}

/// [`build_reply`] with an explicit reply time.
pub fn build_reply_at(
    request: &Request,
    sender_identity: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<Bytes, ProtocolError> {
    build_reply_raw(
        request.version,
        &request.id,
        &request.agent,
        sender_identity,
        body,
        now,
    )
}

/// Build a reply transport from its parts; useful to craft replies without a parsed request.
pub fn build_reply_raw(
    version: ProtocolVersion,
    request_id: &str,
    agent: &str,
    sender_identity: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<Bytes, ProtocolError> {
    match version {
        ProtocolVersion::V1 => {
            // Go converts the body with string(body); JSON and `pong` are UTF-8 anyway.
            let message = String::from_utf8_lossy(body);
            let reply = to_json_sized(
                "reply",
                &V1ReplyOut {
                    protocol: V1_REPLY,
                    message: &message,
                    envelope: V1ReplyEnvelopeOut {
                        requestid: request_id,
                        senderid: sender_identity,
                        agent,
                        time: v1_time(now),
                    },
                },
                string_room(message.len()) + ENVELOPE_SLACK,
            )?;
            let hash = b64::encode(&Sha256::digest(&reply));
            let reply_str =
                std::str::from_utf8(&reply).map_err(|_| ProtocolError::Utf8 { layer: "reply" })?;
            let secure = to_json_sized(
                "secure reply",
                &V1SecureReplyOut {
                    protocol: V1_SECURE_REPLY,
                    message: reply_str,
                    hash: &hash,
                },
                string_room(reply_str.len()) + string_room(hash.len()) + ENVELOPE_SLACK,
            )?;
            Ok(Bytes::from(transport_json(
                V1_TRANSPORT,
                &secure,
                &V1HeadersOut {
                    reply_to: None,
                    mc_sender: Some(sender_identity),
                },
                string_room(sender_identity.len()),
            )?))
        }
        ProtocolVersion::V2 => {
            let message = b64::encode(body);
            let reply = to_json_sized(
                "reply",
                &V2ReplyOut {
                    protocol: V2_REPLY,
                    message: &message,
                    request: request_id,
                    sender: sender_identity,
                    agent,
                    time: unix_nanos(now),
                },
                string_room(message.len()) + ENVELOPE_SLACK,
            )?;
            let hash = b64::encode(&Sha256::digest(&reply));
            let reply_b64 = b64::encode(&reply);
            let secure = to_json_sized(
                "secure reply",
                &V2SecureReplyOut {
                    protocol: V2_SECURE_REPLY,
                    reply: &reply_b64,
                    hash: &hash,
                },
                string_room(reply_b64.len()) + string_room(hash.len()) + ENVELOPE_SLACK,
            )?;
            Ok(Bytes::from(transport_json(
                V2_TRANSPORT,
                &secure,
                &V2HeadersOut {
                    reply: None,
                    sender: Some(sender_identity),
                },
                string_room(sender_identity.len()),
            )?))
        }
    }
}

#[cfg(test)]
mod tests;
