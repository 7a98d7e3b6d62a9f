//! The Choria wire protocol over NATS: envelopes, security, RPC, discovery, lifecycle events and
//! leader election.
//!
//! Layers, bottom up:
//!
//! * [`protocol`]: version 1 and 2 envelopes in both directions (client: [`protocol::encode_request`],
//!   [`protocol::parse_reply`]; server: [`protocol::ServerRequest::parse`],
//!   [`protocol::build_reply`]), filters, request ids, reply subjects and the security modes.
//!   No I/O.
//! * [`mcorpc`]: the MCollective RPC bodies inside the envelopes; [`lifecycle`]: lifecycle
//!   events in the Choria and CloudEvents formats.
//! * [`config`]: the Choria client configuration file and the provisioner's overrides.
//! * [`brokers`]: where the brokers are (configured, SRV records, `puppet:4222`).
//! * [`connection`]: the one shared NATS connection.
//! * [`rpc`]: [`rpc::RpcClient`], a cheap-to-clone handle for directed requests, discovery and
//!   lifecycle events; [`agents`] adds typed `rpcutil` and `choria_provision` calls to it.
//! * [`streams`]: which route reaches Choria Streams (JetStream) from this connection;
//!   [`election`]: leader election on it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use choria_rpc_client::config::{ChoriaConfig, ProvisionerOverrides};
//! use choria_rpc_client::rpc::RpcClient;
//! use std::time::Duration;
//!
//! let mut cfg = ChoriaConfig::load(&choria_rpc_client::config::user_config_path())?;
//! cfg.apply_provisioner_overrides(&ProvisionerOverrides { insecure: true, ..Default::default() });
//! let rpc = RpcClient::connect(&cfg).await?;
//! for node in rpc.discover_provisionable().await?.iter() {
//!     let inv = rpc.inventory(node, Duration::from_secs(4)).await?;
//!     println!("{node} runs {}", inv.version);
//! }
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]
pub mod agents;
pub mod brokers;
pub mod config;
pub mod connection;
pub mod duration;
pub mod election;
pub mod host;
pub mod lifecycle;
pub mod mcorpc;
pub mod protocol;
pub mod rpc;
pub mod streams;
mod text;

/// The NATS client the connection and [`rpc::RpcClient::nats`] hand out.
pub use async_nats;
