//! This host's names as go-choria finds them (the kernel's host name, the domain facter
//! would report) and the DNS names the client accepts.

/// The longest DNS name accepted (RFC 1035, without the final dot).
pub const MAX_NAME_LEN: usize = 253;

/// The host name as the kernel has it (`uname(2)`, as Go's `os.Hostname`): it needs no file,
/// so it works under a unit whose `/proc` shows processes only (`ProcSubset=pid`) and without
/// `HOSTNAME` in the environment. Empty when the kernel has none.
pub fn host_name() -> String {
    let uts = rustix::system::uname();
    uts.nodename().to_string_lossy().trim().to_string()
}

/// The host's domain, as facter's `networking.domain` finds it: what follows the first dot of
/// the host name, else `resolv.conf`'s `domain`, else its first `search` entry.
pub fn host_domain() -> Option<String> {
    let hostname = host_name();
    if let Some((_, d)) = hostname.trim().split_once('.') {
        if valid_dns_name(d.trim_end_matches('.')).is_ok() {
            return Some(d.trim_end_matches('.').to_string());
        }
    }
    // resolv.conf is small; read at most 64 KiB of it.
    let text = std::fs::read("/etc/resolv.conf").ok()?;
    let text = String::from_utf8_lossy(text.get(..text.len().min(65_536))?).into_owned();
    domain_from_resolv_conf(&text)
}

/// `domain`, else the first `search` entry, of a `resolv.conf` text (the last line of each
/// kind counts, as in the resolver).
pub fn domain_from_resolv_conf(text: &str) -> Option<String> {
    let mut domain = None;
    let mut search = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("domain") => domain = words.next().map(str::to_string),
            Some("search") => search = words.next().map(str::to_string),
            _ => {}
        }
    }
    domain
        .or(search)
        .map(|d| d.trim_end_matches('.').to_string())
        .filter(|d| valid_dns_name(d).is_ok())
}

/// Whether `name` (no final dot) is a DNS host name this client accepts: at most
/// [`MAX_NAME_LEN`] bytes, labels of 1 to 63 letters, digits, `-` or `_`.
pub fn valid_dns_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("a label is empty or longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, '-' and '_' are allowed");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_domain_from_resolv_conf() {
        assert_eq!(
            domain_from_resolv_conf("nameserver 10.0.0.1\nsearch a.example.net b.example.net\n"),
            Some("a.example.net".into())
        );
        assert_eq!(
            domain_from_resolv_conf("search a.example.net\ndomain corp.example.net.\n"),
            Some("corp.example.net".into())
        );
        assert_eq!(domain_from_resolv_conf("nameserver 10.0.0.1\n"), None);
        assert_eq!(domain_from_resolv_conf("domain bad..name\n"), None);
    }
}
