//! The [`Driver`]: sends `choria_provision#reprovision` within the rate and in-flight limits,
//! holds the campaign's lease by heartbeat, adopts an operator's pause or abort, and marks a
//! node done from the audit stream, its `server` startup event or a check that it restarted.

use super::*;

/// What the driver reports as it goes.
pub trait Progress: Send {
    /// The campaign as last written.
    fn update(&mut self, rec: &CampaignRecord);
}

impl<F: FnMut(&CampaignRecord) + Send> Progress for F {
    fn update(&mut self, rec: &CampaignRecord) {
        self(rec)
    }
}

/// What a driver needs.
pub struct Driver {
    /// The campaign bucket.
    pub campaigns: Campaigns,
    /// A client of the main collective.
    pub rpc: RpcClient,
    /// The provisioning token sent with each request.
    pub token: String,
    /// The audit stream (its context and name), when configured.
    pub audit: Option<(jetstream::Context, String)>,
}

struct Run {
    rec: CampaignRecord,
    revision: u64,
    nodes: HashMap<String, NodeRecord>,
    queue: VecDeque<String>,
    /// Requests on their way.
    sending: u64,
    /// Nodes acknowledged and not yet provisioned again.
    sent: u64,
    done: u64,
    failed: u64,
    done_times: VecDeque<Instant>,
    audit_next: Option<u64>,
    /// When nodes still `pending` here were seen provisioned (an audit record's time, or when
    /// their startup event arrived): a node is provisioned again within a moment of answering
    /// reprovision, and a busy driver may read that before it gets to the acknowledgement.
    early: HashMap<String, i64>,
    /// Nodes still `pending` here that the audit trail shows provisioned since the campaign
    /// began: credentials issued during the campaign. One that then does not answer was sent
    /// reprovision by an earlier driver whose record of the acknowledgement was lost.
    reissued: HashSet<String>,
    /// Nodes that did not answer, with when to try them again: the wait grows with each try,
    /// so a node restarting through provisioning mode has time to come back.
    retry: BinaryHeap<Reverse<(Instant, String)>>,
    /// Node records changed since the last flush, written together (every tick) so that a
    /// driver reading thousands of acknowledgements a minute does not wait on each write.
    unwritten: HashMap<String, NodeRecord>,
    /// Nodes `sent`, with when (Unix seconds) to ask them on their main collective when they
    /// last started. A provisioner killed between restarting a node and writing its audit
    /// record, while no driver listened for the node's startup event, leaves no other sign
    /// that the node is back: one that answers, restarted since it acknowledged, is done.
    /// Nodes that acknowledged before this driver took over are asked at once.
    next_check: HashMap<String, i64>,
    /// Nodes being asked.
    checking: HashSet<String>,
    /// Nodes found done by asking them, since the last heartbeat.
    checked_done: u64,
}

impl Run {
    fn new(rec: CampaignRecord, revision: u64, nodes: Vec<NodeRecord>) -> Run {
        let mut run = Run {
            queue: VecDeque::new(),
            nodes: HashMap::with_capacity(nodes.len()),
            audit_next: rec.audit_from,
            rec,
            revision,
            sending: 0,
            sent: 0,
            done: 0,
            failed: 0,
            done_times: VecDeque::new(),
            early: HashMap::new(),
            reissued: HashSet::new(),
            retry: BinaryHeap::new(),
            unwritten: HashMap::new(),
            next_check: HashMap::new(),
            checking: HashSet::new(),
            checked_done: 0,
        };
        for n in nodes {
            match n.state {
                NodeRotation::Pending => run.queue.push_back(n.identity.clone()),
                NodeRotation::Sent => {
                    run.sent += 1;
                    run.next_check.insert(n.identity.clone(), 0);
                }
                NodeRotation::Done => run.done += 1,
                NodeRotation::Failed => run.failed += 1,
            }
            run.nodes.insert(n.identity.clone(), n);
        }
        run.count();
        run
    }

    fn in_flight(&self) -> u64 {
        self.sent + self.sending
    }

    /// Keeps `n` for the next flush (its latest state only).
    fn write_later(&mut self, n: NodeRecord) {
        self.unwritten.insert(n.identity.clone(), n);
    }

    /// `identity` acknowledged the request sent at `sent_at`: the record to store, `sent`, or
    /// `done` when it was seen provisioned again since (before the acknowledgement was read).
    fn acked(&mut self, identity: &str, sent_at: i64) -> Option<NodeRecord> {
        let n = self.nodes.get_mut(identity)?;
        if n.state != NodeRotation::Pending {
            return None;
        }
        n.state = NodeRotation::Sent;
        n.sent_at = Some(sent_at);
        self.sent += 1;
        let sent = n.clone();
        self.next_check.insert(
            identity.to_string(),
            sent_at.saturating_add(CHECK_AFTER.as_secs() as i64),
        );
        match self.early.remove(identity) {
            Some(seen) => self.provisioned(identity, Some(seen)).or(Some(sent)),
            None => Some(sent),
        }
    }

    /// `identity` was seen provisioned at `at` (an audit record's time; `None`: now, by its
    /// startup event). Returns its record to store when that makes it done: it acknowledged a
    /// request sent no later than `at`. A node whose acknowledgement was not read yet keeps
    /// the sighting for when it is.
    fn provisioned(&mut self, identity: &str, at: Option<i64>) -> Option<NodeRecord> {
        let n = self.nodes.get_mut(identity)?;
        if n.state == NodeRotation::Pending {
            if at.is_some() {
                self.reissued.insert(identity.to_string());
            }
            let seen = at.unwrap_or_else(now_unix);
            let e = self.early.entry(identity.to_string()).or_insert(seen);
            *e = (*e).max(seen);
            return None;
        }
        if n.state != NodeRotation::Sent || at.is_some_and(|t| n.sent_at.is_some_and(|s| t < s)) {
            return None;
        }
        n.state = NodeRotation::Done;
        n.finished_at = Some(now_unix());
        self.sent -= 1;
        self.done += 1;
        self.done_times.push_back(Instant::now());
        Some(n.clone())
    }

    /// `identity`, still `pending`, did not answer a request: done when the audit trail showed
    /// it provisioned since the campaign began (an earlier driver's request reached it and
    /// it is on its way back), else `None` and it is tried again.
    fn unanswered_but_reissued(&mut self, identity: &str) -> Option<NodeRecord> {
        if !self.reissued.contains(identity) {
            return None;
        }
        let n = self.nodes.get_mut(identity)?;
        if n.state != NodeRotation::Pending {
            return None;
        }
        self.reissued.remove(identity);
        self.early.remove(identity);
        n.state = NodeRotation::Done;
        n.finished_at = Some(now_unix());
        self.done += 1;
        self.done_times.push_back(Instant::now());
        Some(n.clone())
    }

    /// The `sent` nodes to ask now whether they restarted since they acknowledged, at most
    /// `room`; each is asked again [`CHECK_AFTER`] later if still `sent` then.
    fn due_checks(&mut self, now: i64, room: usize) -> Vec<String> {
        let nodes = &self.nodes;
        self.next_check
            .retain(|id, _| nodes.get(id).is_some_and(|n| n.state == NodeRotation::Sent));
        let mut due = Vec::new();
        for (id, when) in self.next_check.iter_mut() {
            if due.len() >= room {
                break;
            }
            if *when > now || self.checking.contains(id) {
                continue;
            }
            *when = now.saturating_add(CHECK_AFTER.as_secs() as i64);
            self.checking.insert(id.clone());
            due.push(id.clone());
        }
        due
    }

    /// `identity` answered on its main collective that it started at `started` (`None`: no
    /// answer). Returns its record to store when that makes it done: it started no earlier
    /// than its acknowledged request was sent.
    fn checked(&mut self, identity: &str, started: Option<i64>) -> Option<NodeRecord> {
        self.checking.remove(identity);
        let n = self.provisioned(identity, Some(started?))?;
        self.checked_done += 1;
        Some(n)
    }

    /// Queues the nodes whose wait before another try is over.
    fn due_retries(&mut self, now: Instant) {
        while let Some(Reverse((due, _))) = self.retry.peek() {
            if *due > now {
                break;
            }
            if let Some(Reverse((_, identity))) = self.retry.pop() {
                self.queue.push_front(identity);
            }
        }
    }

    fn count(&mut self) {
        self.rec.total = self.nodes.len() as u64;
        self.rec.in_flight = self.in_flight();
        self.rec.done = self.done;
        self.rec.failed = self.failed;
        self.rec.pending = self
            .rec
            .total
            .saturating_sub(self.in_flight() + self.done + self.failed);
    }

    fn eta(&mut self, now: i64) {
        let cutoff = Instant::now().checked_sub(Duration::from_secs(60));
        while self
            .done_times
            .front()
            .is_some_and(|t| cutoff.is_some_and(|c| *t < c))
        {
            self.done_times.pop_front();
        }
        let left = self.rec.pending + self.rec.in_flight;
        let per_minute = (self.done_times.len() as u64)
            .max(1)
            .min(u64::from(self.rec.limits.rate_per_minute));
        self.rec.eta = (left > 0)
            .then(|| now.saturating_add(i64::try_from(left * 60 / per_minute).unwrap_or(0)));
    }

    fn failing(&self) -> bool {
        let finished = self.done + self.failed;
        finished >= FAILING_MIN_FINISHED
            && (self.failed as f64) * 100.0 > self.rec.limits.stop_if_failing * finished as f64
    }
}

enum Sent {
    /// Acknowledged; the Unix time the request was sent (a node may be provisioned again
    /// before a busy driver gets to the acknowledgement).
    Acked(String, i64),
    Refused(String, String),
    NoReply(String, String),
}

fn send_outcome(
    identity: String,
    sent_at: i64,
    r: Result<impl Sized, choria_rpc_client::rpc::RequestError>,
) -> Sent {
    use choria_rpc_client::rpc::RequestErrorKind as K;
    match r {
        Ok(_) => Sent::Acked(identity, sent_at),
        // Its first request was acknowledged but not recorded (the driver was killed): it is
        // on its way back already.
        Err(e) if e.to_string().contains("already in provisioning mode") => {
            Sent::Acked(identity, sent_at)
        }
        Err(e) => match e.kind() {
            K::Timeout | K::NoResponders | K::Transport | K::Closed => {
                Sent::NoReply(identity, e.to_string())
            }
            _ => Sent::Refused(identity, e.to_string()),
        },
    }
}

impl Driver {
    /// Drives the campaign until it completes, is paused, stopped or aborted, or `stop` is
    /// cancelled (the campaign stays `running` and another driver may resume it at once).
    /// Returns the campaign as last written.
    pub async fn drive(
        &self,
        stop: CancellationToken,
        progress: &mut dyn Progress,
    ) -> Result<CampaignRecord, CampaignError> {
        let me = format!("{} pid {}", self.campaigns.by(), std::process::id());
        let mut run = self.take_lease(&me).await?;
        info!(
            "rotation campaign {}: driving {} nodes ({} waiting, {} in flight)",
            run.rec.id,
            run.nodes.len(),
            run.queue.len(),
            run.sent
        );
        let mut events = self
            .rpc
            .subscribe_lifecycle("startup", "server", None)
            .await
            .map_err(|e| CampaignError::Select(e.to_string()))?;
        // What the audit trail says since the campaign began (a crash may have hidden it).
        self.poll_audit(&mut run).await?;
        let mut sends: JoinSet<Sent> = JoinSet::new();
        let mut checks: JoinSet<(String, Option<i64>)> = JoinSet::new();
        let per_second = f64::from(run.rec.limits.rate_per_minute) / 60.0;
        let burst = per_second.max(1.0);
        let mut tokens = 1.0_f64.min(burst);
        let mut last_refill = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut last_beat = Instant::now();
        let ended = loop {
            tokio::select! {
                _ = stop.cancelled() => break false,
                ev = events.next() => {
                    if let Some(ev) = ev {
                        self.finish_node(&mut run, &ev.event.identity, None).await?;
                    }
                }
                Some(done) = sends.join_next(), if !sends.is_empty() => {
                    run.sending = run.sending.saturating_sub(1);
                    if let Ok(done) = done {
                        self.sent(&mut run, done).await?;
                    }
                }
                Some(Ok((identity, started))) = checks.join_next(), if !checks.is_empty() => {
                    if let Some(n) = run.checked(&identity, started) {
                        run.write_later(n);
                    }
                }
                _ = tick.tick() => {
                    self.flush(&mut run).await?;
                    let elapsed = last_refill.elapsed().as_secs_f64();
                    last_refill = Instant::now();
                    tokens = (tokens + elapsed * per_second).min(burst);
                    run.due_retries(last_refill);
                    self.send_due(&mut run, &mut tokens, &mut sends);
                    if last_beat.elapsed() >= HEARTBEAT {
                        last_beat = Instant::now();
                        self.poll_audit(&mut run).await?;
                        self.time_out(&mut run).await?;
                        self.spawn_checks(&mut run, &mut checks);
                        if run.checked_done > 0 {
                            info!(
                                "rotation campaign {}: {} nodes done that were back on their main collective, restarted since they acknowledged, with no provisioning record or startup event seen",
                                run.rec.id,
                                std::mem::take(&mut run.checked_done)
                            );
                        }
                        let keep = self.beat(&mut run, &me).await?;
                        progress.update(&run.rec);
                        if !keep {
                            break true;
                        }
                        if run.rec.state != CampaignState::Running && run.sending == 0 {
                            break true;
                        }
                    }
                }
            }
        };
        if !ended {
            info!(
                "rotation campaign {}: this driver stops; the campaign stays {} for `rotate resume`",
                run.rec.id, run.rec.state
            );
        }
        // Release the lease and write where the campaign is.
        self.flush(&mut run).await?;
        run.count();
        run.rec.driver.clear();
        run.rec.heartbeat = 0;
        let last = self.save(&mut run).await?;
        progress.update(&last);
        Ok(last)
    }

    /// Takes the campaign's lease as `me`: only a running campaign whose heartbeat has lapsed
    /// (or is `me`'s own) is driven, and the lease is written compare-and-set.
    async fn take_lease(&self, me: &str) -> Result<Run, CampaignError> {
        let c = &self.campaigns;
        let now = now_unix();
        let (mut rec, revision) = c.read().await?.ok_or(CampaignError::NoCampaign)?;
        if rec.state != CampaignState::Running {
            return Err(CampaignError::State {
                id: rec.id,
                state: rec.state,
                what: "only a running campaign is driven; resume it first".into(),
            });
        }
        if rec.driven(now) && rec.driver != me {
            return Err(CampaignError::Busy {
                age: rec.heartbeat_age(now),
                id: rec.id,
                driver: rec.driver,
            });
        }
        rec.driver = me.to_string();
        rec.heartbeat = now;
        let revision = c
            .write(&rec, Some(revision))
            .await?
            .ok_or_else(|| CampaignError::Busy {
                id: rec.id.clone(),
                driver: "another process".into(),
                age: 0,
            })?;
        let nodes = c.nodes().await?;
        Ok(Run::new(rec, revision, nodes))
    }

    /// Sends `reprovision` to the next waiting nodes while the campaign runs, a token of the
    /// rate is left and the in-flight limit allows; a node that did not answer before and has
    /// been provisioned since is done without a request.
    fn send_due(&self, run: &mut Run, tokens: &mut f64, sends: &mut JoinSet<Sent>) {
        while run.rec.state == CampaignState::Running
            && *tokens >= 1.0
            && run.in_flight() < u64::from(run.rec.limits.max_in_flight)
        {
            let Some(identity) = run.queue.pop_front() else {
                break;
            };
            match run.nodes.get(&identity) {
                Some(n) if n.state == NodeRotation::Pending => {
                    if n.tries > 0 {
                        if let Some(n) = run.unanswered_but_reissued(&identity) {
                            run.write_later(n);
                            continue;
                        }
                    }
                }
                _ => continue,
            }
            *tokens -= 1.0;
            run.sending += 1;
            let rpc = self.rpc.clone();
            let token = self.token.clone();
            sends.spawn(async move {
                let sent_at = now_unix();
                let r = rpc
                    .provision_reprovision(&identity, &token, REPROVISION_TIMEOUT)
                    .await;
                send_outcome(identity, sent_at, r)
            });
        }
    }

    /// Asks the nodes in flight whose check is due when they started (`rpcutil#daemon_stats`
    /// on the main collective), at most [`MAX_CHECKS`] at a time.
    fn spawn_checks(&self, run: &mut Run, checks: &mut JoinSet<(String, Option<i64>)>) {
        for identity in run.due_checks(now_unix(), MAX_CHECKS.saturating_sub(checks.len())) {
            let rpc = self.rpc.clone();
            checks.spawn(async move {
                let started = rpc
                    .daemon_stats(&identity, CHECK_TIMEOUT)
                    .await
                    .ok()
                    .map(|s| s.starttime);
                (identity, started)
            });
        }
    }

    /// Writes progress and the heartbeat; adopts a pause or abort written by someone else.
    /// Returns false when the lease was lost or the campaign is over.
    async fn beat(&self, run: &mut Run, me: &str) -> Result<bool, CampaignError> {
        run.count();
        let now = now_unix();
        run.eta(now);
        if run.rec.state == CampaignState::Running {
            if run.failing() {
                run.rec.state = CampaignState::Stopped;
                run.rec.reason = format!(
                    "stopped itself: {} of {} finished nodes failed, more than {}%",
                    run.failed,
                    run.done + run.failed,
                    run.rec.limits.stop_if_failing
                );
                warn!("rotation campaign {}: {}", run.rec.id, run.rec.reason);
            } else if run.rec.pending == 0 && run.rec.in_flight == 0 {
                run.rec.state = CampaignState::Completed;
                run.rec.eta = None;
                info!(
                    "rotation campaign {} completed: {}",
                    run.rec.id,
                    run.rec.progress()
                );
            }
        }
        run.rec.heartbeat = now;
        let stored = self.save(run).await?;
        if stored.driver != me {
            warn!(
                "rotation campaign {}: taken over by {}",
                run.rec.id,
                escaped(&stored.driver)
            );
            return Ok(false);
        }
        Ok(!run.rec.state.finished())
    }

    /// Writes the campaign over its revision, adopting an operator's state change made since.
    /// Returns what is stored: another driver's record when the lease was taken.
    async fn save(&self, run: &mut Run) -> Result<CampaignRecord, CampaignError> {
        let c = &self.campaigns;
        for tries in 1..=20u64 {
            // A write or read that timed out is tried again: the write over the revision may
            // have been stored, which reading the record shows.
            match c.write(&run.rec, Some(run.revision)).await {
                Ok(Some(r)) => {
                    run.revision = r;
                    return Ok(run.rec.clone());
                }
                Ok(None) => {}
                Err(e) if timed_out(&e.to_string()) => {
                    warn!("rotation campaign {}: {e}; trying again", run.rec.id);
                    tokio::time::sleep(RETRY_PAUSE * tries.min(4) as u32).await;
                }
                Err(e) => return Err(e),
            }
            let (stored, r) = match c.read().await {
                Ok(Some(got)) => got,
                Ok(None) => return Err(CampaignError::NoCampaign),
                Err(e) if timed_out(&e.to_string()) => {
                    warn!("rotation campaign {}: {e}; trying again", run.rec.id);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if stored.id != run.rec.id
                || (!stored.driver.is_empty() && stored.driver != run.rec.driver)
            {
                return Ok(stored);
            }
            run.revision = r;
            if stored.state != run.rec.state {
                info!(
                    "rotation campaign {}: {} ({})",
                    run.rec.id,
                    stored.state,
                    escaped(&stored.reason)
                );
                run.rec.state = stored.state;
                run.rec.reason = stored.reason;
            }
        }
        Err(request(
            "write the campaign",
            "the record kept changing under this write",
        ))
    }

    async fn sent(&self, run: &mut Run, done: Sent) -> Result<(), CampaignError> {
        match done {
            Sent::Acked(identity, sent_at) => {
                if let Some(n) = run.acked(&identity, sent_at) {
                    run.write_later(n);
                }
            }
            Sent::Refused(identity, why) => self.fail(run, &identity, &why).await?,
            Sent::NoReply(identity, why) => {
                if let Some(n) = run.unanswered_but_reissued(&identity) {
                    run.write_later(n);
                    return Ok(());
                }
                let tries = run.nodes.get_mut(&identity).map(|n| {
                    n.tries += 1;
                    n.tries
                });
                match tries {
                    Some(t) if t >= SEND_TRIES => self.fail(run, &identity, &why).await?,
                    Some(t) => {
                        let due = Instant::now() + RETRY_WAIT * t;
                        run.retry.push(Reverse((due, identity)));
                    }
                    None => {}
                }
            }
        }
        Ok(())
    }

    async fn fail(&self, run: &mut Run, identity: &str, why: &str) -> Result<(), CampaignError> {
        let Some(n) = run.nodes.get_mut(identity) else {
            return Ok(());
        };
        match n.state {
            NodeRotation::Done | NodeRotation::Failed => return Ok(()),
            NodeRotation::Sent => run.sent -= 1,
            NodeRotation::Pending => {}
        }
        run.failed += 1;
        let now = now_unix();
        n.state = NodeRotation::Failed;
        n.finished_at = Some(now);
        n.error = bounded(why, MAX_ERROR);
        let n = n.clone();
        warn!(
            "rotation campaign {}: {} failed: {}",
            run.rec.id,
            escaped(identity),
            escaped(&n.error)
        );
        if run.rec.recent_failures.len() >= RECENT_FAILURES {
            run.rec.recent_failures.remove(0);
        }
        run.rec.recent_failures.push(NodeFailure {
            identity: n.identity.clone(),
            error: n.error.clone(),
            at: now,
        });
        run.write_later(n);
        Ok(())
    }

    /// Marks `identity` done when it acknowledged a request (and, with `at`, was provisioned
    /// no earlier than it acknowledged).
    async fn finish_node(
        &self,
        run: &mut Run,
        identity: &str,
        at: Option<i64>,
    ) -> Result<(), CampaignError> {
        if let Some(n) = run.provisioned(identity, at) {
            run.write_later(n);
        }
        Ok(())
    }

    /// Writes the node records changed since the last flush, [`BULK`] at a time.
    async fn flush(&self, run: &mut Run) -> Result<(), CampaignError> {
        if run.unwritten.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut run.unwritten);
        let c = &self.campaigns;
        let mut puts = futures::stream::iter(batch.into_values())
            .map(|n| async move { c.put_node(&n).await })
            .buffer_unordered(BULK);
        while let Some(r) = puts.next().await {
            r?;
        }
        Ok(())
    }

    async fn poll_audit(&self, run: &mut Run) -> Result<(), CampaignError> {
        let (Some((js, stream)), Some(from)) = (&self.audit, run.audit_next) else {
            return Ok(());
        };
        let mut provisioned = Vec::new();
        let read = read_audit(js, stream, from, |a| {
            if a.decision == "provisioned" {
                provisioned.push((a.identity, a.at));
            }
        })
        .await;
        // A read that timed out (a busy broker) is made again from the same place at the next
        // heartbeat; the stream is durable.
        let next = match read {
            Ok(next) => next,
            Err(e) if timed_out(&e.to_string()) => {
                warn!(
                    "rotation campaign {}: {e}; reading it again later",
                    run.rec.id
                );
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        run.audit_next = Some(next);
        for (identity, at) in provisioned {
            self.finish_node(run, &identity, Some(at)).await?;
        }
        Ok(())
    }

    async fn time_out(&self, run: &mut Run) -> Result<(), CampaignError> {
        if run.sent == 0 {
            return Ok(());
        }
        let limit = i64::try_from(run.rec.limits.node_timeout_secs).unwrap_or(i64::MAX);
        let now = now_unix();
        let late: Vec<String> = run
            .nodes
            .values()
            .filter(|n| {
                n.state == NodeRotation::Sent
                    && n.sent_at.is_some_and(|s| now.saturating_sub(s) > limit)
            })
            .map(|n| n.identity.clone())
            .collect();
        for identity in late {
            let why = format!("not provisioned again within {limit}s of acknowledging reprovision");
            self.fail(run, &identity, &why).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::campaign::testing::*;

    #[test]
    fn a_run_counts_nodes_and_judges_the_failure_share() {
        let mut nodes: Vec<NodeRecord> = (0..30)
            .map(|i| node(&format!("n{i}"), NodeRotation::Done))
            .collect();
        nodes.push(node("p1", NodeRotation::Pending));
        nodes.push(node("s1", NodeRotation::Sent));
        nodes.push(node("f1", NodeRotation::Failed));
        let mut run = Run::new(record(33), 1, nodes);
        assert_eq!(run.queue, vec!["p1".to_string()]);
        assert_eq!(
            (
                run.rec.pending,
                run.rec.in_flight,
                run.rec.done,
                run.rec.failed
            ),
            (1, 1, 30, 1)
        );
        // 1 failed of 31 finished is above 2% and below 5%.
        assert!(!run.failing());
        run.rec.limits.stop_if_failing = 2.0;
        assert!(run.failing());
        run.sending = 1;
        run.count();
        assert_eq!((run.rec.pending, run.rec.in_flight), (0, 2));
        // Too few finished nodes to judge.
        let small = Run::new(
            record(2),
            1,
            vec![
                node("a", NodeRotation::Failed),
                node("b", NodeRotation::Done),
            ],
        );
        assert!(!small.failing());
    }

    #[test]
    fn an_acknowledgement_keeps_the_time_its_request_was_sent() {
        let ok: Result<(), choria_rpc_client::rpc::RequestError> = Ok(());
        match send_outcome("n1".into(), 1_000, ok) {
            Sent::Acked(id, at) => assert_eq!((id.as_str(), at), ("n1", 1_000)),
            _ => panic!("not acknowledged"),
        }
    }

    #[test]
    fn a_node_provisioned_before_its_acknowledgement_is_read_is_done_when_it_is() {
        let nodes = ["n1", "n2", "n3", "n4"]
            .map(|id| node(id, NodeRotation::Pending))
            .to_vec();
        let mut run = Run::new(record(4), 1, nodes);
        // n1: the audit record (time 105) and the startup event of n2 arrive before the
        // acknowledgements of requests sent at 100.
        assert!(run.provisioned("n1", Some(105)).is_none());
        assert!(run.provisioned("n2", None).is_none());
        let n1 = run.acked("n1", 100).unwrap();
        assert_eq!(n1.state, NodeRotation::Done);
        let n2 = run.acked("n2", 100).unwrap();
        assert_eq!(n2.state, NodeRotation::Done);
        // n3 was provisioned (time 90) before its request was sent (100): on its way only.
        assert!(run.provisioned("n3", Some(90)).is_none());
        let n3 = run.acked("n3", 100).unwrap();
        assert_eq!((n3.state, n3.sent_at), (NodeRotation::Sent, Some(100)));
        assert!(run.provisioned("n3", Some(99)).is_none());
        assert_eq!(
            run.provisioned("n3", Some(101)).map(|n| n.state),
            Some(NodeRotation::Done)
        );
        // n4 in the usual order; a second sighting changes nothing.
        assert_eq!(
            run.acked("n4", 100).map(|n| n.state),
            Some(NodeRotation::Sent)
        );
        assert!(run.provisioned("n4", None).is_some());
        assert!(run.provisioned("n4", None).is_none());
        assert!(run.acked("n4", 100).is_none());
        assert_eq!((run.done, run.sent), (4, 0));
        assert!(run.early.is_empty());
    }

    #[test]
    fn a_sent_node_with_no_news_is_asked_and_done_only_when_it_restarted_since_it_acknowledged() {
        let mut inherited = node("n1", NodeRotation::Sent);
        inherited.sent_at = Some(100);
        let nodes = vec![inherited, node("n2", NodeRotation::Pending)];
        let mut run = Run::new(record(2), 1, nodes);
        let after = CHECK_AFTER.as_secs() as i64;
        // n1 acknowledged a request of an earlier driver: asked at once, once at a time.
        assert_eq!(run.due_checks(150, 8), vec!["n1".to_string()]);
        assert!(run.due_checks(150, 8).is_empty());
        // No answer (in provisioning mode, off its main collective): asked again later.
        assert!(run.checked("n1", None).is_none());
        assert!(run.due_checks(150 + after - 1, 8).is_empty());
        assert_eq!(run.due_checks(150 + after, 8), vec!["n1".to_string()]);
        // It answers with the start before its request: the reprovision has not restarted it.
        assert!(run.checked("n1", Some(99)).is_none());
        // n2 acknowledges at 200: asked only after CHECK_AFTER, and never while none is room.
        assert_eq!(
            run.acked("n2", 200).map(|n| n.state),
            Some(NodeRotation::Sent)
        );
        assert!(run.due_checks(200 + after - 1, 8).is_empty());
        assert!(run.due_checks(200 + after, 0).is_empty());
        let due = run.due_checks(150 + 2 * after, 8);
        assert_eq!(due.len(), 2, "{due:?}");
        // Restarted since: done, and not asked again.
        assert_eq!(
            run.checked("n1", Some(160)).map(|n| n.state),
            Some(NodeRotation::Done)
        );
        assert_eq!(
            run.checked("n2", Some(200)).map(|n| n.state),
            Some(NodeRotation::Done)
        );
        assert_eq!((run.done, run.sent, run.checked_done), (2, 0, 2));
        assert!(run.due_checks(10_000, 8).is_empty());
        assert!(run.next_check.is_empty() && run.checking.is_empty());
    }

    #[test]
    fn a_node_that_does_not_answer_is_done_only_when_the_audit_trail_shows_it_provisioned() {
        let nodes = ["n1", "n2", "n3"]
            .map(|id| node(id, NodeRotation::Pending))
            .to_vec();
        let mut run = Run::new(record(3), 1, nodes);
        // n1: provisioned during the campaign by the audit trail (an earlier driver's request
        // reached it); n2: only a startup event, which any restart sends; n3: nothing.
        assert!(run.provisioned("n1", Some(105)).is_none());
        assert!(run.provisioned("n2", None).is_none());
        let n1 = run.unanswered_but_reissued("n1").unwrap();
        assert_eq!(n1.state, NodeRotation::Done);
        assert!(run.unanswered_but_reissued("n2").is_none());
        assert!(run.unanswered_but_reissued("n3").is_none());
        assert!(run.unanswered_but_reissued("n1").is_none());
        assert_eq!((run.done, run.sent, run.failed), (1, 0, 0));
    }

    #[test]
    fn nodes_that_did_not_answer_are_queued_again_when_their_wait_is_over() {
        let mut run = Run::new(record(0), 1, Vec::new());
        let now = Instant::now();
        run.retry
            .push(Reverse((now + Duration::from_secs(60), "late".into())));
        run.retry
            .push(Reverse((now + Duration::from_secs(30), "soon".into())));
        run.due_retries(now);
        assert!(run.queue.is_empty());
        run.due_retries(now + Duration::from_secs(31));
        assert_eq!(run.queue, ["soon"]);
        run.due_retries(now + Duration::from_secs(61));
        assert_eq!(run.queue, ["late", "soon"]);
        assert!(run.retry.is_empty());
    }
}
