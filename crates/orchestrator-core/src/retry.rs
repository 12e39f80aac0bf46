//! Exponential backoff with jitter between attempts of a failed task.

use std::time::Duration;

use serde::{Deserialize, Serialize};

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
        let exponent = failed_attempt.saturating_sub(1).min(31);
        let uncapped = self.base_delay.saturating_mul(1u32 << exponent);
        let capped = uncapped.min(self.max_delay);
        let half = capped / 2;
        half + half.mul_f64(jitter.clamp(0.0, 1.0))
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

    #[test]
    fn jitter_spreads_between_half_and_full_delay() {
        let p = policy();
        assert_eq!(p.delay_before_retry(3, 0.0), Duration::from_millis(200));
        assert_eq!(p.delay_before_retry(3, 0.5), Duration::from_millis(300));
        assert_eq!(p.delay_before_retry(3, 7.0), Duration::from_millis(400));
        assert_eq!(p.delay_before_retry(3, -1.0), Duration::from_millis(200));
    }
}
