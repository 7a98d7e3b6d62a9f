//! Command line flags, compatible with the Go provisioner's (`run` is the default command).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub use provisioner::VERSION;

/// The git commit the release was built from, when the build recorded it.
pub const COMMIT: Option<&str> = option_env!("CHORIA_PROVISIONER_COMMIT");

/// Choria Provisioner: finds Choria Servers in provisioning mode and enrolls them.
#[derive(Debug, Parser)]
#[command(
    name = "choria-provisioner",
    about = "Choria Provisioner: enrolls and configures Choria Servers waiting in provisioning mode",
    // `--version` prints the bare version, as the Go provisioner's does.
    disable_version_flag = true,
    // `run` flags may come without the command (it is the default), and `--debug` goes
    // anywhere, as in the Go tool: `--debug run --config FILE` is valid.
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// Force the log level to debug
    #[arg(long, global = true)]
    pub debug: bool,

    /// Show application version.
    #[arg(long)]
    pub version: bool,

    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    run: RunArgs,
}

impl Cli {
    /// The command to run; `run` when none was named. `run`'s flags given before the command
    /// name apply to `run` and `check` (`--config a.yaml check`); before another command,
    /// which would ignore them, they are refused.
    pub fn command(&self) -> Result<Command, clap::Error> {
        let top = &self.run;
        let before = top.config.is_some() || top.choria_config.is_some() || top.pid.is_some();
        let merged = |own: &RunArgs| -> Result<RunArgs, clap::Error> {
            let args = RunArgs {
                config: own.config.clone().or_else(|| top.config.clone()),
                choria_config: own
                    .choria_config
                    .clone()
                    .or_else(|| top.choria_config.clone()),
                pid: own.pid.clone().or_else(|| top.pid.clone()),
            };
            if args.config.is_none() {
                return Err(usage_error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "the following required arguments were not provided:\n  --config <FILE>",
                ));
            }
            Ok(args)
        };
        match &self.command {
            None => Ok(Command::Run(merged(top)?)),
            Some(Command::Run(r)) => Ok(Command::Run(merged(r)?)),
            Some(Command::Check(c)) if top.pid.is_some() => Err(usage_error(
                clap::error::ErrorKind::ArgumentConflict,
                "--pid is a flag of run, not of check",
            )),
            Some(Command::Check(c)) => {
                let own = RunArgs {
                    config: c.files.config.clone(),
                    choria_config: c.files.choria_config.clone(),
                    pid: None,
                };
                let files = merged(&own)?;
                Ok(Command::Check(CheckArgs {
                    files: FileArgs {
                        config: files.config,
                        choria_config: files.choria_config,
                    },
                    probe: c.probe,
                }))
            }
            Some(_) if before => Err(usage_error(
                clap::error::ErrorKind::ArgumentConflict,
                "--config, --choria-config and --pid before a command apply to run and check only; \
                 give this command's own flags after its name",
            )),
            Some(c) => Ok(c.clone()),
        }
    }
}

fn usage_error(kind: clap::error::ErrorKind, message: &str) -> clap::Error {
    <Cli as clap::CommandFactory>::command().error(kind, message)
}

/// The sub commands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the provisioner (the default command)
    #[command(
        after_help = "Example:\n  choria-provisioner run --config prov.yaml --pid /run/prov.pid"
    )]
    Run(RunArgs),
    /// Check both configuration files, the helper and every key named, print what the daemon
    /// would do, and exit non-zero listing every problem
    #[command(after_help = "Example:\n  choria-provisioner check --config prov.yaml --probe")]
    Check(CheckArgs),
    /// Work with the rego_policy
    #[command(subcommand)]
    #[command(
        after_help = "Example:\n  choria-provisioner policy eval --config prov.yaml --input in.json"
    )]
    Policy(PolicyCommand),
    /// Show a running provisioner's status: role, queue, workers, totals, history kept
    #[command(after_help = "Example:\n  choria-provisioner status --json")]
    Status(ApiArgs),
    /// List the nodes a running provisioner has seen recently, newest first
    #[command(after_help = "Example:\n  choria-provisioner nodes --state failed --limit 20")]
    Nodes(NodesArgs),
    /// Show one node's state, cause and history on a running provisioner
    #[command(after_help = "Example:\n  choria-provisioner node web7.example.net")]
    Node(NodeArgs),
    /// Pause provisioning on every replica with fleet_control: nothing new is queued or
    /// started, nodes in flight finish
    #[command(after_help = "Example:\n  choria-provisioner pause --reason \"CA upgrade\"")]
    Pause(PauseArgs),
    /// Lift the pause on every replica with fleet_control
    #[command(after_help = "Example:\n  choria-provisioner resume")]
    Resume(ControlArgs),
    /// Deny nodes on every replica with fleet_control: by identity, /REGEX/ or key fingerprint
    #[command(subcommand)]
    #[command(
        after_help = "Example:\n  choria-provisioner deny add web7.example.net --reason \"stolen\""
    )]
    Deny(DenyCommand),
    /// Approve nodes waiting for approval: each is provisioned at once, if it still presents
    /// the keys it had when pending
    #[command(after_help = "Example:\n  choria-provisioner approve --matching \"^lab-\"")]
    Approve(DecideArgs),
    /// Reject nodes waiting for approval: their key fingerprints go on the deny list
    #[command(
        after_help = "Example:\n  choria-provisioner reject web7.example.net --reason \"not ours\""
    )]
    Reject(DecideArgs),
    /// Rotate provisioned servers: send choria_provision#reprovision in waves on the main
    /// collective and follow each node until it is provisioned again
    #[command(
        after_help = "Example:\n  choria-provisioner rotate --expiring-within 7d --choria-config main.cfg"
    )]
    Rotate(RotateArgs),
    /// Write the man pages and shell completions the packages install under --out DIR
    #[command(hide = true)]
    GenerateAssets {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

/// How `rotate` reaches the campaign bucket and the main collective.
#[derive(Debug, Clone, Args)]
pub struct CampaignArgs {
    /// The provisioner configuration file (YAML) [default:
    /// /etc/choria-provisioner/choria-provisioner.yaml]
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub config: Option<PathBuf>,

    /// The provisioner's Choria client configuration file, for the campaign bucket (default:
    /// the Choria user configuration)
    #[arg(long = "provisioner-choria-config", value_name = "FILE", value_parser = existing_file)]
    pub provisioner_choria_config: Option<PathBuf>,

    /// The main collective's Choria client configuration, where provisioned servers answer
    /// (required to start or resume; the campaign lives there when the provisioning account
    /// has no Choria Streams of its own)
    #[arg(long = "choria-config", value_name = "MAIN.cfg", value_parser = existing_file)]
    pub choria_config: Option<PathBuf>,
}

/// Flags of `rotate`: start a campaign and drive it.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
#[command(group(clap::ArgGroup::new("selection").required(true).args(["identities", "filter", "expiring_within"])))]
pub struct RotateArgs {
    #[command(subcommand)]
    pub command: Option<RotateCommand>,

    #[command(flatten)]
    pub campaign: CampaignArgs,

    /// A file of identities to rotate, one a line
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub identities: Option<PathBuf>,

    /// Discover the servers to rotate: identity=NAME|/RE/, class=NAME, agent=NAME or FACT OP
    /// VALUE terms, separated by spaces
    #[arg(long, value_name = "EXPR")]
    pub filter: Option<String>,

    /// Rotate the nodes whose certificate or server JWT, as the audit stream recorded it,
    /// expires within this long (7d, 12h)
    #[arg(long = "expiring-within", value_name = "DURATION")]
    pub expiring_within: Option<String>,

    /// Reprovision requests a minute at most (N/min, N/s, N/h)
    #[arg(long, value_name = "RATE", default_value = "500/min")]
    pub rate: String,

    /// Nodes between their reprovision request and their new provisioning at most
    #[arg(long = "max-in-flight", value_name = "N", default_value_t = 100)]
    pub max_in_flight: u32,

    /// Stop the campaign when more than this share of the finished nodes failed
    #[arg(long = "stop-if-failing", value_name = "PERCENT", default_value = "5%")]
    pub stop_if_failing: String,

    /// Fail a node not provisioned again this long after it acknowledged (15m, 1h)
    #[arg(long = "node-timeout", value_name = "DURATION", default_value = "15m")]
    pub node_timeout: String,
}

/// `rotate` commands on the campaign under way.
#[derive(Debug, Clone, Subcommand)]
pub enum RotateCommand {
    /// Show the campaign: state, progress, ETA, latest failures
    #[command(after_help = "Example:\n  choria-provisioner rotate status --json")]
    Status(RotateStatusArgs),
    /// Pause the campaign: no more requests are sent; nodes in flight finish
    #[command(
        after_help = "Example:\n  choria-provisioner rotate pause --reason \"CA maintenance\""
    )]
    Pause(RotateReasonArgs),
    /// Resume a paused or stopped campaign, or one whose driver died, and drive it
    #[command(
        after_help = "Example:\n  choria-provisioner rotate resume --choria-config main.cfg"
    )]
    Resume(CampaignArgs),
    /// End the campaign; nodes already sent finish on their own
    #[command(after_help = "Example:\n  choria-provisioner rotate abort --reason \"wrong list\"")]
    Abort(RotateReasonArgs),
}

/// Flags of `rotate status`.
#[derive(Debug, Clone, Args)]
pub struct RotateStatusArgs {
    #[command(flatten)]
    pub campaign: CampaignArgs,

    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// Flags of `rotate pause` and `rotate abort`.
#[derive(Debug, Clone, Args)]
pub struct RotateReasonArgs {
    #[command(flatten)]
    pub campaign: CampaignArgs,

    /// Why, kept in the campaign
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
}

/// Flags of `approve` and `reject`.
#[derive(Debug, Clone, Args)]
pub struct DecideArgs {
    /// The pending node's identity, or with --matching a regular expression of identities
    #[arg(value_name = "ID")]
    pub identity: String,

    /// ID is a regular expression: act on every pending node it matches
    #[arg(long)]
    pub matching: bool,

    #[command(flatten)]
    pub control: ControlArgs,

    /// Why: required by reject and put in the deny entries it adds; kept with an approval and
    /// shown when it applies
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub reason: String,
}

/// How `pause`, `resume` and `deny` reach the fleet control bucket: with the provisioner's
/// broker settings.
#[derive(Debug, Clone, Args)]
pub struct ControlArgs {
    /// The provisioner configuration file (YAML) [default:
    /// /etc/choria-provisioner/choria-provisioner.yaml]
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub config: Option<PathBuf>,

    /// The Choria client configuration file (default: the Choria user configuration)
    #[arg(long = "choria-config", value_name = "FILE", value_parser = existing_file)]
    pub choria_config: Option<PathBuf>,

    /// Succeed when no running provisioner follows the bucket (to prepare a deny list or a
    /// pause before the first start); by default such a change is an error, since it reached
    /// nothing
    #[arg(long)]
    pub no_replicas_ok: bool,
}

/// Flags of `pause`.
#[derive(Debug, Clone, Args)]
pub struct PauseArgs {
    #[command(flatten)]
    pub control: ControlArgs,

    /// Why, shown by every replica's log and by `resume`
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
}

/// `deny` commands.
#[derive(Debug, Clone, Subcommand)]
pub enum DenyCommand {
    /// Deny an identity, a /REGEX/ of identities or a key fingerprint (sha256:HEX)
    #[command(
        after_help = "Example:\n  choria-provisioner deny add \"/^lab-/\" --reason lab --expires 30d"
    )]
    Add(DenyAddArgs),
    /// Remove a deny entry
    #[command(after_help = "Example:\n  choria-provisioner deny rm web7.example.net")]
    Rm(DenyEntryArgs),
    /// List the deny entries
    #[command(after_help = "Example:\n  choria-provisioner deny ls --json")]
    Ls(DenyLsArgs),
}

/// Flags of `deny add`.
#[derive(Debug, Clone, Args)]
pub struct DenyAddArgs {
    /// The identity, /REGEX/ or sha256:HEX key fingerprint
    #[arg(value_name = "ENTRY")]
    pub entry: String,

    #[command(flatten)]
    pub control: ControlArgs,

    /// Why, shown in every refusal
    #[arg(long, value_name = "TEXT")]
    pub reason: String,

    /// How long the entry applies, as 30d, 12h or 90m (default: until removed)
    #[arg(long, value_name = "DURATION")]
    pub expires: Option<String>,
}

/// Flags of `deny rm`.
#[derive(Debug, Clone, Args)]
pub struct DenyEntryArgs {
    /// The entry as it was added
    #[arg(value_name = "ENTRY")]
    pub entry: String,

    #[command(flatten)]
    pub control: ControlArgs,
}

/// Flags of `deny ls`.
#[derive(Debug, Clone, Args)]
pub struct DenyLsArgs {
    #[command(flatten)]
    pub control: ControlArgs,

    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

/// The packaged configuration file, read by `status`, `nodes` and `node` when neither
/// `--config` nor `--monitor` is given.
pub const DEFAULT_CONFIG: &str = "/etc/choria-provisioner/choria-provisioner.yaml";

/// How `status`, `nodes` and `node` reach the daemon.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// The provisioner configuration file (YAML) naming monitor_port, monitor_address and
    /// monitor_token_file [default: /etc/choria-provisioner/choria-provisioner.yaml]
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub config: Option<PathBuf>,

    /// The monitor listener's URL, as http://HOST:PORT or https://HOST:PORT (default: the
    /// configuration's)
    #[arg(long, value_name = "URL")]
    pub monitor: Option<String>,

    /// A file holding the API's bearer token (default: the configuration's monitor_token_file)
    #[arg(long = "token-file", value_name = "FILE", value_parser = existing_file)]
    pub token_file: Option<PathBuf>,

    /// Print the API's JSON, not a table
    #[arg(long)]
    pub json: bool,
}

/// Flags of `nodes`.
#[derive(Debug, Clone, Args)]
pub struct NodesArgs {
    /// Only nodes in this state: queued, working, provisioned, upgraded, shut_down, lock_held,
    /// deferred, refused, failed, dry_run or pending
    #[arg(long, value_name = "STATE")]
    pub state: Option<String>,

    /// List the nodes waiting for an operator's approval instead (identity, key fingerprint,
    /// first and last seen, facts)
    #[arg(long)]
    pub pending: bool,

    /// Skip this many nodes
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub offset: usize,

    /// Show at most this many nodes (at most 500)
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub limit: usize,

    #[command(flatten)]
    pub api: ApiArgs,
}

/// Flags of `node`.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// The node's identity
    #[arg(value_name = "IDENTITY")]
    pub identity: String,

    #[command(flatten)]
    pub api: ApiArgs,
}

/// The `policy` sub commands.
#[derive(Debug, Clone, Subcommand)]
pub enum PolicyCommand {
    /// Evaluate the configured rego_policy against a recorded helper input and print the
    /// decision and reason
    #[command(
        after_help = "Example:\n  choria-provisioner policy eval --config prov.yaml --input in.json --explain"
    )]
    Eval(PolicyEvalArgs),
}

/// Flags of `policy eval`.
#[derive(Debug, Clone, Args)]
pub struct PolicyEvalArgs {
    /// The provisioner configuration file (YAML) naming rego_policy
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub config: PathBuf,

    /// A helper input as JSON (as record_helper_inputs writes it)
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub input: PathBuf,

    /// Also show every rule of the package that produced a value
    #[arg(long)]
    pub explain: bool,
}

/// Flags of `check`: `run`'s files, and `--probe`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub files: FileArgs,

    /// Also reach the helper when it is a webhook: one signed GET, over TLS with the client
    /// certificate when configured (nothing is provisioned)
    #[arg(long)]
    pub probe: bool,
}

/// The files `check` reads, as `run` names them.
#[derive(Debug, Clone, Args)]
pub struct FileArgs {
    /// The provisioner configuration file (YAML); required
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub config: Option<PathBuf>,

    /// The Choria client configuration file (default: the Choria user configuration)
    #[arg(long = "choria-config", value_name = "FILE", value_parser = existing_file)]
    pub choria_config: Option<PathBuf>,
}

/// Flags of `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The provisioner configuration file (YAML); required
    #[arg(long, value_name = "FILE", value_parser = existing_file)]
    pub config: Option<PathBuf>,

    /// The Choria client configuration file (default: the Choria user configuration)
    #[arg(long = "choria-config", value_name = "FILE", value_parser = existing_file)]
    pub choria_config: Option<PathBuf>,

    /// Write the process id to this file, removed on exit
    #[arg(long, value_name = "FILE")]
    pub pid: Option<PathBuf>,
}

fn existing_file(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    match std::fs::metadata(&p) {
        Ok(m) if m.is_file() => Ok(p),
        Ok(_) => Err(format!("{s} is not a file")),
        Err(e) => Err(format!("cannot read {s}: {e}")),
    }
}

/// The library's view of `run`'s file flags.
pub fn paths(args: &RunArgs, debug: bool) -> provisioner::settings::Paths {
    provisioner::settings::Paths {
        config: args.config.clone(),
        choria_config: args.choria_config.clone(),
        debug,
    }
}

/// The library's view of `check`'s file flags.
pub fn check_paths(args: &FileArgs, debug: bool) -> provisioner::settings::Paths {
    provisioner::settings::Paths {
        config: args.config.clone(),
        choria_config: args.choria_config.clone(),
        debug,
    }
}
