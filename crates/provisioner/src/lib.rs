//! The Choria provisioner as a library: everything the `choria-provisioner` daemon does, callable
//! from other Rust tools.
//!
//! * [`settings`]: both configuration files loaded, and the preflight `check` prints and `run`
//!   refuses to start on.
//! * [`daemon`]: the run loop: broker connection, election, lifecycle listener, discovery,
//!   workers and drain.
//! * [`node_rpc`], [`helper`], [`keys`]: the provisioning core's transport, site helper and key
//!   material over the real Choria network, helper processes or webhooks, and key files.
//! * [`aa`] and [`claims`]: active-active replicas; [`audit`] and [`audit_stream`]: the audit
//!   trail; [`rego`]: admission by a Rego policy; [`logging`]: the Go provisioner's log format.
//! * [`operator`] and [`rotate`]: an operator's commands on the fleet lifecycle
//!   ([`fleet_lifecycle`]: pause, deny list, approvals, rotation campaigns) with the
//!   provisioner's own files.

#![deny(missing_docs)]
pub mod aa;
pub mod audit;
pub mod audit_stream;
pub mod claims;
pub mod daemon;
mod error;
pub mod helper;
pub mod keys;
pub mod logging;
pub mod node_rpc;
pub mod operator;
pub mod preflight;
pub mod process;
pub mod rego;
pub mod rotate;
pub mod settings;
pub mod status_client;
pub mod status_text;
pub mod text;

pub use daemon::{runtime, Daemon, DaemonBuilder};
pub use error::Error;
pub use settings::{Paths, Settings};

// The crates whose types appear in this one's signatures.
pub use choria_rpc_client;
pub use fleet_lifecycle;
pub use provision_core;
pub use provision_core::CancellationToken;
/// The provisioner's YAML configuration ([`provisioner_config`]).
pub use provisioner_config as config;
pub use provisioner_metrics;
pub use provisioner_status;
pub use serde_json;

/// The release version: injected at build time by `cargo xtask dist` through
/// `CHORIA_PROVISIONER_VERSION`, else the crate version.
pub const VERSION: &str = match option_env!("CHORIA_PROVISIONER_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

/// An error and its causes joined with `: ` on one line, leaving out a cause whose text the
/// message already carries (some errors repeat their source in their own message).
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        cause = c.source();
    }
    out.replace('\n', " ")
}
