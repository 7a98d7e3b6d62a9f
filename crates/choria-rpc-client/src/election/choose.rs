//! Which JetStream API an election goes through: the `choria.streams` import or the account's
//! own JetStream, found by the one probe of [`crate::streams`].

use tokio_util::sync::CancellationToken;

use super::backoff::Policy;
use super::{Election, ElectionError};
use crate::streams::{first_answering, Probe, StreamsApi};

impl Election {
    /// The election over each route, in [`StreamsApi`] order: the `choria.streams` import, then
    /// the account's own JetStream.
    fn routes(
        client: &async_nats::Client,
        key: &str,
        identity: &str,
    ) -> Result<[Election; 2], ElectionError> {
        let election = |api: StreamsApi| {
            let b = Election::builder(client.clone(), key, identity);
            match api.prefix() {
                Some(p) => b.api_prefix(p).build(),
                None => b.build(),
            }
        };
        Ok([
            election(StreamsApi::ChoriaStreams)?,
            election(StreamsApi::Account)?,
        ])
    }

    /// [`Election::choose`] without retrying: the election over the first route that answers,
    /// or the error of the last route when neither does (Choria Streams is not reachable from
    /// this connection).
    pub async fn choose_once(
        client: async_nats::Client,
        key: &str,
        identity: &str,
    ) -> Result<Election, ElectionError> {
        let routes = Self::routes(&client, key, identity)?;
        let route = |api: StreamsApi| match api {
            StreamsApi::Account => &routes[1],
            _ => &routes[0],
        };
        match first_answering(|api| route(api).open(), unreachable).await {
            Probe::Opened(api, _) | Probe::Answered(api, _) => Ok(route(api).clone()),
            Probe::Unreachable(mut errors) => match errors.pop() {
                Some((_, e)) => Err(e),
                None => Ok(routes[0].clone()),
            },
        }
    }

    /// The election `key` for `identity` over whichever JetStream API answers on `client`.
    ///
    /// The routes are asked as [`crate::streams::first_answering`] asks them: the
    /// `choria.streams` import first, then the account's own JetStream. Whichever API answers
    /// at all is kept even when the bucket is missing there, so a bucket created later is
    /// found. While neither answers, each failure is logged as an error and both are asked
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
        let routes = Self::routes(&client, key, identity)?;
        let route = |api: StreamsApi| match api {
            StreamsApi::Account => &routes[1],
            _ => &routes[0],
        };
        let mut failures = 0usize;
        loop {
            let probe = tokio::select! {
                p = first_answering(|api| route(api).open(), unreachable) => p,
                _ = cancel.cancelled() => return Ok(None),
            };
            match probe {
                Probe::Opened(api, _) | Probe::Answered(api, _) => {
                    if api == StreamsApi::Account {
                        tracing::info!(
                            "leader election uses the account's own JetStream (no choria.streams import)"
                        );
                    }
                    return Ok(Some(route(api).clone()));
                }
                Probe::Unreachable(errors) => {
                    let why: Vec<String> = errors
                        .iter()
                        .map(|(api, e)| format!("{api}: {e}"))
                        .collect();
                    tracing::error!(
                        "leader election: neither route to Choria Streams answers ({}); provisioning stays paused until this is fixed",
                        why.join("; ")
                    );
                }
            }
            failures = failures.saturating_add(1);
            if !retry.sleep(failures, cancel).await {
                return Ok(None);
            }
        }
    }
}

/// Whether an opening error means the route did not answer at all.
fn unreachable(e: &ElectionError) -> bool {
    matches!(
        e,
        ElectionError::StreamsUnavailable { .. } | ElectionError::Request { .. }
    )
}
