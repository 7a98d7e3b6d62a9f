//! `choria-demo-helper`: a fast provisioning helper for demos and benchmarks.
//!
//! As a helper (no arguments) it reads the node as JSON on stdin and prints a reply on stdout:
//! a configuration for every node; with a CSR in the input and `CHORIA_CA_CERT`/`CHORIA_CA_KEY`
//! set, a certificate signed by that CA; with an ed25519 key in the input, a `choria` security
//! configuration for the server JWT the provisioner signs. `CHORIA_UPGRADE_TO` asks for an upgrade
//! to that version; `CHORIA_DEFER` set to a substring defers every identity containing it.
//! `CHORIA_HELPER_DELAY_MS` waits that long (at most a minute) before answering, standing for a
//! remote CA; `CHORIA_HELPER_RECORD` names a file each run appends its identity to.
//!
//! Everything in the input comes from the node, that is from anyone holding a provisioning JWT.
//! Before anything else the identity is held to the provisioner's built-in grammar (labels of
//! ASCII letters, digits, `-` and `_`, 1 to 63 bytes, separated by single dots, at most 253
//! bytes) and Choria client names (`*.mcollective`, `*.choria`) are refused; the SSL and key
//! directories must be absolute paths of plain characters; a CSR must carry exactly one common
//! name, the identity. A refusal is a `defer` naming why. A certificate's only subject
//! alternative name is the checked identity, added as data; the names a CSR asks for are not
//! copied.
//!
//! `choria-demo-helper serve --listen ADDR` answers the same as a webhook helper instead: the
//! node's input POSTed as the body, the reply as the answer, signatures checked with
//! `--secret-file`, over TLS with `--tls-cert`/`--tls-key` and client certificates required with
//! `--client-ca` (see the `serve` module).
//!
//! `choria-demo-helper init-ca DIR` writes a test CA (`ca.pem`, `ca-key.pem`) into DIR;
//! `choria-demo-helper init-signer DIR` writes an ed25519 signer (`signer.seed`, `signer.pub`, both
//! 64 hex characters without a newline, as Choria's tools expect) into DIR.

mod serve;

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
        Some("serve") => serve::main(&args[1..]),
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

/// One stdin run: the node on stdin, the reply on stdout.
fn helper() -> Result<(), String> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| format!("cannot read stdin: {e}"))?;
    let reply = Site::from_env().reply(&input)?;
    println!("{reply}");
    Ok(())
}

/// The CA that signs CSRs: its certificate as PEM (sent to nodes) and its key, parsed once.
pub struct Ca {
    pem: String,
    cert: Certificate,
    signer: SigningKey<Sha256>,
}

impl Ca {
    /// Reads and parses the certificate and key files.
    fn load(cert_path: &str, key_path: &str) -> Result<Ca, String> {
        let pem = std::fs::read_to_string(cert_path)
            .map_err(|e| format!("cannot read {cert_path}: {e}"))?;
        let key_pem = std::fs::read_to_string(key_path)
            .map_err(|e| format!("cannot read {key_path}: {e}"))?;
        let cert = Certificate::from_der(&pem_der(&pem, "CERTIFICATE")?)
            .map_err(|e| format!("invalid CA certificate: {e}"))?;
        let key = RsaPrivateKey::from_pkcs8_pem(&key_pem)
            .or_else(|_| {
                use rsa::pkcs1::DecodeRsaPrivateKey;
                RsaPrivateKey::from_pkcs1_pem(&key_pem)
            })
            .map_err(|e| format!("invalid CA key: {e}"))?;
        Ok(Ca {
            pem,
            cert,
            signer: SigningKey::<Sha256>::new(key),
        })
    }
}

/// The site's settings, from the environment (`CHORIA_BROKERS`, `CHORIA_CA_CERT` and
/// `CHORIA_CA_KEY`, `CHORIA_ISSUER`, `CHORIA_UPGRADE_TO`, `CHORIA_DEFER`); the CA is read when
/// the first CSR arrives (or at once by the server, see [`Site::load_ca`]).
pub struct Site {
    brokers: String,
    defer: Option<String>,
    upgrade: Option<String>,
    issuer: Option<String>,
    ca_files: Option<(String, String)>,
    ca: std::sync::OnceLock<Result<Ca, String>>,
}

impl Site {
    /// The settings of the environment.
    pub fn from_env() -> Site {
        Site {
            brokers: env("CHORIA_BROKERS").unwrap_or_else(|| "nats://127.0.0.1:4222".into()),
            defer: env("CHORIA_DEFER"),
            upgrade: env("CHORIA_UPGRADE_TO"),
            issuer: env("CHORIA_ISSUER"),
            ca_files: env("CHORIA_CA_CERT").zip(env("CHORIA_CA_KEY")),
            ca: std::sync::OnceLock::new(),
        }
    }

    /// The CA, read on first use.
    fn ca(&self) -> Result<&Ca, String> {
        let Some((cert, key)) = &self.ca_files else {
            return Err("a CSR arrived but CHORIA_CA_CERT and CHORIA_CA_KEY are not set".into());
        };
        self.ca
            .get_or_init(|| Ca::load(cert, key))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Reads the CA now when one is configured (a server fails at start, not per node).
    pub fn load_ca(&self) -> Result<(), String> {
        if self.ca_files.is_some() {
            self.ca()?;
        }
        Ok(())
    }

    /// The reply for one node's input: a configuration, or a `defer` naming why the node is
    /// refused. An error is a failure of the helper itself (unreadable input, no CA).
    pub fn reply(&self, input: &[u8]) -> Result<Value, String> {
        let node: Value =
            serde_json::from_slice(input).map_err(|e| format!("invalid input: {e}"))?;
        let identity = match node.get("identity").map(identity_problem) {
            None => return Ok(defer("refused: the input has no identity")),
            Some(Err(why)) => return Ok(defer(&format!("refused: {why}"))),
            Some(Ok(identity)) => identity,
        };

        // Benchmarks and the active-active scenarios: a fixed latency standing for a remote CA,
        // and a record of every identity the helper ran for (one appended line each).
        if let Some(ms) = env("CHORIA_HELPER_DELAY_MS") {
            let ms: u64 = ms.parse().map_err(|_| {
                format!("CHORIA_HELPER_DELAY_MS {ms:?} is not a number of milliseconds")
            })?;
            std::thread::sleep(std::time::Duration::from_millis(ms.min(60_000)));
        }
        if let Some(path) = env("CHORIA_HELPER_RECORD") {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| format!("cannot open {path}: {e}"))?;
            f.write_all(format!("{identity}\n").as_bytes())
                .map_err(|e| format!("cannot write {path}: {e}"))?;
        }

        if let Some(pattern) = &self.defer {
            if identity.contains(pattern.as_str()) {
                return Ok(
                    json!({"defer": true, "msg": format!("deferred: identity matches {pattern}")}),
                );
            }
        }

        let mut config = Map::new();
        let mut set = |k: &str, v: &str| {
            config.insert(k.to_string(), Value::String(v.to_string()));
        };
        set("identity", identity);
        set("plugin.choria.server.provision", "false");
        set("plugin.choria.middleware_hosts", &self.brokers);
        set("plugin.choria.use_srv", "false");
        set("loglevel", "info");

        let mut reply = Map::new();
        let csr = node
            .get("csr")
            .and_then(|c| c.get("csr"))
            .and_then(Value::as_str);
        if let Some(csr) = csr {
            let ssldir = match node.get("csr").and_then(|c| c.get("ssldir")) {
                None | Some(Value::Null) => "/etc/choria/ssl",
                Some(Value::String(s)) if s.is_empty() => "/etc/choria/ssl",
                Some(Value::String(s)) if safe_path(s) => s,
                Some(_) => return Ok(defer(&format!("refused: the SSL directory {PATH_RULE}"))),
            }
            .to_string();
            let ca = self.ca()?;
            let cert = match sign_csr(csr, identity, ca)? {
                Signed::Certificate(cert) => cert,
                Signed::Refused(why) => return Ok(defer(&format!("refused: {why}"))),
            };
            set("plugin.security.provider", "file");
            set(
                "plugin.security.file.certificate",
                &format!("{ssldir}/certificate.pem"),
            );
            set("plugin.security.file.key", &format!("{ssldir}/private.pem"));
            set("plugin.security.file.ca", &format!("{ssldir}/ca.pem"));
            reply.insert("certificate".into(), Value::String(cert));
            reply.insert("ca".into(), Value::String(ca.pem.clone()));
            reply.insert("ssldir".into(), Value::String(ssldir));
        }
        let directory = match node.get("ed25519_pubkey").and_then(|e| e.get("directory")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if safe_path(s) => Some(s.as_str()),
            Some(_) => return Ok(defer(&format!("refused: the key directory {PATH_RULE}"))),
        };
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
            if let Some(issuer) = &self.issuer {
                set("plugin.security.issuer.names", "choria");
                set("plugin.security.issuer.choria.public", issuer);
            }
            reply.insert("server_claims".into(), json!({"collectives": ["choria"]}));
        }
        if let Some(version) = &self.upgrade {
            reply.insert("upgrade".into(), Value::String(version.clone()));
        }
        reply.insert("configuration".into(), Value::Object(config));
        reply.insert(
            "msg".into(),
            Value::String(format!("configured {identity}")),
        );
        Ok(Value::Object(reply))
    }
}

/// A `defer` reply naming why.
fn defer(why: &str) -> Value {
    json!({"defer": true, "msg": why})
}

/// The longest identity accepted (the longest DNS name).
const MAX_IDENTITY_LEN: usize = 253;
/// The longest label.
const MAX_LABEL_LEN: usize = 63;
/// The longest SSL or key directory accepted.
const MAX_PATH_LEN: usize = 1024;
/// What [`safe_path`] asks of a directory, for the refusal message.
const PATH_RULE: &str = "is not an absolute path of letters, digits, '.', '_', '-' and '/'";

/// The identity when it is a string of the provisioner's built-in grammar (labels of ASCII
/// letters, digits, `-` and `_`, each 1 to 63 bytes, separated by single dots, at most 253 bytes)
/// and not a Choria client name (`*.mcollective`, `*.choria`); else why not. Kept here rather
/// than shared with the provisioner: a helper's checks are its own, as a site's would be.
fn identity_problem(value: &Value) -> Result<&str, String> {
    let Some(identity) = value.as_str() else {
        return Err("the identity is not a string".into());
    };
    if identity.len() > MAX_IDENTITY_LEN {
        return Err(format!(
            "the identity is {} bytes long, the limit is {MAX_IDENTITY_LEN}",
            identity.len()
        ));
    }
    for label in identity.split('.') {
        if label.is_empty() {
            return Err(
                "the identity is empty or has an empty label (a leading, trailing or doubled dot)"
                    .into(),
            );
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(format!(
                "the identity has a label of {} bytes, the limit is {MAX_LABEL_LEN}",
                label.len()
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "the identity holds {c:?}; labels may hold letters, digits, '-' and '_'"
            ));
        }
    }
    let lower = identity.to_ascii_lowercase();
    if lower.ends_with(".mcollective") || lower.ends_with(".choria") {
        return Err("the identity is a Choria client name (*.mcollective, *.choria)".into());
    }
    Ok(identity)
}

/// An absolute path of ASCII letters, digits, `.`, `_`, `-` and `/`, without a `..` part, at
/// most [`MAX_PATH_LEN`] bytes: a directory on the node that can go into its configuration.
fn safe_path(path: &str) -> bool {
    path.starts_with('/')
        && path.len() <= MAX_PATH_LEN
        && path
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
        && !path.split('/').any(|part| part == "..")
}

/// What [`sign_csr`] made of a CSR.
#[derive(Debug)]
enum Signed {
    /// The certificate, PEM.
    Certificate(String),
    /// Why the CSR is refused.
    Refused(String),
}

/// The DER inside a PEM block with the given label ([`choria_crypto::pem::decode`]: armour
/// first, so DER that ends inside a header cannot make the decoder spin).
fn pem_der(text: &str, want: &'static str) -> Result<Vec<u8>, String> {
    choria_crypto::pem::decode(text, want).map_err(|e| format!("invalid {want}: {e}"))
}

/// Signs the CSR of a checked identity: its subject must hold exactly one common name, the
/// identity; the certificate's only subject alternative name is `DNS:<identity>`.
fn sign_csr(csr_pem: &str, identity: &str, ca: &Ca) -> Result<Signed, String> {
    let req = CertReq::from_der(&pem_der(csr_pem, "CERTIFICATE REQUEST")?)
        .map_err(|e| format!("invalid CSR for {identity}: {e}"))?;
    if choria_crypto::csr::common_names(&req.info.subject) != [Some(identity.to_string())] {
        return Ok(Signed::Refused(
            "the CSR's subject does not hold exactly one common name, the identity".into(),
        ));
    }
    let serial = SerialNumber::from(rand::random::<u32>());
    let validity =
        Validity::from_now(Duration::from_secs(365 * 86400)).map_err(|e| e.to_string())?;
    let profile = Profile::Leaf {
        issuer: ca.cert.tbs_certificate.subject.clone(),
        enable_key_agreement: false,
        enable_key_encipherment: true,
    };
    let mut builder = CertificateBuilder::new(
        profile,
        serial,
        validity,
        req.info.subject.clone(),
        req.info.public_key.clone(),
        &ca.signer,
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
    cert.to_pem(LineEnding::LF)
        .map(Signed::Certificate)
        .map_err(|e| e.to_string())
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn check(identity: &str) -> Result<&str, String> {
        identity_problem(&Value::String(identity.to_string()))
            .map(|_| identity)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn names_of_the_grammar_are_accepted() {
        let longest_label = "a".repeat(63);
        let at_limit = [&"b".repeat(63)[..]; 3].join(".") + "." + &"c".repeat(61);
        assert_eq!(at_limit.len(), 253);
        for ok in [
            "node1.example.net",
            "slow-1",
            "n_1.Example.NET",
            "-x.y",
            longest_label.as_str(),
            at_limit.as_str(),
        ] {
            assert_eq!(check(ok), Ok(ok), "{ok:?}");
        }
        let e = check(&(at_limit.clone() + "c")).unwrap_err();
        assert!(e.contains("254 bytes"), "{e}");
    }

    #[test]
    fn hostile_identities_are_refused_with_the_reason() {
        let cases: &[(&str, &str)] = &[
            (
                "evil.example.net,DNS:admin.privileged.mcollective,DNS:x",
                "holds ','",
            ),
            ("*.example.net", "holds '*'"),
            (">", "holds '>'"),
            ("node1.example.net\n", "holds '\\n'"),
            ("node1.example.net\nfake log line", "holds '\\n'"),
            ("", "empty"),
            (".example.net", "empty label"),
            ("example.net.", "empty label"),
            ("a..b", "empty label"),
            ("a b", "holds ' '"),
            ("nöde.example.net", "holds 'ö'"),
            ("a/../b", "holds '/'"),
            ("admin.privileged.mcollective", "Choria client name"),
            ("x.PRIVILEGED.choria", "Choria client name"),
            ("web.choria", "Choria client name"),
        ];
        for (identity, why) in cases {
            let e = check(identity).unwrap_err();
            assert!(e.contains(why), "{identity:?}: {e}");
        }
        let e = check(&"a".repeat(5000)).unwrap_err();
        assert!(e.contains("5000 bytes"), "{e}");
        let e = check(&format!("{}.net", "a".repeat(64))).unwrap_err();
        assert!(e.contains("label of 64 bytes"), "{e}");
        for not_a_string in [json!(null), json!(7), json!(["a.b"]), json!({"a": "b"})] {
            assert!(identity_problem(&not_a_string).is_err());
        }
    }

    #[test]
    fn directories_must_be_plain_absolute_paths() {
        let long = format!("/{}", "a".repeat(1024));
        for (path, safe) in [
            ("/etc/choria/ssl", true),
            ("/tmp/.tmpAb3_x-1/ssl", true),
            ("/", true),
            ("etc/choria", false),
            ("", false),
            ("/etc/choria/../../root", false),
            ("/etc/choria\nplugin.security.provider = none", false),
            ("/etc/cho ria", false),
            ("C:\\ProgramData\\choria", false),
            (&long, false),
        ] {
            assert_eq!(safe_path(path), safe, "{path:?}");
        }
    }

    fn name(s: &str) -> Name {
        Name::from_str(s).unwrap()
    }

    fn common_names(subject: &Name) -> Vec<Option<String>> {
        choria_crypto::csr::common_names(subject)
    }

    #[test]
    fn common_names_are_read_from_every_rdn() {
        assert_eq!(
            common_names(&name("CN=n1.example.net")),
            [Some("n1.example.net".to_string())]
        );
        assert_eq!(
            common_names(&name("CN=n1.example.net,O=Example,OU=web")),
            [Some("n1.example.net".to_string())]
        );
        assert_eq!(
            common_names(&name("O=Example")),
            Vec::<Option<String>>::new()
        );
        assert_eq!(
            common_names(&name("CN=a.example.net,CN=admin.privileged.mcollective")).len(),
            2
        );
        assert_eq!(
            common_names(&name("CN=a.example.net+O=x")),
            [Some("a.example.net".to_string())]
        );
    }
}
