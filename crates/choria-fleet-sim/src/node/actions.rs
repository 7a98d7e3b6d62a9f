//! The behaviour of each `choria_provision` action (`jwt`, `gen25519`, `gencsr`, `configure`,
//! `restart`, `shutdown`, `release_update`, `reprovision`), the restart that follows
//! `configure` and the return to provisioning mode that follows `reprovision`: what the node
//! checks, what it keeps, the reply body and the effects it asks the fleet for.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::args::{config_bool, json_type, GoKind};
use super::{
    abort, ok, Effect, Enrollment, IssuerCheck, Node, NodeEnv, NodeOutcome, Phase, Received,
    MAX_ENROLLMENTS,
};
use crate::config::{is_affected, FaultKind, Mode};
use crate::crypto;

impl Node {
    pub(super) fn act_jwt(&mut self, env: &NodeEnv<'_>, data: &Value) -> Vec<u8> {
        if let Err(r) = Self::args(env, "jwt", data, "JWTRequest", &[("token", GoKind::Str)]) {
            return r;
        }
        let (private, public) = env.keys.map_or_else(crypto::x25519_pair, |k| k.ecdh);
        self.ecdh_private = Some(private);
        ok(
            "jwt",
            json!({"jwt": env.jwt, "ecdh_public": hex::encode(public)}),
        )
    }

    pub(super) fn act_gen25519(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        identity: &str,
    ) -> Vec<u8> {
        let args = match Self::args(
            env,
            "gen25519",
            data,
            "ED25519Request",
            &[("token", GoKind::Str), ("nonce", GoKind::Str)],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let signed: Vec<u8> = if is_affected(FaultKind::BadNonce, identity, env.faults.bad_nonce) {
            format!("not-{}", args.str(1)).into_bytes()
        } else {
            args.str(1).as_bytes().to_vec()
        };
        let (public, (public_hex, signature)) = match env.keys.and_then(|k| k.ed25519.as_ref()) {
            // The pool's key signs its first nonce with the commitment made with it.
            Some(k) => (k.key().verifying_key().to_bytes(), k.sign_nonce(&signed)),
            None => {
                // The thread's CSPRNG (seeded from the OS) rather than a system call per key.
                let key = ed25519_dalek::SigningKey::generate(&mut rand::thread_rng());
                (
                    key.verifying_key().to_bytes(),
                    choria_crypto::nonce::sign_nonce(&key, &signed),
                )
            }
        };
        self.ed25519_public = Some(public);
        ok(
            "gen25519",
            json!({
                "public_key": public_hex,
                "directory": env.config_dir,
                "signature": signature,
            }),
        )
    }

    pub(super) fn act_gencsr(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        identity: &str,
    ) -> Vec<u8> {
        let args = match Self::args(
            env,
            "gencsr",
            data,
            "CSRRequest",
            &[
                ("token", GoKind::Str),
                ("cn", GoKind::Str),
                ("C", GoKind::Str),
                ("L", GoKind::Str),
                ("O", GoKind::Str),
                ("OU", GoKind::Str),
                ("ST", GoKind::Str),
            ],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let Some(key) = env.rsa_key else {
            return abort("gencsr", "Could not create private key: no key available");
        };
        let mut cn = if args.str(1).is_empty() {
            identity.to_string()
        } else {
            args.str(1).to_string()
        };
        if is_affected(FaultKind::BadCsr, identity, env.faults.bad_csr) {
            cn = format!("bogus-{cn}");
        }
        let mut dns_names = Vec::new();
        if is_affected(FaultKind::DeniedSan, identity, env.faults.denied_san) {
            let label = identity.split('.').next().unwrap_or(identity);
            dns_names.push(format!("{label}.privileged.choria"));
        }
        match key.csr(
            &cn,
            args.str(2),
            args.str(3),
            args.str(4),
            args.str(5),
            &dns_names,
        ) {
            Ok(csr) => {
                let csr = if is_affected(
                    FaultKind::BadCsrSignature,
                    identity,
                    env.faults.bad_csr_signature,
                ) {
                    choria_crypto::pem::break_signature(&csr).unwrap_or(csr)
                } else {
                    csr
                };
                self.csr_cn = Some(cn.into_boxed_str());
                ok(
                    "gencsr",
                    json!({
                        "csr": csr,
                        "public_key": key.public_pem,
                        "ssldir": format!("{}/ssl", env.config_dir),
                    }),
                )
            }
            Err(e) => abort("gencsr", &format!("Could not create CSR bytes: {e}")),
        }
    }

    pub(super) fn act_configure(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        out: &mut NodeOutcome,
    ) -> Vec<u8> {
        const A: &str = "configure";
        let args = match Self::args(
            env,
            A,
            data,
            "ConfigureRequest",
            &[
                ("token", GoKind::Str),
                ("config", GoKind::Str),
                ("key", GoKind::Str),
                ("certificate", GoKind::Str),
                ("ca", GoKind::Str),
                ("ssldir", GoKind::Str),
                ("ecdh_public", GoKind::Str),
                ("server_jwt", GoKind::Str),
                ("action_policies", GoKind::StrMap),
                ("opa_policies", GoKind::StrMap),
            ],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let (config, key, cert, ca, ssldir, ecdh, server_jwt) = (
            args.str(1),
            args.str(2),
            args.str(3),
            args.str(4),
            args.str(5),
            args.str(6),
            args.str(7),
        );
        if config.is_empty() {
            return abort(
                A,
                "Did not receive any configuration to write, cannot write a empty configuration file",
            );
        }
        if !key.is_empty() && ecdh.is_empty() {
            return abort(
                A,
                "EDCH Public Key not supplied while providing a private key",
            );
        }
        // Go decodes the settings into a map[string]string: null is the empty string, and
        // anything else is refused in Go's words (`config_refusal`).
        // Read with the wire's decoder; what it refuses is read again by serde_json, whose
        // verdict and words decide.
        let read = sonic_rs::from_str::<BTreeMap<String, Option<String>>>(config)
            .or_else(|_| serde_json::from_str::<BTreeMap<String, Option<String>>>(config));
        let settings: BTreeMap<String, String> = match read {
            Ok(m) => m
                .into_iter()
                .map(|(k, v)| (k, v.unwrap_or_default()))
                .collect(),
            Err(e) => return abort(A, &config_refusal(config, &e)),
        };
        let mut received = Received {
            configuration: settings,
            ..Received::default()
        };
        if !cert.is_empty() && !ssldir.is_empty() && !ca.is_empty() {
            received.certificate = cert.to_string();
            received.ca = ca.to_string();
            received.ssldir = ssldir.to_string();
            if !key.is_empty() {
                let Some(private) = self.ecdh_private else {
                    return abort(
                        A,
                        "TLS Setup Failed: could not decrypt private key: private key not set",
                    );
                };
                match crypto::decrypt_delivered_key(key, &private, ecdh) {
                    Ok(pem_text) => {
                        received.key_received = true;
                        received.certificate_matches_key = Some(cert_matches_key(cert, &pem_text));
                    }
                    Err(e) => {
                        return abort(
                            A,
                            &format!("TLS Setup Failed: could not decrypt private key: {e}"),
                        )
                    }
                }
            } else if let Some(k) = env.rsa_key.filter(|_| self.csr_cn.is_some()) {
                received.certificate_matches_key =
                    Some(cert_spki(cert).as_deref() == Some(&k.spki_der[..]));
            }
        }
        if !server_jwt.is_empty() {
            received.server_jwt = server_jwt.to_string();
            match env.issuer.filter(IssuerCheck::due) {
                Some(check) => match crypto::verify_server_jwt(server_jwt, check.key, env.unix_now)
                {
                    Ok((claims, trust)) => {
                        received.server_jwt_claims = Some(claims);
                        received.server_jwt_trust = Some(trust);
                    }
                    Err(e) => {
                        return abort(
                            A,
                            &format!("JWT Setup Failed: server JWT does not verify: {e}"),
                        )
                    }
                },
                None => received.server_jwt_claims = crypto::jwt_claims_unverified(server_jwt).ok(),
            }
        }
        let ap = args.map(8);
        let op = args.map(9);
        if let Some(k) = ap.keys().find(|k| !k.ends_with(".policy")) {
            return abort(
                A,
                &format!(
                    "Could not save Action Policies: expected {k:?} to have .policy extension"
                ),
            );
        }
        if let Some(k) = op.keys().find(|k| !k.ends_with(".rego")) {
            return abort(
                A,
                &format!("Could not save Open Policy Agent Policies: expected {k:?} to have .rego extension"),
            );
        }
        received.action_policies = ap;
        received.opa_policies = op;
        // go-choria counts every setting written plus the comment line.
        let written = received.configuration.len() + 1;
        self.received = Some(Box::new(received));
        out.effects.push(Effect::Event {
            kind: "provisioned",
            component: "provision_mode_server",
            new_version: None,
        });
        ok(
            A,
            json!({"message": format!("Wrote {written} lines to {}", env.config_file)}),
        )
    }

    pub(super) fn act_restart(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        out: &mut NodeOutcome,
    ) -> Vec<u8> {
        const A: &str = "restart";
        let args = match Self::args(
            env,
            A,
            data,
            "RestartRequest",
            &[("token", GoKind::Str), ("splay", GoKind::Int)],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let online = self.phase == Phase::Provisioned;
        let provision_on = match &self.received {
            Some(received) => received
                .configuration
                .get("plugin.choria.server.provision")
                .is_some_and(|v| config_bool(v)),
            // A node started provisioned has a working configuration it never received.
            None if online => false,
            None => {
                return abort(
                    A,
                    &format!(
                        "Configuration {f} could not be parsed, restart cannot continue: open {f}: no such file or directory",
                        f = env.config_file
                    ),
                )
            }
        };
        if provision_on {
            return abort(
                A,
                &format!(
                    "Configuration {} enables provisioning, restart cannot continue",
                    env.config_file
                ),
            );
        }
        let splay = match args.int(1) {
            0 => 10,
            n => n,
        };
        if splay < 0 {
            // go-choria's rand.N panics here and the server dies without replying.
            self.phase = Phase::ShutDown;
            self.problems.push(format!(
                "restart with negative splay {splay} crashed the server"
            ));
            return Vec::new();
        }
        let secs = rand::Rng::gen_range(&mut rand::thread_rng(), 0..splay) + 2;
        if !self.restart_pending {
            self.restart_pending = true;
            out.effects.push(Effect::Event {
                kind: "shutdown",
                component: if online {
                    "server"
                } else {
                    "provision_mode_server"
                },
                new_version: None,
            });
            out.effects.push(Effect::Restart);
        }
        ok(
            A,
            json!({"message": format!("Restarting Choria Server after {secs}s")}),
        )
    }

    pub(super) fn act_shutdown(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        out: &mut NodeOutcome,
    ) -> Vec<u8> {
        if let Err(r) = Self::args(
            env,
            "shutdown",
            data,
            "ShutdownRequest",
            &[("token", GoKind::Str)],
        ) {
            return r;
        }
        let secs = rand::Rng::gen_range(&mut rand::thread_rng(), 0..10);
        out.effects.push(Effect::Shutdown);
        ok(
            "shutdown",
            json!({"message": format!("Shutting Choria Server down after {secs}s")}),
        )
    }

    pub(super) fn act_release_update(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        out: &mut NodeOutcome,
    ) -> Vec<u8> {
        const A: &str = "release_update";
        if !env.upgradable {
            return abort(A, "Version updates is not enabled in the configuration");
        }
        let args = match Self::args(
            env,
            A,
            data,
            "ReleaseUpdateRequest",
            &[
                ("token", GoKind::Str),
                ("repository", GoKind::Str),
                ("version", GoKind::Str),
            ],
        ) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let (repo, version) = (args.str(1), args.str(2));
        if !(repo.starts_with("http://") || repo.starts_with("https://")) || version.is_empty() {
            return abort(
                A,
                &format!(
                    "Update to version {version} failed, release rolled back: invalid repository {repo:?} or version"
                ),
            );
        }
        self.version = Some(version.into());
        out.effects.push(Effect::Event {
            kind: "upgraded",
            component: "provision_mode_server",
            new_version: Some(version.to_string()),
        });
        if !self.restart_pending {
            self.restart_pending = true;
            out.effects.push(Effect::Event {
                kind: "shutdown",
                component: "provision_mode_server",
                new_version: None,
            });
            out.effects.push(Effect::Restart);
        }
        ok(A, json!({"message": "Restarting Choria Server after 2s"}))
    }

    /// `reprovision` on a provisioned server (go-choria's `reprovisionAction`): token check,
    /// then the configuration file is replaced by one enabling provisioning and the server
    /// restarts after the delay announced in the reply.
    pub(super) fn act_reprovision(
        &mut self,
        env: &NodeEnv<'_>,
        data: &Value,
        out: &mut NodeOutcome,
    ) -> Vec<u8> {
        const A: &str = "reprovision";
        if let Err(r) = Self::args(
            env,
            A,
            data,
            "ReprovisionRequest",
            &[("token", GoKind::Str)],
        ) {
            return r;
        }
        // go-choria: rand.N(10)+2 whole seconds.
        let after = env.reprovision_delay.unwrap_or_else(|| {
            Duration::from_secs(rand::Rng::gen_range(&mut rand::thread_rng(), 2..12))
        });
        if !self.restart_pending {
            self.restart_pending = true;
            out.effects.push(Effect::Event {
                kind: "shutdown",
                component: "server",
                new_version: None,
            });
            out.effects.push(Effect::Reprovision { after });
        }
        ok(
            A,
            json!({"message": format!("Restarting after {}", go_duration(after))}),
        )
    }

    /// Complete a `reprovision`: the server restarts into provisioning mode with the
    /// configuration go-choria wrote (`plugin.choria.server.provision=1`, `loglevel=debug`),
    /// leaves its main collective and forgets its keys, so the next `gen25519` or `gencsr`
    /// makes a new one (CSRs come from the next key of the RSA pool).
    pub fn finish_reprovision(&mut self, unix_now: i64) {
        self.restart_pending = false;
        self.restarts = self.restarts.saturating_add(1);
        self.started = unix_now;
        self.reprovisions = self.reprovisions.saturating_add(1);
        self.lock = None;
        self.ecdh_private = None;
        self.ed25519_public = None;
        self.csr_cn = None;
        self.online = None;
        self.drop_once_seen = 0;
        let configuration = BTreeMap::from([
            ("loglevel".to_string(), "debug".to_string()),
            (
                "plugin.choria.server.provision".to_string(),
                "1".to_string(),
            ),
        ]);
        self.received = Some(Box::new(Received {
            configuration,
            ..Received::default()
        }));
        self.phase = Phase::Provisioning;
    }

    /// Complete a restart: the server comes back with the configuration it was given. Returns
    /// the component of its startup event (`None`: it does not come up). A node restarted
    /// out of provisioning mode with a usable configuration counts one more enrollment.
    pub fn finish_restart(&mut self, env: &NodeEnv<'_>, identity: &str) -> Option<&'static str> {
        let before = self.phase;
        let component = self.restart_into(env, identity);
        if self.phase != Phase::Provisioned {
            self.online = None;
        } else if before != Phase::Provisioned {
            self.provisions = self.provisions.saturating_add(1);
            if let Some(r) = self.received.as_deref() {
                let e = Enrollment::of(r, env.unix_now);
                if self.enrollments.len() >= MAX_ENROLLMENTS {
                    self.enrollments.remove(0);
                }
                self.enrollments.push(e);
            }
        }
        component
    }

    fn restart_into(&mut self, env: &NodeEnv<'_>, identity: &str) -> Option<&'static str> {
        self.restart_pending = false;
        self.restarts = self.restarts.saturating_add(1);
        self.started = env.unix_now;
        self.lock = None;
        self.ecdh_private = None;
        if self.phase == Phase::Provisioned && self.received.is_none() {
            // Started provisioned: it comes back as it was.
            return Some("server");
        }
        let Some(received) = &self.received else {
            // A restart from release_update before any configure: still provisioning.
            self.phase = Phase::Provisioning;
            return Some("provision_mode_server");
        };
        let cfg = &received.configuration;
        let provision_off = cfg
            .get("plugin.choria.server.provision")
            .is_some_and(|v| !config_bool(v));
        if !provision_off {
            self.problems.push(
                "configuration does not set plugin.choria.server.provision=false: provisioning again"
                    .into(),
            );
            self.phase = Phase::Provisioning;
            return Some("provision_mode_server");
        }
        let choria_provider =
            cfg.get("plugin.security.provider").map(String::as_str) == Some("choria");
        if env.mode == Mode::Ed25519 || choria_provider {
            if let Err(e) = self.check_server_jwt(identity) {
                self.problems
                    .push(format!("{e}: token and seed removed, provisioning again"));
                self.phase = Phase::Provisioning;
                return Some("provision_mode_server");
            }
        }
        if env.mode == Mode::Pki {
            if let Err(e) = self.check_pki() {
                self.problems.push(e);
                self.phase = Phase::Broken;
                return None;
            }
        }
        if env.stay_online {
            if let Err(e) = check_collectives(&self.received) {
                self.problems.push(e);
                self.phase = Phase::Broken;
                return None;
            }
        }
        self.phase = Phase::Provisioned;
        Some("server")
    }

    fn check_server_jwt(&self, identity: &str) -> Result<(), String> {
        let r = self.received.as_deref().ok_or("no configuration")?;
        if r.server_jwt.is_empty() {
            return Err("no server JWT received".into());
        }
        let claims = r
            .server_jwt_claims
            .as_ref()
            .ok_or("server JWT cannot be decoded")?;
        let id = claims
            .get("identity")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        if id != identity {
            return Err(format!("server JWT identity {id:?} is not {identity:?}"));
        }
        let pk = claims
            .get("public_key")
            .and_then(|v| v.as_str())
            .unwrap_or("");
        match self.ed25519_public {
            Some(k) if hex::encode(k) == pk => Ok(()),
            _ => Err("server JWT public_key does not match server.seed".into()),
        }
    }

    fn check_pki(&self) -> Result<(), String> {
        let r = self.received.as_deref().ok_or("no configuration")?;
        if r.certificate.is_empty() || r.ca.is_empty() || r.ssldir.is_empty() {
            return Err("no certificate, ca and ssldir received".into());
        }
        match r.certificate_matches_key {
            Some(true) => Ok(()),
            Some(false) => Err("certificate does not match the private key".into()),
            None => Err("no private key for the certificate (no CSR made, no key sent)".into()),
        }
    }
}

/// Whether the collectives of the configuration received can be joined: at most
/// [`crate::config::MAX_COLLECTIVES`], each a valid name.
fn check_collectives(received: &Option<Box<Received>>) -> Result<(), String> {
    let Some(r) = received else { return Ok(()) };
    let all = crate::config::collectives_of(&r.configuration);
    if all.len() > crate::config::MAX_COLLECTIVES {
        return Err(format!(
            "{} collectives in the configuration, at most {}",
            all.len(),
            crate::config::MAX_COLLECTIVES
        ));
    }
    match all.iter().find(|c| !crate::config::valid_collective(c)) {
        Some(bad) => Err(format!(
            "invalid collective {:?} in the configuration",
            bad.chars().take(80).collect::<String>()
        )),
        None => Ok(()),
    }
}

fn cert_spki(cert_pem: &str) -> Option<Vec<u8>> {
    use der::Encode as _;
    let cert = choria_crypto::pem::certificate(cert_pem).ok()?;
    cert.tbs_certificate.subject_public_key_info.to_der().ok()
}

fn cert_matches_key(cert_pem: &str, key_pem: &str) -> bool {
    use rsa::pkcs1::DecodeRsaPrivateKey as _;
    use rsa::pkcs8::EncodePublicKey as _;
    let Ok(key) = rsa::RsaPrivateKey::from_pkcs1_pem(key_pem) else {
        return false;
    };
    let Ok(spki) = key.to_public_key().to_public_key_der() else {
        return false;
    };
    cert_spki(cert_pem).as_deref() == Some(spki.as_bytes())
}

/// A duration as Go's `time.Duration.String` writes it (`7s`, `500ms`, `1m30s`, `0s`).
pub(crate) fn go_duration(d: Duration) -> String {
    fn trim(v: f64) -> String {
        let t = format!("{v:.9}");
        let t = t.trim_end_matches('0').trim_end_matches('.');
        t.to_string()
    }
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        return format!("{}ms", trim(d.as_secs_f64() * 1000.0));
    }
    let secs = d.as_secs();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let frac = f64::from(d.subsec_nanos()) / 1e9;
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        out.push_str(&format!("{m}m"));
    }
    out.push_str(&trim(s as f64 + frac));
    out.push('s');
    out
}

/// Why Go refuses `config` as a map[string]string, in its words, for a configuration that was
/// not read as one (`direct` is the reason that read gave).
fn config_refusal(config: &str, direct: &serde_json::Error) -> String {
    const WHY: &str = "Could not decode configuration data";
    match serde_json::from_str::<Value>(config) {
        Err(e) => format!("{WHY}: {e}"),
        Ok(Value::Object(m)) => match m
            .values()
            .find(|v| !matches!(v, Value::String(_) | Value::Null))
        {
            Some(other) => format!(
                "{WHY}: json: cannot unmarshal {} into Go value of type string",
                json_type(other)
            ),
            None => format!("{WHY}: {direct}"),
        },
        Ok(other) => format!(
            "{WHY}: json: cannot unmarshal {} into Go value of type map[string]string",
            json_type(&other)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::{config_refusal, go_duration};
    use std::collections::BTreeMap;
    use std::time::Duration;

    /// Every configuration the direct read refuses gets Go's words for why.
    #[test]
    fn a_configuration_that_is_not_a_string_map_is_refused_in_go_s_words() {
        let refuse = |config: &str| {
            let Err(e) = serde_json::from_str::<BTreeMap<String, Option<String>>>(config) else {
                panic!("{config} was read as a map of strings");
            };
            config_refusal(config, &e)
        };
        assert_eq!(
            refuse(r#"{"a":"x","b":1}"#),
            "Could not decode configuration data: json: cannot unmarshal number into Go value of type string"
        );
        assert_eq!(
            refuse(r#"["a"]"#),
            "Could not decode configuration data: json: cannot unmarshal array into Go value of type map[string]string"
        );
        let syntax = refuse("{\"a\":");
        assert!(
            syntax.starts_with("Could not decode configuration data: EOF while parsing"),
            "{syntax}"
        );
        // Null is read directly (as no value, which becomes the empty string, as Go has it).
        let m: BTreeMap<String, Option<String>> =
            serde_json::from_str(r#"{"a":null,"b":"x"}"#).unwrap_or_default();
        assert_eq!(m.len(), 2);
        assert_eq!((m["a"].as_deref(), m["b"].as_deref()), (None, Some("x")));
    }

    #[test]
    fn durations_print_as_go_prints_them() {
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_secs(7)), "7s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(3600)), "1h0m0s");
    }
}
