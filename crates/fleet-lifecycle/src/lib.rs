//! The fleet lifecycle of the Choria provisioner after a server's first enrollment, kept on
//! Choria Streams (NATS JetStream key-value buckets) so that every replica and every operator's
//! shell sees one state:
//!
//! * [`control`]: the `CHORIA_PROVISIONER_CONTROL` bucket: the operator's pause (the kill
//!   switch), the deny list, followed by every replica with a watch into the core's
//!   [`provision_core::Revocation`] and [`provision_core::PauseState`].
//! * [`approval`]: nodes held for an operator's approval in the same bucket (the core's
//!   [`provision_core::Approval`] and the status page's
//!   [`provisioner_status::control::FleetControlView`]).
//! * [`pacing`]: `max_per_minute` shared by the replicas, a token bucket under the control
//!   bucket's `rate` key (the core's [`provision_core::Pacer`]).
//! * [`campaign`]: rotation campaigns in the `CHORIA_PROVISIONER_CAMPAIGN` bucket, selected by
//!   list, discovery filter or the audit stream's expiry dates, and driven by
//!   `choria_provision#reprovision` within a rate and in-flight limit.
//! * [`seal`]: the replicas' shared secret over everything they write, the claims of
//!   active-active included.
//!
//! It reads no configuration file and makes no connection of its own: callers pass a NATS
//! client (and an RPC client of the main collective for campaigns), the [`seal::Seal`] and
//! the names to write records as. The `provisioner` crate wires it from the settings.

#![deny(missing_docs)]
pub mod approval;
pub mod campaign;
pub mod control;
pub mod pacing;
pub mod seal;

/// Why a lifecycle bucket could not be opened through any route to Choria Streams.
pub(crate) enum NotOpened {
    /// A route answered with this error (the bucket missing, a permission...).
    Refused(choria_rpc_client::streams::BucketError),
    /// No route answered: every route's error on one line.
    Unreachable(String),
}

/// Opens the private bucket `name` (history 1, file storage, values of at most `max_value`
/// bytes) over whichever route to Choria Streams answers first, creating it when `create` and
/// the account may; bounded by [`control::REQUEST_TIMEOUT`] a request.
pub(crate) async fn open_bucket(
    client: &async_nats::Client,
    name: &str,
    description: &str,
    max_value: usize,
    create: bool,
) -> Result<
    (
        choria_rpc_client::streams::StreamsApi,
        async_nats::jetstream::Context,
        choria_rpc_client::streams::OpenedBucket,
    ),
    NotOpened,
> {
    use choria_rpc_client::streams::{first_answering, BucketError, Probe};
    let config = async_nats::jetstream::kv::Config {
        bucket: name.to_string(),
        description: description.to_string(),
        history: 1,
        max_value_size: i32::try_from(max_value).unwrap_or(i32::MAX),
        storage: async_nats::jetstream::stream::StorageType::File,
        ..Default::default()
    };
    let probe = first_answering(
        |api| {
            let config = &config;
            let js = api.context(client.clone(), control::REQUEST_TIMEOUT);
            async move {
                choria_rpc_client::streams::open_bucket(&js, config, create)
                    .await
                    .map(|b| (js, b))
            }
        },
        BucketError::unreachable,
    )
    .await;
    match probe {
        Probe::Opened(api, (js, bucket)) => {
            if let Some(replicas) = bucket.created {
                tracing::info!("created bucket {name} with {replicas} replicas");
            }
            Ok((api, js, bucket))
        }
        Probe::Answered(_, e) => Err(NotOpened::Refused(e)),
        Probe::Unreachable(errors) => Err(NotOpened::Unreachable(
            choria_rpc_client::streams::route_errors(&errors),
        )),
    }
}

/// Unix seconds now.
pub fn now_unix() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Unix seconds as an RFC 3339 time in UTC (the number itself for a time out of range).
pub fn rfc3339(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0)
        .map(|t| t.to_rfc3339())
        .unwrap_or_else(|| unix.to_string())
}

/// `text` without control characters, cut to at most `max` bytes at a character boundary:
/// what an operator's reason or a node's error may be when stored.
pub fn bounded_to(text: &str, max: usize) -> String {
    let mut s: String = text.chars().filter(|c| !c.is_control()).collect();
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
