//! What the cycle tests share: the fakes of `provision_core::testing`, the configurations they
//! run under, and CSRs built from the test key in testdata. The node is faked because the real
//! network path is tested end to end elsewhere; everything it returns is produced with real keys
//! and signatures.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;
use std::time::Duration;

pub use provision_core::testing::*;
use provision_core::{
    Backoff, Clock, Features, ProvisionConfig, ProvisionConfigBuilder, Provisioner, SystemClock,
};

pub fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

/// The node the cycle tests provision: `n1.example.net`, found now.
pub fn host() -> provision_core::Host {
    provision_core::Host::new(
        std::sync::Arc::from("n1.example.net"),
        tokio::time::Instant::now(),
    )
}

/// The fakes of one cycle: a node, a helper giving [`good_reply`], and an observer.
pub fn fakes() -> (FakeNode, FakeHelper, CountingObserver) {
    (
        FakeNode::new(),
        FakeHelper::replying(good_reply()),
        CountingObserver::default(),
    )
}

pub fn now() -> i64 {
    SystemClock.now_unix()
}

/// Writes a 64-hex ed25519 seed file for server JWT signing.
pub fn seed_file(dir: &std::path::Path, seed: [u8; 32]) -> String {
    let p = dir.join("signer.seed");
    std::fs::write(&p, hex::encode(seed)).unwrap();
    p.to_string_lossy().into_owned()
}

/// No token, no feature.
pub fn cfg() -> ProvisionConfigBuilder {
    ProvisionConfig::builder()
}

/// The fake node's token.
pub fn token() -> ProvisionConfigBuilder {
    cfg().token(TOKEN)
}

/// The token and `features`.
pub fn features(f: Features) -> ProvisionConfigBuilder {
    token().features(f)
}

/// The token and the provisioning JWT checked.
pub fn jwt() -> ProvisionConfigBuilder {
    features(Features::NONE.with_jwt(true))
}

/// The token and ed25519 enrolment.
pub fn ed25519() -> ProvisionConfigBuilder {
    features(Features::NONE.with_ed25519(true))
}

/// The token and upgrades from a repository.
pub fn upgrades() -> ProvisionConfigBuilder {
    features(Features::NONE.with_upgrades(true)).upgrades("https://repo.example.net", false)
}

/// A provisioner of `config` over `node` and `helper`, reporting to `obs`, with the test keys
/// and no delay between tries.
pub fn provisioner(
    config: ProvisionConfigBuilder,
    node: &FakeNode,
    helper: &FakeHelper,
    obs: &CountingObserver,
) -> Provisioner {
    builder(config, node, helper, obs).build()
}

/// [`provisioner`], still to be finished.
pub fn builder(
    config: ProvisionConfigBuilder,
    node: &FakeNode,
    helper: &FakeHelper,
    obs: &CountingObserver,
) -> provision_core::ProvisionerBuilder {
    Provisioner::builder(node.clone(), helper.clone())
        .config(config.build().unwrap())
        .observer(obs.clone())
        .keys(test_keys())
        .backoff(Backoff::fixed(vec![Duration::ZERO]))
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
