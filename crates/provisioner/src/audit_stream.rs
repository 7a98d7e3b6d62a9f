//! The audit trail's JetStream stream: every replica of an HA or active-active deployment
//! publishes its decisions into one replicated stream of the provisioning account.
//!
//! The JetStream API is found as the election finds it ([`choria_rpc_client::streams`]): the
//! `choria.streams` import of the provisioning account behind a Choria broker first, then the
//! account's own JetStream. The stream is looked up, and created (file storage, the subject
//! [`AUDIT_SUBJECT`]) where the account may create streams. Each record is published and its
//! acknowledgement awaited, so a record is in the stream when [`AuditStream::publish`] returns.

pub use crate::config::StreamLimits;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;

use choria_rpc_client::streams::{first_answering, Probe};

/// The subject the provisioner publishes audit records on.
pub const AUDIT_SUBJECT: &str = "choria.provisioner.audit";
/// How long a JetStream request or a publish acknowledgement is waited for.
pub const AUDIT_TIMEOUT: Duration = Duration::from_secs(5);

/// The audit stream could not be opened or a record could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Neither JetStream API answered, or the stream could not be found or created.
    #[error("audit stream {stream}: cannot open it through {api}: {detail}")]
    Open {
        /// The stream.
        stream: String,
        /// The API tried last.
        api: &'static str,
        /// What the server said.
        detail: String,
    },
    /// A record was not acknowledged.
    #[error("audit stream {stream}: a record for {identity} was not stored: {detail}")]
    Publish {
        /// The stream.
        stream: String,
        /// The node the record is about.
        identity: String,
        /// What failed.
        detail: String,
    },
}

/// A handle to the audit stream, cheap to clone.
#[derive(Clone)]
pub struct AuditStream {
    js: jetstream::Context,
    stream: String,
    api: &'static str,
}

impl std::fmt::Debug for AuditStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditStream")
            .field("stream", &self.stream)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

fn stream_config(name: &str, limits: StreamLimits) -> jetstream::stream::Config {
    jetstream::stream::Config {
        name: name.to_string(),
        subjects: vec![AUDIT_SUBJECT.to_string()],
        storage: jetstream::stream::StorageType::File,
        max_age: limits.max_age,
        max_bytes: i64::try_from(limits.max_bytes).unwrap_or(i64::MAX),
        discard: jetstream::stream::DiscardPolicy::Old,
        ..Default::default()
    }
}

impl AuditStream {
    /// Opens (or creates) `stream` through the `choria.streams` import, else the account's own
    /// JetStream (any failure through the import tries the account's own).
    ///
    /// A stream created here gets `limits`; an existing one is left as its operator made it,
    /// with a warning when it keeps records for ever.
    pub async fn open(
        client: async_nats::Client,
        stream: &str,
        limits: StreamLimits,
    ) -> Result<AuditStream, AuditError> {
        let probe = first_answering(
            |api| {
                let js = api.context(client.clone(), AUDIT_TIMEOUT);
                async move {
                    let found = js
                        .get_or_create_stream(stream_config(stream, limits))
                        .await
                        .map_err(|e| e.to_string())?;
                    let c = &found.cached_info().config;
                    if c.max_age.is_zero() && c.max_bytes <= 0 && c.max_messages <= 0 {
                        tracing::warn!(
                            "audit: stream {stream} keeps every record for ever and can fill the \
                             server's storage, which the election and claims buckets share: give \
                             it limits, e.g. nats stream edit {stream} --max-age {}s --max-bytes {} \
                             --discard old",
                            limits.max_age.as_secs(),
                            limits.max_bytes
                        );
                    }
                    Ok::<_, String>(js)
                }
            },
            |_| true,
        )
        .await;
        match probe {
            Probe::Opened(api, js) => Ok(AuditStream {
                js,
                stream: stream.to_string(),
                api: api.describe(),
            }),
            Probe::Answered(_, detail) => Err(AuditError::Open {
                stream: stream.to_string(),
                api: "the choria.streams import and the account's own JetStream",
                detail,
            }),
            Probe::Unreachable(errors) => Err(AuditError::Open {
                stream: stream.to_string(),
                api: "the choria.streams import and the account's own JetStream",
                detail: errors
                    .into_iter()
                    .map(|(_, e)| e)
                    .collect::<Vec<_>>()
                    .join("; "),
            }),
        }
    }

    /// The stream's name.
    pub fn name(&self) -> &str {
        &self.stream
    }

    /// Which JetStream API it is reached through, in words.
    pub fn api(&self) -> &'static str {
        self.api
    }

    /// Publishes one record about `identity` and waits for the stream to acknowledge it.
    pub async fn publish(&self, identity: &str, record: Bytes) -> Result<(), AuditError> {
        let fail = |detail: String| AuditError::Publish {
            stream: self.stream.clone(),
            identity: identity.to_string(),
            detail,
        };
        let ack = self
            .js
            .publish(AUDIT_SUBJECT, record)
            .await
            .map_err(|e| fail(e.to_string()))?;
        match tokio::time::timeout(AUDIT_TIMEOUT, ack).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Err(_) => Err(fail(format!("no acknowledgement within {AUDIT_TIMEOUT:?}"))),
        }
    }
}
