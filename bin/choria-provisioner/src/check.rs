//! `choria-provisioner check`: validate everything a rollout depends on, without connecting, and
//! say what the daemon would do. Every problem is listed, not just the first. The checks are
//! the daemon's own preflight ([`provisioner::settings::preflight`]): a setup `check` passes starts,
//! and one it fails does not.

use anyhow::{bail, Result};
use choria_rpc_client::config::{ChoriaConfig, SecurityProvider};
use choria_rpc_client::connection::ConnectionSettings;
use provisioner::config::Config;

use provisioner::settings::{quoted, security_files, CheckedSettings, Problem};
use provisioner::VERSION;

use crate::cli::{paths, CheckArgs};

/// Run the checks, print the plan and the findings, fail when there is any problem.
pub fn main(debug: bool, args: CheckArgs) -> Result<()> {
    let mut checked = CheckedSettings::load(&paths(&args.run, debug));
    let mut probed = None;
    if args.probe {
        if let Some(cfg) = &checked.config {
            let (line, problems) = provisioner::helper::probe(cfg);
            probed = line;
            checked.problems.extend(problems);
        }
    }
    let mut out = format!("choria-provisioner {VERSION}\n");
    if let Some(cfg) = &checked.config {
        out.push_str(&plan(cfg));
    }
    if let Some(c) = &checked.choria {
        out.push_str(&choria_plan(c));
    }
    if let Some(line) = probed {
        out.push_str(&line);
        out.push('\n');
    }
    print!("{out}");
    for p in &checked.problems {
        if let Problem::Warning(w) = p {
            println!("warning: {w}");
        }
    }
    let mut fatal = 0usize;
    for p in &checked.problems {
        if let Problem::Fatal(text) = p {
            println!("problem: {text}");
            fatal += 1;
        }
    }
    if fatal == 0 {
        println!("ok: the configuration is usable");
        Ok(())
    } else {
        bail!("{fatal} problem(s) found")
    }
}

fn plan(cfg: &Config) -> String {
    let f = cfg.provision.features();
    let on = |b: bool| if b { "on" } else { "off" };
    format!(
        "provisioner configuration {}\n  \
         features: jwt {} pki {} ed25519 {} upgrades {}\n  \
         workers: {} (queue {})\n  interval: {}\n  helper: {}\n  lifecycle component: {}\n  \
         leader election: {}\n{}  monitoring: {}\n  site: {}\n  identities: {}\n  \
         extra CSR DNS names: {}\n",
        cfg.file.display(),
        on(f.jwt),
        on(f.pki),
        on(f.ed25519),
        on(f.upgrades),
        cfg.workers,
        cfg.work_queue_size,
        human(cfg.provision.interval()),
        // A webhook URL without credentials or query.
        helper_protocol::webhook::shown_text(&cfg.helper),
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

/// The node history, the monitor token (set or not, never its contents) and the audit trail.
fn status_plan(cfg: &Config) -> String {
    format!(
        "  node history: up to {} nodes, each kept {} after its last change
           monitor token: {}
  audit file: {}
  audit stream: {}
",
        cfg.node_history_size,
        human(cfg.node_history_max_age),
        if cfg.monitor_token_file.is_empty() {
            "not set (the status page, node pages and /api/v1/ answer anyone who reaches the \
             monitor listener)"
                .to_string()
        } else {
            format!(
                "set, read from {} (the status page, node pages and /api/v1/ ask for it)",
                cfg.monitor_token_file
            )
        },
        if cfg.audit_file.is_empty() {
            "none (audit_file unset)".to_string()
        } else {
            format!("{} (one JSON line per decision, fsynced)", cfg.audit_file)
        },
        if cfg.audit_stream.is_empty() {
            "none (audit_stream unset)".to_string()
        } else {
            format!(
                "{} (subject choria.provisioner.audit; opened after connecting, tried again \
                 while it cannot be reached)",
                cfg.audit_stream
            )
        },
    )
}

/// The active-active line: what the replicas share on the broker and what to create when the
/// account may not.
fn active_active(cfg: &Config) -> String {
    use provisioner::claims::{create_command, CLAIMS_BUCKET, MAX_BUCKET_REPLICAS};
    if !cfg.active_active {
        return "  active-active: off\n".to_string();
    }
    format!(
        "  active-active: on, every replica provisions; nodes are claimed in the Choria Streams \
         bucket {CLAIMS_BUCKET} (claim lifetime {}), created at start when the account may, \
         otherwise create it with: {}\n  \
         active-active needs every provisioner of the site to be this one: a deployment with Go \
         provisioners stays on leader_election\n",
        human(cfg.claim_lifetime),
        create_command(CLAIMS_BUCKET, cfg.claim_lifetime, MAX_BUCKET_REPLICAS)
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
    let urls = ConnectionSettings::from_config(c)
        .map(|s| s.describe_brokers())
        .unwrap_or_else(|e| format!("({e})"));
    let caller = match c.caller_certname() {
        Some(name) => format!("choria={name}"),
        None => "unknown (see the problems below)".to_string(),
    };
    let mut out = format!(
        "Choria configuration {}\n  identity: {}\n  caller: {caller}\n  brokers: {}\n  tls: {}\n  \
         security: {}{}\n",
        c.path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
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
