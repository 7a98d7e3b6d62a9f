//! The Prometheus text format as the provisioner writes it, and a plain HTTP GET to fetch it.

use std::io::{Read, Write};
use std::time::Duration;

/// One sample line: `name{k="v",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name (with `_sum`, `_count` or `_bucket` as written).
    pub name: String,
    /// The labels in order, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of a scrape; comments and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i,
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            other => value.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), value));
                }
                other => key.push(other),
            }
        };
        rest = &body[end + 1..];
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// The first sample of `name` that has label `label` (any labels when `None`).
pub fn metric(text: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    parse(text)
        .into_iter()
        .find(|s| s.name == name && label.is_none_or(|(k, v)| s.label(k) == Some(v)))
        .map(|s| s.value)
}

/// The sum of every sample of `name` (all label sets); 0 when there is none.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    parse(text)
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// The sum of the samples of `name` whose label `key` is `value`; 0 when there is none.
pub fn metric_with(text: &str, name: &str, key: &str, value: &str) -> f64 {
    parse(text)
        .iter()
        .filter(|s| s.name == name && s.label(key) == Some(value))
        .map(|s| s.value)
        .sum()
}

/// A plain HTTP/1.1 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_at((std::net::Ipv4Addr::LOCALHOST, port).into(), path)
}

/// A plain HTTP/1.1 GET to `addr` (IPv4 or IPv6): (status, body).
pub fn http_get_at(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let (status, text) = http_get_raw(addr, path, "localhost", Duration::from_secs(5)).ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// A plain HTTP/1.1 GET of `path` to `addr` with `Host: host`, connecting, writing and reading
/// each allowed `timeout`: the status and the whole answer, headers and body.
pub fn http_get_raw(
    addr: std::net::SocketAddr,
    path: &str,
    host: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {text:?}")))?;
    Ok((status, text))
}

/// The `/metrics` page on loopback `port` (empty when it cannot be reached).
pub fn scrape(port: u16) -> String {
    http_get(port, "/metrics")
        .map(|(_, body)| body)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP choria_provisioner_provisioned nodes\n\
        # TYPE choria_provisioner_provisioned counter\n\
        choria_provisioner_provisioned{site=\"local\"} 12\n\
        choria_provisioner_rpc_time_count{site=\"local\",rpc=\"inventory\"} 3\n\
        choria_provisioner_rpc_time_count{site=\"local\",rpc=\"jwt\"} 4.5\n\
        odd{v=\"a,b}\\\"c\"} 1\n\
        bare 7\n";

    #[test]
    fn parses_names_labels_and_values() {
        let s = parse(TEXT);
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].name, "choria_provisioner_provisioned");
        assert_eq!(s[0].label("site"), Some("local"));
        assert_eq!(s[3].label("v"), Some("a,b}\"c"));
        assert_eq!(s[4].labels, vec![]);
        assert_eq!(s[4].value, 7.0);
    }

    #[test]
    fn selects_and_sums() {
        let rpc = "choria_provisioner_rpc_time_count";
        assert_eq!(metric(TEXT, rpc, Some(("rpc", "jwt"))), Some(4.5));
        assert_eq!(metric(TEXT, rpc, Some(("rpc", "gencsr"))), None);
        assert_eq!(metric_sum(TEXT, rpc), 7.5);
        assert_eq!(metric_with(TEXT, rpc, "rpc", "inventory"), 3.0);
        assert_eq!(metric_sum(TEXT, "choria_provisioner"), 0.0);
        assert_eq!(metric_sum(TEXT, "bare"), 7.0);
    }
}
