//! Text for people: settings quoted safely, durations as an operator writes them.

use std::time::Duration;

/// Text from a file or the environment for `check` and errors: in double quotes, control
/// characters and quotes escaped, at most 256 characters.
pub fn quoted(text: &str) -> String {
    const MAX: usize = 256;
    let mut out = String::with_capacity(text.len().min(MAX) + 2);
    out.push('"');
    for c in text.chars().take(MAX) {
        out.extend(c.escape_debug());
    }
    if text.chars().count() > MAX {
        out.push_str("...");
    }
    out.push('"');
    out
}

/// A duration as an operator writes a Choria duration: `1h`, `5m`, `90s` (`0s` for none, and
/// Rust's own form below a second).
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0 if d.is_zero() => "0s".to_string(),
        0 => format!("{d:?}"),
        s if s.is_multiple_of(3600) => format!("{}h", s / 3600),
        s if s.is_multiple_of(60) => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        assert_eq!(duration(Duration::from_secs(60)), "1m");
        assert_eq!(duration(Duration::from_secs(300)), "5m");
        assert_eq!(duration(Duration::from_secs(7200)), "2h");
        assert_eq!(duration(Duration::from_secs(90)), "90s");
        assert_eq!(duration(Duration::ZERO), "0s");
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn quoted_text_is_escaped_and_bounded() {
        assert_eq!(quoted("a\"b\n"), "\"a\\\"b\\n\"");
        let long = quoted(&"x".repeat(1000));
        assert!(long.len() < 270 && long.ends_with("...\""), "{long}");
    }
}
