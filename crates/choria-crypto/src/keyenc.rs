//! Delivering a private key to a node: X25519 key agreement with the node's `ecdh_public`, then
//! the legacy PEM encryption (RFC 1423: AES-CBC, key from OpenSSL's `EVP_BytesToKey` with MD5
//! and the first 8 bytes of the IV as salt) that go-choria decrypts with Go's
//! `x509.DecryptPEMBlock`. [`encrypt_private_key`] is the provisioner's side,
//! [`decrypt_private_key`] the node's.

use aes::cipher::{block_padding::Pkcs7, BlockDecryptMut as _, BlockEncryptMut as _, KeyIvInit};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use md5::{Digest as _, Md5};
use rand::RngCore as _;

use crate::x25519::{self, EcdhError};

/// Why a legacy encrypted PEM block could not be decrypted. The messages are those of Go's
/// `x509.DecryptPEMBlock` where it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LegacyPemError {
    /// The text holds no PEM block.
    #[error("not a PEM block")]
    NotPem,
    /// The block has no `DEK-Info` header.
    #[error("key is not encrypted")]
    NotEncrypted,
    /// The `DEK-Info` header is not `<cipher>,<iv>`.
    #[error("x509: malformed DEK-Info header")]
    MalformedDekInfo,
    /// The cipher is not AES-128/192/256-CBC.
    #[error("x509: unknown encryption mode")]
    UnknownCipher,
    /// The IV is not hexadecimal.
    #[error("encoding/hex: {0}")]
    IvNotHex(String),
    /// The IV is not one AES block.
    #[error("x509: incorrect IV size")]
    IvSize,
    /// The ciphertext is empty or not a whole number of blocks.
    #[error("x509: encrypted PEM data is not a multiple of the block size")]
    BlockSize,
    /// The padding is wrong after decryption: the password is not the one used.
    #[error("x509: decryption password incorrect")]
    Password,
}

/// Why a private key could not be encrypted for, or decrypted by, a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyEncError {
    /// There is no key.
    #[error("no key to encrypt")]
    NoKey,
    /// The node sent no X25519 public key.
    #[error("private key received from helper but server did not start Diffie-Hellman exchange")]
    NoExchange,
    /// The key is not PEM.
    #[error("bad key received")]
    BadKey,
    /// The peer's X25519 key is refused.
    #[error(transparent)]
    Ecdh(#[from] EcdhError),
    /// The encrypted block does not decrypt.
    #[error(transparent)]
    Pem(#[from] LegacyPemError),
}

/// The result of [`encrypt_private_key`].
#[derive(Debug, Clone)]
pub struct EncryptedKey {
    /// The encrypted `RSA PRIVATE KEY` PEM block, sent as `key`.
    pub pem: String,
    /// The provisioner's X25519 public key (64 hex), sent as `ecdh_public`.
    pub ecdh_public: String,
}

/// `EVP_BytesToKey(cipher, MD5, salt, password, count 1)`, the first `len` key bytes.
fn derive_key(password: &[u8], salt: &[u8], len: usize) -> Vec<u8> {
    let mut key = Vec::with_capacity(48);
    let mut prev: Vec<u8> = Vec::new();
    while key.len() < len {
        prev = Md5::new()
            .chain_update(&prev)
            .chain_update(password)
            .chain_update(salt)
            .finalize()
            .to_vec();
        key.extend_from_slice(&prev);
    }
    key.truncate(len);
    key
}

/// Encrypts `der` as a legacy `RSA PRIVATE KEY` PEM block with AES-256-CBC, `password` and
/// `iv`, 64-column lines.
pub fn encrypt_legacy_pem(der: &[u8], password: &[u8], iv: &[u8; 16]) -> String {
    let key = derive_key(password, &iv[..8], 32);
    let mut key32 = [0u8; 32];
    key32.copy_from_slice(&key);
    let ct = cbc::Encryptor::<aes::Aes256>::new(&key32.into(), iv.into())
        .encrypt_padded_vec_mut::<Pkcs7>(der);
    let body = STANDARD.encode(ct);
    let mut pem = String::with_capacity(body.len() + 160);
    pem.push_str("-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,");
    pem.push_str(&hex::encode(iv));
    pem.push_str("\n\n");
    for chunk in body.as_bytes().chunks(64) {
        pem.extend(chunk.iter().map(|&b| char::from(b)));
        pem.push('\n');
    }
    pem.push_str("-----END RSA PRIVATE KEY-----\n");
    pem
}

/// Decrypts the first PEM block of `text` (AES-128/192/256-CBC, as Go's `x509.DecryptPEMBlock`)
/// with `password`, returning its label and the plaintext DER.
pub fn decrypt_legacy_pem_block(
    text: &str,
    password: &[u8],
) -> Result<(String, Vec<u8>), LegacyPemError> {
    let block = ::pem::parse(text).map_err(|_| LegacyPemError::NotPem)?;
    let dek = block
        .headers()
        .get("DEK-Info")
        .ok_or(LegacyPemError::NotEncrypted)?;
    let (cipher, iv_hex) = dek
        .split_once(',')
        .ok_or(LegacyPemError::MalformedDekInfo)?;
    let key_len = match cipher {
        "AES-128-CBC" => 16,
        "AES-192-CBC" => 24,
        "AES-256-CBC" => 32,
        _ => return Err(LegacyPemError::UnknownCipher),
    };
    let iv = hex::decode(iv_hex).map_err(|e| LegacyPemError::IvNotHex(e.to_string()))?;
    let iv: [u8; 16] = iv.try_into().map_err(|_| LegacyPemError::IvSize)?;
    let key = derive_key(password, &iv[..8], key_len);
    let data = block.contents();
    if data.is_empty() || data.len() % 16 != 0 {
        return Err(LegacyPemError::BlockSize);
    }
    let plain = match key_len {
        16 => cbc::Decryptor::<aes::Aes128>::new_from_slices(&key, &iv)
            .map_err(|_| LegacyPemError::Password)?
            .decrypt_padded_vec_mut::<Pkcs7>(data),
        24 => cbc::Decryptor::<aes::Aes192>::new_from_slices(&key, &iv)
            .map_err(|_| LegacyPemError::Password)?
            .decrypt_padded_vec_mut::<Pkcs7>(data),
        _ => cbc::Decryptor::<aes::Aes256>::new_from_slices(&key, &iv)
            .map_err(|_| LegacyPemError::Password)?
            .decrypt_padded_vec_mut::<Pkcs7>(data),
    }
    .map_err(|_| LegacyPemError::Password)?;
    Ok((block.tag().to_string(), plain))
}

/// [`decrypt_legacy_pem_block`], the plaintext DER only.
pub fn decrypt_legacy_pem(text: &str, password: &[u8]) -> Result<Vec<u8>, LegacyPemError> {
    decrypt_legacy_pem_block(text, password).map(|(_, der)| der)
}

/// Encrypts the first PEM block of `key_pem` for the node whose `jwt` reply carried
/// `server_ecdh_public` (hex), with a fresh X25519 key pair and a fresh IV.
pub fn encrypt_private_key(
    key_pem: &str,
    server_ecdh_public: &str,
) -> Result<EncryptedKey, KeyEncError> {
    let mut own = [0u8; 32];
    let mut iv = [0u8; 16];
    let mut rng = rand::thread_rng();
    rng.fill_bytes(&mut own);
    rng.fill_bytes(&mut iv);
    encrypt_private_key_with(key_pem, server_ecdh_public, &own, &iv)
}

/// [`encrypt_private_key`] with the provisioner's X25519 private key and the IV given, for
/// reproducible tests.
pub fn encrypt_private_key_with(
    key_pem: &str,
    server_ecdh_public: &str,
    own_private: &[u8; 32],
    iv: &[u8; 16],
) -> Result<EncryptedKey, KeyEncError> {
    if key_pem.is_empty() {
        return Err(KeyEncError::NoKey);
    }
    if server_ecdh_public.is_empty() {
        return Err(KeyEncError::NoExchange);
    }
    let block = ::pem::parse(key_pem).map_err(|_| KeyEncError::BadKey)?;
    const WHAT: &str = "server ecdh public key";
    let server_public = x25519::decode_public(WHAT, server_ecdh_public)?;
    let secret = x25519::contributory_shared_secret(WHAT, own_private, &server_public)?;
    Ok(EncryptedKey {
        pem: encrypt_legacy_pem(block.contents(), &secret, iv),
        ecdh_public: hex::encode(x25519::public_key(own_private)),
    })
}

/// The node's side: decrypts an encrypted PEM block with the node's X25519 private key and the
/// provisioner's `ecdh_public` (hex), returning the plaintext DER.
pub fn decrypt_private_key(
    encrypted_pem: &str,
    node_private: &[u8; 32],
    provisioner_ecdh_public: &str,
) -> Result<Vec<u8>, KeyEncError> {
    const WHAT: &str = "provisioner ecdh public key";
    let provisioner_public = x25519::decode_public(WHAT, provisioner_ecdh_public)?;
    let secret = x25519::contributory_shared_secret(WHAT, node_private, &provisioner_public)?;
    Ok(decrypt_legacy_pem(encrypted_pem, &secret)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::x25519::tests::{LOW_ORDER, SERVER_PRIVATE, SERVER_PUBLIC};

    fn h32(s: &str) -> [u8; 32] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    fn node_key() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/node-rsa.pem");
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn key_derivation_is_evp_bytes_to_key_md5() {
        // `openssl enc -aes-256-cbc -md md5 -P -pass pass:password -S 0102030405060708`.
        let k = derive_key(b"password", &[1, 2, 3, 4, 5, 6, 7, 8], 32);
        let d1 = Md5::digest(b"password\x01\x02\x03\x04\x05\x06\x07\x08");
        let d2 = Md5::new()
            .chain_update(d1)
            .chain_update(b"password\x01\x02\x03\x04\x05\x06\x07\x08")
            .finalize();
        assert_eq!(&k[..16], d1.as_slice());
        assert_eq!(&k[16..], d2.as_slice());
        assert_eq!(
            derive_key(b"password", &[1, 2, 3, 4, 5, 6, 7, 8], 24),
            &k[..24]
        );
    }

    #[test]
    fn low_order_peer_keys_are_refused_on_both_sides() {
        let key = node_key();
        for point in LOW_ORDER {
            let err = encrypt_private_key(&key, point).unwrap_err().to_string();
            assert_eq!(
                err,
                "invalid server ecdh public key: a low-order X25519 point (the shared secret \
                 would be all zeros)",
                "{point}"
            );
            let err = decrypt_private_key("unused", &h32(SERVER_PRIVATE), point)
                .unwrap_err()
                .to_string();
            assert!(err.contains("provisioner ecdh public key") && err.contains("low-order"));
        }
        assert!(encrypt_private_key(&key, SERVER_PUBLIC).is_ok());
    }

    #[test]
    fn peer_key_errors_name_the_key() {
        let key = node_key();
        assert_eq!(
            encrypt_private_key(&key, &SERVER_PUBLIC[..62])
                .unwrap_err()
                .to_string(),
            "invalid server ecdh public key: 31 bytes, expected 32 (64 hex characters)"
        );
        assert_eq!(
            encrypt_private_key(&key, "").unwrap_err(),
            KeyEncError::NoExchange
        );
        assert_eq!(
            encrypt_private_key("", SERVER_PUBLIC).unwrap_err(),
            KeyEncError::NoKey
        );
        assert_eq!(
            encrypt_private_key("junk", SERVER_PUBLIC).unwrap_err(),
            KeyEncError::BadKey
        );
    }

    #[test]
    fn round_trip_and_go_errors() {
        let der = ::pem::parse(node_key()).unwrap().contents().to_vec();
        let pem = encrypt_legacy_pem(&der, b"secret", &[9u8; 16]);
        assert!(pem.contains("DEK-Info: AES-256-CBC,09090909090909090909090909090909\n"));
        assert_eq!(decrypt_legacy_pem(&pem, b"secret").unwrap(), der);
        let (label, _) = decrypt_legacy_pem_block(&pem, b"secret").unwrap();
        assert_eq!(label, "RSA PRIVATE KEY");
        assert_eq!(
            decrypt_legacy_pem(&pem, b"other").unwrap_err(),
            LegacyPemError::Password
        );
        assert_eq!(
            decrypt_legacy_pem("x", b"").unwrap_err(),
            LegacyPemError::NotPem
        );
        assert_eq!(
            decrypt_legacy_pem(&crate::pem::encode("RSA PRIVATE KEY", der.clone()), b"")
                .unwrap_err(),
            LegacyPemError::NotEncrypted
        );
        let des = pem.replace("AES-256-CBC", "DES-EDE3-CBC");
        assert_eq!(
            decrypt_legacy_pem(&des, b"secret").unwrap_err(),
            LegacyPemError::UnknownCipher
        );
        let short = pem.replace("09090909090909090909090909090909", "0909");
        assert_eq!(
            decrypt_legacy_pem(&short, b"secret").unwrap_err(),
            LegacyPemError::IvSize
        );
    }
}
