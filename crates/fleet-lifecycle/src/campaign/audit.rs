//! Reading the provisioners' audit stream: what a campaign's driver learns of the nodes it
//! sent (provisioned again, or when their credentials expire).

use super::*;

/// One record of the audit trail that matters to campaigns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditSeen {
    /// The node.
    pub identity: String,
    /// The decision (`provisioned`, `failed`, ...).
    pub decision: String,
    /// When (Unix seconds).
    pub at: i64,
    /// When what was issued expires (the certificate's `not_after` or the server JWT's `exp`).
    pub expires: Option<i64>,
}

fn parse_time(v: &serde_json::Value) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(v.as_str()?)
        .ok()
        .map(|t| t.timestamp())
}

/// Parses one audit record.
pub fn parse_audit(bytes: &[u8]) -> Option<AuditSeen> {
    if bytes.len() > MAX_RECORD {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let identity = v.get("identity")?.as_str()?.to_string();
    let decision = v.get("decision")?.as_str()?.to_string();
    let at = parse_time(v.get("time")?)?;
    let cert = v.pointer("/certificate/not_after").and_then(parse_time);
    let jwt = v.pointer("/server_jwt/expires").and_then(parse_time);
    let expires = match (cert, jwt) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Some(AuditSeen {
        identity,
        decision,
        at,
        expires,
    })
}

/// The sequence the next record of audit stream `stream` will have.
pub async fn audit_next_sequence(
    js: &jetstream::Context,
    stream: &str,
) -> Result<u64, CampaignError> {
    Ok(audit_bounds(js, stream).await?.1)
}

/// The sequence of the oldest record audit stream `stream` holds, and of the next it will have.
async fn audit_bounds(js: &jetstream::Context, stream: &str) -> Result<(u64, u64), CampaignError> {
    let fail = |detail: String| CampaignError::Audit {
        stream: stream.to_string(),
        detail,
    };
    let mut s = js
        .get_stream(stream)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let info = s.info().await.map_err(|e| fail(e.to_string()))?;
    let next = info.state.last_sequence.saturating_add(1);
    Ok((info.state.first_sequence.min(next), next))
}

/// Reads audit stream `stream` from sequence `from` to its end, calling `seen` for every record
/// that parses. Returns the sequence to read from next time.
pub async fn read_audit(
    js: &jetstream::Context,
    stream: &str,
    from: u64,
    mut seen: impl FnMut(AuditSeen),
) -> Result<u64, CampaignError> {
    let fail = |detail: String| CampaignError::Audit {
        stream: stream.to_string(),
        detail,
    };
    let (first, next) = audit_bounds(js, stream).await?;
    // Nothing new, or what was new was removed by the stream's limits since.
    if from >= next || first >= next || first == 0 {
        return Ok(next);
    }
    let s = js
        .get_stream(stream)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let consumer = s
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from.max(1),
            },
            ..Default::default()
        })
        .await
        .map_err(|e| fail(e.to_string()))?;
    let mut messages = consumer.messages().await.map_err(|e| fail(e.to_string()))?;
    let last = next - 1;
    let mut read_to = None;
    loop {
        let msg = match tokio::time::timeout(REQUEST_TIMEOUT, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(fail(e.to_string())),
            // A busy broker was slow to deliver: what was not read is read next time, from
            // where this read stopped (records the stream's limits remove meanwhile are
            // skipped then).
            Ok(None) | Err(_) => return Ok(read_to.map_or(from, |s: u64| s + 1)),
        };
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(last);
        read_to = Some(seq);
        if let Some(a) = parse_audit(&msg.payload) {
            seen(a);
        }
        if seq >= last {
            return Ok(seq + 1);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn audit_records_give_the_earliest_expiry_of_what_was_issued() {
        let line = br#"{"time":"2026-12-03T10:00:00.000Z","identity":"n1.example.net","decision":"provisioned","certificate":{"serial":"01","sha256":"aa","not_after":"2027-01-01T00:00:00.000Z"},"server_jwt":{"id":"j","expires":"2026-12-10T00:00:00.000Z"}}"#;
        let a = parse_audit(line).unwrap();
        assert_eq!(a.identity, "n1.example.net");
        assert_eq!(a.decision, "provisioned");
        assert_eq!(a.at, 1_796_292_000);
        assert_eq!(a.expires, Some(1_796_860_800));
        let bare = br#"{"time":"2026-12-03T10:00:00Z","identity":"n2","decision":"failed"}"#;
        assert_eq!(parse_audit(bare).unwrap().expires, None);
        assert!(parse_audit(b"not json").is_none());
        assert!(parse_audit(br#"{"identity":"n3"}"#).is_none());
        let huge = vec![b' '; MAX_RECORD + 1];
        assert!(parse_audit(&huge).is_none());
    }
}
