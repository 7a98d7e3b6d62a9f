//! A campaign for people: the `rotate` flags' rates and shares, the progress line and the
//! status text.

use super::*;

/// Parses `--rate`: `500/min`, `10/s`, `30000/h` or a bare number a minute.
pub fn parse_rate(text: &str) -> Result<u32, CampaignError> {
    let invalid = || {
        CampaignError::Invalid(format!(
            "--rate {}: give nodes a minute as 500/min (or N/s, N/h)",
            escaped(text)
        ))
    };
    let (n, per) = text.split_once('/').unwrap_or((text, "min"));
    let n: u64 = n.trim().parse().map_err(|_| invalid())?;
    let per_minute = match per.trim() {
        "s" | "sec" | "second" => n.checked_mul(60),
        "m" | "min" | "minute" => Some(n),
        "h" | "hour" => Some(n / 60),
        _ => None,
    }
    .ok_or_else(invalid)?;
    u32::try_from(per_minute)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(invalid)
}

/// Parses `--stop-if-failing`: `5%` or `5`.
pub fn parse_share(text: &str) -> Result<f64, CampaignError> {
    text.trim()
        .trim_end_matches('%')
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| {
            CampaignError::Invalid(format!(
                "--stop-if-failing {}: give a share as 5%",
                escaped(text)
            ))
        })
}

/// One line of progress: a bar, the counts and the ETA.
pub fn progress_line(rec: &CampaignRecord, now: i64) -> String {
    const WIDTH: u64 = 30;
    let finished = rec.done + rec.failed;
    let filled = (finished * WIDTH).checked_div(rec.total).unwrap_or(0);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let eta = match rec.eta {
        Some(t) if t > now => format!(", ETA {}", human_duration(t - now)),
        _ => String::new(),
    };
    format!(
        "[{bar}] {}/{} done, {} failed, {} in flight, {} waiting{eta} ({})",
        rec.done, rec.total, rec.failed, rec.in_flight, rec.pending, rec.state
    )
}

fn human_duration(secs: i64) -> String {
    match secs {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// `rotate status`: the campaign in lines for people.
pub fn status_text(rec: &CampaignRecord, now: i64) -> String {
    let mut out = String::new();
    let driver = if rec.driven(now) {
        format!("{} (heartbeat {}s ago)", rec.driver, rec.heartbeat_age(now))
    } else {
        "nobody".to_string()
    };
    let lines = [
        ("Campaign", rec.id.clone()),
        ("State", rec.state.to_string()),
        ("Reason", rec.reason.clone()),
        (
            "Started",
            format!("{} by {}", crate::rfc3339(rec.created), rec.by),
        ),
        ("Selected by", rec.selector.clone()),
        (
            "Limits",
            format!(
                "{}/min, {} in flight, stop above {}% failing, {}s a node",
                rec.limits.rate_per_minute,
                rec.limits.max_in_flight,
                rec.limits.stop_if_failing,
                rec.limits.node_timeout_secs
            ),
        ),
        ("Driven by", driver),
        ("Progress", progress_line(rec, now)),
    ];
    for (k, v) in lines {
        if !v.is_empty() {
            out.push_str(&format!("{k:>12}: {v}\n"));
        }
    }
    if !rec.recent_failures.is_empty() {
        out.push_str("\nLatest failures:\n");
        for f in &rec.recent_failures {
            out.push_str(&format!(
                "  {} {}: {}\n",
                crate::rfc3339(f.at),
                f.identity,
                f.error
            ));
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::campaign::testing::*;

    #[test]
    fn rates_and_shares_parse_with_their_units() {
        assert_eq!(parse_rate("500/min").unwrap(), 500);
        assert_eq!(parse_rate("10/s").unwrap(), 600);
        assert_eq!(parse_rate("6000/h").unwrap(), 100);
        assert_eq!(parse_rate("42").unwrap(), 42);
        for bad in ["0/min", "x/min", "5/week", "10/h", "-1"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_share("5%").unwrap(), 5.0);
        assert_eq!(parse_share("0.5").unwrap(), 0.5);
        assert!(parse_share("101%").is_err());
        assert!(parse_share("lots").is_err());
    }

    #[test]
    fn progress_shows_a_bar_counts_and_eta() {
        let mut rec = record(10);
        rec.done = 5;
        rec.failed = 1;
        rec.in_flight = 2;
        rec.pending = 2;
        rec.eta = Some(1_000 + 125);
        let line = progress_line(&rec, 1_000);
        assert!(
            line.starts_with(&format!("[{}{}]", "#".repeat(18), ".".repeat(12))),
            "{line}"
        );
        assert!(
            line.contains("5/10 done, 1 failed, 2 in flight, 2 waiting, ETA 2m05s (running)"),
            "{line}"
        );
        let text = status_text(&rec, 1_000);
        assert!(text.contains("Driven by: nobody"), "{text}");
        assert!(progress_line(&record(0), 0).contains("0/0 done"));
    }
}
