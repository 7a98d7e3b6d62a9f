//! TLS for the monitor listener (`monitor_tls_cert`, `monitor_tls_key`): rustls with the ring
//! provider, the certificate and key read again when either file changes (looked at no more than
//! once a second), so a renewed certificate is served without a restart. A renewal that does not
//! load keeps the last good pair and logs why.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How often the files are looked at for a change, at most.
const RECHECK: Duration = Duration::from_secs(1);
/// The largest certificate or key file read.
const MAX_FILE: u64 = 1 << 20;

/// Why the monitor's TLS files cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("monitor TLS {what} {}: {detail}", path.display())]
pub struct TlsError {
    /// `certificate` or `key`.
    pub what: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong.
    pub detail: String,
}

/// What identifies a file's content without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp(u64, u64, Option<SystemTime>, Option<SystemTime>);

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp(m.ino(), m.len(), m.modified().ok(), m.created().ok()))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read as _;
    let fail = |detail: String| TlsError {
        what,
        path: path.to_path_buf(),
        detail,
    };
    let mut data = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE + 1).read_to_end(&mut data))
        .map_err(|e| fail(e.to_string()))?;
    if data.len() as u64 > MAX_FILE {
        return Err(fail(format!("is larger than {MAX_FILE} bytes")));
    }
    Ok(data)
}

/// The certificate chain and key of `cert` and `key`, checked to belong together.
pub fn load(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let cert_pem = read("certificate", cert)?;
    let key_pem = read("key", key)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError {
            what: "certificate",
            path: cert.to_path_buf(),
            detail: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError {
            what: "certificate",
            path: cert.to_path_buf(),
            detail: "holds no PEM certificate".into(),
        });
    }
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError {
        what: "key",
        path: key.to_path_buf(),
        detail: e.to_string(),
    })?;
    let certified = CertifiedKey::from_der(chain, private, provider).map_err(|e| TlsError {
        what: "key",
        path: key.to_path_buf(),
        detail: format!("does not go with the certificate: {e}"),
    })?;
    Ok(Arc::new(certified))
}

struct Loaded {
    stamps: (Option<Stamp>, Option<Stamp>),
    checked: Instant,
    key: Arc<CertifiedKey>,
}

/// Serves the certificate of two files, reloading it when they change.
pub struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the pair now: an error when it cannot be used.
    pub fn new(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let stamps = (stamp(cert), stamp(key));
        let certified = load(cert, key, &provider)?;
        Ok(ReloadingCert {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            loaded: Mutex::new(Loaded {
                stamps,
                checked: Instant::now(),
                key: certified,
            }),
        })
    }

    /// The pair to serve now, reloaded first when the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut l = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if l.checked.elapsed() >= RECHECK {
            l.checked = Instant::now();
            let now = (stamp(&self.cert), stamp(&self.key));
            if now != l.stamps {
                match load(&self.cert, &self.key, &self.provider) {
                    Ok(k) => {
                        tracing::info!(
                            "monitoring: reloaded the TLS certificate {}",
                            self.cert.display()
                        );
                        l.key = k;
                        l.stamps = now;
                    }
                    Err(e) => {
                        // Tried again at the next change; the last good pair is served.
                        l.stamps = now;
                        tracing::error!("monitoring: {e}; serving the previous certificate");
                    }
                }
            }
        }
        Arc::clone(&l.key)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The rustls server configuration serving `cert`/`key` (reloaded on change), HTTP/1.1 only.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = ReloadingCert::new(cert, key, Arc::clone(&provider))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError {
            what: "certificate",
            path: cert.to_path_buf(),
            detail: e.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
