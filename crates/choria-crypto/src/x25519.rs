//! X25519 key agreement as Choria uses it to deliver a private key to a node.
//!
//! A peer public key is used only if it is exactly 32 bytes of hex and the agreement is
//! contributory: a low-order point (0, 1, the order-8 points, their non-canonical encodings...)
//! gives an all-zero shared secret whatever our private key, so anything keyed by it would be
//! keyed by a public value. Such keys are refused with [`EcdhError::LowOrder`], as go-choria's
//! X25519 (Go's `crypto/ecdh`) refuses them.

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

/// The X25519 public key of `private`.
pub fn public_key(private: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(*private)).to_bytes()
}

/// A fresh key pair from the thread's CSPRNG (ChaCha, seeded and reseeded from the operating
/// system) rather than a system call per key: (private, public).
pub fn generate() -> ([u8; 32], [u8; 32]) {
    let secret = x25519_dalek::StaticSecret::random_from_rng(rand::thread_rng());
    let public = x25519_dalek::PublicKey::from(&secret);
    (secret.to_bytes(), public.to_bytes())
}

/// The raw shared secret of `private` and `peer_public`, with no check of the peer's key: all
/// zeros for a low-order point. Use [`contributory_shared_secret`] for any key that came from
/// elsewhere.
pub fn shared_secret(private: &[u8; 32], peer_public: &[u8; 32]) -> [u8; 32] {
    x25519_dalek::StaticSecret::from(*private)
        .diffie_hellman(&x25519_dalek::PublicKey::from(*peer_public))
        .to_bytes()
}

/// The shared secret of `private` and `peer_public` (`what` names the peer's key in the error),
/// refused when the peer's key is a low-order point, i.e. when the exchange is not
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

/// Decodes a peer's public key: exactly 64 hex characters, nothing around them.
pub fn decode_public(what: &'static str, text: &str) -> Result<[u8; 32], EcdhError> {
    let bytes = hex::decode(text).map_err(|_| EcdhError::NotHex { what })?;
    let len = bytes.len();
    <[u8; 32]>::try_from(bytes).map_err(|_| EcdhError::Length { what, len })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    pub(crate) const SERVER_PRIVATE: &str =
        "67e4a9b3934a3030470ed7a30f89eeaf7dab7b492aa9ee02fb864d690b7e6eeb";
    pub(crate) const SERVER_PUBLIC: &str =
        "88a9a0ed27dc93c29466ea2bef99e078342b27e7a1d789fc35a9131f86c3a022";
    const PROV_PRIVATE: &str = "3e150feab1f2c709af9afa28e626f258dbf1b683d3bc35225a9b0489de485870";
    const PROV_PUBLIC: &str = "c25fab933b16b2a4589e2c2d297669b818c82881f2f9bfd08cb8fd298924a41b";
    const SHARED: &str = "53a4887b448755a3f0a0618b289eb2369ec4b2461d44890abdfa3084ef080c55";

    fn h32(s: &str) -> [u8; 32] {
        hex::decode(s).unwrap().try_into().unwrap()
    }

    #[test]
    fn ecdh_matches_the_go_vectors() {
        assert_eq!(hex::encode(public_key(&h32(SERVER_PRIVATE))), SERVER_PUBLIC);
        assert_eq!(hex::encode(public_key(&h32(PROV_PRIVATE))), PROV_PUBLIC);
        assert_eq!(
            hex::encode(shared_secret(&h32(SERVER_PRIVATE), &h32(PROV_PUBLIC))),
            SHARED
        );
        assert_eq!(
            hex::encode(shared_secret(&h32(PROV_PRIVATE), &h32(SERVER_PUBLIC))),
            SHARED
        );
        let (private, public) = generate();
        assert_eq!(public_key(&private), public);
    }

    /// Every 32-byte encoding of a low-order u-coordinate as RFC 7748 reads it (top bit
    /// ignored, value reduced mod p = 2^255 - 19): 0 (order 2), 1 (order 4), the two points of
    /// order 8, p - 1 (order 4), p (= 0) and p + 1 (= 1), each also with the top bit set.
    pub(crate) const LOW_ORDER: [&str; 14] = [
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

    #[test]
    fn low_order_peer_keys_are_refused() {
        for (i, point) in LOW_ORDER.iter().enumerate() {
            // The raw function shows why: every private key gives the all-zero secret.
            for own in [h32(PROV_PRIVATE), h32(SERVER_PRIVATE), [0x5a; 32]] {
                assert_eq!(shared_secret(&own, &h32(point)), [0u8; 32], "{i}");
                assert_eq!(
                    contributory_shared_secret("peer", &own, &h32(point)),
                    Err(EcdhError::LowOrder { what: "peer" }),
                    "{i}"
                );
            }
        }
        assert_eq!(
            contributory_shared_secret("peer", &h32(SERVER_PRIVATE), &h32(PROV_PUBLIC)),
            Ok(h32(SHARED))
        );
    }

    #[test]
    fn peer_keys_must_be_exactly_32_bytes_of_hex() {
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
            assert_eq!(decode_public(what, &text), Err(want));
        }
        assert_eq!(decode_public(what, SERVER_PUBLIC), Ok(h32(SERVER_PUBLIC)));
        assert_eq!(
            decode_public(what, &SERVER_PUBLIC.to_uppercase()),
            Ok(h32(SERVER_PUBLIC))
        );
    }
}
