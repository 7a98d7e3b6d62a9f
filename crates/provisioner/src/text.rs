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

/// Rows as columns padded to the widest cell (the last column not padded).
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_aligned() {
        let t = table(&[
            vec!["A".into(), "long one".into(), "x".into()],
            vec!["bbb".into(), "c".into(), "y".into()],
        ]);
        assert_eq!(t, "A    long one  x\nbbb  c         y\n");
    }

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
