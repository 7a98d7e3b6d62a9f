//! Metric hooks the cycle and the work queue call ([`Observer`]); the binary records them as the
//! Go provisioner's Prometheus metrics, embedders as they like.

use std::time::Duration;

/// Metric hooks, called from the cycle and the work queue. Every method has an empty default,
/// so an implementation overrides only what it records. Names follow the Go provisioner's
/// metrics (`choria_provisioner_*`).
pub trait Observer: Send + Sync + 'static {
    /// One RPC try took `elapsed` (`rpc_time{rpc=label}`).
    fn rpc_time(&self, _label: &'static str, _elapsed: Duration) {}
    /// An RPC failed after its tries (`rpc_errors{rpc=label}`).
    fn rpc_error(&self, _label: &'static str) {}
    /// The helper ran for `elapsed` (`helper_time`).
    fn helper_time(&self, _elapsed: Duration) {}
    /// The helper failed (`helper_errors`).
    fn helper_error(&self) {}
    /// A node was shut down on the helper's request (`helper_shutdown_requests`).
    fn helper_shutdown(&self) {}
    /// A node finished successfully (`provisioned`).
    fn provisioned(&self) {}
    /// A node failed (`provision_errors`).
    fn provision_error(&self) {}
    /// A node's lock is held by another provisioner; not an error.
    fn lock_held(&self) {}
    /// A node identity was refused before anything was done for it
    /// (`invalid_identities`, not in the Go set).
    fn invalid_identity(&self) {}
    /// A node was queued by discovery (`discovered`).
    fn discovered(&self) {}
    /// A node was queued by a startup event (`event_discovered`).
    fn event_discovered(&self) {}
    /// A discovery round ran (`discover_cycles`).
    fn discover_cycle(&self) {}
    /// A discovery round failed (`discovery_errors`).
    fn discovery_error(&self) {}
    /// Workers provisioning right now (`busy_workers`).
    fn busy_workers(&self, _n: usize) {}
    /// Entries waiting in the work queue (`work_queue_entries`).
    fn work_queue_entries(&self, _n: usize) {}
    /// Nodes known to the host table (`waiting_nodes`).
    fn waiting_nodes(&self, _n: usize) {}
    /// Whether provisioning is paused (`paused`).
    fn paused(&self, _paused: bool) {}
    /// The admission policy decided for a node (a denial is counted as `policy_denied`). The
    /// hook a node history or audit record would record the decision through.
    fn admission(&self, _identity: &str, _decision: &crate::admission::Decision) {}
    /// Something happened to a node: queued, taken by a worker, a step ended, the cycle ended
    /// (see [`crate::events`]); the hook a node history or an audit trail records through.
    fn node_event(&self, _identity: &str, _event: &crate::events::NodeEvent<'_>) {}
}

/// A shared observer (for example metrics also served over HTTP) observes through its `Arc`.
impl<T: Observer + ?Sized> Observer for std::sync::Arc<T> {
    fn rpc_time(&self, label: &'static str, elapsed: Duration) {
        (**self).rpc_time(label, elapsed)
    }
    fn rpc_error(&self, label: &'static str) {
        (**self).rpc_error(label)
    }
    fn helper_time(&self, elapsed: Duration) {
        (**self).helper_time(elapsed)
    }
    fn helper_error(&self) {
        (**self).helper_error()
    }
    fn helper_shutdown(&self) {
        (**self).helper_shutdown()
    }
    fn provisioned(&self) {
        (**self).provisioned()
    }
    fn provision_error(&self) {
        (**self).provision_error()
    }
    fn lock_held(&self) {
        (**self).lock_held()
    }
    fn invalid_identity(&self) {
        (**self).invalid_identity()
    }
    fn discovered(&self) {
        (**self).discovered()
    }
    fn event_discovered(&self) {
        (**self).event_discovered()
    }
    fn discover_cycle(&self) {
        (**self).discover_cycle()
    }
    fn discovery_error(&self) {
        (**self).discovery_error()
    }
    fn busy_workers(&self, n: usize) {
        (**self).busy_workers(n)
    }
    fn work_queue_entries(&self, n: usize) {
        (**self).work_queue_entries(n)
    }
    fn waiting_nodes(&self, n: usize) {
        (**self).waiting_nodes(n)
    }
    fn paused(&self, paused: bool) {
        (**self).paused(paused)
    }
    fn admission(&self, identity: &str, decision: &crate::admission::Decision) {
        (**self).admission(identity, decision)
    }
    fn node_event(&self, identity: &str, event: &crate::events::NodeEvent<'_>) {
        (**self).node_event(identity, event)
    }
}

/// Two observers observe everything in turn (metrics and a node history, say): `(a, b)`.
impl<A: Observer, B: Observer> Observer for (A, B) {
    fn rpc_time(&self, label: &'static str, elapsed: Duration) {
        self.0.rpc_time(label, elapsed);
        self.1.rpc_time(label, elapsed);
    }
    fn rpc_error(&self, label: &'static str) {
        self.0.rpc_error(label);
        self.1.rpc_error(label);
    }
    fn helper_time(&self, elapsed: Duration) {
        self.0.helper_time(elapsed);
        self.1.helper_time(elapsed);
    }
    fn helper_error(&self) {
        self.0.helper_error();
        self.1.helper_error();
    }
    fn helper_shutdown(&self) {
        self.0.helper_shutdown();
        self.1.helper_shutdown();
    }
    fn provisioned(&self) {
        self.0.provisioned();
        self.1.provisioned();
    }
    fn provision_error(&self) {
        self.0.provision_error();
        self.1.provision_error();
    }
    fn lock_held(&self) {
        self.0.lock_held();
        self.1.lock_held();
    }
    fn invalid_identity(&self) {
        self.0.invalid_identity();
        self.1.invalid_identity();
    }
    fn discovered(&self) {
        self.0.discovered();
        self.1.discovered();
    }
    fn event_discovered(&self) {
        self.0.event_discovered();
        self.1.event_discovered();
    }
    fn discover_cycle(&self) {
        self.0.discover_cycle();
        self.1.discover_cycle();
    }
    fn discovery_error(&self) {
        self.0.discovery_error();
        self.1.discovery_error();
    }
    fn busy_workers(&self, n: usize) {
        self.0.busy_workers(n);
        self.1.busy_workers(n);
    }
    fn work_queue_entries(&self, n: usize) {
        self.0.work_queue_entries(n);
        self.1.work_queue_entries(n);
    }
    fn waiting_nodes(&self, n: usize) {
        self.0.waiting_nodes(n);
        self.1.waiting_nodes(n);
    }
    fn paused(&self, paused: bool) {
        self.0.paused(paused);
        self.1.paused(paused);
    }
    fn admission(&self, identity: &str, decision: &crate::admission::Decision) {
        self.0.admission(identity, decision);
        self.1.admission(identity, decision);
    }
    fn node_event(&self, identity: &str, event: &crate::events::NodeEvent<'_>) {
        self.0.node_event(identity, event);
        self.1.node_event(identity, event);
    }
}

/// An observer that records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl Observer for NoopObserver {}
