//! The provisioning engine of the Choria provisioner, free of any transport so other tools can
//! embed it.
//!
//! The crate does no I/O of its own: no files, no processes, no sockets, no signals. What it
//! needs from outside comes through traits an embedder implements:
//!
//! * [`rpc`]: [`NodeRpc`] (directed RPCs to one node) and [`Helper`] (the site helper; the
//!   binary runs helper-protocol's subprocess `HelperRunner`, its `runner` feature, behind it;
//!   this crate uses helper-protocol without that feature).
//! * [`keys`]: [`KeyMaterial`], the keys of enrolment, asked for every node ([`StaticKeys`]
//!   holds keys loaded once).
//! * [`observer`]: [`Observer`], the metric hooks, and [`events`]: what it is told about each
//!   node for a history or an audit trail ([`NodeEvent`], [`Verdict`]).
//! * [`clock`]: [`Clock`] (wall time) and [`Random`] (nonces and jitter).
//! * [`claims`]: [`Claims`], the shared store through which active-active replicas claim a
//!   node before provisioning it (optional).
//!
//! And the engine itself:
//!
//! * [`config`]: the YAML configuration; [`pause`]: the shared pause state.
//! * [`provision`]: the cycle of one node ([`Provisioner::provision`]).
//! * [`fleet`]: the host table, the bounded work queue and the worker pool ([`Fleet`]).
//! * [`policy`], [`jwt`], [`keyenc`]: the checks and the cryptography of enrolment.
//!
//! # Wiring your own transport
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use provision_core::rpc::*;
//! use provision_core::{Backoff, Config, Fleet, NoopObserver, PauseState, Provisioner, Source, StaticKeys};
//! use provision_core::helper_protocol::{
//!     CsrReply, Ed25519Reply, HelperError, HelperInput, HelperReply,
//! };
//!
//! /// Sends each action to one node over whatever the embedder talks.
//! struct MyTransport;
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
//! let helper = MyHelper;
//! // Keys loaded once; the binary's implementation reads rotated files again.
//! let keys = StaticKeys::new().with_signing_key(std::fs::read_to_string("/etc/choria/signer.seed")?);
//! // The embedder's own pacing (the binary passes go-choria's FiveSec table from the client).
//! let backoff = Backoff::from_steps(&[Duration::from_millis(500), Duration::from_secs(2)], true);
//! let workers = config.workers;
//! let provisioner = Provisioner::new(
//!     config, PauseState::default(), MyTransport, helper, NoopObserver, keys, backoff,
//! );
//! let fleet = Fleet::new(provisioner);
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let runner = tokio::spawn(fleet.clone().run(workers, shutdown.clone()));
//! fleet.add("n1.example.net", Source::Discovery);
//! shutdown.cancel();
//! runner.await?;
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
pub mod admission;
pub mod claims;
pub mod clock;
pub mod config;
pub mod events;
pub mod fleet;
pub mod identity;
pub mod keyenc;
pub mod keys;
pub mod observer;
pub mod pause;
pub mod policy;
pub mod provision;
pub mod rpc;

pub use choria_crypto;
/// The JWT primitives, re-exported from [`choria_crypto`] (the binary and the key material use
/// this path).
pub use choria_crypto::jwt;

pub use admission::{Admission, AllowAll, Decision};
pub use claims::{ClaimError, ClaimOutcome, Claims, Ticket};
pub use clock::{Clock, Random, SystemClock, SystemRandom};
pub use config::{Config, ConfigError, ConfigWarning, Features, Loaded, WebhookSettings};
pub use events::{CertificateId, Issued, NodeEvent, NodeState, ServerJwtId, Verdict};
pub use fleet::{AddResult, Fleet, Source};
pub use helper_protocol;
pub use identity::{IdentityError, IdentityRule};
pub use keys::{KeyMaterial, StaticKeys};
pub use observer::{NoopObserver, Observer};
pub use pause::PauseState;
pub use provision::{Backoff, Host, Outcome, ProvisionError, ProvisionErrorKind, Provisioner};
pub use rpc::{Helper, NodeRpc};
