//! RPC, discovery and lifecycle against a real nats-server, with test responders built on the
//! crate's own server-side protocol API.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::engine::general_purpose::{STANDARD as B64, URL_SAFE_NO_PAD};
use base64::Engine as _;
use bytes::Bytes;
use choria_rpc_client::connection::{self, ConnectionSettings};
use choria_rpc_client::lifecycle::{EventFormat, LifecycleEvent};
use choria_rpc_client::mcorpc::{RpcReply, RpcRequest, StatusCode};
use choria_rpc_client::protocol::{
    self, build_reply, build_reply_raw, ProtocolVersion, Request, Security, ServerRequest,
};
use choria_rpc_client::rpc::{RequestErrorKind, RpcClient, RpcOptions};
use futures::StreamExt as _;
use sha2::Digest as _;
use test_support::NatsServer;

const IDENTITY: &str = "provisioner.example.net";

/// What a responder sends back for one request to one node: zero or more raw transports.
type Handler = Arc<dyn Fn(&Request, &str) -> Vec<Bytes> + Send + Sync>;

fn settings(url: &str) -> ConnectionSettings {
    ConnectionSettings {
        urls: vec![url.to_string()],
        srv: None,
        name: IDENTITY.to_string(),
        user_password: None,
        token: None,
        jwt_auth: None,
        credentials: None,
        tls: None,
        connect_timeout: Duration::from_secs(2),
        inbox_prefix: "provisioning.reply".to_string(),
        subscription_capacity: choria_rpc_client::connection::SUBSCRIPTION_CAPACITY,
    }
}

async fn client(server: &NatsServer, security: Security) -> RpcClient {
    client_with(server, security, RpcOptions::new(IDENTITY, "provisioning")).await
}

async fn client_with(server: &NatsServer, security: Security, opts: RpcOptions) -> RpcClient {
    let nc = connection::connect(&settings(&server.url())).await.unwrap();
    RpcClient::new(nc, security, opts).await.unwrap()
}

/// A new connection tries its broker at once. async-nats counts a connection's first try as
/// attempt 1 and sleeps what the delay callback says before it; the callback answered as for a
/// reconnection (at least 750 ms), so every daemon start and every CLI command waited about a
/// second before its first connection.
#[tokio::test]
async fn a_new_connection_does_not_wait_before_its_first_try() {
    let server = NatsServer::start();
    for _ in 0..3 {
        let started = Instant::now();
        let nc = connection::connect(&settings(&server.url())).await.unwrap();
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(600),
            "connecting took {took:?}: the shortest pause before a reconnection is 750 ms"
        );
        drop(nc);
    }
}

/// Serve `identities` in the `provisioning` collective: directed requests on
/// `provisioning.node.<identity>`, broadcasts on behalf of every identity.
async fn responder(server: &NatsServer, identities: Vec<String>, handler: Handler) {
    let nc = async_nats::connect(server.url()).await.unwrap();
    responder_on(nc, identities, handler).await
}

/// [`responder`] on a given connection.
async fn responder_on(nc: async_nats::Client, identities: Vec<String>, handler: Handler) {
    let mut directed = nc.subscribe("provisioning.node.>").await.unwrap();
    let mut broadcast = nc
        .subscribe("provisioning.broadcast.agent.*")
        .await
        .unwrap();
    connection::round_trip(&nc, Duration::from_secs(5))
        .await
        .unwrap();
    let known: Arc<HashSet<String>> = Arc::new(identities.iter().cloned().collect());
    let ids = Arc::new(identities);
    tokio::spawn(async move {
        loop {
            let (msg, targets): (async_nats::Message, Vec<String>) = tokio::select! {
                Some(m) = directed.next() => {
                    let id = m.subject.as_str().strip_prefix("provisioning.node.").unwrap_or_default().to_string();
                    if !known.contains(&id) { continue; }
                    (m, vec![id])
                }
                Some(m) = broadcast.next() => (m, ids.as_ref().clone()),
                else => return,
            };
            let Ok(req) = ServerRequest::parse(&msg.payload) else {
                continue;
            };
            if !req.is_fresh(SystemTime::now()) {
                continue;
            }
            let Some(reply_to) = req.reply_to.clone() else {
                continue;
            };
            for node in targets {
                for out in handler(&req, &node) {
                    nc.publish(reply_to.clone(), out).await.unwrap();
                }
            }
        }
    });
}

/// An agent that answers discovery with `pong` and RPC with `{"echo": <data>, "node": ...}`,
/// or the statuscode asked for in `data.fail`.
fn echo_agent(require_verified: bool) -> Handler {
    Arc::new(move |req, node| {
        if require_verified && req.verify().is_err() {
            return vec![];
        }
        if req.agent == "discovery" {
            assert_eq!(req.payload, b"ping");
            return vec![build_reply(req, node, protocol::DISCOVERY_PONG).unwrap()];
        }
        let body = RpcRequest::parse(&req.payload).unwrap();
        let reply = match body.data.get("fail").and_then(|f| f.as_i64()) {
            Some(code) => RpcReply::error(
                &body.action,
                StatusCode::from_code(code).unwrap(),
                body.data["msg"].as_str().unwrap_or("failed"),
            ),
            None if body.action == "inventory" => RpcReply::ok(
                "inventory",
                serde_json::json!({
                    "agents": ["choria_provision", "rpcutil"], "classes": [], "collectives": ["provisioning"],
                    "data_plugins": [], "facts": {"node": node}, "machines": [], "main_collective": "provisioning",
                    "version": "0.30.0", "upgradable": true,
                }),
            ),
            None => RpcReply::ok(
                &body.action,
                serde_json::json!({"echo": body.data, "node": node, "caller": req.caller}),
            ),
        };
        vec![build_reply(req, node, &reply.to_vec().unwrap()).unwrap()]
    })
}

fn nodes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node{i}.example.net")).collect()
}

async fn round_trip(security: Security, require_verified: bool) {
    let server = NatsServer::start();
    responder(&server, nodes(3), echo_agent(require_verified)).await;
    let rpc = client(&server, security.clone()).await;
    let data = rpc
        .call(
            "node1.example.net",
            "choria_provision",
            "ping",
            &serde_json::json!({"x": 1}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(data["echo"]["x"], 1);
    assert_eq!(data["node"], "node1.example.net");
    assert_eq!(data["caller"], security.caller_id());
    let inv = rpc
        .inventory("node2.example.net", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(inv.version, "0.30.0");
    assert!(inv.upgradable);
    assert_eq!(inv.raw["facts"]["node"], "node2.example.net");
    let found = rpc.discover_provisionable().await.unwrap();
    assert_eq!(found.len(), 3);
    assert_eq!(rpc.pending(), 0);
    assert_eq!(rpc.stats().dropped(), 0);
}

#[tokio::test]
async fn v1_insecure_request_reply() {
    round_trip(Security::insecure("choria=provisioner.mcollective"), false).await;
}

fn rsa_cert() -> (String, String) {
    use der::EncodePem as _;
    use rsa::pkcs8::EncodePrivateKey as _;
    use std::str::FromStr as _;
    use x509_cert::builder::{Builder as _, CertificateBuilder, Profile};
    let key = rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 1024).unwrap();
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key.clone());
    let spki = x509_cert::spki::SubjectPublicKeyInfoOwned::from_key(key.to_public_key()).unwrap();
    let builder = CertificateBuilder::new(
        Profile::Root,
        x509_cert::serial_number::SerialNumber::from(7u32),
        x509_cert::time::Validity::from_now(Duration::from_secs(3600)).unwrap(),
        x509_cert::name::Name::from_str("CN=provisioner.mcollective").unwrap(),
        spki,
        &signer,
    )
    .unwrap();
    let cert = builder.build::<rsa::pkcs1v15::Signature>().unwrap();
    (
        cert.to_pem(der::pem::LineEnding::LF).unwrap(),
        key.to_pkcs8_pem(der::pem::LineEnding::LF)
            .unwrap()
            .to_string(),
    )
}

#[tokio::test]
async fn v1_x509_signed_request_reply() {
    let (cert, key) = rsa_cert();
    let sec = Security::x509_from_pem("choria=provisioner.mcollective", cert, &key).unwrap();
    round_trip(sec, true).await;
}

fn choria_security() -> Security {
    let seed: [u8; 32] = rand::random();
    let pk = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
    let claims =
        serde_json::json!({"callerid": "up=provisioner", "public_key": hex::encode(pk.as_bytes())});
    let jwt = format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"EdDSA","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(b"sig")
    );
    Security::choria(jwt, seed).unwrap()
}

#[tokio::test]
async fn v2_signed_request_reply() {
    let sec = choria_security();
    assert_eq!(sec.version(), ProtocolVersion::V2);
    round_trip(sec, true).await;
}

#[tokio::test]
async fn status_codes_map_to_typed_errors() {
    let server = NatsServer::start();
    responder(&server, nodes(1), echo_agent(false)).await;
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let status = |code, message: &str| RequestErrorKind::Status {
        code,
        message: message.to_string(),
    };
    for (code, msg, kind) in [
        (1, "nope", status(StatusCode::Aborted, "nope")),
        (
            1,
            "Could not obtain provisioning lock",
            RequestErrorKind::ProvisioningLocked,
        ),
        (
            2,
            "Unknown action",
            status(StatusCode::UnknownAction, "Unknown action"),
        ),
        (3, "missing", status(StatusCode::MissingData, "missing")),
        (4, "invalid", status(StatusCode::InvalidData, "invalid")),
        (5, "boom", status(StatusCode::UnknownError, "boom")),
    ] {
        let err = rpc
            .call(
                "node0.example.net",
                "choria_provision",
                "jwt",
                &serde_json::json!({"fail": code, "msg": msg}),
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), &kind, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("node0.example.net") && text.contains("choria_provision#jwt"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn discovery_of_hundreds_ends_with_the_sliding_window() {
    let server = NatsServer::start();
    let count = 600;
    let last_reply = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let lr = last_reply.clone();
    let agent = echo_agent(false);
    let handler: Handler = Arc::new(move |req, node| {
        let out = agent(req, node);
        *lr.lock().unwrap() = Some(Instant::now());
        // Every node answers twice: the result must still list it once.
        let mut twice = out.clone();
        twice.extend(out);
        twice
    });
    responder(&server, nodes(count), handler).await;
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let start = Instant::now();
    let found = rpc.discover_provisionable().await.unwrap();
    let end = Instant::now();
    assert_eq!(found.len(), count);
    assert_eq!(
        found.iter().collect::<HashSet<_>>().len(),
        count,
        "duplicates in result"
    );
    let last = last_reply.lock().unwrap().unwrap();
    let after_last = end.duration_since(last);
    assert!(
        after_last >= Duration::from_millis(280),
        "ended {after_last:?} after the last reply"
    );
    assert!(
        after_last < Duration::from_millis(1200),
        "window did not end discovery early: {after_last:?} after the last reply"
    );
    assert!(end.duration_since(start) < Duration::from_millis(1900));
    assert_eq!(rpc.pending(), 0);
}

/// A fleet that answers for longer than the discovery timeout (replies a little apart, each
/// within the window) is found whole; a reply after the discovery ended is counted late.
#[tokio::test]
async fn discovery_goes_on_past_its_timeout_while_replies_come_and_counts_late_ones() {
    let server = NatsServer::start();
    let nc = async_nats::connect(server.url()).await.unwrap();
    let mut broadcast = nc
        .subscribe("provisioning.broadcast.agent.*")
        .await
        .unwrap();
    connection::round_trip(&nc, Duration::from_secs(5))
        .await
        .unwrap();
    let count = 30;
    let (late_tx, late_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let msg = broadcast.next().await.unwrap();
        let req = ServerRequest::parse(&msg.payload).unwrap();
        let reply_to = req.reply_to.clone().unwrap();
        // 30 replies 50 ms apart: 1.5 s of answers against a 400 ms timeout.
        for node in nodes(count) {
            let out = build_reply(&req, &node, protocol::DISCOVERY_PONG).unwrap();
            nc.publish(reply_to.clone(), out).await.unwrap();
            nc.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // One more once the discovery has ended.
        let _ = late_rx.await;
        let out = build_reply(&req, "late.example.net", protocol::DISCOVERY_PONG).unwrap();
        nc.publish(reply_to, out).await.unwrap();
        nc.flush().await.unwrap();
    });
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let start = Instant::now();
    let found = rpc
        .discover(
            &protocol::Filter::with_agent("choria_provision"),
            Duration::from_millis(400),
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let took = start.elapsed();
    assert_eq!(found.len(), count, "{took:?}");
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert_eq!(rpc.stats().late_discovery, 0);
    late_tx.send(()).unwrap();
    for _ in 0..100 {
        if rpc.stats().late_discovery == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = rpc.stats();
    assert_eq!((s.late_discovery, s.unexpected), (1, 1));
}

#[tokio::test]
async fn discovery_with_no_responders_ends_at_the_timeout() {
    let server = NatsServer::start();
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let start = Instant::now();
    let found = rpc
        .discover(
            &protocol::Filter::with_agent("choria_provision"),
            Duration::from_millis(400),
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(found.is_empty());
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_millis(700),
        "{took:?}"
    );
    // A broadcast carries no NATS reply subject, so the broker sends no no-responders status.
    let s = rpc.stats();
    assert_eq!((s.no_responders, s.unexpected), (0, 0));
}

fn v1_reply_with(req: &Request, reply_json: &[u8], hash_ok: bool) -> Bytes {
    let hash = if hash_ok {
        B64.encode(sha2::Sha256::digest(reply_json))
    } else {
        B64.encode([1u8; 32])
    };
    let secure = serde_json::json!({
        "protocol": "choria:secure:reply:1",
        "message": String::from_utf8(reply_json.to_vec()).unwrap(),
        "hash": hash,
    });
    let _ = req;
    Bytes::from(
        serde_json::json!({
            "protocol": "choria:transport:1",
            "data": B64.encode(secure.to_string()),
            "headers": {"mc_sender": "node0.example.net"},
        })
        .to_string(),
    )
}

#[tokio::test]
async fn malformed_replies_are_dropped_counted_and_time_out() {
    let server = NatsServer::start();
    let case = Arc::new(AtomicUsize::new(0));
    let c2 = case.clone();
    let handler: Handler = Arc::new(move |req, node| {
        let good_body = br#"{"action":"x","statuscode":0,"statusmsg":"OK","data":{}}"#;
        let reply_json = |id: &str, sender: &str, proto: &str| {
            serde_json::json!({
                "protocol": proto,
                "message": std::str::from_utf8(good_body).unwrap(),
                "envelope": {"requestid": id, "senderid": sender, "agent": req.agent, "time": 1},
            })
            .to_string()
            .into_bytes()
        };
        match c2.load(Ordering::SeqCst) {
            0 => vec![Bytes::from_static(b"this is not json")],
            1 => vec![v1_reply_with(
                req,
                &reply_json(&req.id, node, "choria:reply:9"),
                true,
            )],
            2 => vec![build_reply_raw(
                ProtocolVersion::V1,
                &protocol::new_request_id(),
                &req.agent,
                node,
                good_body,
                SystemTime::now(),
            )
            .unwrap()],
            3 => vec![build_reply(req, "impostor.example.net", good_body).unwrap()],
            4 => vec![v1_reply_with(
                req,
                &reply_json(&req.id, node, "choria:reply:1"),
                false,
            )],
            5 => {
                let big = format!(
                    r#"{{"action":"x","statuscode":0,"statusmsg":"OK","data":{{"pad":"{}"}}}}"#,
                    "a".repeat(100_000)
                );
                vec![build_reply(req, node, big.as_bytes()).unwrap()]
            }
            6 => vec![build_reply_raw(
                ProtocolVersion::V2,
                &req.id,
                &req.agent,
                node,
                good_body,
                SystemTime::now(),
            )
            .unwrap()],
            // A wrong-sender reply followed by the real one: only the real one counts.
            _ => vec![
                build_reply(req, "impostor.example.net", good_body).unwrap(),
                build_reply(req, node, good_body).unwrap(),
            ],
        }
    });
    responder(&server, nodes(1), handler).await;
    let mut opts = RpcOptions::new(IDENTITY, "provisioning");
    opts.max_reply_size = 64 * 1024;
    let rpc = client_with(&server, Security::insecure("choria=p.mcollective"), opts).await;
    type Counter = fn(&choria_rpc_client::rpc::ReplyStats) -> u64;
    let cases: [(&str, Counter); 7] = [
        ("garbage", |s| s.dropped_malformed),
        ("wrong protocol", |s| s.dropped_malformed),
        ("wrong request id", |s| s.dropped_wrong_request),
        ("wrong sender", |s| s.dropped_wrong_sender),
        ("bad hash", |s| s.dropped_malformed),
        ("oversize", |s| s.dropped_oversize),
        ("wrong version", |s| s.dropped_malformed),
    ];
    for (i, (name, counter)) in cases.iter().enumerate() {
        case.store(i, Ordering::SeqCst);
        let before = counter(&rpc.stats());
        let err = rpc
            .call(
                "node0.example.net",
                "choria_provision",
                "x",
                &serde_json::json!({}),
                Duration::from_millis(500),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), &RequestErrorKind::Timeout, "{name}: {err}");
        assert_eq!(counter(&rpc.stats()), before + 1, "{name} not counted");
        assert_eq!(rpc.pending(), 0, "{name} left a pending entry");
    }
    case.store(99, Ordering::SeqCst);
    let before = rpc.stats();
    rpc.call(
        "node0.example.net",
        "choria_provision",
        "x",
        &serde_json::json!({}),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let after = rpc.stats();
    assert_eq!(after.dropped_wrong_sender, before.dropped_wrong_sender + 1);
    assert_eq!(after.replies, before.replies + 1);
}

/// Subscribe to exactly `provisioning.node.<identity>` and never answer: a node that is
/// connected but silent. The subscription lives as long as the returned connection.
async fn silent_node(server: &NatsServer, identity: &str) -> async_nats::Client {
    let nc = async_nats::connect(server.url()).await.unwrap();
    let sub = nc
        .subscribe(format!("provisioning.node.{identity}"))
        .await
        .unwrap();
    connection::round_trip(&nc, Duration::from_secs(5))
        .await
        .unwrap();
    // Keep the subscription open without reading it.
    tokio::spawn(async move {
        let _sub = sub;
        std::future::pending::<()>().await;
    });
    nc
}

/// Serve `identity` on exactly `provisioning.node.<identity>` (as a go-choria server
/// subscribes), answering with `handler`.
async fn exact_responder(server: &NatsServer, identity: &str, handler: Handler) {
    let nc = async_nats::connect(server.url()).await.unwrap();
    let mut sub = nc
        .subscribe(format!("provisioning.node.{identity}"))
        .await
        .unwrap();
    connection::round_trip(&nc, Duration::from_secs(5))
        .await
        .unwrap();
    let node = identity.to_string();
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let Ok(req) = ServerRequest::parse(&msg.payload) else {
                continue;
            };
            // Like a go-choria server: the reply goes where the envelope says, whatever the
            // NATS reply subject.
            let Some(reply_to) = req.reply_to.clone() else {
                continue;
            };
            for out in handler(&req, &node) {
                nc.publish(reply_to.clone(), out).await.unwrap();
            }
        }
    });
}

#[tokio::test]
async fn a_node_nobody_serves_fails_at_once_with_no_responders() {
    let server = NatsServer::start();
    exact_responder(&server, "node0.example.net", echo_agent(false)).await;
    let _silent = silent_node(&server, "silent.example.net").await;
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let ping = br#"{"agent":"rpcutil","action":"ping","data":{}}"#;

    // Nobody subscribes to the node's subject: the broker says so at once, long before the
    // request's 22 s timeout.
    for i in 0..5 {
        let start = Instant::now();
        let err = rpc
            .call(
                "nobody.example.net",
                "choria_provision",
                "jwt",
                &serde_json::json!({"token": "t"}),
                Duration::from_secs(22),
            )
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert_eq!(err.kind(), &RequestErrorKind::NoResponders, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("nobody.example.net") && text.contains("choria_provision#jwt"),
            "{text}"
        );
        // Loopback answers in a few milliseconds; the bound leaves room for a loaded machine
        // and is two orders of magnitude below the timeout.
        assert!(took < Duration::from_millis(200), "try {i} took {took:?}");
    }
    let s = rpc.stats();
    assert_eq!(s.no_responders, 5);
    assert_eq!(s.timeouts, 0);
    assert_eq!(
        s.dropped(),
        0,
        "a no-responders status is not a malformed reply"
    );
    assert_eq!(s.unexpected, 0);
    assert_eq!(rpc.pending(), 0);

    // A served node on the same client still answers.
    let reply = rpc
        .request("node0.example.net", "rpcutil", ping, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(reply.sender, "node0.example.net");

    // A node that is subscribed but silent still runs into the timeout.
    let t = Duration::from_millis(400);
    let start = Instant::now();
    let err = rpc
        .request("silent.example.net", "rpcutil", ping, t)
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.kind(), &RequestErrorKind::Timeout, "{err}");
    assert!(took >= t, "{took:?}");

    let s = rpc.stats();
    assert_eq!((s.no_responders, s.timeouts, s.replies), (5, 1, 1));
    assert_eq!(s.dropped() + s.unexpected, 0);
    assert_eq!(rpc.pending(), 0);
}

#[tokio::test]
async fn directed_requests_carry_the_reply_subject_and_broadcasts_do_not() {
    let server = NatsServer::start();
    let watcher = async_nats::connect(server.url()).await.unwrap();
    let mut wire = watcher.subscribe("provisioning.node.>").await.unwrap();
    let mut wire_broadcast = watcher.subscribe("provisioning.broadcast.>").await.unwrap();
    connection::round_trip(&watcher, Duration::from_secs(5))
        .await
        .unwrap();
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    // The watcher's wildcard is interest in every node's subject: this one times out.
    let err = rpc
        .request(
            "node0.example.net",
            "rpcutil",
            b"{}",
            Duration::from_millis(100),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &RequestErrorKind::Timeout, "{err}");
    let directed = wire.next().await.unwrap();
    assert_eq!(
        directed.subject.as_str(),
        "provisioning.node.node0.example.net"
    );
    let req = ServerRequest::parse(&directed.payload).unwrap();
    let in_envelope = req.reply_to.clone().unwrap();
    assert!(in_envelope.ends_with(&req.id), "{in_envelope}");
    assert_eq!(
        directed.reply.as_ref().map(|r| r.as_str()),
        Some(in_envelope.as_str()),
        "the NATS reply subject is the envelope's reply-to"
    );

    let found = rpc
        .discover(
            &protocol::Filter::with_agent("choria_provision"),
            Duration::from_millis(100),
            None,
        )
        .await
        .unwrap();
    assert!(found.is_empty());
    let broadcast = wire_broadcast.next().await.unwrap();
    assert_eq!(
        broadcast.subject.as_str(),
        "provisioning.broadcast.agent.discovery"
    );
    assert!(broadcast.reply.is_none(), "{:?}", broadcast.reply);
    assert!(ServerRequest::parse(&broadcast.payload)
        .unwrap()
        .reply_to
        .is_some());
}

#[tokio::test]
async fn timeouts_are_honoured_and_leave_nothing_behind() {
    let server = NatsServer::start();
    // Subscribed but silent: with nobody subscribed the broker would answer no-responders.
    let _silent = silent_node(&server, "nobody.example.net").await;
    let _silent2 = silent_node(&server, "nobody").await;
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    for ms in [50u64, 200, 400] {
        let t = Duration::from_millis(ms);
        let start = Instant::now();
        let err = rpc
            .request("nobody.example.net", "rpcutil", b"{}", t)
            .await
            .unwrap_err();
        let took = start.elapsed();
        assert_eq!(err.kind(), &RequestErrorKind::Timeout);
        assert!(
            // The upper bound leaves room for a loaded CI machine; a timer that is not
            // honoured at all would take the whole test's time.
            took >= t && took < t + Duration::from_millis(400),
            "timeout {t:?} took {took:?}"
        );
    }
    assert_eq!(rpc.pending(), 0);
    assert_eq!(rpc.stats().timeouts, 3);
    // A cancelled request (future dropped) is cleaned up too.
    let fut = rpc.request("nobody", "rpcutil", b"{}", Duration::from_secs(10));
    let _ = tokio::time::timeout(Duration::from_millis(50), fut).await;
    assert_eq!(rpc.pending(), 0);
}

#[tokio::test]
async fn broker_going_away_gives_an_error_not_a_hang() {
    let mut server = NatsServer::start();
    responder(&server, nodes(1), echo_agent(false)).await;
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    rpc.request(
        "node0.example.net",
        "rpcutil",
        br#"{"agent":"rpcutil","action":"ping","data":{}}"#,
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    server.stop();
    for _ in 0..3 {
        let start = Instant::now();
        let err = rpc
            .request(
                "node0.example.net",
                "rpcutil",
                br#"{"agent":"rpcutil","action":"ping","data":{}}"#,
                Duration::from_secs(1),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                err.kind(),
                RequestErrorKind::NotConnected
                    | RequestErrorKind::Timeout
                    | RequestErrorKind::Transport
            ),
            "{err}"
        );
        // The request's own one-second timeout bounds it, with room for a loaded machine.
        assert!(start.elapsed() < Duration::from_millis(2500));
    }
    let found = rpc.discover_provisionable().await;
    assert!(found.map(|f| f.is_empty()).unwrap_or(true));
}

#[tokio::test]
async fn connection_watch_follows_the_broker() {
    let mut server = NatsServer::start();
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let mut up = rpc.connection_watch();
    assert!(rpc.is_connected() && *up.borrow_and_update());
    let wait_for = |up: &mut tokio::sync::watch::Receiver<bool>, want: bool| {
        let mut up = up.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), up.wait_for(|v| *v == want))
                .await
                .expect("the watch did not follow the connection")
                .unwrap();
        }
    };
    server.stop();
    wait_for(&mut up, false).await;
    assert!(!rpc.is_connected());
    let err = rpc
        .request(
            "node0.example.net",
            "rpcutil",
            b"{}",
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &RequestErrorKind::NotConnected, "{err}");
    server.restart();
    wait_for(&mut up, true).await;
    assert!(rpc.is_connected());
}

/// A client of `server` with one node answering `rpcutil#ping`, asked once.
async fn answered_once(server: &NatsServer) -> RpcClient {
    responder(server, nodes(1), echo_agent(false)).await;
    let rpc = client(server, Security::insecure("choria=p.mcollective")).await;
    rpc.request("node0.example.net", "rpcutil", PING, Duration::from_secs(5))
        .await
        .unwrap();
    rpc
}

const PING: &[u8] = br#"{"agent":"rpcutil","action":"ping","data":{}}"#;

#[tokio::test]
async fn a_request_sent_while_reconnecting_waits_for_the_connection() {
    let mut server = NatsServer::start();
    let rpc = answered_once(&server).await;
    server.stop();
    let mut up = rpc.connection_watch();
    tokio::time::timeout(Duration::from_secs(10), up.wait_for(|v| !*v))
        .await
        .expect("the client did not see the broker go")
        .unwrap();
    // Sent while the broker is down; the broker comes back within the request's timeout.
    let sent = Instant::now();
    let waiting = {
        let rpc = rpc.clone();
        tokio::spawn(async move {
            rpc.request(
                "node0.example.net",
                "rpcutil",
                PING,
                Duration::from_secs(20),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the request failed while disconnected"
    );
    server.restart();
    let reply = waiting.await.unwrap().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(reply.sender, "node0.example.net");
    assert!(sent.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn an_error_names_node_action_kind_and_cause() {
    use std::error::Error as _;
    let server = NatsServer::start();
    responder(&server, nodes(1), echo_agent(false)).await;
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let err = rpc
        .call(
            "node0.example.net",
            "choria_provision",
            "jwt",
            &serde_json::json!({"fail": 1, "msg": "Could not obtain provisioning lock"}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert_eq!(err.identity, "node0.example.net");
    assert_eq!(err.action, "choria_provision#jwt");
    assert!(err.is_provisioning_locked());
    assert!(err.source().is_none());
    assert_eq!(
        err.to_string(),
        "choria_provision#jwt on node0.example.net failed: Aborted: Could not obtain provisioning lock"
    );
    // A reply whose data does not have the expected shape: the decoding error is the source.
    let odd: Handler = Arc::new(|req, node| {
        let body = RpcRequest::parse(&req.payload).unwrap();
        let reply = RpcReply::ok(&body.action, serde_json::json!({"version": 30}));
        vec![build_reply(req, node, &reply.to_vec().unwrap()).unwrap()]
    });
    responder(&server, vec!["odd.example.net".to_string()], odd).await;
    let err = rpc
        .inventory("odd.example.net", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), &RequestErrorKind::BadReply, "{err}");
    assert_eq!(err.action, "rpcutil#inventory");
    let cause = err
        .source()
        .expect("a bad reply keeps its cause")
        .to_string();
    assert!(!cause.is_empty());
    assert_eq!(
        err.to_string(),
        format!("rpcutil#inventory on odd.example.net failed: bad reply: {cause}")
    );
}

#[tokio::test]
async fn many_concurrent_requests_share_one_connection() {
    let server = NatsServer::start();
    let ids = nodes(200);
    responder(&server, ids.clone(), echo_agent(false)).await;
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let mut tasks = Vec::new();
    for i in 0..2000 {
        let rpc = rpc.clone();
        let id = ids[i % ids.len()].clone();
        tasks.push(tokio::spawn(async move {
            rpc.call(
                &id,
                "choria_provision",
                "ping",
                &serde_json::json!({"i": i}),
                Duration::from_secs(20),
            )
            .await
            .map(|d| (d["node"] == id.as_str(), d["echo"]["i"] == i))
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), (true, true));
    }
    assert_eq!(rpc.pending(), 0);
    assert_eq!(rpc.stats().replies, 2000);
}

#[tokio::test]
async fn lifecycle_events_in_both_formats_and_our_startup_event() {
    let server = NatsServer::start();
    let rpc = client(&server, Security::insecure("choria=p.mcollective")).await;
    let mut sub = rpc
        .subscribe_lifecycle("startup", "provision_mode_server", None)
        .await
        .unwrap();
    let raw = async_nats::connect(server.url()).await.unwrap();
    let ev = LifecycleEvent::startup("n1.example.net", "provision_mode_server", "0.30.0");
    let subject = ev.subject();
    raw.publish(subject.clone(), Bytes::from_static(b"garbage"))
        .await
        .unwrap();
    raw.publish(subject.clone(), ev.to_choria_json().unwrap().into())
        .await
        .unwrap();
    raw.publish(subject, ev.to_cloudevent_json().unwrap().into())
        .await
        .unwrap();
    raw.flush().await.unwrap();
    let a = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .unwrap()
        .unwrap();
    let b = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.format, EventFormat::Choria);
    assert_eq!(b.format, EventFormat::CloudEvent);
    assert_eq!(a.event, ev);
    assert_eq!(b.event, ev);

    let watcher = async_nats::connect(server.url()).await.unwrap();
    let mut ours = watcher
        .subscribe("choria.lifecycle.event.startup.provisioner")
        .await
        .unwrap();
    connection::round_trip(&watcher, Duration::from_secs(5))
        .await
        .unwrap();
    rpc.publish_startup("provisioner", "1.2.3").await.unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), ours.next())
        .await
        .unwrap()
        .unwrap();
    let got = LifecycleEvent::parse(&msg.payload).unwrap();
    assert_eq!(got.format, EventFormat::Choria);
    assert_eq!(got.event.identity, IDENTITY);
    assert_eq!(got.event.component, "provisioner");
    assert_eq!(got.event.version.as_deref(), Some("1.2.3"));
}

#[tokio::test]
async fn requests_resume_after_a_broker_restart() {
    let mut server = NatsServer::start();
    let rpc = answered_once(&server).await;
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rpc
            .request("node0.example.net", "rpcutil", PING, Duration::from_secs(1))
            .await
        {
            Ok(r) => {
                assert_eq!(r.sender, "node0.example.net");
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no recovery after restart: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn tls_file(name: &str) -> String {
    format!("{}/testdata/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn tls_with_the_file_provider_from_a_choria_config() {
    use choria_rpc_client::config::ChoriaConfig;
    let server = NatsServer::start_with_config(&format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n}}\n",
        tls_file("broker.pem"),
        tls_file("broker_key.pem"),
        tls_file("ca.pem")
    ));
    let cfg = ChoriaConfig::parse_str(&format!(
        "identity = {IDENTITY}\nplugin.choria.middleware_hosts = 127.0.0.1:{}\nplugin.security.provider = file\nplugin.security.file.certificate = {}\nplugin.security.file.key = {}\nplugin.security.file.ca = {}\n",
        server.port(),
        tls_file("provisioner.pem"),
        tls_file("provisioner_key.pem"),
        tls_file("ca.pem")
    ))
    .unwrap();
    let settings = ConnectionSettings::from_config(&cfg).unwrap();
    assert!(settings.tls.is_some());
    let security = Security::x509_from_files(
        "choria=provisioner.mcollective",
        cfg.file_certificate.as_deref().unwrap(),
        cfg.file_key.as_deref().unwrap(),
    )
    .unwrap();
    let responder_nc = connection::connect(&settings).await.unwrap();
    responder_on(responder_nc, nodes(1), echo_agent(true)).await;
    let nc = connection::connect(&settings).await.unwrap();
    let rpc = RpcClient::new(nc, security, RpcOptions::new(IDENTITY, "provisioning"))
        .await
        .unwrap();
    let data = rpc
        .call(
            "node0.example.net",
            "choria_provision",
            "ping",
            &serde_json::json!({}),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(data["node"], "node0.example.net");

    // Without TLS (what choria_insecure selects) the same broker refuses the connection.
    let mut plain = settings.clone();
    plain.tls = None;
    assert!(connection::connect(&plain).await.is_err());
}

#[tokio::test]
async fn provisioning_password_selects_nats_user_provisioner() {
    use choria_rpc_client::config::{ChoriaConfig, ProvisionerOverrides};
    let server = NatsServer::start_with_config(
        "authorization {\n  user: provisioner\n  password: s3cret\n}\n",
    );
    let mut cfg = ChoriaConfig::parse_str(&format!(
        "plugin.choria.middleware_hosts = nats://127.0.0.1:{}\nplugin.security.provider = puppet\n",
        server.port()
    ))
    .unwrap();
    let mut wrong = cfg.clone();
    cfg.apply_provisioner_overrides(&ProvisionerOverrides {
        insecure: true,
        broker_provisioning_password: Some("s3cret".into()),
        ..Default::default()
    });
    let settings = ConnectionSettings::from_config(&cfg).unwrap();
    assert!(settings.tls.is_none());
    let nc = connection::connect(&settings).await.unwrap();
    let rpc = RpcClient::new(
        nc,
        cfg.security().unwrap(),
        RpcOptions::new(IDENTITY, "provisioning"),
    )
    .await
    .unwrap();
    assert!(rpc.discover_provisionable().await.unwrap().is_empty());

    wrong.apply_provisioner_overrides(&ProvisionerOverrides {
        insecure: true,
        broker_provisioning_password: Some("wrong".into()),
        ..Default::default()
    });
    let err = connection::connect(&ConnectionSettings::from_config(&wrong).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("127.0.0.1"), "{err}");
}

#[tokio::test]
async fn initial_connect_retries_until_cancelled() {
    let dead = settings(&format!("nats://127.0.0.1:{}", test_support::free_port()));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let s2 = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        s2.cancel();
    });
    let start = Instant::now();
    let err = connection::connect_with_retry(&dead, &shutdown)
        .await
        .unwrap_err();
    assert!(
        matches!(err, connection::ConnectionError::Cancelled { .. }),
        "{err}"
    );
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_millis(2500),
        "{took:?}"
    );
    let server = NatsServer::start();
    let live = settings(&server.url());
    connection::connect_with_retry(&live, &tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
}

/// A broker stand-in that records the CONNECT line of the first client.
async fn capture_connect() -> (u16, tokio::task::JoinHandle<serde_json::Value>) {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let h = tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        let (r, mut w) = sock.into_split();
        w.write_all(
            br#"INFO {"server_id":"x","version":"2.10.0","go":"go","host":"127.0.0.1","port":4222,"max_payload":1048576,"proto":1,"nonce":"abcNONCE123","auth_required":true}"#,
        )
        .await
        .unwrap();
        w.write_all(b"\r\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(r).lines();
        let line = lines.next_line().await.unwrap().unwrap();
        let json = line.strip_prefix("CONNECT ").unwrap().to_string();
        serde_json::from_str(&json).unwrap()
    });
    (port, h)
}

#[tokio::test]
async fn choria_provider_signs_the_broker_nonce_with_its_seed() {
    use choria_rpc_client::config::ChoriaConfig;
    let dir = tempfile::tempdir().unwrap();
    let sec = choria_security();
    let Security::Choria { jwt, key, .. } = &sec else {
        unreachable!()
    };
    std::fs::write(dir.path().join("t.jwt"), jwt).unwrap();
    std::fs::write(dir.path().join("s.seed"), hex::encode(key.to_bytes())).unwrap();
    let (port, connect) = capture_connect().await;
    let cfg = ChoriaConfig::parse_str(&format!(
        "plugin.choria.middleware_hosts = 127.0.0.1:{port}\nplugin.security.provider = choria\nplugin.security.choria.token_file = {}\nplugin.security.choria.seed_file = {}\n",
        dir.path().join("t.jwt").display(),
        dir.path().join("s.seed").display()
    ))
    .unwrap();
    let mut settings = ConnectionSettings::from_config(&cfg).unwrap();
    settings.tls = None;
    assert_eq!(settings.jwt_auth.as_ref().unwrap().jwt, *jwt);
    let client = tokio::spawn(async move { connection::connect(&settings).await });
    let info = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .unwrap()
        .unwrap();
    client.abort();
    assert_eq!(info["auth_token"], jwt.as_str());
    assert_eq!(info["jwt"], jwt.as_str());
    let sig = URL_SAFE_NO_PAD
        .decode(info["sig"].as_str().unwrap())
        .unwrap();
    let sig = ed25519_dalek::Signature::from_slice(&sig).unwrap();
    ed25519_dalek::Verifier::verify(&key.verifying_key(), b"abcNONCE123", &sig).unwrap();
}

#[tokio::test]
async fn an_event_connection_holds_at_most_its_capacity_and_counts_what_it_drops() {
    let server = NatsServer::start();
    let mut events = settings(&server.url());
    events.subscription_capacity = 16;
    let stats = connection::ConnectorStats::new();
    let nats = connection::connect_observed(&events, &stats).await.unwrap();
    let mut sub = choria_rpc_client::rpc::LifecycleSubscription::subscribe(
        &nats,
        "startup",
        "provision_mode_server",
        None,
        64 * 1024,
    )
    .await
    .unwrap();
    // A flood nobody reads yet: 200 events against room for 16.
    let raw = async_nats::connect(server.url()).await.unwrap();
    for n in 0..200 {
        let ev = LifecycleEvent::startup(
            &format!("n{n}.example.net"),
            "provision_mode_server",
            "0.30.0",
        );
        raw.publish(ev.subject(), ev.to_choria_json().unwrap().into())
            .await
            .unwrap();
    }
    raw.flush().await.unwrap();
    // Nothing is read until the client has taken in all 200 events (held or dropped).
    let taken = nats.statistics();
    for _ in 0..500 {
        if taken.in_messages.load(Ordering::Relaxed) >= 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(taken.in_messages.load(Ordering::Relaxed) >= 200);
    // The count is taken just before a message is handed over (or dropped).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut read = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), sub.next()).await {
        read += 1;
    }
    assert!((1..=16).contains(&read), "{read} events held");
    // The NATS client reports each drop through a queue of 128 events, so a burst is counted
    // in part: a lower bound, never more than was dropped.
    let dropped = stats.snapshot().slow_consumers;
    assert!(
        dropped >= 100 && dropped <= 200 - read as u64,
        "{dropped} drops counted of {}",
        200 - read
    );
}
