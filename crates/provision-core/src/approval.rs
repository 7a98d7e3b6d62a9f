//! The approval queue as the cycle sees it ([`Approval`]): with `approval: manual`, or when the
//! admission policy answers `pending`, a node that passed the deny list and the built-in checks
//! is not given to the helper until an operator approves it. The node is recorded as pending
//! (where is the implementer's business: the provisioner keeps it in its fleet control bucket)
//! and left in provisioning mode; the next discovery finds it again. An approval is bound to the
//! node's identity and the fingerprints of the keys it presented, so a different key under the
//! same name is not approved.

use helper_protocol::HelperInput;

/// A node waiting for an operator, as handed to [`Approval::hold`].
#[derive(Debug, Clone, Copy)]
pub struct PendingNode<'a> {
    /// The node's identity (checked by the identity rule).
    pub identity: &'a str,
    /// The fingerprints of the keys it presented ([`crate::revocation::key_fingerprints`]).
    pub keys: &'a [String],
    /// What the helper would be given (the provisioning token emptied).
    pub input: &'a HelperInput,
    /// Why it waits: `approval: manual`, or the policy's reason.
    pub reason: &'a str,
}

/// A hold on its way (boxed, so that [`Approval`] can be a trait object): `Err` with what
/// failed when the node could not be recorded.
pub type HoldFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>;

/// Whether a node needs, and has, an operator's approval.
pub trait Approval: Send + Sync + 'static {
    /// Whether every node waits for an operator (`approval: manual`); otherwise only the nodes
    /// the admission policy marks pending do.
    fn manual(&self) -> bool;

    /// The approval that applies to `identity` presenting `keys` (who approved it and when),
    /// or `None`. Cheap and never blocking: it runs on the async workers.
    fn approved(&self, identity: &str, keys: &[String]) -> Option<String>;

    /// Records the node as pending. Called at every cycle of a node that waits: an
    /// implementation bounds its own writes.
    fn hold<'a>(&'a self, node: PendingNode<'a>) -> HoldFuture<'a>;
}

impl<T: Approval + ?Sized> Approval for std::sync::Arc<T> {
    fn manual(&self) -> bool {
        (**self).manual()
    }
    fn approved(&self, identity: &str, keys: &[String]) -> Option<String> {
        (**self).approved(identity, keys)
    }
    fn hold<'a>(&'a self, node: PendingNode<'a>) -> HoldFuture<'a> {
        (**self).hold(node)
    }
}
