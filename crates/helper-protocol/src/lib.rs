//! The contract between the provisioner and its site helper: the JSON the helper reads on
//! stdin ([`HelperInput`]), the JSON it answers with ([`HelperReply`]), and [`HelperRunner`],
//! which runs the helper as a subprocess with a time limit, an output limit and clean-up of
//! everything it started.
//!
//! The documents match the Go provisioner's byte for byte in key names, key order and the
//! handling of `null` and absent values, so existing helpers keep working.
//!
//! ```no_run
//! # async fn demo() -> Result<(), helper_protocol::HelperError> {
//! use helper_protocol::{HelperInput, HelperRunner};
//! let runner = HelperRunner::new("/usr/local/bin/provision-helper --site lon")?;
//! let reply = runner
//!     .run(&HelperInput { identity: "n1.example.net".into(), inventory: "{}".into(), ..Default::default() })
//!     .await?;
//! println!("defer={} configuration={:?}", reply.defer, reply.configuration);
//! # Ok(()) }
//! ```

//! The subprocess runner is the default feature `runner`; without it the crate holds only the
//! documents and the error type (no tokio), for embedders with their own way of asking. The
//! feature `webhook` adds [`WebhookClient`], which asks a helper over HTTP(S) with the same
//! bytes ([`input_bytes`]) and decodes its reply the same way ([`decode_reply`]); the feature
//! `signature` (part of `webhook`) is its request and reply signatures alone ([`signature`]).

#![deny(missing_docs)]
#[cfg(feature = "changed-file")]
pub mod changed_file;
mod error;
mod exchange;
mod gojson;
#[cfg(feature = "runner")]
mod runner;
#[cfg(feature = "signature")]
pub mod signature;
mod types;
#[cfg(feature = "webhook")]
pub mod webhook;

pub use error::{HelperError, HelperErrorKind};
pub use exchange::{decode_reply, input_bytes};
pub use gojson::{to_go_json, to_go_json_string};
#[cfg(feature = "runner")]
pub use runner::HelperRunner;
#[cfg(feature = "webhook")]
pub use webhook::{WebhookClient, WebhookOptions};

/// How long a helper may take, whichever way it is asked (the Go provisioner's limit).
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The largest reply a helper may give, whichever way it is asked.
pub const DEFAULT_MAX_OUTPUT: usize = 1024 * 1024;
pub use types::{
    CsrReply, Ed25519Reply, HelperInput, HelperReply, ProvisioningClaims, ServerClaims,
    ServerPermissions, StandardClaims,
};
