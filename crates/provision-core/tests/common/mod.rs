//! A scripted fake node, a scripted helper and a counting observer for cycle tests. The node is
//! faked because the real network path is tested end to end elsewhere; everything it returns is
//! produced with real keys and signatures.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ed25519_dalek::Signer as _;
use provision_core::helper_protocol::{
    CsrReply, Ed25519Reply, HelperError, HelperInput, HelperReply, ProvisioningClaims,
    StandardClaims,
};
use provision_core::jwt::VerifyingKey;
use provision_core::jwt::{self, SigningKey};
use provision_core::policy::{self, PolicyError};
use provision_core::rpc::*;
use provision_core::{
    Backoff, Clock, Config, KeyMaterial, Observer, PauseState, Provisioner, SystemClock,
};

pub fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

pub fn now() -> i64 {
    SystemClock.now_unix()
}

/// The provisioning JWT signer used by tests: an ed25519 key whose public half is given to the
/// provisioner as hex.
pub fn prov_signer() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[42u8; 32])
}

pub fn prov_signer_hex() -> String {
    hex::encode(prov_signer().verifying_key().to_bytes())
}

pub fn provisioning_jwt(key: &ed25519_dalek::SigningKey, exp: i64, purpose: &str) -> String {
    let claims = ProvisioningClaims {
        token: "s3cret".into(),
        urls: "nats://127.0.0.1:4222".into(),
        prov_default: true,
        standard: StandardClaims {
            purpose: purpose.into(),
            subject: purpose.into(),
            issuer: "Choria Tokens Package".into(),
            expires_at: Some(exp),
            not_before: Some(now() - 10),
            issued_at: Some(now() - 10),
            id: choria_crypto::ksuid::ksuid(now() - 10),
            ..Default::default()
        },
        ..Default::default()
    };
    jwt::sign(&claims, &SigningKey::Ed25519(Box::new(key.clone()))).unwrap()
}

/// Writes a 64-hex ed25519 seed file for server JWT signing.
pub fn seed_file(dir: &std::path::Path, seed: [u8; 32]) -> String {
    let p = dir.join("signer.seed");
    std::fs::write(&p, hex::encode(seed)).unwrap();
    p.to_string_lossy().into_owned()
}

#[derive(Default)]
pub struct NodeState {
    pub calls: Vec<Action>,
    /// Errors returned by an action before it succeeds (front first).
    pub failures: HashMap<&'static str, VecDeque<RpcErrorKind>>,
    pub jwt: String,
    pub ecdh_secret: [u8; 32],
    pub ed_seed: [u8; 32],
    pub bad_nonce: bool,
    /// The nonces `gen25519` was sent, in order.
    pub nonces: Vec<String>,
    pub short_key: bool,
    pub inventory: Inventory,
    pub csr: CsrReply,
    pub configured: Option<ConfigureRequest>,
    pub released: Option<(String, String)>,
    pub restarted: bool,
    pub shut_down: bool,
    /// Pause this state when the named action is called.
    pub pause_on: Option<(Action, PauseState)>,
    /// After release_update the node comes back with this version.
    pub upgrade_to_version: bool,
    /// Identities starting with this never answer anything (bogus announced nodes).
    pub silent_prefix: Option<String>,
}

#[derive(Clone, Default)]
pub struct FakeNode {
    pub state: Arc<Mutex<NodeState>>,
}

impl FakeNode {
    pub fn new() -> Self {
        let n = FakeNode::default();
        {
            let mut s = n.state.lock().unwrap();
            s.jwt = provisioning_jwt(&prov_signer(), now() + 3600, "choria_provisioning");
            s.ecdh_secret = [9u8; 32];
            s.ed_seed = [5u8; 32];
            s.inventory = Inventory {
                json: r#"{"agents":["choria_provision"],"upgradable":true,"version":"0.29.4"}"#
                    .into(),
                version: "0.29.4".into(),
                upgradable: true,
            };
        }
        n
    }

    pub fn fail(&self, action: Action, kind: RpcErrorKind, times: usize) {
        let mut s = self.state.lock().unwrap();
        let q = s.failures.entry(action.label()).or_default();
        for _ in 0..times {
            q.push_back(kind.clone());
        }
    }

    pub fn calls(&self) -> Vec<Action> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn count(&self, a: Action) -> usize {
        self.calls().iter().filter(|c| **c == a).count()
    }

    pub fn configured(&self) -> Option<ConfigureRequest> {
        self.state.lock().unwrap().configured.clone()
    }

    fn enter(&self, id: &str, action: Action) -> Result<(), RpcError> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(action);
        if let Some((a, p)) = &s.pause_on {
            if *a == action {
                p.pause();
            }
        }
        if let Some(kind) = s
            .failures
            .get_mut(action.label())
            .and_then(|q| q.pop_front())
        {
            return Err(RpcError::new(id, action, kind));
        }
        Ok(())
    }
}

impl NodeRpc for FakeNode {
    async fn inventory(&self, id: &str) -> Result<Inventory, RpcError> {
        self.enter(id, Action::Inventory)?;
        let silent = {
            let s = self.state.lock().unwrap();
            s.silent_prefix
                .as_deref()
                .is_some_and(|p| id.starts_with(p))
        };
        if silent {
            std::future::pending::<()>().await;
        }
        Ok(self.state.lock().unwrap().inventory.clone())
    }

    async fn jwt(&self, id: &str, token: &str) -> Result<JwtReply, RpcError> {
        assert_eq!(token, "s3cret");
        self.enter(id, Action::Jwt)?;
        let silent = {
            let s = self.state.lock().unwrap();
            s.silent_prefix
                .as_deref()
                .is_some_and(|p| id.starts_with(p))
        };
        if silent {
            std::future::pending::<()>().await;
        }
        let s = self.state.lock().unwrap();
        Ok(JwtReply {
            jwt: s.jwt.clone(),
            ecdh_public: hex::encode(choria_crypto::x25519::public_key(&s.ecdh_secret)),
        })
    }

    async fn gen25519(
        &self,
        id: &str,
        _token: &str,
        nonce: &str,
    ) -> Result<Ed25519Reply, RpcError> {
        self.enter(id, Action::Gen25519)?;
        let mut s = self.state.lock().unwrap();
        s.nonces.push(nonce.to_string());
        let key = ed25519_dalek::SigningKey::from_bytes(&s.ed_seed);
        let msg = if s.bad_nonce {
            "other".to_string()
        } else {
            nonce.to_string()
        };
        let mut pk = hex::encode(key.verifying_key().to_bytes());
        if s.short_key {
            pk.truncate(62);
        }
        Ok(Ed25519Reply {
            public_key: pk,
            directory: "/etc/choria".into(),
            signature: hex::encode(key.sign(msg.as_bytes()).to_bytes()),
        })
    }

    async fn gencsr(&self, id: &str, _token: &str, cn: &str) -> Result<CsrReply, RpcError> {
        assert_eq!(cn, id);
        self.enter(id, Action::Gencsr)?;
        Ok(self.state.lock().unwrap().csr.clone())
    }

    async fn configure(
        &self,
        id: &str,
        request: &ConfigureRequest,
    ) -> Result<ActionMessage, RpcError> {
        self.enter(id, Action::Configure)?;
        self.state.lock().unwrap().configured = Some(request.clone());
        Ok(ActionMessage {
            message: "Wrote 3 lines".into(),
        })
    }

    async fn release_update(
        &self,
        id: &str,
        _t: &str,
        repo: &str,
        version: &str,
    ) -> Result<ActionMessage, RpcError> {
        self.enter(id, Action::ReleaseUpdate)?;
        let mut s = self.state.lock().unwrap();
        s.released = Some((repo.to_string(), version.to_string()));
        if s.upgrade_to_version {
            s.inventory.version = version.to_string();
        }
        Ok(ActionMessage {
            message: "Restarting Choria Server after 2s".into(),
        })
    }

    async fn restart(&self, id: &str, _t: &str, splay: u32) -> Result<ActionMessage, RpcError> {
        assert_eq!(splay, 1);
        self.enter(id, Action::Restart)?;
        self.state.lock().unwrap().restarted = true;
        Ok(ActionMessage {
            message: "Restarting Choria Server after 2s".into(),
        })
    }

    async fn shutdown(&self, id: &str, _t: &str) -> Result<ActionMessage, RpcError> {
        self.enter(id, Action::Shutdown)?;
        self.state.lock().unwrap().shut_down = true;
        Ok(ActionMessage {
            message: "Shutting Choria Server down after 4s".into(),
        })
    }
}

/// A helper whose reply the test sets.
#[derive(Clone, Default)]
pub struct FakeHelper {
    pub reply: Arc<Mutex<Option<HelperReply>>>,
    pub inputs: Arc<Mutex<Vec<HelperInput>>>,
}

impl FakeHelper {
    pub fn replying(reply: HelperReply) -> Self {
        let h = FakeHelper::default();
        *h.reply.lock().unwrap() = Some(reply);
        h
    }

    pub fn failing() -> Self {
        FakeHelper::default()
    }

    pub fn runs(&self) -> usize {
        self.inputs.lock().unwrap().len()
    }
}

impl Helper for FakeHelper {
    async fn run(&self, input: &HelperInput) -> Result<HelperReply, HelperError> {
        self.inputs.lock().unwrap().push(input.clone());
        self.reply
            .lock()
            .unwrap()
            .clone()
            .ok_or(HelperError::EmptyOutput {
                helper: "fake".into(),
            })
    }
}

pub fn good_reply() -> HelperReply {
    HelperReply {
        configuration: Some(BTreeMap::from([
            ("identity".to_string(), "n1.example.net".to_string()),
            (
                "plugin.choria.server.provision".to_string(),
                "false".to_string(),
            ),
        ])),
        ..Default::default()
    }
}

#[derive(Default)]
pub struct Counts {
    pub rpc_errors: Mutex<Vec<&'static str>>,
    pub rpc_times: AtomicUsize,
    pub helper_errors: AtomicUsize,
    pub helper_shutdowns: AtomicUsize,
    pub helper_times: AtomicUsize,
    pub provisioned: AtomicUsize,
    pub provision_errors: AtomicUsize,
    pub lock_held: AtomicUsize,
    pub discovered: AtomicUsize,
    pub event_discovered: AtomicUsize,
    pub invalid_identities: AtomicUsize,
    pub max_busy: AtomicUsize,
    pub paused: Mutex<Vec<bool>>,
}

#[derive(Clone, Default)]
pub struct CountingObserver(pub Arc<Counts>);

impl Observer for CountingObserver {
    fn rpc_time(&self, _l: &'static str, _e: Duration) {
        self.0.rpc_times.fetch_add(1, Ordering::SeqCst);
    }
    fn rpc_error(&self, label: &'static str) {
        self.0.rpc_errors.lock().unwrap().push(label);
    }
    fn helper_time(&self, _e: Duration) {
        self.0.helper_times.fetch_add(1, Ordering::SeqCst);
    }
    fn helper_error(&self) {
        self.0.helper_errors.fetch_add(1, Ordering::SeqCst);
    }
    fn helper_shutdown(&self) {
        self.0.helper_shutdowns.fetch_add(1, Ordering::SeqCst);
    }
    fn provisioned(&self) {
        self.0.provisioned.fetch_add(1, Ordering::SeqCst);
    }
    fn provision_error(&self) {
        self.0.provision_errors.fetch_add(1, Ordering::SeqCst);
    }
    fn invalid_identity(&self) {
        self.0.invalid_identities.fetch_add(1, Ordering::SeqCst);
    }
    fn lock_held(&self) {
        self.0.lock_held.fetch_add(1, Ordering::SeqCst);
    }
    fn discovered(&self) {
        self.0.discovered.fetch_add(1, Ordering::SeqCst);
    }
    fn event_discovered(&self) {
        self.0.event_discovered.fetch_add(1, Ordering::SeqCst);
    }
    fn paused(&self, paused: bool) {
        self.0.paused.lock().unwrap().push(paused);
    }
    fn busy_workers(&self, n: usize) {
        self.0.max_busy.fetch_max(n, Ordering::SeqCst);
    }
}

pub fn config(yaml: &str) -> Arc<Config> {
    Arc::new(
        Config::from_yaml(yaml, "/test/provisioner.yaml")
            .unwrap()
            .config,
    )
}

pub fn provisioner(
    cfg: Arc<Config>,
    node: &FakeNode,
    helper: &FakeHelper,
    obs: &CountingObserver,
) -> Provisioner<FakeNode, FakeHelper, CountingObserver> {
    Provisioner::new(
        cfg.clone(),
        PauseState::default(),
        node.clone(),
        helper.clone(),
        obs.clone(),
        ConfigKeys(cfg),
        Backoff::fixed(vec![Duration::ZERO]),
    )
}

/// Entropy that is always the same: every byte `self.0`, every range its low end.
#[derive(Debug, Clone, Copy)]
pub struct FixedRandom(pub u8);

impl provision_core::Random for FixedRandom {
    fn fill_bytes(&self, buf: &mut [u8]) {
        buf.fill(self.0);
    }

    fn in_range(&self, low: u64, _high: u64) -> u64 {
        low
    }
}

/// Key material read from the files the configuration names, again on every call (as the
/// binary's file-backed key material does, without its cache).
pub struct ConfigKeys(pub Arc<Config>);

fn read_text(path: &str) -> Result<String, PolicyError> {
    if path.is_empty() {
        return Ok(String::new());
    }
    std::fs::read(path)
        .map(|d| String::from_utf8_lossy(&d).into_owned())
        .map_err(|source| PolicyError::File {
            path: path.to_string(),
            source,
        })
}

impl KeyMaterial for ConfigKeys {
    fn verify_key(&self) -> Result<VerifyingKey, PolicyError> {
        let name = &self.0.jwt_verify_cert;
        let file = match std::fs::read(name) {
            Ok(d) => Some(d),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || name.is_empty() => None,
            Err(source) => {
                return Err(PolicyError::File {
                    path: name.clone(),
                    source,
                })
            }
        };
        policy::verify_key(name, file.as_deref())
    }

    fn signing_key(&self) -> Result<String, PolicyError> {
        read_text(&self.0.jwt_signing_key)
    }

    fn signing_token(&self) -> Result<String, PolicyError> {
        read_text(&self.0.jwt_signing_token)
    }
}

/// A CSR signed by the node key in testdata.
pub fn make_csr(cn: &str, dns: &[&str]) -> String {
    use x509_cert::ext::pkix::name::GeneralName;
    let names = dns
        .iter()
        .map(|d| GeneralName::DnsName(der::asn1::Ia5String::new(d).unwrap()))
        .collect();
    make_csr_with(&format!("CN={cn}"), names)
}

/// A CSR signed with the test node key, with `subject` in RFC 4514 form (escape a comma in a
/// name as `\,`) and any subject alternative names.
pub fn make_csr_with(subject: &str, sans: Vec<x509_cert::ext::pkix::name::GeneralName>) -> String {
    use rsa::pkcs1::DecodeRsaPrivateKey;
    use std::str::FromStr;
    use x509_cert::builder::{Builder, RequestBuilder};
    use x509_cert::ext::pkix::SubjectAltName;
    let pem = std::fs::read_to_string(testdata("node-rsa.pem")).unwrap();
    let key = rsa::RsaPrivateKey::from_pkcs1_pem(&pem).unwrap();
    let signer = rsa::pkcs1v15::SigningKey::<sha2::Sha256>::new(key);
    let subject = x509_cert::name::Name::from_str(subject).unwrap();
    let mut b = RequestBuilder::new(subject, &signer).unwrap();
    if !sans.is_empty() {
        b.add_extension(&SubjectAltName(sans)).unwrap();
    }
    let req = b.build::<rsa::pkcs1v15::Signature>().unwrap();
    der::EncodePem::to_pem(&req, der::pem::LineEnding::LF).unwrap()
}
