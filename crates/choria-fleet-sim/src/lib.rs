//! A simulated fleet of go-choria servers in provisioning mode, thousands in one process on one
//! NATS connection: the provisioner's end-to-end test bed, benchmark load and demo fleet.
//!
//! Start one with [`SimFleet::start`] and a [`FleetConfig`]; read its progress with
//! [`SimFleet::stats`], [`SimFleet::wait_provisioned`] and what each node received with
//! [`SimFleet::report`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use choria_fleet_sim::{crypto::JwtSigner, SimFleet, FleetConfig, Mode, ProvisioningJwt};
//! let signer = JwtSigner::from_key_data(&std::fs::read("prov-signer-key.pem")?)?;
//! let mut cfg = FleetConfig::new("nats://127.0.0.1:4222", 500, "s3cret", ProvisioningJwt::Sign(signer));
//! cfg.mode = Mode::Pki;
//! let fleet = SimFleet::start(cfg).await?;
//! // ... run a provisioner against it ...
//! let all = fleet.wait_provisioned(500, std::time::Duration::from_secs(120)).await;
//! let report = fleet.report(); // one NodeReport per node
//! fleet.shutdown().await;
//! # let _ = (all, report); Ok(()) }
//! ```
//!
//! Nodes behave like go-choria servers in provisioning mode on the wire: they drop requests in
//! the other protocol version or outside their TTL, answer broadcasts when the filter matches,
//! reply under their identity to the transport's reply subject, hold the provisioning lock per
//! sender and caller, and after `configure` and `restart` leave the `provisioning` collective.
//! A restarted node counts as provisioned only when its configuration would work: it turns
//! provisioning off, and in [`Mode::Pki`] it has a certificate for its key, in
//! [`Mode::Ed25519`] a server JWT for its identity and `gen25519` key. A configuration that
//! leaves provisioning on brings the node back into provisioning mode, as go-choria's does.
//!
//! With [`FleetConfig::stay_online`] a provisioned node stays connected as a provisioned
//! go-choria server: it answers on the collectives of the configuration it was given
//! (`main_collective`/`collectives`, else go-choria's default `mcollective`, or `choria` with
//! the `choria` security provider), broadcast discovery when the filter matches, `rpcutil`,
//! `choria_util` and `choria_provision`, whose `reprovision` brings it back into provisioning
//! mode after a delay with fresh keys and a new startup event, so it can be provisioned again.
//! [`FleetConfig::preprovisioned`] nodes start that way. Requests on a main collective must
//! carry a signature that verifies (v1: against the certificate in the request, v2: against
//! the caller JWT's `public_key`); unlike go-choria, the simulator does not check that
//! certificate's chain or the caller JWT's issuer, and applies no RPC authorization. Replies
//! are unsigned, as in provisioning mode. Each enrollment's credential identifiers are in
//! [`NodeReport::enrollments`].

pub mod config;
pub mod crypto;
pub mod fleet;
pub mod node;

pub use config::{FaultKind, Faults, FleetConfig, Mode, ProvisioningJwt};
pub use fleet::{FleetError, NodeError, SimFleet, Stats};
pub use node::{ActionSeen, Enrollment, EnrollmentSource, NodeReport, Phase, Received};
