//! `pause`, `resume`, `deny`, `approve` and `reject`: fleet control
//! (`provisioner::fleet_lifecycle::control`) opened with the provisioner's own configuration
//! (`provisioner::operator`). The binary parses and prints.

use std::time::Duration;

use anyhow::{bail, Result};
use provisioner::fleet_lifecycle::control::{self, Control};
use provisioner::fleet_lifecycle::{now_unix, rfc3339};
use provisioner::settings::Paths;

use crate::cli::{ControlArgs, DecideArgs, DenyCommand, PauseArgs};

/// Runs `f` on the bucket opened with `args`' files and the provisioner's settings, warning
/// when they do not follow the bucket. When `f` changed the bucket, says which running
/// replicas applied the change, and fails when it reached none (unless `--no-replicas-ok`).
fn with_settings<T>(
    debug: bool,
    args: &ControlArgs,
    f: impl AsyncFnOnce(&Control, provisioner::Settings) -> Result<T>,
) -> Result<T> {
    let config = args
        .config
        .clone()
        .unwrap_or_else(|| crate::cli::DEFAULT_CONFIG.into());
    let paths = Paths {
        config: Some(config.clone()),
        choria_config: args.choria_config.clone(),
        debug,
    };
    let runtime = provisioner::runtime(1)?;
    runtime.block_on(async {
        let (c, settings) = provisioner::operator::control_from_files(&paths, Duration::from_secs(15)).await?;
        if !settings.config.fleet_control {
            eprintln!("warning: {} does not set fleet_control: true; a provisioner started from it does not follow pause or deny", config.display());
        }
        let out = f(&c, settings).await?;
        if c.last_write() > 0 {
            let reach = c.reach(control::presence::REACH_WAIT).await?;
            println!("{}", reach.verdict(args.no_replicas_ok)?);
        }
        Ok(out)
    })
}

/// `pause --reason TEXT`.
pub fn pause(debug: bool, args: &PauseArgs) -> Result<()> {
    if args.reason.trim().is_empty() {
        bail!("--reason must say why provisioning is paused");
    }
    with_settings(debug, &args.control, async |c, _| {
        let r = c.pause(&args.reason).await?;
        println!(
            "Provisioning paused by {} at {}: {}",
            r.by,
            rfc3339(r.at),
            r.reason
        );
        Ok(())
    })
}

/// `resume`.
pub fn resume(debug: bool, args: &ControlArgs) -> Result<()> {
    with_settings(debug, args, async |c, _| {
        match c.resume().await? {
            Some(r) => println!(
                "Provisioning resumed (it was paused by {} at {}: {})",
                r.by,
                rfc3339(r.at),
                r.reason
            ),
            None => println!("Provisioning was not paused by an operator; nothing to resume"),
        }
        Ok(())
    })
}

/// `deny add|rm|ls`.
pub fn deny(debug: bool, cmd: &DenyCommand) -> Result<()> {
    match cmd {
        DenyCommand::Add(a) => {
            control::check_entry(&a.entry)?;
            if a.reason.trim().is_empty() {
                bail!("--reason must say why {} is denied", a.entry);
            }
            let expires = a
                .expires
                .as_deref()
                .map(control::parse_expiry)
                .transpose()?;
            with_settings(debug, &a.control, async |c, _| {
                let r = c.deny(&a.entry, &a.reason, expires).await?;
                let until = r
                    .expires
                    .map(|e| format!(" until {}", rfc3339(e)))
                    .unwrap_or_default();
                println!("Denied {}{until}: {}", r.entry, r.reason);
                Ok(())
            })
        }
        DenyCommand::Rm(a) => with_settings(debug, &a.control, async |c, _| {
            if !c.undeny(&a.entry).await? {
                bail!("{} is not on the deny list", a.entry);
            }
            println!("Removed {} from the deny list", a.entry);
            Ok(())
        }),
        DenyCommand::Ls(a) => with_settings(debug, &a.control, async |c, _| {
            let (entries, forged) = c.deny_list().await?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                print!(
                    "{}",
                    provisioner::status_text::deny_table(&entries, now_unix())
                );
            }
            if forged > 0 {
                eprintln!("warning: {forged} entries in the bucket are malformed or not signed with the provisioners' secret, and are ignored");
            }
            Ok(())
        }),
    }
}

/// `approve ID|--matching REGEX` (`approve`) and `reject ... --reason TEXT`.
pub fn decide(debug: bool, args: &DecideArgs, approve: bool) -> Result<()> {
    with_settings(debug, &args.control, async |c, settings| {
        let lasts = settings.config.approval_expiry;
        print!(
            "{}",
            c.decide(&args.identity, args.matching, approve, &args.reason, lasts)
                .await?
        );
        Ok(())
    })
}
