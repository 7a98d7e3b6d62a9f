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
    let mut num = [0u8; 20];
    let ts = u32::try_from(unix_secs - EPOCH).unwrap_or(0);
    num[..4].copy_from_slice(&ts.to_be_bytes());
    num[4..].copy_from_slice(payload);
    // Repeated division of the 160-bit big-endian number by 62, filling from the right.
    let mut digits = [b'0'; 27];
    for slot in digits.iter_mut().rev() {
        let mut rem = 0u32;
        for byte in num.iter_mut() {
            let acc = (rem << 8) | u32::from(*byte);
            *byte = (acc / 62) as u8;
            rem = acc % 62;
        }
        *slot = ALPHABET[rem as usize];
    }
    digits.iter().map(|&b| char::from(b)).collect()
}

/// The Unix time embedded in a KSUID, if `id` is one.
pub fn ksuid_time(id: &str) -> Option<i64> {
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
    let ts = u32::from_be_bytes([num[0], num[1], num[2], num[3]]);
    Some(i64::from(ts) + EPOCH)
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
}
