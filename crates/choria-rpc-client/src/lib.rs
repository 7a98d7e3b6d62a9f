//! The Choria wire protocol over NATS: envelopes, security, RPC, discovery, lifecycle events and
//! leader election.

pub mod election;
