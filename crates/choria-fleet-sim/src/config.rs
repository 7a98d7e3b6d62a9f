//! What a simulated fleet is made of: its size and names, the protocol it speaks, what it
//! counts as provisioned, and which nodes misbehave (faults chosen deterministically per node).

use std::time::Duration;

use choria_rpc_client::protocol::ProtocolVersion;

/// What the fleet expects to receive before it counts a node as provisioned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Any configuration that leaves provisioning mode.
    Plain,
    /// A certificate, CA and SSL directory whose certificate matches the node's key.
    Pki,
    /// A server JWT for this identity carrying the key made by `gen25519`.
    Ed25519,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "plain" => Ok(Mode::Plain),
            "pki" => Ok(Mode::Pki),
            "ed25519" => Ok(Mode::Ed25519),
            _ => Err(format!(
                "unknown mode {s:?}, expected plain, pki or ed25519"
            )),
        }
    }
}

/// A kind of misbehaviour, each selecting its nodes independently.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// Every reply is delayed.
    Slow,
    /// No RPC reply at all (discovery is still answered, so the node is found).
    Drop,
    /// The first reply to each `choria_provision` action is dropped; retries work.
    DropOnce,
    /// `gen25519` signs something other than the nonce.
    BadNonce,
    /// RPC replies name another sender.
    WrongIdentity,
    /// `gencsr` produces a CSR for another common name.
    BadCsr,
    /// A given `choria_provision` action aborts.
    FailAction,
    /// `gencsr` produces a CSR whose signature does not verify.
    BadCsrSignature,
    /// RPC replies carry a body that is not JSON.
    Garbage,
    /// Every RPC reply is sent twice.
    Duplicate,
    /// RPC replies are padded past the client's 1 MiB reply limit.
    Oversize,
    /// `gencsr` adds a DNS subject alternative name under `privileged.choria`, which the
    /// default `cert_deny_list` refuses.
    DeniedSan,
}

impl FaultKind {
    fn salt(self) -> &'static str {
        match self {
            FaultKind::Slow => "slow",
            FaultKind::Drop => "drop",
            FaultKind::DropOnce => "drop-once",
            FaultKind::BadNonce => "bad-nonce",
            FaultKind::WrongIdentity => "wrong-identity",
            FaultKind::BadCsr => "bad-csr",
            FaultKind::FailAction => "fail-action",
            FaultKind::BadCsrSignature => "bad-csr-signature",
            FaultKind::Garbage => "garbage",
            FaultKind::Duplicate => "duplicate",
            FaultKind::Oversize => "oversize",
            FaultKind::DeniedSan => "denied-san",
        }
    }
}

/// The bucket (0..1000) of a node for a fault kind: FNV-1a of `<kind>:<identity>`. A node is
/// affected by a fault with share `s` when its bucket is below `s * 1000`, so tests can predict
/// exactly which nodes misbehave.
pub fn fault_bucket(kind: FaultKind, identity: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in kind
        .salt()
        .bytes()
        .chain(std::iter::once(b':'))
        .chain(identity.bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    u32::try_from(h % 1000).unwrap_or(0)
}

/// Whether `identity` is affected by a fault of `kind` given to `share` of the fleet.
pub fn is_affected(kind: FaultKind, identity: &str, share: f64) -> bool {
    let threshold = (share.clamp(0.0, 1.0) * 1000.0).round();
    f64::from(fault_bucket(kind, identity)) < threshold
}

/// Fault switches; every share is a fraction of the fleet between 0 and 1.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Share of nodes whose replies are delayed, and by how much.
    pub slow: Option<(f64, Duration)>,
    /// Share of nodes that never answer RPCs.
    pub drop: f64,
    /// Share of nodes that drop the first reply to each provisioning action.
    pub drop_once: f64,
    /// Share of nodes with a wrong `gen25519` nonce signature.
    pub bad_nonce: f64,
    /// Share of nodes replying under another identity.
    pub wrong_identity: f64,
    /// Share of nodes making CSRs for the wrong common name.
    pub bad_csr: f64,
    /// Actions that abort on a share of nodes.
    pub fail_action: Vec<(String, f64)>,
    /// Share of nodes making CSRs with a broken signature.
    pub bad_csr_signature: f64,
    /// Share of nodes whose RPC replies are not JSON.
    pub garbage: f64,
    /// Share of nodes sending every RPC reply twice.
    pub duplicate: f64,
    /// Share of nodes whose RPC replies exceed 1 MiB.
    pub oversize: f64,
    /// Share of nodes whose CSRs carry a DNS name under `privileged.choria`.
    pub denied_san: f64,
}

impl Faults {
    /// Parse `SHARE:DURATION` for `--fault-slow`.
    pub fn parse_slow(s: &str) -> Result<(f64, Duration), String> {
        let (share, dur) = s
            .split_once(':')
            .ok_or_else(|| format!("expected SHARE:DURATION, got {s:?}"))?;
        Ok((parse_share(share)?, parse_duration(dur)?))
    }

    /// Parse `ACTION:SHARE` for `--fault-fail-action`.
    pub fn parse_fail_action(s: &str) -> Result<(String, f64), String> {
        let (action, share) = s
            .split_once(':')
            .ok_or_else(|| format!("expected ACTION:SHARE, got {s:?}"))?;
        Ok((action.to_string(), parse_share(share)?))
    }

    /// The delay to apply to a node's replies, if it is slow.
    pub fn slow_for(&self, identity: &str) -> Option<Duration> {
        self.slow
            .filter(|(share, _)| is_affected(FaultKind::Slow, identity, *share))
            .map(|(_, d)| d)
    }

    /// The body a node really sends for an RPC reply `body` (discovery replies are never
    /// touched, so misbehaving nodes are still found).
    pub fn reply_body(&self, identity: &str, agent: &str, body: Vec<u8>) -> Vec<u8> {
        if agent == "discovery" {
            return body;
        }
        if is_affected(FaultKind::Garbage, identity, self.garbage) {
            return b"{\"statuscode\": 0, \"data\": {this is not json".to_vec();
        }
        if is_affected(FaultKind::Oversize, identity, self.oversize) {
            // A well-formed reply whose data alone is larger than the limit.
            let padding = "x".repeat(OVERSIZE_PADDING);
            return serde_json::to_vec(&serde_json::json!({
                "statuscode": 0,
                "statusmsg": "OK",
                "data": {"padding": padding},
                "action": "",
            }))
            .unwrap_or(body);
        }
        body
    }

    /// How many copies of each RPC reply a node sends.
    pub fn reply_copies(&self, identity: &str, agent: &str) -> usize {
        if agent != "discovery" && is_affected(FaultKind::Duplicate, identity, self.duplicate) {
            2
        } else {
            1
        }
    }

    /// Whether `action` should abort on this node.
    pub fn fails(&self, identity: &str, action: &str) -> bool {
        self.fail_action
            .iter()
            .any(|(a, share)| a == action && is_affected(FaultKind::FailAction, identity, *share))
    }
}

/// Bytes of padding in an oversized reply: past the provisioner's 1 MiB reply limit once
/// wrapped, yet within a broker `max_payload` of 4 MB.
pub const OVERSIZE_PADDING: usize = 1024 * 1024 + 1024;

/// A share: a number between 0 and 1.
pub fn parse_share(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("invalid share {s:?}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("share {s:?} is not between 0 and 1"))
    }
}

/// A duration such as `250ms`, `2s`, `1m`, `1h`, `5d` or a plain number of seconds
/// ([`choria_rpc_client::duration::parse_seconds_or_unit`]).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    choria_rpc_client::duration::parse_seconds_or_unit(s)
        .map_err(|e| format!("invalid duration {:?}: {e}", s.trim()))
}

/// go-choria's default collective (`build.DefaultCollectives`).
pub const DEFAULT_COLLECTIVE: &str = "mcollective";

/// go-choria's default collective when the configuration uses the `choria` security provider
/// and sets no collectives.
pub const DEFAULT_CHORIA_COLLECTIVE: &str = "choria";

/// The most collectives a node may be in, and the longest collective name accepted from a
/// configuration (names come from the network).
pub const MAX_COLLECTIVES: usize = 16;

/// Longest collective name accepted.
pub const MAX_COLLECTIVE_LEN: usize = 64;

/// Whether `name` can be a collective: a non-empty NATS subject token of word characters
/// and dashes, at most [`MAX_COLLECTIVE_LEN`] bytes, and not `provisioning` (that collective
/// is the provisioning mode's own).
pub fn valid_collective(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_COLLECTIVE_LEN
        && name != "provisioning"
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The collectives of a provisioned server with this configuration, main collective first,
/// as go-choria's `Config.normalize` settles them: `collectives` (comma separated, trimmed),
/// else `mcollective`, or `choria` when `plugin.security.provider` is `choria`;
/// `main_collective`, else the first collective. A main collective outside `collectives` is
/// still subscribed, as go-choria subscribes the main collective's agents.
pub fn collectives_of(settings: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut all: Vec<String> = settings
        .get("collectives")
        .map(|c| {
            c.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    if all.is_empty() {
        let choria = settings
            .get("plugin.security.provider")
            .is_some_and(|p| p.trim() == "choria");
        all.push(if choria {
            DEFAULT_CHORIA_COLLECTIVE.to_string()
        } else {
            DEFAULT_COLLECTIVE.to_string()
        });
    }
    let main = settings
        .get("main_collective")
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .or_else(|| all.first().cloned())
        .unwrap_or_default();
    all.retain(|c| *c != main);
    all.insert(0, main);
    all
}

/// Where the provisioning JWT served by `jwt` comes from.
#[derive(Clone)]
pub enum ProvisioningJwt {
    /// Sign one at start with this key (claims per the tokens library's provisioning token).
    Sign(crate::crypto::JwtSigner),
    /// Serve this token verbatim (e.g. made by `choria jwt prov`).
    Verbatim(String),
}

/// Everything needed to start a fleet.
#[derive(Clone)]
pub struct FleetConfig {
    /// NATS URL(s), comma separated; also the JWT's `chu`.
    pub broker: String,
    /// Number of nodes.
    pub nodes: usize,
    /// What counts as provisioned.
    pub mode: Mode,
    /// Protocol the nodes speak; requests in the other version are dropped.
    pub protocol: ProtocolVersion,
    /// The provisioning token (`cht`).
    pub token: String,
    /// The provisioning JWT source.
    pub provisioning_jwt: ProvisioningJwt,
    /// Verify received server JWTs against this issuer (or direct signer) key.
    pub issuer_public: Option<crate::crypto::JwtVerifier>,
    /// Verify the server JWT of one configure request in this many (the first always; at
    /// least 1): a real server writes its JWT unchecked, so a load test may check a sample.
    pub issuer_check_every: u64,
    /// Identities are `<prefix>-<n>.<domain>` (`<prefix>-<n>` with an empty domain), `n`
    /// counting from 1, zero-padded to the width of `nodes`.
    pub identity_prefix: String,
    /// Domain part of generated identities.
    pub domain: String,
    /// Explicit identities, not generated ones (its length then sets the fleet size).
    pub identities: Option<Vec<String>>,
    /// Reported server version.
    pub version: String,
    /// Whether `release_update` is allowed (`update` claim, `upgradable` in inventory).
    pub upgradable: bool,
    /// Where the simulated servers' configuration file lives (reply texts only).
    pub config_file: String,
    /// How long `restart`, `shutdown` and `release_update` wait before acting.
    pub restart_delay: Duration,
    /// How long a provisioning lock lasts (go-choria: 2 minutes).
    pub lock_window: Duration,
    /// Startup lifecycle events per second when the fleet comes up (0: none).
    pub startup_rate: u32,
    /// Startup events for nodes that do not exist, published before the fleet's own (an
    /// attacker holding a provisioning JWT announcing bogus nodes); see [`bogus_identity`].
    pub bogus_events: usize,
    /// Publish lifecycle events in the Choria format, not as CloudEvents.
    pub legacy_lifecycle: bool,
    /// CSRs made at once (`gencsr` signs on a blocking thread; other requests are answered
    /// as they are read).
    pub workers: usize,
    /// Pre-generated RSA keys for `gencsr` (PEM text); generated at start when `None`.
    pub rsa_keys_pem: Option<String>,
    /// How many RSA keys to generate when none are given.
    pub rsa_pool_size: usize,
    /// Connect with TLS without verifying the broker, as provisioning-mode servers do.
    pub tls: bool,
    /// CA file to verify the broker with instead.
    pub tls_ca: Option<std::path::PathBuf>,
    /// NATS user and password (`chusr`/`chpwd`).
    pub nats_user: Option<(String, String)>,
    /// Send the provisioning JWT as the NATS auth token, as real servers do.
    pub token_auth: bool,
    /// Misbehaviour.
    pub faults: Faults,
    /// A node restarted out of provisioning mode stays connected as a provisioned server on the
    /// main collective of the configuration it was given, answering discovery, `rpcutil`,
    /// `choria_util` and `choria_provision` (notably `reprovision`) there. Off: it goes silent.
    pub stay_online: bool,
    /// How long a provisioned node waits after answering `reprovision` before it is back in
    /// provisioning mode; `None`: go-choria's random 2 to 11 whole seconds.
    pub reprovision_delay: Option<Duration>,
    /// The first this-many nodes start already provisioned (on [`FleetConfig::main_collective`]
    /// with an enrollment of the fleet's mode); needs [`FleetConfig::stay_online`].
    pub preprovisioned: usize,
    /// How long the enrollment of a node started provisioned is valid from the fleet's start.
    pub preprovisioned_expires_in: Duration,
    /// Main collective of nodes started provisioned; `None`: go-choria's default for the
    /// fleet's mode, `choria` in [`Mode::Ed25519`] (the `choria` security provider),
    /// `mcollective` otherwise.
    pub main_collective: Option<String>,
}

impl FleetConfig {
    /// A configuration with go-choria-like defaults for `nodes` nodes on `broker`.
    pub fn new(
        broker: impl Into<String>,
        nodes: usize,
        token: impl Into<String>,
        provisioning_jwt: ProvisioningJwt,
    ) -> Self {
        FleetConfig {
            broker: broker.into(),
            nodes,
            mode: Mode::Plain,
            protocol: ProtocolVersion::V1,
            token: token.into(),
            provisioning_jwt,
            issuer_public: None,
            issuer_check_every: 1,
            identity_prefix: "sim".into(),
            domain: "fleet.example.net".into(),
            identities: None,
            version: "0.30.0".into(),
            upgradable: false,
            config_file: "/etc/choria/server.conf".into(),
            restart_delay: Duration::from_secs(2),
            lock_window: Duration::from_secs(120),
            startup_rate: 2000,
            bogus_events: 0,
            legacy_lifecycle: false,
            workers: 64,
            rsa_keys_pem: None,
            rsa_pool_size: 4,
            tls: false,
            tls_ca: None,
            nats_user: None,
            token_auth: true,
            faults: Faults::default(),
            stay_online: false,
            reprovision_delay: None,
            preprovisioned: 0,
            preprovisioned_expires_in: Duration::from_secs(5 * 86_400),
            main_collective: None,
        }
    }

    /// The main collective of nodes started provisioned.
    pub fn preprovisioned_collective(&self) -> String {
        match &self.main_collective {
            Some(c) => c.clone(),
            None if self.mode == Mode::Ed25519 => DEFAULT_CHORIA_COLLECTIVE.to_string(),
            None => DEFAULT_COLLECTIVE.to_string(),
        }
    }

    /// The identities of the fleet, in order.
    pub fn identity_list(&self) -> Vec<String> {
        if let Some(ids) = &self.identities {
            return ids.clone();
        }
        let width = self.nodes.max(1).to_string().len();
        let domain = if self.domain.is_empty() {
            String::new()
        } else {
            format!(".{}", self.domain)
        };
        (1..=self.nodes)
            .map(|i| format!("{}-{i:0width$}{domain}", self.identity_prefix))
            .collect()
    }
}

/// The identity of bogus startup event `n`: nine in ten look like real node names
/// (`bogus-<n>.<domain>`) and never answer; the tenth is one of the hostile forms a node
/// identity must never take (a NATS wildcard, a name smuggling certificate names, a newline
/// forging a log line, a wildcard name, 5,000 bytes, an empty label, a shell metacharacter).
pub fn bogus_identity(n: usize, domain: &str) -> String {
    if n % 10 != 9 {
        return format!("bogus-{n}.{domain}");
    }
    match (n / 10) % 8 {
        0 => ">".to_string(),
        1 => "*".to_string(),
        2 => format!("evil-{n}.{domain},DNS:admin.privileged.mcollective,DNS:x"),
        3 => format!("evil-{n}.{domain}\nERROR forged log line"),
        4 => format!("*.{domain}"),
        5 => format!("{}.{domain}", "a".repeat(5000)),
        6 => format!("evil-{n}..{domain}"),
        _ => format!("evil-{n}.{domain};reboot"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn fault_selection_is_stable_and_close_to_the_share() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("n{i}")).collect();
        let hit = ids
            .iter()
            .filter(|i| is_affected(FaultKind::Drop, i, 0.1))
            .count();
        assert!((800..1200).contains(&hit), "{hit}");
        assert_eq!(
            fault_bucket(FaultKind::Drop, "n1"),
            fault_bucket(FaultKind::Drop, "n1")
        );
        assert!(!ids.iter().any(|i| is_affected(FaultKind::Drop, i, 0.0)));
        assert!(ids.iter().all(|i| is_affected(FaultKind::Drop, i, 1.0)));
    }

    #[test]
    fn reply_faults_change_rpc_replies_only() {
        let f = Faults {
            garbage: 1.0,
            ..Faults::default()
        };
        let body = br#"{"statuscode":0}"#.to_vec();
        assert!(serde_json::from_slice::<serde_json::Value>(&f.reply_body(
            "n1",
            "rpcutil",
            body.clone()
        ))
        .is_err());
        assert_eq!(f.reply_body("n1", "discovery", body.clone()), body);
        let f = Faults {
            oversize: 1.0,
            duplicate: 1.0,
            ..Faults::default()
        };
        let big = f.reply_body("n1", "choria_provision", body.clone());
        assert!(big.len() > 1024 * 1024);
        assert!(serde_json::from_slice::<serde_json::Value>(&big).is_ok());
        assert_eq!(f.reply_copies("n1", "choria_provision"), 2);
        assert_eq!(f.reply_copies("n1", "discovery"), 1);
        assert_eq!(Faults::default().reply_copies("n1", "rpcutil"), 1);
        assert_eq!(
            Faults::default().reply_body("n1", "rpcutil", body.clone()),
            body
        );
    }

    #[test]
    fn durations_and_shares_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert!(parse_duration("x").is_err());
        assert!(parse_share("1.5").is_err());
        assert_eq!(
            Faults::parse_fail_action("configure:0.5").unwrap(),
            ("configure".to_string(), 0.5)
        );
    }

    #[test]
    fn collectives_follow_go_choria_defaults() {
        use std::collections::BTreeMap;
        let m = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(collectives_of(&m(&[])), vec!["mcollective"]);
        assert_eq!(
            collectives_of(&m(&[("plugin.security.provider", "choria")])),
            vec!["choria"]
        );
        assert_eq!(
            collectives_of(&m(&[("collectives", "a, b ,c")])),
            vec!["a", "b", "c"]
        );
        assert_eq!(
            collectives_of(&m(&[("collectives", "a,b"), ("main_collective", "b")])),
            vec!["b", "a"]
        );
        assert_eq!(
            collectives_of(&m(&[("main_collective", "x")])),
            vec!["x", "mcollective"]
        );
        assert!(valid_collective("acme-1_x"));
        for bad in ["", "a.b", "*", ">", "a b", "provisioning"] {
            assert!(!valid_collective(bad), "{bad}");
        }
        assert!(!valid_collective(&"a".repeat(65)));
        assert_eq!(
            parse_duration("5d").unwrap(),
            Duration::from_secs(5 * 86_400)
        );
    }

    #[test]
    fn generated_identities_are_padded_to_the_fleet_size() {
        let mut c = FleetConfig::new("nats://x", 12, "t", ProvisioningJwt::Verbatim("j".into()));
        c.identity_prefix = "n".into();
        c.domain = "d".into();
        let ids = c.identity_list();
        assert_eq!(ids[0], "n-01.d");
        assert_eq!(ids[11], "n-12.d");
        c.domain = String::new();
        assert_eq!(c.identity_list()[2], "n-03");
    }
}
