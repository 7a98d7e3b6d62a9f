//! `rotate`: rotation campaigns through `provisioner::campaign`. The binary parses and prints.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use provisioner::campaign::{self, CampaignRecord, CampaignState, Limits, Operator, Selection};
use provisioner::control::{now_unix, parse_expiry};
use provisioner::settings::Paths;
use provisioner::CancellationToken;

use crate::cli::{CampaignArgs, RotateArgs, RotateCommand};

const CONNECT: Duration = Duration::from_secs(15);

fn paths(debug: bool, args: &CampaignArgs) -> Paths {
    Paths {
        config: Some(
            args.config
                .clone()
                .unwrap_or_else(|| crate::cli::DEFAULT_CONFIG.into()),
        ),
        choria_config: args.provisioner_choria_config.clone(),
        debug,
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// `rotate ...`.
pub fn main(debug: bool, args: &RotateArgs) -> Result<()> {
    match &args.command {
        Some(RotateCommand::Status(a)) => runtime()?.block_on(async {
            let main = main_opt(&a.main).await?;
            let op = campaign::connect_operator(
                &paths(debug, &a.campaign),
                main.as_ref(),
                false,
                CONNECT,
            )
            .await?;
            let (rec, _) = op
                .campaigns
                .read()
                .await?
                .ok_or(campaign::CampaignError::NoCampaign)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&rec)?);
            } else {
                print!("{}", campaign::status_text(&rec, now_unix()));
            }
            Ok(())
        }),
        Some(RotateCommand::Pause(a)) | Some(RotateCommand::Abort(a)) => {
            let want = if matches!(args.command, Some(RotateCommand::Pause(_))) {
                CampaignState::Paused
            } else {
                CampaignState::Aborted
            };
            if a.reason.trim().is_empty() {
                bail!("--reason must say why the campaign is {want}");
            }
            runtime()?.block_on(async {
                let main = main_opt(&a.main).await?;
                let op = campaign::connect_operator(
                    &paths(debug, &a.campaign),
                    main.as_ref(),
                    false,
                    CONNECT,
                )
                .await?;
                let rec = op.campaigns.set_state(want, &a.reason).await?;
                println!("Rotation campaign {} {want}: {}", rec.id, rec.progress());
                Ok(())
            })
        }
        Some(RotateCommand::Resume(a)) => runtime()?.block_on(async {
            let rpc = campaign::main_client(&a.choria_config, CONNECT).await?;
            let op =
                campaign::connect_operator(&paths(debug, &a.campaign), Some(&rpc), false, CONNECT)
                    .await?;
            let rec = op.campaigns.set_state(CampaignState::Running, "").await?;
            println!("Rotation campaign {} resumed: {}", rec.id, rec.progress());
            drive_with(&op, rpc).await
        }),
        None => start(debug, args),
    }
}

fn start(debug: bool, args: &RotateArgs) -> Result<()> {
    let Some(main_config) = &args.choria_config else {
        bail!("--choria-config MAIN.cfg is required: the main collective's Choria client configuration, where provisioned servers answer");
    };
    let selection = match (&args.identities, &args.filter, &args.expiring_within) {
        (Some(f), _, _) => Selection::Identities(f.clone()),
        (_, Some(e), _) => Selection::Filter(e.clone()),
        (_, _, Some(d)) => Selection::ExpiringWithin(parse_expiry(d)?),
        _ => bail!("give --identities, --filter or --expiring-within"),
    };
    let limits = Limits {
        rate_per_minute: campaign::parse_rate(&args.rate)?,
        max_in_flight: args.max_in_flight,
        stop_if_failing: campaign::parse_share(&args.stop_if_failing)?,
        node_timeout_secs: parse_expiry(&args.node_timeout)?.as_secs(),
    };
    limits.validate()?;
    runtime()?.block_on(async {
        let rpc = campaign::main_client(main_config, CONNECT).await?;
        let op =
            campaign::connect_operator(&paths(debug, &args.campaign), Some(&rpc), true, CONNECT)
                .await?;
        let nodes = op.select(&selection, &rpc).await?;
        eprintln!("{} nodes selected by {selection}", nodes.len());
        let rec = op
            .start(&selection, nodes, limits, |n| {
                eprint!("\rrecorded {n} nodes in the campaign");
            })
            .await?;
        eprintln!();
        println!("Rotation campaign {} started: {} nodes", rec.id, rec.total);
        drive_with(&op, rpc).await
    })
}

async fn main_opt(
    main: &Option<std::path::PathBuf>,
) -> Result<Option<provisioner::choria_rpc_client::rpc::RpcClient>> {
    Ok(match main {
        Some(p) => Some(campaign::main_client(p, CONNECT).await?),
        None => None,
    })
}

async fn drive_with(
    op: &Operator,
    rpc: provisioner::choria_rpc_client::rpc::RpcClient,
) -> Result<()> {
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
    println!("{}", campaign::progress_line(&rec, now_unix()));
    for f in &rec.recent_failures {
        eprintln!("failed: {}: {}", f.identity, f.error);
    }
    match rec.state {
        CampaignState::Completed if rec.failed == 0 => Ok(()),
        CampaignState::Completed => bail!(
            "rotation campaign {} completed with {} failed nodes (rotate status lists the latest)",
            rec.id,
            rec.failed
        ),
        CampaignState::Running if stop.is_cancelled() => {
            eprintln!("Interrupted: the campaign is still running; continue it with rotate resume");
            Ok(())
        }
        state => bail!("rotation campaign {} is {state}: {}", rec.id, rec.reason),
    }
}
