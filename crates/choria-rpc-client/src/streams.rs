//! Where Choria Streams (JetStream) is reached from a provisioning connection: the one probe the
//! election, the active-active claims, the fleet lifecycle's buckets and the audit stream
//! share, and the one way a key-value bucket is opened or created on a route.
//!
//! Behind a Choria broker the provisioning account reaches JetStream only through the
//! [`PROVISIONING_API_PREFIX`] import, as the Go provisioner uses it; on a plain NATS server the
//! account's own JetStream answers. [`first_answering`] asks the import first and the account's
//! own API second, and stops at the first that answers at all: a bucket missing behind an API
//! that answered is that API's problem to report, not a reason to try the other.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::context::{GetStreamErrorKind, RequestErrorKind};
use async_nats::jetstream::kv;
use async_nats::jetstream::ErrorCode;

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

/// The most bucket replicas asked for when a bucket is created (a three-server cluster).
pub const MAX_BUCKET_REPLICAS: usize = 3;

/// Why a key-value bucket could not be opened through one route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BucketError {
    /// JetStream did not answer on this route (no responders, a timeout, JetStream not
    /// enabled for the account): the other route may.
    #[error("{0}")]
    Unreachable(String),
    /// The bucket does not exist and was not to be created.
    #[error("the bucket does not exist")]
    Missing,
    /// The bucket did not exist and could not be created: the servers' last answer.
    #[error("cannot create the bucket: {0}")]
    Create(String),
    /// JetStream answered with another error (a permission, a bad request).
    #[error("{0}")]
    Refused(String),
    /// A stream of the bucket's name exists but keeps no history per key: not a bucket.
    #[error("it is not a key-value bucket")]
    NotKeyValue,
}

impl BucketError {
    /// Whether [`first_answering`] should try the other route.
    pub fn unreachable(&self) -> bool {
        matches!(self, BucketError::Unreachable(_))
    }
}

/// A bucket [`open_bucket`] opened.
#[derive(Debug)]
pub struct OpenedBucket {
    /// The bucket.
    pub store: kv::Store,
    /// The replicas it was created with, when this call created it.
    pub created: Option<usize>,
}

/// Opens the key-value bucket `config.bucket` through `js`, creating it from `config` (with
/// [`create_bucket`]) when it is missing and `create` is set.
pub async fn open_bucket(
    js: &jetstream::Context,
    config: &kv::Config,
    create: bool,
) -> Result<OpenedBucket, BucketError> {
    let mut created = None;
    match js.get_stream(format!("KV_{}", config.bucket)).await {
        Ok(stream) if stream.cached_info().config.max_messages_per_subject < 1 => {
            return Err(BucketError::NotKeyValue)
        }
        Ok(_) => {}
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                if !create {
                    return Err(BucketError::Missing);
                }
                created = Some(
                    create_bucket(js, config.clone())
                        .await
                        .map_err(BucketError::Create)?,
                );
            }
            GetStreamErrorKind::JetStream(j)
                if j.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
                    || j.error_code() == ErrorCode::JETSTREAM_NOT_ENABLED =>
            {
                return Err(BucketError::Unreachable(j.to_string()))
            }
            GetStreamErrorKind::JetStream(j) => return Err(BucketError::Refused(j.to_string())),
            _ => {
                let no_responders = std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<jetstream::context::RequestError>())
                    .is_some_and(|r| r.kind() == RequestErrorKind::NoResponders);
                return Err(BucketError::Unreachable(if no_responders {
                    "no responders".to_string()
                } else {
                    e.to_string()
                }));
            }
        },
    }
    let store = js
        .get_key_value(&config.bucket)
        .await
        .map_err(|e| BucketError::Unreachable(e.to_string()))?;
    Ok(OpenedBucket { store, created })
}

/// Creates the key-value bucket `config` with as many replicas as the cluster has, up to
/// [`MAX_BUCKET_REPLICAS`]: fewer only when the servers say the cluster is too small (a
/// transient failure is not settled with one copy on a cluster of three). The replicas it got,
/// or the servers' last answer.
pub async fn create_bucket(js: &jetstream::Context, config: kv::Config) -> Result<usize, String> {
    let mut detail = String::new();
    for replicas in (1..=MAX_BUCKET_REPLICAS).rev() {
        let created = js
            .create_key_value(kv::Config {
                num_replicas: replicas,
                ..config.clone()
            })
            .await;
        match created {
            Ok(_) => return Ok(replicas),
            Err(e) => {
                detail = e.to_string();
                let lower = detail.to_lowercase();
                if !(lower.contains("non-clustered") || lower.contains("insufficient resources")) {
                    break;
                }
            }
        }
    }
    Err(detail)
}

/// The errors of every route [`first_answering`] tried, on one line.
pub fn route_errors<E: std::fmt::Display>(errors: &[(StreamsApi, E)]) -> String {
    errors
        .iter()
        .map(|(api, e)| format!("{api}: {e}"))
        .collect::<Vec<_>>()
        .join("; ")
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
