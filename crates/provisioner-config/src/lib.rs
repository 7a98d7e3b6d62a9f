//! The provisioner's YAML configuration: the Go provisioner's keys and defaults, the file read as
//! the Go provisioner reads it (keys in any case, YAML 1.1 booleans and integers, repeated and
//! merge keys: the `goyaml` module), validation with one clear message per problem, and warnings
//! returned as data.

use std::path::{Path, PathBuf};
use std::time::Duration;

use helper_protocol::webhook::{is_webhook, ReplySignature, ReplySignatureParseError};
use provision_core::config::{DEFAULT_CERT_DENY_LIST, DEFAULT_SERVER_JWT_VALIDITY};
use provision_core::identity::IdentityRule;
use provision_core::policy::{DenyList, ExtraDnsNames};
use provision_core::{Features, ProvisionConfig};

mod checks;
mod goyaml;
mod raw;

use crate::goyaml::{Settings, Value};
use crate::raw::{RawConfig, FIELDS};
pub use choria_rpc_client::duration::{parse as parse_duration, DurationError};

/// The lifecycle component a provisioning-mode server announces itself with.
pub const DEFAULT_LIFECYCLE_COMPONENT: &str = "provision_mode_server";

/// The work queue's default capacity (`work_queue_size`).
pub const DEFAULT_WORK_QUEUE_SIZE: usize = provision_core::fleet::DEFAULT_QUEUE_CAPACITY;
/// Nodes the node history keeps at most (`node_history_size`).
pub const DEFAULT_NODE_HISTORY_SIZE: usize = 10_000;
/// How long the node history keeps a node after its last update (`node_history_max_age`).
pub const DEFAULT_NODE_HISTORY_MAX_AGE: Duration = Duration::from_secs(3600);
/// The shortest discovery interval accepted (as the Go provisioner).
pub const MIN_INTERVAL: Duration = Duration::from_secs(60);
/// Default `approval_expiry`: a week.
pub const DEFAULT_APPROVAL_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default `claim_lifetime` (active-active): how long a claim on a node lives without being
/// kept, and so how long a dead replica's claims block the others.
pub const DEFAULT_CLAIM_LIFETIME: Duration = Duration::from_secs(30);
/// The shortest `claim_lifetime`: a claim is kept every third of it, and a JetStream
/// round-trip must fit comfortably.
pub const MIN_CLAIM_LIFETIME: Duration = Duration::from_secs(6);
/// The longest `claim_lifetime`.
pub const MAX_CLAIM_LIFETIME: Duration = Duration::from_secs(3600);
/// The most `threads` accepted.
pub const MAX_THREADS: u64 = 1024;

/// What `workers: 0` and `threads: 0` mean: the CPUs the process may use (its affinity mask,
/// lowered to its cgroup CPU quota), at least 1.
fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The validated provisioner configuration: the Go provisioner's keys and ours. What the cycle of
/// a node reads is [`Config::provision`]; the rest is the daemon's. Its `Debug` shows `token`
/// and `broker_provisioning_password` as `<redacted>`.
#[derive(Clone)]
#[non_exhaustive]
pub struct Config {
    /// What the cycle reads: `token`, `features`, `interval`, `identity_pattern`,
    /// `cert_deny_list`, `csr_extra_dns_names`, `server_jwt_validity`, `upgrades_repository`
    /// and `upgrades_optional`, compiled.
    pub provision: ProvisionConfig,
    /// Concurrent provisioning workers (the CPU count when configured as 0).
    pub workers: usize,
    /// `threads` (not a Go key): the threads that run the daemon's asynchronous work. 1, the
    /// default, runs every task on one thread, the least CPU a node (a node costs a few hundred
    /// microseconds, so one core provisions thousands a second); more spread the work over that
    /// many (the CPU count when configured as 0). Policy evaluation and audit writes run on
    /// their own threads whatever this says.
    pub threads: usize,
    /// How many nodes may wait in the work queue (`work_queue_size`, not a Go key); a node
    /// found while it is full is dropped with a warning and found again by a later discovery.
    pub work_queue_size: usize,
    /// `logfile` as written; empty means the binary's default (standard output).
    pub logfile: String,
    /// `loglevel` as written.
    pub loglevel: String,
    /// The helper command line.
    pub helper: String,
    /// The lifecycle component whose startup events queue nodes.
    pub lifecycle_component: String,
    /// Talk to the broker without TLS and with the `file` security provider.
    pub choria_insecure: bool,
    /// Label for every metric.
    pub site: String,
    /// Port of the `/metrics` listener, 0 for none.
    pub monitor_port: u16,
    /// NATS password of the `provisioner` user, if any.
    pub broker_provisioning_password: String,
    /// File (RSA PEM or hex ed25519) or hex ed25519 key verifying provisioning JWTs.
    pub jwt_verify_cert: String,
    /// Key signing server JWTs (RSA PEM or 64 hex characters of ed25519 seed).
    pub jwt_signing_key: String,
    /// The provisioner's own chain-issuer JWT, read again for every node.
    pub jwt_signing_token: String,
    /// Take part in leader election.
    pub leader_election: bool,
    /// `leader_election_wait` (not a Go key): an election that cannot start is tried again
    /// for ever (standing by meanwhile); without it the daemon stops, as the Go provisioner
    /// does.
    pub leader_election_wait: bool,
    /// `fleet_control` (not a Go key): follow the `CHORIA_PROVISIONER_CONTROL` bucket, so that
    /// `choria-provisioner pause|resume|deny` reach this replica.
    pub fleet_control: bool,
    /// `max_per_minute` (not a Go key): nodes a minute that may reach the helper, shared by
    /// every replica through the fleet control bucket when `fleet_control` is on; 0 is no limit.
    pub max_per_minute: u32,
    /// `approval: manual` (not a Go key): every node that passes the deny list and the checks
    /// waits for an operator's approval before the helper; `auto` (the default) only the nodes
    /// the policy marks pending. Needs `fleet_control`.
    pub approval_manual: bool,
    /// `approval_expiry` (not a Go key): how long a pending entry, and an approval, lasts.
    pub approval_expiry: Duration,
    /// `active_active` (not a Go key): every replica provisions, each node claimed in the
    /// `CHORIA_PROVISIONER_CLAIMS` bucket first; exclusive with `leader_election`.
    pub active_active: bool,
    /// `claim_lifetime` (not a Go key): how long a claim lives unless kept (active-active).
    pub claim_lifetime: Duration,
    /// `claims_secret_file` (not a Go key): a secret every active-active replica shares and no
    /// node has, sealing the claims bucket's values; empty means the broker password, if any.
    pub claims_secret_file: String,
    /// `monitor_address` (not a Go key): the address the monitor listener binds; empty means
    /// every interface, IPv4 and IPv6, as Go's `:port`.
    pub monitor_address: String,
    /// `rego_policy`: a `.rego` file or a directory of them deciding which nodes may be
    /// provisioned; empty means every node that passes the built-in checks.
    pub rego_policy: String,
    /// `record_helper_inputs` (not a Go key): a directory the daemon writes each node's helper
    /// input to (token removed), for `policy eval`; empty means none are recorded.
    pub record_helper_inputs: String,
    /// The webhook helper's settings (not Go keys), used when `helper` is an `http://` or
    /// `https://` URL.
    pub webhook: WebhookSettings,
    // Node status, history and audit trail (not Go keys).
    /// `node_history_size`: nodes the history behind `/api/v1/nodes` keeps at most.
    pub node_history_size: usize,
    /// `node_history_max_age`: a node not updated for this long is forgotten.
    pub node_history_max_age: Duration,
    /// `monitor_token_file`: a file holding the bearer token the JSON API and the status pages
    /// ask for; empty means they answer loopback clients only.
    pub monitor_token_file: String,
    /// `monitor_tls_cert` and `monitor_tls_key`: the monitor listener's TLS certificate (with
    /// its chain) and key, both or neither; reloaded when they change.
    pub monitor_tls_cert: String,
    /// See `monitor_tls_cert`.
    pub monitor_tls_key: String,
    /// `monitor_hostnames`: names a request's `Host` may give for the API and the pages, besides
    /// loopback and the address the client reached.
    pub monitor_hostnames: Vec<String>,
    /// `audit_file`: the file one JSON line per decision is appended to; empty means none.
    pub audit_file: String,
    /// `audit_stream`: the JetStream stream the same lines are published to; empty means none.
    pub audit_stream: String,
    /// `audit_stream_max_age` and `audit_stream_max_bytes`: what a stream the provisioner
    /// creates keeps (30 days and 1 GiB by default), the oldest records discarded first.
    pub audit_stream_limits: StreamLimits,
    /// The file this was loaded from.
    pub file: PathBuf,
}

impl Default for Config {
    /// The configuration of an empty file: every default.
    fn default() -> Self {
        Config::validate_all(RawConfig::default(), Path::new("")).0
    }
}

/// The webhook helper's files, as written (not Go keys); empty means unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookSettings {
    /// `helper_secret_file`: the file holding the secret every request is signed with.
    pub secret_file: String,
    /// `helper_tls_cert`: a PEM client certificate presented to an `https` helper.
    pub tls_cert: String,
    /// `helper_tls_key`: the private key of `helper_tls_cert`.
    pub tls_key: String,
    /// `helper_tls_ca`: PEM CA certificates trusted, alone, for an `https` helper.
    pub tls_ca: String,
    /// `helper_reply_signature`: whether the helper's replies must be signed with the secret
    /// (`required`) or are checked only when signed (`optional`, the default).
    pub reply_signature: ReplySignature,
}

/// Shows a secret as `<redacted>` when set and `""` when empty, so a dump says whether it is set.
fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "<redacted>"
    }
}

impl std::fmt::Debug for Config {
    // Every field by name, so a field added later must be listed here (and judged secret or
    // not) for this to compile.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Config {
            provision,
            workers,
            threads,
            work_queue_size,
            logfile,
            loglevel,
            helper,
            lifecycle_component,
            choria_insecure,
            site,
            monitor_port,
            broker_provisioning_password,
            jwt_verify_cert,
            jwt_signing_key,
            jwt_signing_token,
            leader_election,
            leader_election_wait,
            fleet_control,
            max_per_minute,
            approval_manual,
            approval_expiry,
            active_active,
            claim_lifetime,
            claims_secret_file,
            monitor_address,
            rego_policy,
            record_helper_inputs,
            webhook,
            node_history_size,
            node_history_max_age,
            monitor_token_file,
            monitor_tls_cert,
            monitor_tls_key,
            monitor_hostnames,
            audit_file,
            audit_stream,
            audit_stream_limits,
            file,
        } = self;
        f.debug_struct("Config")
            // Its own Debug redacts the token.
            .field("provision", provision)
            .field("workers", workers)
            .field("threads", threads)
            .field("work_queue_size", work_queue_size)
            .field("logfile", logfile)
            .field("loglevel", loglevel)
            .field("helper", helper)
            .field("lifecycle_component", lifecycle_component)
            .field("choria_insecure", choria_insecure)
            .field("site", site)
            .field("monitor_port", monitor_port)
            .field(
                "broker_provisioning_password",
                &redacted(broker_provisioning_password),
            )
            .field("jwt_verify_cert", jwt_verify_cert)
            .field("jwt_signing_key", jwt_signing_key)
            .field("jwt_signing_token", jwt_signing_token)
            .field("leader_election", leader_election)
            .field("leader_election_wait", leader_election_wait)
            .field("fleet_control", fleet_control)
            .field("max_per_minute", max_per_minute)
            .field("approval_manual", approval_manual)
            .field("approval_expiry", approval_expiry)
            .field("active_active", active_active)
            .field("claim_lifetime", claim_lifetime)
            .field("claims_secret_file", claims_secret_file)
            .field("monitor_address", monitor_address)
            .field("rego_policy", rego_policy)
            .field("record_helper_inputs", record_helper_inputs)
            // File names only: the secret is never read here.
            .field("webhook", webhook)
            .field("node_history_size", node_history_size)
            .field("node_history_max_age", node_history_max_age)
            .field("monitor_token_file", monitor_token_file)
            .field("monitor_tls_cert", monitor_tls_cert)
            .field("monitor_tls_key", monitor_tls_key)
            .field("monitor_hostnames", monitor_hostnames)
            .field("audit_file", audit_file)
            .field("audit_stream", audit_stream)
            .field("audit_stream_limits", audit_stream_limits)
            .field("file", file)
            .finish()
    }
}

/// A configuration problem that does not stop the provisioner; the binary logs these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigWarning {
    /// A key the provisioner does not know, probably a typo.
    UnknownKey(String),
    /// A key that is accepted for compatibility but does nothing.
    NoEffect(&'static str),
    /// A setting given by more than one key of one mapping (the same key twice, or spellings
    /// differing in case); one of them counts, as in the Go provisioner.
    RepeatedKey {
        /// The setting (`helper`, `features.pki`).
        key: String,
        /// Every key naming it, as written, in the file's order.
        written: Vec<String>,
        /// The key whose value counts (the last applied, for a merged mapping).
        used: String,
        /// A mapping (`features`) given under several spellings: they are merged, each
        /// overriding the ones applied before it.
        merged: bool,
    },
    /// The file holds more than one YAML document; only the first is read, as in the Go
    /// provisioner.
    ExtraDocuments,
}

impl std::fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigWarning::UnknownKey(k) => write!(f, "unknown configuration key {k:?} is ignored"),
            ConfigWarning::NoEffect(k) => {
                write!(
                    f,
                    "configuration key {k:?} is accepted for compatibility but has no effect"
                )
            }
            ConfigWarning::RepeatedKey {
                key,
                written,
                used,
                merged,
            } => {
                write!(
                    f,
                    "configuration key {key:?} is given {} times (",
                    written.len()
                )?;
                for (i, w) in written.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{w:?}")?;
                }
                if *merged {
                    f.write_str(
                        "); the mappings are merged in the byte order of their keys, a later one \
                         overriding an earlier one, as in the Go provisioner",
                    )
                } else {
                    write!(
                        f,
                        "); the value of the last {used:?} counts, as in the Go provisioner"
                    )
                }
            }
            ConfigWarning::ExtraDocuments => f.write_str(
                "the configuration file holds more than one YAML document; only the first is read",
            ),
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file does not exist.
    #[error("configuration file {0} not found")]
    NotFound(PathBuf),
    /// The file could not be read.
    #[error("configuration file {path} could not be read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The YAML could not be parsed or has a value of the wrong type.
    #[error(
        "configuration file {path} could not be parsed at line {line} column {column}: {message}"
    )]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line, 0 when unknown.
        line: usize,
        /// 1-based column, 0 when unknown.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A duration could not be parsed.
    #[error("invalid {key} duration {value:?}: {reason}")]
    Duration {
        /// The key holding it.
        key: &'static str,
        /// The text found.
        value: String,
        /// Why it was refused.
        reason: DurationError,
    },
    /// `interval` is shorter than one minute.
    #[error("interval {0:?} is too small, the minimum is 1 minute, for example 10m or 1h")]
    IntervalTooSmall(String),
    /// `lifecycle_component` contains a NATS subject token character.
    #[error("invalid lifecycle component {0:?}: it may not contain '.', '>' or '*'")]
    LifecycleComponent(String),
    /// Both `pki` and `ed25519` features are on.
    #[error("can only enable one of the pki or ed25519 features")]
    PkiAndEd25519,
    /// `identity_pattern` is not a valid regular expression.
    #[error("invalid identity_pattern {pattern:?}: {reason}")]
    IdentityPattern {
        /// The entry.
        pattern: String,
        /// The regular expression compiler's message.
        reason: String,
    },
    /// `csr_extra_dns_names` is not a valid regular expression.
    #[error("invalid csr_extra_dns_names pattern {pattern:?}: {reason}")]
    CsrNamePattern {
        /// The entry.
        pattern: String,
        /// The regular expression compiler's message.
        reason: String,
    },
    /// `active_active` and `leader_election` are both on.
    #[error("active_active and leader_election cannot both be on: choose one high-availability mode (a deployment with Go provisioners stays on leader_election)")]
    ActiveActiveAndElection,
    /// `approval` is neither `auto` nor `manual`.
    #[error("invalid approval {0:?}: it must be auto or manual")]
    Approval(String),
    /// `approval_expiry` is zero.
    #[error("approval_expiry {0:?} must be longer than zero")]
    ApprovalExpiry(String),
    /// `approval: manual` without `fleet_control`.
    #[error("approval: manual needs fleet_control: true (the pending nodes and approvals live in the fleet control bucket)")]
    ApprovalNeedsFleetControl,
    /// `claim_lifetime` is outside 6 s to 1 h.
    #[error("claim_lifetime {0:?} is out of range: it must be between 6s and 1h")]
    ClaimLifetime(String),
    /// `monitor_address` is not an IP address.
    #[error("invalid monitor_address {0:?}: it must be an IPv4 or IPv6 address, for example 127.0.0.1 or ::1")]
    MonitorAddress(String),
    /// An audit stream limit of zero would keep nothing.
    #[error("{0} must be more than zero")]
    AuditStreamLimit(&'static str),
    /// Only one of `monitor_tls_cert` and `monitor_tls_key` is set.
    #[error(
        "monitor_tls_cert and monitor_tls_key go together: set both, or neither for plain HTTP"
    )]
    MonitorTls,
    /// A `monitor_hostnames` entry is not a host name.
    #[error(
        "invalid monitor_hostnames entry {0:?}: a host name of letters, digits, '-', '_' and '.'"
    )]
    MonitorHostname(String),
    /// `audit_stream` is not a JetStream stream name.
    #[error("invalid audit_stream {0:?}: a stream name has no spaces, '.', '*', '>', '/' or '\\'")]
    AuditStream(String),
    /// `helper_reply_signature` is neither `optional` nor `required`.
    #[error("invalid helper_reply_signature {0:?}: it is optional (the default) or required")]
    HelperReplySignature(String),
    /// `helper_reply_signature: required` with a webhook but no secret to check replies with.
    #[error(
        "helper_reply_signature is required but helper_secret_file is not set: replies are \
         signed with that secret"
    )]
    ReplySignatureWithoutSecret,
    /// A `cert_deny_list` entry is not a valid regular expression.
    #[error("invalid cert_deny_list pattern {pattern:?}: {reason}")]
    DenyPattern {
        /// The entry.
        pattern: String,
        /// The regular expression compiler's message.
        reason: String,
    },
}

/// A configuration checked as far as possible: see [`Config::load_all`].
#[derive(Debug)]
pub struct Checked {
    /// The configuration (invalid values replaced by defaults) and its warnings.
    pub loaded: Loaded,
    /// Every validation problem, in the order the keys are checked; empty when usable.
    pub errors: Vec<ConfigError>,
}

/// A loaded configuration with the warnings found while loading it.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The configuration.
    pub config: Config,
    /// Problems that do not stop the provisioner, in the order found.
    pub warnings: Vec<ConfigWarning>,
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Loaded, ConfigError> {
        let path = path.as_ref();
        let text = Self::read(path)?;
        Self::from_yaml(&text, path)
    }

    /// Reads `path` and validates every key, collecting all the problems, not only
    /// the first (for `choria-provisioner check`). In the returned configuration an invalid
    /// value is replaced by its default, so whatever depends on it can still be checked. A file
    /// that cannot be read or parsed is still an error: nothing can be checked without it.
    pub fn load_all(path: impl AsRef<Path>) -> Result<Checked, ConfigError> {
        let path = path.as_ref();
        let text = Self::read(path)?;
        let (raw, warnings) = Self::parse(&text, path)?;
        let (config, errors) = Self::validate_all(raw, path);
        Ok(Checked {
            loaded: Loaded { config, warnings },
            errors,
        })
    }

    fn read(path: &Path) -> Result<String, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(t) => Ok(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ConfigError::NotFound(path.to_path_buf()))
            }
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Parses and validates YAML `text`; `path` is only used in messages and kept as `file`.
    pub fn from_yaml(text: &str, path: impl AsRef<Path>) -> Result<Loaded, ConfigError> {
        let path = path.as_ref();
        let (raw, warnings) = Self::parse(text, path)?;
        let config = Self::validate(raw, path)?;
        Ok(Loaded { config, warnings })
    }

    /// The typed form of `text`, read as the Go provisioner reads it ([`goyaml`]), and the
    /// warnings about its keys.
    fn parse(text: &str, path: &Path) -> Result<(RawConfig, Vec<ConfigWarning>), ConfigError> {
        let decoded = goyaml::decode(text, &FIELDS).map_err(|e| {
            let (line, column) = e
                .location()
                .map(|l| (l.line(), l.column()))
                .unwrap_or((0, 0));
            ConfigError::Syntax {
                path: path.to_path_buf(),
                line,
                column,
                message: e.to_string(),
            }
        })?;
        let mut warnings: Vec<ConfigWarning> = decoded
            .unknown
            .into_iter()
            .map(ConfigWarning::UnknownKey)
            .collect();
        warnings.extend(
            decoded
                .repeated
                .into_iter()
                .map(|r| ConfigWarning::RepeatedKey {
                    key: r.setting,
                    written: r.written,
                    used: r.used,
                    merged: r.merged,
                }),
        );
        if decoded.extra_documents {
            warnings.push(ConfigWarning::ExtraDocuments);
        }
        let raw = RawConfig::from_settings(&decoded.settings);
        if raw.broker_port != 0 {
            warnings.push(ConfigWarning::NoEffect("broker_port"));
        }
        Ok((raw, warnings))
    }

    /// The configuration, or the first problem in the order the keys are checked.
    fn validate(raw: RawConfig, path: &Path) -> Result<Config, ConfigError> {
        let (config, errors) = Self::validate_all(raw, path);
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(config),
        }
    }
}

/// How much of the audit trail the stream keeps: records older than `max_age` or beyond
/// `max_bytes` are discarded, oldest first, so the stream cannot fill the server's storage that
/// the election and claims buckets share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// `audit_stream_max_age`.
    pub max_age: Duration,
    /// `audit_stream_max_bytes`.
    pub max_bytes: u64,
}

impl Default for StreamLimits {
    /// 30 days and 1 GiB.
    fn default() -> Self {
        StreamLimits {
            max_age: Duration::from_secs(30 * 24 * 3600),
            max_bytes: 1 << 30,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_the_token_and_the_broker_password_and_shows_the_rest() {
        let loaded = Config::from_yaml(
            "token: tok-8c1f2e-secret\nbroker_provisioning_password: pw-77d0a9-secret\n\
             site: lon\nhelper: /usr/bin/helper\nmonitor_address: 127.0.0.1\n",
            "/etc/choria/provisioner.yaml",
        )
        .unwrap();
        let c = loaded.config;
        for text in [
            format!("{c:?}"),
            format!("{c:#?}"),
            format!("{:?}", Some(&c)),
        ] {
            assert!(!text.contains("tok-8c1f2e"), "token in {text}");
            assert!(!text.contains("pw-77d0a9"), "password in {text}");
            assert!(text.contains("token: \"<redacted>\""), "{text}");
            assert!(
                text.contains("broker_provisioning_password: \"<redacted>\""),
                "{text}"
            );
            for shown in [
                "\"lon\"",
                "/usr/bin/helper",
                "127.0.0.1",
                "provision_mode_server",
            ] {
                assert!(text.contains(shown), "{shown} missing from {text}");
            }
        }
        // An unset secret shows as empty, so a dump still says whether it is set.
        let c = load("site: lon\n").unwrap().config;
        let text = format!("{c:?}");
        assert!(text.contains("token: \"\""), "{text}");
        assert!(!text.contains("<redacted>"), "{text}");
    }

    fn load(yaml: &str) -> Result<Loaded, ConfigError> {
        Config::from_yaml(yaml, "/etc/choria/provisioner.yaml")
    }

    #[test]
    fn load_all_reports_every_problem_and_keeps_defaults_in_their_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.yaml");
        std::fs::write(
            &path,
            "interval: 30s\nlifecycle_component: a.b\nserver_jwt_validity: 3x\n\
             cert_deny_list: [\"(\"]\nworkers: 3\nfeatures:\n  pki: true\n  ed25519: true\n",
        )
        .unwrap();
        let checked = Config::load_all(&path).unwrap();
        let kinds: Vec<String> = checked.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(checked.errors.len(), 5, "{kinds:?}");
        assert!(matches!(
            checked.errors[0],
            ConfigError::LifecycleComponent(_)
        ));
        assert!(matches!(checked.errors[1], ConfigError::DenyPattern { .. }));
        assert!(matches!(checked.errors[2], ConfigError::PkiAndEd25519));
        assert!(matches!(
            checked.errors[3],
            ConfigError::Duration {
                key: "server_jwt_validity",
                ..
            }
        ));
        assert!(matches!(
            checked.errors[4],
            ConfigError::IntervalTooSmall(_)
        ));
        let c = checked.loaded.config;
        assert_eq!(c.workers, 3);
        assert_eq!(c.provision.interval(), MIN_INTERVAL);
        assert_eq!(c.lifecycle_component, DEFAULT_LIFECYCLE_COMPONENT);
        assert_eq!(
            c.provision.server_jwt_validity(),
            DEFAULT_SERVER_JWT_VALIDITY
        );
        assert!(c
            .provision
            .deny_list()
            .matches("x.privileged.choria")
            .is_some());
        // `load` still stops at the first of them.
        assert!(matches!(
            Config::load(&path),
            Err(ConfigError::LifecycleComponent(_))
        ));
        // A file that does not parse cannot be checked further.
        std::fs::write(&path, "features: [\n").unwrap();
        assert!(matches!(
            Config::load_all(&path),
            Err(ConfigError::Syntax { .. })
        ));
    }

    #[test]
    fn defaults_match_the_go_provisioner() {
        let l = load("helper: /bin/true\n").unwrap();
        let c = &l.config;
        assert!(l.warnings.is_empty());
        assert_eq!(c.lifecycle_component, "provision_mode_server");
        assert_eq!(c.provision.interval(), Duration::from_secs(60));
        assert_eq!(
            c.workers,
            std::thread::available_parallelism().unwrap().get()
        );
        assert_eq!(
            c.provision.deny_list().patterns().collect::<Vec<_>>(),
            DEFAULT_CERT_DENY_LIST.to_vec()
        );
        assert_eq!(
            c.provision.server_jwt_validity(),
            Duration::from_secs(365 * 86400)
        );
        assert_eq!(c.provision.features(), Features::default());
        assert_eq!(c.monitor_port, 0);
        assert_eq!(c.work_queue_size, DEFAULT_WORK_QUEUE_SIZE);
        assert!(!c.leader_election && !c.choria_insecure && !c.provision.upgrades_optional());
        assert_eq!(c.logfile, "");
        assert_eq!(c.file, PathBuf::from("/etc/choria/provisioner.yaml"));
    }

    #[test]
    fn work_queue_size_is_read_and_zero_or_null_means_the_default() {
        let l = load("work_queue_size: 12\n").unwrap();
        assert!(l.warnings.is_empty(), "{:?}", l.warnings);
        assert_eq!(l.config.work_queue_size, 12);
        assert_eq!(
            load("work_queue_size: 0\n").unwrap().config.work_queue_size,
            DEFAULT_WORK_QUEUE_SIZE
        );
        assert_eq!(
            load("work_queue_size:\n").unwrap().config.work_queue_size,
            DEFAULT_WORK_QUEUE_SIZE
        );
        assert!(matches!(
            load("work_queue_size: -1\n"),
            Err(ConfigError::Syntax { .. })
        ));
    }

    #[test]
    fn threads_default_to_one_and_zero_means_the_cpu_count() {
        assert_eq!(load("").unwrap().config.threads, 1);
        assert_eq!(load("threads:\n").unwrap().config.threads, 1);
        assert_eq!(load("threads: 4\n").unwrap().config.threads, 4);
        assert_eq!(load("threads: 0\n").unwrap().config.threads, cpus());
        for bad in ["threads: -1\n", "threads: 1025\n", "threads: many\n"] {
            assert!(
                matches!(load(bad), Err(ConfigError::Syntax { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn empty_file_and_null_values_take_defaults() {
        let c = load("").unwrap().config;
        assert_eq!(c.provision.interval(), Duration::from_secs(60));
        let c = load("workers:\nlifecycle_component:\ncert_deny_list:\n")
            .unwrap()
            .config;
        assert_eq!(c.lifecycle_component, DEFAULT_LIFECYCLE_COMPONENT);
        assert!(c.workers >= 1);
        assert_eq!(c.provision.deny_list().patterns().count(), 4);
    }

    #[test]
    fn every_key_is_read() {
        let yaml = r#"
workers: 7
interval: 5m
logfile: /var/log/prov.log
loglevel: debug
helper: /usr/bin/helper --x
token: s3cret
lifecycle_component: custom_mode
choria_insecure: true
site: lon
monitor_port: 8080
broker_provisioning_password: pw
cert_deny_list: ["/\\.bad$/"]
jwt_verify_cert: /etc/signer.pem
jwt_signing_key: /etc/key.seed
jwt_signing_token: /etc/client.jwt
server_jwt_validity: 2w
leader_election: true
upgrades_repository: https://repo.example.net/
upgrades_optional: true
features:
  pki: false
  ed25519: true
  upgrades: true
"#;
        let c = load(yaml).unwrap().config;
        assert_eq!(c.workers, 7);
        assert_eq!(c.provision.interval(), Duration::from_secs(300));
        assert_eq!(c.logfile, "/var/log/prov.log");
        assert_eq!(c.loglevel, "debug");
        assert_eq!(c.helper, "/usr/bin/helper --x");
        assert_eq!(c.provision.token(), "s3cret");
        assert_eq!(c.lifecycle_component, "custom_mode");
        assert!(c.choria_insecure);
        assert_eq!(c.site, "lon");
        assert_eq!(c.monitor_port, 8080);
        assert_eq!(c.broker_provisioning_password, "pw");
        assert_eq!(
            c.provision.deny_list().patterns().collect::<Vec<_>>(),
            vec!["/\\.bad$/"]
        );
        assert!(c.provision.deny_list().matches("x.bad").is_some());
        assert_eq!(c.jwt_verify_cert, "/etc/signer.pem");
        assert_eq!(c.jwt_signing_key, "/etc/key.seed");
        assert_eq!(c.jwt_signing_token, "/etc/client.jwt");
        assert_eq!(
            c.provision.server_jwt_validity(),
            Duration::from_secs(14 * 86400)
        );
        assert!(c.leader_election);
        assert_eq!(
            c.provision.upgrades_repository(),
            "https://repo.example.net/"
        );
        assert!(c.provision.upgrades_optional());
        assert!(
            c.provision.features().ed25519
                && c.provision.features().jwt
                && c.provision.features().upgrades
                && !c.provision.features().pki
        );
    }

    #[test]
    fn validation_errors_one_message_each() {
        let cases: &[(&str, &str)] = &[
            ("interval: 30s", "interval \"30s\" is too small"),
            ("interval: 59s", "too small"),
            ("interval: ''", "too small"),
            (
                "lifecycle_component: a.b",
                "invalid lifecycle component \"a.b\"",
            ),
            ("lifecycle_component: a>", "invalid lifecycle component"),
            ("lifecycle_component: '*'", "invalid lifecycle component"),
            (
                "features: {pki: true, ed25519: true}",
                "only enable one of the pki or ed25519",
            ),
            (
                "interval: 10x",
                "invalid interval duration \"10x\": invalid time unit x",
            ),
            ("interval: '60'", "invalid time unit 0"),
            (
                "server_jwt_validity: 1q",
                "invalid server_jwt_validity duration",
            ),
            ("server_jwt_validity: abcd", "invalid number"),
            ("cert_deny_list: ['(']", "invalid cert_deny_list pattern"),
            ("workers: many", "could not be parsed at line 1 column 10"),
        ];
        for (yaml, want) in cases {
            let err = load(yaml).unwrap_err().to_string();
            assert!(err.contains(want), "{yaml}: {err} does not contain {want}");
        }
    }

    #[test]
    fn yaml_syntax_errors_carry_line_and_column() {
        match load("helper: x\ninterval: [1m\n") {
            Err(ConfigError::Syntax { line, column, .. }) => {
                assert!(line >= 2, "line {line}");
                assert!(column > 0);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn missing_file_is_reported() {
        assert!(matches!(
            Config::load("/nonexistent/provisioner.yaml"),
            Err(ConfigError::NotFound(_))
        ));
    }

    #[test]
    fn unknown_and_ineffective_keys_are_warned_by_name() {
        let l = load("feature:\n  pki: true\nfeatures:\n  pkj: true\nrego_policy: x.rego\nbroker_port: 4222\n")
            .unwrap();
        assert_eq!(
            l.warnings,
            vec![
                ConfigWarning::UnknownKey("feature".into()),
                ConfigWarning::UnknownKey("features.pkj".into()),
                ConfigWarning::NoEffect("broker_port"),
            ]
        );
        // rego_policy has an effect: it is read, trimmed, and not warned about.
        assert_eq!(l.config.rego_policy, "x.rego");
        assert_eq!(l.config.record_helper_inputs, "");
        assert!(l.warnings[0].to_string().contains("\"feature\""));
    }

    #[test]
    fn active_active_is_read_and_refused_beside_leader_election() {
        let c = load("active_active: true\nclaim_lifetime: 45s\n")
            .unwrap()
            .config;
        assert!(c.active_active && !c.leader_election);
        assert_eq!(c.claim_lifetime, Duration::from_secs(45));
        let c = load("site: lon\n").unwrap().config;
        assert!(!c.active_active);
        assert_eq!(c.claim_lifetime, DEFAULT_CLAIM_LIFETIME);

        let both = load("active_active: true\nleader_election: true\n").unwrap_err();
        assert!(
            matches!(both, ConfigError::ActiveActiveAndElection),
            "{both}"
        );
        assert!(both.to_string().contains("leader_election"), "{both}");
        for (lifetime, what) in [
            ("2s", "out of range"),
            ("2h", "out of range"),
            ("5q", "invalid claim_lifetime"),
        ] {
            let e = load(&format!(
                "active_active: true\nclaim_lifetime: {lifetime}\n"
            ))
            .unwrap_err();
            assert!(e.to_string().contains(what), "{lifetime}: {e}");
        }
    }

    #[test]
    fn approval_is_auto_by_default_and_manual_needs_fleet_control() {
        let c = load("site: lon\n").unwrap().config;
        assert!(!c.approval_manual);
        assert_eq!(c.approval_expiry, DEFAULT_APPROVAL_EXPIRY);
        let c = load("fleet_control: true\napproval: Manual\napproval_expiry: 2d\n")
            .unwrap()
            .config;
        assert!(c.approval_manual);
        assert_eq!(c.approval_expiry, Duration::from_secs(2 * 86400));
        let e = load("approval: manual\n").unwrap_err();
        assert!(matches!(e, ConfigError::ApprovalNeedsFleetControl), "{e}");
        let e = load("fleet_control: true\napproval: sometimes\n").unwrap_err();
        assert!(e.to_string().contains("auto or manual"), "{e}");
        for bad in ["0s", "5q"] {
            let e = load(&format!("fleet_control: true\napproval_expiry: {bad}\n")).unwrap_err();
            assert!(e.to_string().contains("approval_expiry"), "{bad}: {e}");
        }
    }

    #[test]
    fn helper_reply_signature_is_read_and_needs_a_secret_with_a_webhook() {
        let hook = "helper: https://h.example.net/p\n";
        let c = load(hook).unwrap().config;
        assert_eq!(c.webhook.reply_signature, ReplySignature::Optional);
        let c = load(&format!(
            "{hook}helper_secret_file: /etc/s\nhelper_reply_signature: Required\n"
        ))
        .unwrap()
        .config;
        assert_eq!(c.webhook.reply_signature, ReplySignature::Required);
        let c = load(&format!("{hook}helper_reply_signature: optional\n"))
            .unwrap()
            .config;
        assert_eq!(c.webhook.reply_signature, ReplySignature::Optional);

        let e = load(&format!("{hook}helper_reply_signature: always\n")).unwrap_err();
        assert!(
            matches!(&e, ConfigError::HelperReplySignature(v) if v == "always"),
            "{e}"
        );
        assert!(
            e.to_string().contains("optional (the default) or required"),
            "{e}"
        );
        // Required with nothing to check replies with is refused; with a command helper the
        // key has no effect (check warns) and is no error.
        let e = load(&format!("{hook}helper_reply_signature: required\n")).unwrap_err();
        assert!(matches!(e, ConfigError::ReplySignatureWithoutSecret), "{e}");
        let c = load("helper: /usr/bin/h\nhelper_reply_signature: required\n")
            .unwrap()
            .config;
        assert_eq!(c.webhook.reply_signature, ReplySignature::Required);
    }
}
