//! Where the brokers are, found as go-choria's `MiddlewareServers` finds them:
//!
//! 1. `plugin.choria.middleware_hosts`, when it names any host;
//! 2. else, unless `plugin.choria.use_srv` is false, the SRV records
//!    `_mcollective-server._tcp.<domain>` and then `_x-puppet-mcollective._tcp.<domain>` (the
//!    first name that answers wins), the domain being `CHORIA_SRV_DOMAIN` when that variable is
//!    set, else `plugin.choria.srv_domain`, else the host's own domain;
//! 3. else `nats://puppet:4222`.
//!
//! A failed lookup is a warning and falls through to `puppet:4222`, as in go-choria. Targets are
//! ordered as RFC 2782 asks (lowest priority first, weighted random order within a priority),
//! which is what Go's `net.LookupSRV` returns.
//!
//! The lookup uses the system resolver configuration (`/etc/resolv.conf`). The
//! [`DNS_SERVER_ENV`] environment variable (`CHORIA_PROVISIONER_DNS_SERVER=ip[:port]`) sends it
//! to one given DNS server instead, on any port, which `resolv.conf` cannot express: for tests
//! and for diagnosing a site's records.
//!
//! Everything a DNS server sends is bounded: the lookup has a deadline, names are limited to
//! [`MAX_NAME_LEN`], at most [`MAX_SRV_TARGETS`] targets are kept, and a target that is not a
//! plain host name (or a port of 0, or the "no service" target `.`) is dropped.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::Resolver;

use crate::config::{parse_bool, parse_middleware_host, ChoriaConfig};
use crate::host::{host_domain, valid_dns_name};

/// The environment variable that points SRV lookups at one DNS server, `ip` or `ip:port`.
pub const DNS_SERVER_ENV: &str = "CHORIA_PROVISIONER_DNS_SERVER";
/// The environment variable that sets the SRV domain; like go-choria, it wins over
/// `plugin.choria.srv_domain` whenever it is set.
pub const SRV_DOMAIN_ENV: &str = "CHORIA_SRV_DOMAIN";
/// The SRV names asked for, in order, under the domain.
pub const MIDDLEWARE_SRV_NAMES: [&str; 2] =
    ["_mcollective-server._tcp", "_x-puppet-mcollective._tcp"];
/// The broker used when nothing else names one.
pub const FALLBACK_BROKER: &str = "nats://puppet:4222";
/// At most this many SRV targets are used.
pub const MAX_SRV_TARGETS: usize = 32;
pub use crate::host::MAX_NAME_LEN;
/// How long all the SRV lookups of one resolution may take together.
pub const SRV_LOOKUP_DEADLINE: Duration = Duration::from_secs(10);
/// How long one query to one server may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Why the broker settings cannot be used. Reported before any network call.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A `plugin.choria.middleware_hosts` entry is not `host:port` or `scheme://host:port`.
    #[error("plugin.choria.middleware_hosts: {0}")]
    MiddlewareHost(#[source] crate::config::ChoriaConfigError),
    /// The SRV domain is not a DNS name.
    #[error("invalid srv domain {domain:?} (from {from}): {reason}")]
    SrvDomain {
        /// The domain, bounded.
        domain: String,
        /// Where it came from.
        from: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// [`DNS_SERVER_ENV`] is not `ip` or `ip:port`.
    #[error("{DNS_SERVER_ENV}={value:?} is not an ip address or ip:port")]
    DnsServer {
        /// The value, bounded.
        value: String,
    },
}

/// How the broker list was arrived at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrokerSource {
    /// `plugin.choria.middleware_hosts`.
    Configured,
    /// An SRV record set; the name that answered.
    Srv(String),
    /// Nothing named a broker: `puppet:4222`.
    Fallback,
}

impl std::fmt::Display for BrokerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BrokerSource::Configured => f.write_str("plugin.choria.middleware_hosts"),
            BrokerSource::Srv(name) => write!(f, "SRV records {name}"),
            BrokerSource::Fallback => f.write_str("the default puppet:4222"),
        }
    }
}

/// The brokers to connect to, in order, and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Brokers {
    /// `scheme://host:port` URLs.
    pub urls: Vec<String>,
    /// Where they came from.
    pub source: BrokerSource,
}

/// Where the SRV domain comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SrvDomain {
    /// A given domain (from [`SRV_DOMAIN_ENV`] or `plugin.choria.srv_domain`).
    Given(String),
    /// The host's own domain, found at lookup time.
    Host,
}

/// SRV lookup settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvSettings {
    /// The domain the names are looked up under.
    pub domain: SrvDomain,
    /// One DNS server to ask, overriding the system's ([`DNS_SERVER_ENV`]).
    pub dns_server: Option<SocketAddr>,
}

/// How to find the brokers: configured URLs, else SRV (when enabled), else `puppet:4222`.
/// Built from the configuration before any network call; [`BrokerPlan::resolve`] does the
/// lookups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerPlan {
    configured: Vec<String>,
    srv: Option<SrvSettings>,
}

/// Bound a value shown in an error.
fn shown(v: &str) -> String {
    v.chars().take(80).collect()
}

/// Parse [`DNS_SERVER_ENV`]'s value: `ip`, `ip:port` or `[ipv6]:port`.
pub fn parse_dns_server(v: &str) -> Result<SocketAddr, BrokerError> {
    let v = v.trim();
    if let Ok(sa) = v.parse::<SocketAddr>() {
        return Ok(sa);
    }
    v.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| BrokerError::DnsServer { value: shown(v) })
}

impl BrokerPlan {
    /// Exactly these broker URLs (already `scheme://host:port`), no lookups.
    pub fn urls(urls: Vec<String>) -> Self {
        BrokerPlan {
            configured: urls,
            srv: None,
        }
    }

    /// No configured URLs: look them up with `srv` (`None`: SRV off), else `puppet:4222`.
    pub fn lookup(srv: Option<SrvSettings>) -> Self {
        BrokerPlan {
            configured: Vec::new(),
            srv,
        }
    }

    /// The plan a configuration asks for: `plugin.choria.middleware_hosts`,
    /// `plugin.choria.use_srv` (default true), `plugin.choria.srv_domain` and the
    /// [`SRV_DOMAIN_ENV`] and [`DNS_SERVER_ENV`] environment variables.
    pub fn from_config(cfg: &ChoriaConfig) -> Result<Self, BrokerError> {
        Self::from_parts(
            cfg,
            std::env::var(SRV_DOMAIN_ENV).ok(),
            std::env::var(DNS_SERVER_ENV).ok(),
        )
    }

    /// [`BrokerPlan::from_config`] with the environment given.
    pub fn from_parts(
        cfg: &ChoriaConfig,
        srv_domain_env: Option<String>,
        dns_server_env: Option<String>,
    ) -> Result<Self, BrokerError> {
        let configured = cfg
            .middleware_hosts
            .iter()
            .map(|h| parse_middleware_host(h))
            .collect::<Result<Vec<_>, _>>()
            .map_err(BrokerError::MiddlewareHost)?;
        let raw = |k: &str| cfg.raw.get(k).map(|v| v.trim());
        let use_srv = raw("plugin.choria.use_srv")
            .filter(|v| !v.is_empty())
            .is_none_or(parse_bool);
        // Only a lookup that will happen is checked: with hosts configured, the SRV settings
        // are never used (as in go-choria).
        let srv = if use_srv && configured.is_empty() {
            // go-choria: the environment variable wins whenever it is set, even empty.
            let (domain, from) = match srv_domain_env {
                Some(d) => (d, SRV_DOMAIN_ENV),
                None => (
                    raw("plugin.choria.srv_domain").unwrap_or("").to_string(),
                    "plugin.choria.srv_domain",
                ),
            };
            let domain = domain.trim().trim_end_matches('.').to_string();
            let domain = if domain.is_empty() {
                SrvDomain::Host
            } else {
                valid_dns_name(&domain).map_err(|reason| BrokerError::SrvDomain {
                    domain: shown(&domain),
                    from,
                    reason,
                })?;
                SrvDomain::Given(domain)
            };
            let dns_server = dns_server_env
                .filter(|v| !v.trim().is_empty())
                .map(|v| parse_dns_server(&v))
                .transpose()?;
            Some(SrvSettings { domain, dns_server })
        } else {
            None
        };
        Ok(BrokerPlan { configured, srv })
    }

    /// The configured URLs (empty when brokers are looked up).
    pub fn configured(&self) -> &[String] {
        &self.configured
    }

    /// The SRV settings, `None` when brokers are configured or SRV is switched off.
    pub fn srv(&self) -> Option<&SrvSettings> {
        if self.configured.is_empty() {
            self.srv.as_ref()
        } else {
            None
        }
    }

    /// What the plan amounts to, for logs and `check`: the configured URLs, or how they will be
    /// looked up.
    pub fn describe(&self) -> String {
        if !self.configured.is_empty() {
            return self.configured.join(", ");
        }
        match self.srv() {
            None => format!("{FALLBACK_BROKER} (no middleware_hosts, SRV lookups off)"),
            Some(s) => {
                let domain = match &s.domain {
                    SrvDomain::Given(d) => d.clone(),
                    SrvDomain::Host => "<the host's domain>".to_string(),
                };
                let via = s
                    .dns_server
                    .map(|a| format!(" via {a}"))
                    .unwrap_or_default();
                format!(
                    "SRV {}{via}, else {FALLBACK_BROKER}",
                    MIDDLEWARE_SRV_NAMES
                        .map(|n| format!("{n}.{domain}"))
                        .join(" or ")
                )
            }
        }
    }

    /// The brokers now: the configured ones, else the SRV targets, else `puppet:4222`. Never
    /// fails: a lookup problem is logged as a warning and falls through, as in go-choria.
    pub async fn resolve(&self) -> Brokers {
        if !self.configured.is_empty() {
            return Brokers {
                urls: self.configured.clone(),
                source: BrokerSource::Configured,
            };
        }
        if let Some(srv) = self.srv() {
            match tokio::time::timeout(SRV_LOOKUP_DEADLINE, lookup_middleware(srv)).await {
                Ok(Ok(Some(found))) => return found,
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    tracing::warn!("Could not resolve Middleware Server SRV records: {e}")
                }
                Err(_) => tracing::warn!(
                    "Could not resolve Middleware Server SRV records: no answer within {SRV_LOOKUP_DEADLINE:?}"
                ),
            }
        }
        Brokers {
            urls: vec![FALLBACK_BROKER.to_string()],
            source: BrokerSource::Fallback,
        }
    }
}

/// Why an SRV lookup failed.
#[derive(Debug, thiserror::Error)]
pub enum SrvError {
    /// The resolver could not be set up (unreadable `resolv.conf`...).
    #[error("cannot set up the DNS resolver: {0}")]
    Resolver(String),
    /// The host's domain is unknown.
    #[error("the host's domain is unknown: set plugin.choria.srv_domain or {SRV_DOMAIN_ENV}")]
    NoDomain,
}

fn resolver(srv: &SrvSettings) -> Result<Resolver<TokioRuntimeProvider>, SrvError> {
    let (config, mut opts) = match srv.dns_server {
        Some(addr) => {
            let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
            for c in &mut ns.connections {
                c.port = addr.port();
            }
            (
                ResolverConfig::from_name_servers(vec![ns]),
                ResolverOpts::default(),
            )
        }
        None => hickory_resolver::system_conf::read_system_conf()
            .map_err(|e| SrvError::Resolver(e.to_string()))?,
    };
    opts.timeout = QUERY_TIMEOUT;
    opts.attempts = 2;
    opts.cache_size = 16;
    // Names are asked fully qualified; no search list, no hosts file.
    opts.ndots = 0;
    opts.use_hosts_file = hickory_resolver::config::ResolveHosts::Never;
    let mut builder = Resolver::builder_with_config(config, TokioRuntimeProvider::default());
    *builder.options_mut() = opts;
    builder
        .build()
        .map_err(|e| SrvError::Resolver(e.to_string()))
}

/// One SRV answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvTarget {
    /// Priority: lower first.
    pub priority: u16,
    /// Weight within a priority.
    pub weight: u16,
    /// Port.
    pub port: u16,
    /// Host, without the final dot.
    pub host: String,
}

/// Look up the middleware SRV names in turn; the first that answers with usable targets wins.
async fn lookup_middleware(srv: &SrvSettings) -> Result<Option<Brokers>, SrvError> {
    let domain = match &srv.domain {
        SrvDomain::Given(d) => d.clone(),
        SrvDomain::Host => host_domain().ok_or(SrvError::NoDomain)?,
    };
    let resolver = resolver(srv)?;
    for name in MIDDLEWARE_SRV_NAMES {
        let record = format!("{name}.{domain}");
        tracing::debug!("Attempting SRV lookup for {record}");
        let answers = match resolver.srv_lookup(format!("{record}.")).await {
            Ok(lookup) => lookup
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::SRV(s) => Some(SrvTarget {
                        priority: s.priority,
                        weight: s.weight,
                        port: s.port,
                        host: s.target.to_ascii(),
                    }),
                    _ => None,
                })
                .collect::<Vec<_>>(),
            Err(e) => {
                tracing::debug!("Failed to resolve {record}: {e}");
                continue;
            }
        };
        let targets = usable_targets(answers, &mut rand::thread_rng());
        if targets.is_empty() {
            tracing::debug!("No usable SRV targets for {record}");
            continue;
        }
        tracing::debug!("Found {} SRV records for {record}", targets.len());
        return Ok(Some(Brokers {
            urls: targets
                .iter()
                .map(|t| format!("nats://{}:{}", t.host, t.port))
                .collect(),
            source: BrokerSource::Srv(record),
        }));
    }
    Ok(None)
}

/// The targets to use, in the order to try them: unusable ones (the "no service" target `.`,
/// port 0, a host that is not a plain DNS name) dropped, ordered as RFC 2782 and Go's
/// `net.LookupSRV` order them, at most [`MAX_SRV_TARGETS`].
pub fn usable_targets(answers: Vec<SrvTarget>, rng: &mut impl rand::Rng) -> Vec<SrvTarget> {
    let mut targets: Vec<SrvTarget> = answers
        .into_iter()
        .map(|mut t| {
            t.host = t.host.trim_end_matches('.').to_string();
            t
        })
        .filter(|t| t.port != 0 && valid_dns_name(&t.host).is_ok())
        .take(MAX_SRV_TARGETS * 8)
        .collect();
    sort_rfc2782(&mut targets, rng);
    targets.dedup_by(|a, b| a.host == b.host && a.port == b.port);
    targets.truncate(MAX_SRV_TARGETS);
    targets
}

/// Sort by priority, then shuffle each priority's targets by weight: the next target is drawn
/// with a probability proportional to its weight (zero weights last, in their order).
pub fn sort_rfc2782(targets: &mut [SrvTarget], rng: &mut impl rand::Rng) {
    targets.sort_by_key(|t| (t.priority, t.weight));
    let mut start = 0;
    while start < targets.len() {
        let prio = targets[start].priority;
        let end = targets[start..]
            .iter()
            .position(|t| t.priority != prio)
            .map_or(targets.len(), |n| start + n);
        shuffle_by_weight(&mut targets[start..end], rng);
        start = end;
    }
}

fn shuffle_by_weight(mut group: &mut [SrvTarget], rng: &mut impl rand::Rng) {
    let mut sum: u32 = group.iter().map(|t| u32::from(t.weight)).sum();
    while sum > 0 && group.len() > 1 {
        let n = rng.gen_range(0..sum);
        let mut running = 0u32;
        for i in 0..group.len() {
            running += u32::from(group[i].weight);
            if running > n {
                group.swap(0, i);
                break;
            }
        }
        sum -= u32::from(group[0].weight);
        group = &mut group[1..];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn t(priority: u16, weight: u16, host: &str) -> SrvTarget {
        SrvTarget {
            priority,
            weight,
            port: 4222,
            host: host.into(),
        }
    }

    fn cfg(text: &str) -> ChoriaConfig {
        ChoriaConfig::parse_str(text).unwrap()
    }

    #[test]
    fn configured_hosts_come_first_and_srv_settings_follow_go() {
        let plan = BrokerPlan::from_parts(
            &cfg("plugin.choria.middleware_hosts = b1:4222, tls://b2:4443\nplugin.choria.srv_domain = example.net"),
            None,
            None,
        )
        .unwrap();
        assert_eq!(plan.configured(), ["nats://b1:4222", "tls://b2:4443"]);
        assert_eq!(plan.srv(), None, "configured hosts need no lookup");

        let plan =
            BrokerPlan::from_parts(&cfg("plugin.choria.srv_domain = example.net."), None, None)
                .unwrap();
        assert_eq!(
            plan.srv().unwrap().domain,
            SrvDomain::Given("example.net".into())
        );
        // The environment wins over the file whenever it is set, as go-choria's confkey does.
        let plan = BrokerPlan::from_parts(
            &cfg("plugin.choria.srv_domain = example.net"),
            Some("other.example.org".into()),
            Some("127.0.0.1:5353".into()),
        )
        .unwrap();
        let srv = plan.srv().unwrap();
        assert_eq!(srv.domain, SrvDomain::Given("other.example.org".into()));
        assert_eq!(srv.dns_server, Some("127.0.0.1:5353".parse().unwrap()));
        let plan = BrokerPlan::from_parts(
            &cfg("plugin.choria.srv_domain = example.net"),
            Some(String::new()),
            None,
        )
        .unwrap();
        assert_eq!(plan.srv().unwrap().domain, SrvDomain::Host);
        let plan = BrokerPlan::from_parts(&cfg(""), None, None).unwrap();
        assert_eq!(plan.srv().unwrap().domain, SrvDomain::Host);
        assert!(plan
            .describe()
            .contains("_mcollective-server._tcp.<the host's domain>"));

        for off in ["false", "no", "0", "n"] {
            let plan =
                BrokerPlan::from_parts(&cfg(&format!("plugin.choria.use_srv = {off}")), None, None)
                    .unwrap();
            assert_eq!(plan.srv(), None, "use_srv = {off}");
        }
        let plan = BrokerPlan::from_parts(&cfg("plugin.choria.use_srv = yes"), None, None).unwrap();
        assert!(plan.srv().is_some());
    }

    #[test]
    fn bad_settings_are_refused_before_any_lookup() {
        let err = BrokerPlan::from_parts(&cfg("plugin.choria.middleware_hosts = b1"), None, None)
            .unwrap_err();
        assert!(matches!(err, BrokerError::MiddlewareHost(_)), "{err}");
        let long = "a".repeat(300);
        for bad in ["exa mple.net", "a..b", long.as_str(), "ex/ample"] {
            let err = BrokerPlan::from_parts(
                &cfg(&format!("plugin.choria.srv_domain = {bad}")),
                None,
                None,
            )
            .unwrap_err();
            assert!(matches!(err, BrokerError::SrvDomain { .. }), "{bad}: {err}");
            assert!(err.to_string().len() < 250, "bounded: {err}");
        }
        // Settings of a lookup that never happens do not matter.
        BrokerPlan::from_parts(
            &cfg("plugin.choria.middleware_hosts = b1:4222\nplugin.choria.srv_domain = a..b"),
            None,
            Some("not-an-address".into()),
        )
        .unwrap();
        let err =
            BrokerPlan::from_parts(&cfg(""), None, Some("dns.example.net:53".into())).unwrap_err();
        assert!(matches!(err, BrokerError::DnsServer { .. }), "{err}");
        assert_eq!(
            parse_dns_server("10.0.0.1").unwrap(),
            "10.0.0.1:53".parse().unwrap()
        );
        assert_eq!(
            parse_dns_server("[::1]:5353").unwrap(),
            "[::1]:5353".parse().unwrap()
        );
    }

    #[test]
    fn targets_are_ordered_by_priority_and_weight_and_bounded() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let answers = vec![
            t(20, 0, "late.example.net."),
            t(10, 0, "zero.example.net."),
            t(10, 100, "heavy.example.net."),
            t(5, 0, "first.example.net"),
            t(10, 0, "."),
            SrvTarget {
                port: 0,
                ..t(1, 0, "noport.example.net")
            },
            t(1, 0, "bad host.example.net"),
        ];
        let got = usable_targets(answers, &mut rng);
        let hosts: Vec<_> = got.iter().map(|t| t.host.as_str()).collect();
        assert_eq!(hosts.first(), Some(&"first.example.net"));
        assert_eq!(hosts.last(), Some(&"late.example.net"));
        assert_eq!(hosts.len(), 4, "{hosts:?}");
        // Within priority 10 the weighted target comes first every time: weight 0 is drawn
        // only once the weighted ones are used up.
        assert_eq!(hosts[1], "heavy.example.net");

        // Weights decide the odds: 3:1 over many draws.
        let mut first_heavy = 0;
        for seed in 0..2000 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let got = usable_targets(vec![t(1, 1, "light.x"), t(1, 3, "heavy.x")], &mut rng);
            if got[0].host == "heavy.x" {
                first_heavy += 1;
            }
        }
        assert!((1350..1650).contains(&first_heavy), "{first_heavy} of 2000");

        let many: Vec<_> = (0..1000)
            .map(|i| t(1, 1, &format!("b{i}.example.net")))
            .collect();
        assert_eq!(usable_targets(many, &mut rng).len(), MAX_SRV_TARGETS);
    }

    /// A plan looking up `domain` on the test's DNS server.
    fn srv_plan(dns: &test_support::dns::DnsServer, extra: &str) -> BrokerPlan {
        BrokerPlan::from_parts(
            &cfg(&format!("plugin.choria.srv_domain = example.net\n{extra}")),
            None,
            Some(dns.addr()),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn srv_records_from_a_real_dns_server_are_used_in_priority_order() {
        use test_support::dns::{DnsServer, SrvRecord};
        let name = "_mcollective-server._tcp.example.net";
        let Some(dns) = DnsServer::start_or_skip(
            "srv_records_from_a_real_dns_server_are_used_in_priority_order",
            &[
                SrvRecord::new(name, "b-late.example.net", 4223).prio(20, 0),
                SrvRecord::new(name, "b-first.example.net", 4222).prio(5, 0),
                SrvRecord::new(name, "b-mid.example.net", 4224).prio(10, 5),
                // The second name is not asked once the first one answers.
                SrvRecord::new(
                    "_x-puppet-mcollective._tcp.example.net",
                    "other.example.net",
                    4222,
                ),
            ],
        ) else {
            return;
        };
        let found = srv_plan(&dns, "").resolve().await;
        assert_eq!(found.source, BrokerSource::Srv(name.into()));
        assert_eq!(
            found.urls,
            [
                "nats://b-first.example.net:4222",
                "nats://b-mid.example.net:4224",
                "nats://b-late.example.net:4223"
            ]
        );
        // Configured hosts win over any record; SRV off means no lookup at all.
        let found = srv_plan(
            &dns,
            "plugin.choria.middleware_hosts = cfg.example.net:4222",
        )
        .resolve()
        .await;
        assert_eq!(found.source, BrokerSource::Configured);
        assert_eq!(found.urls, ["nats://cfg.example.net:4222"]);
        let found = srv_plan(&dns, "plugin.choria.use_srv = false")
            .resolve()
            .await;
        assert_eq!(found.source, BrokerSource::Fallback);
        assert_eq!(found.urls, [FALLBACK_BROKER]);
    }

    #[tokio::test]
    async fn the_puppet_name_is_asked_second_and_nothing_found_falls_back_to_puppet() {
        use test_support::dns::{DnsServer, SrvRecord};
        let name = "_x-puppet-mcollective._tcp.example.net";
        let Some(dns) = DnsServer::start_or_skip(
            "the_puppet_name_is_asked_second_and_nothing_found_falls_back_to_puppet",
            &[
                SrvRecord::new(name, "puppet-broker.example.net", 4333),
                // Records under another domain are not ours.
                SrvRecord::new(
                    "_mcollective-server._tcp.example.org",
                    "wrong.example.org",
                    4222,
                ),
                // "." is "no service here" and is never used.
                SrvRecord::new("_mcollective-server._tcp.none.example.net", ".", 4222),
            ],
        ) else {
            return;
        };
        let found = srv_plan(&dns, "").resolve().await;
        assert_eq!(found.source, BrokerSource::Srv(name.into()));
        assert_eq!(found.urls, ["nats://puppet-broker.example.net:4333"]);

        for domain in ["example.com", "none.example.net"] {
            let plan = BrokerPlan::from_parts(
                &cfg(&format!("plugin.choria.srv_domain = {domain}")),
                None,
                Some(dns.addr()),
            )
            .unwrap();
            let started = std::time::Instant::now();
            let found = plan.resolve().await;
            assert_eq!(found.source, BrokerSource::Fallback, "{domain}");
            assert_eq!(found.urls, [FALLBACK_BROKER]);
            assert!(
                started.elapsed() < SRV_LOOKUP_DEADLINE,
                "{domain}: {:?}",
                started.elapsed()
            );
        }
    }

    #[tokio::test]
    async fn a_dns_server_that_does_not_answer_falls_back_within_the_deadline() {
        // A UDP socket that reads nothing: every query times out.
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let plan = BrokerPlan::from_parts(
            &cfg("plugin.choria.srv_domain = example.net"),
            None,
            Some(addr),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let found = plan.resolve().await;
        assert_eq!(found.source, BrokerSource::Fallback);
        assert!(
            started.elapsed() <= SRV_LOOKUP_DEADLINE + Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}
