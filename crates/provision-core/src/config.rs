//! What the cycle of one node and the work queue read: the provisioning token, the features, the
//! rules identities and CSRs are held to, the server JWT validity, the upgrade settings and the
//! discovery interval. Nothing here is read from a file: the daemon builds a [`ProvisionConfig`]
//! from the provisioner YAML, an embedder with [`ProvisionConfig::builder`].

use std::time::Duration;

use crate::identity::IdentityRule;
use crate::policy::{CsrPolicy, DenyList, ExtraDnsNames};

/// The certificate names refused unless `cert_deny_list` says otherwise.
pub const DEFAULT_CERT_DENY_LIST: [&str; 4] = [
    "\\.privileged.mcollective$",
    "\\.privileged.choria$",
    "\\.mcollective$",
    "\\.choria$",
];

/// The default validity of issued server JWTs (one year of 365 days).
pub const DEFAULT_SERVER_JWT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The default discovery interval (the Go provisioner's `1m`), which also bounds how long a node
/// may wait in the queue (two intervals).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

/// Optional features (the `features` map of the provisioner YAML).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Features {
    /// Fetch the node's CSR and validate it.
    pub pki: bool,
    /// Fetch and verify the node's provisioning JWT (forced on by `ed25519`).
    pub jwt: bool,
    /// Fetch an ed25519 key from the node and issue it a server JWT.
    pub ed25519: bool,
    /// Upgrade nodes when the helper asks for a version.
    pub upgrades: bool,
}

impl Features {
    /// No feature on: the node's inventory is fetched, the helper asked, the node configured.
    pub const NONE: Features = Features {
        pki: false,
        jwt: false,
        ed25519: false,
        upgrades: false,
    };

    /// With the CSR fetched and checked.
    pub const fn with_pki(mut self, on: bool) -> Self {
        self.pki = on;
        self
    }

    /// With the provisioning JWT fetched and verified.
    pub const fn with_jwt(mut self, on: bool) -> Self {
        self.jwt = on;
        self
    }

    /// With an ed25519 key fetched and a server JWT issued (implies `jwt`).
    pub const fn with_ed25519(mut self, on: bool) -> Self {
        self.ed25519 = on;
        self
    }

    /// With upgrades when the helper names a version.
    pub const fn with_upgrades(mut self, on: bool) -> Self {
        self.upgrades = on;
        self
    }
}

/// A combination of settings the cycle cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProvisionConfigError {
    /// Both `pki` and `ed25519` are on: a node gets a certificate or a server JWT, not both.
    #[error("can only enable one of the pki or ed25519 features")]
    PkiAndEd25519,
    /// A zero interval would make every queued node stale at once.
    #[error("the discovery interval must be more than zero")]
    ZeroInterval,
}

/// The settings of the cycle. Build one with [`ProvisionConfig::builder`]; [`Default`] is the
/// Go provisioner's defaults (no token, no feature, the built-in identity grammar, the default
/// deny list). Its `Debug` shows the token as `<redacted>`.
#[derive(Clone)]
pub struct ProvisionConfig {
    token: String,
    features: Features,
    interval: Duration,
    identity_rule: IdentityRule,
    deny_list: DenyList,
    extra_dns: Option<ExtraDnsNames>,
    server_jwt_validity: Duration,
    upgrades_repository: String,
    upgrades_optional: bool,
    dry_run: bool,
}

impl Default for ProvisionConfig {
    fn default() -> Self {
        ProvisionConfig {
            token: String::new(),
            features: Features::NONE,
            interval: DEFAULT_INTERVAL,
            identity_rule: IdentityRule::builtin(),
            deny_list: DenyList::default_list(),
            extra_dns: None,
            server_jwt_validity: DEFAULT_SERVER_JWT_VALIDITY,
            upgrades_repository: String::new(),
            upgrades_optional: false,
            dry_run: false,
        }
    }
}

impl std::fmt::Debug for ProvisionConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvisionConfig")
            .field(
                "token",
                &if self.token.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("features", &self.features)
            .field("interval", &self.interval)
            .field("identity_rule", &self.identity_rule)
            .field("deny_list", &self.deny_list)
            .field("extra_dns", &self.extra_dns)
            .field("server_jwt_validity", &self.server_jwt_validity)
            .field("upgrades_repository", &self.upgrades_repository)
            .field("upgrades_optional", &self.upgrades_optional)
            .field("dry_run", &self.dry_run)
            .finish()
    }
}

impl ProvisionConfig {
    /// A builder starting from [`ProvisionConfig::default`].
    pub fn builder() -> ProvisionConfigBuilder {
        ProvisionConfigBuilder(ProvisionConfig::default())
    }

    /// The provisioning token sent in every `choria_provision` request.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The features on (`jwt` is on whenever `ed25519` is).
    pub fn features(&self) -> Features {
        self.features
    }

    /// The discovery interval: a node waiting in the queue longer than two is dropped.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The rule every node identity is held to.
    pub fn identity_rule(&self) -> &IdentityRule {
        &self.identity_rule
    }

    /// The compiled `cert_deny_list`.
    pub fn deny_list(&self) -> &DenyList {
        &self.deny_list
    }

    /// The DNS names a CSR may carry besides the identity, `None` for none.
    pub fn extra_dns_names(&self) -> Option<&ExtraDnsNames> {
        self.extra_dns.as_ref()
    }

    /// What a node's CSR is held to.
    pub fn csr_policy(&self) -> CsrPolicy<'_> {
        CsrPolicy {
            deny: &self.deny_list,
            identity_rule: &self.identity_rule,
            extra_dns: self.extra_dns.as_ref(),
        }
    }

    /// How long issued server JWTs are valid unless the helper says otherwise.
    pub fn server_jwt_validity(&self) -> Duration {
        self.server_jwt_validity
    }

    /// The `release_update` repository.
    pub fn upgrades_repository(&self) -> &str {
        &self.upgrades_repository
    }

    /// Whether an upgrade failure is logged and provisioning goes on.
    pub fn upgrades_optional(&self) -> bool {
        self.upgrades_optional
    }

    /// `dry_run`: nodes are checked and judged by the policy and the helper (told by
    /// `"dry_run": true` in its input), and nothing is signed, configured or restarted.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }
}

/// Builds a [`ProvisionConfig`]; [`ProvisionConfigBuilder::build`] checks the combination.
#[derive(Debug, Clone)]
#[must_use]
pub struct ProvisionConfigBuilder(ProvisionConfig);

impl ProvisionConfigBuilder {
    /// The provisioning token (empty: none).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.0.token = token.into();
        self
    }

    /// The features; `ed25519` turns `jwt` on.
    pub fn features(mut self, features: Features) -> Self {
        self.0.features = features;
        self
    }

    /// The discovery interval.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.0.interval = interval;
        self
    }

    /// The identity rule ([`IdentityRule::with_pattern`] for a site pattern).
    pub fn identity_rule(mut self, rule: IdentityRule) -> Self {
        self.0.identity_rule = rule;
        self
    }

    /// The certificate names refused ([`DenyList::new`]).
    pub fn deny_list(mut self, deny: DenyList) -> Self {
        self.0.deny_list = deny;
        self
    }

    /// DNS names a CSR may carry besides the identity.
    pub fn extra_dns_names(mut self, names: Option<ExtraDnsNames>) -> Self {
        self.0.extra_dns = names;
        self
    }

    /// How long issued server JWTs are valid unless the helper says otherwise.
    pub fn server_jwt_validity(mut self, validity: Duration) -> Self {
        self.0.server_jwt_validity = validity;
        self
    }

    /// The `release_update` repository, and whether an upgrade failure is only logged.
    pub fn upgrades(mut self, repository: impl Into<String>, optional: bool) -> Self {
        self.0.upgrades_repository = repository.into();
        self.0.upgrades_optional = optional;
        self
    }

    /// Dry run: judge every node, change none ([`ProvisionConfig::dry_run`]).
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.0.dry_run = dry_run;
        self
    }

    /// The configuration, or why the combination cannot work.
    pub fn build(self) -> Result<ProvisionConfig, ProvisionConfigError> {
        let mut c = self.0;
        if c.features.pki && c.features.ed25519 {
            return Err(ProvisionConfigError::PkiAndEd25519);
        }
        if c.interval.is_zero() {
            return Err(ProvisionConfigError::ZeroInterval);
        }
        if c.features.ed25519 {
            c.features.jwt = true;
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_checks_the_combination_and_implies_jwt() {
        let c = ProvisionConfig::builder()
            .token("s3cret")
            .features(Features::NONE.with_ed25519(true))
            .build()
            .expect("valid");
        assert!(c.features().jwt);
        assert_eq!(c.token(), "s3cret");
        assert!(!format!("{c:?}").contains("s3cret"));
        assert_eq!(
            ProvisionConfig::builder()
                .features(Features::NONE.with_pki(true).with_ed25519(true))
                .build()
                .err(),
            Some(ProvisionConfigError::PkiAndEd25519)
        );
        assert_eq!(
            ProvisionConfig::builder()
                .interval(Duration::ZERO)
                .build()
                .err(),
            Some(ProvisionConfigError::ZeroInterval)
        );
    }

    #[test]
    fn defaults_are_the_go_provisioners() {
        let c = ProvisionConfig::default();
        assert_eq!(c.interval(), Duration::from_secs(60));
        assert!(c.deny_list().matches("n1.mcollective").is_some());
        assert_eq!(c.server_jwt_validity(), DEFAULT_SERVER_JWT_VALIDITY);
        assert!(c.extra_dns_names().is_none());
    }
}
