//! Logging set-up, with the Go provisioner's rules: `loglevel` and `logfile` come from the
//! provisioner configuration only (the Choria configuration's own log settings are not used,
//! as in Go), `--debug` wins, and a `logfile` naming a file gets one JSON object a line in
//! logrus' layout (`component`, `level`, `msg`, `time` and the record's fields, keys sorted),
//! the form operators' log shippers and alerts read from the Go provisioner. On standard output
//! or standard error the lines are text for people.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Context, Result};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

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
pub fn init(loglevel: &str, logfile: &str, debug: bool) -> Result<()> {
    let level = level(loglevel, debug);
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_target(false);
    // Colour only on a terminal: under systemd or with output redirected, escape codes would
    // end up in the journal and in files.
    match target(logfile) {
        Target::Stdout => {
            let ansi = std::io::stdout().is_terminal();
            builder
                .with_ansi(ansi)
                .with_writer(Escaping::new(std::io::stdout, ansi))
                .init()
        }
        Target::Stderr => {
            let ansi = std::io::stderr().is_terminal();
            builder
                .with_ansi(ansi)
                .with_writer(Escaping::new(std::io::stderr, ansi))
                .init()
        }
        Target::Discard => builder.with_writer(std::io::sink).init(),
        Target::File(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(Path::new(path))
                .with_context(|| format!("cannot open log file {path}"))?;
            builder
                .with_ansi(false)
                .event_format(LogrusJson)
                .with_writer(Escaping::new(std::sync::Mutex::new(file), false))
                .init()
        }
    }
    Ok(())
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
        let line = json_line(
            *meta.level(),
            meta.target(),
            fields,
            &chrono::Local::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        );
        writer.write_str(&line)
    }
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
    /// The other fields by name.
    pub fields: BTreeMap<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::Str(s) | Value::Num(s) => s,
                Value::Bool(b) => b.to_string(),
            };
        } else {
            self.fields.insert(field.name().to_string(), value);
        }
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
    let mut c = Capped {
        out: String::new(),
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
fn component(target: &str, fields: &BTreeMap<String, Value>) -> Option<Value> {
    if let Some(c) = fields.get("component") {
        return Some(c.clone());
    }
    if target.starts_with("provision_core::provision") {
        if let Some(id @ Value::Str(_)) = fields.get("identity") {
            return Some(id.clone());
        }
    }
    let hosts = ["provision_core::fleet", "choria_provisioner::daemon"];
    if hosts.iter().any(|h| target.starts_with(h)) {
        return Some(Value::Str("hosts".into()));
    }
    Some(Value::Str("provisioner".into()))
}

/// One JSON line (with its newline) for a record: see [`LogrusJson`].
pub fn json_line(level: Level, target: &str, record: Fields, time: &str) -> String {
    let mut data: BTreeMap<String, Value> = BTreeMap::new();
    let component = component(target, &record.fields);
    for (k, v) in record.fields {
        // logrus keeps its own keys and moves a clashing field aside.
        let k = match k.as_str() {
            "time" | "msg" | "level" | "logrus_error" => format!("fields.{k}"),
            _ => k,
        };
        data.insert(k, v);
    }
    if let Some(c) = component {
        data.insert("component".into(), c);
    }
    data.insert("level".into(), Value::Str(level_name(level).into()));
    data.insert("msg".into(), Value::Str(record.message));
    data.insert("time".into(), Value::Str(time.into()));
    let mut out = String::with_capacity(256);
    out.push('{');
    for (i, (k, v)) in data.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_string(&mut out, k);
        out.push(':');
        match v {
            Value::Str(s) => json_string(&mut out, s),
            Value::Num(n) => out.push_str(n),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
    out.push_str("}\n");
    out
}

/// `s` as a JSON string the way Go's encoding/json writes it with HTML escaping on (logrus'
/// default): `"` and `\` escaped, `\n`, `\r`, `\t`, `\b`, `\f` short, other control characters
/// as `\u00XX`, `<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`. DEL and the C1 controls, which Go
/// leaves as they are, are escaped too, so no byte of a line can drive a terminal. Cut at
/// [`MAX_VALUE_LEN`] bytes with the full length noted.
pub fn json_string(out: &mut String, s: &str) {
    let cut = floor_char_boundary(s, MAX_VALUE_LEN);
    out.push('"');
    for c in s[..cut].chars() {
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
    }
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
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
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
