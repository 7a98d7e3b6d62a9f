//! Standard base64 (RFC 4648, padded) for the envelopes, a SIMD block at a time.
//!
//! Every message carries two or three base64 layers (the transport's `data`, a v1 reply's
//! `message`, a v2 secure envelope's `request` or `reply`), a few kilobytes each; `base64-simd`
//! encodes and checks them with AVX2 or SSE4.1 where the processor has them, and a table
//! otherwise. What it accepts and refuses is what the `base64` crate's `STANDARD` engine accepts
//! and refuses (padding required, non-zero trailing bits refused, no whitespace): the tests
//! below check the two against each other.

use base64_simd::STANDARD;

/// The base64 of `data`.
pub(crate) fn encode(data: &[u8]) -> String {
    STANDARD.encode_to_string(data)
}

/// The length of the base64 of `len` bytes, `None` if it would overflow.
pub(crate) fn encoded_len(len: usize) -> Option<usize> {
    len.checked_add(2)
        .map(|l| l / 3)
        .and_then(|l| l.checked_mul(4))
}

/// Appends the base64 of `data` to `out`.
pub(crate) fn encode_into(data: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + STANDARD.encoded_length(data.len()), 0);
    let written = STANDARD
        .encode(data, base64_simd::Out::from_slice(&mut out[start..]))
        .len();
    out.truncate(start + written);
}

/// Whether `text` is the base64 of `data`; without allocating when `data` is a digest.
pub(crate) fn is_encoding_of(data: &[u8], text: &[u8]) -> bool {
    let mut buf = [0u8; 88];
    match buf.get_mut(..STANDARD.encoded_length(data.len())) {
        Some(out) => STANDARD.encode(data, base64_simd::Out::from_slice(out)) == text,
        None => encode(data).as_bytes() == text,
    }
}

/// The bytes `text` encodes, `None` when it is not valid padded standard base64.
pub(crate) fn decode(text: &[u8]) -> Option<Vec<u8>> {
    STANDARD.decode_to_vec(text).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD as REFERENCE;
    use base64::Engine as _;
    use rand::{Rng as _, SeedableRng as _};

    #[test]
    fn encodes_as_the_base64_crate_does() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for len in (0..300).chain([1023, 1024, 1025, 4096, 65_537]) {
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let want = REFERENCE.encode(&data);
            assert_eq!(encode(&data), want, "{len} bytes");
            assert_eq!(encoded_len(len), Some(want.len()));
            assert!(is_encoding_of(&data, want.as_bytes()));
            assert!(!is_encoding_of(&data, &[want.as_bytes(), b"="].concat()));
            let mut out = b"prefix".to_vec();
            encode_into(&data, &mut out);
            assert_eq!(&out[..6], b"prefix");
            assert_eq!(&out[6..], want.as_bytes(), "{len} bytes appended");
        }
        assert_eq!(encoded_len(usize::MAX), None);
    }

    /// Valid encodings, their damaged forms and random text from the alphabet and its
    /// neighbours: each accepted with the same bytes, or refused, by both.
    #[test]
    fn accepts_and_refuses_what_the_base64_crate_does() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let agree = |text: &[u8]| {
            let want = REFERENCE.decode(text).ok();
            assert_eq!(decode(text), want, "{:?}", String::from_utf8_lossy(text));
            want.is_some()
        };
        let mut accepted = 0;
        let mut refused = 0;
        for len in (0..200).chain([1000, 1001, 1002, 4097]) {
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let good = REFERENCE.encode(&data).into_bytes();
            assert!(agree(&good));
            let mut variants: Vec<Vec<u8>> = vec![
                good.iter().copied().filter(|b| *b != b'=').collect(),
                [good.as_slice(), b"="].concat(),
                [good.as_slice(), b"=="].concat(),
                [good.as_slice(), b"\n"].concat(),
                [b" ", good.as_slice()].concat(),
                [good.as_slice(), b"AAAA"].concat(),
            ];
            if !good.is_empty() {
                for _ in 0..8 {
                    let mut v = good.clone();
                    let at = rng.gen_range(0..v.len());
                    v[at] = *b"A/+=-_.\0\xff\r9z"
                        .get(rng.gen_range(0..12))
                        .unwrap_or(&b'A');
                    variants.push(v);
                }
                // The last character before the padding with its unused low bits set.
                let pad = good.iter().rev().take_while(|b| **b == b'=').count();
                let last = good.len() - pad - 1;
                for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef".iter() {
                    let mut v = good.clone();
                    v[last] = *c;
                    variants.push(v);
                }
                variants.push(good[..good.len() - 1].to_vec());
            }
            for v in &variants {
                if agree(v) {
                    accepted += 1;
                } else {
                    refused += 1;
                }
            }
        }
        let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ \n";
        for _ in 0..20_000 {
            let len = rng.gen_range(0..40);
            let text: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                .collect();
            if agree(&text) {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        assert!(accepted > 1000 && refused > 1000, "{accepted} {refused}");
    }
}
