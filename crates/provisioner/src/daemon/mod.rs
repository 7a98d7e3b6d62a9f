//! The running provisioner: connect, elect, discover, provision, serve metrics, drain.
//!
//! Start-up follows the Go provisioner's `cmd/provisioner.go` and `hosts.Process`: both
//! configurations are loaded and validated before anything binds, and the daemon refuses to
//! start on any problem `check` reports (the same [`preflight`]); then the broker connection,
//! the provisioner's own startup event, the election (paused until won), the lifecycle listener,
//! discovery at start and every `interval`, and the workers.
//!
//! Every task the daemon starts is owned by a [`JoinSet`] and waited for before it returns: the
//! signal handler and the connection watch, the listener, discovery and the election (whose
//! follower runs inside it), and the workers. Control follows the election's own state and the
//! fleet's own counts, never a metric.

mod start;
mod tasks;

use std::sync::Arc;
use std::time::Duration;

use provision_core::Observer;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::preflight::Problem;
use crate::settings::Settings;
use crate::Error;
use crate::VERSION;
use start::{Feeders, FleetControl, FleetParts, Running};
pub use tasks::{discovery_shards, DISCOVERY_SHARD_SIZE, MAX_DISCOVERY_SHARDS};

/// The tokio runtime for `threads` threads (the `threads` setting, [`Config::threads`]): a
/// current-thread runtime for 0 or 1, the cheapest per node, since the tasks that wake each
/// other (a worker and the broker connection's writer above all) then run in turn on one core
/// and one write to the broker carries every message queued since the last; a multi-thread one
/// with that many workers otherwise. Tokio's blocking threads (policy evaluation, audit writes)
/// come with either; they and a multi-thread runtime's workers are named `provisioner` (a
/// current-thread runtime runs on the thread that calls `block_on`).
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all().thread_name("provisioner").build()
}

/// How long in-flight nodes may take to finish after a shutdown signal before they are abandoned
/// (an abandoned node is found again by the next discovery of whichever provisioner runs).
pub const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// The daemon, ready to run: its settings passed the preflight. Built with
/// [`Daemon::builder`]; [`Daemon::run`] runs it until a shutdown token is cancelled.
///
/// ```no_run
/// # async fn demo() -> Result<(), provisioner::Error> {
/// use provisioner::settings::{Paths, Settings};
/// use provisioner::Daemon;
/// use tokio_util::sync::CancellationToken;
///
/// let settings = Settings::load(&Paths::new(
///     "/etc/choria-provisioner/choria-provisioner.yaml",
///     "/etc/choria-provisioner/choria.cfg",
/// ))?;
/// let shutdown = CancellationToken::new();
/// // Cancel `shutdown` (a signal, a test, the embedding tool's own stop) to drain and return.
/// Daemon::builder(settings).build()?.run(shutdown).await
/// # }
/// ```
pub struct Daemon {
    settings: Settings,
    observer: Option<Arc<dyn Observer>>,
    drain_grace: Duration,
    force: CancellationToken,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("config", &self.settings.config.file)
            .field("observer", &self.observer.is_some())
            .field("drain_grace", &self.drain_grace)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Daemon`].
#[must_use]
pub struct DaemonBuilder {
    settings: Settings,
    observer: Option<Arc<dyn Observer>>,
    drain_grace: Duration,
    force: CancellationToken,
}

impl DaemonBuilder {
    /// Also tell `observer` everything the cycle and the work queue report (besides the
    /// daemon's own metrics, node history and audit trail).
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// How long nodes in flight may take to finish once shutdown begins (default
    /// [`DRAIN_GRACE`]).
    pub fn drain_grace(mut self, grace: Duration) -> Self {
        self.drain_grace = grace;
        self
    }

    /// A token that, once cancelled during the drain, stops waiting for nodes in flight (the
    /// binary cancels it on a second signal).
    pub fn force(mut self, force: CancellationToken) -> Self {
        self.force = force;
        self
    }

    /// Runs the preflight `check` runs: every finding is logged, and a fatal one refuses the
    /// start before anything binds or connects ([`Error::Refused`]).
    pub fn build(self) -> Result<Daemon, Error> {
        let problems = match crate::preflight::refuse(&self.settings) {
            Ok(p) => p,
            Err(e) => {
                if let Error::Refused { problems } = &e {
                    for p in problems {
                        error!("{p}");
                    }
                }
                return Err(e);
            }
        };
        for p in problems {
            if let Problem::Warning(w) = p {
                warn!("{w}");
            }
        }
        Ok(Daemon {
            settings: self.settings,
            observer: self.observer,
            drain_grace: self.drain_grace,
            force: self.force,
        })
    }
}

impl Daemon {
    /// A builder for the daemon of `settings`.
    pub fn builder(settings: Settings) -> DaemonBuilder {
        DaemonBuilder {
            settings,
            observer: None,
            drain_grace: DRAIN_GRACE,
            force: CancellationToken::new(),
        }
    }

    /// Runs until `shutdown` is cancelled, then drains: nodes in flight get the drain grace to
    /// finish. Returns once every task it started has stopped.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        run(self, shutdown).await
    }
}

/// The daemon's run, as a list of its steps: serve the monitor listener, connect to the
/// broker, open the claims (active-active), start the audit writer and the fleet's workers,
/// then listen, discover and elect until `outer` is cancelled, and drain.
async fn run(daemon: Daemon, outer: CancellationToken) -> Result<(), Error> {
    let Daemon {
        settings,
        observer: extra_observer,
        drain_grace,
        force,
    } = daemon;
    info!(
        version = VERSION,
        "Choria Provisioner starting using configuration file {}. Discovery interval {} using {} workers",
        settings.config.file.display(),
        crate::text::duration(settings.config.provision.interval()),
        settings.config.workers
    );
    let Settings { config, choria, .. } = settings;
    let mut run = Running::new(Arc::new(config), outer.child_token());
    // The audit file is opened before anything binds: a file that cannot be written stops the
    // start, as check reports it.
    let audit_file = match run.config.audit_file.as_str() {
        "" => None,
        f => Some(crate::audit::AuditFile::open(std::path::Path::new(f))?),
    };
    let control = FleetControl::of(&run.config, &choria.identity);
    start::serve(&mut run, &choria.identity, control.as_ref()).await?;
    let helper = start::helper(&run.config)?;
    let Some((client, connection)) = start::connect(&mut run, &choria).await? else {
        return run.stop_early("the broker connection was made").await;
    };
    let ha = HaMode::of(&run.config);
    info!("high availability: {}", ha.label());
    let claims = match ha {
        HaMode::ActiveActive => match start::open_claims(&run, &client, &choria.identity).await? {
            Some(store) => Some(store),
            None => return run.stop_early("the claims bucket was opened").await,
        },
        _ => None,
    };
    let spreader = claims.as_ref().map(|store| {
        Arc::new(crate::aa::Spreader::new(
            store.clone(),
            Arc::clone(&run.config),
        ))
    });
    let claims = claims.as_ref().zip(spreader.as_ref());
    let audit = start::start_audit(&mut run, &client, &choria.identity, audit_file);
    let pause = start::initial_pause(&run);
    let (fleet, policy) = start::start_fleet(
        &mut run,
        FleetParts {
            client: &client,
            choria: &choria,
            helper,
            audit,
            extra_observer,
            pause: pause.clone(),
            claims,
            control: control.as_ref(),
        },
    )?;
    start::spawn_feeders(
        &mut run,
        Feeders {
            client: &client,
            identity: &choria.identity,
            connection: &connection,
            fleet: &fleet,
            pause: &pause,
            claims,
            control: control.as_ref(),
            policy,
        },
    )?;
    info!(
        "provisioning with {} workers, discovery every {:?}",
        run.config.workers,
        run.config.provision.interval()
    );
    run.run_until_shutdown(&fleet, drain_grace, &force).await
}

/// The high-availability mode the daemon runs in, from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaMode {
    /// One provisioner, always active.
    Single,
    /// `leader_election`: the leader provisions, the others stand by.
    LeaderElection,
    /// `active_active`: every replica provisions, each node claimed in the claims bucket.
    ActiveActive,
}

impl HaMode {
    /// The mode `config` asks for (the two keys are exclusive, checked when it is loaded).
    pub fn of(config: &Config) -> Self {
        if config.active_active {
            HaMode::ActiveActive
        } else if config.leader_election {
            HaMode::LeaderElection
        } else {
            HaMode::Single
        }
    }

    /// How the mode is named in logs and `check`.
    pub fn label(self) -> &'static str {
        match self {
            HaMode::Single => "none (a single provisioner)",
            HaMode::LeaderElection => "leader election (active-standby)",
            HaMode::ActiveActive => {
                "active-active (every replica provisions, nodes claimed in Choria Streams)"
            }
        }
    }
}
