//! The one test certificate authority, made with `openssl` (on every machine): a CA, RSA keys,
//! CSRs and certificates it signs, with the names a test asks for. The go-choria environment's
//! broker, servers and clients get their certificates here too, so every certificate a test
//! makes has the same shape: critical basic constraints and key usage, both TLS purposes, SHA-256
//! and a serial of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::SystemTime;

use crate::stack::run;
use crate::Result;

/// How a private key is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum KeyFormat {
    /// PKCS#8 (`-----BEGIN PRIVATE KEY-----`), openssl's default.
    #[default]
    Pkcs8,
    /// PKCS#1 (`-----BEGIN RSA PRIVATE KEY-----`), as helpers built on openssl or cfssl print it.
    Pkcs1,
}

/// A CA in a directory: its certificate and key, and the certificates it issued there.
#[derive(Debug, Clone)]
pub struct TestCa {
    dir: PathBuf,
    days: u32,
    /// The CA certificate (PEM).
    pub cert: PathBuf,
    /// The CA's private key (PEM, PKCS#8).
    pub key: PathBuf,
}

/// A certificate the CA issued, with its key.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// A certificate signing request and the key it was made with.
#[derive(Debug, Clone)]
pub struct Request {
    /// The request (PEM).
    pub csr: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

fn quiet(cmd: &mut Command) -> Result<String> {
    run(cmd.stderr(Stdio::null()))
}

/// The `subjectAltName` value for `sans`: `IP:` for an address, `DNS:` for anything else; `None`
/// for no names.
fn alt_names(sans: &[&str]) -> Option<String> {
    if sans.is_empty() {
        return None;
    }
    let names: Vec<String> = sans
        .iter()
        .map(|s| {
            if s.parse::<std::net::IpAddr>().is_ok() {
                format!("IP:{s}")
            } else {
                format!("DNS:{s}")
            }
        })
        .collect();
    Some(names.join(","))
}

/// A new RSA key of 2048 bits at `path`, written as `format` says.
pub fn rsa_key(path: &Path, format: KeyFormat) -> Result<()> {
    let mut cmd = Command::new("openssl");
    cmd.arg("genrsa");
    if format == KeyFormat::Pkcs1 {
        cmd.arg("-traditional");
    }
    quiet(cmd.arg("-out").arg(path).arg("2048")).map(|_| ())
}

/// `count` RSA keys in PEM, one after the other (fast, unlike an unoptimised build generating
/// them).
pub fn rsa_keys_pem(count: usize) -> Result<String> {
    (0..count)
        .map(|_| quiet(Command::new("openssl").args(["genrsa", "2048"])))
        .collect()
}

/// A new key (`<name>-key.pem`, as `format` says) and a certificate signing request made with it
/// (`<name>.csr`) in `dir`, for `subject` as openssl writes it (`/CN=n1.example.net/O=Example`).
/// The request asks for `sans` as its subjectAltName extension when there are any.
pub fn csr(
    dir: &Path,
    name: &str,
    subject: &str,
    sans: &[&str],
    format: KeyFormat,
) -> Result<Request> {
    let key = dir.join(format!("{name}-key.pem"));
    let csr = dir.join(format!("{name}.csr"));
    rsa_key(&key, format)?;
    request(&key, subject, sans, &csr)?;
    Ok(Request { csr, key })
}

/// The subject alternative names of the PEM certificate `cert`, as openssl prints them
/// (`DNS:a.example.net`, `IP Address:192.0.2.1`); `dir` holds the file openssl reads.
pub fn cert_sans(dir: &Path, cert: &str) -> Result<Vec<String>> {
    let file = dir.join("issued.pem");
    crate::write(&file, cert)?;
    let mut cmd = Command::new("openssl");
    cmd.args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(&file);
    Ok(quiet(&mut cmd)?
        .lines()
        .skip(1)
        .flat_map(|l| l.split(','))
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

/// Every file directly under `dir` with its length and modification time: compared before and
/// after, it shows that nothing under a CA's folder was written.
pub fn files_snapshot(dir: &Path) -> Result<BTreeMap<String, (u64, SystemTime)>> {
    let mut out = BTreeMap::new();
    let list = |e: std::io::Error| crate::Error::Io {
        what: format!("listing {}", dir.display()),
        err: e,
    };
    for e in std::fs::read_dir(dir).map_err(list)? {
        let e = e.map_err(list)?;
        let m = e.metadata().map_err(list)?;
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            (m.len(), m.modified().map_err(list)?),
        );
    }
    Ok(out)
}

/// A certificate signing request made with the existing `key` and written to `out`, for
/// `subject` as openssl writes it, asking for `sans` as its subjectAltName extension when there
/// are any. It fails when openssl refuses the subject (a common name over 64 bytes, say).
pub fn request(key: &Path, subject: &str, sans: &[&str], out: &Path) -> Result<()> {
    let mut cmd = Command::new("openssl");
    cmd.args(["req", "-new", "-subj", subject, "-key"])
        .arg(key)
        .arg("-out")
        .arg(out);
    if let Some(names) = alt_names(sans) {
        cmd.args(["-addext", &format!("subjectAltName={names}")]);
    }
    quiet(&mut cmd).map(drop)
}

impl TestCa {
    /// A CA named `provisioner test ca` in `dir` (`ca.pem`, `ca-key.pem`); it and the
    /// certificates it issues are valid for two days.
    pub fn new(dir: &Path) -> Result<TestCa> {
        TestCa::named(dir, "provisioner test ca", 2)
    }

    /// A CA with common name `cn` in `dir` (`ca.pem`, `ca-key.pem`); it and the certificates it
    /// issues are valid for `days` days.
    pub fn named(dir: &Path, cn: &str, days: u32) -> Result<TestCa> {
        let cert = dir.join("ca.pem");
        let key = dir.join("ca-key.pem");
        quiet(
            Command::new("openssl")
                .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256"])
                .args(["-days", &days.to_string(), "-subj", &format!("/CN={cn}")])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        )?;
        Ok(TestCa {
            dir: dir.to_path_buf(),
            days,
            cert,
            key,
        })
    }

    /// A certificate for `cn` with DNS (or, for an address, IP) subject alternative names
    /// `sans`, for TLS servers and clients alike, as `<cn>-cert.pem` and `<cn>-key.pem`.
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Result<Issued> {
        self.issue_as(cn, cn, sans, KeyFormat::Pkcs8)
    }

    /// As [`TestCa::issue`], with the files named after `name` (`<name>-cert.pem`,
    /// `<name>-key.pem`, and the request `<name>.csr` and extensions `<name>.ext` beside them)
    /// and the key written as `format` says.
    pub fn issue_as(
        &self,
        name: &str,
        cn: &str,
        sans: &[&str],
        format: KeyFormat,
    ) -> Result<Issued> {
        let req = csr(&self.dir, name, &format!("/CN={cn}"), &[], format)?;
        let cert = self.dir.join(format!("{name}-cert.pem"));
        let ext = self.dir.join(format!("{name}.ext"));
        // Extensions make it a version 3 certificate, which TLS libraries insist on; they are
        // given at signing, since openssl does not copy a request's extensions.
        let mut lines = "basicConstraints = critical,CA:FALSE\n\
                         keyUsage = critical,digitalSignature,keyEncipherment\n\
                         extendedKeyUsage = serverAuth,clientAuth\n"
            .to_string();
        if let Some(names) = alt_names(sans) {
            lines.push_str(&format!("subjectAltName = {names}\n"));
        }
        crate::write(&ext, &lines)?;
        quiet(
            Command::new("openssl")
                .args(["x509", "-req", "-sha256", "-days", &self.days.to_string()])
                .arg("-in")
                .arg(&req.csr)
                .arg("-CA")
                .arg(&self.cert)
                .arg("-CAkey")
                .arg(&self.key)
                // A serial file gives every certificate a serial of its own.
                .arg("-CAserial")
                .arg(self.dir.join("ca.srl"))
                .arg("-CAcreateserial")
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(&cert),
        )?;
        Ok(Issued { cert, key: req.key })
    }

    /// A main collective secured by this CA: a certificate for the broker (`localhost`,
    /// `127.0.0.1`) and one for the operator `operator.mcollective`, with the broker's `tls`
    /// block for its nats-server configuration (a client certificate required of TLS clients,
    /// plain connections allowed) and the operator's Choria client configuration (the file
    /// security provider), which names no broker: the caller adds its address.
    pub fn main_collective(&self) -> Result<MainCollective> {
        let broker = self.issue("localhost", &["127.0.0.1", "localhost"])?;
        let operator = self.issue("operator.mcollective", &[])?;
        Ok(MainCollective {
            broker_tls: format!(
                "allow_non_tls: true\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 5\n}}\n",
                broker.cert.display(),
                broker.key.display(),
                self.cert.display()
            ),
            operator_config: format!(
                "identity = operator.mcollective\nmain_collective = mcollective\ncollectives = mcollective\n\
                 plugin.security.provider = file\nplugin.security.file.certificate = {}\n\
                 plugin.security.file.key = {}\nplugin.security.file.ca = {}\n",
                operator.cert.display(),
                operator.key.display(),
                self.cert.display()
            ),
        })
    }
}

/// See [`TestCa::main_collective`].
#[derive(Debug, Clone)]
pub struct MainCollective {
    /// nats-server configuration lines: `allow_non_tls` and the `tls` block.
    pub broker_tls: String,
    /// The operator's Choria client configuration, without `plugin.choria.middleware_hosts`.
    pub operator_config: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn openssl(args: &[&str], file: &Path) -> String {
        run(Command::new("openssl").args(args).arg(file)).expect("openssl")
    }

    #[test]
    fn issued_certificates_verify_and_carry_the_names_asked_for() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let ca = TestCa::new(dir.path()).expect("a CA");
        let a = ca
            .issue("broker.example.net", &["localhost", "127.0.0.1"])
            .expect("a certificate");
        let b = ca
            .issue_as("client", "c1.example.net", &[], KeyFormat::Pkcs1)
            .expect("another");
        assert_eq!(b.cert, dir.path().join("client-cert.pem"));
        for cert in [&a.cert, &b.cert] {
            let ca_file = ca.cert.display().to_string();
            let ok = openssl(&["verify", "-CAfile", &ca_file], cert);
            assert!(ok.trim().ends_with("OK"), "{ok}");
        }
        let text = openssl(&["x509", "-noout", "-text", "-in"], &a.cert);
        assert!(
            text.contains("DNS:localhost, IP Address:127.0.0.1"),
            "{text}"
        );
        assert!(
            text.contains("X509v3 Basic Constraints: critical"),
            "{text}"
        );
        assert!(text.contains("TLS Web Server Authentication, TLS Web Client Authentication"));
        let serial = |c: &Path| openssl(&["x509", "-noout", "-serial", "-in"], c);
        assert_ne!(serial(&a.cert), serial(&b.cert));
        let key = |p: &Path| std::fs::read_to_string(p).expect("a key");
        assert!(key(&a.key).starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(key(&b.key).starts_with("-----BEGIN RSA PRIVATE KEY-----"));
    }

    #[test]
    fn a_request_asks_for_its_subject_and_names() {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let req = csr(
            dir.path(),
            "n1",
            "/CN=n1.example.net/O=Example",
            &["n1.example.net", "10.0.0.1"],
            KeyFormat::Pkcs8,
        )
        .expect("a request");
        let text = openssl(&["req", "-noout", "-text", "-in"], &req.csr);
        assert!(text.contains("CN = n1.example.net, O = Example"), "{text}");
        assert!(
            text.contains("DNS:n1.example.net, IP Address:10.0.0.1"),
            "{text}"
        );
        assert!(req.key.is_file());
    }
}
