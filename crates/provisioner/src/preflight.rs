//! The one judge of the settings: what `check` prints and `run` refuses to start on.
//!
//! [`preflight`] looks at whatever loaded, without connecting anywhere, and returns every
//! problem: fatal ones (the daemon would fail on them, at start or for every node) and warnings.
//! `check` calls it through [`Report::examine`], which loads both files as far as they go;
//! `run` through [`refuse`], on settings that loaded. Being one function, the two cannot
//! disagree: a setup `check` passes starts, one it fails does not.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use choria_rpc_client::config::{ChoriaConfig, PuppetError, SecurityProvider};
use choria_rpc_client::connection::{ConnectionError, ConnectionSettings};
use helper_protocol::signature::ReplyCheck;
use helper_protocol::webhook::{is_webhook, ReplySignature};
use helper_protocol::WebhookClient;
use provision_core::KeyMaterial as _;

use crate::config::Config;
use crate::helper::webhook_options;
use crate::keys::FileKeys;
use crate::settings::{choria_path, overrides, read_token, Paths, Settings};
use crate::text::{duration, quoted};

/// One finding of [`preflight`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The daemon cannot work with this: `check` fails and `run` refuses to start.
    Fatal(String),
    /// Worth knowing; nothing fails.
    Warning(String),
}

impl Problem {
    /// The text of a fatal problem.
    pub fn fatal(&self) -> Option<&str> {
        match self {
            Problem::Fatal(t) => Some(t),
            Problem::Warning(_) => None,
        }
    }

    /// The text of a warning.
    pub fn warning(&self) -> Option<&str> {
        match self {
            Problem::Warning(t) => Some(t),
            Problem::Fatal(_) => None,
        }
    }
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

/// What `check` could load, with every problem found on the way: what it prints.
#[derive(Debug)]
pub struct Report {
    /// The provisioner configuration, invalid values replaced by their defaults; `None` when
    /// the file cannot be read or parsed.
    pub config: Option<Config>,
    /// The Choria configuration with the overrides; `None` when it cannot be loaded.
    pub choria: Option<ChoriaConfig>,
    /// Loading problems and warnings, then the preflight's, in that order.
    pub problems: Vec<Problem>,
    /// What `probe` printed.
    probed: Option<String>,
}

impl Report {
    /// Load both files as far as they go, listing every problem rather than the first, and run
    /// [`preflight`] on whatever loaded: `check`. With no fatal problem in loading this is
    /// exactly [`Settings::load`] followed by [`preflight`], what `run` refuses to start on.
    pub fn examine(args: &Paths) -> Report {
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
                f.fatal(crate::Error::NoConfig.to_string());
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
        problems.extend(preflight(config.as_ref(), choria.as_ref()));
        Report {
            config,
            choria,
            problems,
            probed: None,
        }
    }

    /// `check --probe`: reach a webhook helper once and add what it answered.
    pub fn probe(&mut self) {
        if let Some(cfg) = &self.config {
            let (line, problems) = probe(cfg);
            self.probed = line;
            self.problems.extend(problems);
        }
    }

    /// The fatal problems: `check` fails and `run` refuses to start on any.
    pub fn fatal(&self) -> impl Iterator<Item = &str> {
        self.problems.iter().filter_map(Problem::fatal)
    }

    /// The warnings.
    pub fn warnings(&self) -> impl Iterator<Item = &str> {
        self.problems.iter().filter_map(Problem::warning)
    }

    /// What the daemon would do with these settings, a line per setting, as `check` prints it
    /// before the problems.
    pub fn plan(&self) -> String {
        let mut out = String::new();
        if let Some(cfg) = &self.config {
            out.push_str(&plan(cfg));
        }
        if let Some(c) = &self.choria {
            out.push_str(&choria_plan(c));
        }
        if let Some(line) = &self.probed {
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

/// Everything that can be known about the settings without connecting, judged in one place
/// for `check` and `run`: the helper, every key and token file named, the monitor token and the
/// audit directory, the Choria security files and the broker URLs, and the secrets others can
/// read. A fatal problem is one the daemon would fail on anyway, at start or for every node;
/// the rest are warnings. What did not load (`None`) is not judged.
pub fn preflight(config: Option<&Config>, choria: Option<&ChoriaConfig>) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(cfg) = config {
        problems.extend(preflight_config(cfg));
        problems.extend(status_problems(cfg));
    }
    if let Some(c) = choria {
        problems.extend(preflight_choria(c));
    }
    problems.extend(
        readable_secrets(config, choria)
            .into_iter()
            .map(Problem::Warning),
    );
    problems
}

/// Every finding on loaded settings: the loading warnings, then [`preflight`]'s.
pub fn problems(settings: &Settings) -> Vec<Problem> {
    let mut problems: Vec<Problem> = settings
        .warnings
        .iter()
        .map(|w| Problem::Warning(w.to_string()))
        .collect();
    problems.extend(preflight(Some(&settings.config), Some(&settings.choria)));
    problems
}

/// `run`'s preflight on loaded settings: [`problems`], or an error listing the fatal ones when
/// there is any.
pub fn refuse(settings: &Settings) -> Result<Vec<Problem>, crate::Error> {
    let problems = problems(settings);
    let fatal: Vec<String> = problems
        .iter()
        .filter_map(|p| p.fatal().map(str::to_string))
        .collect();
    if fatal.is_empty() {
        Ok(problems)
    } else {
        Err(crate::Error::Refused { problems: fatal })
    }
}

/// Who the status API and pages answer, in words: for the daemon's start-up line and `check`.
pub fn api_access(cfg: &Config) -> String {
    let who = if cfg.monitor_token_file.is_empty() {
        "loopback clients only (monitor_token_file is not set)".to_string()
    } else {
        format!(
            "any host with the bearer token of monitor_token_file {}",
            cfg.monitor_token_file
        )
    };
    let tls = if cfg.monitor_tls_cert.is_empty() {
        "plain HTTP"
    } else {
        "HTTPS (monitor_tls_cert)"
    };
    let hosts = if cfg.monitor_hostnames.is_empty() {
        "Host: loopback or the address reached".to_string()
    } else {
        format!(
            "Host: loopback, the address reached or {}",
            cfg.monitor_hostnames.join(", ")
        )
    };
    format!("{who}, {tls}, {hosts}")
}

/// The monitor token file must be readable and not empty, the monitor's TLS files must load,
/// and the audit file's directory must exist: the daemon reads them and opens it at start.
fn status_problems(cfg: &Config) -> Vec<Problem> {
    let mut out = Vec::new();
    if !cfg.monitor_tls_cert.is_empty() && !cfg.monitor_tls_key.is_empty() {
        if let Err(e) = provisioner_status::tls::server_config(
            Path::new(&cfg.monitor_tls_cert),
            Path::new(&cfg.monitor_tls_key),
        ) {
            out.push(Problem::Fatal(e.to_string()));
        }
    }
    if let Err(e) = read_token(&cfg.monitor_token_file) {
        out.push(Problem::Fatal(crate::one_line(&e)));
    }
    if !cfg.audit_file.is_empty() {
        let dir = Path::new(&cfg.audit_file)
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !dir.is_dir() {
            out.push(Problem::Fatal(format!(
                "audit_file {}: the directory {} does not exist",
                cfg.audit_file,
                dir.display()
            )));
        }
    }
    out
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
    match path.as_deref().map(|p| (p, std::fs::metadata(p))) {
        Some((p, Ok(m))) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
            // Mode bits say someone may run it; whether this user may (a root-only 0700
            // helper under the service's account) only the kernel says.
            if let Err(e) = rustix::fs::access(p, rustix::fs::Access::EXEC_OK) {
                f.fatal(format!(
                    "helper {program} cannot be run by this user (uid {}): {e}",
                    rustix::process::geteuid().as_raw()
                ));
            }
        }
        Some((_, Ok(_))) => f.fatal(format!("helper {program} is not an executable file")),
        Some((_, Err(e))) => f.fatal(format!("helper {program}: {e}")),
        None => f.fatal(format!("helper {program} is not found on PATH")),
    }
}

/// Every file holding a secret that someone other than the service can read, as warnings. The
/// daemon logs the same list at start.
///
/// Key files (`jwt_signing_key`, the file provider's key, the choria provider's seed) should be
/// readable by their owner and, at most, the service's group: a write permission for group or
/// others, a read permission for others, or a group read for another group is reported. The
/// provisioner YAML (when it sets `token` or `broker_provisioning_password`) and the Choria
/// configuration (when it sets `plugin.nats.pass`) are installed `root:choria-provisioner`
/// 0640: they are reported when others can read them, or a group other than the service's (the
/// group this process runs as, or a
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
            key_file_readable(
                Path::new(&cfg.jwt_signing_key),
                "jwt_signing_key",
                &service_groups,
                &mut out,
            );
        }
        if !cfg.webhook.tls_key.is_empty() {
            key_file_readable(
                Path::new(&cfg.webhook.tls_key),
                "helper_tls_key",
                &service_groups,
                &mut out,
            );
        }
        if !cfg.claims_secret_file.is_empty() {
            key_file_readable(
                Path::new(&cfg.claims_secret_file),
                "claims_secret_file",
                &service_groups,
                &mut out,
            );
        }
        if !cfg.monitor_tls_key.is_empty() {
            key_file_readable(
                Path::new(&cfg.monitor_tls_key),
                "monitor_tls_key",
                &service_groups,
                &mut out,
            );
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
            key_file_readable(k, what, &service_groups, &mut out);
        }
        if let Some(s) = &c.choria_seed_file {
            key_file_readable(
                s,
                "plugin.security.choria.seed_file",
                &service_groups,
                &mut out,
            );
        }
    }
    out
}

/// A key file should not be readable by group or others.
fn key_file_readable(path: &Path, what: &str, service_groups: &[u32], out: &mut Vec<String>) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(m) = std::fs::metadata(path) else {
        return;
    };
    let mode = m.permissions().mode() & 0o777;
    // The service's own group may read its keys (the packages' layout); nobody else may, and
    // nobody but the owner may write them.
    let group_read_ok = service_groups.contains(&m.gid());
    let exposed = mode & 0o027 != 0 || (mode & 0o040 != 0 && !group_read_ok);
    if exposed {
        out.push(format!(
            "{what} {} is readable by group or others (mode {mode:o}); make it the owner's alone \
             (chmod 0600), or readable by the service's group only (chmod 0640, group \
             {SERVICE_GROUP})",
            path.display()
        ));
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
         make it readable by its owner and the service's group only (chmod 0640, owner root, \
         group {SERVICE_GROUP}, as the packages install it)",
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
        f.0.extend(webhook_problems(cfg));
    } else {
        check_helper(&cfg.helper, &mut f);
        f.0.extend(unused_webhook_settings(cfg));
    }
    if cfg.active_active
        && cfg.claims_secret_file.is_empty()
        && cfg.broker_provisioning_password.is_empty()
    {
        f.warn(
            "active_active without claims_secret_file or broker_provisioning_password: the claims \
             bucket's values are not sealed, so any client that may write the bucket can skew how \
             the replicas split the fleet; seal them, or give only the provisioners write access \
             (docs/security.md)",
        );
    }
    if !cfg.claims_secret_file.is_empty() {
        if let Err(e) = crate::aa::seal(cfg) {
            f.fatal(crate::one_line(&e));
        }
    }
    if cfg.provision.token().is_empty() {
        f.warn("no token is set: servers whose provisioning JWT carries a token will refuse every request");
    } else if PLACEHOLDER_TOKENS
        .contains(&cfg.provision.token().trim().to_ascii_lowercase().as_str())
    {
        f.fatal(
            "token is the packaged placeholder \"change me\": set it to the token given to \
             `choria jwt prov --token` (a guessable token lets anyone who can reach a server in \
             provisioning mode reconfigure it)",
        );
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

/// Tokens that are the packaged configuration's placeholder, refused as a token.
const PLACEHOLDER_TOKENS: [&str; 3] = ["change me", "changeme", "change-me"];

fn preflight_choria(c: &ChoriaConfig) -> Vec<Problem> {
    let mut f = Findings::default();
    if c.identity == "localhost" || c.identity.starts_with("localhost.") {
        f.warn(format!(
            "identity is {}: every provisioner that finds no better name shares it (caller id, \
             election candidate, active-active replica); set identity in the Choria configuration",
            quoted(&c.identity)
        ));
    }
    let unread = c.unread_go_keys();
    if !unread.is_empty() {
        const SHOWN: usize = 12;
        let more = unread.len().saturating_sub(SHOWN);
        f.warn(format!(
            "the Choria configuration sets {} that go-choria reads and this provisioner does not \
             (they change nothing here): {}{}",
            if unread.len() == 1 { "a key" } else { "keys" },
            unread[..unread.len().min(SHOWN)].join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
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

/// What `check` and the daemon's preflight find wrong with a webhook helper: the URL, the
/// secret file (it must exist, hold a secret and be the owner's alone) and the TLS files (read
/// and parsed by the very client the daemon builds).
pub fn webhook_problems(config: &Config) -> Vec<Problem> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut out = Vec::new();
    let url = match helper_protocol::webhook::parse_url(&config.helper) {
        Ok(url) => url,
        Err(e) => {
            out.push(Problem::Fatal(format!(
                "helper {}: {e}",
                quoted(&helper_protocol::webhook::shown_text(&config.helper))
            )));
            return out;
        }
    };
    let w = &config.webhook;
    if w.secret_file.is_empty() {
        out.push(Problem::Warning(
            "helper_secret_file is not set: webhook requests are not signed, so the helper \
             cannot tell the provisioner's requests from anyone else's"
                .into(),
        ));
    } else {
        match std::fs::metadata(&w.secret_file) {
            Err(e) => out.push(Problem::Fatal(format!(
                "helper_secret_file {}: {e}",
                w.secret_file
            ))),
            Ok(m) if m.permissions().mode() & 0o077 != 0 => out.push(Problem::Fatal(format!(
                "helper_secret_file {} can be read or written by group or others (mode {:o}); \
                     make it the owner's alone (chmod 0600)",
                w.secret_file,
                m.permissions().mode() & 0o777
            ))),
            Ok(_) => {
                if let Err(e) =
                    helper_protocol::webhook::read_secret(std::path::Path::new(&w.secret_file))
                {
                    out.push(Problem::Fatal(format!("helper_secret_file {e}")));
                }
            }
        }
    }
    let tls_files = [
        ("helper_tls_cert", &w.tls_cert),
        ("helper_tls_key", &w.tls_key),
        ("helper_tls_ca", &w.tls_ca),
    ];
    if url.scheme() == "http" {
        for (key, value) in tls_files {
            if !value.is_empty() {
                out.push(Problem::Warning(format!(
                    "{key} has no effect: the helper URL is plain http"
                )));
            }
        }
        let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']);
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_loopback());
        if !loopback {
            out.push(Problem::Warning(format!(
                "helper {} is plain http to another host: node data and the helper's replies \
                 (private keys, certificates) travel unencrypted; use https",
                helper_protocol::webhook::shown(&url)
            )));
        }
    }
    // The client the daemon builds: TLS files read and parsed, cert and key together.
    if let Err(e) = WebhookClient::new(&webhook_options(config)) {
        out.push(Problem::Fatal(e.to_string()));
    }
    out
}

/// Warnings for webhook settings given with a command as the helper.
pub fn unused_webhook_settings(config: &Config) -> Vec<Problem> {
    let w = &config.webhook;
    [
        ("helper_secret_file", &w.secret_file),
        ("helper_tls_cert", &w.tls_cert),
        ("helper_tls_key", &w.tls_key),
        ("helper_tls_ca", &w.tls_ca),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(key, _)| key)
    .chain((w.reply_signature == ReplySignature::Required).then_some("helper_reply_signature"))
    .map(|key| {
        Problem::Warning(format!(
            "{key} has no effect: the helper is a command, not an http:// or https:// URL"
        ))
    })
    .collect()
}

/// `check --probe`: reaches a webhook helper with one signed `GET` (over TLS with the client
/// certificate when configured) and says how it answered: a line to print, and the problems.
/// A client that cannot be built is not probed (its problem is listed already).
pub fn probe(config: &Config) -> (Option<String>, Vec<Problem>) {
    if !is_webhook(&config.helper) {
        return (
            Some("probe: the helper is a command; there is nothing to reach".into()),
            Vec::new(),
        );
    }
    let Ok(client) = WebhookClient::new(&webhook_options(config)) else {
        return (None, Vec::new());
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return (None, vec![Problem::Fatal(format!("probe: {e}"))]),
    };
    match runtime.block_on(client.probe()) {
        Ok(p) => {
            let success = (200..300).contains(&p.status);
            let signed = match &p.reply_signature {
                _ if !success => "",
                Ok(ReplyCheck::Signed) => ", its answer signed with the secret",
                Ok(ReplyCheck::Unsigned) => ", its answer not signed",
                Ok(ReplyCheck::NoSecret) => "",
                Err(_) => ", its answer's signature refused",
            };
            let line = format!(
                "probe: {} answered HTTP {} over {} in {} ms{signed}",
                client.helper(),
                p.status,
                p.version,
                p.elapsed.as_millis()
            );
            let mut problems = match p.status {
                401 | 403 => vec![Problem::Warning(format!(
                    "the webhook refused the signed probe with HTTP {}: check helper_secret_file \
                     and the client certificate against what the helper expects",
                    p.status
                ))],
                500.. => vec![Problem::Warning(format!(
                    "the webhook answered the probe with HTTP {}",
                    p.status
                ))],
                _ => Vec::new(),
            };
            // The daemon would judge every reply as the probe's answer was judged: say so
            // before it refuses them all.
            if success {
                if let Err(e) = &p.reply_signature {
                    problems.push(Problem::Warning(format!(
                        "the webhook's answer to the probe would be refused as a reply: {e}; \
                         the helper must sign its replies with helper_secret_file's secret \
                         (helper_reply_signature is {})",
                        config.webhook.reply_signature
                    )));
                }
            }
            (Some(line), problems)
        }
        Err(e) => (None, vec![Problem::Fatal(format!("probe: {e}"))]),
    }
}

// What `check` prints before the problems: the plan of the daemon.

fn plan(cfg: &Config) -> String {
    let f = cfg.provision.features();
    let on = |b: bool| if b { "on" } else { "off" };
    format!(
        "provisioner configuration {}\n  \
         features: jwt {} pki {} ed25519 {} upgrades {}\n  \
         workers: {} (queue {}, threads {})\n  interval: {}\n  helper: {}\n  lifecycle component: {}\n  \
         leader election: {}\n{}  monitoring: {}\n  site: {}\n  identities: {}\n  \
         extra CSR DNS names: {}\n",
        cfg.file.display(),
        on(f.jwt),
        on(f.pki),
        on(f.ed25519),
        on(f.upgrades),
        cfg.workers,
        cfg.work_queue_size,
        cfg.threads,
        duration(cfg.provision.interval()),
        helper_plan(cfg),
        cfg.lifecycle_component,
        on(cfg.leader_election),
        active_active(cfg),
        monitoring(cfg),
        if cfg.site.is_empty() {
            "(none)"
        } else {
            &cfg.site
        },
        match cfg.provision.identity_rule().pattern() {
            None => {
                "the built-in grammar (DNS-like labels of letters, digits, '-' and '_')".to_string()
            }
            Some(p) => format!("identity_pattern {}", quoted(p)),
        },
        match cfg.provision.extra_dns_names() {
            None => "none (every DNS name must be the identity)".to_string(),
            Some(e) => format!("csr_extra_dns_names {}", quoted(e.pattern())),
        },
    ) + &status_plan(cfg)
}

/// The helper line: a command as it is; a webhook URL without credentials or query, with how
/// its requests and replies are signed.
fn helper_plan(cfg: &Config) -> String {
    let shown = helper_protocol::webhook::shown_text(&cfg.helper);
    if !is_webhook(&cfg.helper) {
        return shown;
    }
    let how = if cfg.webhook.secret_file.is_empty() {
        "requests not signed and replies not checked: helper_secret_file is unset"
    } else {
        match cfg.webhook.reply_signature {
            ReplySignature::Required => {
                "requests signed (signature versions 2 and 1), replies must be signed \
                 (helper_reply_signature required)"
            }
            ReplySignature::Optional => {
                "requests signed (signature versions 2 and 1), signed replies checked and unsigned \
                 ones accepted (helper_reply_signature optional)"
            }
        }
    };
    format!("{shown} (webhook; {how})")
}

/// The node history, the monitor token (set or not, never its contents), who the status API
/// answers, and the audit trail.
fn status_plan(cfg: &Config) -> String {
    let token = if cfg.monitor_token_file.is_empty() {
        "not set (the status page, node pages and /api/v1/ answer loopback clients only)"
            .to_string()
    } else {
        format!(
            "set, read from {} (the status page, node pages and /api/v1/ ask for it)",
            cfg.monitor_token_file
        )
    };
    let audit_file = if cfg.audit_file.is_empty() {
        "none (audit_file unset)".to_string()
    } else {
        format!("{} (one JSON line per decision, fsynced)", cfg.audit_file)
    };
    let audit_stream = if cfg.audit_stream.is_empty() {
        "none (audit_stream unset)".to_string()
    } else {
        format!(
            "{} (subject choria.provisioner.audit; opened after connecting, tried again while it \
             cannot be reached; created keeping {} and {} bytes, the oldest records discarded)",
            cfg.audit_stream,
            duration(cfg.audit_stream_limits.max_age),
            cfg.audit_stream_limits.max_bytes
        )
    };
    format!(
        "  node history: up to {} nodes, each kept {} after its last change\n  \
         monitor token: {token}\n  \
         status API: {}\n  \
         audit file: {audit_file}\n  \
         audit stream: {audit_stream}\n",
        cfg.node_history_size,
        duration(cfg.node_history_max_age),
        if cfg.monitor_port == 0 {
            "off (monitor_port 0)".to_string()
        } else {
            api_access(cfg)
        },
    )
}

/// The active-active line: what the replicas share on the broker and what to create when the
/// account may not.
fn active_active(cfg: &Config) -> String {
    use crate::claims::{create_command, CLAIMS_BUCKET};
    use choria_rpc_client::streams::MAX_BUCKET_REPLICAS;
    if !cfg.active_active {
        return "  active-active: off\n".to_string();
    }
    format!(
        "  active-active: on, every replica provisions; nodes are claimed in the Choria Streams \
         bucket {CLAIMS_BUCKET} (claim lifetime {}), created at start when the account may, \
         otherwise create it with: {}\n  \
         active-active needs every provisioner of the site to be this one: a deployment with Go \
         provisioners stays on leader_election\n  claims sealed: {}\n",
        duration(cfg.claim_lifetime),
        create_command(CLAIMS_BUCKET, cfg.claim_lifetime, MAX_BUCKET_REPLICAS),
        if !cfg.claims_secret_file.is_empty() {
            format!("yes, with claims_secret_file {}", cfg.claims_secret_file)
        } else if !cfg.broker_provisioning_password.is_empty() {
            "yes, with the broker provisioning password".to_string()
        } else {
            "no (forged values are refused by form and age only)".to_string()
        }
    )
}

/// Where the monitor listener would listen.
fn monitoring(cfg: &Config) -> String {
    if cfg.monitor_port == 0 {
        return "off".to_string();
    }
    if cfg.monitor_address.is_empty() {
        format!(
            "port {} on every interface, IPv4 and IPv6 (monitor_address unset)",
            cfg.monitor_port
        )
    } else {
        format!(
            "port {} on {} (monitor_address)",
            cfg.monitor_port, cfg.monitor_address
        )
    }
}

fn choria_plan(c: &ChoriaConfig) -> String {
    let urls = ConnectionSettings::from_config(c)
        .map(|s| s.describe_brokers())
        .unwrap_or_else(|e| format!("({e})"));
    let caller = match c.caller_certname() {
        Some(name) => format!("choria={name}"),
        None => "unknown (see the problems below)".to_string(),
    };
    let mut out = format!(
        "Choria configuration {}{}\n  identity: {}\n  caller: {caller}\n  brokers: {}\n  tls: {}\n  \
         security: {}{}\n",
        c.path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        if c.plugin_files.is_empty() {
            String::new()
        } else {
            format!(
                " (with {})",
                c.plugin_files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
        c.identity,
        urls,
        if c.disable_tls {
            "off (choria_insecure)"
        } else {
            "on"
        },
        c.security_provider,
        if c.insecure {
            ", requests unsigned"
        } else {
            ""
        },
    );
    if !c.insecure {
        out.push_str(&security_plan(c));
    }
    out.push_str(&format!("  collective: {}\n", c.main_collective));
    out
}

/// Where the security provider's files are: for the puppet provider its ssldir and certname
/// and where each came from, then each file by its full path.
fn security_plan(c: &ChoriaConfig) -> String {
    let mut out = String::new();
    if c.security_provider == SecurityProvider::Puppet {
        match c.puppet_settings() {
            Ok(p) => out.push_str(&format!(
                "  ssldir: {} ({})\n  certname: {} ({})\n",
                p.ssldir.display(),
                p.ssldir_from,
                p.certname,
                p.certname_from
            )),
            // The reason is one of the problems listed below.
            Err(_) => out.push_str("  ssldir and certname: unknown (see the problems below)\n"),
        }
    }
    if let Ok(files) = security_files(c) {
        for (what, path) in files {
            let label = what.strip_prefix("the puppet provider's ").unwrap_or(what);
            out.push_str(&format!(
                "  {label}: {}\n",
                path.map(|p| p.display().to_string())
                    .unwrap_or_else(|| "(not set)".to_string())
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests;
