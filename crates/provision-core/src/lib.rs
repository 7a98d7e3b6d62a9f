//! The provisioning engine of the Choria provisioner, free of any transport so other tools can
//! embed it.
//!
//! * [`config`]: the YAML configuration and the shared pause state.
//! * [`rpc`]: the traits an embedder implements: [`NodeRpc`] (directed RPCs to one node),
//!   [`Helper`] (the site helper; [`helper_protocol::HelperRunner`] implements it),
//!   [`Observer`] (metric hooks) and [`Clock`].
//! * [`provision`]: the cycle of one node ([`Provisioner::provision`]).
//! * [`fleet`]: the host table, the bounded work queue and the worker pool ([`Fleet`]).
//! * [`policy`], [`jwt`], [`keyenc`]: the checks and the cryptography of enrolment.
//!
//! # Wiring your own transport
//!
//! ```no_run
//! use std::sync::Arc;
//! use provision_core::rpc::*;
//! use provision_core::{Config, Fleet, PauseState, Provisioner, Source};
//! use provision_core::helper_protocol::{CsrReply, Ed25519Reply, HelperRunner};
//!
//! /// Sends each action to one node over whatever the embedder talks.
//! struct MyTransport;
//!
//! impl NodeRpc for MyTransport {
//!     async fn inventory(&self, identity: &str) -> Result<Inventory, RpcError> {
//!         Err(RpcError::new(identity, Action::Inventory, RpcErrorKind::Timeout))
//!     }
//!     async fn jwt(&self, identity: &str, _token: &str) -> Result<JwtReply, RpcError> {
//!         Err(RpcError::new(identity, Action::Jwt, RpcErrorKind::Timeout))
//!     }
//!     async fn gen25519(&self, identity: &str, _t: &str, _nonce: &str) -> Result<Ed25519Reply, RpcError> {
//!         Err(RpcError::new(identity, Action::Gen25519, RpcErrorKind::Timeout))
//!     }
//!     async fn gencsr(&self, identity: &str, _t: &str, _cn: &str) -> Result<CsrReply, RpcError> {
//!         Err(RpcError::new(identity, Action::Gencsr, RpcErrorKind::Timeout))
//!     }
//!     async fn configure(&self, identity: &str, _r: &ConfigureRequest) -> Result<ActionMessage, RpcError> {
//!         Err(RpcError::new(identity, Action::Configure, RpcErrorKind::Timeout))
//!     }
//!     async fn release_update(&self, identity: &str, _t: &str, _repo: &str, _v: &str) -> Result<ActionMessage, RpcError> {
//!         Err(RpcError::new(identity, Action::ReleaseUpdate, RpcErrorKind::Timeout))
//!     }
//!     async fn restart(&self, identity: &str, _t: &str, _splay: u32) -> Result<ActionMessage, RpcError> {
//!         Err(RpcError::new(identity, Action::Restart, RpcErrorKind::Timeout))
//!     }
//!     async fn shutdown(&self, identity: &str, _t: &str) -> Result<ActionMessage, RpcError> {
//!         Err(RpcError::new(identity, Action::Shutdown, RpcErrorKind::Timeout))
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let loaded = Config::load("/etc/choria/provisioner/provisioner.yaml")?;
//! for w in &loaded.warnings {
//!     eprintln!("warning: {w}");
//! }
//! let config = Arc::new(loaded.config);
//! let helper = HelperRunner::new(&config.helper)?;
//! let workers = config.workers;
//! let provisioner = Provisioner::new(config, PauseState::default(), MyTransport, helper, NoopObserver);
//! let fleet = Fleet::new(provisioner);
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let runner = tokio::spawn(fleet.clone().run(workers, shutdown.clone()));
//! fleet.add("n1.example.net", Source::Discovery);
//! shutdown.cancel();
//! runner.await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
pub mod config;
pub mod fleet;
pub mod identity;
pub mod keyenc;
pub mod policy;
pub mod provision;
pub mod rpc;

pub use choria_crypto;
/// The JWT primitives, re-exported from [`choria_crypto`] (the binary and the key material use
/// this path).
pub use choria_crypto::jwt;

pub use config::{Config, ConfigError, ConfigWarning, Features, Loaded, PauseState};
pub use fleet::{AddResult, Fleet, Source};
pub use helper_protocol;
pub use identity::{IdentityError, IdentityRule};
pub use provision::{Backoff, Host, Outcome, ProvisionError, ProvisionErrorKind, Provisioner};
pub use rpc::{Clock, Helper, NodeRpc, NoopObserver, Observer, SystemClock};
