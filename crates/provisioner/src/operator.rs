//! An operator's commands reach the fleet lifecycle ([`fleet_lifecycle`]) with the
//! provisioner's own files: the broker connection and credentials the daemon uses, the records'
//! seal from its claims secret, and the operator named as `USER@IDENTITY` in what they write.

use std::path::Path;
use std::time::Duration;

use choria_rpc_client::rpc::RpcClient;
use fleet_lifecycle::campaign::{CampaignError, Campaigns, Operator};
use fleet_lifecycle::control::Control;
use tracing::info;

use crate::settings::{Paths, Settings};
use crate::Error;

/// Who an operator's records name: `USER@IDENTITY` (`SUDO_USER` first, then `USER`), the
/// identity being the Choria configuration's.
pub fn operator_name(settings: &Settings) -> String {
    let user = std::env::var("SUDO_USER")
        .or_else(|_| std::env::var("USER"))
        .unwrap_or_else(|_| "unknown".into());
    format!("{user}@{}", settings.choria.identity)
}

/// The provisioning connection of `settings` (its credentials, as the daemon connects), made
/// and handed to `open`, the whole bounded by `timeout`.
async fn with_connection<T>(
    settings: &Settings,
    timeout: Duration,
    open: impl AsyncFnOnce(choria_rpc_client::async_nats::Client) -> Result<T, Error>,
) -> Result<T, Error> {
    let connection =
        choria_rpc_client::connection::ConnectionSettings::from_config(&settings.choria)?;
    connection.validate()?;
    let connect = async {
        let nats = choria_rpc_client::connection::connect(&connection).await?;
        open(nats).await
    };
    tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| Error::ConnectTimeout(timeout))?
}

/// Fleet control for a one-off command (`pause`, `resume`, `deny`, `approve`): the bucket
/// opened over the provisioning connection of `settings`, created when missing; `by` names the
/// operator in the records written.
pub async fn control(settings: &Settings, by: &str, timeout: Duration) -> Result<Control, Error> {
    let seal = crate::aa::seal(&settings.config)?;
    with_connection(settings, timeout, async |nats| {
        Ok(Control::open(nats, by, seal, true).await?)
    })
    .await
}

/// Fleet control for an operator's command from the provisioner's files, and the settings
/// they hold (a daemon started from them follows the bucket only with `fleet_control`).
pub async fn control_from_files(
    paths: &Paths,
    timeout: Duration,
) -> Result<(Control, Settings), Error> {
    let settings = Settings::load(paths)?;
    let control = control(&settings, &operator_name(&settings), timeout).await?;
    Ok((control, settings))
}

/// The campaign bucket for an operator's command from the provisioner's files; `create` makes
/// the bucket when missing (starting a campaign), else a missing bucket means there is no
/// campaign.
///
/// The bucket is looked for in the provisioning account first (beside fleet control, where
/// the provisioners' status API shows it). Behind a Choria broker the provisioning account
/// reaches no streams but the election's; then, with `main` (a client of the main
/// collective), the bucket lives in the main collective's Choria Streams.
pub async fn campaigns(
    paths: &Paths,
    main: Option<&RpcClient>,
    create: bool,
    timeout: Duration,
) -> Result<Operator, Error> {
    let settings = Settings::load(paths)?;
    let by = operator_name(&settings);
    let seal = crate::aa::seal(&settings.config)?;
    let campaigns = with_connection(&settings, timeout, async |nats| {
        let here = Campaigns::open(nats.clone(), &by, seal.clone(), create).await;
        let opened = match (here, main) {
            (Err(CampaignError::Unreachable { detail }), Some(rpc)) => {
                info!("campaign: the provisioning account has no Choria Streams for it ({detail}); using the main collective's");
                Campaigns::open(rpc.nats().clone(), &by, seal, create).await?
            }
            (here, _) => here?,
        };
        Ok(opened.with_provisioning(nats))
    })
    .await?;
    Ok(Operator {
        campaigns,
        rule: settings.config.provision.identity_rule().clone(),
        audit_stream: settings.config.audit_stream.clone(),
        token: settings.config.provision.token().to_string(),
    })
}

/// A client of the main collective from the Choria configuration `path` (the servers' own
/// collective, where provisioned servers answer), bounded by `timeout`.
pub async fn main_client(path: &Path, timeout: Duration) -> Result<RpcClient, Error> {
    let cfg = choria_rpc_client::config::ChoriaConfig::load(path).map_err(|source| {
        Error::ChoriaConfig {
            path: path.to_path_buf(),
            source,
        }
    })?;
    tokio::time::timeout(timeout, RpcClient::connect(&cfg))
        .await
        .map_err(|_| Error::ConnectTimeout(timeout))?
        .map_err(|source| Error::MainCollective {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
}
