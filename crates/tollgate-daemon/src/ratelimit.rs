//! Token-bucket rate limits, keyed, with time passed in.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

/// One bucket: `rate` tokens per second, holding at most `rate` (one second's burst).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Per-key token buckets. Keys idle for a while are forgotten, so the map stays bounded by
/// the number of keys active in the last few seconds.
#[derive(Debug)]
pub struct RateLimiter<K> {
    rate: f64,
    buckets: HashMap<K, Bucket>,
    last_sweep: Option<Instant>,
}

impl<K: Eq + Hash + Clone> RateLimiter<K> {
    /// `per_second` tokens per second per key.
    pub fn new(per_second: u32) -> Self {
        RateLimiter {
            rate: f64::from(per_second.max(1)),
            buckets: HashMap::new(),
            last_sweep: None,
        }
    }

    /// Take one token for `key` at `now`; `Err(retry_after_ms)` when the bucket is empty.
    pub fn check(&mut self, key: &K, now: Instant) -> Result<(), u64> {
        self.sweep(now);
        let rate = self.rate;
        let b = self.buckets.entry(key.clone()).or_insert(Bucket {
            tokens: rate,
            last: now,
        });
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate).min(rate);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let wait_ms = (((1.0 - b.tokens) / rate) * 1000.0).ceil() as u64;
            Err(wait_ms.max(1))
        }
    }

    fn sweep(&mut self, now: Instant) {
        let due = self
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t).as_secs() >= 10);
        if due {
            // A bucket idle for over 2 s is full again: forgetting it changes nothing.
            self.buckets
                .retain(|_, b| now.saturating_duration_since(b.last).as_secs() < 2);
            self.last_sweep = Some(now);
        }
    }

    /// Keys currently tracked.
    pub fn tracked(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn allows_the_rate_then_refuses_then_refills() {
        let t0 = Instant::now();
        let mut r = RateLimiter::new(10);
        for _ in 0..10 {
            assert!(r.check(&"a", t0).is_ok());
        }
        let wait = r.check(&"a", t0).unwrap_err();
        assert!((1..=100).contains(&wait), "{wait}");
        // Other keys are independent.
        assert!(r.check(&"b", t0).is_ok());
        // 100 ms later one token is back.
        assert!(r.check(&"a", t0 + Duration::from_millis(100)).is_ok());
        assert!(r.check(&"a", t0 + Duration::from_millis(100)).is_err());
        // Idle keys are forgotten.
        assert!(r.check(&"c", t0 + Duration::from_secs(30)).is_ok());
        assert_eq!(r.tracked(), 1);
    }
}
