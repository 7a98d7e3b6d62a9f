//! Golden fixtures and schema checks for the protocol module.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::json;

use super::*;

const REQ_ID: &str = "2c5f1e6a7b8c4d9e8f7a6b5c4d3e2f10";
const SENDER: &str = "provisioner.example.net";
const CALLER: &str = "choria=provisioner.mcollective";
const PAYLOAD: &[u8] = br#"{"agent":"rpcutil","action":"inventory","data":{}}"#;
const REPLY_BODY: &[u8] = br#"{"action":"inventory","statuscode":0,"statusmsg":"OK","data":{}}"#;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn fixture_str(name: &str) -> String {
    String::from_utf8(fixture(name)).unwrap()
}

fn at_secs(s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s)
}

fn filter() -> Filter {
    Filter::with_agent("choria_provision")
}

fn x509() -> Security {
    Security::x509_from_pem(
        CALLER,
        fixture_str("x509_cert.pem"),
        &fixture_str("x509_key.pem"),
    )
    .unwrap()
}

fn choria() -> Security {
    let seed: [u8; 32] = hex::decode(fixture_str("v2_seed.hex"))
        .unwrap()
        .try_into()
        .unwrap();
    Security::choria(fixture_str("v2_caller.jwt"), seed).unwrap()
}

fn encode(sec: &Security, now: SystemTime) -> Bytes {
    let f = filter();
    let reply_to = reply_subject("provisioning", sec.caller_id(), REQ_ID);
    encode_request(
        sec,
        &OutgoingRequest {
            agent: "rpcutil",
            collective: "provisioning",
            payload: PAYLOAD,
            filter: &f,
            ttl: 60,
            sender: SENDER,
            id: REQ_ID,
            reply_to: &reply_to,
        },
        now,
    )
    .unwrap()
}

#[test]
fn v1_insecure_request_matches_golden_bytes() {
    let got = encode(&Security::insecure(CALLER), at_secs(1_718_000_000));
    assert_eq!(
        std::str::from_utf8(&got).unwrap(),
        fixture_str("v1_transport_request_insecure.json")
    );
}

#[test]
fn v1_x509_request_matches_golden_bytes_and_verifies() {
    let got = encode(&x509(), at_secs(1_718_000_000));
    assert_eq!(
        std::str::from_utf8(&got).unwrap(),
        fixture_str("v1_transport_request_x509.json")
    );
    let req = ServerRequest::parse(&got).unwrap();
    req.verify().unwrap();
    assert_eq!(req.signed_bytes, fixture("v1_request.json"));
}

#[test]
fn v2_request_matches_golden_bytes_and_verifies() {
    let now = UNIX_EPOCH + Duration::from_nanos(1_718_000_000_123_456_789);
    let got = encode(&choria(), now);
    assert_eq!(
        std::str::from_utf8(&got).unwrap(),
        fixture_str("v2_transport_request.json")
    );
    let req = ServerRequest::parse(&got).unwrap();
    req.verify().unwrap();
    assert_eq!(req.caller, "provisioner_signer");
    assert_eq!(req.signed_bytes, fixture("v2_request.json"));
}

#[test]
fn server_parses_golden_requests() {
    for (name, version, caller) in [
        (
            "v1_transport_request_insecure.json",
            ProtocolVersion::V1,
            CALLER,
        ),
        (
            "v1_transport_request_x509.json",
            ProtocolVersion::V1,
            CALLER,
        ),
        (
            "v2_transport_request.json",
            ProtocolVersion::V2,
            "provisioner_signer",
        ),
    ] {
        let req = ServerRequest::parse(&fixture(name)).unwrap();
        assert_eq!(req.version, version, "{name}");
        assert_eq!(req.id, REQ_ID);
        assert_eq!(req.agent, "rpcutil");
        assert_eq!(req.collective, "provisioning");
        assert_eq!(req.sender, SENDER);
        assert_eq!(req.caller, caller);
        assert_eq!(req.ttl, 60);
        assert_eq!(req.payload, PAYLOAD);
        assert_eq!(req.filter, filter());
        assert_eq!(
            req.reply_to.as_deref(),
            Some(reply_subject("provisioning", caller, REQ_ID).as_str())
        );
        assert_eq!(req.time_nanos() / 1_000_000_000, 1_718_000_000);
    }
}

#[test]
fn insecure_requests_do_not_verify() {
    let req = ServerRequest::parse(&fixture("v1_transport_request_insecure.json")).unwrap();
    assert!(matches!(req.verify(), Err(ProtocolError::Security(_))));
}

#[test]
fn tampered_signed_request_does_not_verify() {
    let req = ServerRequest::parse(&fixture("v1_transport_request_x509.json")).unwrap();
    let mut bad = req.clone();
    bad.signed_bytes[10] ^= 1;
    assert!(bad.verify().is_err());
    let req = ServerRequest::parse(&fixture("v2_transport_request.json")).unwrap();
    let mut bad = req.clone();
    bad.signed_bytes[10] ^= 1;
    assert!(bad.verify().is_err());
}

/// A certificate whose DER ends inside its first header made `der`'s streaming PEM reader loop
/// forever (the same flaw the CSR fuzz target found in the provisioner's CSR check).
#[test]
fn truncated_request_certificate_is_refused_promptly() {
    let req = ServerRequest::parse(&fixture("v1_transport_request_x509.json")).unwrap();
    let mut bad = req.clone();
    if let RequestSecurity::V1 { pubcert, .. } = &mut bad.security {
        *pubcert = "-----BEGIN CERTIFICATE-----\nAQ==\n-----END CERTIFICATE-----\n".into();
    }
    let res = test_support::returns_within("verify", Duration::from_secs(10), move || {
        bad.verify().map_err(|e| e.to_string())
    });
    let err = res.unwrap_err();
    assert!(err.contains("invalid certificate"), "{err}");
}

#[test]
fn truncated_certificate_file_is_refused_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nAQ==\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    std::fs::write(&key, "unused").unwrap();
    let res = test_support::returns_within("x509_from_files", Duration::from_secs(10), move || {
        Security::x509_from_files("choria=p.mcollective", &cert, &key)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    let err = res.unwrap_err();
    assert!(err.contains("cert.pem"), "{err}");
}

#[test]
fn replies_match_golden_bytes() {
    let v1 = build_reply_raw(
        ProtocolVersion::V1,
        REQ_ID,
        "rpcutil",
        "node1.example.net",
        REPLY_BODY,
        at_secs(1_718_000_001),
    )
    .unwrap();
    assert_eq!(
        std::str::from_utf8(&v1).unwrap(),
        fixture_str("v1_transport_reply.json")
    );
    let v2 = build_reply_raw(
        ProtocolVersion::V2,
        REQ_ID,
        "rpcutil",
        "node1.example.net",
        REPLY_BODY,
        at_secs(1_718_000_001),
    )
    .unwrap();
    assert_eq!(
        std::str::from_utf8(&v2).unwrap(),
        fixture_str("v2_transport_reply.json")
    );
}

#[test]
fn client_parses_golden_replies() {
    for (name, version, time) in [
        (
            "v1_transport_reply.json",
            ProtocolVersion::V1,
            1_718_000_001,
        ),
        (
            "v2_transport_reply.json",
            ProtocolVersion::V2,
            1_718_000_001_000_000_000,
        ),
    ] {
        let r = parse_reply(&fixture(name)).unwrap();
        assert_eq!(r.version, version);
        assert_eq!(r.request_id, REQ_ID);
        assert_eq!(r.sender, "node1.example.net");
        assert_eq!(r.transport_sender.as_deref(), Some("node1.example.net"));
        assert_eq!(r.agent, "rpcutil");
        assert_eq!(r.time, time);
        assert_eq!(r.body, REPLY_BODY);
    }
}

#[test]
fn build_reply_answers_a_parsed_request_in_its_version() {
    for sec in [Security::insecure(CALLER), x509(), choria()] {
        let bytes = encode(&sec, SystemTime::now());
        let req = ServerRequest::parse(&bytes).unwrap();
        let reply = build_reply(&req, "node9", b"{}").unwrap();
        let r = parse_reply(&reply).unwrap();
        assert_eq!(r.version, sec.version());
        assert_eq!(r.request_id, REQ_ID);
        assert_eq!(r.sender, "node9");
        assert_eq!(r.body, b"{}");
    }
}

#[test]
fn discovery_ping_decodes_to_ping_in_both_versions() {
    for sec in [Security::insecure(CALLER), choria()] {
        let f = Filter::default();
        let bytes = encode_request(
            &sec,
            &OutgoingRequest {
                agent: "discovery",
                collective: "provisioning",
                payload: DISCOVERY_PING,
                filter: &f,
                ttl: 60,
                sender: SENDER,
                id: &new_request_id(),
                reply_to: "provisioning.reply.x.y",
            },
            SystemTime::now(),
        )
        .unwrap();
        let req = ServerRequest::parse(&bytes).unwrap();
        assert_eq!(req.payload, b"ping");
        let reply = build_reply(&req, "n1", DISCOVERY_PONG).unwrap();
        assert_eq!(parse_reply(&reply).unwrap().body, b"pong");
    }
}

/// Wrap a v1 request JSON value into secure request and transport, insecure.
fn v1_transport_of(request: &serde_json::Value, headers: serde_json::Value) -> Vec<u8> {
    let secure = json!({
        "protocol": V1_SECURE_REQUEST,
        "message": request.to_string(),
        "signature": "insecure",
        "pubcert": "insecure",
    });
    serde_json::to_vec(&json!({
        "protocol": V1_TRANSPORT,
        "data": B64.encode(secure.to_string()),
        "headers": headers,
    }))
    .unwrap()
}

fn golden_v1_request() -> serde_json::Value {
    serde_json::from_slice(&fixture("v1_request.json")).unwrap()
}

#[test]
fn v1_schema_violations_are_rejected() {
    type Mutator = fn(&mut serde_json::Value);
    let cases: Vec<(&str, Mutator)> = vec![
        ("requestid 31 chars", |v| {
            v["envelope"]["requestid"] = json!("2c5f1e6a7b8c4d9e8f7a6b5c4d3e2f1")
        }),
        ("ttl below 30", |v| v["envelope"]["ttl"] = json!(29)),
        ("missing fact array", |v| {
            v["envelope"]["filter"]
                .as_object_mut()
                .unwrap()
                .remove("fact");
        }),
        ("null identity array", |v| {
            v["envelope"]["filter"]["identity"] = serde_json::Value::Null
        }),
        ("missing filter", |v| {
            v["envelope"].as_object_mut().unwrap().remove("filter");
        }),
        ("empty callerid", |v| v["envelope"]["callerid"] = json!("")),
        ("empty agent", |v| v["envelope"]["agent"] = json!("")),
        ("wrong protocol", |v| {
            v["protocol"] = json!("choria:request:2")
        }),
        ("empty message", |v| v["message"] = json!("")),
        ("time as text", |v| v["envelope"]["time"] = json!("now")),
    ];
    for (name, mutate) in cases {
        let mut v = golden_v1_request();
        mutate(&mut v);
        let bytes = v1_transport_of(&v, json!({"reply-to": "x.reply.y.z"}));
        assert!(ServerRequest::parse(&bytes).is_err(), "{name} was accepted");
    }
    // The untouched request passes, with null headers and without agent in the filter.
    let mut v = golden_v1_request();
    v["envelope"]["filter"]
        .as_object_mut()
        .unwrap()
        .remove("agent");
    let req = ServerRequest::parse(&v1_transport_of(&v, serde_json::Value::Null)).unwrap();
    assert_eq!(req.reply_to, None);
    assert!(req.filter.agent.is_empty());
}

#[test]
fn transport_garbage_is_an_error_not_a_panic() {
    for bytes in [
        &b""[..],
        b"null",
        b"{}",
        b"[1,2]",
        br#"{"protocol":"choria:transport:1","data":"!!!"}"#,
        br#"{"protocol":"choria:transport:9","data":""}"#,
        br#"{"protocol":"choria:transport:1","data":"bnVsbA=="}"#,
        br#"{"protocol":"io.choria.protocol.v2.transport","data":"e30="}"#,
    ] {
        assert!(ServerRequest::parse(bytes).is_err());
        assert!(parse_reply(bytes).is_err());
    }
}

#[test]
fn json_errors_are_one_bounded_line_without_the_input() {
    let secret = "tok-5ecr3t-".repeat(40);
    let long = "y".repeat(100_000);
    for bytes in [
        // A syntax error beside a secret: the decoder would quote the input around it.
        format!(r#"{{"protocol":"choria:transport:1","token":"{secret}" "data":""}}"#),
        // A wrong type carrying a huge value, and trailing garbage after a whole document.
        format!(r#"{{"protocol":{{"x":"{secret}"}},"data":"{long}"}}"#),
        format!(r#"{{"protocol":"choria:transport:1","data":""}} {secret}"#),
        // Invalid UTF-8 and a control character inside strings.
        format!("{{\"protocol\":\"\u{1}{secret}\",\"data\":\"\"}}"),
    ] {
        for e in [
            ServerRequest::parse(bytes.as_bytes()).unwrap_err(),
            parse_reply(bytes.as_bytes()).unwrap_err(),
        ] {
            let text = e.to_string();
            assert!(matches!(e, ProtocolError::Json { .. }), "{text}");
            assert!(!text.contains('\n'), "one line: {text}");
            assert!(!text.contains("5ecr3t"), "the input is not quoted: {text}");
            assert!(text.len() <= JsonError::MAX + 40, "{} bytes", text.len());
        }
    }
    let mut bad_utf8 = br#"{"protocol":""#.to_vec();
    bad_utf8.extend_from_slice(b"\xff\xfe");
    bad_utf8.extend_from_slice(br#"","data":""}"#);
    let e = ServerRequest::parse(&bad_utf8).unwrap_err().to_string();
    assert!(
        e.starts_with("invalid transport json: ") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn reply_with_a_wrong_hash_is_rejected() {
    let secure = json!({
        "protocol": V1_SECURE_REPLY,
        "message": String::from_utf8(fixture("v1_reply.json")).unwrap(),
        "hash": B64.encode([0u8; 32]),
    });
    let t = json!({"protocol": V1_TRANSPORT, "data": B64.encode(secure.to_string())});
    assert!(matches!(
        parse_reply(t.to_string().as_bytes()),
        Err(ProtocolError::HashMismatch)
    ));
}

/// `json` with the string value of each of `fields` written wholly as `\uXXXX` escapes: the
/// same document to a JSON reader, but no string it holds can be read in place.
fn escape_fields(json: &str, fields: &[&str]) -> String {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    let mut out = json.to_string();
    for field in fields {
        if let Some(text) = v[*field].as_str() {
            let escaped: String = text
                .chars()
                .map(|c| format!("\\u{:04x}", c as u32))
                .collect();
            let plain = serde_json::to_string(text).unwrap();
            assert!(out.contains(&plain), "{field} is not written plainly");
            out = out.replacen(&plain, &format!("\"{escaped}\""), 1);
        }
    }
    assert_eq!(serde_json::from_str::<serde_json::Value>(&out).unwrap(), v);
    out
}

#[test]
fn replies_decode_the_same_whether_their_strings_are_escaped_or_not() {
    for name in ["v1_transport_reply.json", "v2_transport_reply.json"] {
        let plain = fixture_str(name);
        let want = parse_reply(plain.as_bytes()).unwrap();
        // Escapes in the transport layer (its protocol and base64 data).
        let outer = escape_fields(&plain, &["protocol", "data"]);
        // Escapes in the secure layer too (its protocol, the hash, v2's base64 reply).
        let t: serde_json::Value = serde_json::from_str(&plain).unwrap();
        let secure = B64.decode(t["data"].as_str().unwrap()).unwrap();
        let secure = escape_fields(
            std::str::from_utf8(&secure).unwrap(),
            &["protocol", "hash", "reply"],
        );
        let mut inner = t.clone();
        inner["data"] = json!(B64.encode(secure));
        for bytes in [outer, inner.to_string()] {
            let got = parse_reply(bytes.as_bytes()).unwrap();
            assert_eq!(got.version, want.version);
            assert_eq!(got.request_id, want.request_id);
            assert_eq!(got.sender, want.sender);
            assert_eq!(got.transport_sender, want.transport_sender);
            assert_eq!(got.body, want.body);
        }
    }
}

#[test]
fn a_peers_protocol_name_is_quoted_bounded_in_errors() {
    let long = "x".repeat(100_000);
    let transport = json!({"protocol": long, "data": ""}).to_string();
    let message = String::from_utf8(fixture("v1_reply.json")).unwrap();
    let mut reply: serde_json::Value = serde_json::from_str(&message).unwrap();
    reply["protocol"] = json!(long);
    let reply = reply.to_string();
    let secure = json!({
        "protocol": V1_SECURE_REPLY,
        "message": reply,
        "hash": B64.encode(sha2::Sha256::digest(reply.as_bytes())),
    });
    let inner = json!({"protocol": V1_TRANSPORT, "data": B64.encode(secure.to_string())});
    for bytes in [transport, inner.to_string()] {
        match parse_reply(bytes.as_bytes()) {
            Err(e @ ProtocolError::Protocol { .. }) => {
                assert!(e.to_string().len() < 300, "{} bytes", e.to_string().len())
            }
            other => panic!("not a protocol error: {other:?}"),
        }
    }
}

#[test]
fn reply_hashes_of_the_wrong_length_are_rejected() {
    let message = String::from_utf8(fixture("v1_reply.json")).unwrap();
    let good = B64.encode(sha2::Sha256::digest(message.as_bytes()));
    for hash in [
        String::new(),
        good[..43].to_string(),
        format!("{good}="),
        format!("{good}{good}"),
    ] {
        let secure = json!({"protocol": V1_SECURE_REPLY, "message": message, "hash": hash});
        let t = json!({"protocol": V1_TRANSPORT, "data": B64.encode(secure.to_string())});
        assert!(
            matches!(
                parse_reply(t.to_string().as_bytes()),
                Err(ProtocolError::HashMismatch)
            ),
            "hash {hash:?}"
        );
    }
    let secure = json!({"protocol": V1_SECURE_REPLY, "message": message, "hash": good});
    let t = json!({"protocol": V1_TRANSPORT, "data": B64.encode(secure.to_string())});
    assert!(parse_reply(t.to_string().as_bytes()).is_ok());
}

#[test]
fn ttl_window_is_exclusive_on_both_sides() {
    let req = ServerRequest::parse(&fixture("v1_transport_request_insecure.json")).unwrap();
    let t = 1_718_000_000;
    assert!(req.is_fresh(at_secs(t)));
    assert!(req.is_fresh(at_secs(t + 59)));
    assert!(!req.is_fresh(at_secs(t + 60)));
    assert!(req.is_fresh(at_secs(t - 59)));
    assert!(!req.is_fresh(at_secs(t - 60)));
}

#[test]
fn reply_subject_uses_md5_of_the_caller() {
    assert_eq!(
        caller_hash("choria=provisioner.mcollective"),
        hex::encode(<Md5 as md5::Digest>::digest(
            b"choria=provisioner.mcollective"
        ))
    );
    assert_eq!(
        reply_subject("provisioning", "x", "abc"),
        "provisioning.reply.9dd4e461268c8034f5c8564e155c67a6.abc"
    );
    let id = new_request_id();
    assert_eq!(id.len(), 32);
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
}

#[test]
fn filter_matching_follows_go_choria() {
    let agents = vec!["choria_provision".to_string(), "rpcutil".to_string()];
    let classes = vec!["Role::Web".to_string()];
    let facts = json!({"os": {"family": "RedHat", "release": {"major": "9"}}, "cpus": 4});
    let node = NodeInfo {
        identity: "web1.example.net",
        agents: &agents,
        classes: &classes,
        facts: &facts,
    };
    let fact = |f: &str, op: &str, v: &str| FactFilter {
        fact: f.into(),
        operator: op.into(),
        value: v.into(),
    };
    let cases: Vec<(Filter, bool)> = vec![
        (Filter::default(), true),
        (Filter::with_agent("choria_provision"), true),
        (Filter::with_agent("puppet"), false),
        (Filter::with_agent("/^choria_/"), true),
        (Filter::with_identity("web1.example.net"), true),
        (Filter::with_identity("/^web\\d+/"), true),
        (Filter::with_identity("db1"), false),
        (
            Filter {
                identity: vec!["db1".into(), "web1.example.net".into()],
                ..Filter::default()
            },
            true,
        ),
        (
            Filter {
                agent: vec!["rpcutil".into(), "puppet".into()],
                ..Filter::default()
            },
            false,
        ),
        (
            Filter {
                class: vec!["/role::web/".into()],
                ..Filter::default()
            },
            true,
        ),
        (
            Filter {
                fact: vec![fact("os.family", "==", "RedHat"), fact("cpus", ">=", "4")],
                ..Filter::default()
            },
            true,
        ),
        (
            Filter {
                fact: vec![fact("cpus", "<", "4")],
                ..Filter::default()
            },
            false,
        ),
        (
            Filter {
                fact: vec![fact("os.release.major", "=~", "/^9/")],
                ..Filter::default()
            },
            true,
        ),
        (
            Filter {
                fact: vec![fact("missing", "!=", "x")],
                ..Filter::default()
            },
            false,
        ),
        (
            Filter {
                compound: vec![json!([{"expr": "true"}])],
                ..Filter::default()
            },
            false,
        ),
    ];
    for (i, (f, want)) in cases.iter().enumerate() {
        assert_eq!(f.matches(&node), *want, "case {i}: {f:?}");
    }
}

#[test]
fn filter_serialises_all_five_arrays_in_go_order() {
    assert_eq!(
        serde_json::to_string(&Filter::default()).unwrap(),
        r#"{"fact":[],"cf_class":[],"agent":[],"identity":[],"compound":[]}"#
    );
}

#[test]
fn lifecycle_fixtures_parse_in_both_formats() {
    use crate::lifecycle::{EventFormat, LifecycleEvent};
    let c = LifecycleEvent::parse(&fixture("lifecycle_startup_choria.json")).unwrap();
    assert_eq!(c.format, EventFormat::Choria);
    assert_eq!(c.event.identity, "node1.example.net");
    assert_eq!(c.event.event_type(), "startup");
    assert_eq!(c.event.version.as_deref(), Some("0.30.0"));
    assert_eq!(
        c.event.to_choria_json().unwrap(),
        fixture("lifecycle_startup_choria.json")
    );
    let ce = LifecycleEvent::parse(&fixture("lifecycle_startup_cloudevent.json")).unwrap();
    assert_eq!(ce.format, EventFormat::CloudEvent);
    assert_eq!(ce.event, c.event);
    assert_eq!(
        ce.event.to_cloudevent_json().unwrap(),
        fixture("lifecycle_startup_cloudevent.json")
    );
}

#[test]
fn transport_written_directly_equals_the_serialised_envelope() {
    // Every length around base64's padding boundaries, and bytes of every value.
    for len in [0usize, 1, 2, 3, 4, 5, 63, 64, 65, 1000, 4099] {
        let secure: Vec<u8> = (0..len).map(|i| (i * 131 % 256) as u8).collect();
        // A sender as long as an identity may be, so the headers' room counts.
        let sender = format!("{}.example.net", "n".repeat(241));
        let v1 = V1HeadersOut {
            reply_to: Some("_INBOX.a\"b"),
            mc_sender: Some(&sender),
        };
        let room = string_room(10) + string_room(sender.len());
        let direct = transport_json(V1_TRANSPORT, &secure, &v1, room).unwrap();
        assert_eq!(
            direct.capacity(),
            b64::encoded_len(len).unwrap() + room + ENVELOPE_SLACK,
            "written without growing, {len} bytes"
        );
        let data = B64.encode(&secure);
        let serialised = serde_json::to_vec(&TransportOut {
            protocol: V1_TRANSPORT,
            data: &data,
            headers: v1,
        })
        .unwrap();
        assert_eq!(direct, serialised, "v1, {len} bytes");
        let v2 = V2HeadersOut {
            reply: Some("r"),
            sender: None,
        };
        let direct = transport_json(V2_TRANSPORT, &secure, &v2, string_room(1)).unwrap();
        let serialised = serde_json::to_vec(&TransportOut {
            protocol: V2_TRANSPORT,
            data: &data,
            headers: v2,
        })
        .unwrap();
        assert_eq!(direct, serialised, "v2, {len} bytes");
    }
}

fn node(identity: &str) -> NodeInfo<'_> {
    NodeInfo {
        identity,
        agents: &[],
        classes: &[],
        facts: &serde_json::Value::Null,
    }
}

#[test]
fn identity_shards_give_every_identity_to_exactly_one_shard() {
    let ids = [
        "n-0000001.fleet.example.net",
        "web01",
        "DB-Z.example",
        "a_b_.x",
        "x-.y",
        "host_",
        "ALLCAPS.Example",
        "q9.z",
        "tail.9",
        "ü",
    ];
    for shards in 2..=12 {
        let filters: Vec<Filter> = (0..shards)
            .map(|i| {
                Filter::with_identity(Filter::identity_shard(i, shards).expect("a shard filter"))
            })
            .collect();
        let matchers: Vec<Matcher<'_>> = filters.iter().map(Filter::matcher).collect();
        for id in ids {
            let hits: Vec<usize> = (0..shards)
                .filter(|&i| matchers[i].matches(&node(id)))
                .collect();
            assert_eq!(hits.len(), 1, "{id} in {shards} shards: {hits:?}");
        }
    }
    assert_eq!(Filter::identity_shard(0, 1), None);
    assert_eq!(Filter::identity_shard(3, 3), None);
}

#[test]
fn a_range_of_shards_matches_what_its_shards_match() {
    let ids = [
        "n-0000001.fleet.example.net",
        "n-0000010.fleet.example.net",
        "web0a",
        "DB-Z.example",
        "host_",
        "ALLCAPS.Example",
        "ü",
    ];
    for shards in 2..=10 {
        for start in 0..shards {
            for end in start + 1..=shards {
                let range = Filter::with_identity(
                    Filter::identity_shards(start..end, shards).expect("a range filter"),
                );
                let range = range.matcher();
                for id in ids {
                    let in_one = (start..end).any(|i| {
                        Filter::with_identity(Filter::identity_shard(i, shards).unwrap())
                            .matcher()
                            .matches(&node(id))
                    });
                    assert_eq!(
                        range.matches(&node(id)),
                        in_one,
                        "{id} in shards {start}..{end} of {shards}"
                    );
                }
            }
        }
    }
    // Every shard is every identity.
    let all = Filter::with_identity(Filter::identity_shards(0..10, 10).unwrap());
    assert!(ids.iter().all(|id| all.matcher().matches(&node(id))));
    assert_eq!(Filter::identity_shards(2..2, 10), None);
    assert_eq!(Filter::identity_shards(9..11, 10), None);
    assert_eq!(Filter::identity_shard(usize::MAX, 10), None);
}

#[test]
fn identity_shards_split_numbered_hosts_evenly() {
    let filters: Vec<Filter> = (0..10)
        .map(|i| Filter::with_identity(Filter::identity_shard(i, 10).expect("a shard filter")))
        .collect();
    let matchers: Vec<Matcher<'_>> = filters.iter().map(Filter::matcher).collect();
    let mut counts = [0usize; 10];
    for n in 0..10_000 {
        let id = format!("n-{n:07}.fleet.example.net");
        for (i, m) in matchers.iter().enumerate() {
            if m.matches(&node(&id)) {
                counts[i] += 1;
            }
        }
    }
    assert_eq!(counts, [1000; 10]);
}

#[test]
fn a_matcher_matches_as_its_filter_does() {
    let f = Filter {
        identity: vec!["/^web/".into(), "db1".into(), "/[/".into()],
        ..Filter::default()
    };
    let m = f.matcher();
    for (id, want) in [("web3", true), ("db1", true), ("db2", false), ("[", false)] {
        assert_eq!(m.matches(&node(id)), want, "{id}");
        assert_eq!(f.matches(&node(id)), want, "{id}");
    }
}
