//! A local provisioning stack on loopback for `demo` and `bench`: test-support's nats-server,
//! process guards, run files and metrics parser. Every process is stopped when its guard drops,
//! so an error or Ctrl-C leaves nothing running.

use std::path::Path;

use anyhow::Result;
pub use test_support::metrics::{metric_sum, scrape as scrape_all};
pub use test_support::stack::{
    build_binaries, init_signer, write_run_files, ProvisionerOptions, RunFiles,
};
pub use test_support::{Mode, NatsServer, ProcessGuard as Proc};

/// The broker's extra configuration: simulator reports and large fleets need big messages.
const NATS_EXTRA: &str = "max_payload: 4MB";

/// Start nats-server with JetStream in `dir` on a free port, its log in `dir`.
pub fn start_nats(dir: &Path) -> Result<(NatsServer, String)> {
    let nats = NatsServer::start_in(dir, test_support::free_port(), NATS_EXTRA, true)?;
    let url = nats.url();
    Ok((nats, url))
}

/// A free loopback port (kept for the fault suite until it moves to its own crate).
pub fn free_port() -> Result<u16> {
    Ok(test_support::free_port())
}

/// nats-server with JetStream in `dir` on a chosen port, so a restart keeps the address; its
/// log is appended to across restarts (kept for the fault suite until it moves to its own
/// crate).
pub fn start_nats_on(dir: &Path, port: u16) -> Result<Proc> {
    let conf = dir.join("nats.conf");
    std::fs::write(&conf, test_support::nats::config(port, dir, NATS_EXTRA))?;
    Ok(test_support::nats::spawn(
        &conf,
        Some(&dir.join("nats-server.log")),
    )?)
}
