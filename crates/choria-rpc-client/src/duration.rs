//! Durations as go-choria reads them: `util.ParseDuration` for the provisioner's YAML and the
//! operator's flags, and, for the Choria client configuration and the simulator's flags, a
//! plain integer as seconds first.

use std::time::Duration;

/// A duration the go-choria parser would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The last character is not a known unit.
    #[error("invalid time unit {0}")]
    Unit(String),
    /// The number could not be parsed.
    #[error("invalid number")]
    Number,
    /// Negative durations make no sense for any key.
    #[error("negative durations are not allowed")]
    Negative,
    /// Too large to represent.
    #[error("duration out of range")]
    Overflow,
}

/// Parses a duration the way go-choria's `util.ParseDuration` does: the last character picks the
/// unit; `w`/`W` (weeks), `d`/`D` (days), `M` (30-day months) and `y`/`Y` (365-day years) take a
/// decimal number and are truncated to whole hours; anything ending in `s`, `m` or `h` is a Go
/// duration such as `90s`, `1h30m` or `250ms`. A bare number has no unit and is refused, as in
/// go-choria. An empty string is zero. Negative values are refused (Go would accept them).
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    let Some(unit) = s.chars().last() else {
        return Ok(Duration::ZERO);
    };
    let number = &s[..s.len() - unit.len_utf8()];
    let hours_per = match unit {
        'w' | 'W' => 7.0 * 24.0,
        'd' | 'D' => 24.0,
        'M' => 24.0 * 30.0,
        'y' | 'Y' => 24.0 * 365.0,
        's' | 'S' | 'm' | 'h' | 'H' => return parse_go_duration(s),
        other => return Err(DurationError::Unit(other.to_string())),
    };
    // go-choria parses these with 32-bit float precision.
    let v: f32 = number.trim().parse().map_err(|_| DurationError::Number)?;
    if !v.is_finite() {
        return Err(DurationError::Number);
    }
    let hours = (f64::from(v) * hours_per).trunc();
    if hours < 0.0 {
        return Err(DurationError::Negative);
    }
    if hours > (u64::MAX / 3600) as f64 {
        return Err(DurationError::Overflow);
    }
    Ok(Duration::from_secs(hours as u64 * 3600))
}

/// Go's `time.ParseDuration`: a sequence of decimal numbers each with a unit
/// (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), optionally signed.
fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let mut rest = s;
    let mut negative = false;
    if let Some(r) = rest.strip_prefix('-') {
        negative = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Number);
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let num = &rest[..num_len];
        if num.is_empty() || num == "." {
            return Err(DurationError::Number);
        }
        let value: f64 = num.parse().map_err(|_| DurationError::Number)?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos_per = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(DurationError::Unit(String::new())),
            other => return Err(DurationError::Unit(other.to_string())),
        };
        total += value * nanos_per;
    }
    if negative && total > 0.0 {
        return Err(DurationError::Negative);
    }
    // Go durations are capped at about 292 years.
    if total > i64::MAX as f64 {
        return Err(DurationError::Overflow);
    }
    Ok(Duration::from_nanos(total as u64))
}

/// A plain integer as seconds, else [`parse`]; an empty value is refused (the Choria client
/// configuration's durations and the simulator's flags).
pub fn parse_seconds_or_unit(text: &str) -> Result<Duration, DurationError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(DurationError::Number);
    }
    match t.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => parse(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_follow_go_choria() {
        let ok: &[(&str, u64)] = &[
            ("1m", 60),
            ("90s", 90),
            ("1h30m", 5400),
            ("2h", 7200),
            ("1d", 86400),
            ("1D", 86400),
            ("1.5d", 36 * 3600),
            ("1w", 7 * 86400),
            ("1M", 30 * 86400),
            ("1y", 365 * 86400),
            ("1Y", 365 * 86400),
            (" 5m ", 300),
            ("", 0),
        ];
        for (s, secs) in ok {
            assert_eq!(parse(s), Ok(Duration::from_secs(*secs)), "{s}");
        }
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("60"), Err(DurationError::Unit("0".into())));
        assert_eq!(parse("1x"), Err(DurationError::Unit("x".into())));
        assert_eq!(parse("xd"), Err(DurationError::Number));
        assert_eq!(parse("1H"), Err(DurationError::Unit("H".into())));
        assert_eq!(parse("-5m"), Err(DurationError::Negative));
    }

    #[test]
    fn integers_are_seconds_where_a_configuration_allows_them() {
        assert_eq!(parse_seconds_or_unit("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_seconds_or_unit("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(
            parse_seconds_or_unit("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(parse_seconds_or_unit("1h1m"), Ok(Duration::from_secs(3660)));
        assert_eq!(
            parse_seconds_or_unit("5d"),
            Ok(Duration::from_secs(5 * 86400))
        );
        assert!(parse_seconds_or_unit("x").is_err());
        assert!(parse_seconds_or_unit("").is_err());
        assert!(parse_seconds_or_unit(&"9".repeat(400)).is_err());
    }
}
