//! The provisioning engine of the Choria provisioner, free of any transport so other tools can
//! embed it.
//!
//! The crate does no I/O of its own: no files, no processes, no sockets, no signals. What it
//! needs from outside comes through traits an embedder implements:
//!
//! * [`rpc`]: [`NodeRpc`] (directed RPCs to one node) and [`Helper`] (the site helper).
//! * [`keys`]: [`KeyMaterial`], the keys of enrolment, asked for every node ([`StaticKeys`]
//!   holds keys loaded once).
//! * [`observer`]: [`Observer`], the metric hooks, and [`events`]: what it is told about each
//!   node for a history or an audit trail ([`NodeEvent`], [`Verdict`]).
//! * [`clock`]: [`Clock`] (wall time) and [`Random`] (nonces and jitter).
//! * [`admission`]: [`Admission`], a policy asked before the helper (optional).
//! * [`claims`]: [`Claims`], the shared store through which active-active replicas claim a
//!   node before provisioning it (optional).
//!
//! And the engine itself:
//!
//! * [`config`]: [`ProvisionConfig`], what the cycle reads; [`pause`]: the shared pause state.
//! * [`provision`]: the cycle of one node ([`Provisioner::provision`]), built with
//!   [`Provisioner::builder`].
//! * [`fleet`]: the host table, the bounded work queue and the worker pool ([`Fleet`]).
//! * [`policy`]: the checks of enrolment; [`jwt`] and [`choria_crypto::keyenc`] its
//!   cryptography.
//! * [`testing`] (feature `testing`): in-memory fakes of every collaborator.
//!
//! # Embedding
//!
//! `examples/embed.rs` (`cargo run -p provision-core --example embed`) provisions a small
//! fleet end to end on in-memory fakes. The shape of it:
//!
//! ```
//! use std::sync::Arc;
//! use provision_core::helper_protocol::{HelperError, HelperInput, HelperReply};
//! use provision_core::{
//!     CancellationToken, Features, Fleet, Helper, NoopObserver, ProvisionConfig, Provisioner,
//!     Source, StaticKeys,
//! };
//! # use provision_core::rpc::*;
//! # use provision_core::helper_protocol::{CsrReply, Ed25519Reply};
//! # struct MyTransport;
//! # impl NodeRpc for MyTransport {
//! #     async fn inventory(&self, id: &str) -> Result<Inventory, RpcError> { Err(RpcError::new(id, Action::Inventory, RpcErrorKind::Timeout)) }
//! #     async fn jwt(&self, id: &str, _: &str) -> Result<JwtReply, RpcError> { Err(RpcError::new(id, Action::Jwt, RpcErrorKind::Timeout)) }
//! #     async fn gen25519(&self, id: &str, _: &str, _: &str) -> Result<Ed25519Reply, RpcError> { Err(RpcError::new(id, Action::Gen25519, RpcErrorKind::Timeout)) }
//! #     async fn gencsr(&self, id: &str, _: &str, _: &str) -> Result<CsrReply, RpcError> { Err(RpcError::new(id, Action::Gencsr, RpcErrorKind::Timeout)) }
//! #     async fn configure(&self, id: &str, _: &ConfigureRequest) -> Result<ActionMessage, RpcError> { Err(RpcError::new(id, Action::Configure, RpcErrorKind::Timeout)) }
//! #     async fn release_update(&self, id: &str, _: &str, _: &str, _: &str) -> Result<ActionMessage, RpcError> { Err(RpcError::new(id, Action::ReleaseUpdate, RpcErrorKind::Timeout)) }
//! #     async fn restart(&self, id: &str, _: &str, _: u32) -> Result<ActionMessage, RpcError> { Err(RpcError::new(id, Action::Restart, RpcErrorKind::Timeout)) }
//! #     async fn shutdown(&self, id: &str, _: &str) -> Result<ActionMessage, RpcError> { Err(RpcError::new(id, Action::Shutdown, RpcErrorKind::Timeout)) }
//! # }
//!
//! /// Decides each node's configuration (a subprocess, a web service, a rule in code...).
//! struct MyHelper;
//!
//! impl Helper for MyHelper {
//!     async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
//!         let mut reply = HelperReply::default();
//!         reply.configuration = Some([("identity".to_string(), input.identity.clone())].into());
//!         Ok(reply)
//!     }
//! }
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = ProvisionConfig::builder()
//!     .token("s3cret")
//!     .features(Features::NONE.with_ed25519(true))
//!     .build()?;
//! // `MyTransport` implements `NodeRpc` over whatever the embedder talks to its nodes with.
//! let provisioner = Provisioner::builder(MyTransport, MyHelper)
//!     .config(config)
//!     .keys(StaticKeys::new().with_signing_key("…64 hex characters of ed25519 seed…"))
//!     .observer(NoopObserver)
//!     .build();
//! let fleet = Fleet::new(provisioner);
//! let shutdown = CancellationToken::new();
//! let workers = tokio::spawn(Arc::clone(&fleet).run(4, shutdown.clone()));
//! fleet.add("n1.example.net", Source::Discovery);
//! // ... until the process stops:
//! shutdown.cancel();
//! workers.await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
pub mod admission;
pub mod approval;
pub mod claims;
pub mod clock;
pub mod config;
mod erased;
pub mod events;
pub mod fleet;
pub mod identity;
pub mod keys;
mod nonce_checks;
pub mod observer;
pub mod pacing;
pub mod pause;
pub mod policy;
pub mod provision;
pub mod revocation;
pub mod rpc;
#[cfg(feature = "testing")]
pub mod testing;

pub use choria_crypto;
/// The JWT primitives, re-exported from [`choria_crypto`] (the binary and the key material use
/// this path).
pub use choria_crypto::jwt;

pub use admission::{Admission, AllowAll, Decision};
pub use approval::{Approval, HoldFuture, PendingNode};
pub use claims::{ClaimError, ClaimOutcome, Claims, Ticket};
pub use clock::{Clock, Random, SystemClock, SystemRandom};
pub use config::{Features, ProvisionConfig, ProvisionConfigBuilder, ProvisionConfigError};
pub use events::{CertificateId, Issued, NodeEvent, NodeState, ServerJwtId, Verdict};
pub use fleet::{AddResult, Fleet, Source};
pub use helper_protocol;
pub use identity::{IdentityError, IdentityRule};
pub use keys::{KeyMaterial, StaticKeys};
pub use observer::{NoopObserver, Observer};
pub use pacing::{LocalBucket, Pacer};
pub use pause::PauseState;
pub use provision::{
    Backoff, Host, Outcome, ProvisionError, ProvisionErrorKind, Provisioner, ProvisionerBuilder,
};
pub use revocation::{DenyNone, Revocation};
pub use rpc::{Helper, NodeRpc};
/// The shutdown signal [`Fleet::run`] and [`Fleet::drain`] take, from `tokio-util`.
pub use tokio_util::sync::CancellationToken;
