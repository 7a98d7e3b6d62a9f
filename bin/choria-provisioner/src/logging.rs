//! Logging set-up: `loglevel` and `logfile` from the configuration, `--debug` wins.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Context, Result};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;

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
        "" | "stdout" => {
            let ansi = std::io::stdout().is_terminal();
            builder
                .with_ansi(ansi)
                .with_writer(Escaping::new(std::io::stdout, ansi))
                .init()
        }
        "stderr" => {
            let ansi = std::io::stderr().is_terminal();
            builder
                .with_ansi(ansi)
                .with_writer(Escaping::new(std::io::stderr, ansi))
                .init()
        }
        "discard" => builder.with_writer(std::io::sink).init(),
        path => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(path))
                .with_context(|| format!("cannot open log file {path}"))?;
            builder
                .with_ansi(false)
                .with_writer(Escaping::new(std::sync::Mutex::new(file), false))
                .init()
        }
    }
    Ok(())
}

/// A writer that keeps every log record on one line whatever text a node or helper managed to
/// get into it: line breaks and other control characters inside a record are written escaped
/// (`\n`, `\x1b`...), only the record's final newline is kept. Node-supplied text is escaped
/// where it is logged too; this is the backstop. The terminal's own colour codes are kept when
/// colour is on.
pub struct Escaping<M> {
    inner: M,
    keep_escape: bool,
}

impl<M> Escaping<M> {
    /// Wraps `inner`; `keep_escape` keeps ESC bytes (colour on a terminal).
    pub fn new(inner: M, keep_escape: bool) -> Self {
        Escaping { inner, keep_escape }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Escaping<M> {
    type Writer = EscapingWriter<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingWriter {
            inner: self.inner.make_writer(),
            keep_escape: self.keep_escape,
        }
    }
}

/// See [`Escaping`].
pub struct EscapingWriter<W> {
    inner: W,
    keep_escape: bool,
}

/// `record` with control characters other than its final newline escaped.
pub fn escape_record(record: &[u8], keep_escape: bool) -> std::borrow::Cow<'_, [u8]> {
    let body = record.strip_suffix(b"\n").unwrap_or(record);
    let bad = |b: u8| (b < 0x20 && b != b'\t' && !(keep_escape && b == 0x1b)) || b == 0x7f;
    if !body.iter().any(|b| bad(*b)) {
        return std::borrow::Cow::Borrowed(record);
    }
    let mut out = Vec::with_capacity(record.len() + 16);
    for &b in body {
        match b {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b if bad(b) => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
            b => out.push(b),
        }
    }
    if body.len() < record.len() {
        out.push(b'\n');
    }
    std::borrow::Cow::Owned(out)
}

impl<W: std::io::Write> std::io::Write for EscapingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.inner
            .write_all(&escape_record(buf, self.keep_escape))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::escape_record;

    #[test]
    fn a_record_stays_on_one_line() {
        let r = escape_record(b"INFO added n1\nERROR forged\r\x1b[31m\n", false);
        assert_eq!(&*r, b"INFO added n1\\nERROR forged\\r\\x1b[31m\n");
        let clean = escape_record(b"INFO fine\tline\n", false);
        assert!(matches!(clean, std::borrow::Cow::Borrowed(_)));
        let colour = escape_record(b"\x1b[32mINFO\x1b[0m ok\n", true);
        assert!(matches!(colour, std::borrow::Cow::Borrowed(_)));
    }
}
