//! `choria-provisioner run`: load the settings, start logging, install the signal handlers,
//! write the pid file, and run the library's daemon until a signal.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use provisioner::settings::Settings;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::cli::{paths, RunArgs};

/// Run the daemon until SIGINT or SIGTERM.
pub fn main(debug: bool, args: RunArgs) -> Result<()> {
    let settings = Settings::load(&paths(&args, debug)).map_err(staged)?;
    // As in Go, the provisioner configuration's own `loglevel` and `logfile`, whatever the
    // Choria configuration says. Held to the end: a log file's last lines are written when it
    // drops.
    let _log =
        provisioner::logging::init(&settings.config.loglevel, &settings.config.logfile, debug)?;
    let threads = settings.config.threads;
    // Refused before the runtime starts or the pid file is written.
    let force = CancellationToken::new();
    let daemon = provisioner::Daemon::builder(settings)
        .force(force.clone())
        .build()
        .map_err(staged)?;
    let runtime = provisioner::runtime(threads).context("cannot start the async runtime")?;
    // The handlers are in place before the pid file exists, so whoever reads it can always
    // stop the process cleanly.
    let signals = {
        let _rt = runtime.enter();
        Signals::install()?
    };
    let _pid = match &args.pid {
        Some(p) => Some(PidFile::create(p)?),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let result = runtime.block_on(async {
        let watch = tokio::spawn(signals.watch(shutdown.clone(), force.clone()));
        let result = daemon.run(shutdown).await;
        watch.abort();
        result
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    let result = result.map_err(staged);
    if let Err(e) = &result {
        error!("{}", provisioner::one_line(e.as_ref()));
    }
    result
}

/// The error with the Go provisioner's words for the stage that failed before it.
fn staged(e: provisioner::Error) -> anyhow::Error {
    let stage = e.stage();
    anyhow::Error::new(e).context(stage)
}

/// The PID file, removed when dropped.
struct PidFile(PathBuf);

impl PidFile {
    fn create(path: &Path) -> Result<Self> {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("cannot write pid file {}", path.display()))?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// SIGTERM and SIGINT, caught from start-up on.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Install the handlers; needs the runtime's context.
    fn install() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
        })
    }

    /// The first signal cancels `shutdown`, a second one `force`.
    async fn watch(mut self, shutdown: CancellationToken, force: CancellationToken) {
        tokio::select! {
            _ = self.term.recv() => info!("received SIGTERM"),
            _ = self.int.recv() => info!("received SIGINT"),
        }
        shutdown.cancel();
        // A second signal (an impatient Ctrl-C) ends the drain at once.
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        warn!("received a second signal, not waiting for nodes in flight");
        force.cancel();
    }
}
