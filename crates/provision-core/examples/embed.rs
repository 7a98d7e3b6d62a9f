//! Embedding the provisioning engine: the whole cycle of a small fleet, in memory.
//!
//! `cargo run -p provision-core --example embed`
//!
//! What an embedding tool supplies, and what this example uses for each:
//!
//! * the transport ([`NodeRpc`]): here `testing::FakeNode`, which answers as a go-choria server
//!   in provisioning mode would (a signed provisioning JWT, an ed25519 key proven over a fresh
//!   nonce, an inventory); a real tool sends the same actions over its own network, as the
//!   `provisioner` crate does over NATS;
//! * the helper ([`Helper`]): here a rule in code that configures each node from its identity;
//! * the keys ([`StaticKeys`]): the key verifying provisioning JWTs and the seed signing the
//!   server JWTs this provisioner issues;
//! * an observer ([`Observer`]): here one that prints what happens to each node.
//!
//! The nodes come in as a discovery would find them ([`Fleet::add`]), the workers provision them
//! ([`Fleet::run`]), and the example stops once every node's cycle has ended.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use provision_core::events::{NodeEvent, NodeState};
use provision_core::helper_protocol::{HelperError, HelperInput, HelperReply};
use provision_core::testing::{test_keys, FakeNode};
use provision_core::{
    Backoff, CancellationToken, Features, Fleet, Helper, Observer, ProvisionConfig, Provisioner,
    Source,
};

/// The site's decision, in code: every node gets its identity, the broker and a collective.
struct SiteRules;

impl Helper for SiteRules {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        let collective = if input.identity.starts_with("db") {
            "databases"
        } else {
            "web"
        };
        let configuration = BTreeMap::from([
            ("identity".to_string(), input.identity.clone()),
            ("collectives".to_string(), collective.to_string()),
            (
                "plugin.choria.middleware_hosts".to_string(),
                "nats://broker.example.net:4222".to_string(),
            ),
            ("plugin.choria.server.provision".to_string(), "false".into()),
        ]);
        Ok(HelperReply {
            configuration: Some(configuration),
            msg: format!("joined {collective}"),
            ..HelperReply::default()
        })
    }
}

/// Prints every step and how each cycle ended; counts the ended cycles.
#[derive(Default)]
struct Printer {
    ended: AtomicUsize,
    provisioned: AtomicUsize,
}

impl Observer for Printer {
    fn node_event(&self, identity: &str, event: &NodeEvent<'_>) {
        match event {
            NodeEvent::Step { step, ok, .. } => {
                println!("{identity}: {step} {}", if *ok { "ok" } else { "failed" });
            }
            NodeEvent::Finished(v) => {
                let issued = v
                    .issued
                    .server_jwt
                    .as_ref()
                    .map(|j| format!(", server JWT {}", j.id))
                    .unwrap_or_default();
                println!(
                    "{identity}: {} ({}){issued}",
                    v.state,
                    if v.cause.is_empty() {
                        &v.helper_msg
                    } else {
                        &v.cause
                    }
                );
                if v.state == NodeState::Provisioned {
                    self.provisioned.fetch_add(1, Ordering::SeqCst);
                }
                self.ended.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = ProvisionConfig::builder()
        .token(provision_core::testing::TOKEN)
        .features(Features::NONE.with_ed25519(true))
        .build()?;
    let printer = Arc::new(Printer::default());
    let provisioner = Provisioner::builder(FakeNode::new(), SiteRules)
        .config(config)
        .keys(test_keys())
        .observer(Arc::clone(&printer))
        .backoff(Backoff::fixed(vec![Duration::from_millis(100)]))
        .build();
    let fleet = Fleet::new(provisioner);
    let shutdown = CancellationToken::new();
    let workers = tokio::spawn(Arc::clone(&fleet).run(4, shutdown.clone()));

    // A discovery result: three real names and one no identity may have.
    let found = [
        "web1.example.net",
        "web2.example.net",
        "db1.example.net",
        "bad name",
    ];
    let mut queued = 0;
    for identity in found {
        match fleet.add(identity, Source::Discovery) {
            provision_core::AddResult::Queued => queued += 1,
            other => println!("{identity:?}: not queued: {other:?}"),
        }
    }
    // Wait for every queued node's cycle to end.
    while printer.ended.load(Ordering::SeqCst) < queued {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    workers.await?;
    let provisioned = printer.provisioned.load(Ordering::SeqCst);
    println!("provisioned {provisioned} of {queued} queued nodes");
    if provisioned != queued {
        return Err("not every queued node was provisioned".into());
    }
    Ok(())
}
