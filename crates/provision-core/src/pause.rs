//! Whether provisioning is paused ([`PauseState`]): one switch shared by every task, flipped by
//! the leader election or an operator, checked by the work queue before it queues a node and by
//! the cycle before every step.

use std::sync::Arc;

use tokio::sync::watch;

/// Whether provisioning is paused: shared by every task, changed by leader election or an
/// operator. Cloning shares the same state; [`PauseState::subscribe`] follows changes (for the
/// paused gauge, or to wake up when provisioning resumes).
#[derive(Debug, Clone)]
pub struct PauseState {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for PauseState {
    fn default() -> Self {
        Self::new(false)
    }
}

impl PauseState {
    /// A new state, paused or not.
    pub fn new(paused: bool) -> Self {
        PauseState {
            tx: Arc::new(watch::Sender::new(paused)),
        }
    }

    /// Stops provisioning: every step checks this before it starts.
    pub fn pause(&self) {
        self.tx.send_replace(true);
    }

    /// Allows provisioning again.
    pub fn resume(&self) {
        self.tx.send_replace(false);
    }

    /// Inverts the state.
    pub fn flip(&self) {
        self.tx.send_modify(|p| *p = !*p);
    }

    /// Whether provisioning is paused now.
    pub fn paused(&self) -> bool {
        *self.tx.borrow()
    }

    /// A receiver that sees every change.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pause_state_is_shared_between_clones() {
        let p = PauseState::default();
        let q = p.clone();
        let rx = p.subscribe();
        assert!(!q.paused());
        p.pause();
        assert!(q.paused());
        assert!(rx.has_changed().unwrap());
        q.flip();
        assert!(!p.paused());
        q.flip();
        assert!(p.paused());
        p.resume();
        assert!(!q.paused());
    }
}
