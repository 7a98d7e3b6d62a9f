//! The campaign bucket: [`Campaigns`] opens it over whichever route to Choria Streams
//! answers and reads and writes its sealed records, compare-and-set on the campaign's revision;
//! writes that time out are tried again.

use super::*;

/// The campaign bucket over one route.
#[derive(Clone)]
pub struct Campaigns {
    pub(super) store: kv::Store,
    js: jetstream::Context,
    seal: Seal,
    by: String,
    /// The provisioners' own connection, for the audit stream, when the bucket is elsewhere
    /// or here.
    pub(super) provisioning: Option<async_nats::Client>,
}

impl std::fmt::Debug for Campaigns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Campaigns").field("by", &self.by).finish()
    }
}

impl Campaigns {
    /// Opens the bucket over whichever route answers, creating it when `create` and the
    /// account may. `by` names whoever writes.
    pub async fn open(
        client: async_nats::Client,
        by: &str,
        seal: Seal,
        create: bool,
    ) -> Result<Campaigns, CampaignError> {
        let description = "Choria provisioner rotation campaigns";
        let (js, opened) =
            match crate::open_bucket(&client, CAMPAIGN_BUCKET, description, MAX_RECORD, create)
                .await
            {
                Ok((_, js, opened)) => (js, opened),
                Err(crate::NotOpened::Refused(BucketError::Missing)) => {
                    return Err(CampaignError::NoCampaign)
                }
                Err(crate::NotOpened::Refused(BucketError::Create(d))) => {
                    return Err(request("create the bucket", d))
                }
                Err(crate::NotOpened::Refused(e)) => return Err(request("open the bucket", e)),
                Err(crate::NotOpened::Unreachable(detail)) => {
                    return Err(CampaignError::Unreachable { detail })
                }
            };
        Ok(Campaigns {
            store: opened.store,
            js,
            seal,
            by: by.to_string(),
            provisioning: None,
        })
    }

    /// The same bucket, with the provisioners' own connection for the audit stream (when the
    /// bucket was reached over another, the main collective's).
    pub fn with_provisioning(mut self, client: async_nats::Client) -> Self {
        self.provisioning = Some(client);
        self
    }

    /// The JetStream API the bucket was reached through (the audit stream is read through it).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// Who writes.
    pub fn by(&self) -> &str {
        &self.by
    }

    fn seal_bytes<T: Serialize + Clone>(
        &self,
        key: &str,
        rec: &T,
        set_tag: impl Fn(&mut T, String),
    ) -> Result<Vec<u8>, CampaignError> {
        let mut bare = rec.clone();
        set_tag(&mut bare, String::new());
        let unsigned = serde_json::to_vec(&bare).map_err(|e| request("encode a record", e))?;
        let tag = self.seal.tag_record(key, &unsigned).unwrap_or_default();
        set_tag(&mut bare, tag);
        serde_json::to_vec(&bare).map_err(|e| request("encode a record", e))
    }

    pub(super) fn open_record<T: Serialize + serde::de::DeserializeOwned>(
        &self,
        key: &str,
        bytes: &[u8],
        tag: impl Fn(&mut T) -> &mut String,
    ) -> Option<T> {
        let opened = (bytes.len() <= MAX_RECORD)
            .then(|| serde_json::from_slice::<T>(bytes).ok())
            .flatten()
            .and_then(|mut rec| {
                let t = std::mem::take(tag(&mut rec));
                let unsigned = serde_json::to_vec(&rec).ok()?;
                self.seal.verify_record(key, &unsigned, &t).then(|| {
                    *tag(&mut rec) = t;
                    rec
                })
            });
        if opened.is_none() {
            warn!(
                "campaign: ignoring {}: malformed or not signed with the provisioners' secret",
                escaped(key)
            );
        }
        opened
    }

    /// The campaign and its revision, if there is one.
    pub async fn read(&self) -> Result<Option<(CampaignRecord, u64)>, CampaignError> {
        let entry = self
            .store
            .entry(CAMPAIGN_KEY)
            .await
            .map_err(|e| request("read the campaign", e))?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        Ok(self
            .open_record::<CampaignRecord>(CAMPAIGN_KEY, &entry.value, |r| &mut r.tag)
            .map(|r| (r, entry.revision)))
    }

    /// Writes the campaign: created when `revision` is `None`, else only over that revision.
    /// Returns the new revision, or `None` when someone wrote it since.
    pub(super) async fn write(
        &self,
        rec: &CampaignRecord,
        revision: Option<u64>,
    ) -> Result<Option<u64>, CampaignError> {
        let bytes = self.seal_bytes(CAMPAIGN_KEY, rec, |r, t| r.tag = t)?;
        let done = match revision {
            None => self
                .store
                .create(CAMPAIGN_KEY, bytes.into())
                .await
                .map_err(|e| e.to_string()),
            Some(r) => self
                .store
                .update(CAMPAIGN_KEY, bytes.into(), r)
                .await
                .map_err(|e| e.to_string()),
        };
        match done {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.contains("wrong last sequence") || e.contains("key exists") => Ok(None),
            Err(e) => Err(request("write the campaign", e)),
        }
    }

    /// Writes a node's record; a put whose acknowledgement timed out is tried again (a put
    /// is idempotent, and a broker busy with a large campaign's fleet can be slow to answer).
    pub(super) async fn put_node(&self, rec: &NodeRecord) -> Result<(), CampaignError> {
        let key = node_key(&rec.identity);
        let bytes = self.seal_bytes(&key, rec, |r, t| r.tag = t)?;
        let what = format!("record {}", escaped(&rec.identity));
        retry_timeouts(&what, || async {
            self.store
                .put(key.clone(), bytes.clone().into())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| request(what.clone(), e))
    }

    /// Every node of the campaign.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, CampaignError> {
        let keys = self
            .store
            .keys()
            .await
            .map_err(|e| request("list the nodes", e))?;
        let keys: Vec<String> = keys
            .filter_map(|k| async move { k.ok().filter(|k| k.starts_with(NODE_PREFIX)) })
            .collect()
            .await;
        let store = &self.store;
        let got: Vec<Result<Option<NodeRecord>, CampaignError>> = futures::stream::iter(keys)
            .map(|key| async move {
                let bytes = store
                    .get(&key)
                    .await
                    .map_err(|e| request("read a node", e))?;
                Ok(bytes.and_then(|b| {
                    self.open_record::<NodeRecord>(&key, &b, |r| &mut r.tag)
                        .filter(|r| node_key(&r.identity) == key)
                }))
            })
            .buffer_unordered(BULK)
            .collect()
            .await;
        let mut out = Vec::with_capacity(got.len());
        for g in got {
            if let Some(r) = g? {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Starts a campaign over `targets` with `limits`; refused while another is not over.
    /// `on_stored` is told how many nodes are recorded so far.
    pub async fn start(
        &self,
        selector: &str,
        targets: Vec<String>,
        limits: Limits,
        audit_from: Option<u64>,
        mut on_stored: impl FnMut(usize),
    ) -> Result<CampaignRecord, CampaignError> {
        limits.validate()?;
        if targets.is_empty() {
            return Err(CampaignError::Select(format!(
                "{selector} selected no nodes"
            )));
        }
        if targets.len() > MAX_TARGETS {
            return Err(CampaignError::Invalid(format!(
                "{} nodes selected, more than the {MAX_TARGETS} one campaign holds",
                targets.len()
            )));
        }
        let previous = self.read().await?;
        if let Some((old, _)) = &previous {
            if !old.state.finished() {
                return Err(CampaignError::Exists {
                    id: old.id.clone(),
                    state: old.state,
                    progress: old.progress(),
                });
            }
        }
        self.purge_nodes().await?;
        let now = now_unix();
        let id = format!(
            "{}-{}",
            chrono::Utc::now().format("%Y%m%dT%H%M%SZ"),
            &choria_rpc_client::protocol::new_request_id()[..8]
        );
        let mut rec = CampaignRecord::new(
            id,
            self.by.clone(),
            bounded(selector, MAX_ERROR),
            now,
            limits,
            targets.len() as u64,
            audit_from,
        );
        let mut revision = match previous {
            Some((_, r)) => self.write(&rec, Some(r)).await?,
            None => self.write(&rec, None).await?,
        }
        .ok_or_else(|| {
            CampaignError::Invalid("another campaign was started at the same time".into())
        })?;
        let mut stored = 0usize;
        let mut puts = futures::stream::iter(targets)
            .map(|identity| async move {
                self.put_node(&NodeRecord {
                    identity,
                    state: NodeRotation::Pending,
                    sent_at: None,
                    finished_at: None,
                    tries: 0,
                    error: String::new(),
                    tag: String::new(),
                })
                .await
            })
            .buffer_unordered(BULK);
        while let Some(r) = puts.next().await {
            r?;
            stored += 1;
            if stored.is_multiple_of(1000) {
                on_stored(stored);
            }
        }
        on_stored(stored);
        rec.state = CampaignState::Running;
        rec.reason.clear();
        revision = self.write(&rec, Some(revision)).await?.ok_or_else(|| {
            CampaignError::Invalid("the campaign was changed while its nodes were recorded".into())
        })?;
        let _ = revision;
        info!(
            "rotation campaign {} started by {}: {} nodes ({})",
            rec.id,
            escaped(&rec.by),
            rec.total,
            escaped(&rec.selector)
        );
        Ok(rec)
    }

    async fn purge_nodes(&self) -> Result<(), CampaignError> {
        let stream = self
            .js
            .get_stream(format!("KV_{CAMPAIGN_BUCKET}"))
            .await
            .map_err(|e| request("open the bucket's stream", e))?;
        stream
            .purge()
            .filter(format!("$KV.{CAMPAIGN_BUCKET}.{NODE_PREFIX}>"))
            .await
            .map(|_| ())
            .map_err(|e| request("remove the previous campaign's nodes", e))
    }

    /// Sets the campaign's state as an operator: `paused`, `running` (resume) or `aborted`,
    /// with `reason`. Returns the record as written.
    pub async fn set_state(
        &self,
        want: CampaignState,
        reason: &str,
    ) -> Result<CampaignRecord, CampaignError> {
        for _ in 0..20 {
            let (mut rec, revision) = self.read().await?.ok_or(CampaignError::NoCampaign)?;
            let refuse = |what: &str| CampaignError::State {
                id: rec.id.clone(),
                state: rec.state,
                what: what.to_string(),
            };
            match (rec.state, want) {
                (s, _) if s.finished() => return Err(refuse("it is over")),
                (CampaignState::Running, CampaignState::Running) => return Ok(rec),
                (CampaignState::Paused, CampaignState::Paused) => return Ok(rec),
                _ => {}
            }
            rec.state = want;
            rec.reason = if reason.is_empty() {
                format!("{} by {}", want.label(), self.by)
            } else {
                bounded(
                    &format!("{} by {}: {reason}", want.label(), self.by),
                    MAX_ERROR,
                )
            };
            if want == CampaignState::Running {
                rec.reason.clear();
            }
            if self.write(&rec, Some(revision)).await?.is_some() {
                info!("rotation campaign {} {}", rec.id, want.label());
                return Ok(rec);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(request(
            "change the campaign's state",
            "the record kept changing under this write",
        ))
    }
}

/// Tries of a campaign bucket write whose answer timed out.
const WRITE_TRIES: u32 = 5;

/// The pause before the first repeat of a write that timed out (then twice, three times...).
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Whether an error text says a request timed out (async-nats: "timed out: didn't receive ack
/// in time", "request timed out").
pub(super) fn timed_out(e: &str) -> bool {
    let e = e.to_ascii_lowercase();
    e.contains("timed out") || e.contains("timeout")
}

/// Runs `op` until it succeeds, fails otherwise than by a timeout, or has timed out
/// [`WRITE_TRIES`] times, pausing a little longer before each repeat.
async fn retry_timeouts<T, F, Fut>(what: &str, mut op: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut tries = 1;
    loop {
        match op().await {
            Err(e) if timed_out(&e) && tries < WRITE_TRIES => {
                warn!(
                    "campaign: {what} timed out (try {tries} of {WRITE_TRIES}): {e}; trying again"
                );
                tokio::time::sleep(RETRY_PAUSE * tries).await;
                tries += 1;
            }
            done => return done,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bucket_writes_that_time_out_are_tried_again_and_other_errors_are_not() {
        // Timed out twice, then stored: the write succeeds.
        let mut calls = 0;
        let r = retry_timeouts("record n1", || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err("ack error: timed out: didn't receive ack in time".to_string())
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(r, Ok(3));
        // Always timing out: given up after WRITE_TRIES.
        let mut calls = 0;
        let r: Result<(), String> = retry_timeouts("record n2", || {
            calls += 1;
            async { Err("request timed out".to_string()) }
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls, WRITE_TRIES);
        // Any other error is returned at once.
        let mut calls = 0;
        let r: Result<(), String> = retry_timeouts("record n3", || {
            calls += 1;
            async { Err("wrong last sequence: 4".to_string()) }
        })
        .await;
        assert_eq!(r, Err("wrong last sequence: 4".to_string()));
        assert_eq!(calls, 1);
        assert!(timed_out(
            "ack error: Timed out: didn't receive ack in time"
        ));
        assert!(!timed_out("no responders"));
    }
}
