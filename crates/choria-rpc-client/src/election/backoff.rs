//! Jittered backoff tables shared with go-choria (`FiveSec`, `FiveSecStartGrace`, `TwentySec`).
//!
//! A [`Policy`] is a table of base delays in milliseconds. Step `n` uses entry `n` (the last entry
//! once `n` runs past the end) and draws the actual delay uniformly from `[m/2, 3m/2)`, the same
//! spread go-choria uses so that many processes retrying together drift apart.

use std::borrow::Cow;
use std::time::Duration;

use rand::Rng;
use tokio_util::sync::CancellationToken;

/// A backoff policy: base delays in milliseconds, saturating at the last one, each jittered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    millis: Cow<'static, [u64]>,
}

/// Up to 5 seconds: go-choria's default policy (`backoff.FiveSec`).
pub const FIVE_SEC: Policy = Policy::from_static(&[
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000,
]);

/// Like [`FIVE_SEC`] with a few quick first tries (`backoff.FiveSecStartGrace`).
pub const FIVE_SEC_START_GRACE: Policy = Policy::from_static(&[
    0, 25, 50, 75, 100, 125, 150, 200, 250, 500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000,
    4500, 5000,
]);

/// Up to 20 seconds (`backoff.TwentySec`): the campaign policy of the provisioner's election.
pub const TWENTY_SEC: Policy = Policy::from_static(&[
    500, 750, 1000, 1500, 2000, 2500, 3000, 3500, 4000, 4500, 5000, 5500, 5750, 6000, 6500, 7000,
    7500, 8000, 8500, 9000, 9500, 10000, 10500, 10750, 11000, 11500, 12000, 12500, 13000, 13500,
    14000, 14500, 15000, 15500, 15750, 16000, 16500, 17000, 17500, 18000, 18500, 19000, 19500,
    20000,
]);

impl Policy {
    /// A policy over a static table of base delays in milliseconds.
    ///
    /// An empty table means "no delay" at every step.
    pub const fn from_static(millis: &'static [u64]) -> Self {
        Policy {
            millis: Cow::Borrowed(millis),
        }
    }

    /// A policy over a table built at run time.
    pub fn from_millis(millis: Vec<u64>) -> Self {
        Policy {
            millis: Cow::Owned(millis),
        }
    }

    /// The table of base delays in milliseconds.
    pub fn millis(&self) -> &[u64] {
        &self.millis
    }

    /// The base (unjittered) delay of step `n`.
    pub fn base(&self, n: usize) -> Duration {
        let idx = n.min(self.millis.len().saturating_sub(1));
        Duration::from_millis(self.millis.get(idx).copied().unwrap_or(0))
    }

    /// The jittered delay of step `n`: uniform in `[m/2, 3m/2)` milliseconds of the base `m`.
    pub fn duration(&self, n: usize) -> Duration {
        let m = self.base(n).as_millis() as u64;
        Duration::from_millis(jitter(m))
    }

    /// Sleep for step `n`, returning `false` early when `cancel` fires.
    pub async fn sleep(&self, n: usize, cancel: &CancellationToken) -> bool {
        let d = self.duration(n);
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = cancel.cancelled() => false,
        }
    }
}

/// `m/2 + uniform(0..m)` with integer halving, as go-choria computes it; 0 stays 0.
fn jitter(m: u64) -> u64 {
    if m == 0 {
        return 0;
    }
    m / 2 + rand::thread_rng().gen_range(0..m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn twenty_sec_table_matches_go_choria() {
        let policy = TWENTY_SEC;
        let t = policy.millis();
        assert_eq!(t.len(), 44);
        assert_eq!(t.first(), Some(&500));
        assert_eq!(t.get(12), Some(&5750));
        assert_eq!(t.get(23), Some(&10750));
        assert_eq!(t.get(34), Some(&15750));
        assert_eq!(t.last(), Some(&20000));
        assert!(t.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn steps_saturate_at_the_last_entry() {
        assert_eq!(TWENTY_SEC.base(0), Duration::from_millis(500));
        assert_eq!(TWENTY_SEC.base(43), Duration::from_secs(20));
        assert_eq!(TWENTY_SEC.base(1000), Duration::from_secs(20));
        assert_eq!(FIVE_SEC.base(99), Duration::from_secs(5));
        assert_eq!(FIVE_SEC_START_GRACE.base(0), Duration::ZERO);
        assert_eq!(Policy::from_millis(Vec::new()).duration(3), Duration::ZERO);
    }

    #[test]
    fn jitter_stays_in_half_open_range() {
        for n in [0usize, 5, 20, 43, 60] {
            let m = TWENTY_SEC.base(n).as_millis() as u64;
            for _ in 0..500 {
                let d = TWENTY_SEC.duration(n).as_millis() as u64;
                assert!(
                    d >= m / 2 && d < m / 2 + m,
                    "step {n}: {d} outside [{}, {})",
                    m / 2,
                    m / 2 + m
                );
            }
        }
        assert_eq!(FIVE_SEC_START_GRACE.duration(0), Duration::ZERO);
    }

    #[test]
    fn jitter_spreads_values() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            seen.insert(FIVE_SEC.duration(0));
        }
        assert!(seen.len() > 20, "only {} distinct delays", seen.len());
    }

    #[tokio::test(start_paused = true)]
    async fn sleep_stops_on_cancel() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(!TWENTY_SEC.sleep(40, &cancel).await);
        let live = CancellationToken::new();
        assert!(FIVE_SEC.sleep(0, &live).await);
    }
}
