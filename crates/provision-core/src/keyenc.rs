//! Encrypting a private key for a node: X25519 key agreement with the node's `ecdh_public`, then
//! the legacy PEM encryption (AES-256-CBC, key from OpenSSL's `EVP_BytesToKey` with MD5) that
//! go-choria decrypts. [`decrypt_private_key`] is the node's side, for tests and simulators.
//!
//! A peer public key is used only if it is exactly 32 bytes of hex and the key agreement is
//! contributory: a low-order point (0, 1, the order-8 points, their non-canonical encodings...)
//! gives an all-zero shared secret whatever our private key, so the private key would be
//! encrypted under a public value. Such keys are refused with [`EcdhError`], as go-choria's
//! X25519 refuses them.

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

/// Why an X25519 peer public key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EcdhError {
    /// The key is not hexadecimal.
    #[error("invalid {what}: not hexadecimal")]
    NotHex {
        /// Which key (`server ecdh public key`...).
        what: &'static str,
    },
    /// The key does not decode to exactly 32 bytes.
    #[error("invalid {what}: {len} bytes, expected 32 (64 hex characters)")]
    Length {
        /// Which key.
        what: &'static str,
        /// The decoded length.
        len: usize,
    },
    /// The key is a low-order point: the shared secret would be all zeros, a public value.
    #[error("invalid {what}: a low-order X25519 point (the shared secret would be all zeros)")]
    LowOrder {
        /// Which key.
        what: &'static str,
    },
}

impl From<EcdhError> for PolicyError {
    fn from(e: EcdhError) -> Self {
        PolicyError::Key(e.to_string())
    }
}

/// The raw X25519 shared secret of `private` and `peer_public`, with no check of the peer's
/// key: all zeros for a low-order point. Use [`contributory_shared_secret`] for any key that
/// came from elsewhere.
pub fn ecdh_shared_secret(private: &[u8; 32], peer_public: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::StaticSecret::from(*private)
        .diffie_hellman(&x25519_dalek::PublicKey::from(*peer_public))
        .to_bytes()
}

/// The X25519 shared secret of `private` and `peer_public` (`what` names the peer's key in the
/// error), refused when the peer's key is a low-order point, i.e. when the exchange is not
/// contributory.
pub fn contributory_shared_secret(
    what: &'static str,
    private: &[u8; 32],
    peer_public: &[u8; 32],
) -> Result<[u8; 32], EcdhError> {
    let shared = x25519_dalek::StaticSecret::from(*private)
        .diffie_hellman(&x25519_dalek::PublicKey::from(*peer_public));
    if !shared.was_contributory() {
        return Err(EcdhError::LowOrder { what });
    }
    Ok(shared.to_bytes())
}

/// Decodes a peer's X25519 public key: exactly 64 hex characters, nothing around them.
pub fn decode_ecdh_public(what: &'static str, text: &str) -> Result<[u8; 32], EcdhError> {
    let bytes = hex::decode(text).map_err(|_| EcdhError::NotHex { what })?;
    let len = bytes.len();
    <[u8; 32]>::try_from(bytes).map_err(|_| EcdhError::Length { what, len })
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
    const WHAT: &str = "server ecdh public key";
    let server_public = decode_ecdh_public(WHAT, server_ecdh_public)?;
    let secret = contributory_shared_secret(WHAT, own_private, &server_public)?;
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
    const WHAT: &str = "provisioner ecdh public key";
    let provisioner_public = decode_ecdh_public(WHAT, provisioner_ecdh_public)?;
    let secret = contributory_shared_secret(WHAT, node_private, &provisioner_public)?;
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

    /// Every 32-byte encoding of a low-order u-coordinate as RFC 7748 reads it (top bit
    /// ignored, value reduced mod p = 2^255 - 19): 0 (order 2), 1 (order 4), the two points of
    /// order 8, p - 1 (order 4), p (= 0) and p + 1 (= 1), each also with the top bit set.
    /// The test shows each one gives the all-zero secret for several private keys.
    const LOW_ORDER: [&str; 14] = [
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "0100000000000000000000000000000000000000000000000000000000000000",
        "0100000000000000000000000000000000000000000000000000000000000080",
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
        "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b880",
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
        "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f11d7",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
    ];

    fn node_key() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/node-rsa.pem");
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn low_order_peer_keys_are_refused() {
        let key = node_key();
        for (i, point) in LOW_ORDER.iter().enumerate() {
            // The raw function shows why: every private key gives the all-zero secret.
            for own in [h32(PROV_PRIVATE), h32(SERVER_PRIVATE), [0x5a; 32]] {
                assert_eq!(ecdh_shared_secret(&own, &h32(point)), [0u8; 32], "{i}");
                assert_eq!(
                    contributory_shared_secret("peer", &own, &h32(point)),
                    Err(EcdhError::LowOrder { what: "peer" }),
                    "{i}"
                );
            }
            let err = encrypt_private_key(&key, point).unwrap_err().to_string();
            assert_eq!(
                err,
                "invalid server ecdh public key: a low-order X25519 point (the shared secret \
                 would be all zeros)",
                "{i}: {point}"
            );
            let err = decrypt_private_key("unused", &h32(SERVER_PRIVATE), point)
                .unwrap_err()
                .to_string();
            assert!(err.contains("provisioner ecdh public key") && err.contains("low-order"));
        }
        // An ordinary key on either side is accepted.
        assert!(encrypt_private_key(&key, SERVER_PUBLIC).is_ok());
        assert_eq!(
            contributory_shared_secret("peer", &h32(SERVER_PRIVATE), &h32(PROV_PUBLIC)),
            Ok(h32(SHARED))
        );
    }

    #[test]
    fn peer_keys_must_be_exactly_32_bytes_of_hex() {
        let key = node_key();
        let what = "server ecdh public key";
        let cases = [
            ("zz".repeat(32), EcdhError::NotHex { what }),
            (format!(" {SERVER_PUBLIC}"), EcdhError::NotHex { what }),
            (format!("{SERVER_PUBLIC}\n"), EcdhError::NotHex { what }),
            (SERVER_PUBLIC[..63].to_string(), EcdhError::NotHex { what }),
            (
                SERVER_PUBLIC[..62].to_string(),
                EcdhError::Length { what, len: 31 },
            ),
            (
                format!("{SERVER_PUBLIC}00"),
                EcdhError::Length { what, len: 33 },
            ),
            ("a".repeat(5000), EcdhError::Length { what, len: 2500 }),
        ];
        for (text, want) in cases {
            assert_eq!(decode_ecdh_public(what, &text), Err(want.clone()));
            assert_eq!(
                encrypt_private_key(&key, &text).unwrap_err().to_string(),
                want.to_string()
            );
        }
        assert_eq!(
            decode_ecdh_public(what, SERVER_PUBLIC),
            Ok(h32(SERVER_PUBLIC))
        );
        assert_eq!(
            decode_ecdh_public(what, &SERVER_PUBLIC.to_uppercase()),
            Ok(h32(SERVER_PUBLIC))
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
