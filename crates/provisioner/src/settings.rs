//! Both configurations, loaded once with the provisioner's overrides of the Choria
//! configuration, and the preflight that `check` prints and `run` refuses to start on.
//!
//! `run` and `check` share everything here, so the daemon never starts with a setup `check`
//! calls broken, and `check` never passes a setup the daemon refuses.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use choria_rpc_client::config::{
    ChoriaConfig, ProvisionerOverrides, PuppetError, SecurityProvider,
};
use choria_rpc_client::connection::{ConnectionError, ConnectionSettings};
use provision_core::KeyMaterial as _;

use crate::config::{Config, ConfigWarning};

use crate::keys::FileKeys;

/// Where the two configuration files are, as given on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Paths {
    /// The provisioner configuration (YAML); required.
    pub config: Option<PathBuf>,
    /// The Choria client configuration; `None` means the Choria user configuration.
    pub choria_config: Option<PathBuf>,
    /// `--debug`: the log level forced to debug.
    pub debug: bool,
}

impl Paths {
    /// Both files named.
    pub fn new(config: impl Into<PathBuf>, choria_config: impl Into<PathBuf>) -> Self {
        Paths {
            config: Some(config.into()),
            choria_config: Some(choria_config.into()),
            debug: false,
        }
    }
}

/// The bearer token in `path` (its first line), `None` for an empty path.
pub fn read_token(path: &str) -> Result<Option<String>> {
    if path.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read monitor_token_file {path}"))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        anyhow::bail!("monitor_token_file {path} is empty");
    }
    Ok(Some(token))
}

/// The status findings of these settings: the token file must be readable and not empty,
/// and the audit file's directory must exist.
fn status_preflight(cfg: &Config) -> Vec<String> {
    let mut fatal = Vec::new();
    if let Err(e) = read_token(&cfg.monitor_token_file) {
        fatal.push(crate::one_line(e.as_ref()));
    }
    if !cfg.audit_file.is_empty() {
        let dir = Path::new(&cfg.audit_file)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.is_dir() {
            fatal.push(format!(
                "audit_file {}: the directory {} does not exist",
                cfg.audit_file,
                dir.display()
            ));
        }
    }
    fatal
}

/// Both configurations, loaded, validated and with the provisioner's overrides applied.
pub struct Settings {
    /// The provisioner YAML.
    pub config: Config,
    /// Warnings found while loading it.
    pub warnings: Vec<ConfigWarning>,
    /// The Choria client configuration.
    pub choria: ChoriaConfig,
}

/// One finding of [`preflight`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The daemon cannot work with this: `check` fails and `run` refuses to start.
    Fatal(String),
    /// Worth knowing; nothing fails.
    Warning(String),
}

/// Collects findings.
#[derive(Default)]
struct Findings(Vec<Problem>);

impl Findings {
    fn fatal(&mut self, p: impl Into<String>) {
        self.0.push(Problem::Fatal(p.into()));
    }
    fn warn(&mut self, w: impl Into<String>) {
        self.0.push(Problem::Warning(w.into()));
    }
}

/// The Choria configuration file named on the command line, else the user's.
fn choria_path(args: &Paths) -> PathBuf {
    args.choria_config
        .clone()
        .unwrap_or_else(choria_rpc_client::config::user_config_path)
}

/// What the provisioner configuration changes in the Choria configuration.
fn overrides(config: &Config, debug: bool) -> ProvisionerOverrides {
    let set = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
    ProvisionerOverrides {
        insecure: config.choria_insecure,
        broker_provisioning_password: set(&config.broker_provisioning_password),
        loglevel: set(&config.loglevel),
        logfile: set(&config.logfile),
        debug,
    }
}

impl Settings {
    /// Load and validate both files for `run`, failing on the first error; nothing is opened
    /// or bound yet.
    pub fn load(args: &Paths) -> Result<Settings> {
        let debug = args.debug;
        let path = args.config.as_deref().context("--config is required")?;
        let loaded = Config::load(path).map_err(anyhow::Error::new)?;
        let choria_path = choria_path(args);
        let mut choria = ChoriaConfig::load(&choria_path).with_context(|| {
            format!(
                "cannot load the Choria configuration {}",
                choria_path.display()
            )
        })?;
        choria.apply_provisioner_overrides(&overrides(&loaded.config, debug));
        Ok(Settings {
            config: loaded.config,
            warnings: loaded.warnings,
            choria,
        })
    }
}

/// What `check` could load, with every problem found on the way.
pub struct CheckedSettings {
    /// The provisioner configuration, invalid values replaced by their defaults; `None` when
    /// the file cannot be read or parsed.
    pub config: Option<Config>,
    /// The Choria configuration with the overrides; `None` when it cannot be loaded.
    pub choria: Option<ChoriaConfig>,
    /// Loading problems and warnings, then the preflight's, in that order.
    pub problems: Vec<Problem>,
}

impl CheckedSettings {
    /// Load both files as far as they go, listing every problem rather than the first, and run
    /// the preflight on whatever loaded. With no fatal problem in loading this is exactly
    /// [`Settings::load`] followed by [`preflight`].
    pub fn load(args: &Paths) -> CheckedSettings {
        let debug = args.debug;
        let mut f = Findings::default();
        // Every validation problem is listed; the rest of the checks go on with defaults in
        // place of the invalid values.
        let config = match args.config.as_deref().map(Config::load_all) {
            Some(Ok(checked)) => {
                for e in checked.errors {
                    f.fatal(e.to_string());
                }
                for w in checked.loaded.warnings {
                    f.warn(w.to_string());
                }
                Some(checked.loaded.config)
            }
            Some(Err(e)) => {
                f.fatal(e.to_string());
                None
            }
            None => {
                f.fatal("--config is required");
                None
            }
        };
        let choria_path = choria_path(args);
        let choria = match ChoriaConfig::load(&choria_path) {
            Ok(mut c) => {
                if let Some(cfg) = &config {
                    c.apply_provisioner_overrides(&overrides(cfg, debug));
                }
                Some(c)
            }
            Err(e) => {
                f.fatal(format!(
                    "Choria configuration {}: {e}",
                    choria_path.display()
                ));
                None
            }
        };
        let mut problems = f.0;
        if let Some(cfg) = &config {
            problems.extend(preflight_config(cfg));
        }
        if let Some(c) = &choria {
            problems.extend(preflight_choria(c));
        }
        problems.extend(
            readable_secrets(config.as_ref(), choria.as_ref())
                .into_iter()
                .map(Problem::Warning),
        );
        CheckedSettings {
            config,
            choria,
            problems,
        }
    }
}

/// Everything that can be known about `settings` without connecting: the configuration's
/// warnings, the helper, every key file named, the Choria security files and the broker URLs,
/// and the secrets others can read. A fatal problem is one the daemon would fail on anyway, at
/// start or for every node; the rest are warnings.
pub fn preflight(settings: &Settings) -> Vec<Problem> {
    let mut problems: Vec<Problem> = settings
        .warnings
        .iter()
        .map(|w| Problem::Warning(w.to_string()))
        .collect();
    problems.extend(preflight_config(&settings.config));
    problems.extend(
        status_preflight(&settings.config)
            .into_iter()
            .map(Problem::Fatal),
    );
    problems.extend(preflight_choria(&settings.choria));
    problems.extend(
        readable_secrets(Some(&settings.config), Some(&settings.choria))
            .into_iter()
            .map(Problem::Warning),
    );
    problems
}

/// The helper's program: it parses as a command line, exists, is a file and is executable.
fn check_helper(helper: &str, f: &mut Findings) {
    let Some(words) = shlex::split(helper) else {
        f.fatal(format!(
            "helper {} cannot be parsed as a command line",
            quoted(helper)
        ));
        return;
    };
    let Some(program) = words.first() else {
        f.fatal("no helper is configured");
        return;
    };
    let path = if program.contains('/') {
        Some(PathBuf::from(program))
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|c| c.is_file())
        })
    };
    match path.as_deref().map(std::fs::metadata) {
        Some(Ok(m)) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {}
        Some(Ok(_)) => f.fatal(format!("helper {program} is not an executable file")),
        Some(Err(e)) => f.fatal(format!("helper {program}: {e}")),
        None => f.fatal(format!("helper {program} is not found on PATH")),
    }
}

/// Every file holding a secret that someone other than the service can read, as warnings. The
/// daemon logs the same list at start.
///
/// Key files (`jwt_signing_key`, the file provider's key, the choria provider's seed) should be
/// the owner's alone (root under the packaged unit): any group or other permission is reported. The provisioner YAML
/// (when it sets `token` or `broker_provisioning_password`) and the Choria configuration (when
/// it sets `plugin.nats.pass`) are installed `root:root` 0640: they are reported when others can
/// read them, or a group other than the service's (the group this process runs as, or a
/// `choria-provisioner` group left by an earlier package).
fn readable_secrets(config: Option<&Config>, choria: Option<&ChoriaConfig>) -> Vec<String> {
    let mut out = Vec::new();
    let service_groups = service_groups();
    if let Some(cfg) = config {
        let mut held = Vec::new();
        if !cfg.provision.token().is_empty() {
            held.push("token");
        }
        if !cfg.broker_provisioning_password.is_empty() {
            held.push("broker_provisioning_password");
        }
        if !held.is_empty() {
            config_file_readable(
                &cfg.file,
                "the provisioner configuration",
                &held.join(" and "),
                &service_groups,
                &mut out,
            );
        }
        if !cfg.jwt_signing_key.is_empty() {
            key_file_readable(Path::new(&cfg.jwt_signing_key), "jwt_signing_key", &mut out);
        }
        if !cfg.webhook.tls_key.is_empty() {
            key_file_readable(Path::new(&cfg.webhook.tls_key), "helper_tls_key", &mut out);
        }
    }
    if let Some(c) = choria {
        let pass_in_file = c
            .raw
            .get("plugin.nats.pass")
            .is_some_and(|p| !p.trim().is_empty());
        if let (true, Some(path)) = (pass_in_file, c.path.as_deref()) {
            config_file_readable(
                path,
                "the Choria configuration",
                "plugin.nats.pass",
                &service_groups,
                &mut out,
            );
        }
        if let Some(k) = &c.file_key {
            let what = match c.security_provider {
                SecurityProvider::Puppet => "the puppet provider's private key",
                _ => "plugin.security.file.key",
            };
            key_file_readable(k, what, &mut out);
        }
        if let Some(s) = &c.choria_seed_file {
            key_file_readable(s, "plugin.security.choria.seed_file", &mut out);
        }
    }
    out
}

/// A key file should not be readable by group or others.
fn key_file_readable(path: &Path, what: &str, out: &mut Vec<String>) {
    if let Ok(m) = std::fs::metadata(path) {
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            out.push(format!(
                "{what} {} is readable by group or others (mode {mode:o})",
                path.display()
            ));
        }
    }
}

/// A configuration file holding `secret` should be readable by its owner and the service's
/// group only.
fn config_file_readable(
    path: &Path,
    what: &str,
    secret: &str,
    service_groups: &[u32],
    out: &mut Vec<String>,
) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(m) = std::fs::metadata(path) else {
        return;
    };
    let mode = m.permissions().mode() & 0o777;
    let who = if mode & 0o004 != 0 {
        "every local user".to_string()
    } else if mode & 0o040 != 0 && !service_groups.contains(&m.gid()) {
        format!(
            "group {} (not the service's group)",
            group_name(m.gid()).unwrap_or_else(|| m.gid().to_string())
        )
    } else {
        return;
    };
    out.push(format!(
        "{what} {} holds {secret} and is readable by {who} (mode {mode:o}); \
         make it readable by root only (chmod 0640 or 0600, owner and group root, as the \
         packages install it)",
        path.display()
    ));
}

/// The group the packages create for the service.
const SERVICE_GROUP: &str = "choria-provisioner";

/// The groups that may read the configuration: this process's effective group (the service's,
/// when the daemon runs) and the packages' service group when it exists.
fn service_groups() -> Vec<u32> {
    let mut groups = Vec::new();
    // Without libc calls: "Gid: real effective saved filesystem" in /proc/self/status.
    if let Some(egid) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Gid:"))
                .and_then(|l| l.split_whitespace().nth(2)?.parse::<u32>().ok())
        })
    {
        groups.push(egid);
    }
    if let Some(gid) = group_entries()
        .into_iter()
        .find(|(name, _)| name == SERVICE_GROUP)
        .map(|(_, gid)| gid)
    {
        groups.push(gid);
    }
    groups
}

/// `(name, gid)` of every group in /etc/group.
fn group_entries() -> Vec<(String, u32)> {
    std::fs::read_to_string("/etc/group")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            let gid = f.nth(1)?.parse().ok()?;
            Some((name.to_string(), gid))
        })
        .collect()
}

fn group_name(gid: u32) -> Option<String> {
    group_entries()
        .into_iter()
        .find(|(_, g)| *g == gid)
        .map(|(name, _)| name)
}

fn preflight_config(cfg: &Config) -> Vec<Problem> {
    let mut f = Findings::default();
    if helper_protocol::webhook::is_webhook(&cfg.helper) {
        // The webhook helper's URL, secret file and TLS files (helper.rs).
        f.0.extend(crate::helper::webhook_problems(cfg));
    } else {
        check_helper(&cfg.helper, &mut f);
        f.0.extend(crate::helper::unused_webhook_settings(cfg));
    }
    if cfg.provision.token().is_empty() {
        f.warn("no token is set: servers whose provisioning JWT carries a token will refuse every request");
    }
    if !cfg.loglevel.is_empty()
        && !["debug", "info", "warn", "error", "fatal"].contains(&cfg.loglevel.as_str())
    {
        f.warn(format!(
            "loglevel {} is not one of debug, info, warn, error, fatal: the log is written at \
             warning level (as the Go provisioner does)",
            quoted(&cfg.loglevel)
        ));
    }
    // The same reader the daemon's cycle uses for every node.
    let keys = FileKeys::new(Arc::new(cfg.clone()));
    if cfg.provision.features().jwt {
        if let Err(e) = keys.verify_key() {
            f.fatal(format!("jwt_verify_cert: {e}"));
        }
    }
    if cfg.provision.features().ed25519 {
        if cfg.jwt_signing_key.is_empty() {
            f.fatal("features.ed25519 needs jwt_signing_key");
        } else {
            match keys.signing_key() {
                Ok(data) => {
                    if let Err(e) = provision_core::jwt::SigningKey::from_key_data(data.as_bytes())
                    {
                        f.fatal(format!("jwt_signing_key {}: {e}", cfg.jwt_signing_key));
                    }
                }
                Err(e) => f.fatal(format!("jwt_signing_key {}: {e}", cfg.jwt_signing_key)),
            }
        }
        if !cfg.jwt_signing_token.is_empty() {
            match keys.signing_token() {
                Ok(t) => {
                    if let Err(e) =
                        provision_core::jwt::decode_unverified::<serde_json::Value>(t.trim())
                    {
                        f.fatal(format!("jwt_signing_token {}: {e}", cfg.jwt_signing_token));
                    }
                }
                Err(e) => f.fatal(format!("jwt_signing_token {}: {e}", cfg.jwt_signing_token)),
            }
        }
    }
    if !cfg.rego_policy.is_empty() {
        if let Err(e) = crate::rego::RegoPolicy::load(&cfg.rego_policy) {
            f.fatal(e.to_string());
        }
    }
    if cfg.provision.features().upgrades
        && cfg.provision.upgrades_repository().is_empty()
        && !cfg.provision.upgrades_optional()
    {
        f.warn("features.upgrades is on but upgrades_repository is empty: upgrades will fail");
    }
    f.0
}

fn preflight_choria(c: &ChoriaConfig) -> Vec<Problem> {
    let mut f = Findings::default();
    // What the connection refuses before trying the network: bad middleware hosts, a bad SRV
    // domain or CHORIA_PROVISIONER_DNS_SERVER, an unreadable or malformed credentials file.
    if let Err(e) = ConnectionSettings::from_config(c).and_then(|s| s.validate()) {
        if !matches!(e, ConnectionError::Config(_)) {
            f.fatal(format!("Choria configuration: {e}"));
        }
    }
    if c.insecure {
        return f.0;
    }
    if let Some(e) = c.security_provider.unsupported() {
        f.fatal(format!("Choria security: {e}"));
        return f.0;
    }
    let files = match security_files(c) {
        Ok(files) => files,
        Err(e) => {
            f.fatal(format!("Choria security: {e}"));
            return f.0;
        }
    };
    // Each file once, by what names it; the provider's own reading follows only when they are
    // all there, so a missing file is one problem, not two.
    let mut all_there = true;
    for (what, p) in &files {
        let problem = match p {
            None => Some(format!("{what} is not set")),
            Some(p) => match read_head(p) {
                Ok(data)
                    if !data.windows(11).any(|w| w == b"-----BEGIN ") && pem_expected(what) =>
                {
                    Some(format!("{what} {} holds no PEM data", p.display()))
                }
                Ok(_) => None,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Some(format!("{what} {} does not exist", p.display()))
                }
                Err(e) => Some(format!("{what} {}: {e}", p.display())),
            },
        };
        if let Some(problem) = problem {
            // The first missing puppet file says where the name and directory came from.
            let hint = match (&c.security_provider, &c.puppet) {
                (SecurityProvider::Puppet, Some(Ok(puppet))) if all_there => format!(
                    " (certname {} from {}; ssldir from {})",
                    quoted(&puppet.certname),
                    puppet.certname_from,
                    puppet.ssldir_from
                ),
                _ => String::new(),
            };
            all_there = false;
            f.fatal(format!("{problem}{hint}"));
        }
    }
    if all_there {
        if let Err(e) = c.security() {
            f.fatal(format!("Choria security: {e}"));
        }
    }
    f.0
}

/// The first MiB of a security file: enough to see its PEM armour, bounded whatever the path
/// names.
fn read_head(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut data = Vec::new();
    std::fs::File::open(path)?
        .take(1 << 20)
        .read_to_end(&mut data)?;
    Ok(data)
}

/// Whether the file `what` names is PEM text (certificates and keys; not the choria provider's
/// hex seed or JWT).
fn pem_expected(what: &str) -> bool {
    !what.starts_with("plugin.security.choria.")
}

/// The files the security provider reads, each with what names it (the setting, or for the
/// puppet provider the file's role), `None` when its setting is missing.
pub fn security_files(
    c: &ChoriaConfig,
) -> Result<Vec<(&'static str, Option<PathBuf>)>, PuppetError> {
    Ok(match &c.security_provider {
        SecurityProvider::Puppet => {
            let p = c.puppet_settings()?;
            vec![
                ("the puppet provider's certificate", Some(p.certificate())),
                ("the puppet provider's private key", Some(p.key())),
                ("the puppet provider's CA", Some(p.ca())),
            ]
        }
        SecurityProvider::Choria => vec![
            (
                "plugin.security.choria.token_file",
                c.choria_token_file.clone(),
            ),
            (
                "plugin.security.choria.seed_file",
                c.choria_seed_file.clone(),
            ),
        ],
        SecurityProvider::Pkcs11 | SecurityProvider::CertManager | SecurityProvider::Other(_) => {
            Vec::new()
        }
        SecurityProvider::File => vec![
            (
                "plugin.security.file.certificate",
                c.file_certificate.clone(),
            ),
            ("plugin.security.file.key", c.file_key.clone()),
            ("plugin.security.file.ca", c.file_ca.clone()),
        ],
    })
}

/// Text from a file or the environment for `check` and errors: in double quotes, control
/// characters and quotes escaped, at most 256 characters.
pub fn quoted(text: &str) -> String {
    const MAX: usize = 256;
    let mut out = String::with_capacity(text.len().min(MAX) + 2);
    out.push('"');
    for c in text.chars().take(MAX) {
        out.extend(c.escape_debug());
    }
    if text.chars().count() > MAX {
        out.push_str("...");
    }
    out.push('"');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn args(config: &Path, choria: &Path) -> Paths {
        Paths::new(config, choria)
    }

    /// Whenever both files load, `check` finds exactly what the daemon's preflight finds.
    #[test]
    fn check_and_run_find_the_same_problems() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let helper = write(d, "helper.sh", "#!/bin/sh\necho {}\n", 0o644);
        let seed = write(d, "signer.seed", "not a seed", 0o644);
        let token = write(d, "signer.jwt", "not a jwt", 0o600);
        let yaml = write(
            d,
            "p.yaml",
            &format!(
                "helper: {}\nchoria_insecure: true\njwt_verify_cert: {}/nope.pem\n\
                 jwt_signing_key: {}\njwt_signing_token: {}\nworkerz: 3\n\
                 features:\n  ed25519: true\n  upgrades: true\n",
                helper.display(),
                d.display(),
                seed.display(),
                token.display()
            ),
            0o600,
        );
        let cfg = write(
            d,
            "c.cfg",
            "identity = p1\nplugin.choria.middleware_hosts = nats://b.example.net:x\n",
            0o600,
        );
        let checked = CheckedSettings::load(&args(&yaml, &cfg));
        let settings = Settings::load(&args(&yaml, &cfg)).unwrap();
        let mut from_check = checked.problems.clone();
        let mut from_run = preflight(&settings);
        from_check.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        from_run.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        assert_eq!(from_check, from_run);
        let fatal: Vec<_> = from_run
            .iter()
            .filter_map(|p| match p {
                Problem::Fatal(t) => Some(t.as_str()),
                Problem::Warning(_) => None,
            })
            .collect();
        for want in [
            "is not an executable file",
            "jwt_verify_cert",
            "jwt_signing_key",
            "jwt_signing_token",
            "b.example.net:x",
        ] {
            assert!(
                fatal.iter().any(|t| t.contains(want)),
                "{want:?} not fatal: {from_run:?}"
            );
        }
        let warnings: Vec<_> = from_run
            .iter()
            .filter_map(|p| match p {
                Problem::Warning(t) => Some(t.as_str()),
                Problem::Fatal(_) => None,
            })
            .collect();
        for want in [
            "workerz",
            "no token is set",
            "upgrades_repository",
            "readable by group or others",
        ] {
            assert!(
                warnings.iter().any(|t| t.contains(want)),
                "{want:?} not a warning: {from_run:?}"
            );
        }
    }
}
