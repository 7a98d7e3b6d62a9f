//! Load driver: discover a running fleet and provision every node the way the Go provisioner
//! does in plain mode (jwt, inventory, configure, restart), with bounded concurrency.
//!
//! `cargo run --release -p choria-fleet-sim --example drive -- nats://127.0.0.1:4222 s3cret 64`
#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::json;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let token = args.next().unwrap_or_else(|| common::TOKEN.into());
    let concurrency: usize = args.next().and_then(|c| c.parse().ok()).unwrap_or(64);
    let client = Arc::new(common::Client::v1(&url, "driver").await);

    let started = Instant::now();
    let nodes = client.discover(usize::MAX, Duration::from_secs(5)).await;
    eprintln!(
        "drive: discovered {} nodes in {:.2}s",
        nodes.len(),
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let config = json!({"plugin.choria.server.provision": "false", "loglevel": "info"}).to_string();
    let results = futures::stream::iter(nodes.clone())
        .map(|node| {
            let client = client.clone();
            let token = token.clone();
            let config = config.clone();
            async move {
                let t = json!({"token": token});
                let ok = |r: choria_rpc_client::mcorpc::RpcReply| {
                    r.statuscode == choria_rpc_client::mcorpc::StatusCode::Ok
                };
                ok(client.rpc(&node, "jwt", t.clone()).await)
                    && client
                        .rpc_wait(
                            &node,
                            "rpcutil",
                            "inventory",
                            json!({}),
                            Duration::from_secs(4),
                        )
                        .await
                        .is_some()
                    && ok(client
                        .rpc(
                            &node,
                            "configure",
                            json!({"token": token, "config": config}),
                        )
                        .await)
                    && ok(client
                        .rpc(&node, "restart", json!({"token": token, "splay": 1}))
                        .await)
            }
        })
        .buffer_unordered(concurrency)
        .collect::<Vec<bool>>()
        .await;
    let good = results.iter().filter(|ok| **ok).count();
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "drive: provisioned {good}/{} nodes in {secs:.2}s ({:.0} nodes/min)",
        nodes.len(),
        good as f64 / secs * 60.0
    );
}
