//! Whether provisioning is paused ([`PauseState`]): one switch shared by every task, checked by
//! the work queue before it queues or starts a node. Two things pause it: the leader election
//! (a standby; the cycles in flight stop at their next step, since another instance now leads)
//! and an operator's hold ([`PauseState::hold`], the kill switch: nothing new starts, the cycles
//! in flight finish).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

/// Whether provisioning is paused: shared by every task, changed by leader election or an
/// operator. Cloning shares the same state; [`PauseState::subscribe`] follows changes (for the
/// paused gauge, or to wake up when provisioning resumes).
#[derive(Debug, Clone)]
pub struct PauseState {
    tx: Arc<watch::Sender<bool>>,
    /// The election's part (and [`PauseState::pause`]'s), and the operator's hold.
    parts: Arc<Mutex<(bool, bool)>>,
    /// The election's part alone, read by every step of a cycle.
    standby: Arc<AtomicBool>,
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
            parts: Arc::new(Mutex::new((paused, false))),
            standby: Arc::new(AtomicBool::new(paused)),
        }
    }

    fn set(&self, change: impl FnOnce(&mut (bool, bool))) {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut parts);
        self.standby.store(parts.0, Ordering::SeqCst);
        let paused = parts.0 || parts.1;
        self.tx
            .send_if_modified(|p| std::mem::replace(p, paused) != paused);
    }

    /// Stops provisioning (the leader election's switch): nothing is queued or started, and
    /// every step of a cycle in flight checks this before it starts.
    pub fn pause(&self) {
        self.set(|p| p.0 = true);
    }

    /// Allows provisioning again, unless an operator's hold is on.
    pub fn resume(&self) {
        self.set(|p| p.0 = false);
    }

    /// Inverts the election's switch.
    pub fn flip(&self) {
        self.set(|p| p.0 = !p.0);
    }

    /// The operator's hold (the kill switch): while it is on nothing is queued or started, but
    /// the cycles in flight finish.
    pub fn hold(&self, on: bool) {
        self.set(|p| p.1 = on);
    }

    /// Whether the operator's hold is on.
    pub fn held(&self) -> bool {
        self.parts.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    /// Whether the election's switch is on: the cycles in flight stop at their next step.
    pub fn stops_cycles(&self) -> bool {
        self.standby.load(Ordering::SeqCst)
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

    #[test]
    fn a_hold_pauses_new_work_but_not_the_cycles_in_flight_and_outlasts_a_resume() {
        let p = PauseState::new(true);
        p.hold(true);
        p.resume();
        assert!(p.paused(), "the hold keeps it paused");
        assert!(!p.stops_cycles());
        assert!(p.held());
        let rx = p.subscribe();
        p.hold(false);
        assert!(!p.paused());
        assert!(rx.has_changed().unwrap());
        p.pause();
        assert!(p.paused() && p.stops_cycles() && !p.held());
    }
}
