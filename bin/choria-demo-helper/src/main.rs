//! `choria-demo-helper`: a fast provisioning helper for demos and benchmarks.
//!
//! As a helper (no arguments) it reads the node as JSON on stdin and prints a reply on stdout:
//! a configuration for every node; with a CSR in the input and `CHORIA_CA_CERT`/`CHORIA_CA_KEY`
//! set, a certificate signed by that CA; with an ed25519 key in the input, a `choria` security
//! configuration for the server JWT the provisioner signs. `CHORIA_UPGRADE_TO` asks for an upgrade
//! to that version; `CHORIA_DEFER` set to a substring defers every identity containing it.
//!
//! `choria-demo-helper init-ca DIR` writes a test CA (`ca.pem`, `ca-key.pem`) into DIR;
//! `choria-demo-helper init-signer DIR` writes an ed25519 signer (`signer.seed`, `signer.pub`, both
//! 64 hex characters without a newline, as Choria's tools expect) into DIR.

use std::io::Read;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use der::{Decode, EncodePem};
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};
use rsa::RsaPrivateKey;
use serde_json::{json, Map, Value};
use sha2::Sha256;
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::name::Name;
use x509_cert::request::CertReq;
use x509_cert::serial_number::SerialNumber;
use x509_cert::time::Validity;
use x509_cert::Certificate;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("init-ca") => match args.get(1) {
            Some(dir) => init_ca(dir),
            None => Err("usage: choria-demo-helper init-ca DIR".into()),
        },
        Some("init-signer") => match args.get(1) {
            Some(dir) => init_signer(dir),
            None => Err("usage: choria-demo-helper init-signer DIR".into()),
        },
        Some(other) => Err(format!("unknown argument {other:?}")),
        None => helper(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("choria-demo-helper: {e}");
            ExitCode::FAILURE
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn helper() -> Result<(), String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("cannot read stdin: {e}"))?;
    let node: Value = serde_json::from_str(&input).map_err(|e| format!("invalid input: {e}"))?;
    let identity = node
        .get("identity")
        .and_then(Value::as_str)
        .ok_or("input has no identity")?;

    if let Some(pattern) = env("CHORIA_DEFER") {
        if identity.contains(&pattern) {
            println!(
                "{}",
                json!({"defer": true, "msg": format!("deferred: identity matches {pattern}")})
            );
            return Ok(());
        }
    }

    let brokers = env("CHORIA_BROKERS").unwrap_or_else(|| "nats://127.0.0.1:4222".into());
    let mut config = Map::new();
    let mut set = |k: &str, v: &str| {
        config.insert(k.to_string(), Value::String(v.to_string()));
    };
    set("identity", identity);
    set("plugin.choria.server.provision", "false");
    set("plugin.choria.middleware_hosts", &brokers);
    set("plugin.choria.use_srv", "false");
    set("loglevel", "info");

    let mut reply = Map::new();
    let csr = node
        .get("csr")
        .and_then(|c| c.get("csr"))
        .and_then(Value::as_str);
    if let Some(csr) = csr {
        let ssldir = node
            .get("csr")
            .and_then(|c| c.get("ssldir"))
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("/etc/choria/ssl")
            .to_string();
        let (ca_cert, ca_key) = match (env("CHORIA_CA_CERT"), env("CHORIA_CA_KEY")) {
            (Some(c), Some(k)) => (c, k),
            _ => {
                return Err("a CSR arrived but CHORIA_CA_CERT and CHORIA_CA_KEY are not set".into())
            }
        };
        let ca_pem =
            std::fs::read_to_string(&ca_cert).map_err(|e| format!("cannot read {ca_cert}: {e}"))?;
        let key_pem =
            std::fs::read_to_string(&ca_key).map_err(|e| format!("cannot read {ca_key}: {e}"))?;
        let cert = sign_csr(csr, identity, &ca_pem, &key_pem)?;
        set("plugin.security.provider", "file");
        set(
            "plugin.security.file.certificate",
            &format!("{ssldir}/certificate.pem"),
        );
        set("plugin.security.file.key", &format!("{ssldir}/private.pem"));
        set("plugin.security.file.ca", &format!("{ssldir}/ca.pem"));
        reply.insert("certificate".into(), Value::String(cert));
        reply.insert("ca".into(), Value::String(ca_pem));
        reply.insert("ssldir".into(), Value::String(ssldir));
    }
    let directory = node
        .get("ed25519_pubkey")
        .and_then(|e| e.get("directory"))
        .and_then(Value::as_str);
    if let Some(dir) = directory {
        set("plugin.security.provider", "choria");
        set(
            "plugin.security.choria.token_file",
            &format!("{dir}/server.jwt"),
        );
        set(
            "plugin.security.choria.seed_file",
            &format!("{dir}/server.seed"),
        );
        if let Some(issuer) = env("CHORIA_ISSUER") {
            set("plugin.security.issuer.names", "choria");
            set("plugin.security.issuer.choria.public", &issuer);
        }
        reply.insert("server_claims".into(), json!({"collectives": ["choria"]}));
    }
    if let Some(version) = env("CHORIA_UPGRADE_TO") {
        reply.insert("upgrade".into(), Value::String(version));
    }
    reply.insert("configuration".into(), Value::Object(config));
    reply.insert(
        "msg".into(),
        Value::String(format!("configured {identity}")),
    );
    println!("{}", Value::Object(reply));
    Ok(())
}

/// The DER inside a PEM block with the given label. The armour is decoded first: der's
/// streaming PEM reader spins on DER that ends inside a header.
fn pem_der(text: &str, want: &str) -> Result<Vec<u8>, String> {
    let (label, der) =
        der::pem::decode_vec(text.trim().as_bytes()).map_err(|e| format!("invalid {want}: {e}"))?;
    if label != want {
        return Err(format!("expected a {want}, found {label:?}"));
    }
    Ok(der)
}

fn sign_csr(csr_pem: &str, identity: &str, ca_pem: &str, key_pem: &str) -> Result<String, String> {
    let req = CertReq::from_der(&pem_der(csr_pem, "CERTIFICATE REQUEST")?)
        .map_err(|e| format!("invalid CSR for {identity}: {e}"))?;
    let ca = Certificate::from_der(&pem_der(ca_pem, "CERTIFICATE")?)
        .map_err(|e| format!("invalid CA certificate: {e}"))?;
    let key = RsaPrivateKey::from_pkcs8_pem(key_pem)
        .or_else(|_| {
            use rsa::pkcs1::DecodeRsaPrivateKey;
            RsaPrivateKey::from_pkcs1_pem(key_pem)
        })
        .map_err(|e| format!("invalid CA key: {e}"))?;
    let signer = SigningKey::<Sha256>::new(key);
    let serial = SerialNumber::from(rand::random::<u32>());
    let validity =
        Validity::from_now(Duration::from_secs(365 * 86400)).map_err(|e| e.to_string())?;
    let profile = Profile::Leaf {
        issuer: ca.tbs_certificate.subject.clone(),
        enable_key_agreement: false,
        enable_key_encipherment: true,
    };
    let mut builder = CertificateBuilder::new(
        profile,
        serial,
        validity,
        req.info.subject.clone(),
        req.info.public_key.clone(),
        &signer,
    )
    .map_err(|e| e.to_string())?;
    let dns = der::asn1::Ia5String::new(identity)
        .map_err(|e| format!("identity {identity} is not a DNS name: {e}"))?;
    builder
        .add_extension(&SubjectAltName(vec![GeneralName::DnsName(dns)]))
        .map_err(|e| e.to_string())?;
    let cert = builder
        .build::<rsa::pkcs1v15::Signature>()
        .map_err(|e| format!("cannot sign for {identity}: {e}"))?;
    cert.to_pem(LineEnding::LF).map_err(|e| e.to_string())
}

fn init_ca(dir: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {dir}: {e}"))?;
    let key = RsaPrivateKey::new(&mut rand::thread_rng(), 2048).map_err(|e| e.to_string())?;
    let signer = SigningKey::<Sha256>::new(key.clone());
    let subject = Name::from_str("CN=choria-demo-ca").map_err(|e| e.to_string())?;
    let spki = spki::SubjectPublicKeyInfoOwned::from_key(key.to_public_key())
        .map_err(|e| e.to_string())?;
    let validity =
        Validity::from_now(Duration::from_secs(10 * 365 * 86400)).map_err(|e| e.to_string())?;
    let serial = SerialNumber::from(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs() as u32)
            .unwrap_or(1),
    );
    let builder = CertificateBuilder::new(Profile::Root, serial, validity, subject, spki, &signer)
        .map_err(|e| e.to_string())?;
    let cert = builder
        .build::<rsa::pkcs1v15::Signature>()
        .map_err(|e| e.to_string())?;
    let cert_pem = cert.to_pem(LineEnding::LF).map_err(|e| e.to_string())?;
    let key_pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| e.to_string())?;
    std::fs::write(format!("{dir}/ca.pem"), cert_pem).map_err(|e| e.to_string())?;
    write_private(&format!("{dir}/ca-key.pem"), key_pem.as_bytes())?;
    println!("{dir}/ca.pem");
    Ok(())
}

fn init_signer(dir: &str) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {dir}: {e}"))?;
    let key = ed25519_dalek::SigningKey::generate(&mut rand::thread_rng());
    write_private(
        &format!("{dir}/signer.seed"),
        hex::encode(key.to_bytes()).as_bytes(),
    )?;
    let public = hex::encode(key.verifying_key().to_bytes());
    std::fs::write(format!("{dir}/signer.pub"), &public).map_err(|e| e.to_string())?;
    println!("{public}");
    Ok(())
}

fn write_private(path: &str, data: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot write {path}: {e}"))?;
    f.write_all(data)
        .map_err(|e| format!("cannot write {path}: {e}"))
}
