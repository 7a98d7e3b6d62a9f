//! The one reply dispatcher: every message on the client's reply subscription routed by its
//! request id to the request waiting for it, checked (sender, signature, size) on the way;
//! discovery's answers collected unparsed, and the connection's state followed.

use super::*;

pub(super) fn is_connected(nats: &async_nats::Client) -> bool {
    nats.connection_state() == async_nats::connection::State::Connected
}

/// Feeds [`RpcClient::connection_watch`] until the client is dropped (which aborts this task).
pub(super) async fn poll_connection(inner: std::sync::Weak<Inner>) {
    loop {
        tokio::time::sleep(CONNECTION_POLL).await;
        // Not upgradable only while the client is still being built.
        let Some(inner) = inner.upgrade() else {
            continue;
        };
        let up = is_connected(&inner.nats);
        inner
            .connected
            .send_if_modified(|was| std::mem::replace(was, up) != up);
    }
}

/// How often a request waiting for the broker connection looks at it.
pub(super) const RECONNECT_POLL: Duration = Duration::from_millis(50);

pub(super) async fn dispatch(inner: std::sync::Weak<Inner>, mut sub: async_nats::Subscriber) {
    while let Some(msg) = sub.next().await {
        // Not upgradable only while the client is still being built (it aborts this task when
        // dropped), so keep going.
        let Some(inner) = inner.upgrade() else {
            continue;
        };
        handle_reply(&inner, &msg);
    }
    // The subscription ended (client closed): wake every waiter with a closed channel.
    if let Some(inner) = inner.upgrade() {
        lock(&inner.pending).clear();
    }
}

pub(super) fn handle_reply(inner: &Inner, msg: &async_nats::Message) {
    let c = &inner.counters;
    let count = |a: &AtomicU64| {
        a.fetch_add(1, Ordering::Relaxed);
    };
    let subject = msg.subject.as_str();
    let Some(subject_id) = subject
        .strip_prefix(inner.reply_prefix.as_str())
        .and_then(|s| s.strip_prefix('.'))
    else {
        count(&c.unexpected);
        return;
    };
    if let Some(status) = msg.status {
        // A status message from the broker, not a Choria reply: never parsed as one.
        handle_status(inner, subject, subject_id, status, msg.payload.is_empty());
        return;
    }
    if msg.payload.len() > inner.opts.max_reply_size {
        count(&c.dropped_oversize);
        tracing::warn!(
            subject,
            size = msg.payload.len(),
            limit = inner.opts.max_reply_size,
            "dropping oversized reply"
        );
        return;
    }
    // Cheap check first: replies for requests that already finished are common (late
    // discovery answers, timeouts) and need no parsing. A discovery's replies are handed to it
    // whole.
    let known = match lock(&inner.pending).get(subject_id) {
        None => false,
        Some(Pending::Discovery { tx }) => {
            // A discovery that has just ended drops what it does not read any more (the payload is
            // shared, not copied).
            let _ = tx.send(msg.payload.clone());
            return;
        }
        Some(Pending::Directed { .. }) => true,
    };
    if !known {
        count(&c.unexpected);
        let late = inner
            .finished_discoveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|id| id == subject_id);
        if late {
            count(&c.late_discovery);
        }
        tracing::debug!(subject, "dropping reply for no pending request");
        return;
    }
    let Some(reply) = checked_reply(inner, subject, subject_id, &msg.payload) else {
        return;
    };
    let mut pending = lock(&inner.pending);
    match pending.get(subject_id) {
        Some(Pending::Directed { target, .. }) => {
            if *target != reply.sender {
                let target = target.clone();
                drop(pending);
                count(&c.dropped_wrong_sender);
                tracing::warn!(
                    subject,
                    sender = %reply.sender,
                    expected = %target,
                    "dropping reply from a node that was not asked"
                );
                return;
            }
            if let Some(Pending::Directed { tx, .. }) = pending.remove(subject_id) {
                drop(pending);
                count(&c.replies);
                // The waiter may have timed out in the meantime; nothing to do then.
                let _ = tx.send(Delivery::Reply(reply));
            }
        }
        _ => count(&c.unexpected),
    }
}

/// The reply in `payload`, received on `subject` for request `id`, when it parses, speaks this
/// client's protocol version and answers that request; anything else is counted and dropped
/// with a log line. The one check of directed and discovery replies alike.
pub(super) fn checked_reply(
    inner: &Inner,
    subject: &str,
    id: &str,
    payload: &[u8],
) -> Option<Reply> {
    let c = &inner.counters;
    let reply = match protocol::parse_reply(payload) {
        Ok(r) => r,
        Err(e) => {
            c.dropped_malformed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(subject, error = %e, "dropping malformed reply");
            return None;
        }
    };
    if reply.version != inner.security.version() {
        c.dropped_malformed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(subject, sender = %reply.sender, "dropping reply in the wrong protocol version");
        return None;
    }
    if reply.request_id != id {
        c.dropped_wrong_request.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            subject,
            sender = %reply.sender,
            request_id = %reply.request_id,
            "dropping reply whose request id does not match its subject"
        );
        return None;
    }
    Some(reply)
}

/// What discoveries have found so far: the identities in arrival order, and an index of them
/// (positions in `found`, hashed by identity) to drop repeats: each identity is held once,
/// however many nodes answer with it.
#[derive(Default)]
pub(super) struct Collected {
    pub(super) found: Discovered,
    pub(super) seen: hashbrown::HashTable<u32>,
    pub(super) hasher: std::collections::hash_map::RandomState,
}

/// The identities a discovery found, each once, in arrival order: their bytes in one buffer and
/// where each ends. A million 25-byte identities take 29 MB in two allocations, where a
/// `Vec<String>` takes about 56 MB in a million and one (which the allocator keeps long after).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Discovered {
    pub(super) text: String,
    pub(super) ends: Vec<u32>,
}

impl Discovered {
    /// How many identities.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether none.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The identity at `i` (empty past the end).
    pub fn get(&self, i: u32) -> &str {
        let i = i as usize;
        let Some(&end) = self.ends.get(i) else {
            return "";
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text
            .get(start as usize..end as usize)
            .unwrap_or_default()
    }

    /// The identities in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.ends.len() as u32).map(|i| self.get(i))
    }

    /// Adds `identity`; false (nothing added) once the buffer would pass 4 GiB.
    pub(super) fn push(&mut self, identity: &str) -> bool {
        let Ok(end) = u32::try_from(self.text.len() + identity.len()) else {
            return false;
        };
        self.text.push_str(identity);
        self.ends.push(end);
        true
    }

    /// The identities as strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_string).collect()
    }
}

/// The sender of a reply to discovery `id` ([`checked_reply`]), counted as a reply.
pub(super) fn discovery_sender(
    inner: &Inner,
    subject: &str,
    id: &str,
    payload: &[u8],
) -> Option<String> {
    let reply = checked_reply(inner, subject, id, payload)?;
    inner.counters.replies.fetch_add(1, Ordering::Relaxed);
    Some(
        reply
            .transport_sender
            .filter(|s| !s.is_empty())
            .unwrap_or(reply.sender),
    )
}

/// A broker status message on a reply subject. nats-server sends a no-responders status (503,
/// no payload) to a directed request's NATS reply subject when nothing is subscribed to the
/// node's subject: that completes the pending request at once. Any other status (or one for
/// no pending directed request) is counted as unexpected.
pub(super) fn handle_status(
    inner: &Inner,
    subject: &str,
    subject_id: &str,
    status: async_nats::StatusCode,
    empty: bool,
) {
    let c = &inner.counters;
    if status == async_nats::StatusCode::NO_RESPONDERS && empty {
        let mut pending = lock(&inner.pending);
        if matches!(pending.get(subject_id), Some(Pending::Directed { .. })) {
            if let Some(Pending::Directed { target, tx }) = pending.remove(subject_id) {
                drop(pending);
                c.no_responders.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    subject,
                    identity = %target,
                    "no responders: nothing is subscribed to the node's subject"
                );
                // The waiter may have timed out in the meantime; nothing to do then.
                let _ = tx.send(Delivery::NoResponders);
            }
            return;
        }
    }
    c.unexpected.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        subject,
        status = %status,
        "dropping a status message for no pending directed request"
    );
}
