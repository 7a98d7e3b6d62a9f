//! `rotate`: rotation campaigns through `provisioner::rotate`. The binary parses and prints.

use anyhow::Result;
use provisioner::fleet_lifecycle::campaign::CampaignState;
use provisioner::rotate::{self, RotateCommand, StartFlags};
use provisioner::settings::Paths;

use crate::cli::{self, CampaignArgs, RotateArgs};

/// `rotate ...`.
pub fn main(debug: bool, args: &RotateArgs) -> Result<()> {
    let (files, cmd) = match &args.command {
        Some(cli::RotateCommand::Status(a)) => {
            (&a.campaign, RotateCommand::Status { json: a.json })
        }
        Some(cli::RotateCommand::Pause(a)) => (&a.campaign, set(CampaignState::Paused, &a.reason)),
        Some(cli::RotateCommand::Abort(a)) => (&a.campaign, set(CampaignState::Aborted, &a.reason)),
        Some(cli::RotateCommand::Resume(a)) => (a, RotateCommand::Resume),
        None => (
            &args.campaign,
            StartFlags {
                identities: args.identities.clone(),
                filter: args.filter.clone(),
                expiring_within: args.expiring_within.clone(),
                rate: args.rate.clone(),
                max_in_flight: args.max_in_flight,
                stop_if_failing: args.stop_if_failing.clone(),
                node_timeout: args.node_timeout.clone(),
            }
            .command()?,
        ),
    };
    let paths = paths(debug, files);
    let runtime = provisioner::runtime(2)?;
    let out = runtime.block_on(rotate::run(&paths, files.choria_config.as_deref(), cmd))?;
    print!("{out}");
    Ok(())
}

fn set(state: CampaignState, reason: &str) -> RotateCommand {
    RotateCommand::Set {
        state,
        reason: reason.to_string(),
    }
}

fn paths(debug: bool, args: &CampaignArgs) -> Paths {
    Paths {
        config: Some(
            args.config
                .clone()
                .unwrap_or_else(|| cli::DEFAULT_CONFIG.into()),
        ),
        choria_config: args.provisioner_choria_config.clone(),
        debug,
    }
}
