//! The file as the Go provisioner reads it: every key it knows, each with the kind Go's
//! decoder gives it, read from the Go-YAML value tree into [`RawConfig`] before any check.

use super::*;
use crate::goyaml::{Field, Kind};

#[derive(Default)]
pub(super) struct RawFeatures {
    pub(super) pki: bool,
    pub(super) jwt: bool,
    pub(super) ed25519: bool,
    pub(super) upgrades: bool,
}

/// The settings as the file gives them (defaults where it does not).
#[derive(Default)]
pub(super) struct RawConfig {
    pub(super) workers: u32,
    pub(super) threads: Option<u32>,
    pub(super) work_queue_size: u32,
    pub(super) interval: Option<String>,
    pub(super) logfile: String,
    pub(super) loglevel: String,
    pub(super) helper: String,
    pub(super) token: String,
    pub(super) lifecycle_component: String,
    pub(super) choria_insecure: bool,
    pub(super) site: String,
    pub(super) monitor_port: u16,
    pub(super) broker_port: u16,
    pub(super) broker_provisioning_password: String,
    pub(super) cert_deny_list: Vec<String>,
    pub(super) jwt_verify_cert: String,
    pub(super) jwt_signing_key: String,
    pub(super) jwt_signing_token: String,
    pub(super) server_jwt_validity: String,
    pub(super) rego_policy: String,
    pub(super) leader_election: bool,
    pub(super) leader_election_wait: bool,
    pub(super) dry_run: bool,
    pub(super) fleet_control: bool,
    pub(super) max_per_minute: u32,
    pub(super) approval: String,
    pub(super) approval_expiry: String,
    pub(super) active_active: bool,
    pub(super) claim_lifetime: String,
    pub(super) claims_secret_file: String,
    pub(super) upgrades_repository: String,
    pub(super) upgrades_optional: bool,
    pub(super) features: RawFeatures,
    pub(super) identity_pattern: String,
    pub(super) csr_extra_dns_names: String,
    pub(super) monitor_address: String,
    pub(super) record_helper_inputs: String,
    pub(super) webhook: WebhookSettings,
    pub(super) helper_reply_signature: String,
    pub(super) node_history_size: u32,
    pub(super) node_history_max_age: String,
    pub(super) monitor_token_file: String,
    pub(super) monitor_tls_cert: String,
    pub(super) monitor_tls_key: String,
    pub(super) monitor_hostnames: Vec<String>,
    pub(super) audit_file: String,
    pub(super) audit_stream: String,
    pub(super) audit_stream_max_age: String,
    pub(super) audit_stream_max_bytes: u64,
}

pub(super) const fn field(name: &'static str, kind: Kind) -> Field {
    Field { name, kind }
}

/// The `features` keys.
pub(super) const FEATURE_FIELDS: [Field; 4] = [
    field("pki", Kind::Bool),
    field("jwt", Kind::Bool),
    field("ed25519", Kind::Bool),
    field("upgrades", Kind::Bool),
];

/// Every key: the Go provisioner's (its `json` tags) and ours (`identity_pattern`,
/// `csr_extra_dns_names`, `monitor_address`, `work_queue_size`).
pub(super) const FIELDS: [Field; 52] = [
    field(
        "workers",
        Kind::Int {
            max: u32::MAX as u64,
        },
    ),
    field("threads", Kind::Int { max: MAX_THREADS }),
    field(
        "work_queue_size",
        Kind::Int {
            max: u32::MAX as u64,
        },
    ),
    field("interval", Kind::Str),
    field("logfile", Kind::Str),
    field("loglevel", Kind::Str),
    field("helper", Kind::Str),
    field("token", Kind::Str),
    field("lifecycle_component", Kind::Str),
    field("choria_insecure", Kind::Bool),
    field("site", Kind::Str),
    field(
        "monitor_port",
        Kind::Int {
            max: u16::MAX as u64,
        },
    ),
    field(
        "broker_port",
        Kind::Int {
            max: u16::MAX as u64,
        },
    ),
    field("broker_provisioning_password", Kind::Str),
    field("cert_deny_list", Kind::StrList),
    field("jwt_verify_cert", Kind::Str),
    field("jwt_signing_key", Kind::Str),
    field("jwt_signing_token", Kind::Str),
    field("server_jwt_validity", Kind::Str),
    field("rego_policy", Kind::Str),
    field("leader_election", Kind::Bool),
    field("leader_election_wait", Kind::Bool),
    field("dry_run", Kind::Bool),
    field("fleet_control", Kind::Bool),
    field(
        "max_per_minute",
        Kind::Int {
            max: u32::MAX as u64,
        },
    ),
    field("approval", Kind::Str),
    field("approval_expiry", Kind::Str),
    field("upgrades_repository", Kind::Str),
    field("upgrades_optional", Kind::Bool),
    field("features", Kind::Map(&FEATURE_FIELDS)),
    field("identity_pattern", Kind::Str),
    field("csr_extra_dns_names", Kind::Str),
    field("monitor_address", Kind::Str),
    field("record_helper_inputs", Kind::Str),
    field("active_active", Kind::Bool),
    field("claim_lifetime", Kind::Str),
    field("claims_secret_file", Kind::Str),
    // The webhook helper.
    field("helper_secret_file", Kind::Str),
    field("helper_tls_cert", Kind::Str),
    field("helper_tls_key", Kind::Str),
    field("helper_tls_ca", Kind::Str),
    field("helper_reply_signature", Kind::Str),
    // Node status, history and audit trail.
    field(
        "node_history_size",
        Kind::Int {
            max: u32::MAX as u64,
        },
    ),
    field("node_history_max_age", Kind::Str),
    field("monitor_token_file", Kind::Str),
    field("monitor_tls_cert", Kind::Str),
    field("monitor_tls_key", Kind::Str),
    field("monitor_hostnames", Kind::StrList),
    field("audit_file", Kind::Str),
    field("audit_stream", Kind::Str),
    field("audit_stream_max_age", Kind::Str),
    field(
        "audit_stream_max_bytes",
        Kind::Int {
            max: i64::MAX as u64,
        },
    ),
];

impl RawConfig {
    pub(super) fn from_settings(s: &Settings) -> RawConfig {
        let text = |name| match s.get(name) {
            Some(Value::Str(v)) => v.clone(),
            _ => String::new(),
        };
        let flag = |s: &Settings, name| matches!(s.get(name), Some(Value::Bool(true)));
        let int = |name| match s.get(name) {
            Some(Value::Int(v)) => *v,
            _ => 0,
        };
        let features = match s.get("features") {
            Some(Value::Map(f)) => RawFeatures {
                pki: flag(f, "pki"),
                jwt: flag(f, "jwt"),
                ed25519: flag(f, "ed25519"),
                upgrades: flag(f, "upgrades"),
            },
            _ => RawFeatures::default(),
        };
        RawConfig {
            // The schema bounds every integer to its type.
            workers: u32::try_from(int("workers")).unwrap_or(u32::MAX),
            threads: match s.get("threads") {
                Some(Value::Int(v)) => Some(u32::try_from(*v).unwrap_or(u32::MAX)),
                _ => None,
            },
            work_queue_size: u32::try_from(int("work_queue_size")).unwrap_or(u32::MAX),
            interval: match s.get("interval") {
                Some(Value::Str(v)) => Some(v.clone()),
                _ => None,
            },
            logfile: text("logfile"),
            loglevel: text("loglevel"),
            helper: text("helper"),
            token: text("token"),
            lifecycle_component: text("lifecycle_component"),
            choria_insecure: flag(s, "choria_insecure"),
            site: text("site"),
            monitor_port: u16::try_from(int("monitor_port")).unwrap_or(u16::MAX),
            broker_port: u16::try_from(int("broker_port")).unwrap_or(u16::MAX),
            broker_provisioning_password: text("broker_provisioning_password"),
            cert_deny_list: match s.get("cert_deny_list") {
                Some(Value::StrList(v)) => v.clone(),
                _ => Vec::new(),
            },
            jwt_verify_cert: text("jwt_verify_cert"),
            jwt_signing_key: text("jwt_signing_key"),
            jwt_signing_token: text("jwt_signing_token"),
            server_jwt_validity: text("server_jwt_validity"),
            rego_policy: text("rego_policy"),
            leader_election: flag(s, "leader_election"),
            leader_election_wait: flag(s, "leader_election_wait"),
            dry_run: flag(s, "dry_run"),
            fleet_control: flag(s, "fleet_control"),
            max_per_minute: u32::try_from(int("max_per_minute")).unwrap_or(u32::MAX),
            approval: text("approval"),
            approval_expiry: text("approval_expiry"),
            upgrades_repository: text("upgrades_repository"),
            upgrades_optional: flag(s, "upgrades_optional"),
            features,
            identity_pattern: text("identity_pattern"),
            csr_extra_dns_names: text("csr_extra_dns_names"),
            monitor_address: text("monitor_address"),
            record_helper_inputs: text("record_helper_inputs"),
            active_active: flag(s, "active_active"),
            claim_lifetime: text("claim_lifetime"),
            claims_secret_file: text("claims_secret_file"),
            webhook: WebhookSettings {
                secret_file: text("helper_secret_file").trim().to_string(),
                tls_cert: text("helper_tls_cert").trim().to_string(),
                tls_key: text("helper_tls_key").trim().to_string(),
                tls_ca: text("helper_tls_ca").trim().to_string(),
                reply_signature: Default::default(),
            },
            helper_reply_signature: text("helper_reply_signature"),
            node_history_size: u32::try_from(int("node_history_size")).unwrap_or(u32::MAX),
            node_history_max_age: text("node_history_max_age"),
            monitor_token_file: text("monitor_token_file"),
            monitor_tls_cert: text("monitor_tls_cert"),
            monitor_tls_key: text("monitor_tls_key"),
            monitor_hostnames: match s.get("monitor_hostnames") {
                Some(Value::StrList(v)) => v.clone(),
                _ => Vec::new(),
            },
            audit_file: text("audit_file"),
            audit_stream: text("audit_stream"),
            audit_stream_max_age: text("audit_stream_max_age"),
            audit_stream_max_bytes: int("audit_stream_max_bytes"),
        }
    }
}
