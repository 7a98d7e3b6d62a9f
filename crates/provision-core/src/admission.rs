//! Admission: whether a node that passed the built-in checks may go on to the helper. The cycle
//! asks an [`Admission`] after the provisioning JWT, ed25519 proof, inventory and CSR checks
//! and before the helper runs, with the input the helper would get. The core knows no policy
//! language: the binary implements the trait with its Rego policy; no admission configured
//! means every node goes on, as before.

use helper_protocol::HelperInput;

/// What an [`Admission`] decided for one node.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// The node goes on to the helper.
    Allow,
    /// The node is refused: it never reaches the helper and is never configured.
    Deny(String),
    /// The node is left for now and tried again on a later discovery, as when the helper
    /// defers it.
    Defer(String),
    /// The node waits for an operator's approval ([`crate::Approval`]) before it goes on to the
    /// helper; without an approval queue it is deferred.
    Pending(String),
}

impl Decision {
    /// `allow`, `deny`, `defer` or `pending`.
    pub fn label(&self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Deny(_) => "deny",
            Decision::Defer(_) => "defer",
            Decision::Pending(_) => "pending",
        }
    }

    /// The reason given, empty for an allow.
    pub fn reason(&self) -> &str {
        match self {
            Decision::Allow => "",
            Decision::Deny(r) | Decision::Defer(r) | Decision::Pending(r) => r,
        }
    }
}

/// A decision on its way (boxed, so that [`Admission`] can be a trait object).
pub type DecisionFuture<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Decision> + Send + 'a>>;

/// Decides whether a node may be provisioned, from the helper's input. Awaited once per cycle
/// on a worker: an implementation whose decision costs CPU (a policy language) runs it off the
/// async workers and bounds its time.
pub trait Admission: Send + Sync + 'static {
    /// The decision for the node described by `input`.
    fn decide<'a>(&'a self, input: &'a HelperInput) -> DecisionFuture<'a>;
}

/// Admits every node: today's behaviour when no policy is configured.
#[derive(Debug, Clone, Copy, Default)]
pub struct AllowAll;

impl Admission for AllowAll {
    fn decide<'a>(&'a self, _input: &'a HelperInput) -> DecisionFuture<'a> {
        Box::pin(std::future::ready(Decision::Allow))
    }
}

impl<T: Admission + ?Sized> Admission for std::sync::Arc<T> {
    fn decide<'a>(&'a self, input: &'a HelperInput) -> DecisionFuture<'a> {
        (**self).decide(input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn allow_all_allows_and_labels_read_as_documented() {
        let input = HelperInput {
            identity: "n1".into(),
            csr: None,
            ed25519_pubkey: None,
            inventory: String::new(),
            jwt: None,
            dry_run: false,
        };
        assert_eq!(AllowAll.decide(&input).await, Decision::Allow);
        assert_eq!(Decision::Deny("x".into()).label(), "deny");
        assert_eq!(Decision::Defer("later".into()).reason(), "later");
        assert_eq!(Decision::Allow.reason(), "");
    }
}
