//! Both configurations, loaded once with the provisioner's overrides of the Choria
//! configuration. Loading only: what is wrong with them is judged by [`crate::preflight`].

use std::path::{Path, PathBuf};

use choria_rpc_client::config::{ChoriaConfig, ProvisionerOverrides};

use crate::config::{Config, ConfigWarning};
use crate::Error;

/// Where the two configuration files are, as given on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Paths {
    /// The provisioner configuration (YAML); required.
    pub config: Option<PathBuf>,
    /// The Choria client configuration; `None` means the Choria user configuration.
    pub choria_config: Option<PathBuf>,
    /// `--debug`: the log level forced to debug.
    pub debug: bool,
}

impl Paths {
    /// Both files named.
    pub fn new(config: impl Into<PathBuf>, choria_config: impl Into<PathBuf>) -> Self {
        Paths {
            config: Some(config.into()),
            choria_config: Some(choria_config.into()),
            debug: false,
        }
    }
}

/// The largest token file read.
const MAX_TOKEN_FILE: u64 = 64 * 1024;

/// The bearer token in `path` (its first line, trimmed), `None` for an empty path. A missing,
/// unreadable, oversized or empty file is an error.
pub fn read_token(path: &str) -> Result<Option<String>, Error> {
    use std::io::Read as _;
    if path.is_empty() {
        return Ok(None);
    }
    let what = "monitor_token_file";
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_FILE).read_to_string(&mut text))
        .map_err(|e| Error::file("read", what, path, e))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(Error::EmptyFile {
            what,
            path: path.into(),
        });
    }
    Ok(Some(token))
}

/// Both configurations, loaded, validated and with the provisioner's overrides applied.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The provisioner YAML.
    pub config: Config,
    /// Warnings found while loading it.
    pub warnings: Vec<ConfigWarning>,
    /// The Choria client configuration.
    pub choria: ChoriaConfig,
}

/// The Choria configuration file named on the command line, else the user's.
pub(crate) fn choria_path(args: &Paths) -> PathBuf {
    args.choria_config
        .clone()
        .unwrap_or_else(choria_rpc_client::config::user_config_path)
}

/// What the provisioner configuration changes in the Choria configuration.
pub(crate) fn overrides(config: &Config, debug: bool) -> ProvisionerOverrides {
    let set = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
    ProvisionerOverrides {
        insecure: config.choria_insecure,
        broker_provisioning_password: set(&config.broker_provisioning_password),
        loglevel: set(&config.loglevel),
        logfile: set(&config.logfile),
        debug,
    }
}

impl Settings {
    /// Load and validate both files for `run`, failing on the first error; nothing is opened
    /// or bound yet.
    pub fn load(args: &Paths) -> Result<Settings, Error> {
        let debug = args.debug;
        let path = args.config.as_deref().ok_or(Error::NoConfig)?;
        let loaded = Config::load(path)?;
        let choria_path = choria_path(args);
        let mut choria =
            ChoriaConfig::load(&choria_path).map_err(|source| Error::ChoriaConfig {
                path: choria_path.clone(),
                source,
            })?;
        choria.apply_provisioner_overrides(&overrides(&loaded.config, debug));
        Ok(Settings {
            config: loaded.config,
            warnings: loaded.warnings,
            choria,
        })
    }

    /// Both configurations built by an embedder, with the provisioner's overrides applied to
    /// the Choria one as [`Settings::load`] applies them (the `provisioning` collective, and
    /// with `choria_insecure` no TLS and the file provider).
    pub fn new(config: Config, mut choria: ChoriaConfig) -> Settings {
        choria.apply_provisioner_overrides(&overrides(&config, false));
        Settings {
            config,
            warnings: Vec::new(),
            choria,
        }
    }

    /// The provisioner configuration file.
    pub fn config_file(&self) -> &Path {
        &self.config.file
    }
}
