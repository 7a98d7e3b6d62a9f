//! How the fleet answers: nodes coming online on their collectives, the receive loop and the
//! worker pool that hands each request to its node, and what a node does after it answers
//! (restart, shutdown, reprovision, lifecycle events).

use super::*;

impl Inner {
    pub(super) fn report_of(&self, i: usize) -> Option<NodeReport> {
        let id = self.identities.get(i)?;
        let node = self.nodes.get(i)?.lock().ok()?;
        let set = node.online().and_then(|s| self.collective_set(s));
        Some(node.report(id, &self.cfg.version, set.as_deref()))
    }

    pub(super) fn collective_set(&self, set: u16) -> Option<Arc<[String]>> {
        self.collective_sets
            .read()
            .ok()?
            .get(usize::from(set))
            .cloned()
    }

    pub(super) fn env<'a>(
        &'a self,
        idx: usize,
        key_generation: usize,
        collectives: Option<&'a [String]>,
    ) -> NodeEnv<'a> {
        let rsa_key = self
            .pool
            .get()
            .filter(|p| !p.is_empty())
            .and_then(|p| p.get(idx.wrapping_add(key_generation) % p.len()));
        let keys = (!self.keys.is_empty())
            .then(|| &self.keys[idx.wrapping_add(key_generation) % self.keys.len()]);
        NodeEnv {
            token: &self.cfg.token,
            jwt: &self.jwt,
            version: &self.cfg.version,
            upgradable: self.cfg.upgradable,
            config_file: &self.cfg.config_file,
            config_dir: &self.config_dir,
            issuer: self.cfg.issuer_public.as_ref().map(|key| IssuerCheck {
                key,
                every: self.cfg.issuer_check_every,
                seen: &self.issuer_seen,
            }),
            mode: self.cfg.mode,
            lock_window: self.cfg.lock_window,
            rsa_key,
            keys,
            faults: &self.cfg.faults,
            now: Instant::now(),
            unix_now: unix_now(),
            fleet_started: self.started,
            collectives,
            reprovision_delay: self.cfg.reprovision_delay,
            stay_online: self.cfg.stay_online,
        }
    }

    /// Subscribe to a collective's directed subject (a wildcard, as for `provisioning`) and
    /// its broadcast agent subjects; the caller hands them to the receive loop.
    pub(super) async fn collective_subscriptions(
        &self,
        collective: &str,
    ) -> Result<Vec<async_nats::Subscriber>, (String, async_nats::SubscribeError)> {
        let mut subjects = vec![if self.generated_names() {
            format!("{collective}.node.*.{}", self.cfg.domain)
        } else {
            format!("{collective}.node.>")
        }];
        subjects.extend(
            AGENTS
                .iter()
                .map(|a| protocol::broadcast_subject(collective, a)),
        );
        let mut subs = Vec::with_capacity(subjects.len());
        for subject in subjects {
            match self.client.subscribe(subject.clone()).await {
                Ok(s) => subs.push(s),
                Err(e) => return Err((subject, e)),
            }
        }
        Ok(subs)
    }

    /// Whether every identity is `<prefix>-<n>.<domain>`, so one wildcard per collective
    /// covers the fleet's directed subjects and no more.
    pub(super) fn generated_names(&self) -> bool {
        self.cfg.identities.is_none()
            && !self.cfg.identity_prefix.contains(['.', '*', '>', ' '])
            && !self.cfg.domain.is_empty()
            && !self.cfg.domain.contains(['*', '>', ' '])
    }

    /// Put a node just restarted out of provisioning mode online on the collectives of its
    /// configuration: intern the set, subscribe to collectives not yet served.
    pub(super) async fn go_online(&self, idx: usize, identity: &str) -> Result<(), NodeError> {
        const ACTION: &str = "restart";
        let Some(collectives) = self
            .nodes
            .get(idx)
            .and_then(|n| n.lock().ok())
            .and_then(|n| n.configured_collectives())
        else {
            return Ok(());
        };
        if collectives.len() > crate::config::MAX_COLLECTIVES {
            return Err(NodeError::TooManyCollectives {
                identity: identity.to_string(),
                action: ACTION,
                count: collectives.len(),
                max: crate::config::MAX_COLLECTIVES,
            });
        }
        if let Some(bad) = collectives
            .iter()
            .find(|c| !crate::config::valid_collective(c))
        {
            return Err(NodeError::InvalidCollective {
                identity: identity.to_string(),
                action: ACTION,
                collective: bad.chars().take(80).collect(),
            });
        }
        {
            let mut subscribed = self.subscribed.lock().await;
            for c in &collectives {
                if subscribed.contains(c) {
                    continue;
                }
                if subscribed.len() >= MAX_FLEET_COLLECTIVES {
                    return Err(NodeError::FleetCollectives {
                        identity: identity.to_string(),
                        action: ACTION,
                        max: MAX_FLEET_COLLECTIVES,
                    });
                }
                let subs =
                    self.collective_subscriptions(c)
                        .await
                        .map_err(|(subject, source)| NodeError::Subscribe {
                            identity: identity.to_string(),
                            action: ACTION,
                            subject,
                            source,
                        })?;
                for sub in subs {
                    if self.new_subs.send(sub).await.is_err() {
                        // The receive loop is gone: the fleet is shutting down.
                        return Ok(());
                    }
                }
                let _ = self.client.flush().await;
                subscribed.insert(c.clone());
            }
        }
        let set = {
            let Ok(mut sets) = self.collective_sets.write() else {
                return Ok(());
            };
            match sets.iter().position(|s| **s == *collectives) {
                Some(i) => i,
                None if sets.len() >= MAX_COLLECTIVE_SETS => {
                    return Err(NodeError::FleetCollectives {
                        identity: identity.to_string(),
                        action: ACTION,
                        max: MAX_COLLECTIVE_SETS,
                    })
                }
                None => {
                    sets.push(Arc::from(collectives));
                    sets.len() - 1
                }
            }
        };
        if let (Ok(set), Some(Ok(mut node))) =
            (u16::try_from(set), self.nodes.get(idx).map(|n| n.lock()))
        {
            node.set_online(set);
        }
        Ok(())
    }

    /// Keep the phase gauges (`provisioned`, `broken`, `shut_down`) in step with a node
    /// moving from `before` to `after`.
    pub(super) fn count_phase(&self, before: Phase, after: Phase) {
        if before == after {
            return;
        }
        let gauge = |p: Phase| match p {
            Phase::Provisioned => Some(&self.counters.provisioned),
            Phase::Broken => Some(&self.counters.broken),
            Phase::ShutDown => Some(&self.counters.shut_down),
            Phase::Provisioning => None,
        };
        if let Some(g) = gauge(before) {
            let _ = g.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            });
        }
        if let Some(g) = gauge(after) {
            g.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) async fn receive(
        self: Arc<Self>,
        subs: Vec<async_nats::Subscriber>,
        mut new_subs: mpsc::Receiver<async_nats::Subscriber>,
    ) {
        let mut all = futures::stream::select_all(subs);
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => break,
                Some(sub) = new_subs.recv() => {
                    all.push(sub);
                    continue;
                }
                m = all.next() => match m { Some(m) => m, None => break },
            };
            // Answered here rather than in a task of its own: a request is tens of
            // microseconds of work, and the replies of the requests read in a row go out in
            // one write to the broker, with no task switch between them. The one
            // slow answer, a CSR, runs on a blocking thread (`answer`).
            self.handle(msg.subject.as_str(), &msg.payload).await;
        }
    }

    pub(super) async fn handle(self: &Arc<Self>, subject: &str, payload: &[u8]) {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let req = match ServerRequest::parse(payload) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("dropping undecodable request on {subject}: {e}");
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        // A v1 server drops v2 requests and vice versa; stale or future requests are dropped.
        if req.version != self.cfg.protocol
            || !req.is_fresh(SystemTime::now())
            || req.reply_to.is_none()
        {
            self.counters.ignored.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let req = Arc::new(req);
        let (scope, directed) = if let Some(identity) = subject.strip_prefix(DIRECTED) {
            (Scope::Provisioning, Some(identity))
        } else if subject.starts_with("provisioning.") {
            (Scope::Provisioning, None)
        } else {
            // A main collective: `<collective>.node.<identity>` or a broadcast.
            let Some((collective, rest)) = subject.split_once('.') else {
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                return;
            };
            // A provisioned server verifies the request's signature (see the crate docs for
            // what the simulator does not check).
            if let Err(e) = req.verify() {
                tracing::debug!("dropping request on {subject}: {e}");
                self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                self.counters.unverified.fetch_add(1, Ordering::Relaxed);
                return;
            }
            let member: Arc<[bool]> = match self.collective_sets.read() {
                Ok(sets) => sets
                    .iter()
                    .map(|s| s.iter().any(|c| c == collective))
                    .collect(),
                Err(_) => return,
            };
            (Scope::Main(member), rest.strip_prefix("node."))
        };
        // Compiled once: a broadcast is matched against every node.
        let matcher = req.filter.matcher();
        if let Some(identity) = directed {
            match self.index.get(identity) {
                Some(&i) => self.answer(i as usize, &req, &matcher, &scope).await,
                None => {
                    self.counters.ignored.fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        for i in 0..self.identities.len() {
            if self.cancel.is_cancelled() {
                return;
            }
            self.answer(i, &req, &matcher, &scope).await;
        }
    }

    pub(super) async fn answer(
        self: &Arc<Self>,
        idx: usize,
        req: &Arc<Request>,
        matcher: &Matcher<'_>,
        scope: &Scope,
    ) {
        let Some(identity) = self.identities.get(idx).cloned() else {
            return;
        };
        let info = NodeInfo {
            identity: &identity,
            agents: &self.agents,
            classes: &[],
            facts: &self.facts,
        };
        if !matcher.matches(&info) {
            return;
        }
        let is_gencsr = req.agent == "choria_provision"
            && memchr::memmem::find(&req.payload, b"gencsr").is_some();
        if is_gencsr {
            // CSRs need the key pool, and RSA signing is slow: at most `workers` at once, each
            // in a task of its own that signs on a blocking thread, while other requests are
            // answered.
            let Ok(permit) = self.csr_permits.clone().acquire_owned().await else {
                return;
            };
            let me = self.clone();
            let r = req.clone();
            let sc = scope.clone();
            self.tracker.spawn(async move {
                me.wait_pool().await;
                let signer = me.clone();
                let (id, req) = (identity.clone(), r.clone());
                let out =
                    tokio::task::spawn_blocking(move || signer.run_node(idx, &id, &req, &sc)).await;
                if let Ok(Some(out)) = out {
                    me.deliver(idx, &identity, &r, out).await;
                }
                drop(permit);
            });
            return;
        }
        if let Some(out) = self.run_node(idx, &identity, req, scope) {
            self.deliver(idx, &identity, req, out).await;
        }
    }

    /// Generate the RSA pool in the background unless it exists. A plain thread rather than a
    /// runtime task: key generation cannot be interrupted and must not hold up shutdown.
    pub(super) fn start_pool(self: &Arc<Self>) {
        if self.pool.get().is_some() {
            return;
        }
        let me = self.clone();
        self.pool_started.call_once(move || {
            let spawned = std::thread::Builder::new()
                .name("rsa-pool".into())
                .spawn(move || {
                    let size = me.cfg.rsa_pool_size.max(1);
                    let keys: Vec<PoolKey> =
                        (0..size).filter_map(|_| PoolKey::generate().ok()).collect();
                    if keys.is_empty() {
                        tracing::error!("could not generate any rsa key for gencsr");
                    }
                    let _ = me.pool.set(keys);
                    me.pool_ready.notify_waiters();
                });
            if let Err(e) = spawned {
                tracing::error!("cannot start rsa key generation: {e}");
            }
        });
    }

    pub(super) async fn wait_pool(self: &Arc<Self>) {
        self.start_pool();
        loop {
            let ready = self.pool_ready.notified();
            if self.pool.get().is_some() {
                return;
            }
            tokio::select! {
                _ = ready => {},
                _ = tokio::time::sleep(Duration::from_millis(200)) => {},
            }
        }
    }

    pub(super) fn run_node(
        &self,
        idx: usize,
        identity: &str,
        req: &Request,
        scope: &Scope,
    ) -> Option<NodeOutcome> {
        let mut node = self.nodes.get(idx)?.lock().ok()?;
        let set = match scope {
            Scope::Provisioning if node.answers() => None,
            Scope::Provisioning => return None,
            Scope::Main(member) => {
                let set = node.online()?;
                if !member.get(usize::from(set)).copied().unwrap_or(false) {
                    return None;
                }
                Some(self.collective_set(set)?)
            }
        };
        if req.agent == "discovery" {
            return Some(node.discovery(&req.payload));
        }
        let before = node.phase;
        let env = self.env(idx, node.key_generation(), set.as_deref());
        let out = node.rpc(
            &env,
            &req.agent,
            &Call {
                identity,
                sender: &req.sender,
                caller: &req.caller,
                payload: &req.payload,
            },
        );
        let after = node.phase;
        drop(node);
        self.count_phase(before, after);
        Some(out)
    }

    pub(super) async fn deliver(
        self: &Arc<Self>,
        idx: usize,
        identity: &Arc<str>,
        req: &Request,
        out: NodeOutcome,
    ) {
        if let Some(body) = out.reply {
            let body = self.cfg.faults.reply_body(identity, &req.agent, body);
            let copies = self.cfg.faults.reply_copies(identity, &req.agent);
            let sender = if out.wrong_identity {
                format!("wrong-{identity}")
            } else {
                identity.to_string()
            };
            match protocol::build_reply(req, &sender, &body) {
                Ok(bytes) => {
                    let subject = req.reply_to.clone().unwrap_or_default();
                    if req.agent == "discovery" {
                        self.counters
                            .discovery_replies
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    match self.cfg.faults.slow_for(identity) {
                        Some(delay) => {
                            let me = self.clone();
                            self.tracker.spawn(async move {
                                tokio::select! {
                                    _ = me.cancel.cancelled() => {},
                                    _ = tokio::time::sleep(delay) => me.publish(subject, bytes).await,
                                }
                            });
                        }
                        None => {
                            for _ in 1..copies {
                                self.publish(subject.clone(), bytes.clone()).await;
                            }
                            self.publish(subject, bytes).await
                        }
                    }
                }
                Err(e) => tracing::warn!("{identity}: cannot build reply to {}: {e}", req.agent),
            }
        }
        for effect in out.effects {
            match effect {
                Effect::Event {
                    kind,
                    component,
                    new_version,
                } => {
                    if kind == "provisioned" {
                        self.counters.configured.fetch_add(1, Ordering::Relaxed);
                        self.changed.notify_waiters();
                    }
                    let mut e = LifecycleEvent::new(kind, identity, component);
                    if kind == "upgraded" {
                        e.version = Some(self.cfg.version.clone());
                        e.new_version = new_version;
                    }
                    self.event(e).await;
                }
                Effect::Reprovision { after } => {
                    self.counters
                        .reprovision_requests
                        .fetch_add(1, Ordering::Relaxed);
                    let me = self.clone();
                    let id = identity.clone();
                    self.tracker.spawn(async move {
                        tokio::select! {
                            _ = me.cancel.cancelled() => return,
                            _ = tokio::time::sleep(after) => {},
                        }
                        me.finish_reprovision(idx, &id).await;
                    });
                }
                Effect::Restart | Effect::Shutdown => {
                    let me = self.clone();
                    let id = identity.clone();
                    self.tracker.spawn(async move {
                        tokio::select! {
                            _ = me.cancel.cancelled() => return,
                            _ = tokio::time::sleep(me.cfg.restart_delay) => {},
                        }
                        if effect == Effect::Restart {
                            me.finish_restart(idx, &id).await;
                        } else {
                            me.finish_shutdown(idx, &id).await;
                        }
                    });
                }
            }
        }
    }

    pub(super) async fn finish_restart(&self, idx: usize, identity: &str) {
        let (component, before, mut phase, version) = {
            let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) else {
                return;
            };
            let before = node.phase;
            let env = self.env(idx, node.key_generation(), None);
            let c = node.finish_restart(&env, identity);
            (
                c,
                before,
                node.phase,
                node.version(&self.cfg.version).to_string(),
            )
        };
        if phase == Phase::Provisioned && before != Phase::Provisioned {
            self.counters.provisions.fetch_add(1, Ordering::Relaxed);
        }
        if phase == Phase::Provisioned && self.cfg.stay_online {
            if let Err(e) = self.go_online(idx, identity).await {
                tracing::warn!("{e}");
                if let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) {
                    node.break_with(e.to_string());
                    phase = node.phase;
                }
            }
        }
        self.count_phase(before, phase);
        if phase == Phase::Broken {
            tracing::warn!("{identity}: restarted with an unusable configuration");
        }
        self.changed.notify_waiters();
        if let Some(component) = component {
            self.event(LifecycleEvent::startup(identity, component, &version))
                .await;
        }
    }

    pub(super) async fn finish_shutdown(&self, idx: usize, identity: &str) {
        let mut component = "provision_mode_server";
        if let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) {
            let before = node.phase;
            if before == Phase::Provisioned {
                component = "server";
            }
            node.finish_shutdown();
            drop(node);
            self.count_phase(before, Phase::ShutDown);
        }
        self.changed.notify_waiters();
        self.event(LifecycleEvent::new("shutdown", identity, component))
            .await;
    }

    /// A node's `reprovision` delay is over: it is back in provisioning mode and announces
    /// itself as it does at start.
    pub(super) async fn finish_reprovision(&self, idx: usize, identity: &str) {
        let version = {
            let Some(Ok(mut node)) = self.nodes.get(idx).map(|n| n.lock()) else {
                return;
            };
            let before = node.phase;
            node.finish_reprovision(unix_now());
            let after = node.phase;
            let v = node.version(&self.cfg.version).to_string();
            drop(node);
            self.count_phase(before, after);
            v
        };
        self.counters.reprovisioned.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_waiters();
        self.event(LifecycleEvent::startup(
            identity,
            "provision_mode_server",
            &version,
        ))
        .await;
    }

    pub(super) async fn publish(&self, subject: String, bytes: Bytes) {
        match self.client.publish(subject, bytes).await {
            Ok(()) => {
                self.counters.replies.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::warn!("cannot publish a reply: {e}"),
        }
    }

    pub(super) async fn event(&self, e: LifecycleEvent) {
        let body = if self.cfg.legacy_lifecycle {
            e.to_choria_json()
        } else {
            e.to_cloudevent_json()
        };
        let Ok(body) = body else { return };
        match self.client.publish(e.subject(), Bytes::from(body)).await {
            Ok(()) => {
                self.counters.events.fetch_add(1, Ordering::Relaxed);
            }
            Err(err) => tracing::warn!(
                "{}: cannot publish {} event: {err}",
                e.identity,
                e.event_type()
            ),
        }
    }

    /// Every node announces itself, `startup_rate` per second, as servers coming up would;
    /// first come `bogus_events` announcements of nodes that do not exist.
    pub(super) async fn startup_events(self: Arc<Self>) {
        // A thousand at a time, all handed to the connection before any is awaited, so that
        // they leave in large writes: a flood costs its sender little, as an attacker's would.
        let mut start = 0;
        while start < self.cfg.bogus_events {
            if self.cancel.is_cancelled() {
                return;
            }
            let end = (start + 1000).min(self.cfg.bogus_events);
            futures::future::join_all((start..end).map(|n| {
                let id = crate::config::bogus_identity(n, &self.cfg.domain);
                self.event(LifecycleEvent::startup(
                    &id,
                    "provision_mode_server",
                    &self.cfg.version,
                ))
            }))
            .await;
            // Let the broker keep up rather than dropping the connection as a slow one.
            let _ = self.client.flush().await;
            start = end;
        }
        if self.cfg.bogus_events > 0 {
            let _ = self.client.flush().await;
            tracing::warn!("published {} bogus startup events", self.cfg.bogus_events);
        }
        let rate = self.cfg.startup_rate;
        if rate == 0 {
            return;
        }
        // Ticks of 10 ms carrying rate/100 events (at least one).
        let per_tick = usize::try_from(rate / 100).unwrap_or(1).max(1);
        let tick = Duration::from_secs_f64(per_tick as f64 / f64::from(rate));
        let mut interval = tokio::time::interval(tick);
        for (c, chunk) in self.identities.chunks(per_tick).enumerate() {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = interval.tick() => {},
            }
            for (i, id) in chunk.iter().enumerate() {
                let idx = c * per_tick + i;
                // Nodes started provisioned come up as normal servers.
                let component = if idx < self.cfg.preprovisioned {
                    "server"
                } else {
                    // A node discovery has already provisioned is past its boot in
                    // provisioning mode: a real server announces that boot before anything
                    // can provision it, so an announcement now would be a stale one.
                    let waiting = self
                        .nodes
                        .get(idx)
                        .and_then(|n| n.lock().ok().map(|n| n.answers()))
                        .unwrap_or(false);
                    if !waiting {
                        self.counters.events_skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    "provision_mode_server"
                };
                self.event(LifecycleEvent::startup(id, component, &self.cfg.version))
                    .await;
            }
        }
    }
}
