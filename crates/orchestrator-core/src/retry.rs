//! Exponential backoff with jitter between attempts of a failed task.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff::{Backoff, Jitter};

/// `delay(n) = min(max_delay, base_delay * 2^(n-1))`, then "equal jitter":
/// half of it is fixed and half is scaled by a random sample, so retries of
/// many tasks that failed together spread out instead of stampeding.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before the attempt after `failed_attempt` (1-based).
    /// `jitter` is a uniform sample in `[0, 1)`; values outside are clamped.
    pub fn delay_before_retry(&self, failed_attempt: u32, jitter: f64) -> Duration {
        let backoff = Backoff::doubling(self.base_delay, self.max_delay).with_jitter(Jitter::Equal);
        // At most 2^31 times the base, as this policy always computed it.
        let doublings = failed_attempt.saturating_sub(1).min(31);
        backoff.delay(doublings, jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }

    #[test]
    fn delay_doubles_per_attempt() {
        let p = policy();
        assert_eq!(p.delay_before_retry(1, 1.0), Duration::from_millis(100));
        assert_eq!(p.delay_before_retry(2, 1.0), Duration::from_millis(200));
        assert_eq!(p.delay_before_retry(3, 1.0), Duration::from_millis(400));
    }

    #[test]
    fn delay_is_capped() {
        let p = policy();
        assert_eq!(p.delay_before_retry(10, 1.0), Duration::from_secs(2));
        assert_eq!(p.delay_before_retry(u32::MAX, 1.0), Duration::from_secs(2));
    }

    /// docs/configuration.md: `min(retry_max_ms, retry_base_ms × 2^(n-1))`,
    /// then between half of that and all of it, to the nanosecond.
    #[test]
    fn delays_are_the_documented_ones() {
        let documented = |p: &RetryPolicy, n: u32, jitter: f64| {
            let doubled = p
                .base_delay
                .saturating_mul(1u32 << n.saturating_sub(1).min(31));
            let half = doubled.min(p.max_delay) / 2;
            half + half.mul_f64(jitter.clamp(0.0, 1.0))
        };
        let policies = [
            RetryPolicy::default(),
            policy(),
            RetryPolicy {
                base_delay: Duration::from_nanos(333_333_333),
                max_delay: Duration::from_secs(3600),
            },
            RetryPolicy {
                base_delay: Duration::from_millis(7),
                max_delay: Duration::MAX,
            },
        ];
        for p in &policies {
            for n in (0..40).chain([1000, u32::MAX]) {
                for jitter in [0.0, 0.1, 0.33, 0.5, 0.999, 1.0] {
                    assert_eq!(
                        p.delay_before_retry(n, jitter),
                        documented(p, n, jitter),
                        "{p:?}, attempt {n}, jitter {jitter}"
                    );
                }
            }
        }
    }

    #[test]
    fn jitter_spreads_between_half_and_full_delay() {
        let p = policy();
        assert_eq!(p.delay_before_retry(3, 0.0), Duration::from_millis(200));
        assert_eq!(p.delay_before_retry(3, 0.5), Duration::from_millis(300));
        assert_eq!(p.delay_before_retry(3, 7.0), Duration::from_millis(400));
        assert_eq!(p.delay_before_retry(3, -1.0), Duration::from_millis(200));
    }
}
