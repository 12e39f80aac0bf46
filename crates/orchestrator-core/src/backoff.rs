//! Exponential backoff: how long to wait before the next try of something
//! that failed or is not done yet. The one formula of every retry loop in
//! the workspace (a task's retries, an http step's polls, the storage's
//! reconnects and conflict retries, a live move's retries). Pure: the
//! loops keep their own sleeping, clock and random samples.

use std::time::Duration;

/// `delay(n) = min(max, initial * factor^n)`, then [`Jitter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// The first wait (`n = 0`).
    pub initial: Duration,
    /// Each wait is the one before times this; 1 keeps them equal.
    pub factor: f64,
    /// The longest wait, before jitter.
    pub max: Duration,
    pub jitter: Jitter,
}

/// How a random sample spreads a wait, so that the retries of many callers
/// that failed together do not stampede.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// The wait as computed.
    None,
    /// Half of the wait is fixed, half scaled by the sample: between half
    /// the wait and all of it.
    Equal,
    /// The wait scaled by the sample: between none of it and all of it.
    Full,
}

impl Backoff {
    /// From `initial`, doubling up to `max`, without jitter.
    pub const fn doubling(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            factor: 2.0,
            max,
            jitter: Jitter::None,
        }
    }

    pub const fn with_jitter(self, jitter: Jitter) -> Backoff {
        Backoff { jitter, ..self }
    }

    /// The wait before retry `n` (0 for the first). `sample` is a uniform
    /// sample in `[0, 1)` for the jitter; values outside are clamped, and
    /// it is unused without jitter.
    pub fn delay(&self, n: u32, sample: f64) -> Duration {
        let wait = self.grown(n);
        let sample = if sample.is_nan() {
            0.0
        } else {
            sample.clamp(0.0, 1.0)
        };
        match self.jitter {
            Jitter::None => wait,
            Jitter::Equal => {
                let half = wait / 2;
                half + half.mul_f64(sample)
            }
            Jitter::Full => wait.mul_f64(sample),
        }
    }

    /// `min(max, initial * factor^n)`, multiplied one step at a time so
    /// that a whole factor stays exact in integer nanoseconds, and stopped
    /// once the cap is reached (or the wait stops growing), so that a
    /// large `n` costs no more than the steps up to the cap.
    fn grown(&self, n: u32) -> Duration {
        let mut wait = self.initial;
        for _ in 0..n {
            if wait >= self.max {
                break;
            }
            let next = times(wait, self.factor);
            if next <= wait {
                break;
            }
            wait = next;
        }
        wait.min(self.max)
    }
}

/// `wait * factor`, saturating at [`Duration::MAX`].
fn times(wait: Duration, factor: f64) -> Duration {
    if factor.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&factor) {
        // Whole: exact integer arithmetic (the cast is lossless here).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        return wait.saturating_mul(factor as u32);
    }
    // As `Duration::mul_f64`, without its panic on overflow.
    Duration::try_from_secs_f64(factor * wait.as_secs_f64()).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[track_caller]
    fn check(backoff: Backoff, sample: f64, expected_ms: &[u64]) {
        let waits: Vec<Duration> = (0..expected_ms.len() as u32)
            .map(|n| backoff.delay(n, sample))
            .collect();
        let expected: Vec<Duration> = expected_ms.iter().map(|ms| MS * *ms as u32).collect();
        assert_eq!(waits, expected, "{backoff:?} with sample {sample}");
    }

    #[test]
    fn waits_grow_by_the_factor_up_to_the_cap() {
        let doubling = Backoff::doubling(MS * 250, MS * 5000);
        check(doubling, 0.7, &[250, 500, 1000, 2000, 4000, 5000, 5000]);
        let slower = Backoff {
            factor: 1.5,
            ..Backoff::doubling(MS * 100, MS * 300)
        };
        check(slower, 0.0, &[100, 150, 225, 300, 300]);
        let steady = Backoff {
            factor: 1.0,
            ..Backoff::doubling(MS * 500, MS * 10_000)
        };
        check(steady, 0.0, &[500, 500, 500]);
        // The cap holds even for the first wait.
        check(Backoff::doubling(MS * 9, MS * 5), 0.0, &[5, 5]);
        check(Backoff::doubling(Duration::ZERO, MS * 5), 0.0, &[0, 0]);
    }

    #[test]
    fn a_fractional_factor_grows_as_repeated_multiplication() {
        // What a loop doing `wait = wait.mul_f64(factor).min(max)` waits.
        let backoff = Backoff {
            factor: 1.3,
            ..Backoff::doubling(MS * 700, Duration::from_secs(30))
        };
        let mut wait = backoff.initial;
        for n in 0..20 {
            assert_eq!(backoff.delay(n, 0.0), wait, "retry {n}");
            wait = wait.mul_f64(backoff.factor).min(backoff.max);
        }
    }

    #[test]
    fn a_huge_retry_number_neither_overflows_nor_takes_long() {
        let backoff = Backoff::doubling(Duration::from_secs(1), Duration::MAX);
        assert_eq!(backoff.delay(u32::MAX, 0.0), Duration::MAX);
        let fractional = Backoff {
            factor: 1.5,
            ..backoff
        };
        assert_eq!(fractional.delay(u32::MAX, 0.0), Duration::MAX);
        let capped = Backoff::doubling(MS, Duration::from_secs(60));
        assert_eq!(capped.delay(u32::MAX, 0.0), Duration::from_secs(60));
    }

    #[test]
    fn jitter_spreads_the_wait() {
        let doubling = Backoff::doubling(MS * 100, MS * 400);
        let equal = doubling.with_jitter(Jitter::Equal);
        check(equal, 1.0, &[100, 200, 400, 400]);
        check(equal, 0.5, &[75, 150, 300, 300]);
        check(equal, 0.0, &[50, 100, 200, 200]);
        let full = doubling.with_jitter(Jitter::Full);
        check(full, 0.5, &[50, 100, 200]);
        check(full, 0.0, &[0, 0, 0]);
        // Samples outside [0, 1) are clamped, and no sample panics.
        check(equal, 7.0, &[100, 200]);
        check(equal, -1.0, &[50, 100]);
        check(full, f64::NAN, &[0, 0]);
        check(doubling, 0.3, &[100, 200, 400]);
    }
}
