//! Where Choria Streams (JetStream) is reached from a provisioning connection: the one probe the
//! election, the active-active claims and the audit stream share.
//!
//! Behind a Choria broker the provisioning account reaches JetStream only through the
//! [`PROVISIONING_API_PREFIX`] import, as the Go provisioner uses it; on a plain NATS server the
//! account's own JetStream answers. [`first_answering`] asks the import first and the account's
//! own API second, and stops at the first that answers at all: a bucket missing behind an API
//! that answered is that API's problem to report, not a reason to try the other.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;

/// The JetStream API prefix of the provisioning account's `choria.streams` import.
pub const PROVISIONING_API_PREFIX: &str = "choria.streams";

/// One of the two routes to JetStream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StreamsApi {
    /// The `choria.streams` import of a Choria broker's provisioning account.
    ChoriaStreams,
    /// The account's own JetStream (`$JS.API`).
    Account,
}

impl StreamsApi {
    /// Both routes, in the order they are tried.
    pub const ALL: [StreamsApi; 2] = [StreamsApi::ChoriaStreams, StreamsApi::Account];

    /// The API prefix, `None` for the account's own `$JS.API`.
    pub fn prefix(self) -> Option<&'static str> {
        match self {
            StreamsApi::ChoriaStreams => Some(PROVISIONING_API_PREFIX),
            StreamsApi::Account => None,
        }
    }

    /// The subject prefix requests go to.
    pub fn subject_prefix(self) -> &'static str {
        self.prefix().unwrap_or("$JS.API")
    }

    /// The route in words, for logs and errors.
    pub fn describe(self) -> &'static str {
        match self {
            StreamsApi::ChoriaStreams => "the choria.streams import",
            StreamsApi::Account => "the account's own JetStream",
        }
    }

    /// A JetStream context on `client` through this route, every request bounded by `timeout`.
    pub fn context(self, client: async_nats::Client, timeout: Duration) -> jetstream::Context {
        let builder = jetstream::ContextBuilder::new().timeout(timeout);
        match self.prefix() {
            Some(p) => builder.api_prefix(p).build(client),
            None => builder.build(client),
        }
    }
}

impl std::fmt::Display for StreamsApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// What [`first_answering`] found.
#[derive(Debug)]
pub enum Probe<T, E> {
    /// `open` succeeded through this route.
    Opened(StreamsApi, T),
    /// This route answered, but `open` failed there for a reason other than reaching it (a
    /// missing or misconfigured bucket, a permission): the other route is not tried.
    Answered(StreamsApi, E),
    /// No route answered: the errors of each, in the order tried.
    Unreachable(Vec<(StreamsApi, E)>),
}

/// Calls `open` through each route of [`StreamsApi::ALL`] in turn, until one succeeds or fails
/// for a reason `unreachable` does not call a failure to reach JetStream.
pub async fn first_answering<T, E, F, Fut>(
    mut open: F,
    unreachable: impl Fn(&E) -> bool,
) -> Probe<T, E>
where
    F: FnMut(StreamsApi) -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut errors = Vec::with_capacity(StreamsApi::ALL.len());
    for api in StreamsApi::ALL {
        match open(api).await {
            Ok(v) => return Probe::Opened(api, v),
            Err(e) if !unreachable(&e) => return Probe::Answered(api, e),
            Err(e) => errors.push((api, e)),
        }
    }
    Probe::Unreachable(errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_import_is_asked_first_and_an_answer_stops_the_probe() {
        let mut asked = Vec::new();
        let found = first_answering(
            |api| {
                asked.push(api);
                async move { Err::<(), _>(api == StreamsApi::ChoriaStreams) }
            },
            |unreached: &bool| !*unreached,
        )
        .await;
        assert!(matches!(
            found,
            Probe::Answered(StreamsApi::ChoriaStreams, true)
        ));
        assert_eq!(asked, [StreamsApi::ChoriaStreams]);

        let mut asked = Vec::new();
        let found = first_answering(
            |api| {
                asked.push(api);
                async move {
                    if api == StreamsApi::Account {
                        Ok(7)
                    } else {
                        Err("no responders")
                    }
                }
            },
            |_| true,
        )
        .await;
        assert!(matches!(found, Probe::Opened(StreamsApi::Account, 7)));
        assert_eq!(asked, StreamsApi::ALL);

        let none = first_answering(|_| async { Err::<(), _>("timeout") }, |_| true).await;
        match none {
            Probe::Unreachable(e) => assert_eq!(e.len(), 2),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn routes_name_their_prefixes() {
        assert_eq!(StreamsApi::ChoriaStreams.subject_prefix(), "choria.streams");
        assert_eq!(StreamsApi::Account.subject_prefix(), "$JS.API");
    }
}
