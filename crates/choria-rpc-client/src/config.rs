//! The Choria client configuration file (`key = value`) as far as a provisioner needs it, the
//! provisioner's overrides, identity and caller id rules, and middleware host parsing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::host::host_name;
use crate::protocol::{Security, SecurityError};
use crate::text::bounded;

mod go_keys;
pub use go_keys::{GO_CHORIA_KEYS, READ_KEYS};

/// The most a configuration file may hold; a larger one is refused rather than read.
const MAX_FILE: u64 = 1 << 20;

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
    /// The security provider is not one go-choria knows.
    #[error(
        "security provider {0} is unknown; the supported providers are puppet (the default), file and choria"
    )]
    UnsupportedProvider(String),
    /// A go-choria security provider this provisioner does not implement (`pkcs11`,
    /// `certmanager`), with what to use instead.
    #[error("the {provider} security provider is not supported by this provisioner: {instead}")]
    ProviderUnavailable {
        /// The provider.
        provider: &'static str,
        /// What to configure instead.
        instead: &'static str,
    },
    /// The puppet provider cannot find its ssldir or certname.
    #[error(transparent)]
    Puppet(#[from] PuppetError),
    /// Loading certificates, keys, seeds or tokens failed.
    #[error(transparent)]
    Security(#[from] SecurityError),
}

/// The security provider selected by `plugin.security.provider` (`puppet` when absent, as in
/// go-choria). Its `Display` is the name as written in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecurityProvider {
    /// x509 files (`plugin.security.file.*`), protocol v1.
    File,
    /// ed25519 seed and JWT (`plugin.security.choria.*`), protocol v2.
    Choria,
    /// x509 files in Puppet's ssldir, named after the certname ([`PuppetSettings`]), protocol v1.
    Puppet,
    /// go-choria's PKCS#11 provider: not supported here.
    Pkcs11,
    /// go-choria's Kubernetes cert-manager provider: not supported here.
    CertManager,
    /// A name go-choria does not know either.
    Other(String),
}

impl SecurityProvider {
    /// The provider for a `plugin.security.provider` value.
    pub fn from_name(name: &str) -> Self {
        match name {
            "file" => SecurityProvider::File,
            "choria" => SecurityProvider::Choria,
            "puppet" => SecurityProvider::Puppet,
            "pkcs11" => SecurityProvider::Pkcs11,
            "certmanager" => SecurityProvider::CertManager,
            other => SecurityProvider::Other(other.to_string()),
        }
    }

    /// The name as written in the configuration.
    pub fn name(&self) -> &str {
        match self {
            SecurityProvider::File => "file",
            SecurityProvider::Choria => "choria",
            SecurityProvider::Puppet => "puppet",
            SecurityProvider::Pkcs11 => "pkcs11",
            SecurityProvider::CertManager => "certmanager",
            SecurityProvider::Other(name) => name,
        }
    }

    /// Why this provider cannot be used, for the ones this provisioner does not implement.
    pub fn unsupported(&self) -> Option<ChoriaConfigError> {
        match self {
            SecurityProvider::Pkcs11 => Some(ChoriaConfigError::ProviderUnavailable {
                provider: "pkcs11",
                instead: "give the provisioner a certificate and RSA key in files (issued by the \
                          same CA) and set plugin.security.provider = file with \
                          plugin.security.file.certificate, plugin.security.file.key and \
                          plugin.security.file.ca, or use the choria provider with a seed and JWT",
            }),
            SecurityProvider::CertManager => Some(ChoriaConfigError::ProviderUnavailable {
                provider: "certmanager",
                instead: "write the certificate, key and CA cert-manager issues (the Secret's \
                          tls.crt, tls.key and ca.crt) to files and set plugin.security.provider \
                          = file with plugin.security.file.certificate, plugin.security.file.key \
                          and plugin.security.file.ca naming them",
            }),
            SecurityProvider::Other(name) => {
                Some(ChoriaConfigError::UnsupportedProvider(bounded(name)))
            }
            SecurityProvider::File | SecurityProvider::Choria | SecurityProvider::Puppet => None,
        }
    }
}

impl std::fmt::Display for SecurityProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&bounded(self.name()))
    }
}

/// Puppet's ssldir for root as Puppet's packages (AIO) install it.
pub const PUPPET_ROOT_SSLDIR: &str = "/etc/puppetlabs/puppet/ssl";

/// What a Choria client's certname ends in: `<USER>.mcollective`, as go-choria's default
/// client identity suffix.
pub const CLIENT_CERTNAME_SUFFIX: &str = "mcollective";

/// Why the puppet provider cannot find its files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PuppetError {
    /// Neither `MCOLLECTIVE_CERTNAME` nor `USER` is set.
    #[error(
        "the puppet security provider cannot name the provisioner's certificate: neither \
         MCOLLECTIVE_CERTNAME nor USER is set (a Choria client's certname is <USER>.mcollective); \
         set MCOLLECTIVE_CERTNAME to the certname of the provisioner's certificate in its ssldir"
    )]
    NoCertname,
    /// Not root, no `plugin.choria.ssldir` and no `HOME`.
    #[error(
        "the puppet security provider cannot find the ssldir: HOME is not set for this non-root \
         user; set plugin.choria.ssldir"
    )]
    NoHome,
    /// The certname cannot name a file.
    #[error(
        "the puppet security provider cannot use certname \"{certname}\" from {from}: a certname \
         names files in the ssldir, so it must be a non-empty name without '/'"
    )]
    InvalidCertname {
        /// The certname, escaped and bounded.
        certname: String,
        /// Where it came from.
        from: CertnameSource,
    },
}

/// Where the puppet provider's ssldir came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslDirSource {
    /// `plugin.choria.ssldir`.
    Setting,
    /// Root without `plugin.choria.ssldir`: [`PUPPET_ROOT_SSLDIR`].
    RootDefault,
    /// Another user without `plugin.choria.ssldir`: `$HOME/.puppetlabs/etc/puppet/ssl`.
    UserDefault,
}

impl std::fmt::Display for SslDirSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SslDirSource::Setting => "plugin.choria.ssldir",
            SslDirSource::RootDefault => {
                "Puppet's default for root, puppet is not asked; set plugin.choria.ssldir if \
                 puppet.conf moves it"
            }
            SslDirSource::UserDefault => {
                "Puppet's default for a non-root user, under HOME; set plugin.choria.ssldir to \
                 use another"
            }
        })
    }
}

/// Where the puppet provider's certname came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertnameSource {
    /// The `MCOLLECTIVE_CERTNAME` environment variable.
    Environment,
    /// `<USER>.mcollective`.
    User,
}

impl std::fmt::Display for CertnameSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CertnameSource::Environment => "MCOLLECTIVE_CERTNAME",
            CertnameSource::User => "USER, as <USER>.mcollective",
        })
    }
}

/// The puppet provider's ssldir and certname, resolved as go-choria's `puppetsec` does for a
/// client (the provisioner is one): the certname is `MCOLLECTIVE_CERTNAME`, else
/// `<USER>.mcollective` (for root too: `root.mcollective`); the ssldir is
/// `plugin.choria.ssldir`, else `$HOME/.puppetlabs/etc/puppet/ssl` for a non-root user, else
/// [`PUPPET_ROOT_SSLDIR`]. (For root go-choria asks `puppet apply --configprint ssldir`; this
/// provisioner runs no Puppet process and uses Puppet's packaged default instead.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PuppetSettings {
    /// The ssldir.
    pub ssldir: PathBuf,
    /// Where it came from.
    pub ssldir_from: SslDirSource,
    /// The certname: the caller id is `choria=<certname>`.
    pub certname: String,
    /// Where it came from.
    pub certname_from: CertnameSource,
}

impl PuppetSettings {
    /// Resolve the ssldir and certname from `plugin.choria.ssldir` (`ssldir`), whether the
    /// process runs as root and the environment (`env`: a variable's value, `None` when unset).
    /// Empty variables count as unset.
    pub fn resolve(
        ssldir: Option<&Path>,
        root: bool,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, PuppetError> {
        let var = |k: &str| env(k).filter(|v| !v.is_empty());
        let (certname, certname_from) = match var("MCOLLECTIVE_CERTNAME") {
            Some(c) => (c, CertnameSource::Environment),
            None => match var("USER") {
                Some(u) => (
                    format!("{u}.{CLIENT_CERTNAME_SUFFIX}"),
                    CertnameSource::User,
                ),
                None => return Err(PuppetError::NoCertname),
            },
        };
        if certname.contains(['/', '\0']) || certname == "." || certname == ".." {
            return Err(PuppetError::InvalidCertname {
                certname: bounded(&certname),
                from: certname_from,
            });
        }
        let (ssldir, ssldir_from) = match ssldir.filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => (d.to_path_buf(), SslDirSource::Setting),
            None if root => (PathBuf::from(PUPPET_ROOT_SSLDIR), SslDirSource::RootDefault),
            None => match var("HOME") {
                Some(home) => (
                    Path::new(&home).join(".puppetlabs/etc/puppet/ssl"),
                    SslDirSource::UserDefault,
                ),
                None => return Err(PuppetError::NoHome),
            },
        };
        Ok(PuppetSettings {
            ssldir,
            ssldir_from,
            certname,
            certname_from,
        })
    }

    /// `certs/<certname>.pem` in the ssldir.
    pub fn certificate(&self) -> PathBuf {
        self.ssldir
            .join("certs")
            .join(format!("{}.pem", self.certname))
    }

    /// `private_keys/<certname>.pem` in the ssldir.
    pub fn key(&self) -> PathBuf {
        self.ssldir
            .join("private_keys")
            .join(format!("{}.pem", self.certname))
    }

    /// `certs/ca.pem` in the ssldir.
    pub fn ca(&self) -> PathBuf {
        self.ssldir.join("certs").join("ca.pem")
    }
}

/// The file provider's certname as go-choria's `filesec` names a client:
/// `MCOLLECTIVE_CERTNAME`, else `<USER>.mcollective` for a non-root user with `USER` set, else
/// the configured identity.
pub fn file_certname(identity: &str, root: bool, env: impl Fn(&str) -> Option<String>) -> String {
    let var = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(c) = var("MCOLLECTIVE_CERTNAME") {
        return c;
    }
    if !root {
        if let Some(u) = var("USER") {
            return format!("{u}.{CLIENT_CERTNAME_SUFFIX}");
        }
    }
    identity.to_string()
}

/// The process environment, for [`PuppetSettings::resolve`] and [`file_certname`].
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok()
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
    /// `plugin.security.file.certificate`; with the puppet provider, `certs/<certname>.pem`
    /// in the ssldir (go-choria's puppet provider is the file provider with these paths).
    pub file_certificate: Option<PathBuf>,
    /// `plugin.security.file.key`; with the puppet provider, `private_keys/<certname>.pem`.
    pub file_key: Option<PathBuf>,
    /// `plugin.security.file.ca`; with the puppet provider, `certs/ca.pem`.
    pub file_ca: Option<PathBuf>,
    /// With the puppet provider: its ssldir and certname, or why they cannot be found.
    pub puppet: Option<Result<PuppetSettings, PuppetError>>,
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
    /// The files `plugin.d/` beside the file added, in the order they were read (go-choria
    /// reads `*.cfg` and `*.conf` there; `choria.cfg`'s keys are `plugin.choria.<key>`).
    pub plugin_files: Vec<PathBuf>,
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
            puppet,
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
            plugin_files,
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
            .field("puppet", puppet)
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
            .field("plugin_files", plugin_files)
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

/// The fully qualified name `/etc/hosts` gives `short` (what `hostname -f` finds through the
/// files source): the first name with a dot on a line that names `short`.
fn hosts_fqdn(short: &str, hosts: &str) -> Option<String> {
    hosts.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let _address = words.next()?;
        let names: Vec<&str> = words.collect();
        if !names.iter().any(|n| n.eq_ignore_ascii_case(short)) {
            return None;
        }
        names
            .iter()
            .find(|n| {
                n.contains('.')
                    && n.to_ascii_lowercase()
                        .starts_with(&format!("{}.", short.to_ascii_lowercase()))
            })
            .map(|n| n.trim_end_matches('.').to_string())
    })
}

/// The default identity as go-choria finds it: the host name when it has two or more dots,
/// else its fully qualified name (`/etc/hosts`, else the host name and the domain facter would
/// report), else the short host name; `localhost` only when the kernel has no name at all.
fn default_identity() -> String {
    let name = host_name();
    if name.is_empty() {
        return "localhost".to_string();
    }
    if name.matches('.').count() >= 2 {
        return name;
    }
    let short = name.split('.').next().unwrap_or(&name).to_string();
    let hosts = std::fs::read("/etc/hosts").unwrap_or_default();
    let hosts = String::from_utf8_lossy(&hosts[..hosts.len().min(1 << 20)]).into_owned();
    if let Some(fqdn) = hosts_fqdn(&short, &hosts) {
        return fqdn;
    }
    if let Some(domain) = crate::host::host_domain() {
        if !name.contains('.') {
            return format!("{name}.{domain}");
        }
    }
    name
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `key = value` lines into `raw`, each key prefixed with `prefix`: blank lines and `#`
/// comments skipped, a line without `=` or without a value ignored (go-choria's
/// `(.+?)\s*=\s*(.+)`), a later key winning.
fn parse_lines(text: &str, prefix: &str, raw: &mut BTreeMap<String, String>) {
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() {
            continue;
        }
        raw.insert(format!("{prefix}{k}"), v.to_string());
    }
}

/// A configuration file's text, refused beyond [`MAX_FILE`] bytes.
fn read_bounded(path: &Path) -> Result<String, ChoriaConfigError> {
    use std::io::Read as _;
    let io = |source| ChoriaConfigError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE + 1).read_to_string(&mut text))
        .map_err(io)?;
    if text.len() as u64 > MAX_FILE {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_FILE} bytes"),
        )));
    }
    Ok(text)
}

/// The `plugin.d` directory go-choria reads beside `config`: none for a file under `home`.
fn plugin_dir(config: &Path, home: Option<PathBuf>) -> Option<PathBuf> {
    let config = std::path::absolute(config).unwrap_or_else(|_| config.to_path_buf());
    // go-choria compares the strings: /home/a covers /home/ab/x too. A service account whose
    // home is `/` would cover every file, so `/` counts as no home.
    if let Some(home) = home.filter(|h| !h.as_os_str().is_empty() && h != Path::new("/")) {
        if config
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(home.as_os_str().as_encoded_bytes())
        {
            return None;
        }
    }
    Some(config.parent()?.join("plugin.d"))
}

/// The `*.cfg` and `*.conf` files of `dir` in name order (none when it is not a directory).
fn plugin_dir_files(dir: &Path) -> Result<Vec<PathBuf>, ChoriaConfigError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let io = |source| ChoriaConfigError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let ext = path.extension().and_then(|e| e.to_str());
        if matches!(ext, Some("cfg" | "conf")) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

impl ChoriaConfig {
    /// Read and parse a configuration file, with the `plugin.d/` directory beside it as
    /// go-choria reads it: every `*.cfg` and `*.conf` file there in name order, a line
    /// `key = value` of `<plugin>.cfg` standing for `plugin.<plugin>.key = value`. go-choria
    /// applies only `choria.cfg`'s to its settings (the others are options of agents a
    /// provisioner does not run), and so does this; they win over the main file. No
    /// `plugin.d/` is read for a file under the user's home directory, as in go-choria.
    pub fn load(path: &Path) -> Result<Self, ChoriaConfigError> {
        let mut raw = BTreeMap::new();
        parse_lines(&read_bounded(path)?, "", &mut raw);
        let mut plugin_files = Vec::new();
        if let Some(dir) = plugin_dir(path, std::env::var_os("HOME").map(PathBuf::from)) {
            for file in plugin_dir_files(&dir)? {
                let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name == "choria.cfg" {
                    parse_lines(&read_bounded(&file)?, "plugin.choria.", &mut raw);
                }
                plugin_files.push(file);
            }
        }
        let mut cfg = Self::from_map(raw)?;
        cfg.path = Some(path.to_path_buf());
        cfg.plugin_files = plugin_files;
        Ok(cfg)
    }

    /// The go-choria keys set in this configuration that this client does not read, so
    /// setting them changes nothing here (go-choria would act on them).
    pub fn unread_go_keys(&self) -> Vec<&str> {
        self.raw
            .keys()
            .map(String::as_str)
            .filter(|k| GO_CHORIA_KEYS.contains(k) && !READ_KEYS.contains(k))
            .collect()
    }

    /// Parse configuration text. The `MCOLLECTIVE_NATS_USERNAME` and
    /// `MCOLLECTIVE_NATS_PASSWORD` environment variables fill in NATS credentials that the file
    /// does not set.
    pub fn parse_str(text: &str) -> Result<Self, ChoriaConfigError> {
        let mut raw = BTreeMap::new();
        parse_lines(text, "", &mut raw);
        Self::from_map(raw)
    }

    fn from_map(raw: BTreeMap<String, String>) -> Result<Self, ChoriaConfigError> {
        let get = |k: &str| raw.get(k).map(String::as_str).filter(|v| !v.is_empty());
        let path = |k: &str| get(k).map(expand_home);
        let provider =
            SecurityProvider::from_name(get("plugin.security.provider").unwrap_or("puppet"));
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
            Some(v) => crate::duration::parse_seconds_or_unit(v)
                .map_err(|_| invalid(key, v, "not a duration")),
            None => Ok(default),
        };
        let discovery_timeout = duration("discovery_timeout", Duration::from_secs(2))?;
        let connect_timeout = duration(
            "plugin.choria.network.connect_timeout",
            Duration::from_secs(2),
        )?
        .min(Duration::from_secs(120));
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let puppet = (provider == SecurityProvider::Puppet).then(|| {
            PuppetSettings::resolve(
                path("plugin.choria.ssldir").as_deref(),
                running_as_root(),
                process_env,
            )
        });
        let (file_certificate, file_key, file_ca) = match &puppet {
            Some(Ok(p)) => (Some(p.certificate()), Some(p.key()), Some(p.ca())),
            Some(Err(_)) => (None, None, None),
            None => (
                path("plugin.security.file.certificate"),
                path("plugin.security.file.key"),
                path("plugin.security.file.ca"),
            ),
        };
        Ok(ChoriaConfig {
            path: None,
            identity: get("identity")
                .map(str::to_string)
                .unwrap_or_else(default_identity),
            middleware_hosts: get("plugin.choria.middleware_hosts")
                .map(list)
                .unwrap_or_default(),
            file_certificate,
            file_key,
            file_ca,
            puppet,
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
            plugin_files: Vec::new(),
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
            if self.security_provider != SecurityProvider::File {
                // As in go-choria: the file provider with its own settings, not the files the
                // previous provider would have used.
                self.security_provider = SecurityProvider::File;
                self.puppet = None;
                let path = |k: &str| {
                    self.raw
                        .get(k)
                        .map(String::as_str)
                        .filter(|v| !v.is_empty())
                        .map(expand_home)
                };
                self.file_certificate = path("plugin.security.file.certificate");
                self.file_key = path("plugin.security.file.key");
                self.file_ca = path("plugin.security.file.ca");
            }
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

    /// The certname of the caller id `choria=<certname>`: with the puppet provider its
    /// resolved certname ([`PuppetSettings`]), `None` when that cannot be found; otherwise the
    /// file provider's ([`file_certname`]).
    pub fn caller_certname(&self) -> Option<String> {
        match &self.puppet {
            Some(Ok(p)) if self.security_provider == SecurityProvider::Puppet => {
                Some(p.certname.clone())
            }
            Some(Err(_)) if self.security_provider == SecurityProvider::Puppet => None,
            _ => Some(file_certname(
                &self.identity,
                running_as_root(),
                process_env,
            )),
        }
    }

    /// The puppet provider's ssldir and certname: as resolved when the file was read, resolved
    /// again only when the provider was changed afterwards.
    pub fn puppet_settings(&self) -> Result<PuppetSettings, PuppetError> {
        match &self.puppet {
            Some(r) => r.clone(),
            None => PuppetSettings::resolve(
                self.raw
                    .get("plugin.choria.ssldir")
                    .filter(|v| !v.is_empty())
                    .map(|v| expand_home(v))
                    .as_deref(),
                running_as_root(),
                process_env,
            ),
        }
    }

    /// The file provider's certname ([`file_certname`] with this process's user and
    /// environment).
    pub fn certname(&self) -> String {
        file_certname(&self.identity, running_as_root(), process_env)
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
            SecurityProvider::Puppet => {
                let p = self.puppet_settings()?;
                Ok(Security::x509_from_files(
                    format!("choria={}", p.certname),
                    &p.certificate(),
                    &p.key(),
                )?)
            }
            other => Err(other
                .unsupported()
                .unwrap_or_else(|| ChoriaConfigError::UnsupportedProvider(other.to_string()))),
        }
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
mod tests;
