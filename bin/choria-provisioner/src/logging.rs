//! Logging set-up: `loglevel` and `logfile` from the configuration, `--debug` wins.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Context, Result};
use tracing_subscriber::filter::LevelFilter;

/// Parse a Choria log level name.
pub fn level(name: &str, debug: bool) -> LevelFilter {
    if debug {
        return LevelFilter::DEBUG;
    }
    match name.to_ascii_lowercase().as_str() {
        "debug" => LevelFilter::DEBUG,
        "trace" => LevelFilter::TRACE,
        "warn" | "warning" => LevelFilter::WARN,
        "error" | "fatal" | "panic" => LevelFilter::ERROR,
        _ => LevelFilter::INFO,
    }
}

/// Install the global subscriber. `logfile` is a path, or `stdout`/`stderr`/empty for the
/// terminal, or `discard`.
pub fn init(loglevel: &str, logfile: &str, debug: bool) -> Result<()> {
    let level = level(loglevel, debug);
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false);
    // Colour only on a terminal: under systemd or with output redirected, escape codes would
    // end up in the journal and in files.
    match logfile {
        "" | "stdout" => builder
            .with_ansi(std::io::stdout().is_terminal())
            .with_writer(std::io::stdout)
            .init(),
        "stderr" => builder
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init(),
        "discard" => builder.with_writer(std::io::sink).init(),
        path => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(path))
                .with_context(|| format!("cannot open log file {path}"))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init()
        }
    }
    Ok(())
}
