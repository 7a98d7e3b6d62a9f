//! Node identities are hostile input: anyone holding a provisioning JWT can announce any
//! identity in a startup event or answer discovery under any name. This module is the one place
//! that decides whether an identity may be acted on, and the one place that makes node-supplied
//! text safe to write to a log.
//!
//! The built-in grammar is DNS-name-like: labels of ASCII letters, digits, `-` and `_`, each 1 to
//! 63 bytes, separated by single dots, with no leading or trailing dot, at most 253 bytes in all.
//! A site with other naming sets `identity_pattern`, a regular expression the whole identity must
//! match; even then the identity must pass the [floor](IdentityRule::check): 1 to 253 bytes of
//! printable ASCII without white space and without any of `*` `>` `,` `/` `\` `"` `'` `:` `;`
//! `=` `<` `$` `{` `}` `[` `]` `` ` `` `|` `&` `!` `?` `#` `%` `(` `)` `@` `^` `~` `+`, and no empty dot-separated part. The floor keeps
//! an identity from becoming a NATS wildcard, breaking a subject, or smuggling extra names into
//! a certificate request or a log line, whatever the pattern says.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use regex::Regex;

/// A regular expression compiler's message on one line (it draws the pattern and a caret over
/// several): for errors, `check` and logs.
pub fn regex_message(e: &regex::Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The longest identity accepted (the longest DNS name).
pub const MAX_IDENTITY_LEN: usize = 253;
/// The longest label of the built-in grammar.
pub const MAX_LABEL_LEN: usize = 63;

/// Why an identity was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// Empty.
    #[error("the identity is empty")]
    Empty,
    /// Longer than [`MAX_IDENTITY_LEN`] bytes.
    #[error("the identity is {0} bytes long, the limit is 253")]
    TooLong(usize),
    /// A character that no identity may hold (control, space, non-ASCII, wildcard, separator).
    #[error("the identity holds the character {0:?}, which no identity may hold")]
    ForbiddenChar(char),
    /// A leading, trailing or doubled dot.
    #[error("the identity has an empty label (a leading, trailing or doubled dot)")]
    EmptyLabel,
    /// A label longer than [`MAX_LABEL_LEN`] bytes (built-in grammar only).
    #[error("the identity has a label of {0} bytes, the limit is 63")]
    LabelTooLong(usize),
    /// A character outside the built-in grammar.
    #[error("the identity holds {0:?}; labels may hold letters, digits, '-' and '_' (set identity_pattern for other naming)")]
    NotInGrammar(char),
    /// The site's `identity_pattern` does not match.
    #[error("the identity does not match identity_pattern {0:?}")]
    Pattern(String),
}

/// Characters refused by the floor on top of control characters, white space and non-ASCII.
const FORBIDDEN: &[char] = &[
    '*', '>', ',', '/', '\\', '"', '\'', ':', ';', '=', '<', '$', '{', '}', '[', ']', '`', '|',
    '&', '!', '?', '#', '%', '(', ')', '@', '^', '~', '+',
];

/// The rule every identity is held to: the built-in grammar, or a site pattern on top of the
/// floor.
#[derive(Clone, Default)]
pub struct IdentityRule {
    pattern: Option<(String, Regex)>,
}

impl fmt::Debug for IdentityRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Some((p, _)) => write!(f, "IdentityRule(pattern {p:?})"),
            None => f.write_str("IdentityRule(built-in grammar)"),
        }
    }
}

impl IdentityRule {
    /// The built-in DNS-name-like grammar.
    pub fn builtin() -> Self {
        IdentityRule { pattern: None }
    }

    /// A site's `identity_pattern`: the whole identity must match it (it is anchored here), on
    /// top of the floor. An empty pattern is the built-in grammar. Returns the compiler's
    /// message for a pattern that does not compile.
    pub fn with_pattern(pattern: &str) -> Result<Self, String> {
        if pattern.is_empty() {
            return Ok(Self::builtin());
        }
        let re = regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(1 << 20)
            .build()
            .map_err(|e| regex_message(&e))?;
        Ok(IdentityRule {
            pattern: Some((pattern.to_string(), re)),
        })
    }

    /// The pattern as written, `None` for the built-in grammar.
    pub fn pattern(&self) -> Option<&str> {
        self.pattern.as_ref().map(|(p, _)| p.as_str())
    }

    /// Whether `identity` may be acted on.
    pub fn check(&self, identity: &str) -> Result<(), IdentityError> {
        if identity.is_empty() {
            return Err(IdentityError::Empty);
        }
        if identity.len() > MAX_IDENTITY_LEN {
            return Err(IdentityError::TooLong(identity.len()));
        }
        for c in identity.chars() {
            if !c.is_ascii() || c.is_ascii_control() || c == ' ' || FORBIDDEN.contains(&c) {
                return Err(IdentityError::ForbiddenChar(c));
            }
        }
        for label in identity.split('.') {
            if label.is_empty() {
                return Err(IdentityError::EmptyLabel);
            }
            if self.pattern.is_none() {
                if label.len() > MAX_LABEL_LEN {
                    return Err(IdentityError::LabelTooLong(label.len()));
                }
                if let Some(c) = label
                    .chars()
                    .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
                {
                    return Err(IdentityError::NotInGrammar(c));
                }
            }
        }
        if let Some((p, re)) = &self.pattern {
            if !re.is_match(identity) {
                return Err(IdentityError::Pattern(p.clone()));
            }
        }
        Ok(())
    }
}

/// The longest piece of node-supplied text written to a log line by [`escaped`].
pub const LOG_TEXT_LIMIT: usize = 120;

/// Node-supplied text made safe for a log line: control characters, quotes, backslashes and
/// anything outside printable ASCII are escaped (`\n`, `\u{1b}`...), and the text is cut at
/// [`LOG_TEXT_LIMIT`] characters with the full length noted. A newline in an identity can
/// therefore never start a forged log line.
pub fn escaped(text: &str) -> Escaped<'_> {
    Escaped(text, LOG_TEXT_LIMIT)
}

/// See [`escaped`].
#[derive(Clone, Copy)]
pub struct Escaped<'a>(&'a str, usize);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        for (shown, c) in self.0.chars().enumerate() {
            if shown >= self.1 {
                return write!(f, "...({} bytes)", self.0.len());
            }
            if (' '..='~').contains(&c) && c != '\\' && c != '"' {
                f.write_char(c)?;
            } else {
                for e in c.escape_default() {
                    f.write_char(e)?;
                }
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// How often a [`LogSummary`] writes a line.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// A log line that a flood could repeat thousands of times a second (a refused identity, a full
/// queue, a node that never answered), written as a bounded summary instead: the first of a
/// quiet period is logged at once, then at most one line per [`SUMMARY_EVERY`] counts the others
/// and shows the latest. A flood of bogus nodes therefore costs a few log lines a minute.
#[derive(Debug)]
pub struct LogSummary {
    what: &'static str,
    inner: Mutex<SummaryState>,
}

#[derive(Debug, Default)]
struct SummaryState {
    last_line: Option<Instant>,
    pending: u64,
    example: String,
}

impl LogSummary {
    /// A summary whose lines count `what` (for example "refused node identities").
    pub const fn new(what: &'static str) -> Self {
        LogSummary {
            what,
            inner: Mutex::new(SummaryState {
                last_line: None,
                pending: 0,
                example: String::new(),
            }),
        }
    }

    /// Logs `line` (at warn) now if no line was written for [`SUMMARY_EVERY`], otherwise counts
    /// it and keeps it as the latest example for the next summary. `line` is only built when it
    /// may be used and must already have escaped any node-supplied text (see [`escaped`]).
    pub fn record(&self, line: impl FnOnce() -> String) {
        let now = Instant::now();
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let due = s
            .last_line
            .is_none_or(|t| now.duration_since(t) >= SUMMARY_EVERY);
        if due && s.pending == 0 {
            s.last_line = Some(now);
            drop(s);
            tracing::warn!("{}", line());
            return;
        }
        s.pending += 1;
        s.example = line();
        if due {
            self.emit(&mut s, now);
        }
    }

    /// Writes the summary line if one is due (called periodically, so a burst's tail is logged).
    pub fn flush(&self) {
        let now = Instant::now();
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let due = s
            .last_line
            .is_none_or(|t| now.duration_since(t) >= SUMMARY_EVERY);
        if due && s.pending > 0 {
            self.emit(&mut s, now);
        }
    }

    /// How many records wait for the next summary line.
    pub fn pending(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).pending
    }

    fn emit(&self, s: &mut SummaryState, now: Instant) {
        let secs = s
            .last_line
            .map_or(0, |t| now.duration_since(t).as_secs().max(1));
        tracing::warn!(
            "{} more {} in the last {secs}s, the latest: {}",
            s.pending,
            self.what,
            s.example
        );
        s.pending = 0;
        s.example = String::new();
        s.last_line = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_grammar_accepts_dns_like_names() {
        let r = IdentityRule::builtin();
        for ok in [
            "n1.example.net",
            "localhost",
            "web_01.dc-2.example.net",
            "a",
            "1.2.3.4",
            &format!("{}.example.net", "a".repeat(63)),
        ] {
            assert_eq!(r.check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn builtin_grammar_refuses_the_known_attacks() {
        let r = IdentityRule::builtin();
        let cases: Vec<(String, IdentityError)> = vec![
            (String::new(), IdentityError::Empty),
            (">".into(), IdentityError::ForbiddenChar('>')),
            ("*".into(), IdentityError::ForbiddenChar('*')),
            ("n1.*.example".into(), IdentityError::ForbiddenChar('*')),
            (
                "evil.example.net,DNS:admin.privileged.mcollective,DNS:x".into(),
                IdentityError::ForbiddenChar(','),
            ),
            ("*.example.net".into(), IdentityError::ForbiddenChar('*')),
            ("a\nb".into(), IdentityError::ForbiddenChar('\n')),
            ("a b".into(), IdentityError::ForbiddenChar(' ')),
            ("a\u{e9}".into(), IdentityError::ForbiddenChar('\u{e9}')),
            (".a".into(), IdentityError::EmptyLabel),
            ("a.".into(), IdentityError::EmptyLabel),
            ("a..b".into(), IdentityError::EmptyLabel),
            ("a".repeat(5000), IdentityError::TooLong(5000)),
            ("a".repeat(64), IdentityError::LabelTooLong(64)),
        ];
        for (id, want) in cases {
            assert_eq!(r.check(&id), Err(want), "{}", escaped(&id));
        }
    }

    #[test]
    fn a_site_pattern_is_anchored_and_cannot_lift_the_floor() {
        let r = IdentityRule::with_pattern(r"[a-z0-9.]+\.example\.net").expect("pattern");
        assert_eq!(r.check("n1.example.net"), Ok(()));
        assert!(matches!(
            r.check("n1.example.net.evil"),
            Err(IdentityError::Pattern(_))
        ));
        let any = IdentityRule::with_pattern(".*").expect("pattern");
        assert_eq!(any.check("x".repeat(100).as_str()), Ok(()));
        assert_eq!(any.check(">"), Err(IdentityError::ForbiddenChar('>')));
        assert_eq!(any.check("a,DNS:b"), Err(IdentityError::ForbiddenChar(',')));
        assert_eq!(any.check("a..b"), Err(IdentityError::EmptyLabel));
        assert!(IdentityRule::with_pattern("(").is_err());
        assert!(IdentityRule::with_pattern("")
            .expect("empty")
            .pattern()
            .is_none());
    }

    #[test]
    fn escaped_text_cannot_forge_a_log_line_and_is_bounded() {
        let s = escaped("a\nINFO forged\r\u{1b}[31m\\\"").to_string();
        assert!(!s.contains('\n') && !s.contains('\r') && !s.contains('\u{1b}'));
        assert_eq!(s, "a\\nINFO forged\\r\\u{1b}[31m\\\\\\\"");
        let long = escaped(&"x".repeat(5000)).to_string();
        assert!(long.len() < LOG_TEXT_LIMIT + 30, "{}", long.len());
        assert!(long.ends_with("...(5000 bytes)"));
    }

    #[test]
    fn a_summary_logs_the_first_line_and_counts_the_rest() {
        let s = LogSummary::new("refused node identities");
        let mut built = 0;
        for _ in 0..10_000 {
            s.record(|| {
                built += 1;
                "refusing x".to_string()
            });
        }
        assert_eq!(s.pending(), 9_999, "only the first is written at once");
        s.flush();
        assert_eq!(s.pending(), 9_999, "no summary before the period is over");
        assert!(built >= 9_999, "the examples are kept");
    }
}
