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
         leader election: {}\n  monitoring: {}\n  site: {}\n",
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
        if cfg.monitor_port > 0 {
            format!("port {}", cfg.monitor_port)
        } else {
            "off".to_string()
        },
        if cfg.site.is_empty() {
            "(none)"
        } else {
            &cfg.site
        },
    )
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

/// A secret file should not be readable by group or others.
fn check_private(path: &Path, what: &str, r: &mut Report) {
    if let Ok(m) = std::fs::metadata(path) {
        if m.permissions().mode() & 0o077 != 0 {
            r.warn(format!(
                "{what} {} is readable by group or others (mode {:o})",
                path.display(),
                m.permissions().mode() & 0o777
            ));
        }
    }
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
                    check_private(Path::new(&cfg.jwt_signing_key), "jwt_signing_key", r);
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
            if let Some(k) = &c.file_key {
                check_private(k, "plugin.security.file.key", r);
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
            if let Some(s) = &c.choria_seed_file {
                check_private(s, "plugin.security.choria.seed_file", r);
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
