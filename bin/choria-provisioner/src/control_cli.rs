//! `pause`, `resume` and `deny`: fleet control through the `provisioner::control` library, with
//! the provisioner's own configuration for the broker. The binary parses and prints.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use provisioner::control::{self, Control, DenyRecord};
use provisioner::settings::{Paths, Settings};

use crate::cli::{ControlArgs, DenyCommand, PauseArgs};

/// How long a command waits for the broker and the bucket.
const TIMEOUT: Duration = Duration::from_secs(15);

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Loads the settings, warns when the configuration read does not follow fleet control, and
/// opens the bucket.
async fn open(debug: bool, args: &ControlArgs) -> Result<Control> {
    let config = args
        .config
        .clone()
        .unwrap_or_else(|| crate::cli::DEFAULT_CONFIG.into());
    let settings = Settings::load(&Paths {
        config: Some(config.clone()),
        choria_config: args.choria_config.clone(),
        debug,
    })?;
    if !settings.config.fleet_control {
        eprintln!(
            "warning: {} does not set fleet_control: true; a provisioner started from it does not follow pause or deny",
            config.display()
        );
    }
    let user = std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| "unknown".into());
    let by = format!("{user}@{}", settings.choria.identity);
    Ok(control::connect(&settings, &by, TIMEOUT).await?)
}

fn time(unix: i64) -> String {
    control::rfc3339(unix)
}

/// `pause --reason TEXT`.
pub fn pause(debug: bool, args: &PauseArgs) -> Result<()> {
    if args.reason.trim().is_empty() {
        bail!("--reason must say why provisioning is paused");
    }
    runtime()?.block_on(async {
        let c = open(debug, &args.control).await?;
        let rec = c.pause(&args.reason).await?;
        println!(
            "Provisioning paused on every replica with fleet_control by {} at {}: {}",
            rec.by,
            time(rec.at),
            rec.reason
        );
        Ok(())
    })
}

/// `resume`.
pub fn resume(debug: bool, args: &ControlArgs) -> Result<()> {
    runtime()?.block_on(async {
        let c = open(debug, args).await?;
        match c.resume().await? {
            Some(was) => println!(
                "Provisioning resumed (it was paused by {} at {}: {})",
                was.by,
                time(was.at),
                was.reason
            ),
            None => println!("Provisioning was not paused by an operator; nothing to resume"),
        }
        Ok(())
    })
}

/// `deny add|rm|ls`.
pub fn deny(debug: bool, cmd: &DenyCommand) -> Result<()> {
    runtime()?.block_on(async {
        match cmd {
            DenyCommand::Add(a) => {
                control::check_entry(&a.entry)?;
                if a.reason.trim().is_empty() {
                    bail!("--reason must say why {} is denied", a.entry);
                }
                let expires = match &a.expires {
                    None => None,
                    Some(text) => {
                        let d = provisioner::config::parse_duration(text)
                            .with_context(|| format!("invalid --expires {text:?}"))?;
                        if d.is_zero() {
                            bail!("--expires must be longer than zero");
                        }
                        Some(d)
                    }
                };
                let c = open(debug, &a.control).await?;
                let rec = c.deny(&a.entry, &a.reason, expires).await?;
                println!(
                    "Denied {} on every replica with fleet_control{}: {}",
                    rec.entry,
                    rec.expires
                        .map(|e| format!(" until {}", time(e)))
                        .unwrap_or_default(),
                    rec.reason
                );
            }
            DenyCommand::Rm(a) => {
                let c = open(debug, &a.control).await?;
                if c.undeny(&a.entry).await? {
                    println!("Removed {} from the deny list", a.entry);
                } else {
                    bail!("{} is not on the deny list", a.entry);
                }
            }
            DenyCommand::Ls(a) => {
                let c = open(debug, &a.control).await?;
                let (entries, forged) = c.deny_list().await?;
                if a.json {
                    println!("{}", serde_json::to_string_pretty(&entries)?);
                } else {
                    print!("{}", table(&entries, control::now_unix()));
                }
                if forged > 0 {
                    eprintln!("warning: {forged} entries in the bucket are malformed or not signed with the provisioners' secret, and are ignored");
                }
            }
        }
        Ok(())
    })
}

fn table(entries: &[DenyRecord], now: i64) -> String {
    if entries.is_empty() {
        return "No deny entries\n".to_string();
    }
    let mut rows = vec![vec![
        "ENTRY".to_string(),
        "BY".into(),
        "ADDED".into(),
        "EXPIRES".into(),
        "REASON".into(),
    ]];
    for e in entries {
        rows.push(vec![
            e.entry.clone(),
            e.by.clone(),
            time(e.at),
            match e.expires {
                None => "never".into(),
                Some(x) if x <= now => format!("{} (expired)", time(x)),
                Some(x) => time(x),
            },
            e.reason.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            if i == 4 {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push('\n');
    }
    out
}
