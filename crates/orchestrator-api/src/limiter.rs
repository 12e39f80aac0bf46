//! Rate limiters whose memory is bounded whatever the callers send.
//!
//! governor's keyed limiters keep one state per key for ever unless told
//! to forget: a caller spraying source addresses (or `X-Forwarded-For`
//! values through a trusted proxy) would grow them without end. Here the
//! limiter keeps its states in a [`BoundedStore`]: at most `capacity`
//! keys have a bucket of their own; a key arriving when the table is full
//! shares one bucket, the overflow key, with every other such key until
//! room is made. Room is made by [`prune`], which a task runs every
//! [`PRUNE_EVERY`]: it drops every key whose bucket has refilled (a state
//! indistinguishable from a fresh one, so forgetting it changes no
//! answer). Callers already known keep their own buckets when the table
//! is full; only newcomers are lumped together, and they are refused
//! together once their shared bucket is empty. The table holds at most
//! `capacity + 1` entries.

use std::collections::HashMap;
use std::hash::Hash;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use governor::clock::DefaultClock;
use governor::nanos::Nanos;
use governor::state::StateStore;
use governor::state::keyed::ShrinkableKeyedStateStore;
use governor::{Quota, RateLimiter};

/// How many keys (addresses, tokens) have a bucket of their own, per
/// limiter. A state is a few dozen bytes: a full table is a few MiB.
pub(crate) const MAX_KEYS: usize = 65_536;

/// How often the buckets that have refilled are forgotten.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(30);

/// A keyed rate limiter over a [`BoundedStore`].
pub(crate) type Limiter<K> = RateLimiter<K, BoundedStore<K>, DefaultClock>;

/// A limiter of `quota` keeping at most `capacity` keys apart; keys
/// beyond share the bucket of `overflow`.
pub(crate) fn limiter<K: Hash + Eq + Clone>(
    quota: Quota,
    capacity: usize,
    overflow: K,
) -> Limiter<K> {
    RateLimiter::new(
        quota,
        BoundedStore::new(capacity, overflow),
        DefaultClock::default(),
    )
}

/// Forgets the keys whose bucket has refilled and gives the memory back.
pub(crate) fn prune<K: Hash + Eq + Clone>(limiter: &Limiter<K>) {
    limiter.retain_recent();
    limiter.shrink_to_fit();
}

/// Prunes `limiter` every [`PRUNE_EVERY`] until it is dropped (it is held
/// weakly, so the task never keeps it alive). Needs a runtime; without
/// one (a router built outside one, never served) nothing runs.
pub(crate) fn prune_periodically<K>(limiter: &Arc<Limiter<K>>)
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak: Weak<Limiter<K>> = Arc::downgrade(limiter);
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval(PRUNE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let Some(limiter) = weak.upgrade() else {
                return;
            };
            prune(&limiter);
        }
    });
}

/// The limiter's states: each key's theoretical arrival time (GCRA), in
/// nanoseconds since the limiter's start, for at most `capacity` keys
/// plus the overflow key.
pub(crate) struct BoundedStore<K> {
    capacity: usize,
    /// The bucket shared by the keys that found the table full.
    overflow: K,
    /// A std `Mutex`: held for one hash map operation (or one pass of a
    /// prune), never across an await.
    states: Mutex<HashMap<K, u64>>,
}

impl<K: Hash + Eq + Clone> BoundedStore<K> {
    pub(crate) fn new(capacity: usize, overflow: K) -> BoundedStore<K> {
        BoundedStore {
            capacity: capacity.max(1),
            overflow,
            states: Mutex::new(HashMap::new()),
        }
    }

    fn states(&self) -> std::sync::MutexGuard<'_, HashMap<K, u64>> {
        // Each update is whole before the next statement: a poisoned lock
        // holds no half-written state.
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<K: Hash + Eq + Clone> StateStore for BoundedStore<K> {
    type Key = K;

    fn measure_and_replace<T, F, E>(&self, key: &K, f: F) -> Result<T, E>
    where
        F: Fn(Option<Nanos>) -> Result<(T, Nanos), E>,
    {
        let mut states = self.states();
        // Zero is "never seen", as in governor's own states.
        let known = |value: u64| NonZeroU64::new(value).map(|n| Nanos::from(n.get()));
        if let Some(state) = states.get_mut(key) {
            let (outcome, next) = f(known(*state))?;
            *state = next.as_u64();
            return Ok(outcome);
        }
        let key = if states.len() < self.capacity {
            key
        } else {
            &self.overflow
        };
        let previous = states.get(key).copied().and_then(known);
        let (outcome, next) = f(previous)?;
        states.insert(key.clone(), next.as_u64());
        Ok(outcome)
    }
}

impl<K: Hash + Eq + Clone> ShrinkableKeyedStateStore<K> for BoundedStore<K> {
    fn retain_recent(&self, drop_below: Nanos) {
        let drop_below = drop_below.as_u64();
        self.states().retain(|_, state| *state > drop_below);
    }

    fn shrink_to_fit(&self) {
        self.states().shrink_to_fit();
    }

    fn len(&self) -> usize {
        self.states().len()
    }

    fn is_empty(&self) -> bool {
        self.states().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::num::NonZeroU32;

    use super::*;

    fn address(n: u32) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n))
    }

    #[test]
    fn a_spray_of_keys_fills_the_table_to_its_cap_and_shares_one_bucket_beyond() {
        let quota = Quota::per_hour(NonZeroU32::new(1).unwrap());
        let limiter = limiter(quota, 100, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        for n in 0..100 {
            assert!(
                limiter.check_key(&address(n)).is_ok(),
                "key {n} has its own bucket"
            );
        }
        assert_eq!(limiter.len(), 100);
        // The table is full: the next newcomer gets the overflow bucket,
        // and every newcomer after it finds that bucket empty.
        assert!(limiter.check_key(&address(1000)).is_ok());
        for n in 1001..2000 {
            assert!(
                limiter.check_key(&address(n)).is_err(),
                "key {n} shares the spent bucket"
            );
        }
        assert_eq!(limiter.len(), 101, "capacity plus the overflow key");
        // A key known before the table filled keeps its own (spent) bucket.
        assert!(limiter.check_key(&address(5)).is_err());
    }

    #[test]
    fn pruning_forgets_the_buckets_that_refilled_and_keeps_the_spent_ones() {
        use governor::clock::FakeRelativeClock;
        use governor::middleware::NoOpMiddleware;

        // One request a second, bursts of one: a bucket refills in 1 s.
        let quota = Quota::per_second(NonZeroU32::new(1).unwrap());
        let clock = FakeRelativeClock::default();
        let limiter: RateLimiter<IpAddr, BoundedStore<IpAddr>, _, NoOpMiddleware<Nanos>> =
            RateLimiter::new(
                quota,
                BoundedStore::new(1000, IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                clock.clone(),
            );
        for n in 0..500 {
            assert!(limiter.check_key(&address(n)).is_ok());
        }
        clock.advance(Duration::from_millis(500));
        // Half a second on, one key is used again: its bucket is spent.
        assert!(limiter.check_key(&address(7)).is_err());
        // Governor forgets a state one interval after it was fresh again.
        clock.advance(Duration::from_millis(1700));
        assert!(limiter.check_key(&address(7)).is_ok());
        limiter.retain_recent();
        limiter.shrink_to_fit();
        // The 499 others refilled and are forgotten; the one in use stays,
        // still spent.
        assert_eq!(limiter.len(), 1);
        assert!(limiter.check_key(&address(7)).is_err());
        assert!(
            limiter.check_key(&address(8)).is_ok(),
            "a forgotten key starts afresh"
        );
    }
}
