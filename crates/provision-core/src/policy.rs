//! The security checks of provisioning: the node's provisioning JWT, its nonce signature, its
//! CSR, the server JWT the provisioner issues, and the encryption of a private key for the node.

use std::time::Duration;

use choria_crypto::csr::{self, CsrError};
use helper_protocol::{ProvisioningClaims, ServerClaims, StandardClaims};
use regex::Regex;

use crate::identity::{escaped, IdentityError, IdentityRule};
use crate::jwt::{self, JwtError, SigningKey, VerifyingKey};

pub use choria_crypto::csr::CsrNames;

/// The purpose claim of provisioning tokens.
pub const PROVISIONING_PURPOSE: &str = "choria_provisioning";
/// The purpose claim of server tokens.
pub const SERVER_PURPOSE: &str = "choria_server";
/// The issuer of server tokens signed without a chain issuer.
pub const SERVER_ISSUER: &str = "Choria Provisioner";

/// A failed check; the message says what was wrong without naming the node (the caller does).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The node sent no JWT.
    #[error("no JWT received")]
    NoJwt,
    /// `jwt_verify_cert` is not configured.
    #[error("no JWT verification certificate configured, cannot validate JWT")]
    NoVerifyCert,
    /// The token failed verification.
    #[error("could not parse provisioner token: {0}")]
    Jwt(#[from] JwtError),
    /// The token is not a provisioning token.
    #[error("not a provisioning token")]
    NotProvisioning,
    /// The token carries a trust chain signature whose issuer expired or is not a chain issuer.
    #[error("provisioning token issuer has expired")]
    IssuerExpired,
    /// The gen25519 reply was incomplete or wrong.
    #[error("{0}")]
    Nonce(&'static str),
    /// No CSR was received.
    #[error("no CSR received")]
    NoCsr,
    /// The CSR could not be parsed.
    #[error("could not parse CSR: {0}")]
    CsrParse(String),
    /// The CSR's self-signature does not verify.
    #[error("CSR signature is not valid: {0}")]
    CsrSignature(String),
    /// The CSR's common name is not the identity.
    #[error("common name \"{}\" does not match identity {}", escaped(.cn), escaped(.identity))]
    CommonName {
        /// The CSR's common name.
        cn: String,
        /// The node identity.
        identity: String,
    },
    /// The CSR has more than one common name.
    #[error("the CSR has {0} common names, expected one")]
    CommonNames(usize),
    /// A CSR name is not a valid identity or DNS name.
    #[error("name \"{}\" is not valid: {why}", escaped(.name))]
    InvalidName {
        /// The name.
        name: String,
        /// Why.
        why: IdentityError,
    },
    /// A DNS subject alternative name other than the identity that `csr_extra_dns_names` does
    /// not allow.
    #[error("subject alternative name DNS:{} is not the identity {} and csr_extra_dns_names does not allow it", escaped(.name), escaped(.identity))]
    ExtraDnsName {
        /// The name.
        name: String,
        /// The node identity.
        identity: String,
    },
    /// A subject alternative name that is not a DNS name (IP, URI, email, other).
    #[error("subject alternative name {kind}:{} is not allowed, only DNS names are", escaped(.value))]
    SanKind {
        /// The kind (IP, URI, email, ...).
        kind: &'static str,
        /// Its value as text.
        value: String,
    },
    /// A CSR name matches `cert_deny_list`.
    #[error("{} matches denied certificate pattern {pattern}", escaped(.name))]
    Denied {
        /// The name.
        name: String,
        /// The pattern it matched.
        pattern: String,
    },
    /// The server JWT could not be built.
    #[error("{0}")]
    ServerJwt(String),
    /// A file named in the configuration could not be read.
    #[error("could not read {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The private key from the helper could not be encrypted or decrypted.
    #[error("{0}")]
    Key(String),
}

impl From<choria_crypto::keyenc::KeyEncError> for PolicyError {
    fn from(e: choria_crypto::keyenc::KeyEncError) -> Self {
        PolicyError::Key(e.to_string())
    }
}

/// The compiled `cert_deny_list`.
#[derive(Debug, Clone, Default)]
pub struct DenyList {
    patterns: Vec<(String, Regex)>,
}

impl DenyList {
    /// Compiles `patterns`; an entry written `/re/` is the regular expression `re` (as the Go
    /// matcher, which strips every leading and trailing slash of such an entry). Returns the
    /// first bad pattern and the compiler's message on failure.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, (String, String)> {
        let mut out = Vec::with_capacity(patterns.len());
        for p in patterns {
            let p = p.as_ref();
            let body = if p.len() > 2 && p.starts_with('/') && p.ends_with('/') {
                p.trim_matches('/')
            } else {
                p
            };
            let re = Regex::new(body)
                .map_err(|e| (p.to_string(), crate::identity::regex_message(&e)))?;
            out.push((p.to_string(), re));
        }
        Ok(DenyList { patterns: out })
    }

    /// The built-in list, [`crate::config::DEFAULT_CERT_DENY_LIST`].
    pub fn default_list() -> Self {
        DenyList::new(&crate::config::DEFAULT_CERT_DENY_LIST).unwrap_or_default()
    }

    /// The patterns as written.
    pub fn patterns(&self) -> impl Iterator<Item = &str> {
        self.patterns.iter().map(|(p, _)| p.as_str())
    }

    /// The first pattern (as written) that matches anywhere in `name`.
    pub fn matches(&self, name: &str) -> Option<&str> {
        self.patterns
            .iter()
            .find(|(_, re)| re.is_match(name))
            .map(|(p, _)| p.as_str())
    }
}

/// Verifies a node's `provisioning.jwt` as the Go provisioner does.
///
/// `verify_cert` is `jwt_verify_cert`: when `verify_cert_file` holds its content (the caller read
/// the file because a file by that name exists) it is RSA PEM or hex ed25519; otherwise
/// `verify_cert` itself is a hex ed25519 public key. `now` is Unix seconds.
pub fn validate_provisioning_jwt(
    raw: &str,
    verify_cert: &str,
    verify_cert_file: Option<&[u8]>,
    now: i64,
) -> Result<ProvisioningClaims, PolicyError> {
    if raw.is_empty() {
        return Err(PolicyError::NoJwt);
    }
    let key = verify_key(verify_cert, verify_cert_file)?;
    validate_provisioning_jwt_with_key(raw, &key, now)
}

/// The key `jwt_verify_cert` names: the content of the file by that name when there is one
/// (`verify_cert_file`), else the setting itself as a hex ed25519 public key.
pub fn verify_key(
    verify_cert: &str,
    verify_cert_file: Option<&[u8]>,
) -> Result<VerifyingKey, PolicyError> {
    if verify_cert.is_empty() {
        return Err(PolicyError::NoVerifyCert);
    }
    Ok(match verify_cert_file {
        Some(data) => VerifyingKey::from_public_data(data)?,
        None => VerifyingKey::from_ed25519_hex(verify_cert.as_bytes())?,
    })
}

/// [`validate_provisioning_jwt`] with a key already loaded.
pub fn validate_provisioning_jwt_with_key(
    raw: &str,
    key: &VerifyingKey,
    now: i64,
) -> Result<ProvisioningClaims, PolicyError> {
    if raw.is_empty() {
        return Err(PolicyError::NoJwt);
    }
    // Many nodes present the same provisioning JWT (it is baked into a site's images): its
    // signature is checked once per verification key, its times on every call.
    static VERIFIED: std::sync::OnceLock<jwt::VerifiedTokens> = std::sync::OnceLock::new();
    let memo = VERIFIED.get_or_init(jwt::VerifiedTokens::new);
    let mut claims: ProvisioningClaims = jwt::verify_remembered(raw, key, now, memo)?;
    if claims.standard.purpose != PROVISIONING_PURPOSE
        && claims.standard.subject != PROVISIONING_PURPOSE
    {
        return Err(PolicyError::NotProvisioning);
    }
    // A token with a trust chain must come from a chain issuer whose own expiry has not passed.
    if !claims.standard.trust_chain_signature.is_empty() {
        let chain = claims.standard.issuer.starts_with("C-");
        match claims.standard.issuer_expires_at {
            Some(issexp) if chain && now < issexp => {}
            _ => return Err(PolicyError::IssuerExpired),
        }
    }
    if claims.organization_unit.is_empty() {
        claims.organization_unit = "choria".to_string();
    }
    Ok(claims)
}

/// Checks a `gen25519` reply: the signature over the nonce's ASCII text must verify with the
/// returned key ([`choria_crypto::nonce::verify_nonce_signature`]). Unlike the Go code a key of
/// the wrong length is an error, not a crash.
pub fn verify_nonce_signature(
    nonce: &str,
    public_key_hex: &str,
    signature_hex: &str,
) -> Result<(), PolicyError> {
    choria_crypto::nonce::verify_nonce_signature(nonce, public_key_hex, signature_hex)
        .map_err(|e| PolicyError::Nonce(e.message()))
}

/// `csr_extra_dns_names`: a regular expression the whole of a DNS name must match for a CSR to
/// carry it besides the identity.
#[derive(Clone)]
pub struct ExtraDnsNames {
    pattern: String,
    re: Regex,
}

impl std::fmt::Debug for ExtraDnsNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ExtraDnsNames({:?})", self.pattern)
    }
}

impl ExtraDnsNames {
    /// Compiles `pattern`, anchored at both ends; `None` for an empty pattern. Returns the
    /// compiler's message for a pattern that does not compile (or compiles too large).
    pub fn new(pattern: &str) -> Result<Option<Self>, String> {
        if pattern.is_empty() {
            return Ok(None);
        }
        let re = regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
            .size_limit(1 << 20)
            .build()
            .map_err(|e| crate::identity::regex_message(&e))?;
        Ok(Some(ExtraDnsNames {
            pattern: pattern.to_string(),
            re,
        }))
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether the whole of `name` matches.
    pub fn is_match(&self, name: &str) -> bool {
        self.re.is_match(name)
    }
}

/// What a node's CSR is held to: the deny list, the identity rule, and the DNS names allowed
/// besides the identity.
#[derive(Debug, Clone, Copy)]
pub struct CsrPolicy<'a> {
    /// `cert_deny_list`, matched against the common name and every DNS name.
    pub deny: &'a DenyList,
    /// The rule the common name (the identity) is held to.
    pub identity_rule: &'a IdentityRule,
    /// `csr_extra_dns_names`: DNS names allowed besides the identity.
    pub extra_dns: Option<&'a ExtraDnsNames>,
}

impl<'a> CsrPolicy<'a> {
    /// The built-in identity grammar, no extra names, and `deny`.
    pub fn new(deny: &'a DenyList) -> Self {
        static BUILTIN: std::sync::OnceLock<IdentityRule> = std::sync::OnceLock::new();
        CsrPolicy {
            deny,
            identity_rule: BUILTIN.get_or_init(IdentityRule::builtin),
            extra_dns: None,
        }
    }
}

/// Validates a node's CSR: it parses, its self-signature verifies with its own RSA key (so the
/// node holds the key), it has exactly one common name and that is `identity`, valid under the
/// identity rule; every DNS subject alternative name is the identity or allowed by
/// `csr_extra_dns_names` (and a valid DNS name); no other kind of name (IP, URI, email...) is
/// present; and neither the common name nor any DNS name matches the deny list. A CA that copies
/// the CSR's names can therefore only ever certify the node's own identity.
pub fn validate_csr(
    csr_pem: &str,
    identity: &str,
    policy: &CsrPolicy<'_>,
) -> Result<CsrNames, PolicyError> {
    if csr_pem.trim().is_empty() {
        return Err(PolicyError::NoCsr);
    }
    let req = csr::from_pem(csr_pem.trim()).map_err(csr_error)?;
    csr::verify_signature(&req).map_err(csr_error)?;
    let names = csr::names(&req).map_err(csr_error)?;
    check_csr_names(&names, identity, policy)?;
    Ok(names)
}

/// The name rules of [`validate_csr`] on names already read from a CSR.
pub fn check_csr_names(
    names: &CsrNames,
    identity: &str,
    policy: &CsrPolicy<'_>,
) -> Result<(), PolicyError> {
    if names.common_names > 1 {
        return Err(PolicyError::CommonNames(names.common_names));
    }
    if names.common_name != identity {
        return Err(PolicyError::CommonName {
            cn: names.common_name.clone(),
            identity: identity.to_string(),
        });
    }
    policy
        .identity_rule
        .check(&names.common_name)
        .map_err(|why| PolicyError::InvalidName {
            name: names.common_name.clone(),
            why,
        })?;
    if let Some((kind, value)) = names.other_names.first() {
        return Err(PolicyError::SanKind {
            kind,
            value: value.clone(),
        });
    }
    static DNS: std::sync::OnceLock<IdentityRule> = std::sync::OnceLock::new();
    let dns_rule = DNS.get_or_init(IdentityRule::builtin);
    for name in &names.dns_names {
        if name.eq_ignore_ascii_case(identity) {
            continue;
        }
        dns_rule
            .check(name)
            .map_err(|why| PolicyError::InvalidName {
                name: name.clone(),
                why,
            })?;
        if !policy.extra_dns.is_some_and(|re| re.is_match(name)) {
            return Err(PolicyError::ExtraDnsName {
                name: name.clone(),
                identity: identity.to_string(),
            });
        }
    }
    for name in std::iter::once(&names.common_name).chain(names.dns_names.iter()) {
        if let Some(pattern) = policy.deny.matches(name) {
            return Err(PolicyError::Denied {
                name: name.clone(),
                pattern: pattern.to_string(),
            });
        }
    }
    Ok(())
}

fn csr_error(e: CsrError) -> PolicyError {
    match e {
        CsrError::Parse(why) => PolicyError::CsrParse(why),
        CsrError::Signature(why) => PolicyError::CsrSignature(why),
    }
}

/// Everything that goes into a server JWT.
#[derive(Debug, Clone, Copy)]
pub struct ServerJwtRequest<'a> {
    /// The node identity.
    pub identity: &'a str,
    /// The node's ed25519 public key, hex, from `gen25519`.
    pub public_key_hex: &'a str,
    /// The rule the identity is held to: no token is signed for an invalid identity.
    pub identity_rule: &'a IdentityRule,
    /// The helper's `configuration`, for `collectives` and `plugin.security.provider`.
    pub configuration: Option<&'a std::collections::BTreeMap<String, String>>,
    /// The helper's `server_claims`.
    pub server_claims: Option<&'a ServerClaims>,
    /// The signing key as text (the content of `jwt_signing_key`: a hex ed25519 seed or an RSA
    /// PEM), empty when none is configured. The caller reads it (see
    /// [`crate::keys::KeyMaterial`]); this function does no I/O.
    pub signing_key: &'a str,
    /// The content of `jwt_signing_token`, empty when none is configured.
    pub signing_token: &'a str,
    /// `server_jwt_validity`.
    pub default_validity: Duration,
    /// The random part of the token's id (`jti`, a KSUID of `now`), from the caller's entropy.
    pub jti_payload: [u8; 16],
    /// Unix seconds.
    pub now: i64,
}

/// A signed server JWT and the claims in it.
#[derive(Debug, Clone)]
pub struct IssuedServerJwt {
    /// The compact token.
    pub token: String,
    /// Its claims.
    pub claims: ServerClaims,
}

/// Builds and signs a server JWT with the Go provisioner's claims and defaults, adding the
/// chain-issuer data of `signing_token` when one is configured.
pub fn issue_server_jwt(req: &ServerJwtRequest<'_>) -> Result<IssuedServerJwt, PolicyError> {
    req.identity_rule
        .check(req.identity)
        .map_err(|why| PolicyError::InvalidName {
            name: req.identity.to_string(),
            why,
        })?;
    if req.public_key_hex.is_empty() {
        return Err(PolicyError::ServerJwt("no ed25519 public key set".into()));
    }
    if req.signing_key.is_empty() {
        return Err(PolicyError::ServerJwt(
            "no jwt signing key configured using jwt_signing_key".into(),
        ));
    }
    if req.default_validity.is_zero() {
        return Err(PolicyError::ServerJwt(
            "no default validity configured".into(),
        ));
    }
    let pk = hex::decode(req.public_key_hex)
        .map_err(|e| PolicyError::ServerJwt(format!("invalid ed25519 public key: {e}")))?;
    let default_secs = i64::try_from(req.default_validity.as_secs()).unwrap_or(i64::MAX / 2);

    let mut org = "choria".to_string();
    let mut validity = default_secs;
    let mut collectives = vec!["mcollective".to_string()];
    let mut pub_subjects = Vec::new();
    let mut permissions = None;
    if let Some(cfg) = req.configuration {
        if cfg.get("plugin.security.provider").map(String::as_str) == Some("choria") {
            collectives = vec!["choria".to_string()];
        }
        if let Some(cc) = cfg.get("collectives") {
            // Split without trimming, as the Go provisioner does.
            collectives = cc.split(',').map(str::to_string).collect();
        }
    }
    if let Some(sc) = req.server_claims {
        if !sc.organization_unit.is_empty() {
            org = sc.organization_unit.clone();
        }
        if let Some(exp) = sc.standard.expires_at.filter(|e| *e != 0) {
            // An absolute time, not a duration.
            validity = exp - req.now;
        }
        if !sc.collectives.is_empty() {
            collectives = sc.collectives.clone();
        }
        if !sc.additional_publish_subjects.is_empty() {
            pub_subjects = sc.additional_publish_subjects.clone();
        }
        permissions = sc.permissions.clone();
    }
    if validity <= 3600 {
        validity = default_secs;
    }
    if collectives.is_empty() {
        return Err(PolicyError::ServerJwt(
            "at least one collective is required".into(),
        ));
    }

    let mut claims = ServerClaims {
        identity: req.identity.to_string(),
        collectives,
        permissions,
        organization_unit: org,
        additional_publish_subjects: pub_subjects,
        standard: StandardClaims {
            purpose: SERVER_PURPOSE.to_string(),
            public_key: hex::encode(pk),
            issuer: SERVER_ISSUER.to_string(),
            expires_at: Some(req.now.saturating_add(validity)),
            not_before: Some(req.now),
            issued_at: Some(req.now),
            id: choria_crypto::ksuid::ksuid_with(req.now, &req.jti_payload),
            ..Default::default()
        },
    };

    // Read for every node; parsed again only when it changes.
    let key = SigningKey::from_key_data_remembered(req.signing_key.as_bytes())?;
    if !req.signing_token.is_empty() {
        let signer: StandardClaims = jwt::decode_unverified(req.signing_token)?;
        if signer.trust_chain_signature.is_empty() {
            return Err(PolicyError::ServerJwt(
                "no Trust Chain Signature claim in JWT Signing Token".into(),
            ));
        }
        if !matches!(key, SigningKey::Ed25519(_)) {
            return Err(PolicyError::ServerJwt(
                "jwt_signing_key must be an ed25519 seed when jwt_signing_token is set".into(),
            ));
        }
        add_chain_issuer_data(&mut claims.standard, &signer, &key)?;
    }
    let token = jwt::sign(&claims, &key)?;
    Ok(IssuedServerJwt { token, claims })
}

/// Links `claims` to the chain issuer `signer` (tokens `AddChainIssuerData`); `key` is the chain
/// issuer's ed25519 key.
fn add_chain_issuer_data(
    claims: &mut StandardClaims,
    signer: &StandardClaims,
    key: &SigningKey,
) -> Result<(), PolicyError> {
    if signer.id.is_empty() {
        return Err(PolicyError::ServerJwt("signing token: id not set".into()));
    }
    if signer.public_key.is_empty() {
        return Err(PolicyError::ServerJwt(
            "signing token: public key not set".into(),
        ));
    }
    let Some(signer_exp) = signer.expires_at else {
        return Err(PolicyError::ServerJwt(
            "signing token: issuer has no expiry".into(),
        ));
    };
    claims.issuer = format!("C-{}.{}", signer.id, signer.public_key);
    claims.issuer_expires_at = Some(signer_exp);
    if claims.expires_at.is_none_or(|e| signer_exp < e) {
        claims.expires_at = Some(signer_exp);
    }
    let data = format!("{}.{}", claims.id, signer.trust_chain_signature);
    let sig = key.sign_bytes(data.as_bytes())?;
    claims.trust_chain_signature = format!("{}.{}", signer.trust_chain_signature, hex::encode(sig));
    Ok(())
}
