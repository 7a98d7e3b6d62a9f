//! The Choria wire protocol over NATS: envelopes, security, RPC, discovery, lifecycle events and
//! leader election.

pub mod agents;
pub mod config;
pub mod connection;
pub mod election;
pub mod lifecycle;
pub mod mcorpc;
pub mod protocol;
pub mod rpc;
