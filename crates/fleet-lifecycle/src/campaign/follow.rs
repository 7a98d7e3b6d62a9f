//! The daemon's view of the campaign: [`CampaignFollower`] watches the campaign record into a
//! [`CampaignSlot`] for the status API, the page and the metrics.

use super::*;

/// The campaign as a provisioner follows it, for its status API, page and metrics.
#[derive(Debug, Default)]
pub struct CampaignSlot(std::sync::RwLock<Option<CampaignRecord>>);

impl CampaignSlot {
    /// An empty slot.
    pub fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::default()
    }

    /// The campaign last seen, if any.
    pub fn get(&self) -> Option<CampaignRecord> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set(&self, rec: Option<CampaignRecord>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = rec;
    }
}

impl CampaignRecord {
    /// What the status API and page show of it.
    pub fn info(&self) -> provisioner_status::CampaignInfo {
        provisioner_status::CampaignInfo {
            id: self.id.clone(),
            state: self.state.label().to_string(),
            reason: self.reason.clone(),
            by: self.by.clone(),
            total: self.total,
            done: self.done,
            failed: self.failed,
            in_flight: self.in_flight,
            pending: self.pending,
            eta: self.eta,
            driver: self.driver.clone(),
            recent_failures: self
                .recent_failures
                .iter()
                .map(|f| (f.identity.clone(), f.error.clone()))
                .collect(),
        }
    }
}

/// Follows the campaign record in the provisioning account's campaign bucket (when there is
/// one) into a [`CampaignSlot`] and the `choria_provisioner_campaign_nodes` gauges. The bucket
/// is looked for again every `retry` while it is missing or unreachable.
pub struct CampaignFollower {
    /// The daemon's connection.
    pub client: async_nats::Client,
    /// The replica's identity.
    pub by: String,
    /// The seal records are checked with.
    pub seal: Seal,
    /// Where the campaign is kept.
    pub slot: std::sync::Arc<CampaignSlot>,
    /// The gauges.
    pub metrics: std::sync::Arc<provisioner_metrics::Metrics>,
    /// How long to wait before looking for the bucket again.
    pub retry: Duration,
}

impl CampaignFollower {
    fn show(&self, rec: Option<CampaignRecord>) {
        let counts = rec
            .as_ref()
            .map(|r| [r.pending, r.in_flight, r.done, r.failed])
            .unwrap_or_default();
        for (g, n) in self.metrics.campaign_nodes.iter().zip(counts) {
            g.set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.slot.set(rec);
    }

    /// Follows until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            if let Ok(c) =
                Campaigns::open(self.client.clone(), &self.by, self.seal.clone(), false).await
            {
                if let Ok(mut watch) = c.store.watch(CAMPAIGN_KEY).await {
                    if let Ok(now) = c.read().await {
                        self.show(now.map(|(r, _)| r));
                    }
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            e = watch.next() => match e {
                                Some(Ok(entry)) => {
                                    let rec = (entry.operation == kv::Operation::Put)
                                        .then(|| c.open_record::<CampaignRecord>(CAMPAIGN_KEY, &entry.value, |r| &mut r.tag))
                                        .flatten();
                                    self.show(rec);
                                }
                                _ => break,
                            }
                        }
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.retry) => {}
            }
        }
    }
}
