//! The cost of the protocol's layers for one provisioning exchange, without a broker: encoding
//! a `configure` request (the largest the provisioner sends: settings as JSON inside the RPC
//! JSON, a server JWT), the server reading it, the server building an `inventory` reply (the
//! largest a node sends), and the client reading that. v1 (the provisioning protocol of a
//! server with `plugin.choria.security.provider = file` or insecure) and v2 (Choria security).
//! Prints the median nanoseconds of each step over repeated batches: the figures to compare
//! between builds when a change is too small for `cargo xtask bench` to resolve (that one
//! varies by several percent from run to run on a shared machine).
//!
//! `cargo bench -p choria-rpc-client --bench protocol [-- ITERATIONS]` (default 2,000 a batch).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::{Duration, Instant, UNIX_EPOCH};

use choria_rpc_client::protocol::{
    build_reply_raw, encode_request, parse_reply, reply_subject, Filter, OutgoingRequest,
    ProtocolVersion, Security, ServerRequest,
};

const BATCHES: usize = 15;

fn testdata(name: &str) -> String {
    let path = format!("{}/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A `configure` request as the provisioner sends it to an ed25519 node.
fn configure_payload() -> Vec<u8> {
    let settings: serde_json::Map<String, serde_json::Value> = (0..12)
        .map(|i| {
            (
                format!("plugin.choria.setting_{i}"),
                serde_json::Value::String(format!("value \"{i}\" for the node, C:\\path\\{i}")),
            )
        })
        .collect();
    let jwt = format!(
        "eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9.{}.{}",
        "eyJpc3MiOiJDLTEyMzQiLCJzdWIiOiJub2RlMSJ9".repeat(16),
        "c2lnbmF0dXJl".repeat(7)
    );
    serde_json::to_vec(&serde_json::json!({
        "agent": "choria_provision",
        "action": "configure",
        "data": {
            "token": "s3cret-demo-token",
            "config": serde_json::to_string(&settings).unwrap(),
            "server_jwt": jwt,
            "ecdh_public": "ab".repeat(32),
            "action_policies": {},
            "opa_policies": {},
        }
    }))
    .unwrap()
}

/// An `inventory` reply as a go-choria server in provisioning mode sends it.
fn inventory_body() -> Vec<u8> {
    let facts: serde_json::Map<String, serde_json::Value> = (0..40)
        .map(|i| (format!("fact_{i}"), serde_json::json!(format!("value {i}"))))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "statuscode": 0,
        "statusmsg": "OK",
        "action": "inventory",
        "data": {
            "agents": ["choria_provision", "choria_util", "discovery", "rpcutil"],
            "facts": facts,
            "classes": [],
            "collectives": ["provisioning"],
            "data_plugins": [],
            "main_collective": "provisioning",
            "version": "0.29.4",
            "upgradable": true,
        }
    }))
    .unwrap()
}

/// The median nanoseconds of `op` over [`BATCHES`] batches of `n`.
fn median_ns(n: usize, mut op: impl FnMut()) -> f64 {
    let mut batches: Vec<Duration> = (0..BATCHES)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..n {
                op();
            }
            started.elapsed()
        })
        .collect();
    batches.sort();
    batches[BATCHES / 2].as_nanos() as f64 / n as f64
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2_000);
    let payload = configure_payload();
    let body = inventory_body();
    let now = UNIX_EPOCH + Duration::from_secs(1_718_000_000);
    let seed: [u8; 32] = hex::decode(testdata("v2_seed.hex").trim())
        .unwrap()
        .try_into()
        .unwrap();
    let filter = Filter::with_agent("choria_provision");
    let mut total = [0.0f64; 2];
    for (i, (name, version, security)) in [
        (
            "v1",
            ProtocolVersion::V1,
            Security::insecure("choria=provisioner.mcollective".to_string()),
        ),
        (
            "v2",
            ProtocolVersion::V2,
            Security::choria(testdata("v2_caller.jwt").trim().to_string(), seed).unwrap(),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let id = "2c5f1e6a7b8c4d9e8f7a6b5c4d3e2f10";
        let reply_to = reply_subject("provisioning", security.caller_id(), id);
        let req = OutgoingRequest {
            agent: "choria_provision",
            collective: "provisioning",
            payload: &payload,
            filter: &filter,
            ttl: 60,
            sender: "provisioner.example.net",
            id,
            reply_to: &reply_to,
        };
        let encoded = encode_request(&security, &req, now).unwrap();
        let reply =
            build_reply_raw(version, id, "rpcutil", "node1.example.net", &body, now).unwrap();
        let steps = [
            (
                "encode_request",
                median_ns(n, || {
                    std::hint::black_box(encode_request(&security, &req, now).unwrap());
                }),
            ),
            (
                "ServerRequest::parse",
                median_ns(n, || {
                    std::hint::black_box(ServerRequest::parse(&encoded).unwrap());
                }),
            ),
            (
                "build_reply_raw",
                median_ns(n, || {
                    std::hint::black_box(
                        build_reply_raw(version, id, "rpcutil", "node1.example.net", &body, now)
                            .unwrap(),
                    );
                }),
            ),
            (
                "parse_reply",
                median_ns(n, || {
                    std::hint::black_box(parse_reply(&reply).unwrap());
                }),
            ),
        ];
        for (step, ns) in steps {
            println!("protocol: {name} {step:<21} {ns:>8.0} ns");
            total[i] += ns;
        }
        println!(
            "protocol: {name} request {} bytes, reply {} bytes",
            encoded.len(),
            reply.len()
        );
    }
    println!(
        "protocol: v1_exchange_ns={:.0} v2_exchange_ns={:.0}",
        total[0], total[1]
    );
}
