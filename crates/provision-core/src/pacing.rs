//! Pacing: how many nodes a minute may reach the helper (`max_per_minute`), so that a rotation
//! or a mass boot cannot overrun the certificate authority behind it. The cycle awaits a
//! [`Pacer`] after the deny list and the admission policy and before the helper runs; the
//! binary shares one token bucket between replicas in the fleet control bucket. No pacer means
//! no limit, as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A permission on its way (boxed, so that [`Pacer`] can be a trait object).
pub type PaceFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Lets nodes through at a rate. Awaited once per cycle on a worker, so a worker waiting here
/// holds its slot: the queue fills and backs off as it does when the helper is slow.
pub trait Pacer: Send + Sync + 'static {
    /// Resolves when `identity` may go on to the helper.
    fn admit<'a>(&'a self, identity: &'a str) -> PaceFuture<'a>;
}

/// A token bucket in this process: `per_minute` tokens a minute, holding at most one second's
/// worth (at least one), so a burst is no larger than the rate allows in a second.
#[derive(Debug)]
pub struct LocalBucket {
    per_second: f64,
    capacity: f64,
    state: Mutex<(f64, Instant)>,
}

impl LocalBucket {
    /// A full bucket of `per_minute` (at least 1) a minute.
    pub fn new(per_minute: u32) -> Self {
        let per_second = f64::from(per_minute.max(1)) / 60.0;
        let capacity = per_second.max(1.0);
        LocalBucket {
            per_second,
            capacity,
            state: Mutex::new((capacity, Instant::now())),
        }
    }

    /// Takes a token if there is one; else how long until there is.
    pub fn try_take(&self, now: Instant) -> Result<(), Duration> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_duration_since(s.1).as_secs_f64();
        s.0 = (s.0 + elapsed * self.per_second).min(self.capacity);
        s.1 = now;
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - s.0) / self.per_second))
        }
    }
}

impl Pacer for LocalBucket {
    fn admit<'a>(&'a self, _identity: &'a str) -> PaceFuture<'a> {
        Box::pin(async move {
            while let Err(wait) = self.try_take(Instant::now()) {
                tokio::time::sleep(wait).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_one_seconds_worth_then_paces() {
        let b = LocalBucket::new(120);
        let t0 = Instant::now();
        assert!(b.try_take(t0).is_ok());
        assert!(b.try_take(t0).is_ok());
        let wait = b.try_take(t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(400) && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert!(b.try_take(t0 + Duration::from_millis(500)).is_ok());
        assert!(b.try_take(t0 + Duration::from_millis(500)).is_err());
    }

    #[test]
    fn a_slow_rate_still_lets_one_through() {
        let b = LocalBucket::new(1);
        let t0 = Instant::now();
        assert!(b.try_take(t0).is_ok());
        let wait = b.try_take(t0).unwrap_err();
        assert!(wait > Duration::from_secs(59), "{wait:?}");
    }
}
