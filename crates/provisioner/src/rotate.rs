//! The operator's `rotate` commands over [`fleet_lifecycle::campaign`]: each connects with the
//! provisioner's files (and the main collective's client configuration where it needs one),
//! does one thing and returns what to print, so the binary only parses and prints.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::settings::Paths;
use fleet_lifecycle::campaign::{
    self, CampaignError, CampaignRecord, CampaignState, Limits, Operator, Selection,
};
use fleet_lifecycle::control::parse_expiry;
use fleet_lifecycle::now_unix;

/// How long a command waits for its broker connections.
pub const CONNECT: Duration = Duration::from_secs(15);

/// A `rotate` command, as parsed.
#[derive(Debug, Clone)]
pub enum RotateCommand {
    /// Start a campaign and drive it.
    Start {
        /// `--identities`, `--filter` or `--expiring-within`.
        selection: Selection,
        /// The limits.
        limits: Limits,
    },
    /// `rotate status [--json]`.
    Status {
        /// Print JSON.
        json: bool,
    },
    /// `rotate pause|abort --reason`.
    Set {
        /// `paused` or `aborted`.
        state: CampaignState,
        /// Why.
        reason: String,
    },
    /// `rotate resume`: running again, then driven.
    Resume,
}

/// The flags of a campaign's start, as given: one selection, the limits as text.
#[derive(Debug, Clone, Default)]
pub struct StartFlags {
    /// `--identities FILE`.
    pub identities: Option<PathBuf>,
    /// `--filter EXPR`.
    pub filter: Option<String>,
    /// `--expiring-within DURATION`.
    pub expiring_within: Option<String>,
    /// `--rate`.
    pub rate: String,
    /// `--max-in-flight`.
    pub max_in_flight: u32,
    /// `--stop-if-failing`.
    pub stop_if_failing: String,
    /// `--node-timeout`.
    pub node_timeout: String,
}

impl StartFlags {
    /// The command these flags start.
    pub fn command(&self) -> Result<RotateCommand, crate::Error> {
        let selection = match (&self.identities, &self.filter, &self.expiring_within) {
            (Some(f), _, _) => Selection::Identities(f.clone()),
            (_, Some(e), _) => Selection::Filter(e.clone()),
            (_, _, Some(d)) => Selection::ExpiringWithin(parse_expiry(d)?),
            _ => {
                return Err(CampaignError::Invalid(
                    "give --identities, --filter or --expiring-within".into(),
                )
                .into())
            }
        };
        let limits = Limits {
            rate_per_minute: campaign::parse_rate(&self.rate)?,
            max_in_flight: self.max_in_flight,
            stop_if_failing: campaign::parse_share(&self.stop_if_failing)?,
            node_timeout_secs: parse_expiry(&self.node_timeout)?.as_secs(),
        };
        limits.validate()?;
        Ok(RotateCommand::Start { selection, limits })
    }
}

/// Runs `cmd` with the provisioner's files `paths` and, where given, the main collective's
/// client configuration `main` (required to start or resume). Returns what to print.
pub async fn run(
    paths: &Paths,
    main: Option<&Path>,
    cmd: RotateCommand,
) -> Result<String, crate::Error> {
    let needs_main = matches!(cmd, RotateCommand::Start { .. } | RotateCommand::Resume);
    let rpc = match main {
        Some(p) => Some(crate::operator::main_client(p, CONNECT).await?),
        None if needs_main => {
            return Err(CampaignError::Invalid(
                "--choria-config MAIN.cfg is required: the main collective's Choria client configuration, where provisioned servers answer".into(),
            )
            .into())
        }
        None => None,
    };
    let create = matches!(cmd, RotateCommand::Start { .. });
    let op = crate::operator::campaigns(paths, rpc.as_ref(), create, CONNECT).await?;
    match cmd {
        RotateCommand::Status { json } => {
            let (rec, _) = op
                .campaigns
                .read()
                .await?
                .ok_or(CampaignError::NoCampaign)?;
            Ok(if json {
                serde_json::to_string_pretty(&rec).unwrap_or_default() + "\n"
            } else {
                campaign::status_text(&rec, now_unix())
            })
        }
        RotateCommand::Set { state, reason } => {
            if reason.trim().is_empty() {
                return Err(CampaignError::Invalid(format!(
                    "--reason must say why the campaign is {state}"
                ))
                .into());
            }
            let rec = op.campaigns.set_state(state, &reason).await?;
            Ok(format!(
                "Rotation campaign {} {state}: {}\n",
                rec.id,
                rec.progress()
            ))
        }
        RotateCommand::Resume => {
            let rec = op.campaigns.set_state(CampaignState::Running, "").await?;
            eprintln!("Rotation campaign {} resumed: {}", rec.id, rec.progress());
            drive(&op, rpc).await
        }
        RotateCommand::Start { selection, limits } => {
            let Some(client) = &rpc else {
                return Err(CampaignError::NoCampaign.into());
            };
            let nodes = op.select(&selection, client).await?;
            eprintln!("{} nodes selected by {selection}", nodes.len());
            let rec = op
                .start(&selection, nodes, limits, |n| {
                    eprint!("\rrecorded {n} nodes in the campaign");
                })
                .await?;
            eprintln!(
                "\nRotation campaign {} started: {} nodes",
                rec.id, rec.total
            );
            drive(&op, rpc).await
        }
    }
}

/// Drives the campaign until it ends or Ctrl-C, showing progress on stderr (a line rewritten
/// on a terminal, else one every 10 s); the last line and failures to print, or why the
/// campaign did not complete cleanly.
async fn drive(
    op: &Operator,
    rpc: Option<choria_rpc_client::rpc::RpcClient>,
) -> Result<String, crate::Error> {
    let Some(rpc) = rpc else {
        return Err(CampaignError::NoCampaign.into());
    };
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_signal.cancel();
        }
    });
    let tty = std::io::stderr().is_terminal();
    let mut last_line = Instant::now();
    let mut show = |rec: &CampaignRecord| {
        let line = campaign::progress_line(rec, now_unix());
        if tty {
            eprint!("\r{line}\x1b[K");
        } else if last_line.elapsed() >= Duration::from_secs(10) {
            last_line = Instant::now();
            eprintln!("{line}");
        }
    };
    let rec = op.driver(rpc).await?.drive(stop.clone(), &mut show).await?;
    if tty {
        eprintln!();
    }
    for f in &rec.recent_failures {
        eprintln!("failed: {}: {}", f.identity, f.error);
    }
    let last = format!("{}\n", campaign::progress_line(&rec, now_unix()));
    let refuse = |what: String| {
        CampaignError::State {
            id: rec.id.clone(),
            state: rec.state,
            what,
        }
        .into()
    };
    match rec.state {
        CampaignState::Completed if rec.failed == 0 => Ok(last),
        CampaignState::Completed => {
            print!("{last}");
            Err(refuse(format!(
                "{} failed nodes (rotate status lists the latest)",
                rec.failed
            )))
        }
        CampaignState::Running if stop.is_cancelled() => {
            Ok(last
                + "Interrupted: the campaign is still running; continue it with rotate resume\n")
        }
        _ => {
            print!("{last}");
            Err(refuse(rec.reason.clone()))
        }
    }
}
