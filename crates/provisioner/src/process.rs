//! What a daemon process needs around the [`Daemon`](crate::Daemon): a pid file removed when
//! it drops, and SIGTERM and SIGINT caught from start-up on (the first stops the daemon, a
//! second one ends the drain at once).

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Error;

/// The pid file, removed when dropped.
#[derive(Debug)]
pub struct PidFile(PathBuf);

impl PidFile {
    /// Writes this process's id to `path`.
    pub fn create(path: &Path) -> Result<Self, Error> {
        std::fs::write(path, format!("{}\n", std::process::id())).map_err(|source| {
            Error::File {
                action: "write",
                what: "pid file",
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok(PidFile(path.to_path_buf()))
    }
}

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// SIGTERM and SIGINT, caught from the moment they are installed.
#[derive(Debug)]
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers; needs a runtime's context.
    pub fn install() -> Result<Self, Error> {
        use tokio::signal::unix::{signal, SignalKind};
        let handler = |what| move |source| Error::Runtime { what, source };
        Ok(Signals {
            term: signal(SignalKind::terminate()).map_err(handler("a SIGTERM handler"))?,
            int: signal(SignalKind::interrupt()).map_err(handler("a SIGINT handler"))?,
        })
    }

    /// The first signal cancels `shutdown`, a second one `force`.
    pub async fn watch(mut self, shutdown: CancellationToken, force: CancellationToken) {
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
