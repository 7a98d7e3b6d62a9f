//! What is wrong with a configuration: every value checked, each problem one
//! [`ConfigError`], and an invalid value replaced by its default so that the rest can be
//! checked too.

use super::*;
use crate::raw::RawConfig;

impl Config {
    /// Every problem, with invalid values replaced by their defaults in the configuration.
    pub(crate) fn validate_all(raw: RawConfig, path: &Path) -> (Config, Vec<ConfigError>) {
        let mut errors = Vec::new();
        let mut lifecycle_component = if raw.lifecycle_component.is_empty() {
            DEFAULT_LIFECYCLE_COMPONENT.to_string()
        } else {
            raw.lifecycle_component.clone()
        };
        if lifecycle_component.contains(['.', '>', '*']) {
            errors.push(ConfigError::LifecycleComponent(std::mem::replace(
                &mut lifecycle_component,
                DEFAULT_LIFECYCLE_COMPONENT.to_string(),
            )));
        }
        let workers = match raw.workers {
            0 => cpus(),
            n => n as usize,
        };
        let threads = match raw.threads {
            None => 1,
            Some(0) => cpus(),
            Some(n) => n as usize,
        };
        let cert_deny_list = if raw.cert_deny_list.is_empty() {
            DEFAULT_CERT_DENY_LIST
                .iter()
                .map(|s| s.to_string())
                .collect()
        } else {
            raw.cert_deny_list.clone()
        };
        let deny_list = DenyList::new(&cert_deny_list).unwrap_or_else(|(pattern, reason)| {
            errors.push(ConfigError::DenyPattern { pattern, reason });
            DenyList::default_list()
        });
        let mut features = Features::NONE
            .with_pki(raw.features.pki)
            .with_jwt(raw.features.jwt)
            .with_ed25519(raw.features.ed25519)
            .with_upgrades(raw.features.upgrades);
        if features.pki && features.ed25519 {
            errors.push(ConfigError::PkiAndEd25519);
            // Checked as far as it goes, with the ed25519 settings (which need more checks).
            features.pki = false;
        }
        if raw.active_active && raw.leader_election {
            errors.push(ConfigError::ActiveActiveAndElection);
        }
        let approval_manual = match raw.approval.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => false,
            "manual" => true,
            _ => {
                errors.push(ConfigError::Approval(raw.approval.clone()));
                false
            }
        };
        if approval_manual && !raw.fleet_control {
            errors.push(ConfigError::ApprovalNeedsFleetControl);
        }
        let timings = Timings::of(&raw, &mut errors);
        let identity_rule =
            IdentityRule::with_pattern(&raw.identity_pattern).unwrap_or_else(|reason| {
                errors.push(ConfigError::IdentityPattern {
                    pattern: raw.identity_pattern.clone(),
                    reason,
                });
                IdentityRule::builtin()
            });
        let extra_dns = ExtraDnsNames::new(&raw.csr_extra_dns_names).unwrap_or_else(|reason| {
            errors.push(ConfigError::CsrNamePattern {
                pattern: raw.csr_extra_dns_names.clone(),
                reason,
            });
            None
        });
        let monitor = MonitorSettings::of(&raw, &mut errors);
        let (audit_stream, audit_stream_limits) = audit_stream_settings(&raw, &mut errors);
        let webhook = webhook_settings(&raw, &mut errors);
        let work_queue_size = match raw.work_queue_size {
            0 => DEFAULT_WORK_QUEUE_SIZE,
            n => n as usize,
        };
        let node_history_size = match raw.node_history_size {
            0 => DEFAULT_NODE_HISTORY_SIZE,
            n => n as usize,
        };
        let provision = ProvisionConfig::builder()
            .token(raw.token)
            .features(features)
            .interval(timings.interval)
            .identity_rule(identity_rule)
            .deny_list(deny_list)
            .extra_dns_names(extra_dns)
            .server_jwt_validity(timings.server_jwt_validity)
            .upgrades(raw.upgrades_repository, raw.upgrades_optional)
            .dry_run(raw.dry_run)
            .build()
            // The combinations the builder refuses were refused above, their values replaced.
            .unwrap_or_default();
        let config = Config {
            provision,
            workers,
            threads,
            work_queue_size,
            logfile: raw.logfile,
            loglevel: raw.loglevel,
            helper: raw.helper,
            lifecycle_component,
            choria_insecure: raw.choria_insecure,
            site: raw.site,
            monitor_port: raw.monitor_port,
            broker_provisioning_password: raw.broker_provisioning_password,
            jwt_verify_cert: raw.jwt_verify_cert,
            jwt_signing_key: raw.jwt_signing_key,
            jwt_signing_token: raw.jwt_signing_token,
            leader_election: raw.leader_election,
            leader_election_wait: raw.leader_election_wait,
            fleet_control: raw.fleet_control,
            max_per_minute: raw.max_per_minute,
            approval_manual,
            approval_expiry: timings.approval_expiry,
            active_active: raw.active_active,
            claim_lifetime: timings.claim_lifetime,
            claims_secret_file: raw.claims_secret_file.trim().to_string(),
            monitor_address: monitor.address,
            rego_policy: raw.rego_policy.trim().to_string(),
            record_helper_inputs: raw.record_helper_inputs.trim().to_string(),
            webhook,
            node_history_size,
            node_history_max_age: timings.node_history_max_age,
            monitor_token_file: raw.monitor_token_file.trim().to_string(),
            monitor_tls_cert: monitor.tls_cert,
            monitor_tls_key: monitor.tls_key,
            monitor_hostnames: monitor.hostnames,
            audit_file: raw.audit_file.trim().to_string(),
            audit_stream,
            audit_stream_limits,
            file: path.to_path_buf(),
        };
        (config, errors)
    }
}

/// A duration setting: `default` when empty, else read as go-choria reads durations and
/// accepted by `check`; a value that does not read, or that `check` refuses, is an error and
/// leaves the default.
fn duration_setting(
    errors: &mut Vec<ConfigError>,
    key: &'static str,
    text: &str,
    default: Duration,
    check: impl FnOnce(Duration) -> Result<(), ConfigError>,
) -> Duration {
    if text.trim().is_empty() {
        return default;
    }
    match parse_duration(text.trim()) {
        Ok(d) => match check(d) {
            Ok(()) => d,
            Err(e) => {
                errors.push(e);
                default
            }
        },
        Err(reason) => {
            errors.push(ConfigError::Duration {
                key,
                value: text.to_string(),
                reason,
            });
            default
        }
    }
}

/// The duration settings, each checked and defaulted.
struct Timings {
    interval: Duration,
    server_jwt_validity: Duration,
    approval_expiry: Duration,
    claim_lifetime: Duration,
    node_history_max_age: Duration,
}

impl Timings {
    fn of(raw: &RawConfig, errors: &mut Vec<ConfigError>) -> Self {
        let interval_text = raw.interval.clone().unwrap_or_else(|| "1m".to_string());
        // An empty interval reads as zero, which is too small (said after the others, as
        // check lists it).
        let interval = parse_duration(&interval_text).unwrap_or_else(|reason| {
            errors.push(ConfigError::Duration {
                key: "interval",
                value: interval_text.clone(),
                reason,
            });
            MIN_INTERVAL
        });
        let server_jwt_validity = duration_setting(
            errors,
            "server_jwt_validity",
            &raw.server_jwt_validity,
            DEFAULT_SERVER_JWT_VALIDITY,
            |_| Ok(()),
        );
        let approval_expiry = duration_setting(
            errors,
            "approval_expiry",
            &raw.approval_expiry,
            DEFAULT_APPROVAL_EXPIRY,
            |d| {
                if d.is_zero() {
                    Err(ConfigError::ApprovalExpiry(raw.approval_expiry.clone()))
                } else {
                    Ok(())
                }
            },
        );
        let claim_lifetime = duration_setting(
            errors,
            "claim_lifetime",
            &raw.claim_lifetime,
            DEFAULT_CLAIM_LIFETIME,
            |d| {
                if (MIN_CLAIM_LIFETIME..=MAX_CLAIM_LIFETIME).contains(&d) {
                    Ok(())
                } else {
                    Err(ConfigError::ClaimLifetime(raw.claim_lifetime.clone()))
                }
            },
        );
        let interval = if interval < MIN_INTERVAL {
            errors.push(ConfigError::IntervalTooSmall(interval_text));
            MIN_INTERVAL
        } else {
            interval
        };
        let node_history_max_age = duration_setting(
            errors,
            "node_history_max_age",
            &raw.node_history_max_age,
            DEFAULT_NODE_HISTORY_MAX_AGE,
            |_| Ok(()),
        );
        Timings {
            interval,
            server_jwt_validity,
            approval_expiry,
            claim_lifetime,
            node_history_max_age,
        }
    }
}

/// The monitor listener's address, TLS files and host names, checked.
struct MonitorSettings {
    address: String,
    tls_cert: String,
    tls_key: String,
    hostnames: Vec<String>,
}

impl MonitorSettings {
    fn of(raw: &RawConfig, errors: &mut Vec<ConfigError>) -> Self {
        let address = raw.monitor_address.trim().to_string();
        if !address.is_empty() && address.parse::<std::net::IpAddr>().is_err() {
            errors.push(ConfigError::MonitorAddress(address.clone()));
        }
        let tls_cert = raw.monitor_tls_cert.trim().to_string();
        let tls_key = raw.monitor_tls_key.trim().to_string();
        if tls_cert.is_empty() != tls_key.is_empty() {
            errors.push(ConfigError::MonitorTls);
        }
        let hostnames: Vec<String> = raw
            .monitor_hostnames
            .iter()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect();
        if let Some(bad) = hostnames.iter().find(|h| {
            h.len() > 253
                || !h
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        }) {
            errors.push(ConfigError::MonitorHostname(bad.clone()));
        }
        MonitorSettings {
            address,
            tls_cert,
            tls_key,
            hostnames,
        }
    }
}

/// `audit_stream` and the limits of a stream the provisioner creates, checked.
fn audit_stream_settings(raw: &RawConfig, errors: &mut Vec<ConfigError>) -> (String, StreamLimits) {
    let defaults = StreamLimits::default();
    let limits = StreamLimits {
        max_age: duration_setting(
            errors,
            "audit_stream_max_age",
            &raw.audit_stream_max_age,
            defaults.max_age,
            |d| {
                if d.is_zero() {
                    Err(ConfigError::AuditStreamLimit("audit_stream_max_age"))
                } else {
                    Ok(())
                }
            },
        ),
        max_bytes: match raw.audit_stream_max_bytes {
            0 => defaults.max_bytes,
            n => n,
        },
    };
    let stream = raw.audit_stream.trim().to_string();
    if stream
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || ".*>/\\".contains(c))
        || stream.len() > 255
    {
        errors.push(ConfigError::AuditStream(stream.clone()));
    }
    (stream, limits)
}

/// The webhook's settings with `helper_reply_signature`, checked against the secret.
fn webhook_settings(raw: &RawConfig, errors: &mut Vec<ConfigError>) -> WebhookSettings {
    let mut webhook = raw.webhook.clone();
    webhook.reply_signature =
        raw.helper_reply_signature
            .parse()
            .unwrap_or_else(|e: ReplySignatureParseError| {
                errors.push(ConfigError::HelperReplySignature(e.0));
                Default::default()
            });
    // Only a webhook is asked for replies over the network; with a command the setting has no
    // effect, which `check` warns about.
    if webhook.reply_signature == ReplySignature::Required
        && webhook.secret_file.is_empty()
        && is_webhook(&raw.helper)
    {
        errors.push(ConfigError::ReplySignatureWithoutSecret);
        webhook.reply_signature = Default::default();
    }
    webhook
}
