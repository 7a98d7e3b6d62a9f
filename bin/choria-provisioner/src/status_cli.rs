//! `status`, `nodes` and `node`: the JSON API of a running provisioner, read over its monitor
//! listener and printed as aligned tables for people or as JSON (`--json`) for scripts.
//!
//! The listener's address, port and bearer token come from the same YAML the daemon reads
//! (`monitor_address`, `monitor_port`, `monitor_token_file`) unless `--monitor URL` and
//! `--token-file` say otherwise. The HTTP is a plain HTTP/1.1 GET over one connection with a
//! timeout for every step and a bounded response: a daemon that cannot be reached, or answers
//! something else, is one line on stderr and a non-zero exit.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs as _};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use provisioner::settings::read_token;

use crate::cli::{ApiArgs, NodeArgs, NodesArgs};

/// How long connecting, sending and each read may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The largest response read (a page of 500 nodes is well under this).
const MAX_RESPONSE: u64 = 8 << 20;

/// Where the API is and the token it wants.
struct Target {
    host: String,
    addr: SocketAddr,
    token: Option<String>,
}

fn target(args: &ApiArgs) -> Result<Target> {
    let default = Path::new(crate::cli::DEFAULT_CONFIG);
    let config_path = match (&args.config, &args.monitor) {
        (Some(p), _) => Some(p.as_path()),
        (None, None) if default.is_file() => Some(default),
        _ => None,
    };
    let config = match config_path {
        Some(p) => Some(
            provisioner::config::Config::load(p)
                .map_err(anyhow::Error::new)?
                .config,
        ),
        None => None,
    };
    let token_file = match (&args.token_file, &config) {
        (Some(p), _) => p.display().to_string(),
        (None, Some(c)) => c.monitor_token_file.clone(),
        (None, None) => String::new(),
    };
    let token = read_token(&token_file)?;
    let (host, addr) = match (&args.monitor, &config) {
        (Some(url), _) => parse_url(url)?,
        (None, Some(c)) => {
            if c.monitor_port == 0 {
                bail!(
                    "monitor_port is 0 in {}: the daemon serves no API (give --monitor URL if it runs with another configuration)",
                    c.file.display()
                );
            }
            // Every interface (empty or unspecified) is reached on loopback.
            let ip: IpAddr = match c.monitor_address.parse::<IpAddr>() {
                Ok(ip) if ip.is_unspecified() && ip.is_ipv6() => Ipv6Addr::LOCALHOST.into(),
                Ok(ip) if ip.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
                Ok(ip) => ip,
                Err(_) => Ipv4Addr::LOCALHOST.into(),
            };
            let addr = SocketAddr::new(ip, c.monitor_port);
            (addr.to_string(), addr)
        }
        (None, None) => bail!("give --config FILE (the daemon's YAML) or --monitor URL"),
    };
    Ok(Target { host, addr, token })
}

/// `http://HOST:PORT` (a trailing `/` allowed) as the Host header and an address.
fn parse_url(url: &str) -> Result<(String, SocketAddr)> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        anyhow!("--monitor {url:?}: only http://HOST:PORT is supported (the monitor listener speaks plain HTTP)")
    })?;
    let hostport = rest.trim_end_matches('/');
    if hostport.is_empty() || hostport.contains('/') {
        bail!("--monitor {url:?}: expected http://HOST:PORT");
    }
    let with_port = if hostport.rsplit_once(':').is_some_and(|(h, p)| {
        !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && (!h.contains(':') || h.ends_with(']'))
    }) {
        hostport.to_string()
    } else {
        format!("{hostport}:80")
    };
    let addr = with_port
        .to_socket_addrs()
        .with_context(|| format!("--monitor {url:?}: cannot resolve {with_port}"))?
        .next()
        .ok_or_else(|| anyhow!("--monitor {url:?}: {with_port} has no address"))?;
    Ok((hostport.to_string(), addr))
}

/// GETs `path` and returns the JSON body of a 200 answer.
fn get(t: &Target, path: &str) -> Result<Value> {
    let unreachable = |e: std::io::Error| {
        anyhow!(
            "cannot reach the provisioner's monitor listener at http://{}: {e} (is the daemon running, and is monitor_port set?)",
            t.host
        )
    };
    let mut s = TcpStream::connect_timeout(&t.addr, TIMEOUT).map_err(unreachable)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(unreachable)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(unreachable)?;
    let auth = match &t.token {
        Some(tok) => format!("Authorization: Bearer {tok}\r\n"),
        None => String::new(),
    };
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n{auth}Connection: close\r\n\r\n",
        t.host
    )
    .map_err(unreachable)?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE + 1)
        .read_to_end(&mut raw)
        .map_err(unreachable)?;
    if raw.len() as u64 > MAX_RESPONSE {
        bail!(
            "the answer from http://{}{path} is larger than {MAX_RESPONSE} bytes",
            t.host
        );
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("http://{}{path} did not answer HTTP", t.host))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let status: u16 = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("http://{}{path} did not answer HTTP", t.host))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    let json: Option<Value> = serde_json::from_slice(&body).ok();
    let said = json
        .as_ref()
        .and_then(|j| j["error"].as_str())
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    match status {
        200 => json.ok_or_else(|| anyhow!("http://{}{path} answered something that is not JSON", t.host)),
        401 => bail!("the provisioner at http://{} wants a bearer token{said} (monitor_token_file in the YAML, or --token-file)", t.host),
        404 => bail!("not found at http://{}{path}{said}", t.host),
        s => bail!("http://{}{path} answered {s}{said}", t.host),
    }
}

/// The body of a chunked response.
fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("a chunked answer is cut short"))?;
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| anyhow!("a chunked answer has a bad chunk size"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            bail!("a chunked answer is cut short");
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Rows as columns padded to the widest cell (the last column not padded).
fn table(rows: &[Vec<String>]) -> String {
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

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect(),
        Value::Null => "-".into(),
        v => v.to_string(),
    }
}

fn print_json(v: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// `choria-provisioner status`.
pub fn status(args: &ApiArgs) -> Result<()> {
    let t = target(args)?;
    let s = get(&t, "/api/v1/status")?;
    if args.json {
        return print_json(&s);
    }
    let mut rows = vec![
        vec!["Provisioner".into(), text(&s["identity"])],
        vec!["Version".into(), text(&s["version"])],
        vec!["Site".into(), text(&s["site"])],
        vec!["Role".into(), text(&s["role"])],
        vec!["Connected".into(), text(&s["connected"])],
        vec!["Paused".into(), text(&s["paused"])],
        vec!["Queue".into(), text(&s["queue"])],
        vec![
            "In flight".into(),
            format!(
                "{} of {} workers",
                text(&s["in_flight"]),
                text(&s["workers"])
            ),
        ],
    ];
    if let Some(totals) = s["totals"].as_object() {
        for (k, v) in totals {
            rows.push(vec![k.replace('_', " "), text(v)]);
        }
    }
    let h = &s["history"];
    if h.is_object() {
        rows.push(vec![
            "History".into(),
            format!(
                "{} nodes, {} bytes ({} per node), at most {} nodes for {} s",
                text(&h["nodes"]),
                text(&h["bytes"]),
                text(&h["bytes_per_node"]),
                text(&h["max_nodes"]),
                text(&h["max_age_seconds"])
            ),
        ]);
        if let Some(states) = h["states"].as_object() {
            let held: Vec<String> = states
                .iter()
                .filter(|(_, v)| v.as_u64().unwrap_or(0) > 0)
                .map(|(k, v)| format!("{k} {}", text(v)))
                .collect();
            rows.push(vec![
                "Nodes held".into(),
                if held.is_empty() {
                    "none".into()
                } else {
                    held.join(", ")
                },
            ]);
        }
    }
    print!("{}", table(&rows));
    Ok(())
}

/// `choria-provisioner nodes`.
pub fn nodes(args: &NodesArgs) -> Result<()> {
    let t = target(&args.api)?;
    let mut q = format!("/api/v1/nodes?offset={}&limit={}", args.offset, args.limit);
    if let Some(s) = &args.state {
        if provision_core::NodeState::parse(s).is_none() {
            let known: Vec<&str> = provision_core::NodeState::ALL
                .iter()
                .map(|s| s.label())
                .collect();
            bail!("unknown state {s:?} (known: {})", known.join(", "));
        }
        q.push_str(&format!("&state={s}"));
    }
    let v = get(&t, &q)?;
    if args.api.json {
        return print_json(&v);
    }
    let mut rows = vec![vec![
        "IDENTITY".into(),
        "STATE".into(),
        "STEP".into(),
        "UPDATED".into(),
        "CAUSE".into(),
    ]];
    for n in v["nodes"].as_array().into_iter().flatten() {
        rows.push(vec![
            text(&n["identity"]),
            text(&n["state"]),
            text(&n["step"]),
            text(&n["updated"]),
            text(&n["cause"]),
        ]);
    }
    print!("{}", table(&rows));
    let shown = rows.len() - 1;
    let total = v["total"].as_u64().unwrap_or(0);
    if total as usize > shown {
        println!("{shown} of {total} nodes shown (--offset, --limit for more)");
    }
    Ok(())
}

/// `choria-provisioner node IDENTITY`.
pub fn node(args: &NodeArgs) -> Result<()> {
    let t = target(&args.api)?;
    let path = format!(
        "/api/v1/nodes/{}",
        provisioner_status::api::percent_encode(&args.identity)
    );
    let n = get(&t, &path)?;
    if args.api.json {
        return print_json(&n);
    }
    let mut rows = vec![
        vec!["Identity".into(), text(&n["identity"])],
        vec!["State".into(), text(&n["state"])],
        vec!["Step".into(), text(&n["step"])],
        vec!["Cause".into(), text(&n["cause"])],
        vec!["Found by".into(), text(&n["found_by"])],
        vec!["Helper message".into(), text(&n["helper_msg"])],
        vec![
            "Issued".into(),
            if n["issued"].is_null() {
                "-".into()
            } else {
                n["issued"].to_string()
            },
        ],
        vec!["First seen".into(), text(&n["first_seen"])],
        vec!["Updated".into(), text(&n["updated"])],
        vec!["Cycles".into(), text(&n["cycles"])],
    ];
    if !n["upgrade"].is_null() {
        rows.push(vec![
            "Upgrade".into(),
            format!(
                "{} to {}",
                text(&n["upgrade"]["from"]),
                text(&n["upgrade"]["to"])
            ),
        ]);
    }
    print!("{}", table(&rows));
    println!();
    let mut hist = vec![vec![
        "TIME".into(),
        "EVENT".into(),
        "STEP".into(),
        "RESULT".into(),
        "TRIES".into(),
        "MS".into(),
        "DETAIL".into(),
    ]];
    for e in n["history"].as_array().into_iter().flatten() {
        hist.push(vec![
            text(&e["time"]),
            text(&e["event"]),
            text(&e["step"]),
            if e["ok"].as_bool().unwrap_or(false) {
                "ok".into()
            } else {
                "failed".into()
            },
            text(&e["tries"]),
            text(&e["elapsed_ms"]),
            text(&e["detail"]),
        ]);
    }
    print!("{}", table(&hist));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_host_and_port() {
        assert_eq!(
            parse_url("http://127.0.0.1:8080/").unwrap().1,
            "127.0.0.1:8080".parse().unwrap()
        );
        assert_eq!(
            parse_url("http://[::1]:9").unwrap().1,
            "[::1]:9".parse().unwrap()
        );
        assert_eq!(parse_url("http://127.0.0.1").unwrap().1.port(), 80);
        assert!(parse_url("https://x:1").is_err());
        assert!(parse_url("http://x:1/api").is_err());
    }

    #[test]
    fn tables_are_aligned() {
        let t = table(&[
            vec!["A".into(), "long one".into(), "x".into()],
            vec!["bbb".into(), "c".into(), "y".into()],
        ]);
        assert_eq!(t, "A    long one  x\nbbb  c         y\n");
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"ff\r\nabc").is_err());
    }
}
