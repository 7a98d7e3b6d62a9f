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

#![deny(missing_docs)]
mod gojson;
mod runner;
mod types;

pub use gojson::{to_go_json, to_go_json_string};
pub use runner::{HelperError, HelperErrorKind, HelperRunner, DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT};
pub use types::{
    CsrReply, Ed25519Reply, HelperInput, HelperReply, ProvisioningClaims, ServerClaims,
    ServerPermissions, StandardClaims,
};
