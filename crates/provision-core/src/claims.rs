//! Claims: active-active coordination between provisioners sharing one fleet. Before anything is
//! sent to a node, the cycle asks a [`Claims`] store for the node; only the replica whose claim
//! went through identifies it, runs the helper and configures it. The claim is kept while the
//! cycle runs, marked done after a successful cycle (so the others leave the node alone while
//! it restarts) and released after a failed one (so any replica may try again).
//!
//! The core knows no store: the binary implements the trait over a JetStream key-value bucket.
//! Without one (leader election or a single provisioner) the cycle runs as before.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// The boxed future a [`Claims`] method returns (the trait is used as a trait object).
pub type ClaimFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A claim this replica holds on one node: the store's key and the revision last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The node.
    pub identity: String,
    /// The store's key for the node.
    pub key: String,
    /// The revision of the claim as last written by this replica.
    pub revision: u64,
}

/// What asking for a node's claim gave.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The node is ours: go on.
    Claimed(Ticket),
    /// Another replica holds the node (`done`: it finished it and the node is restarting).
    Taken {
        /// The replica holding it, as written in the claim (escaped before logging).
        by: String,
        /// The other replica finished the node.
        done: bool,
    },
}

/// A claim operation that could not be confirmed (the store is unreachable, timed out, or the
/// claim was lost to expiry). The node is not started: the replica does not guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("claim {action} for {identity}: {detail}")]
pub struct ClaimError {
    /// The node.
    pub identity: String,
    /// `claim`, `keep`, `done` or `release`.
    pub action: &'static str,
    /// What failed.
    pub detail: String,
}

/// The shared store of claims, one implementation per transport.
pub trait Claims: Send + Sync + 'static {
    /// Claim `identity` for this replica, atomically: at most one replica gets `Claimed` for a
    /// node until the claim is released or expires.
    fn claim<'a>(&'a self, identity: &'a str) -> ClaimFuture<'a, Result<ClaimOutcome, ClaimError>>;
    /// Extend the claim's life; fails when the claim was lost (expired and taken by another
    /// replica) or cannot be confirmed.
    fn keep<'a>(&'a self, ticket: &'a mut Ticket) -> ClaimFuture<'a, Result<(), ClaimError>>;
    /// Mark the node done after a successful cycle.
    fn done(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>>;
    /// Give the node up after a failed cycle, so any replica may take it again.
    fn release(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>>;
    /// How often a claim is kept while its cycle runs (a third of its lifetime).
    fn keep_every(&self) -> Duration;
}

impl<T: Claims + ?Sized> Claims for std::sync::Arc<T> {
    fn claim<'a>(&'a self, identity: &'a str) -> ClaimFuture<'a, Result<ClaimOutcome, ClaimError>> {
        (**self).claim(identity)
    }
    fn keep<'a>(&'a self, ticket: &'a mut Ticket) -> ClaimFuture<'a, Result<(), ClaimError>> {
        (**self).keep(ticket)
    }
    fn done(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>> {
        (**self).done(ticket)
    }
    fn release(&self, ticket: Ticket) -> ClaimFuture<'_, Result<(), ClaimError>> {
        (**self).release(ticket)
    }
    fn keep_every(&self) -> Duration {
        (**self).keep_every()
    }
}
