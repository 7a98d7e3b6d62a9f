//! A local provisioning stack on loopback for `demo` and `bench`: test-support's nats-server,
//! process guards, run files and metrics parser. Every process is stopped when its guard drops,
//! so an error or Ctrl-C leaves nothing running.

use std::path::Path;

use anyhow::Result;
pub use test_support::metrics::metric_sum;
pub use test_support::stack::{build_binaries, static_helper, write_run_files};
pub use test_support::{Mode, NatsServer, ProcessGuard as Proc};

/// Start nats-server with JetStream in `dir` on a free port, its log in `dir` (installing
/// nats-server under target/tools first when there is none).
pub fn start_nats(dir: &Path) -> Result<(NatsServer, String)> {
    start_nats_with(dir, "")
}

/// As [`start_nats`], with `extra` added to the server's configuration (TLS, say).
pub fn start_nats_with(dir: &Path, extra: &str) -> Result<(NatsServer, String)> {
    crate::tools::ensure_nats_server()?;
    // Simulator reports and large fleets need big messages.
    let conf = format!("max_payload: 4MB\n{extra}");
    let nats = NatsServer::start_in_free_port(dir, &conf, true)?;
    let url = nats.url();
    Ok((nats, url))
}
