//! Logging set-up, with the Go provisioner's rules: `loglevel` and `logfile` come from the
//! provisioner configuration only (the Choria configuration's own log settings are not used,
//! as in Go), `--debug` wins, and a `logfile` naming a file gets one JSON object a line in
//! logrus' layout (`component`, `level`, `msg`, `time` and the record's fields, keys sorted),
//! the form operators' log shippers and alerts read from the Go provisioner. On standard output
//! or standard error the lines are text for people.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// The level for a `loglevel` value, exactly as the Go provisioner decides it (go-choria's
/// `SetupLogging`): `debug`, `info`, `warn`, `error` and `fatal`, written in lower case, select
/// their level; anything else, the empty string (no `loglevel` at all) included, and `warning`,
/// `trace` or `INFO` too, is the warning level. `--debug` selects debug whatever `loglevel`
/// says. At `fatal` nothing is logged: what stops the daemon is printed on standard error.
pub fn level(name: &str, debug: bool) -> LevelFilter {
    if debug {
        return LevelFilter::DEBUG;
    }
    match name {
        "debug" => LevelFilter::DEBUG,
        "info" => LevelFilter::INFO,
        "warn" => LevelFilter::WARN,
        "error" => LevelFilter::ERROR,
        "fatal" => LevelFilter::OFF,
        _ => LevelFilter::WARN,
    }
}

/// Where `logfile` sends the log, as go-choria reads it: `stdout`, `stderr` and `discard` in
/// any case, the empty string for standard output, anything else a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// Standard output, text.
    Stdout,
    /// Standard error, text.
    Stderr,
    /// Nowhere.
    Discard,
    /// A file, appended to and created when missing; JSON lines.
    File(&'a str),
}

/// See [`Target`].
pub fn target(logfile: &str) -> Target<'_> {
    match logfile.to_ascii_lowercase().as_str() {
        "" | "stdout" => Target::Stdout,
        "stderr" => Target::Stderr,
        "discard" => Target::Discard,
        _ => Target::File(logfile),
    }
}

/// Install the global subscriber for the provisioner configuration's `loglevel` and `logfile`.
/// A log file is written by its own thread ([`BatchedFile`]); the returned guard writes what is
/// left and stops it when dropped.
pub fn init(loglevel: &str, logfile: &str, debug: bool) -> Result<LogGuard, crate::Error> {
    let level = level(loglevel, debug);
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false);
    // The NATS client writes every connection event at info (`event: ...`), one per dropped
    // message in a flood; the connection's own lines (above, in go-choria's words) say the
    // same, counted and bounded, so the client's own are kept to warnings and errors.
    let filter = tracing_subscriber::filter::Targets::new()
        .with_default(level)
        .with_target("async_nats", level.min(LevelFilter::WARN));
    // Colour only on a terminal: under systemd or with output redirected, escape codes would
    // end up in the journal and in files.
    match target(logfile) {
        Target::Stdout => {
            let ansi = std::io::stdout().is_terminal();
            builder
                .with_ansi(ansi)
                .with_writer(Escaping::new(std::io::stdout, ansi))
                .finish()
                .with(filter)
                .init()
        }
        Target::Stderr => {
            let ansi = std::io::stderr().is_terminal();
            builder
                .with_ansi(ansi)
                .with_writer(Escaping::new(std::io::stderr, ansi))
                .finish()
                .with(filter)
                .init()
        }
        Target::Discard => builder
            .with_writer(std::io::sink)
            .finish()
            .with(filter)
            .init(),
        Target::File(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(path))
                .map_err(|e| crate::Error::file("open", "log file", path, e))?;
            let (batched, guard) =
                BatchedFile::start(file).map_err(|source| crate::Error::Runtime {
                    what: "the log file's writer",
                    source,
                })?;
            // No [`Escaping`] backstop: a JSON line has every control character escaped in its
            // strings already (tested below), so scanning it again would find nothing.
            builder
                .with_ansi(false)
                .event_format(LogrusJson)
                .with_writer(batched)
                .finish()
                .with(filter)
                .init();
            return Ok(guard);
        }
    }
    Ok(LogGuard(None))
}

/// The most log bytes waiting for the writer thread; a record that finds this many waits for
/// the write (nothing is dropped).
const MAX_PENDING: usize = 1 << 20;

/// A log file written by one thread: each record is appended to a buffer, and the thread
/// writes whatever has gathered with one system call. Under load the daemon's threads no
/// longer make a `write` per line (ten a node), and a slow disk holds them only once a
/// mebibyte waits. The lines reach the file in the order they were logged.
pub struct BatchedFile {
    batch: std::sync::Arc<Batch>,
}

#[derive(Default)]
struct Batch {
    state: std::sync::Mutex<Pending>,
    /// Lines are waiting, or the guard closed the file.
    ready: std::sync::Condvar,
    /// The writer took the waiting lines.
    room: std::sync::Condvar,
}

#[derive(Default)]
struct Pending {
    lines: Vec<u8>,
    closed: bool,
    /// The writer waits for lines: only then is it woken (a wake is a system call).
    idle: bool,
}

/// After writing a small batch the writer lets lines gather this long before the next write:
/// under load one write and no wake-up per few hundred lines, not both per line.
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// A batch this large is followed by the next write at once.
const SMALL_BATCH: usize = 64 * 1024;

impl Batch {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Stops a [`BatchedFile`]'s thread after it wrote every waiting line.
pub struct LogGuard(Option<(std::sync::Arc<Batch>, std::thread::JoinHandle<()>)>);

impl Drop for LogGuard {
    fn drop(&mut self) {
        if let Some((batch, thread)) = self.0.take() {
            {
                let mut p = batch.lock();
                p.closed = true;
                p.idle = false;
            }
            batch.ready.notify_all();
            let _ = thread.join();
        }
    }
}

impl BatchedFile {
    /// Start the writer thread for `file`.
    pub fn start(mut file: std::fs::File) -> std::io::Result<(BatchedFile, LogGuard)> {
        let batch = std::sync::Arc::new(Batch::default());
        let shared = std::sync::Arc::clone(&batch);
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || {
                use std::io::Write as _;
                let mut out = Vec::new();
                loop {
                    let closed = {
                        let mut p = shared.lock();
                        while p.lines.is_empty() && !p.closed {
                            p.idle = true;
                            p = shared.ready.wait(p).unwrap_or_else(|e| e.into_inner());
                        }
                        p.idle = false;
                        if p.lines.is_empty() {
                            return;
                        }
                        std::mem::swap(&mut p.lines, &mut out);
                        p.closed
                    };
                    shared.room.notify_all();
                    // A failed write cannot be logged; the daemon goes on.
                    let _ = file.write_all(&out);
                    let small = out.len() < SMALL_BATCH;
                    out.clear();
                    if small && !closed {
                        std::thread::sleep(LINGER);
                    }
                    if out.capacity() > MAX_PENDING {
                        out = Vec::new();
                    }
                }
            })?;
        let guard = LogGuard(Some((std::sync::Arc::clone(&batch), thread)));
        Ok((BatchedFile { batch }, guard))
    }
}

/// One record's writer for a [`BatchedFile`].
pub struct BatchedLine<'a> {
    batch: &'a Batch,
}

impl<'a> MakeWriter<'a> for BatchedFile {
    type Writer = BatchedLine<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        BatchedLine { batch: &self.batch }
    }
}

impl std::io::Write for BatchedLine<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut p = self.batch.lock();
        while p.lines.len() >= MAX_PENDING && !p.closed {
            p = self.batch.room.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        if p.closed {
            // The daemon is stopping and its writer is gone.
            return Ok(buf.len());
        }
        let wake = p.idle;
        p.idle = false;
        p.lines.extend_from_slice(buf);
        drop(p);
        if wake {
            self.batch.ready.notify_one();
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The longest value (message or field) written in a JSON line, in bytes; a longer one is cut
/// at a character boundary and its full length noted. Node-supplied text is bounded where it
/// is logged; this bounds everything else, so no record can grow a line without limit.
pub const MAX_VALUE_LEN: usize = 8 * 1024;

/// logrus' `JSONFormatter` as the Go provisioner uses it: one JSON object a line with the keys
/// sorted, `level` (`debug`, `info`, `warning`, `error`), `msg`, `time` (RFC 3339 in the local
/// time zone, whole seconds: `2006-01-02T15:04:05Z07:00`), `component`, and every field of the
/// record. A field named like one of logrus' own keys is written as `fields.<name>`, as logrus
/// does. Strings are escaped as Go's encoding/json escapes them, `<`, `>` and `&` included,
/// with every control character escaped.
///
/// `component` is what the Go provisioner's logger was named: a `component` field when the
/// record has one; else the node's identity for the steps of a node's cycle (Go logs them
/// with a logger named after the node); else `hosts` for the work queue, discovery, events and
/// election (Go's `hosts` package); else `provisioner`.
pub struct LogrusJson;

impl<S, N> FormatEvent<S, N> for LogrusJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        LINE.with(|cached| {
            let mut cached = cached.borrow_mut();
            let cached = &mut *cached;
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if cached.secs != secs || cached.time.is_empty() {
                cached.secs = secs;
                cached.time =
                    chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            }
            cached.line.clear();
            write_json_line(
                &mut cached.line,
                *meta.level(),
                meta.target(),
                &fields,
                &cached.time,
            );
            let written = writer.write_str(&cached.line);
            // A record that was cut at the limits can still be long: such a buffer is not kept.
            if cached.line.capacity() > 4 * MAX_VALUE_LEN {
                cached.line = String::new();
            }
            written
        })
    }
}

/// What a thread keeps between the records it logs.
#[derive(Default)]
struct LineCache {
    /// The second `time` was written for (the lines carry whole seconds).
    secs: u64,
    time: String,
    /// The line being written, its buffer reused.
    line: String,
}

thread_local! {
    static LINE: std::cell::RefCell<LineCache> = std::cell::RefCell::new(LineCache::default());
}

/// A field value as logrus would encode it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A JSON string.
    Str(String),
    /// A JSON number, already written.
    Num(String),
    /// A JSON boolean.
    Bool(bool),
}

/// The message and the fields of one record.
#[derive(Debug, Default)]
pub struct Fields {
    /// The message.
    pub message: String,
    /// The other fields, in the order they were recorded, each name once.
    pub fields: Vec<(Cow<'static, str>, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if name == "message" {
            self.message = match value {
                Value::Str(s) | Value::Num(s) => s,
                Value::Bool(b) => b.to_string(),
            };
        } else if let Some(slot) = self.fields.iter_mut().find(|(k, _)| k == name) {
            slot.1 = value;
        } else {
            self.fields.push((Cow::Borrowed(name), value));
        }
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.fields
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::Str(bounded_format(format_args!("{value:?}"))));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::Num(value.to_string()));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::Num(value.to_string()));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        let v = if value.is_finite() {
            Value::Num(value.to_string())
        } else {
            Value::Str(value.to_string())
        };
        self.put(field, v);
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(bounded_format(format_args!("{value}"))));
    }
}

/// Formats `args`, stopping a little after [`MAX_VALUE_LEN`] bytes so a huge value is never
/// built in full (it is cut to the limit when written).
fn bounded_format(args: std::fmt::Arguments<'_>) -> String {
    struct Capped {
        out: String,
        total: usize,
    }
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.total = self.total.saturating_add(s.len());
            let room = (MAX_VALUE_LEN + 4).saturating_sub(self.out.len());
            if room > 0 {
                // Cut a little past the limit (whole characters); the cut is made below.
                let mut end = room.min(s.len());
                while !s.is_char_boundary(end) {
                    end += 1;
                }
                self.out.push_str(&s[..end]);
            }
            Ok(())
        }
    }
    // Most messages and values fit: written in pieces, they would otherwise grow the buffer a
    // few times each.
    let mut c = Capped {
        out: String::with_capacity(128),
        total: 0,
    };
    let _ = c.write_fmt(args);
    if c.total > MAX_VALUE_LEN {
        // Room left for the note, so the value is not cut again when written.
        let cut = floor_char_boundary(&c.out, MAX_VALUE_LEN - 32);
        c.out.truncate(cut);
        let _ = write!(c.out, "...({} bytes)", c.total);
    }
    c.out
}

fn floor_char_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    let mut i = at;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// logrus' name of a level.
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// The Go logger's name for a record of `target` (see [`LogrusJson`]).
fn component<'a>(target: &str, fields: &'a Fields) -> Text<'a> {
    if let Some(c) = fields.get("component") {
        return Text::Field(c);
    }
    if target.starts_with("provision_core::provision") {
        if let Some(id @ Value::Str(_)) = fields.get("identity") {
            return Text::Field(id);
        }
    }
    // The work queue, discovery, events and the election, and the summaries of their
    // repeated lines (`provision_core::identity::LogSummary`).
    let hosts = [
        "provision_core::fleet",
        "provision_core::identity",
        "provisioner::daemon",
    ];
    if hosts.iter().any(|h| target.starts_with(h)) {
        return Text::Str("hosts");
    }
    Text::Str("provisioner")
}

/// A value of a line: a record's field, or text of the line's own.
#[derive(Clone, Copy)]
enum Text<'a> {
    Field(&'a Value),
    Str(&'a str),
}

/// logrus' own keys, and the names a record's fields of those names are written under.
const OWN_KEYS: [(&str, &str); 4] = [
    ("time", "fields.time"),
    ("msg", "fields.msg"),
    ("level", "fields.level"),
    ("logrus_error", "fields.logrus_error"),
];

/// One JSON line (with its newline) for a record: see [`LogrusJson`].
pub fn json_line(level: Level, target: &str, record: Fields, time: &str) -> String {
    let mut out = String::with_capacity(256);
    write_json_line(&mut out, level, target, &record, time);
    out
}

/// [`json_line`], appended to `out`.
fn write_json_line(out: &mut String, level: Level, target: &str, record: &Fields, time: &str) {
    let mut keys: Vec<(&str, Text<'_>)> = Vec::with_capacity(record.fields.len() + 4);
    // The record's fields, then those moved aside from logrus' keys, then logrus' own: where
    // two share a name the later one is written, as logrus' map would keep it.
    for (k, v) in &record.fields {
        if k != "component" && !OWN_KEYS.iter().any(|(own, _)| k == own) {
            keys.push((k, Text::Field(v)));
        }
    }
    for (own, aside) in OWN_KEYS {
        if let Some(v) = record.get(own) {
            keys.push((aside, Text::Field(v)));
        }
    }
    keys.push(("component", component(target, record)));
    keys.push(("level", Text::Str(level_name(level))));
    keys.push(("msg", Text::Str(&record.message)));
    keys.push(("time", Text::Str(time)));
    // A stable sort keeps equal names in the order above.
    keys.sort_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    let mut first = true;
    for (i, (k, v)) in keys.iter().enumerate() {
        if keys.get(i + 1).is_some_and(|next| next.0 == *k) {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        json_string(out, k);
        out.push(':');
        match v {
            Text::Str(s) => json_string(out, s),
            Text::Field(Value::Str(s)) => json_string(out, s),
            Text::Field(Value::Num(n)) => out.push_str(n),
            Text::Field(Value::Bool(b)) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
    out.push_str("}\n");
}

/// `s` as a JSON string the way Go's encoding/json writes it with HTML escaping on (logrus'
/// default): `"` and `\` escaped, `\n`, `\r`, `\t`, `\b`, `\f` short, other control characters
/// as `\u00XX`, `<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`. DEL and the C1 controls, which Go
/// leaves as they are, are escaped too, so no byte of a line can drive a terminal. Cut at
/// [`MAX_VALUE_LEN`] bytes with the full length noted.
pub fn json_string(out: &mut String, s: &str) {
    let cut = floor_char_boundary(s, MAX_VALUE_LEN);
    let text = &s[..cut];
    out.reserve(text.len() + 2);
    out.push('"');
    // Runs of printable ASCII that need no escape are copied whole.
    let bytes = text.as_bytes();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        let b = bytes[i];
        if (0x20..0x7f).contains(&b) && !matches!(b, b'"' | b'\\' | b'<' | b'>' | b'&') {
            i += 1;
            continue;
        }
        out.push_str(&text[start..i]);
        // `i` is a character boundary: every byte before it was ASCII or a whole character.
        let Some(c) = text[i..].chars().next() else {
            break;
        };
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 || ('\u{7f}'..='\u{9f}').contains(&c) => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
        i += c.len_utf8();
        start = i;
    }
    out.push_str(&text[start..]);
    if cut < s.len() {
        let _ = write!(out, "...({} bytes)", s.len());
    }
    out.push('"');
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
    use super::*;

    #[test]
    fn a_batched_file_gets_every_line_in_order_and_waits_when_full() {
        use std::io::Write as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.log");
        let file = std::fs::File::create(&path).unwrap();
        let (batched, guard) = BatchedFile::start(file).unwrap();
        let batched = std::sync::Arc::new(batched);
        // Four threads, each a mebibyte and more of lines, so writers wait for room.
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let b = std::sync::Arc::clone(&batched);
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        let line = format!("{t} {i:06} {}\n", "x".repeat(40));
                        b.make_writer().write_all(line.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut next = [0usize; 4];
        for line in text.lines() {
            let mut parts = line.split(' ');
            let t: usize = parts.next().unwrap().parse().unwrap();
            let i: usize = parts.next().unwrap().parse().unwrap();
            assert_eq!(i, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, [20_000; 4], "lines lost");
    }

    #[test]
    fn a_record_stays_on_one_line() {
        let r = escape_record(b"INFO added n1\nERROR forged\r\x1b[31m\n", false);
        assert_eq!(&*r, b"INFO added n1\\nERROR forged\\r\\x1b[31m\n");
        let clean = escape_record(b"INFO fine\tline\n", false);
        assert!(matches!(clean, std::borrow::Cow::Borrowed(_)));
        let colour = escape_record(b"\x1b[32mINFO\x1b[0m ok\n", true);
        assert!(matches!(colour, std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn loglevel_follows_go() {
        // The five names go-choria knows, in lower case only.
        assert_eq!(level("debug", false), LevelFilter::DEBUG);
        assert_eq!(level("info", false), LevelFilter::INFO);
        assert_eq!(level("warn", false), LevelFilter::WARN);
        assert_eq!(level("error", false), LevelFilter::ERROR);
        assert_eq!(level("fatal", false), LevelFilter::OFF);
        // Everything else is go-choria's default branch: warning.
        for other in [
            "", "warning", "trace", "INFO", "Debug", "panic", "verbose", " info",
        ] {
            assert_eq!(level(other, false), LevelFilter::WARN, "{other:?}");
        }
        // --debug wins over anything.
        for any in ["", "info", "error", "fatal", "nonsense"] {
            assert_eq!(level(any, true), LevelFilter::DEBUG, "{any:?}");
        }
    }

    #[test]
    fn logfile_names_as_go_reads_them() {
        assert_eq!(target(""), Target::Stdout);
        assert_eq!(target("stdout"), Target::Stdout);
        assert_eq!(target("STDOUT"), Target::Stdout);
        assert_eq!(target("Stderr"), Target::Stderr);
        assert_eq!(target("DISCARD"), Target::Discard);
        assert_eq!(
            target("/var/log/choria-provisioner.log"),
            Target::File("/var/log/choria-provisioner.log")
        );
        assert_eq!(target("info"), Target::File("info"));
    }

    #[test]
    fn level_names_are_logrus_names() {
        assert_eq!(level_name(Level::WARN), "warning");
        assert_eq!(level_name(Level::ERROR), "error");
        assert_eq!(level_name(Level::INFO), "info");
        assert_eq!(level_name(Level::DEBUG), "debug");
    }

    fn record(msg: &str, fields: &[(&str, Value)]) -> Fields {
        Fields {
            message: msg.into(),
            fields: fields
                .iter()
                .map(|(k, v)| (Cow::Owned(k.to_string()), v.clone()))
                .collect(),
        }
    }

    /// The log file is written without the [`Escaping`] backstop: a JSON line must leave it
    /// nothing to escape, whatever text a node got into the message, a field or a field's name.
    #[test]
    fn a_json_line_leaves_the_backstop_nothing_to_escape() {
        let every: String = (0u32..=0x3000).filter_map(char::from_u32).collect();
        let fields = [
            ("identity", Value::Str(every.clone())),
            ("msg", Value::Str(every.clone())),
            (every.as_str(), Value::Str("x".into())),
            ("n", Value::Num("12".into())),
            ("ok", Value::Bool(true)),
        ];
        for target in ["provision_core::provision", "provisioner::daemon", "other"] {
            let line = json_line(
                Level::WARN,
                target,
                record(&every, &fields),
                "2026-12-01T06:00:00Z",
            );
            assert!(line.ends_with('\n'));
            assert!(
                matches!(escape_record(line.as_bytes(), false), Cow::Borrowed(_)),
                "{line:?}"
            );
            assert_eq!(line.lines().count(), 1);
        }
    }

    #[test]
    fn a_line_in_logrus_layout() {
        let line = json_line(
            Level::INFO,
            "provision_core::fleet",
            record("Provisioned n1.example.net", &[]),
            "2026-12-01T06:00:00Z",
        );
        assert_eq!(
            line,
            "{\"component\":\"hosts\",\"level\":\"info\",\"msg\":\"Provisioned n1.example.net\",\
             \"time\":\"2026-12-01T06:00:00Z\"}\n"
        );
        // A node's step is logged under the node's name, fields sorted with logrus' keys.
        let line = json_line(
            Level::ERROR,
            "provision_core::provision",
            record(
                "rpc handler for choria_provision#jwt failed: timeout",
                &[
                    ("identity", Value::Str("n1".into())),
                    ("try", Value::Num("2".into())),
                    ("level", Value::Str("clash".into())),
                ],
            ),
            "2026-12-01T07:00:00+02:00",
        );
        assert_eq!(
            line,
            "{\"component\":\"n1\",\"fields.level\":\"clash\",\"identity\":\"n1\",\
             \"level\":\"error\",\"msg\":\"rpc handler for choria_provision#jwt failed: timeout\",\
             \"time\":\"2026-12-01T07:00:00+02:00\",\"try\":2}\n"
        );
        let v: serde_json::Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => panic!("not JSON: {e}: {line}"),
        };
        assert_eq!(v["level"], "error");
        // An explicit component wins; anything else is the provisioner's.
        let line = json_line(
            Level::WARN,
            "choria_rpc_client::connection",
            record("x", &[]),
            "t",
        );
        assert!(line.starts_with("{\"component\":\"provisioner\",\"level\":\"warning\""));
        let line = json_line(
            Level::WARN,
            "provision_core::fleet",
            record("x", &[("component", Value::Str("provisioner".into()))]),
            "t",
        );
        assert!(
            line.starts_with("{\"component\":\"provisioner\","),
            "{line}"
        );
        // Each key once: a field moved aside wins over a field already of that name, and a
        // field recorded twice keeps its later value.
        let mut fields = record(
            "x",
            &[
                ("fields.msg", Value::Str("literal".into())),
                ("msg", Value::Str("moved".into())),
                ("b", Value::Num("1".into())),
                ("a", Value::Bool(true)),
            ],
        );
        fields.fields.push(("b".into(), Value::Num("2".into())));
        let line = json_line(Level::INFO, "provision_core::fleet", fields, "t");
        assert_eq!(
            line,
            "{\"a\":true,\"b\":2,\"component\":\"hosts\",\"fields.msg\":\"moved\",\
             \"level\":\"info\",\"msg\":\"x\",\"time\":\"t\"}\n"
        );
    }

    #[test]
    fn strings_escaped_as_go_does() {
        let mut out = String::new();
        json_string(
            &mut out,
            "a\"b\\c\nd\re\tf\u{8}\u{c}\u{1b}[31m<x>&\u{7f}\u{9b}\u{2028}é",
        );
        assert_eq!(
            out,
            "\"a\\\"b\\\\c\\nd\\re\\tf\\b\\f\\u001b[31m\\u003cx\\u003e\\u0026\\u007f\\u009b\\u2028é\""
        );
        let v: serde_json::Value = match serde_json::from_str(&out) {
            Ok(v) => v,
            Err(e) => panic!("not JSON: {e}: {out}"),
        };
        assert!(v.as_str().is_some_and(|s| s.starts_with("a\"b\\c\nd")));
        // Plain runs around escapes, at either end, and none at all.
        for (input, want) in [
            ("", "\"\""),
            ("plain text", "\"plain text\""),
            ("<start", "\"\\u003cstart\""),
            ("end&", "\"end\\u0026\""),
            ("é<é", "\"é\\u003cé\""),
        ] {
            let mut out = String::new();
            json_string(&mut out, input);
            assert_eq!(out, want, "{input:?}");
        }
    }

    #[test]
    fn values_are_bounded() {
        let huge = "x".repeat(MAX_VALUE_LEN * 4);
        let mut out = String::new();
        json_string(&mut out, &huge);
        assert!(out.len() < MAX_VALUE_LEN + 64, "{}", out.len());
        assert!(out.ends_with(&format!("...({} bytes)\"", huge.len())));
        // A multi-byte character at the cut is not split.
        let wide = "é".repeat(MAX_VALUE_LEN);
        let mut out = String::new();
        json_string(&mut out, &wide);
        assert!(out.contains("...("));
        let formatted = bounded_format(format_args!("{huge}"));
        assert!(formatted.len() <= MAX_VALUE_LEN);
        assert!(formatted.ends_with(&format!("...({} bytes)", huge.len())));
    }
}
