//! A subscription to lifecycle events of one type and component: each message read, bounded
//! and parsed, dropped events counted and logged at most every ten seconds.

use super::*;

/// A subscription yielding parsed lifecycle events.
#[derive(Debug)]
pub struct LifecycleSubscription {
    pub(super) sub: async_nats::Subscriber,
    pub(super) max_size: usize,
    /// When a dropped event was last logged, and how many were dropped since.
    pub(super) dropped_log: (Option<Instant>, u64),
}

/// At most one line about dropped (oversized or unparsable) events in this long.
pub(super) const DROPPED_EVENT_LOG_EVERY: Duration = Duration::from_secs(10);

impl LifecycleSubscription {
    /// Subscribe on `nats` to `choria.lifecycle.event.<event_type>.<component>` (in
    /// `queue_group` when given), dropping events larger than `max_size` bytes. The connection
    /// may be one of its own (see
    /// [`EVENT_SUBSCRIPTION_CAPACITY`](crate::connection::EVENT_SUBSCRIPTION_CAPACITY)).
    pub async fn subscribe(
        nats: &async_nats::Client,
        event_type: &str,
        component: &str,
        queue_group: Option<&str>,
        max_size: usize,
    ) -> Result<Self, RequestError> {
        let subject = format!("choria.lifecycle.event.{event_type}.{component}");
        let res = match queue_group {
            Some(q) => nats.queue_subscribe(subject.clone(), q.to_string()).await,
            None => nats.subscribe(subject.clone()).await,
        };
        let transport = |e: Source| {
            RequestError::new(
                "*",
                format!("subscribe {subject}"),
                RequestErrorKind::Transport,
            )
            .with_source(e)
        };
        let sub = res.map_err(|e| transport(e.into()))?;
        crate::connection::round_trip(nats, ROUND_TRIP_TIMEOUT)
            .await
            .map_err(|e| transport(e.into()))?;
        Ok(LifecycleSubscription {
            sub,
            max_size,
            dropped_log: (None, 0),
        })
    }

    /// The next event that parses; `None` when the subscription ends. Oversized and
    /// unparsable events are dropped, with one line for them at most every ten seconds.
    pub async fn next(&mut self) -> Option<ReceivedEvent> {
        while let Some(msg) = self.sub.next().await {
            let why = if msg.payload.len() > self.max_size {
                format!(
                    "{} bytes, over the {} allowed",
                    msg.payload.len(),
                    self.max_size
                )
            } else {
                match LifecycleEvent::parse(&msg.payload) {
                    Ok(ev) => return Some(ev),
                    Err(e) => e.to_string(),
                }
            };
            let (last, count) = &mut self.dropped_log;
            *count += 1;
            if last.is_none_or(|t| t.elapsed() >= DROPPED_EVENT_LOG_EVERY) {
                *last = Some(Instant::now());
                tracing::warn!(
                    subject = %msg.subject,
                    "dropped {} lifecycle events that were oversized or unparsable, the latest: {why}",
                    std::mem::take(count)
                );
            }
        }
        None
    }

    /// Stop receiving.
    pub async fn unsubscribe(mut self) {
        // Unsubscribing a dead connection has nothing left to clean up.
        let _ = self.sub.unsubscribe().await;
    }
}
