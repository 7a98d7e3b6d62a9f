//! Embedding the whole provisioner: settings built in code, the daemon started from a library
//! call against a NATS server, stopped by Ctrl-C.
//!
//! `cargo run -p provisioner --example run -- nats://127.0.0.1:4222 /usr/local/bin/helper`
//!
//! The settings are the daemon's own (`provisioner::config::Config`, the Go provisioner's YAML
//! keys, and the Choria client configuration), here written inline: a plain (TLS-less) broker,
//! the provisioning token `s3cret`, and the helper given on the command line (a command, or an
//! `http://` URL for a webhook). `cargo xtask demo` runs a broker and a simulated fleet to point
//! it at.

use std::time::Duration;

use choria_rpc_client::config::ChoriaConfig;
use provision_core::CancellationToken;
use provisioner::config::Config;
use provisioner::{Daemon, Settings};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(helper)) = (args.next(), args.next()) else {
        return Err("usage: run NATS_URL HELPER".into());
    };
    let yaml = format!(
        "helper: {helper:?}\ntoken: s3cret\nworkers: 8\nchoria_insecure: true\nmonitor_port: 0\n"
    );
    let loaded = Config::from_yaml(&yaml, "example.yaml")?;
    let choria = ChoriaConfig::parse_str(&format!(
        "identity = embedded-provisioner\nplugin.choria.middleware_hosts = {url}\n"
    ))?;
    // The daemon logs through `tracing`: the Go provisioner's text lines on standard output.
    let _log = provisioner::logging::init("info", "", false)?;

    let daemon = Daemon::builder(Settings::new(loaded.config, choria))
        .drain_grace(Duration::from_secs(5))
        .build()?;
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });
    daemon.run(shutdown).await?;
    Ok(())
}
