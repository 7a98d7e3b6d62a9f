//! The steps of one node's cycle, in order: identify the node (provisioning JWT, ed25519 key,
//! inventory, CSR), consult the helper (and wait for an operator's approval), enroll (the server
//! JWT, the encrypted key), and configure or upgrade it.

use super::*;

impl Provisioner {
    /// Fetches and checks what the node presents, each part gated by its feature: the
    /// provisioning JWT (`jwt`), the ed25519 key proven over a fresh nonce (`gen25519`), the
    /// inventory, and a CSR (`gencsr`). What an earlier round over the same host fetched is
    /// used again (the CSR excepted).
    pub(super) async fn identify(&self, host: &mut Host) -> Result<(), ProvisionErrorKind> {
        let cfg = &*self.config;
        let identity = host.identity.clone();
        let id: &str = &identity;
        let token = cfg.token();
        let rpc = &self.rpc;

        if cfg.features().jwt {
            if host.raw_jwt.is_empty() {
                info!(identity = id, "Fetching JWT");
                let r = self
                    .call(Action::Jwt, id, &mut host.contact, || rpc.jwt(id, token))
                    .await?;
                host.raw_jwt = r.jwt;
                host.server_ecdh_public = r.ecdh_public;
            } else {
                info!(
                    identity = id,
                    "Already have JWT for {id}, not retrieving again"
                );
            }
            if host.raw_jwt.is_empty() {
                return Err(ProvisionErrorKind::Jwt(PolicyError::NoJwt));
            }
            let key = self.keys.verify_key().map_err(ProvisionErrorKind::Jwt)?;
            let claims = policy::validate_provisioning_jwt_with_key(
                &host.raw_jwt,
                &key,
                self.clock.now_unix(),
            )
            .map_err(ProvisionErrorKind::Jwt)?;
            host.claims = Some(claims);
        }

        if cfg.features().ed25519 && host.ed25519.is_some() {
            info!(
                identity = id,
                "Already have ED25519 public key, not retrieving again"
            );
        } else if cfg.features().ed25519 {
            info!(identity = id, "Fetching ED25519 public key");
            // A fresh nonce for every try: a reply to an earlier try cannot be replayed.
            let (nonce, r) = self
                .call(Action::Gen25519, id, &mut host.contact, || {
                    let nonce = self.nonce();
                    async move {
                        let r = rpc.gen25519(id, token, &nonce).await?;
                        Ok((nonce, r))
                    }
                })
                .await?;
            // Checked with the proofs of the other nodes identified in the same turn.
            self.nonce_checks
                .verify(&nonce, &r.public_key, &r.signature)
                .await
                .map_err(|e| ProvisionErrorKind::Ed25519(PolicyError::Nonce(e.message())))?;
            host.ed25519 = Some(r);
        }

        if host.inventory.is_some() {
            info!(
                identity = id,
                "Already have metadata for {id}, not retrieving again"
            );
        } else {
            info!(identity = id, "Fetching Inventory");
            let inv = self
                .call(Action::Inventory, id, &mut host.contact, || {
                    rpc.inventory(id)
                })
                .await?;
            host.inventory = Some(inv);
        }

        if cfg.features().pki {
            info!(identity = id, "Fetching CSR");
            let csr = self
                .call(Action::Gencsr, id, &mut host.contact, || {
                    rpc.gencsr(id, token, id)
                })
                .await?;
            policy::validate_csr(&csr.csr, id, &cfg.csr_policy())
                .map_err(ProvisionErrorKind::Csr)?;
            host.csr = Some(csr);
        }
        Ok(())
    }

    /// Runs the helper with what was checked. `Continue` with its reply to go on; `Break` when
    /// the cycle ends here (the helper asked for the node to be shut down). A deferral is an
    /// error.
    pub(super) async fn consult_helper(
        &self,
        host: &mut Host,
        keys: &[String],
    ) -> Result<ControlFlow<Outcome, HelperReply>, ProvisionErrorKind> {
        let identity = host.identity.clone();
        let id: &str = &identity;
        self.check_paused("the helper")?;
        let input = HelperInput {
            identity: id.to_string(),
            csr: host.csr.clone(),
            ed25519_pubkey: host.ed25519.clone(),
            inventory: host
                .inventory
                .as_ref()
                .map(|i| i.json.clone())
                .unwrap_or_default(),
            jwt: host.claims.clone(),
            dry_run: self.config.dry_run(),
        };
        let mut pending: Option<String> = None;
        if let Some(admission) = &self.admission {
            let mut shown = input.clone();
            if let Some(claims) = shown.jwt.as_mut() {
                // The policy never sees the provisioning token or the broker password.
                claims.token.clear();
                claims.prov_nats_pass.clear();
            }
            let asked = Instant::now();
            let decision = admission.decide(&shown).await;
            self.observer.admission(id, &decision);
            let (ok, reason) = match &decision {
                Decision::Allow => (true, String::new()),
                Decision::Deny(r) => (false, format!("deny: {}", escaped(r))),
                Decision::Defer(r) => (false, format!("defer: {}", escaped(r))),
                Decision::Pending(r) => (true, format!("pending: {}", escaped(r))),
            };
            self.observer.node_event(
                id,
                &NodeEvent::Step {
                    step: "policy",
                    ok,
                    tries: 1,
                    elapsed: asked.elapsed(),
                    detail: &reason,
                },
            );
            match decision {
                Decision::Allow => {}
                Decision::Deny(reason) => {
                    let reason = escaped(&reason).to_string();
                    warn!(identity = id, "Refused by policy: {reason}");
                    return Err(ProvisionErrorKind::Denied(reason));
                }
                Decision::Defer(reason) => {
                    return Err(ProvisionErrorKind::Deferred(escaped(&reason).to_string()));
                }
                // Without an approval queue a pending node is deferred.
                Decision::Pending(reason) if self.approval.is_none() => {
                    return Err(ProvisionErrorKind::Deferred(escaped(&reason).to_string()));
                }
                Decision::Pending(reason) => pending = Some(escaped(&reason).to_string()),
            }
        }
        if let Some(outcome) = self.await_approval(id, keys, &input, pending).await? {
            return Ok(ControlFlow::Break(outcome));
        }
        if let Some(pacer) = &self.pacer {
            let asked = Instant::now();
            pacer.admit(id).await;
            let waited = asked.elapsed();
            if waited >= Duration::from_millis(1) {
                self.observer.node_event(
                    id,
                    &NodeEvent::Step {
                        step: "rate_limit",
                        ok: true,
                        tries: 1,
                        elapsed: waited,
                        detail: "",
                    },
                );
            }
        }
        let started = Instant::now();
        let reply = self.helper.run(&input).await;
        let took = started.elapsed();
        self.observer.helper_time(took);
        let helper_step = |ok: bool, detail: &str| {
            self.observer.node_event(
                id,
                &NodeEvent::Step {
                    step: "helper",
                    ok,
                    tries: 1,
                    elapsed: took,
                    detail,
                },
            )
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                self.observer.helper_error();
                helper_step(false, &e.to_string());
                return Err(e.into());
            }
        };
        host.helper_msg = escaped(&reply.msg).to_string();
        helper_step(!reply.defer, &host.helper_msg);

        if reply.defer {
            return Err(ProvisionErrorKind::Deferred(
                escaped(&reply.msg).to_string(),
            ));
        }
        if !reply.shutdown {
            return Ok(ControlFlow::Continue(reply));
        }
        if reply.msg.is_empty() {
            warn!(
                identity = id,
                "Shutting down host based on helper output, no reason given"
            );
        } else {
            warn!(
                identity = id,
                "Shutting down host based on helper output: {}",
                escaped(&reply.msg)
            );
        }
        let token = self.config.token();
        let rpc = &self.rpc;
        info!(identity = id, "Shutting down node");
        match self
            .call(Action::Shutdown, id, &mut host.contact, || {
                rpc.shutdown(id, token)
            })
            .await
        {
            Ok(m) => {
                self.observer.helper_shutdown();
                info!(identity = id, "Shutdown response: {}", escaped(&m.message));
            }
            // The Go provisioner only warns when the node refuses to shut down.
            Err(ProvisionErrorKind::Rpc(RpcError {
                kind: RpcErrorKind::Aborted { code, message },
                ..
            })) => warn!(
                identity = id,
                "Could not shutdown {id}: {} ({code})",
                escaped(&message)
            ),
            Err(e) => return Err(e),
        }
        Ok(ControlFlow::Break(Outcome::ShutDown))
    }

    /// With an approval queue: `Some(Pending)` when the node needs an operator's approval
    /// (every node with `approval: manual`, else when the policy said `pending`) and has none
    /// for this identity and these keys: it is recorded as pending and goes no further.
    async fn await_approval(
        &self,
        id: &str,
        keys: &[String],
        input: &HelperInput,
        policy_pending: Option<String>,
    ) -> Result<Option<Outcome>, ProvisionErrorKind> {
        let Some(approval) = &self.approval else {
            return Ok(None);
        };
        let reason = match policy_pending {
            Some(r) => r,
            None if approval.manual() => "approval: manual".to_string(),
            None => return Ok(None),
        };
        let step = |ok: bool, detail: &str| {
            self.observer.node_event(
                id,
                &NodeEvent::Step {
                    step: "approval",
                    ok,
                    tries: 1,
                    elapsed: Duration::ZERO,
                    detail,
                },
            )
        };
        if let Some(by) = approval.approved(id, keys) {
            let detail = format!("approved by {}", escaped(&by));
            info!(identity = id, "{id} was {detail}");
            step(true, &detail);
            return Ok(None);
        }
        let mut shown = input.clone();
        if let Some(claims) = shown.jwt.as_mut() {
            claims.token.clear();
            claims.prov_nats_pass.clear();
        }
        let held = approval
            .hold(PendingNode {
                identity: id,
                keys,
                input: &shown,
                reason: &reason,
            })
            .await;
        match held {
            Ok(()) => {
                step(false, &format!("pending: {reason}"));
                info!(
                    identity = id,
                    "{id} waits for an operator's approval ({reason}): choria-provisioner approve {id}"
                );
                Ok(Some(Outcome::Pending { reason }))
            }
            Err(e) => {
                let e = escaped(&e).to_string();
                step(false, &e);
                Err(ProvisionErrorKind::Approval(e))
            }
        }
    }

    /// Signs the node's server JWT (with `ed25519`, key material asked for now so a rotated key
    /// takes effect) and encrypts the helper's private key for the node's X25519 key.
    pub(super) fn enroll(
        &self,
        host: &Host,
        reply: &HelperReply,
    ) -> Result<Enrolment, ProvisionErrorKind> {
        let cfg = &*self.config;
        let mut enrolment = Enrolment::default();
        if cfg.features().ed25519 {
            self.check_paused("server JWT issuance")?;
            let pk = host
                .ed25519
                .as_ref()
                .map(|e| e.public_key.as_str())
                .unwrap_or_default();
            let signing_key = self
                .keys
                .signing_key()
                .map_err(ProvisionErrorKind::ServerJwt)?;
            let signing_token = self
                .keys
                .signing_token()
                .map_err(ProvisionErrorKind::ServerJwt)?;
            let mut jti_payload = [0u8; 16];
            self.random.fill_bytes(&mut jti_payload);
            let issued = policy::issue_server_jwt(&ServerJwtRequest {
                identity: &host.identity,
                public_key_hex: pk,
                identity_rule: cfg.identity_rule(),
                configuration: reply.configuration.as_ref(),
                server_claims: reply.server_claims.as_ref(),
                signing_key: &signing_key,
                signing_token: &signing_token,
                default_validity: cfg.server_jwt_validity(),
                jti_payload,
                now: self.clock.now_unix(),
            })
            .map_err(ProvisionErrorKind::ServerJwt)?;
            enrolment.issued.server_jwt = Some(ServerJwtId {
                id: issued.claims.standard.id.clone(),
                expires: issued.claims.standard.expires_at,
            });
            enrolment.server_jwt = issued.token;
        }

        if !reply.key.is_empty() {
            // A fresh X25519 key pair and IV for every key sent.
            let mut own_private = [0u8; 32];
            let mut iv = [0u8; 16];
            self.random.fill_bytes(&mut own_private);
            self.random.fill_bytes(&mut iv);
            let enc =
                encrypt_private_key_with(&reply.key, &host.server_ecdh_public, &own_private, &iv)
                    .map_err(|e| ProvisionErrorKind::KeyEncryption(e.into()))?;
            enrolment.key = enc.pem;
            enrolment.ecdh_public = enc.ecdh_public;
        }
        Ok(enrolment)
    }

    /// Upgrades the node when the helper asks for another version (the cycle ends there), then
    /// sends `configure` with everything and `restart`.
    pub(super) async fn configure(
        &self,
        host: &mut Host,
        mut reply: HelperReply,
        enrolment: Enrolment,
    ) -> Result<Outcome, ProvisionErrorKind> {
        let cfg = &*self.config;
        let identity = host.identity.clone();
        let id: &str = &identity;
        let token = cfg.token();
        let rpc = &self.rpc;

        if cfg.features().upgrades && !reply.upgrade.is_empty() {
            match self.upgrade(host, &reply.upgrade).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) => {}
                Err(e @ (ProvisionErrorKind::Paused(_) | ProvisionErrorKind::LockHeld(_))) => {
                    return Err(e)
                }
                Err(e) if cfg.upgrades_optional() => {
                    warn!(
                        identity = id,
                        "Could not upgrade to {}, continuing: {e}",
                        escaped(&reply.upgrade)
                    )
                }
                Err(e) => return Err(e),
            }
        }

        let configuration = reply.configuration.take().unwrap_or_default();
        if configuration.is_empty() {
            return Err(ProvisionErrorKind::EmptyConfiguration);
        }
        if !reply.certificate.is_empty() {
            host.issued.certificate = Some(
                choria_crypto::pem::certificate_summary(&reply.certificate)
                    .map(|c| CertificateId {
                        serial: c.serial,
                        sha256: c.sha256,
                        not_after: c.not_after,
                    })
                    .map_err(|e| e.to_string()),
            );
        }
        let ssldir = match host.csr.as_ref().filter(|c| !c.ssldir.is_empty()) {
            Some(c) => c.ssldir.clone(),
            None => std::mem::take(&mut reply.ssldir),
        };
        let request = ConfigureRequest {
            token: token.to_string(),
            config: helper_protocol::to_go_json_string(&configuration).unwrap_or_default(),
            ca: std::mem::take(&mut reply.ca),
            certificate: std::mem::take(&mut reply.certificate),
            ssldir,
            key: enrolment.key,
            ecdh_public: enrolment.ecdh_public,
            action_policies: reply.action_policies.take().unwrap_or_default(),
            opa_policies: reply.opa_policies.take().unwrap_or_default(),
            server_jwt: enrolment.server_jwt,
        };
        info!(identity = id, "Configuring node");
        let m = self
            .call(Action::Configure, id, &mut host.contact, || {
                rpc.configure(id, &request)
            })
            .await?;
        info!(identity = id, "Configure response: {}", escaped(&m.message));
        info!(identity = id, "Restarting node");
        let m = self
            .call(Action::Restart, id, &mut host.contact, || {
                rpc.restart(id, token, 1)
            })
            .await?;
        info!(identity = id, "Restart response: {}", escaped(&m.message));
        Ok(Outcome::Provisioned)
    }

    /// `Ok(Some(Upgraded))` when an update was applied, `Ok(None)` when the node already runs
    /// the requested version.
    async fn upgrade(
        &self,
        host: &mut Host,
        target: &str,
    ) -> Result<Option<Outcome>, ProvisionErrorKind> {
        let cfg = &*self.config;
        let fail = |reason: &str| ProvisionErrorKind::Upgrade {
            target: target.to_string(),
            reason: reason.to_string(),
        };
        if cfg.upgrades_repository().is_empty() {
            return Err(fail("upgrades_repository is not configured"));
        }
        let inv = host.inventory.as_ref();
        let version = inv.map(|i| i.version.as_str()).unwrap_or_default();
        if version.is_empty() {
            return Err(fail("did not receive a version in inventory"));
        }
        if !inv.is_some_and(|i| i.upgradable) {
            return Err(fail("does not support upgrades"));
        }
        if !versions_differ(version, target).map_err(|e| fail(&e))? {
            return Ok(None);
        }
        warn!(
            identity = %host.identity,
            "Will attempt version update from {} to {}",
            escaped(version),
            escaped(target)
        );
        let identity = host.identity.clone();
        let id: &str = &identity;
        let repo = cfg.upgrades_repository();
        let token = cfg.token();
        let rpc = &self.rpc;
        info!(identity = id, "Updating node to {}", escaped(target));
        self.call(Action::ReleaseUpdate, id, &mut host.contact, || {
            rpc.release_update(id, token, repo, target)
        })
        .await?;
        Ok(Some(Outcome::Upgraded {
            from: version.to_string(),
            to: target.to_string(),
        }))
    }
}

/// Whether `current` and `target` are different RPM versions (so an upgrade is due). A version
/// that rpm would not parse is an error rather than a guess: an upgrade is never sent for it.
fn versions_differ(current: &str, target: &str) -> Result<bool, String> {
    let target: rpm_evr::Version = target
        .parse()
        .map_err(|e| format!("the helper asked for an unparsable version: {e}"))?;
    let current: rpm_evr::Version = current
        .parse()
        .map_err(|e| format!("the node reports an unparsable version: {e}"))?;
    Ok(current != target)
}

#[cfg(test)]
mod version_tests {
    use super::versions_differ;

    #[test]
    fn upgrade_decision_follows_rpm_ordering_and_refuses_unparsable_versions() {
        assert_eq!(versions_differ("0.30.0", "0.30.0"), Ok(false));
        assert_eq!(
            versions_differ("1.0", "1.00"),
            Ok(false),
            "rpm treats 1.0 and 1.00 as equal"
        );
        assert_eq!(versions_differ("0.30.0", "0.31.0"), Ok(true));
        assert_eq!(
            versions_differ("0.31.0", "0.30.0"),
            Ok(true),
            "a downgrade is a difference too"
        );
        assert!(versions_differ("0.30.0", "not a version!")
            .unwrap_err()
            .contains("helper"));
        assert!(versions_differ("1..0", "0.30.0")
            .unwrap_err()
            .contains("node"));
    }
}
