//! The Choria client configuration file (`key = value`) as far as a provisioner needs it, the
//! provisioner's overrides, identity and caller id rules, and middleware host parsing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::protocol::{Security, SecurityError};

/// Why a configuration could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum ChoriaConfigError {
    /// The file could not be read.
    #[error("cannot read choria configuration {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A key has a value that cannot be used.
    #[error("invalid value {value:?} for {key}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// Why.
        reason: String,
    },
    /// No middleware hosts are configured (SRV lookups are not supported).
    #[error("no middleware hosts configured: set plugin.choria.middleware_hosts (srv lookups are not supported)")]
    NoMiddlewareHosts,
    /// A middleware host entry cannot be parsed.
    #[error("invalid middleware host {0:?}: expected host:port or scheme://host:port")]
    InvalidMiddlewareHost(String),
    /// The security provider needs a setting that is missing.
    #[error("security provider {provider} needs {key}")]
    MissingSetting {
        /// The provider.
        provider: String,
        /// The missing key.
        key: &'static str,
    },
    /// The security provider is not one this client implements.
    #[error("security provider {0} is not supported, use file or choria")]
    UnsupportedProvider(String),
    /// Loading certificates, keys, seeds or tokens failed.
    #[error(transparent)]
    Security(#[from] SecurityError),
}

/// The security provider selected by `plugin.security.provider`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecurityProvider {
    /// x509 files (`plugin.security.file.*`), protocol v1.
    File,
    /// ed25519 seed and JWT (`plugin.security.choria.*`), protocol v2.
    Choria,
    /// Any other provider (`puppet`, `pkcs11`, `certmanager`...), not supported here.
    Other(String),
}

/// The provisioner-side values applied over the Choria configuration, as the Go provisioner's
/// `cmd/provisioner.go` does. Its `Debug` redacts the password.
#[derive(Clone, Default)]
pub struct ProvisionerOverrides {
    /// `choria_insecure`: TLS off, requests unsigned, file provider.
    pub insecure: bool,
    /// `broker_provisioning_password`: when set, NATS user `provisioner` with this password.
    pub broker_provisioning_password: Option<String>,
    /// `loglevel` of the provisioner configuration.
    pub loglevel: Option<String>,
    /// `logfile` of the provisioner configuration.
    pub logfile: Option<String>,
    /// `--debug`: forces log level `debug`.
    pub debug: bool,
}

/// The parsed client configuration.
#[derive(Clone)]
pub struct ChoriaConfig {
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// `identity`: the configured node/client identity.
    pub identity: String,
    /// `collectives`.
    pub collectives: Vec<String>,
    /// `main_collective`.
    pub main_collective: String,
    /// `plugin.choria.middleware_hosts`, as written.
    pub middleware_hosts: Vec<String>,
    /// `plugin.security.provider`.
    pub security_provider: SecurityProvider,
    /// `plugin.security.file.certificate`.
    pub file_certificate: Option<PathBuf>,
    /// `plugin.security.file.key`.
    pub file_key: Option<PathBuf>,
    /// `plugin.security.file.ca`.
    pub file_ca: Option<PathBuf>,
    /// `plugin.security.choria.token_file`.
    pub choria_token_file: Option<PathBuf>,
    /// `plugin.security.choria.seed_file`.
    pub choria_seed_file: Option<PathBuf>,
    /// `plugin.security.choria.ca`.
    pub choria_ca: Option<PathBuf>,
    /// `plugin.security.choria.certificate`.
    pub choria_certificate: Option<PathBuf>,
    /// `plugin.security.choria.key`.
    pub choria_key: Option<PathBuf>,
    /// `plugin.nats.user` (or `MCOLLECTIVE_NATS_USERNAME`).
    pub nats_user: Option<String>,
    /// `plugin.nats.pass` (or `MCOLLECTIVE_NATS_PASSWORD`).
    pub nats_pass: Option<String>,
    /// `plugin.nats.credentials`.
    pub nats_credentials: Option<PathBuf>,
    /// `ttl` in seconds.
    pub ttl: u32,
    /// `discovery_timeout`.
    pub discovery_timeout: Duration,
    /// `plugin.choria.network.connect_timeout`.
    pub connect_timeout: Duration,
    /// `loglevel`.
    pub loglevel: String,
    /// `logfile`.
    pub logfile: String,
    /// TLS off (only set by the provisioner's `choria_insecure`).
    pub disable_tls: bool,
    /// Requests unsigned (`protocol.Secure = false` in go-choria).
    pub insecure: bool,
    /// Every key as read, including ones not interpreted here.
    pub raw: BTreeMap<String, String>,
}

impl std::fmt::Debug for ProvisionerOverrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ProvisionerOverrides {
            insecure,
            broker_provisioning_password,
            loglevel,
            logfile,
            debug,
        } = self;
        f.debug_struct("ProvisionerOverrides")
            .field("insecure", insecure)
            .field(
                "broker_provisioning_password",
                &broker_provisioning_password.as_ref().map(|_| REDACTED),
            )
            .field("loglevel", loglevel)
            .field("logfile", logfile)
            .field("debug", debug)
            .finish()
    }
}

/// What a secret shows as in `Debug` output.
const REDACTED: &str = "<redacted>";

/// Whether the value of the configuration key `key` is a secret itself (a password, a token or
/// a seed written inline) rather than a setting or a file name: its last dotted part names a
/// password, secret, token, seed or JWT and does not end in `file`.
fn secret_key(key: &str) -> bool {
    let last = key.rsplit('.').next().unwrap_or(key).to_ascii_lowercase();
    ["pass", "secret", "token", "seed", "jwt"]
        .iter()
        .any(|w| last.contains(w))
        && !last.ends_with("file")
}

/// `raw` for `Debug`: every key, the values of secret keys redacted.
struct RedactedRaw<'a>(&'a BTreeMap<String, String>);

impl std::fmt::Debug for RedactedRaw<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(k, v)| {
                let v: &dyn std::fmt::Debug = if secret_key(k) && !v.is_empty() {
                    &REDACTED
                } else {
                    v
                };
                (k, v)
            }))
            .finish()
    }
}

impl std::fmt::Debug for ChoriaConfig {
    // The NATS password must never reach a log line: it is redacted, and so is every secret
    // value in `raw`. Every field by name, so a field added later must be listed here (and
    // judged secret or not) for this to compile.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ChoriaConfig {
            path,
            identity,
            collectives,
            main_collective,
            middleware_hosts,
            security_provider,
            file_certificate,
            file_key,
            file_ca,
            choria_token_file,
            choria_seed_file,
            choria_ca,
            choria_certificate,
            choria_key,
            nats_user,
            nats_pass,
            nats_credentials,
            ttl,
            discovery_timeout,
            connect_timeout,
            loglevel,
            logfile,
            disable_tls,
            insecure,
            raw,
        } = self;
        f.debug_struct("ChoriaConfig")
            .field("path", path)
            .field("identity", identity)
            .field("collectives", collectives)
            .field("main_collective", main_collective)
            .field("middleware_hosts", middleware_hosts)
            .field("security_provider", security_provider)
            .field("file_certificate", file_certificate)
            .field("file_key", file_key)
            .field("file_ca", file_ca)
            .field("choria_token_file", choria_token_file)
            .field("choria_seed_file", choria_seed_file)
            .field("choria_ca", choria_ca)
            .field("choria_certificate", choria_certificate)
            .field("choria_key", choria_key)
            .field("nats_user", nats_user)
            .field("nats_pass", &nats_pass.as_ref().map(|_| REDACTED))
            .field("nats_credentials", nats_credentials)
            .field("ttl", ttl)
            .field("discovery_timeout", discovery_timeout)
            .field("connect_timeout", connect_timeout)
            .field("loglevel", loglevel)
            .field("logfile", logfile)
            .field("disable_tls", disable_tls)
            .field("insecure", insecure)
            .field("raw", &RedactedRaw(raw))
            .finish()
    }
}

/// Boolean values as go-choria reads them: `1 yes true y t` are true, anything else false.
pub fn parse_bool(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "yes" | "true" | "y" | "t"
    )
}

/// A duration: a plain integer is seconds, else a number with a unit (`ms`, `s`, `m`, `h`,
/// `d`, `w`), possibly several (`1m30s`).
pub fn parse_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = v;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let n: f64 = rest.get(..num_end)?.parse().ok()?;
        rest = rest.get(num_end..)?;
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = rest.get(..unit_end)?;
        rest = rest.get(unit_end..)?;
        let secs = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86_400.0,
            "w" => 604_800.0,
            _ => return None,
        };
        // A sum too large for a Duration is an invalid value, not a panic.
        total = total.checked_add(Duration::try_from_secs_f64(n * secs).ok()?)?;
    }
    Some(total)
}

fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
}

/// Expand a leading `~` to the home directory.
pub fn expand_home(v: &str) -> PathBuf {
    if let Some(rest) = v.strip_prefix('~') {
        if let Some(home) = home_dir() {
            return home.join(rest.trim_start_matches('/'));
        }
    }
    PathBuf::from(v)
}

/// The default client configuration file, found the way go-choria's `UserConfig` does:
/// `~/.choriarc`, `~/.mcollective`, `/etc/choria/client.conf`,
/// `/usr/local/etc/choria/client.conf`, else `/etc/puppetlabs/mcollective/client.cfg`.
pub fn user_config_path() -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(home) = home_dir() {
        candidates.push(home.join(".choriarc"));
        candidates.push(home.join(".mcollective"));
    }
    candidates.push(PathBuf::from("/etc/choria/client.conf"));
    candidates.push(PathBuf::from("/usr/local/etc/choria/client.conf"));
    candidates
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/etc/puppetlabs/mcollective/client.cfg"))
}

/// The default identity: the host name (go-choria prefers a fully qualified one; no DNS or
/// facter lookup is done here).
fn default_identity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "localhost".to_string())
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl ChoriaConfig {
    /// Read and parse a configuration file.
    pub fn load(path: &Path) -> Result<Self, ChoriaConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ChoriaConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg = Self::parse_str(&text)?;
        cfg.path = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Parse configuration text. The `MCOLLECTIVE_NATS_USERNAME` and
    /// `MCOLLECTIVE_NATS_PASSWORD` environment variables fill in NATS credentials that the file
    /// does not set.
    pub fn parse_str(text: &str) -> Result<Self, ChoriaConfigError> {
        let mut raw = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            raw.insert(k.trim().to_string(), v.trim().to_string());
        }
        Self::from_map(raw)
    }

    fn from_map(raw: BTreeMap<String, String>) -> Result<Self, ChoriaConfigError> {
        let get = |k: &str| raw.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let path = |k: &str| get(k).map(expand_home);
        let provider = match get("plugin.security.provider").unwrap_or("puppet") {
            "file" => SecurityProvider::File,
            "choria" => SecurityProvider::Choria,
            other => SecurityProvider::Other(other.to_string()),
        };
        let collectives = match get("collectives") {
            Some(v) => list(v),
            None if provider == SecurityProvider::Choria => vec!["choria".to_string()],
            None => vec!["mcollective".to_string()],
        };
        let main_collective = get("main_collective")
            .map(str::to_string)
            .or_else(|| collectives.first().cloned())
            .unwrap_or_else(|| "mcollective".to_string());
        let invalid = |key: &str, value: &str, reason: &str| ChoriaConfigError::InvalidValue {
            key: key.to_string(),
            value: value.to_string(),
            reason: reason.to_string(),
        };
        let ttl = match get("ttl") {
            Some(v) => v
                .parse::<u32>()
                .map_err(|_| invalid("ttl", v, "not a whole number of seconds"))?,
            None => 60,
        };
        let duration = |key: &str, default: Duration| match get(key) {
            Some(v) => parse_duration(v).ok_or_else(|| invalid(key, v, "not a duration")),
            None => Ok(default),
        };
        let discovery_timeout = duration("discovery_timeout", Duration::from_secs(2))?;
        let connect_timeout = duration(
            "plugin.choria.network.connect_timeout",
            Duration::from_secs(2),
        )?
        .min(Duration::from_secs(120));
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Ok(ChoriaConfig {
            path: None,
            identity: get("identity")
                .map(str::to_string)
                .unwrap_or_else(default_identity),
            middleware_hosts: get("plugin.choria.middleware_hosts")
                .map(list)
                .unwrap_or_default(),
            file_certificate: path("plugin.security.file.certificate"),
            file_key: path("plugin.security.file.key"),
            file_ca: path("plugin.security.file.ca"),
            choria_token_file: path("plugin.security.choria.token_file"),
            choria_seed_file: path("plugin.security.choria.seed_file"),
            choria_ca: path("plugin.security.choria.ca"),
            choria_certificate: path("plugin.security.choria.certificate"),
            choria_key: path("plugin.security.choria.key"),
            nats_user: get("plugin.nats.user")
                .map(str::to_string)
                .or_else(|| env("MCOLLECTIVE_NATS_USERNAME")),
            nats_pass: get("plugin.nats.pass")
                .map(str::to_string)
                .or_else(|| env("MCOLLECTIVE_NATS_PASSWORD")),
            nats_credentials: path("plugin.nats.credentials"),
            ttl,
            discovery_timeout,
            connect_timeout,
            loglevel: get("loglevel").unwrap_or("info").to_string(),
            logfile: get("logfile").unwrap_or("stdout").to_string(),
            disable_tls: false,
            insecure: false,
            security_provider: provider,
            collectives,
            main_collective,
            raw,
        })
    }

    /// Apply the provisioner's overrides: collectives and main collective forced to
    /// `provisioning`, log level and file copied over, `--debug` forcing `debug`, insecure
    /// mode turning TLS and signing off and selecting the file provider, and the broker
    /// provisioning password selecting NATS user `provisioner`.
    pub fn apply_provisioner_overrides(&mut self, o: &ProvisionerOverrides) {
        if let Some(l) = &o.loglevel {
            self.loglevel = l.clone();
        }
        if let Some(f) = &o.logfile {
            self.logfile = f.clone();
        }
        self.collectives = vec!["provisioning".to_string()];
        self.main_collective = "provisioning".to_string();
        if o.debug {
            self.loglevel = "debug".to_string();
        }
        if o.insecure {
            self.disable_tls = true;
            self.insecure = true;
            self.security_provider = SecurityProvider::File;
        }
        if let Some(p) = o
            .broker_provisioning_password
            .as_ref()
            .filter(|p| !p.is_empty())
        {
            self.nats_user = Some("provisioner".to_string());
            self.nats_pass = Some(p.clone());
        }
    }

    /// The file provider's certname: `MCOLLECTIVE_CERTNAME`, else `<USER>.mcollective` for a
    /// non-root user with `USER` set, else the configured identity.
    pub fn certname(&self) -> String {
        if let Ok(c) = std::env::var("MCOLLECTIVE_CERTNAME") {
            if !c.is_empty() {
                return c;
            }
        }
        if !running_as_root() {
            if let Ok(u) = std::env::var("USER") {
                if !u.is_empty() {
                    return format!("{u}.mcollective");
                }
            }
        }
        self.identity.clone()
    }

    /// The security mode to sign requests with. Insecure mode needs no files; the file
    /// provider reads its certificate and key; the choria provider its token and seed.
    pub fn security(&self) -> Result<Security, ChoriaConfigError> {
        if self.insecure {
            return Ok(Security::insecure(format!("choria={}", self.certname())));
        }
        match &self.security_provider {
            SecurityProvider::File => {
                let missing = |key| ChoriaConfigError::MissingSetting {
                    provider: "file".into(),
                    key,
                };
                let cert = self
                    .file_certificate
                    .as_deref()
                    .ok_or_else(|| missing("plugin.security.file.certificate"))?;
                let key = self
                    .file_key
                    .as_deref()
                    .ok_or_else(|| missing("plugin.security.file.key"))?;
                Ok(Security::x509_from_files(
                    format!("choria={}", self.certname()),
                    cert,
                    key,
                )?)
            }
            SecurityProvider::Choria => {
                let missing = |key| ChoriaConfigError::MissingSetting {
                    provider: "choria".into(),
                    key,
                };
                let token = self
                    .choria_token_file
                    .as_deref()
                    .ok_or_else(|| missing("plugin.security.choria.token_file"))?;
                let seed = self
                    .choria_seed_file
                    .as_deref()
                    .ok_or_else(|| missing("plugin.security.choria.seed_file"))?;
                Ok(Security::choria_from_files(token, seed)?)
            }
            SecurityProvider::Other(p) => Err(ChoriaConfigError::UnsupportedProvider(p.clone())),
        }
    }

    /// Middleware URLs (`nats://host:port`), from `plugin.choria.middleware_hosts`; a host
    /// without a scheme gets `nats`. With no hosts configured this is an error, as SRV
    /// lookups are not done.
    pub fn middleware_urls(&self) -> Result<Vec<String>, ChoriaConfigError> {
        if self.middleware_hosts.is_empty() {
            return Err(ChoriaConfigError::NoMiddlewareHosts);
        }
        self.middleware_hosts
            .iter()
            .map(|h| parse_middleware_host(h))
            .collect()
    }
}

/// Normalise one middleware host entry to `scheme://host:port`.
pub fn parse_middleware_host(h: &str) -> Result<String, ChoriaConfigError> {
    let bad = || ChoriaConfigError::InvalidMiddlewareHost(h.to_string());
    let h = h.trim();
    let (scheme, rest) = match h.split_once("://") {
        Some((s, r)) if !s.is_empty() => (s, r),
        Some(_) => return Err(bad()),
        None => ("nats", h),
    };
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.trim_end_matches('/').parse().map_err(|_| bad())?;
    if host.is_empty() || host.contains('/') {
        return Err(bad());
    }
    Ok(format!("{scheme}://{host}:{port}"))
}

fn running_as_root() -> bool {
    // Without libc calls: the effective uid is in /proc/self/status ("Uid: real effective ...").
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SAMPLE: &str = "
# a comment
identity = prov.example.net
collectives = mcollective, other
plugin.choria.middleware_hosts = broker1:4222,tls://broker2.example.net:4443 , nats://b3:4222
plugin.security.provider = file
plugin.security.file.certificate = ~/cert.pem
plugin.security.file.key=/k.pem
plugin.nats.user = alice
plugin.nats.pass = a=b
ttl = 90
discovery_timeout = 3
plugin.choria.network.connect_timeout = 1m30s
plugin.security.issuer.names = acme
  plugin.security.issuer.acme.public = abcd
ttl = 120
";

    #[test]
    fn parses_keys_comments_and_overrides() {
        let c = ChoriaConfig::parse_str(SAMPLE).unwrap();
        assert_eq!(c.identity, "prov.example.net");
        assert_eq!(c.collectives, vec!["mcollective", "other"]);
        assert_eq!(c.main_collective, "mcollective");
        assert_eq!(c.security_provider, SecurityProvider::File);
        assert_eq!(c.file_key.as_deref(), Some(Path::new("/k.pem")));
        assert!(
            !c.file_certificate
                .as_ref()
                .unwrap()
                .to_string_lossy()
                .starts_with('~')
                || home_dir().is_none()
        );
        assert_eq!(c.nats_user.as_deref(), Some("alice"));
        assert_eq!(c.nats_pass.as_deref(), Some("a=b"));
        assert_eq!(c.ttl, 120, "a later line overrides an earlier one");
        assert_eq!(c.discovery_timeout, Duration::from_secs(3));
        assert_eq!(c.connect_timeout, Duration::from_secs(90));
        assert_eq!(c.raw["plugin.security.issuer.acme.public"], "abcd");
        assert_eq!(
            c.middleware_urls().unwrap(),
            vec![
                "nats://broker1:4222",
                "tls://broker2.example.net:4443",
                "nats://b3:4222"
            ]
        );
        assert!(
            !format!("{c:?}").contains("a=b"),
            "password leaked into Debug"
        );
    }

    #[test]
    fn debug_redacts_every_password_token_and_seed_and_shows_the_rest() {
        let mut c = ChoriaConfig::parse_str(
            "identity = prov.example.net\n\
             plugin.nats.user = alice\n\
             plugin.nats.pass = nats-5b0c3e-secret\n\
             plugin.choria.network.system.password = sys-91f0aa-secret\n\
             plugin.security.choria.token_file = /etc/p/signer.jwt\n\
             plugin.security.choria.seed_file = /etc/p/signer.seed\n\
             plugin.security.provisioning.token = tok-2d44e1-secret\n",
        )
        .unwrap();
        let text = format!("{c:?}");
        for secret in ["nats-5b0c3e", "sys-91f0aa", "tok-2d44e1"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        for shown in [
            "prov.example.net",
            "alice",
            "/etc/p/signer.jwt",
            "/etc/p/signer.seed",
            "plugin.nats.pass",
            "<redacted>",
        ] {
            assert!(text.contains(shown), "{shown} missing from {text}");
        }
        let o = ProvisionerOverrides {
            broker_provisioning_password: Some("prov-6a7c1d-secret".into()),
            loglevel: Some("warn".into()),
            ..Default::default()
        };
        let text = format!("{o:?} {o:#?}");
        assert!(!text.contains("prov-6a7c1d"), "{text}");
        assert!(
            text.contains("<redacted>") && text.contains("warn"),
            "{text}"
        );
        // The override lands in nats_pass, which is redacted too.
        c.apply_provisioner_overrides(&o);
        let text = format!("{c:#?}");
        assert!(!text.contains("prov-6a7c1d"), "{text}");
        assert!(!text.contains("nats-5b0c3e"), "{text}");
    }

    #[test]
    fn defaults_apply() {
        let c = ChoriaConfig::parse_str("").unwrap();
        assert_eq!(c.collectives, vec!["mcollective"]);
        assert_eq!(c.main_collective, "mcollective");
        assert_eq!(c.ttl, 60);
        assert_eq!(c.loglevel, "info");
        assert_eq!(c.logfile, "stdout");
        assert_eq!(
            c.security_provider,
            SecurityProvider::Other("puppet".into())
        );
        assert!(!c.identity.is_empty());
        assert!(matches!(
            c.middleware_urls(),
            Err(ChoriaConfigError::NoMiddlewareHosts)
        ));
        let c = ChoriaConfig::parse_str("plugin.security.provider = choria").unwrap();
        assert_eq!(c.collectives, vec!["choria"]);
    }

    #[test]
    fn provisioner_overrides_follow_the_go_provisioner() {
        let mut c = ChoriaConfig::parse_str(SAMPLE).unwrap();
        c.apply_provisioner_overrides(&ProvisionerOverrides {
            insecure: true,
            broker_provisioning_password: Some("s3cret".into()),
            loglevel: Some("warn".into()),
            logfile: Some("/var/log/p.log".into()),
            debug: true,
        });
        assert_eq!(c.collectives, vec!["provisioning"]);
        assert_eq!(c.main_collective, "provisioning");
        assert_eq!(c.loglevel, "debug");
        assert_eq!(c.logfile, "/var/log/p.log");
        assert!(c.disable_tls && c.insecure);
        assert_eq!(c.nats_user.as_deref(), Some("provisioner"));
        assert_eq!(c.nats_pass.as_deref(), Some("s3cret"));
        let sec = c.security().unwrap();
        assert!(sec.caller_id().starts_with("choria="));
        assert_eq!(sec.version(), crate::protocol::ProtocolVersion::V1);

        let mut c = ChoriaConfig::parse_str("plugin.security.provider = puppet").unwrap();
        c.apply_provisioner_overrides(&ProvisionerOverrides {
            loglevel: Some("warn".into()),
            ..Default::default()
        });
        assert_eq!(c.loglevel, "warn");
        assert!(!c.insecure);
        assert!(matches!(
            c.security(),
            Err(ChoriaConfigError::UnsupportedProvider(_))
        ));
    }

    #[test]
    fn middleware_host_table() {
        for (input, want) in [
            ("h:4222", Some("nats://h:4222")),
            ("nats://h:1", Some("nats://h:1")),
            ("tls://10.0.0.1:4443", Some("tls://10.0.0.1:4443")),
            ("h", None),
            ("h:port", None),
            (":4222", None),
            ("://h:4222", None),
        ] {
            assert_eq!(
                parse_middleware_host(input).ok().as_deref(),
                want,
                "{input}"
            );
        }
    }

    #[test]
    fn booleans_and_durations() {
        for t in ["1", "yes", "TRUE", "y", "t"] {
            assert!(parse_bool(t));
        }
        for f in ["0", "no", "false", "n", "f", "maybe"] {
            assert!(!parse_bool(f));
        }
        assert_eq!(parse_duration("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("2s"), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h1m"), Some(Duration::from_secs(3660)));
        assert_eq!(parse_duration("x"), None);
        assert_eq!(parse_duration(""), None);
    }

    #[test]
    fn missing_security_files_are_reported_by_key() {
        let c = ChoriaConfig::parse_str("plugin.security.provider = file").unwrap();
        assert!(matches!(
            c.security(),
            Err(ChoriaConfigError::MissingSetting {
                key: "plugin.security.file.certificate",
                ..
            })
        ));
        let c = ChoriaConfig::parse_str(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = /nonexistent/t\nplugin.security.choria.seed_file = /nonexistent/s",
        )
        .unwrap();
        assert!(matches!(c.security(), Err(ChoriaConfigError::Security(_))));
    }

    #[test]
    fn file_provider_loads_real_files() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let c = ChoriaConfig::parse_str(&format!(
            "plugin.security.provider = file\nplugin.security.file.certificate = {dir}/testdata/x509_cert.pem\nplugin.security.file.key = {dir}/testdata/x509_key.pem\n"
        ))
        .unwrap();
        let sec = c.security().unwrap();
        assert!(matches!(sec, Security::X509 { .. }));
        let c = ChoriaConfig::parse_str(&format!(
            "plugin.security.provider = choria\nplugin.security.choria.token_file = {dir}/testdata/v2_caller.jwt\nplugin.security.choria.seed_file = {dir}/testdata/v2_seed.hex\n"
        ))
        .unwrap();
        let sec = c.security().unwrap();
        assert_eq!(sec.caller_id(), "provisioner_signer");
    }
}
