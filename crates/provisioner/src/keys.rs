//! The cycle's [`KeyMaterial`] read from the files the provisioner configuration names, again for
//! every node, so a rotated key or token takes effect without a restart.
//!
//! `jwt_verify_cert` is a file when a file by that name exists (RSA PEM or hex ed25519), else
//! itself a hex ed25519 public key, as the Go provisioner decides. Its parsed key is kept and
//! parsed again only when the file changes (the same stamp as below). `jwt_signing_key` and
//! `jwt_signing_token` are read again whenever the file's inode, size, modification or change
//! time differ from the last read. All three are looked at (one `stat`) at most every
//! [`RECHECK`], so a key replaced by a rename or rewritten in place takes effect within a tenth
//! of a second, without reading the files, or even looking at them, for every node.

use std::sync::{Arc, Mutex};

use std::time::Instant;

use helper_protocol::changed_file::{file_stamp, ChangedFile, FileStamp, RECHECK};

use provision_core::jwt::VerifyingKey;
use provision_core::policy::{self, PolicyError};
use provision_core::KeyMaterial;

use crate::config::Config;

/// When the verification key file was last seen ([`file_stamp`]), `None` when there is no such
/// file.
type KeyStamp = Option<FileStamp>;

/// Key material from the files of a provisioner configuration.
pub struct FileKeys {
    config: Arc<Config>,
    /// The verification key, the stamp it was parsed from, and when that stamp was last seen.
    verify_key_cache: Mutex<Option<(KeyStamp, VerifyingKey, Instant)>>,
    signing_key: TextFile,
    signing_token: TextFile,
}

impl FileKeys {
    /// The files `config` names.
    pub fn new(config: Arc<Config>) -> Self {
        FileKeys {
            signing_key: TextFile::new(&config.jwt_signing_key),
            signing_token: TextFile::new(&config.jwt_signing_token),
            config,
            verify_key_cache: Mutex::new(None),
        }
    }
}

/// A small text file (a key, a token) read again only when it changed ([`ChangedFile`]); none
/// when no file is configured.
struct TextFile(Option<ChangedFile<String>>);

/// The largest key or token file read (an RSA key is a few KiB).
const MAX_KEY_FILE: u64 = 1024 * 1024;

impl TextFile {
    fn new(path: &str) -> Self {
        TextFile((!path.is_empty()).then(|| ChangedFile::new(path, MAX_KEY_FILE)))
    }

    /// The file's content, empty when no file is configured.
    fn read(&self) -> Result<String, PolicyError> {
        let Some(file) = &self.0 else {
            return Ok(String::new());
        };
        file.get(
            |data| Ok(String::from_utf8_lossy(&data).into_owned()),
            |source| PolicyError::File {
                path: file.path().display().to_string(),
                source,
            },
        )
    }
}

/// `jwt_verify_cert` read as a file when a file by that name exists.
fn read_verify_cert(verify_cert: &str) -> Result<Option<Vec<u8>>, PolicyError> {
    if verify_cert.is_empty() {
        return Ok(None);
    }
    match std::fs::read(verify_cert) {
        Ok(d) => Ok(Some(d)),
        // No such file: the value is the key itself, when it can be one (hex); a path that
        // does not exist is named as missing, not parsed as a malformed key.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && verify_cert.trim().chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            Ok(None)
        }
        Err(source) => Err(PolicyError::File {
            path: verify_cert.to_string(),
            source,
        }),
    }
}

impl KeyMaterial for FileKeys {
    /// The provisioning JWT verification key, parsed once and parsed again only when the file
    /// named by `jwt_verify_cert` changes, looked at at most every [`RECHECK`].
    fn verify_key(&self) -> Result<VerifyingKey, PolicyError> {
        if let Ok(cache) = self.verify_key_cache.lock() {
            if let Some((_, k, looked)) = cache.as_ref() {
                if looked.elapsed() < RECHECK {
                    return Ok(k.clone());
                }
            }
        }
        let name = &self.config.jwt_verify_cert;
        let looked = Instant::now();
        let stamp = std::fs::metadata(name).ok().map(|m| file_stamp(&m));
        if let Ok(mut cache) = self.verify_key_cache.lock() {
            if let Some((s, k, seen)) = cache.as_mut() {
                if *s == stamp {
                    *seen = looked;
                    return Ok(k.clone());
                }
            }
        }
        let data = read_verify_cert(name)?;
        let key = policy::verify_key(name, data.as_deref())?;
        if let Ok(mut cache) = self.verify_key_cache.lock() {
            *cache = Some((stamp, key.clone(), looked));
        }
        Ok(key)
    }

    fn signing_key(&self) -> Result<String, PolicyError> {
        self.signing_key.read()
    }

    fn signing_token(&self) -> Result<String, PolicyError> {
        self.signing_token.read()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Arc<Config> {
        Arc::new(
            Config::from_yaml(yaml, "/test/provisioner.yaml")
                .unwrap()
                .config,
        )
    }

    fn hex_key(seed: u8) -> String {
        hex::encode(
            ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
                .verifying_key()
                .to_bytes(),
        )
    }

    fn ed25519(key: VerifyingKey) -> [u8; 32] {
        match key {
            VerifyingKey::Ed25519(k) => k.to_bytes(),
            other => panic!("not an ed25519 key: {other:?}"),
        }
    }

    #[test]
    fn a_rotated_verification_key_file_takes_effect_without_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("signer.pub");
        std::fs::write(&file, hex_key(42)).unwrap();
        let keys = FileKeys::new(config(&format!("jwt_verify_cert: {}\n", file.display())));
        let first = ed25519(keys.verify_key().unwrap());
        assert_eq!(hex::encode(first), hex_key(42));
        // Unchanged file: the cached key.
        assert_eq!(ed25519(keys.verify_key().unwrap()), first);
        // Rotated (a different size, so the change is seen within the file system's timestamp
        // granularity): seen once the last look is older than the recheck window.
        std::fs::write(&file, format!("{}\n", hex_key(1))).unwrap();
        std::thread::sleep(RECHECK);
        assert_eq!(hex::encode(ed25519(keys.verify_key().unwrap())), hex_key(1));
        // Damaged: refused from the next look on, the file named; nothing of it is cached.
        std::fs::write(&file, "not a key").unwrap();
        std::thread::sleep(RECHECK);
        assert!(keys.verify_key().is_err());
        std::fs::write(&file, hex_key(42)).unwrap();
        assert_eq!(
            hex::encode(ed25519(keys.verify_key().unwrap())),
            hex_key(42)
        );
    }

    #[test]
    fn a_verify_cert_that_is_no_file_is_a_hex_key() {
        let keys = FileKeys::new(config(&format!("jwt_verify_cert: {}\n", hex_key(7))));
        assert_eq!(hex::encode(ed25519(keys.verify_key().unwrap())), hex_key(7));
        let none = FileKeys::new(config(""));
        assert!(matches!(none.verify_key(), Err(PolicyError::NoVerifyCert)));
    }

    #[test]
    fn a_missing_verify_cert_file_is_named_as_missing() {
        let keys = FileKeys::new(config("jwt_verify_cert: /etc/choria/prov-signer.pem\n"));
        let e = keys.verify_key().unwrap_err().to_string();
        assert!(
            e.contains("/etc/choria/prov-signer.pem") && e.contains("No such file"),
            "{e}"
        );
        assert!(!e.contains("hex"), "{e}");
    }

    #[test]
    fn signing_key_and_token_changes_are_seen_once_the_recheck_window_passes() {
        let dir = tempfile::tempdir().unwrap();
        let seed = dir.path().join("signer.seed");
        let token = dir.path().join("signer.jwt");
        std::fs::write(&seed, "one").unwrap();
        std::fs::write(&token, "t1").unwrap();
        let keys = FileKeys::new(config(&format!(
            "jwt_signing_key: {}\njwt_signing_token: {}\n",
            seed.display(),
            token.display()
        )));
        assert_eq!(keys.signing_key().unwrap(), "one");
        assert_eq!(keys.signing_token().unwrap(), "t1");
        // Rewritten in place, same size: seen by the times (set apart here, since two writes
        // in one test can share the file system's clock tick).
        let rewrite = |path: &std::path::Path, text: &str, secs: u64| {
            std::fs::write(path, text).unwrap();
            let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs);
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(t)
                .unwrap();
        };
        rewrite(&seed, "two", 1_000_000);
        rewrite(&token, "t2", 1_000_000);
        // Within the window of the last look the files are not looked at.
        assert_eq!(keys.signing_key().unwrap(), "one");
        std::thread::sleep(RECHECK);
        assert_eq!(keys.signing_key().unwrap(), "two");
        assert_eq!(keys.signing_token().unwrap(), "t2");
        // Unchanged: the same content again.
        assert_eq!(keys.signing_key().unwrap(), "two");
        // Replaced by a rename (a new inode), same size.
        let new = dir.path().join("signer.seed.new");
        std::fs::write(&new, "six").unwrap();
        std::fs::rename(&new, &seed).unwrap();
        std::thread::sleep(RECHECK);
        assert_eq!(keys.signing_key().unwrap(), "six");
        std::fs::remove_file(&seed).unwrap();
        std::thread::sleep(RECHECK);
        assert!(matches!(
            keys.signing_key(),
            Err(PolicyError::File { path, .. }) if path == seed.to_string_lossy()
        ));
        let none = FileKeys::new(config(""));
        assert_eq!(none.signing_key().unwrap(), "");
        assert_eq!(none.signing_token().unwrap(), "");
    }
}
