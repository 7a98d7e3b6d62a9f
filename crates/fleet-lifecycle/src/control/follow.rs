//! The daemon's side of fleet control: [`Follower`] opens the bucket and follows it for as
//! long as the daemon runs, opening it again after a failure.

use super::*;

/// The daemon's side: opens (creating) the bucket and follows it for as long as `stop` allows,
/// opening it again after `retry` whenever it cannot be reached; `resumed` is notified when the
/// operator's pause is lifted. Errors are logged once per
/// kind of failure in a row.
/// What the daemon follows the bucket with ([`Follower::run`]).
#[derive(Debug)]
pub struct Follower {
    /// The broker connection.
    pub client: async_nats::Client,
    /// The replica's identity.
    pub by: String,
    /// Checks the records' tags.
    pub seal: Seal,
    /// Where the deny list goes.
    pub view: Arc<ControlView>,
    /// Where the operator's pause goes.
    pub pause: PauseState,
    /// Notified when the pause is lifted.
    pub resumed: Arc<tokio::sync::Notify>,
    /// How long to wait before opening the bucket again after a failure.
    pub retry: Duration,
    /// Where the bucket goes once opened, for the approval queue's writes.
    pub slot: Arc<ControlSlot>,
}

impl Follower {
    /// Follows until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let Follower {
            client,
            by,
            seal,
            view,
            pause,
            resumed,
            retry,
            slot,
        } = self;
        let mut last_error = String::new();
        loop {
            let res = match Control::open(client.clone(), &by, seal.clone(), true).await {
                Ok(c) => {
                    last_error.clear();
                    slot.set(c.clone());
                    c.follow(&view, &pause, &resumed, &stop).await
                }
                Err(e) => Err(e),
            };
            if stop.is_cancelled() {
                return;
            }
            if let Err(e) = res {
                let text = e.to_string();
                if text != last_error {
                    error!("fleet control: {text}; pause and deny list changes are not seen until this is fixed (the last ones seen still apply)");
                    last_error = text;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = stop.cancelled() => return,
            }
        }
    }
}

/// The fleet control bucket once the daemon's follower has opened it: where pending records
/// are written and the status page's decisions go.
#[derive(Debug, Default)]
pub struct ControlSlot(RwLock<Option<Control>>);

impl ControlSlot {
    /// An empty slot.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Sets the bucket opened.
    pub fn set(&self, control: Control) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = Some(control);
    }

    /// The bucket, once opened.
    pub fn get(&self) -> Option<Control> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
