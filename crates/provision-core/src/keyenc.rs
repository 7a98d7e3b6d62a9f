//! Encrypting a private key for a node: X25519 key agreement with the node's `ecdh_public`, then
//! the legacy PEM encryption (AES-256-CBC, key from OpenSSL's `EVP_BytesToKey` with MD5) that
//! go-choria decrypts. [`decrypt_private_key`] is the node's side, for tests and simulators.

use aes::cipher::{block_padding::Pkcs7, BlockDecryptMut, BlockEncryptMut, KeyIvInit};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use md5::{Digest, Md5};
use rand::RngCore;

use crate::policy::PolicyError;

type Enc = cbc::Encryptor<aes::Aes256>;
type Dec = cbc::Decryptor<aes::Aes256>;

/// The result of [`encrypt_private_key`].
#[derive(Debug, Clone)]
pub struct EncryptedKey {
    /// The encrypted `RSA PRIVATE KEY` PEM block, sent as `key`.
    pub pem: String,
    /// The provisioner's X25519 public key (64 hex), sent as `ecdh_public`.
    pub ecdh_public: String,
}

/// The X25519 public key of `private`.
pub fn ecdh_public(private: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(*private)).to_bytes()
}

/// The raw X25519 shared secret of `private` and `peer_public`.
pub fn ecdh_shared_secret(private: &[u8; 32], peer_public: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::StaticSecret::from(*private)
        .diffie_hellman(&x25519_dalek::PublicKey::from(*peer_public))
        .to_bytes()
}

fn decode_hex32(what: &str, text: &str) -> Result<[u8; 32], PolicyError> {
    hex::decode(text.trim())
        .ok()
        .and_then(|v| <[u8; 32]>::try_from(v).ok())
        .ok_or_else(|| PolicyError::Key(format!("invalid {what}: expected 64 hex characters")))
}

/// `EVP_BytesToKey(AES-256, MD5, salt, password, count 1)`, key part only.
fn derive_key(password: &[u8], salt: &[u8]) -> [u8; 32] {
    let d1 = Md5::new()
        .chain_update(password)
        .chain_update(salt)
        .finalize();
    let d2 = Md5::new()
        .chain_update(d1)
        .chain_update(password)
        .chain_update(salt)
        .finalize();
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&d1);
    key[16..].copy_from_slice(&d2);
    key
}

/// Encrypts the first PEM block of `key_pem` for the node whose `jwt` reply carried
/// `server_ecdh_public` (hex), with a fresh X25519 key pair and a fresh IV.
pub fn encrypt_private_key(
    key_pem: &str,
    server_ecdh_public: &str,
) -> Result<EncryptedKey, PolicyError> {
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
) -> Result<EncryptedKey, PolicyError> {
    if key_pem.is_empty() {
        return Err(PolicyError::Key("no key to encrypt".into()));
    }
    if server_ecdh_public.is_empty() {
        return Err(PolicyError::Key(
            "private key received from helper but server did not start Diffie-Hellman exchange"
                .into(),
        ));
    }
    let block = pem::parse(key_pem).map_err(|_| PolicyError::Key("bad key received".into()))?;
    let server_public = decode_hex32("server ecdh public key", server_ecdh_public)?;
    let secret = ecdh_shared_secret(own_private, &server_public);
    let key = derive_key(&secret, &iv[..8]);
    let ct = Enc::new(&key.into(), iv.into()).encrypt_padded_vec_mut::<Pkcs7>(block.contents());
    let body = STANDARD.encode(ct);
    let mut pem = String::with_capacity(body.len() + 160);
    pem.push_str("-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,");
    pem.push_str(&hex::encode(iv));
    pem.push_str("\n\n");
    for chunk in body.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END RSA PRIVATE KEY-----\n");
    Ok(EncryptedKey {
        pem,
        ecdh_public: hex::encode(ecdh_public(own_private)),
    })
}

/// The node's side: decrypts an encrypted PEM block with the node's X25519 private key and the
/// provisioner's `ecdh_public` (hex), returning the plaintext DER.
pub fn decrypt_private_key(
    encrypted_pem: &str,
    node_private: &[u8; 32],
    provisioner_ecdh_public: &str,
) -> Result<Vec<u8>, PolicyError> {
    let provisioner_public = decode_hex32("provisioner ecdh public key", provisioner_ecdh_public)?;
    let secret = ecdh_shared_secret(node_private, &provisioner_public);
    decrypt_legacy_pem(encrypted_pem, &secret)
}

/// Decrypts a legacy encrypted PEM block (AES-256-CBC only) with `password`.
pub fn decrypt_legacy_pem(encrypted_pem: &str, password: &[u8]) -> Result<Vec<u8>, PolicyError> {
    let mut iv_hex = None;
    let mut body = String::new();
    let mut in_block = false;
    for line in encrypted_pem.lines().map(str::trim) {
        if line.starts_with("-----BEGIN ") {
            in_block = true;
            continue;
        }
        if line.starts_with("-----END ") {
            break;
        }
        if !in_block || line.is_empty() {
            continue;
        }
        if let Some(v) = line.strip_prefix("DEK-Info:") {
            let (alg, iv) = v
                .trim()
                .split_once(',')
                .ok_or_else(|| PolicyError::Key("malformed DEK-Info header".into()))?;
            if alg != "AES-256-CBC" {
                return Err(PolicyError::Key(format!("unsupported PEM cipher {alg}")));
            }
            iv_hex = Some(iv.to_string());
        } else if line.contains(':') {
            continue;
        } else {
            body.push_str(line);
        }
    }
    let iv_hex = iv_hex.ok_or_else(|| PolicyError::Key("key is not encrypted".into()))?;
    let iv: [u8; 16] = hex::decode(&iv_hex)
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| PolicyError::Key("invalid IV in DEK-Info header".into()))?;
    let ct = STANDARD
        .decode(body)
        .map_err(|e| PolicyError::Key(format!("invalid PEM body: {e}")))?;
    let key = derive_key(password, &iv[..8]);
    Dec::new(&key.into(), &iv.into())
        .decrypt_padded_vec_mut::<Pkcs7>(&ct)
        .map_err(|_| PolicyError::Key("decryption password incorrect".into()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SERVER_PRIVATE: &str = "67e4a9b3934a3030470ed7a30f89eeaf7dab7b492aa9ee02fb864d690b7e6eeb";
    const SERVER_PUBLIC: &str = "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022";
    const PROV_PRIVATE: &str = "3e150feab1f2c709af9afa28e626f258dbf1b683d3bc35225a9b0489de485870";
    const PROV_PUBLIC: &str = "c25fab933b16b2a4589e2c2d297669b818c82881f2f9bfd08cb8fd298924a41b";
    const SHARED: &str = "53a4887b448755a3f0a0618b289eb2369ec4b2461d44890abdfa3084ef080c55";

    fn h32(s: &str) -> [u8; 32] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    #[test]
    fn ecdh_matches_the_go_vectors() {
        assert_eq!(
            hex::encode(ecdh_public(&h32(SERVER_PRIVATE))),
            SERVER_PUBLIC
        );
        assert_eq!(hex::encode(ecdh_public(&h32(PROV_PRIVATE))), PROV_PUBLIC);
        assert_eq!(
            hex::encode(ecdh_shared_secret(&h32(SERVER_PRIVATE), &h32(PROV_PUBLIC))),
            SHARED
        );
        assert_eq!(
            hex::encode(ecdh_shared_secret(&h32(PROV_PRIVATE), &h32(SERVER_PUBLIC))),
            SHARED
        );
    }

    #[test]
    fn key_derivation_is_evp_bytes_to_key_md5() {
        // `openssl enc -aes-256-cbc -md md5 -P -pass pass:password -S 0102030405060708`.
        let k = derive_key(b"password", &[1, 2, 3, 4, 5, 6, 7, 8]);
        let d1 = Md5::digest(b"password\x01\x02\x03\x04\x05\x06\x07\x08");
        assert_eq!(&k[..16], d1.as_slice());
    }
}
