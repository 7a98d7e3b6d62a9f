//! The ed25519 proof of possession a node gives in its `gen25519` reply: the signature of the
//! provisioner's nonce (its ASCII text) with the key the node returns.

use ed25519_dalek::Signer as _;

/// Why a nonce proof was refused. The messages are the Go provisioner's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NonceError {
    /// No public key in the reply.
    #[error("no public key received")]
    NoPublicKey,
    /// No signature in the reply.
    #[error("no signature received")]
    NoSignature,
    /// The public key is not hexadecimal or not a valid ed25519 point.
    #[error("invalid public key received")]
    InvalidPublicKey,
    /// The public key is not 32 bytes.
    #[error("invalid public key received: wrong length")]
    PublicKeyLength,
    /// The signature is not hexadecimal.
    #[error("invalid signature")]
    InvalidSignature,
    /// The signature does not verify (strictly) over the nonce.
    #[error("invalid nonce signature")]
    BadSignature,
}

impl NonceError {
    /// The message, as a static string.
    pub fn message(self) -> &'static str {
        match self {
            NonceError::NoPublicKey => "no public key received",
            NonceError::NoSignature => "no signature received",
            NonceError::InvalidPublicKey => "invalid public key received",
            NonceError::PublicKeyLength => "invalid public key received: wrong length",
            NonceError::InvalidSignature => "invalid signature",
            NonceError::BadSignature => "invalid nonce signature",
        }
    }
}

/// Checks a `gen25519` reply: the signature (hex) over the nonce's text must verify strictly
/// with the returned public key (hex). Unlike the Go code a key of the wrong length is an
/// error, not a crash.
pub fn verify_nonce_signature(
    nonce: &str,
    public_key_hex: &str,
    signature_hex: &str,
) -> Result<(), NonceError> {
    let (vk, sig) = decode_proof(public_key_hex, signature_hex)?;
    verify_strict(nonce, &vk, &sig)
}

/// One `gen25519` reply to check with others: the nonce the provisioner sent and the public key
/// and signature (hex) the node returned.
#[derive(Debug, Clone, Copy)]
pub struct NonceProof<'a> {
    /// The nonce's text, as sent.
    pub nonce: &'a str,
    /// The node's public key, hex.
    pub public_key_hex: &'a str,
    /// The node's signature of the nonce, hex.
    pub signature_hex: &'a str,
}

/// Checks many `gen25519` replies at once and answers for each, in order, exactly what
/// [`verify_nonce_signature`] answers for it.
///
/// The proofs that decode are checked together with one multiscalar multiplication (about half
/// the cost of checking them one by one from eight proofs on), each scaled by a fresh random
/// 128-bit factor so that no invalid proof can cancel another. Before that every proof passes the
/// checks of a strict verification: a canonical `s`, a canonical `R` that decodes, and neither
/// `R` nor the key of small order. When the batch equation fails, every proof in it is checked
/// on its own, so a bad proof costs its sender a refusal and the batch one more multiplication,
/// never a wrong answer for its neighbours.
///
/// The one difference a batch can make is for a signature whose `R` carries a small torsion
/// component that the random factors happen to cancel: a single check refuses it, a batch may
/// not. Only the holder of the key's private scalar can make such a signature, so it still proves
/// possession of the key, which is all a nonce proof is for.
pub fn verify_nonce_signatures(proofs: &[NonceProof<'_>]) -> Vec<Result<(), NonceError>> {
    let mut results: Vec<Result<(), NonceError>> = Vec::with_capacity(proofs.len());
    let mut decoded = Vec::with_capacity(proofs.len());
    for (i, p) in proofs.iter().enumerate() {
        match decode_proof(p.public_key_hex, p.signature_hex) {
            Ok((vk, sig)) => {
                results.push(Ok(()));
                decoded.push((i, vk, sig));
            }
            Err(e) => results.push(Err(e)),
        }
    }
    if decoded.len() == 1 {
        for (i, vk, sig) in &decoded {
            results[*i] = verify_strict(proofs[*i].nonce, vk, sig);
        }
        return results;
    }
    let mut terms = Vec::with_capacity(decoded.len());
    for (i, vk, sig) in &decoded {
        match batch_term(proofs[*i].nonce, vk, sig) {
            Some(t) => terms.push(t),
            None => results[*i] = Err(NonceError::BadSignature),
        }
    }
    if !batch_holds(&terms) {
        for (i, vk, sig) in &decoded {
            if results[*i].is_ok() {
                results[*i] = verify_strict(proofs[*i].nonce, vk, sig);
            }
        }
    }
    results
}

fn decode_proof(
    public_key_hex: &str,
    signature_hex: &str,
) -> Result<(ed25519_dalek::VerifyingKey, ed25519_dalek::Signature), NonceError> {
    if public_key_hex.is_empty() {
        return Err(NonceError::NoPublicKey);
    }
    if signature_hex.is_empty() {
        return Err(NonceError::NoSignature);
    }
    let pk = hex::decode(public_key_hex).map_err(|_| NonceError::InvalidPublicKey)?;
    let sig = hex::decode(signature_hex).map_err(|_| NonceError::InvalidSignature)?;
    let pk: [u8; 32] = pk.try_into().map_err(|_| NonceError::PublicKeyLength)?;
    let vk =
        ed25519_dalek::VerifyingKey::from_bytes(&pk).map_err(|_| NonceError::InvalidPublicKey)?;
    let sig = ed25519_dalek::Signature::from_slice(&sig).map_err(|_| NonceError::BadSignature)?;
    Ok((vk, sig))
}

fn verify_strict(
    nonce: &str,
    vk: &ed25519_dalek::VerifyingKey,
    sig: &ed25519_dalek::Signature,
) -> Result<(), NonceError> {
    vk.verify_strict(nonce.as_bytes(), sig)
        .map_err(|_| NonceError::BadSignature)
}

/// One proof's part of the batch equation `[s]B = R + [k]A`, with `k = H(R || A || nonce)`;
/// `None` where a strict verification refuses the proof whatever the equation says.
struct BatchTerm {
    r: curve25519_dalek::EdwardsPoint,
    a: curve25519_dalek::EdwardsPoint,
    s: curve25519_dalek::Scalar,
    k: curve25519_dalek::Scalar,
}

fn batch_term(
    nonce: &str,
    vk: &ed25519_dalek::VerifyingKey,
    sig: &ed25519_dalek::Signature,
) -> Option<BatchTerm> {
    use curve25519_dalek::edwards::CompressedEdwardsY;
    use sha2::Digest as _;
    let r_bytes = sig.r_bytes();
    if !canonical_y(r_bytes) {
        return None;
    }
    let s = Option::<curve25519_dalek::Scalar>::from(
        curve25519_dalek::Scalar::from_canonical_bytes(*sig.s_bytes()),
    )?;
    let r = CompressedEdwardsY(*r_bytes).decompress()?;
    let a = curve25519_dalek::EdwardsPoint::from(*vk);
    if r.is_small_order() || a.is_small_order() {
        return None;
    }
    let mut h = sha2::Sha512::new();
    h.update(r_bytes);
    h.update(vk.as_bytes());
    h.update(nonce.as_bytes());
    let k = curve25519_dalek::Scalar::from_bytes_mod_order_wide(&h.finalize().into());
    Some(BatchTerm { r, a, s, k })
}

/// Whether a compressed point's y coordinate is below the field's prime (2^255 - 19): a strict
/// verification compares `R` as its canonical encoding, so a non-canonical one never verifies.
fn canonical_y(bytes: &[u8; 32]) -> bool {
    let top = bytes[31] & 0x7f;
    !(top == 0x7f && bytes[1..31].iter().all(|b| *b == 0xff) && bytes[0] >= 0xed)
}

/// `[-sum(z s)]B + sum(z R) + sum(z k A) == 0` for fresh random 128-bit odd `z`.
fn batch_holds(terms: &[BatchTerm]) -> bool {
    use curve25519_dalek::traits::{IsIdentity as _, VartimeMultiscalarMul as _};
    use rand::RngCore as _;
    if terms.is_empty() {
        return true;
    }
    let mut rng = rand::thread_rng();
    let mut scalars = Vec::with_capacity(2 * terms.len() + 1);
    let mut points = Vec::with_capacity(2 * terms.len() + 1);
    let mut b = curve25519_dalek::Scalar::ZERO;
    for t in terms {
        let mut z = [0u8; 32];
        rng.fill_bytes(&mut z[..16]);
        z[0] |= 1;
        let z = curve25519_dalek::Scalar::from_bytes_mod_order(z);
        b += z * t.s;
        scalars.push(z);
        points.push(t.r);
        scalars.push(z * t.k);
        points.push(t.a);
    }
    scalars.push(-b);
    points.push(curve25519_dalek::constants::ED25519_BASEPOINT_POINT);
    curve25519_dalek::EdwardsPoint::vartime_multiscalar_mul(scalars, points).is_identity()
}

/// The node's side: `(public key, signature)` as hex for `nonce` signed with `key`.
pub fn sign_nonce(key: &ed25519_dalek::SigningKey, nonce: &[u8]) -> (String, String) {
    (
        hex::encode(key.verifying_key().to_bytes()),
        hex::encode(key.sign(nonce).to_bytes()),
    )
}

/// A node's ed25519 key with the commitment of its first nonce signature made in advance.
///
/// An ed25519 signature is `(R, s)` with `R = [r]B` and `s = r + H(R || A || M) a`; the
/// verifier cannot tell how `r` was chosen, only that the equation holds. The standard signer
/// derives `r` from the key and the message; this one draws the first `r` at random when it is
/// made (the one costly multiplication, `[r]B`), so the first signature costs a hash and two
/// scalar operations. The prepared `r` is used once: every later signature is the standard
/// one, so no `r` ever signs two messages.
pub struct PreparedSigner {
    key: ed25519_dalek::SigningKey,
    r: curve25519_dalek::Scalar,
    big_r: [u8; 32],
    used: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PreparedSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedSigner")
            .field(
                "public_key",
                &hex::encode(self.key.verifying_key().as_bytes()),
            )
            .finish_non_exhaustive()
    }
}

impl PreparedSigner {
    /// `key`, with a first commitment drawn from `rng`.
    pub fn new(
        key: ed25519_dalek::SigningKey,
        rng: &mut (impl rand::RngCore + rand::CryptoRng),
    ) -> Self {
        let mut wide = [0u8; 64];
        rng.fill_bytes(&mut wide);
        let r = curve25519_dalek::Scalar::from_bytes_mod_order_wide(&wide);
        let big_r = curve25519_dalek::EdwardsPoint::mul_base(&r)
            .compress()
            .to_bytes();
        PreparedSigner {
            key,
            r,
            big_r,
            used: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The key.
    pub fn key(&self) -> &ed25519_dalek::SigningKey {
        &self.key
    }

    /// `(public key, signature)` as hex for `nonce`, as [`sign_nonce`] gives them; the first
    /// call uses the prepared commitment.
    pub fn sign_nonce(&self, nonce: &[u8]) -> (String, String) {
        use sha2::Digest as _;
        if self.used.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return sign_nonce(&self.key, nonce);
        }
        let public = self.key.verifying_key().to_bytes();
        let mut h = sha2::Sha512::new();
        h.update(self.big_r);
        h.update(public);
        h.update(nonce);
        let k = curve25519_dalek::Scalar::from_bytes_mod_order_wide(&h.finalize().into());
        let s = self.r + k * self.key.to_scalar();
        let mut sig = [0u8; 64];
        sig[..32].copy_from_slice(&self.big_r);
        sig[32..].copy_from_slice(s.as_bytes());
        (hex::encode(public), hex::encode(sig))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_nonce_verifies_and_nothing_else_does() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[3u8; 32]);
        let (pk, sig) = sign_nonce(&key, b"abc123");
        assert_eq!(verify_nonce_signature("abc123", &pk, &sig), Ok(()));
        assert_eq!(
            verify_nonce_signature("other", &pk, &sig),
            Err(NonceError::BadSignature)
        );
        assert_eq!(
            verify_nonce_signature("abc123", "", &sig),
            Err(NonceError::NoPublicKey)
        );
        assert_eq!(
            verify_nonce_signature("abc123", &pk, ""),
            Err(NonceError::NoSignature)
        );
        assert_eq!(
            verify_nonce_signature("abc123", &pk[..62], &sig),
            Err(NonceError::PublicKeyLength)
        );
        assert_eq!(
            verify_nonce_signature("abc123", "zz", &sig),
            Err(NonceError::InvalidPublicKey)
        );
        for e in [NonceError::NoPublicKey, NonceError::BadSignature] {
            assert_eq!(e.message(), e.to_string());
        }
    }

    fn proof<'a>(nonce: &'a str, pk: &'a str, sig: &'a str) -> NonceProof<'a> {
        NonceProof {
            nonce,
            public_key_hex: pk,
            signature_hex: sig,
        }
    }

    /// `s + l`: the same point arithmetic, but not a canonical scalar.
    fn with_s_plus_l(sig_hex: &str) -> String {
        let mut b = hex::decode(sig_hex).unwrap();
        // l = 2^252 + 27742317777372353535851937790883648493, little-endian.
        let l: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut carry = 0u16;
        for i in 0..32 {
            let v = u16::from(b[32 + i]) + u16::from(l[i]) + carry;
            b[32 + i] = (v & 0xff) as u8;
            carry = v >> 8;
        }
        hex::encode(b)
    }

    #[test]
    fn a_batch_answers_for_each_proof_what_a_single_check_answers() {
        let keys: Vec<_> = (0..12u8)
            .map(|i| ed25519_dalek::SigningKey::from_bytes(&[i + 1; 32]))
            .collect();
        let nonces: Vec<String> = (0..12).map(|i| format!("nonce-{i}")).collect();
        let signed: Vec<(String, String)> = keys
            .iter()
            .zip(&nonces)
            .map(|(k, n)| sign_nonce(k, n.as_bytes()))
            .collect();
        let other = sign_nonce(&keys[0], b"something else");
        let small_order_key = hex::encode(
            [1u8; 1]
                .iter()
                .chain([0u8; 31].iter())
                .copied()
                .collect::<Vec<_>>(),
        );
        let mut small_order_r = hex::decode(&signed[3].1).unwrap();
        small_order_r[..32].copy_from_slice(&{
            let mut id = [0u8; 32];
            id[0] = 1;
            id
        });
        let small_order_r = hex::encode(small_order_r);
        let mut non_canonical_r = hex::decode(&signed[4].1).unwrap();
        non_canonical_r[0] = 0xee;
        non_canonical_r[1..31].fill(0xff);
        non_canonical_r[31] = 0x7f;
        let non_canonical_r = hex::encode(non_canonical_r);
        let big_s = with_s_plus_l(&signed[5].1);

        let proofs = vec![
            proof(&nonces[0], &signed[0].0, &signed[0].1),
            proof(&nonces[1], &signed[1].0, &signed[1].1),
            proof(&nonces[2], &signed[2].0, &other.1),
            proof(&nonces[3], &signed[3].0, &small_order_r),
            proof(&nonces[4], &signed[4].0, &non_canonical_r),
            proof(&nonces[5], &signed[5].0, &big_s),
            proof(&nonces[6], &small_order_key, &signed[6].1),
            proof(&nonces[7], "", &signed[7].1),
            proof(&nonces[8], &signed[8].0, "zz"),
            proof("not the nonce", &signed[9].0, &signed[9].1),
            proof(&nonces[10], &signed[10].0, &signed[10].1),
            proof(&nonces[11], &signed[11].0, &signed[11].1),
        ];
        let batch = verify_nonce_signatures(&proofs);
        let single: Vec<_> = proofs
            .iter()
            .map(|p| verify_nonce_signature(p.nonce, p.public_key_hex, p.signature_hex))
            .collect();
        assert_eq!(batch, single);
        let ok: Vec<bool> = batch.iter().map(Result::is_ok).collect();
        assert_eq!(
            ok,
            [true, true, false, false, false, false, false, false, false, false, true, true]
        );
        assert_eq!(batch[5], Err(NonceError::BadSignature));
        assert_eq!(batch[8], Err(NonceError::InvalidSignature));
    }

    #[test]
    fn a_batch_of_good_proofs_passes_and_one_forgery_fails_alone() {
        let keys: Vec<_> = (0..40u8)
            .map(|i| {
                ed25519_dalek::SigningKey::from_bytes(&[i.wrapping_mul(7).wrapping_add(3); 32])
            })
            .collect();
        let signed: Vec<(String, String)> = keys
            .iter()
            .map(|k| sign_nonce(k, b"shared-nonce"))
            .collect();
        let mut proofs: Vec<NonceProof<'_>> = signed
            .iter()
            .map(|(pk, sig)| proof("shared-nonce", pk, sig))
            .collect();
        assert!(verify_nonce_signatures(&proofs).iter().all(Result::is_ok));
        // Node 17 presents node 18's signature under its own key.
        proofs[17].signature_hex = &signed[18].1;
        let r = verify_nonce_signatures(&proofs);
        for (i, r) in r.iter().enumerate() {
            assert_eq!(r.is_ok(), i != 17, "proof {i}: {r:?}");
        }
        assert!(verify_nonce_signatures(&[]).is_empty());
        assert_eq!(
            verify_nonce_signatures(&proofs[17..18]),
            vec![Err(NonceError::BadSignature)]
        );
    }

    #[test]
    fn a_prepared_first_signature_verifies_and_its_commitment_is_never_used_again() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[9u8; 32]);
        let signer = PreparedSigner::new(key.clone(), &mut rand::thread_rng());
        let (pk, first) = signer.sign_nonce(b"nonce-1");
        assert_eq!(pk, hex::encode(key.verifying_key().to_bytes()));
        assert_eq!(verify_nonce_signature("nonce-1", &pk, &first), Ok(()));
        // Drawn, not derived: not the standard signature of the same nonce.
        assert_ne!(first, sign_nonce(&key, b"nonce-1").1);
        // Every later signature is the standard one, with its own commitment.
        let (_, second) = signer.sign_nonce(b"nonce-2");
        assert_eq!(second, sign_nonce(&key, b"nonce-2").1);
        assert_eq!(verify_nonce_signature("nonce-2", &pk, &second), Ok(()));
        assert_ne!(first[..64], second[..64]);
        let (_, again) = signer.sign_nonce(b"nonce-1");
        assert_eq!(again, sign_nonce(&key, b"nonce-1").1);
        assert_eq!(
            verify_nonce_signature("nonce-2", &pk, &first),
            Err(NonceError::BadSignature)
        );
        // Two signers of one key draw different commitments.
        let other = PreparedSigner::new(key, &mut rand::thread_rng());
        assert_ne!(other.sign_nonce(b"nonce-1").1, first);
    }
}
