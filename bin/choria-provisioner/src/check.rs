//! `choria-provisioner check`: validate everything a rollout depends on, without connecting, and
//! say what the daemon would do. Every problem is listed, not just the first.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use choria_rpc_client::config::{ChoriaConfig, ProvisionerOverrides, SecurityProvider};
use provision_core::{policy, Config};

use crate::cli::{RunArgs, VERSION};

/// Findings of a check: problems fail it, warnings do not.
#[derive(Default)]
struct Report {
    problems: Vec<String>,
    warnings: Vec<String>,
}

impl Report {
    fn problem(&mut self, p: impl Into<String>) {
        self.problems.push(p.into());
    }
    fn warn(&mut self, w: impl Into<String>) {
        self.warnings.push(w.into());
    }
}

/// Run the checks, print the plan and the findings, fail when there is any problem.
pub fn main(debug: bool, args: RunArgs) -> Result<()> {
    let mut r = Report::default();
    let mut out = String::new();
    out.push_str(&format!("choria-provisioner {VERSION}\n"));

    // Every validation problem is listed; the rest of the checks go on with defaults in place
    // of the invalid values.
    let config = match args.config.as_deref().map(Config::load_all) {
        Some(Ok(checked)) => {
            for e in checked.errors {
                r.problem(e.to_string());
            }
            for w in checked.loaded.warnings {
                r.warn(w.to_string());
            }
            Some(checked.loaded.config)
        }
        Some(Err(e)) => {
            r.problem(e.to_string());
            None
        }
        None => {
            r.problem("--config is required");
            None
        }
    };
    let choria_path: PathBuf = args
        .choria_config
        .clone()
        .unwrap_or_else(choria_rpc_client::config::user_config_path);
    let choria = match ChoriaConfig::load(&choria_path) {
        Ok(mut c) => {
            if let Some(cfg) = &config {
                c.apply_provisioner_overrides(&ProvisionerOverrides {
                    insecure: cfg.choria_insecure,
                    broker_provisioning_password: Some(cfg.broker_provisioning_password.clone())
                        .filter(|p| !p.is_empty()),
                    loglevel: Some(cfg.loglevel.clone()).filter(|l| !l.is_empty()),
                    logfile: Some(cfg.logfile.clone()).filter(|l| !l.is_empty()),
                    debug,
                });
            }
            Some(c)
        }
        Err(e) => {
            r.problem(format!(
                "Choria configuration {}: {e}",
                choria_path.display()
            ));
            None
        }
    };

    if let Some(cfg) = &config {
        check_provisioner(cfg, &mut r);
        out.push_str(&plan(cfg));
    }
    if let Some(c) = &choria {
        check_choria(c, &mut r);
        out.push_str(&choria_plan(c));
    }
    for w in readable_secrets(config.as_ref(), choria.as_ref()) {
        r.warn(w);
    }
    print!("{out}");
    for w in &r.warnings {
        println!("warning: {w}");
    }
    for p in &r.problems {
        println!("problem: {p}");
    }
    if r.problems.is_empty() {
        println!("ok: the configuration is usable");
        Ok(())
    } else {
        bail!("{} problem(s) found", r.problems.len())
    }
}

fn plan(cfg: &Config) -> String {
    let f = cfg.features;
    let on = |b: bool| if b { "on" } else { "off" };
    format!(
        "provisioner configuration {}\n  \
         features: jwt {} pki {} ed25519 {} upgrades {}\n  \
         workers: {} (queue {})\n  interval: {}\n  helper: {}\n  lifecycle component: {}\n  \
         leader election: {}\n  monitoring: {}\n  site: {}\n  identities: {}\n  \
         extra CSR DNS names: {}\n",
        cfg.file.display(),
        on(f.jwt),
        on(f.pki),
        on(f.ed25519),
        on(f.upgrades),
        cfg.workers,
        cfg.work_queue_size,
        human(cfg.interval),
        cfg.helper,
        cfg.lifecycle_component,
        on(cfg.leader_election),
        monitoring(cfg),
        if cfg.site.is_empty() {
            "(none)"
        } else {
            &cfg.site
        },
        if cfg.identity_pattern.is_empty() {
            "the built-in grammar (DNS-like labels of letters, digits, '-' and '_')".to_string()
        } else {
            format!("identity_pattern {:?}", cfg.identity_pattern)
        },
        if cfg.csr_extra_dns_names.is_empty() {
            "none (every DNS name must be the identity)".to_string()
        } else {
            format!("csr_extra_dns_names {:?}", cfg.csr_extra_dns_names)
        },
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

/// A duration as an operator writes it: `1h`, `5m`, `90s`.
fn human(d: std::time::Duration) -> String {
    let s = d.as_secs();
    if s > 0 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s > 0 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

fn choria_plan(c: &ChoriaConfig) -> String {
    let urls = c
        .middleware_urls()
        .map(|u| u.join(", "))
        .unwrap_or_else(|e| format!("({e})"));
    format!(
        "Choria configuration {}\n  identity: {}\n  caller: choria={}\n  brokers: {}\n  tls: {}\n  \
         security: {}{}\n  collective: {}\n",
        c.path.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
        c.identity,
        c.certname(),
        urls,
        if c.disable_tls { "off (choria_insecure)" } else { "on" },
        format!("{:?}", c.security_provider).to_lowercase(),
        if c.insecure { ", requests unsigned" } else { "" },
        c.main_collective,
    )
}

/// The helper's program: exists, is a file, and is executable.
fn check_helper(helper: &str, r: &mut Report) {
    let Some(words) = shlex::split(helper) else {
        r.problem(format!(
            "helper {helper:?} cannot be parsed as a command line"
        ));
        return;
    };
    let Some(program) = words.first() else {
        r.problem("no helper is configured");
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
        Some(Ok(_)) => r.problem(format!("helper {program} is not an executable file")),
        Some(Err(e)) => r.problem(format!("helper {program}: {e}")),
        None => r.problem(format!("helper {program} is not found on PATH")),
    }
}

/// Every file holding a secret that someone other than the service can read, as warnings. The
/// daemon logs the same list at start.
///
/// Key files (`jwt_signing_key`, the file provider's key, the choria provider's seed) should be
/// the service user's alone: any group or other permission is reported. The provisioner YAML
/// (when it sets `token` or `broker_provisioning_password`) and the Choria configuration (when
/// it sets `plugin.nats.pass`) are installed readable by the service's group: they are reported
/// when others can read them, or a group other than the service's (the group this process runs
/// as, or the packages' `choria-provisioner` group).
pub(crate) fn readable_secrets(
    config: Option<&Config>,
    choria: Option<&ChoriaConfig>,
) -> Vec<String> {
    let mut out = Vec::new();
    let service_groups = service_groups();
    if let Some(cfg) = config {
        let mut held = Vec::new();
        if !cfg.token.is_empty() {
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
            key_file_readable(k, "plugin.security.file.key", &mut out);
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
         make it readable by the service's group only (chmod 0640, group choria-provisioner) \
         or by its owner only (chmod 0600)",
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

fn check_provisioner(cfg: &Config, r: &mut Report) {
    check_helper(&cfg.helper, r);
    if cfg.token.is_empty() {
        r.warn("no token is set: servers whose provisioning JWT carries a token will refuse every request");
    }
    if cfg.features.jwt {
        match policy::read_verify_cert(&cfg.jwt_verify_cert)
            .and_then(|file| policy::verify_key(&cfg.jwt_verify_cert, file.as_deref()))
        {
            Ok(_) => {}
            Err(e) => r.problem(format!("jwt_verify_cert: {e}")),
        }
    }
    if cfg.features.ed25519 {
        if cfg.jwt_signing_key.is_empty() {
            r.problem("features.ed25519 needs jwt_signing_key");
        } else {
            match std::fs::read(&cfg.jwt_signing_key) {
                Ok(data) => {
                    if let Err(e) = provision_core::jwt::SigningKey::from_key_data(&data) {
                        r.problem(format!("jwt_signing_key {}: {e}", cfg.jwt_signing_key));
                    }
                }
                Err(e) => r.problem(format!("jwt_signing_key {}: {e}", cfg.jwt_signing_key)),
            }
        }
        if !cfg.jwt_signing_token.is_empty() {
            match std::fs::read_to_string(&cfg.jwt_signing_token) {
                Ok(t) => {
                    if let Err(e) =
                        provision_core::jwt::decode_unverified::<serde_json::Value>(t.trim())
                    {
                        r.problem(format!("jwt_signing_token {}: {e}", cfg.jwt_signing_token));
                    }
                }
                Err(e) => r.problem(format!("jwt_signing_token {}: {e}", cfg.jwt_signing_token)),
            }
        }
    }
    if cfg.features.upgrades && cfg.upgrades_repository.is_empty() && !cfg.upgrades_optional {
        r.warn("features.upgrades is on but upgrades_repository is empty: upgrades will fail");
    }
}

fn check_choria(c: &ChoriaConfig, r: &mut Report) {
    if let Err(e) = c.middleware_urls() {
        r.problem(format!("Choria configuration: {e}"));
    }
    if c.insecure {
        return;
    }
    match c.security_provider {
        SecurityProvider::File => {
            for (what, p) in [
                ("plugin.security.file.certificate", &c.file_certificate),
                ("plugin.security.file.key", &c.file_key),
                ("plugin.security.file.ca", &c.file_ca),
            ] {
                match p {
                    None => r.problem(format!("{what} is not set")),
                    Some(p) => match std::fs::read_to_string(p) {
                        Ok(text) if text.contains("-----BEGIN ") => {}
                        Ok(_) => r.problem(format!("{what} {} holds no PEM data", p.display())),
                        Err(e) => r.problem(format!("{what} {}: {e}", p.display())),
                    },
                }
            }
        }
        SecurityProvider::Choria => {
            for (what, p) in [
                ("plugin.security.choria.token_file", &c.choria_token_file),
                ("plugin.security.choria.seed_file", &c.choria_seed_file),
            ] {
                match p {
                    None => r.problem(format!("{what} is not set")),
                    Some(p) => {
                        if let Err(e) = std::fs::read(p) {
                            r.problem(format!("{what} {}: {e}", p.display()));
                        }
                    }
                }
            }
        }
        ref other => r.problem(format!(
            "security provider {other:?} is not supported; use file or choria"
        )),
    }
    if let Err(e) = c.security() {
        r.problem(format!("Choria security: {e}"));
    }
}
