//! A simulated fleet of go-choria servers in provisioning mode, thousands in one process on one
//! NATS connection: the provisioner's end-to-end test bed, benchmark load and demo fleet.
//!
//! Start one with [`Fleet::start`] and a [`FleetConfig`]; read its progress with
//! [`Fleet::stats`], [`Fleet::wait_provisioned`] and what each node received with
//! [`Fleet::report`].

pub mod config;
pub mod crypto;
pub mod fleet;
pub mod node;

pub use config::{FaultKind, Faults, FleetConfig, Mode, ProvisioningJwt};
pub use fleet::{Fleet, FleetError, Stats};
pub use node::{ActionSeen, NodeReport, Phase, Received};
