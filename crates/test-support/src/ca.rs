//! The one test certificate authority, made with `openssl` (on every machine): a CA, RSA keys,
//! CSRs and certificates it signs, with the names a test asks for.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::stack::run;
use crate::Result;

/// A CA in a directory: its certificate and key, and the certificates it issued there.
#[derive(Debug, Clone)]
pub struct TestCa {
    dir: PathBuf,
    /// The CA certificate (PEM).
    pub cert: PathBuf,
    /// The CA's private key (PEM).
    pub key: PathBuf,
}

/// A certificate the CA issued, with its key.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key: PathBuf,
}

fn quiet(cmd: &mut Command) -> Result<String> {
    run(cmd.stderr(Stdio::null()))
}

/// A new RSA key of 2048 bits at `path`: PKCS#1 (`-----BEGIN RSA PRIVATE KEY-----`, as helpers
/// built on openssl or cfssl print it) when `pkcs1`, else PKCS#8.
pub fn rsa_key(path: &Path, pkcs1: bool) -> Result<()> {
    let mut cmd = Command::new("openssl");
    cmd.arg("genrsa");
    if pkcs1 {
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

impl TestCa {
    /// A CA named `provisioner test ca`, valid for two days, in `dir` (`ca.pem`, `ca-key.pem`).
    pub fn new(dir: &Path) -> Result<TestCa> {
        let cert = dir.join("ca.pem");
        let key = dir.join("ca-key.pem");
        quiet(
            Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                ])
                .args(["-subj", "/CN=provisioner test ca"])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        )?;
        Ok(TestCa {
            dir: dir.to_path_buf(),
            cert,
            key,
        })
    }

    /// A certificate for `cn` with DNS (or, for an address, IP) subject alternative names
    /// `sans`, for TLS servers and clients alike, as `<cn>.pem` and `<cn>-key.pem`.
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Result<Issued> {
        let key = self.dir.join(format!("{cn}-key.pem"));
        let csr = self.dir.join(format!("{cn}.csr"));
        let cert = self.dir.join(format!("{cn}.pem"));
        let ext = self.dir.join(format!("{cn}.ext"));
        quiet(
            Command::new("openssl")
                .args(["req", "-new", "-newkey", "rsa:2048", "-nodes"])
                .args(["-subj", &format!("/CN={cn}")])
                .arg("-keyout")
                .arg(&key)
                .arg("-out")
                .arg(&csr),
        )?;
        // Extensions make it a version 3 certificate, which TLS libraries insist on.
        let mut lines = "basicConstraints=CA:FALSE\n\
                         keyUsage=digitalSignature,keyEncipherment\n\
                         extendedKeyUsage=serverAuth,clientAuth\n"
            .to_string();
        if !sans.is_empty() {
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
            lines.push_str(&format!("subjectAltName={}\n", names.join(",")));
        }
        crate::write(&ext, &lines)?;
        quiet(
            Command::new("openssl")
                .args(["x509", "-req", "-days", "2", "-set_serial", "7", "-in"])
                .arg(&csr)
                .arg("-CA")
                .arg(&self.cert)
                .arg("-CAkey")
                .arg(&self.key)
                .arg("-extfile")
                .arg(&ext)
                .arg("-out")
                .arg(&cert),
        )?;
        Ok(Issued { cert, key })
    }
}
