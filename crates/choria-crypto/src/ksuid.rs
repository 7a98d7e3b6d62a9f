//! KSUIDs (segment.io's K-Sortable Unique IDs), which the Choria tokens package uses as `jti`:
//! 4 bytes of seconds since 2014-05-13 16:53:20 UTC and 16 random bytes, as 27 base62
//! characters. A chain issuer's tokens are checked against the time inside their id.

const EPOCH: i64 = 1_400_000_000;
const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// A new KSUID whose embedded time is `unix_secs`, with a random payload.
pub fn ksuid(unix_secs: i64) -> String {
    let mut payload = [0u8; 16];
    rand::Rng::fill(&mut rand::thread_rng(), &mut payload);
    ksuid_with(unix_secs, &payload)
}

/// The KSUID of `unix_secs` and `payload`, for callers that choose their own randomness. A time
/// before the KSUID epoch or past its range is written as the epoch.
pub fn ksuid_with(unix_secs: i64, payload: &[u8; 16]) -> String {
    let ts = u32::try_from(unix_secs - EPOCH).unwrap_or(0);
    // The 160-bit big-endian number as five 32-bit limbs, most significant first.
    let mut num = [ts, 0, 0, 0, 0];
    for (limb, chunk) in num[1..].iter_mut().zip(payload.chunks_exact(4)) {
        *limb = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    // Repeated division by 62, filling from the right.
    let mut digits = [b'0'; 27];
    for slot in digits.iter_mut().rev() {
        let mut rem = 0u64;
        for limb in num.iter_mut() {
            let acc = (rem << 32) | u64::from(*limb);
            // acc < 62 << 32, so the quotient fits in 32 bits.
            *limb = (acc / 62) as u32;
            rem = acc % 62;
        }
        *slot = ALPHABET[rem as usize];
    }
    digits.iter().map(|&b| char::from(b)).collect()
}

/// The Unix time embedded in a KSUID, if `id` is one.
pub fn ksuid_time(id: &str) -> Option<i64> {
    let num = ksuid_number(id)?;
    let ts = u32::from_be_bytes([num[0], num[1], num[2], num[3]]);
    Some(i64::from(ts) + EPOCH)
}

/// The 160-bit big-endian number a KSUID writes (time, then payload), if `id` is one.
fn ksuid_number(id: &str) -> Option<[u8; 20]> {
    if id.len() != 27 {
        return None;
    }
    let mut num = [0u8; 20];
    for c in id.bytes() {
        let v = match c {
            b'0'..=b'9' => c - b'0',
            b'A'..=b'Z' => c - b'A' + 10,
            b'a'..=b'z' => c - b'a' + 36,
            _ => return None,
        };
        let mut carry = u32::from(v);
        for b in num.iter_mut().rev() {
            let acc = u32::from(*b) * 62 + carry;
            *b = (acc & 0xff) as u8;
            carry = acc >> 8;
        }
        if carry != 0 {
            return None;
        }
    }
    Some(num)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksuid_round_trips_its_time() {
        let id = ksuid(1_718_000_000);
        assert_eq!(id.len(), 27);
        assert_eq!(ksuid_time(&id), Some(1_718_000_000));
        assert_eq!(ksuid_time("short"), None);
        assert_eq!(ksuid_time("0ujtsYcgvSTl8PAuAdqWYSMnLO!"), None);
        // Past 2^160.
        assert_eq!(ksuid_time("zzzzzzzzzzzzzzzzzzzzzzzzzzz"), None);
    }

    #[test]
    fn known_ksuids_of_the_reference_implementation() {
        assert_eq!(
            ksuid_time("0ujtsYcgvSTl8PAuAdqWYSMnLOv"),
            Some(1_507_608_047)
        );
        // The reference's nil and max values.
        assert_eq!(ksuid_with(EPOCH, &[0; 16]), "000000000000000000000000000");
        assert_eq!(
            ksuid_with(EPOCH + i64::from(u32::MAX), &[0xff; 16]),
            "aWgEPTl1tmebfsQzFP4bxwgy80V"
        );
        assert_eq!(ksuid_with(0, &[0; 16]), "000000000000000000000000000");
    }

    /// The reference's `0ujtsYcgvSTl8PAuAdqWYSMnLOv` is its payload
    /// `B5A1CD34B5F99D1154FB6853345C9735` at 1507608047; every id read back gives its time and
    /// its payload, whatever the payload's bytes.
    #[test]
    fn ids_carry_their_payload_and_time() {
        let payload: [u8; 16] = [
            0xB5, 0xA1, 0xCD, 0x34, 0xB5, 0xF9, 0x9D, 0x11, 0x54, 0xFB, 0x68, 0x53, 0x34, 0x5C,
            0x97, 0x35,
        ];
        assert_eq!(
            ksuid_with(1_507_608_047, &payload),
            "0ujtsYcgvSTl8PAuAdqWYSMnLOv"
        );
        for seed in 0u8..=255 {
            let p: [u8; 16] =
                std::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8 * 17));
            let t = EPOCH + i64::from(seed) * 86_400 * 97;
            let id = ksuid_with(t, &p);
            assert_eq!(ksuid_time(&id), Some(t), "{id}");
            assert_eq!(
                ksuid_number(&id).map(|n| n[4..].to_vec()),
                Some(p.to_vec()),
                "{id}"
            );
        }
    }
}
