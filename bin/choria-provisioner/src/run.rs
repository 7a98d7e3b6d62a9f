//! `choria-provisioner run`: load the settings, start logging, install the library's signal
//! handlers, write its pid file, and run its daemon until a signal.

use std::time::Duration;

use anyhow::{Context, Result};
use provisioner::settings::Settings;
use tokio_util::sync::CancellationToken;
use tracing::error;

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
        provisioner::process::Signals::install()?
    };
    let _pid = match &args.pid {
        Some(p) => Some(provisioner::process::PidFile::create(p)?),
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
