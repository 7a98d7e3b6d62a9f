//! The one error of the library's entry points: loading the settings, starting and running the
//! daemon. Each names what it was doing and the file or setting involved; [`crate::one_line`]
//! turns one (with its causes) into the line the binary prints.

use std::path::PathBuf;

/// Why the provisioner could not load its settings, start, or keep running.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No provisioner configuration file was named.
    #[error("--config is required: the provisioner configuration file")]
    NoConfig,
    /// The provisioner configuration cannot be used.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The Choria configuration cannot be loaded.
    #[error("cannot load the Choria configuration {}", path.display())]
    ChoriaConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: choria_rpc_client::config::ChoriaConfigError,
    },
    /// The Choria security provider cannot be used.
    #[error("Choria security")]
    Security(#[source] choria_rpc_client::config::ChoriaConfigError),
    /// The preflight found problems the daemon cannot work with (what `check` lists).
    #[error(
        "refusing to start, {} problem(s) found (as `choria-provisioner check` reports): {}",
        problems.len(),
        problems.join("; ")
    )]
    Refused {
        /// Every fatal problem, as `check` words it.
        problems: Vec<String>,
    },
    /// A file could not be opened, read or written.
    #[error("cannot {action} {what} {}", path.display())]
    File {
        /// `open`, `read`, `create`...
        action: &'static str,
        /// The setting naming it (`audit_file`, `monitor_token_file`, `logfile`...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A file that must hold something is empty.
    #[error("{what} {} is empty", path.display())]
    EmptyFile {
        /// The setting naming it.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The monitor listener could not be started.
    #[error(transparent)]
    Monitor(#[from] provisioner_status::ServeError),
    /// The monitor listener's TLS files cannot be used.
    #[error(transparent)]
    MonitorTls(provisioner_status::tls::TlsError),
    /// The broker connection cannot be made with these settings.
    #[error(transparent)]
    Connection(#[from] choria_rpc_client::connection::ConnectionError),
    /// The RPC client could not start on the connection.
    #[error(transparent)]
    Rpc(#[from] choria_rpc_client::rpc::RequestError),
    /// Leader election cannot start (Choria Streams unreachable, the bucket missing or
    /// unusable) and `leader_election_wait` is off.
    #[error("leader election cannot start (set leader_election_wait: true to keep trying)")]
    Election(#[source] choria_rpc_client::election::ElectionError),
    /// The active-active claims bucket cannot be used.
    #[error(transparent)]
    Claims(#[from] crate::claims::ClaimsError),
    /// Fleet control (pause, deny list) cannot be used.
    #[error(transparent)]
    Control(#[from] fleet_lifecycle::control::ControlError),
    /// A rotation campaign cannot be started, read or driven.
    #[error(transparent)]
    Campaign(#[from] fleet_lifecycle::campaign::CampaignError),
    /// A client of the main collective could not be started.
    #[error("cannot connect to the main collective with {}", path.display())]
    MainCollective {
        /// The Choria configuration used.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<choria_rpc_client::rpc::SetupError>,
    },
    /// The broker could not be reached in time by a one-off command.
    #[error("could not connect to the broker within {0:?}")]
    ConnectTimeout(std::time::Duration),
    /// The site helper cannot be run as configured.
    #[error(transparent)]
    Helper(#[from] helper_protocol::HelperError),
    /// The `rego_policy` cannot be loaded.
    #[error(transparent)]
    Policy(#[from] crate::rego::PolicyError),
    /// The async runtime or a signal handler could not be set up.
    #[error("cannot start {what}")]
    Runtime {
        /// What could not be started.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// What the Go provisioner says before such an error when it exits (`Provisioning could
    /// not be configured`, `Provisioning could not configure Choria`, `Provisioning could not
    /// start`), so the binary's last line reads as Go's.
    pub fn stage(&self) -> &'static str {
        match self {
            Error::NoConfig | Error::Config(_) | Error::Refused { .. } => {
                "Provisioning could not be configured"
            }
            Error::ChoriaConfig { .. } | Error::Security(_) => {
                "Provisioning could not configure Choria"
            }
            _ => "Provisioning could not start",
        }
    }

    /// A file error.
    pub(crate) fn file(
        action: &'static str,
        what: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::File {
            action,
            what,
            path: path.into(),
            source,
        }
    }
}
