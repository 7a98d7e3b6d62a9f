//! Which JetStream API an election goes through: the `choria.streams` import or the account's
//! own JetStream.

use tokio_util::sync::CancellationToken;

use super::backoff::Policy;
use super::{Election, ElectionError, PROVISIONING_API_PREFIX};

impl Election {
    /// The election `key` for `identity` over whichever JetStream API answers on `client`.
    ///
    /// Behind a Choria broker the provisioning account reaches JetStream only through the
    /// [`PROVISIONING_API_PREFIX`] import, as the Go provisioner uses it; on a plain NATS
    /// server the account's own JetStream answers. The import is tried first. Whichever API
    /// answers at all is kept even when the bucket is missing there, so a bucket created later
    /// is found. While neither answers, each failure is logged as an error and both are asked
    /// again after `retry`'s delay for the number of failures so far.
    ///
    /// `Ok(None)` when `cancel` fires first; an error only when the names do not make an
    /// election (see [`ElectionError::InvalidName`]).
    pub async fn choose(
        client: async_nats::Client,
        key: &str,
        identity: &str,
        retry: &Policy,
        cancel: &CancellationToken,
    ) -> Result<Option<Election>, ElectionError> {
        let prefixed = Election::builder(client.clone(), key, identity)
            .api_prefix(PROVISIONING_API_PREFIX)
            .build()?;
        let direct = Election::builder(client, key, identity).build()?;
        let unreachable = |e: &ElectionError| {
            matches!(
                e,
                ElectionError::StreamsUnavailable { .. } | ElectionError::Request { .. }
            )
        };
        let mut failures = 0usize;
        loop {
            let why = tokio::select! {
                opened = prefixed.open() => match opened {
                    Ok(_) => return Ok(Some(prefixed)),
                    Err(e) if !unreachable(&e) => return Ok(Some(prefixed)),
                    Err(e) => e,
                },
                _ = cancel.cancelled() => return Ok(None),
            };
            let opened = tokio::select! {
                opened = direct.open() => opened,
                _ = cancel.cancelled() => return Ok(None),
            };
            match opened {
                Err(e) if unreachable(&e) => {
                    tracing::error!("leader election: {why}; the account's own JetStream does not answer either: {e}; provisioning stays paused until this is fixed");
                }
                _ => {
                    tracing::info!(
                        "leader election uses the account's own JetStream (no choria.streams import)"
                    );
                    return Ok(Some(direct));
                }
            }
            failures = failures.saturating_add(1);
            if !retry.sleep(failures, cancel).await {
                return Ok(None);
            }
        }
    }
}
