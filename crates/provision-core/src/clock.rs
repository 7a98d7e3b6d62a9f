//! What the cycle takes from its surroundings besides the network: the wall clock ([`Clock`])
//! and entropy ([`Random`]), each with a system implementation, so tests can fix both.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock time for token validity; monotonic time comes from tokio.
pub trait Clock: Send + Sync + 'static {
    /// Seconds since the Unix epoch.
    fn now_unix(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_unix(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
    }
}

/// Entropy for the cycle: the `gen25519` nonce, the jitter of the delays between RPC tries, the
/// id of a server JWT, and the X25519 key pair and IV that encrypt a private key for a node.
/// [`SystemRandom`] draws from the operating system's generator; a test can return fixed values
/// to make a cycle repeatable.
pub trait Random: Send + Sync + 'static {
    /// Fills `buf` with random bytes.
    fn fill_bytes(&self, buf: &mut [u8]);

    /// A number drawn uniformly from `low..=high` (`low` when `high < low`).
    fn in_range(&self, low: u64, high: u64) -> u64;
}

/// The thread-local generator of the `rand` crate, seeded by the operating system.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRandom;

impl Random for SystemRandom {
    fn fill_bytes(&self, buf: &mut [u8]) {
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), buf);
    }

    fn in_range(&self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        rand::Rng::gen_range(&mut rand::thread_rng(), low..=high)
    }
}

/// A shared source draws through its `Arc`.
impl<T: Random + ?Sized> Random for std::sync::Arc<T> {
    fn fill_bytes(&self, buf: &mut [u8]) {
        (**self).fill_bytes(buf)
    }

    fn in_range(&self, low: u64, high: u64) -> u64 {
        (**self).in_range(low, high)
    }
}
