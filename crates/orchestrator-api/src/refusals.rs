//! Refusals of callers without a valid token, audited in aggregate.
//!
//! A refusal of a valid token (a role it lacks, a missing CSRF token) is
//! an act of someone known, and gets its own audit record. A caller with
//! no token, or a wrong one, is no one: a flood of such requests must not
//! turn into a flood of durable (fsynced) audit lines, nor into memory
//! that grows with each request. So these refusals are counted per client
//! address, and the audit log gets at most one record per address per
//! [`AUDIT_INTERVAL`]: the first refusal of an address at once (count 1),
//! then, at the end of each interval that saw more, one record carrying
//! how many. The metric `orchestrator_auth_refusals_total` counts every
//! one of them as it happens.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// At most one audit record per address in this time.
pub(crate) const AUDIT_INTERVAL: Duration = Duration::from_secs(60);

/// How many addresses are counted apart. Refusals from further addresses
/// (a caller spraying source addresses) are counted together, as
/// [`Source::Other`], so the table holds at most one entry more than this
/// whatever arrives.
pub(crate) const MAX_ADDRESSES: usize = 4096;

/// Whom a tally counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    Address(IpAddr),
    /// Every address beyond [`MAX_ADDRESSES`], and callers whose address
    /// is unknown.
    Other,
}

impl Source {
    /// The audit record's `target`.
    pub(crate) fn target(self) -> String {
        match self {
            Source::Address(ip) => ip.to_string(),
            Source::Other => "other addresses".to_owned(),
        }
    }
}

/// An audit record to write: `count` refusals from `source`, the last of
/// them answered with `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Due {
    pub source: Source,
    pub count: u64,
    pub status: u16,
}

/// One address's refusals in its current interval.
#[derive(Debug)]
struct Tally {
    /// When the last record for this address was due: the interval runs
    /// from here.
    since: Instant,
    /// Refusals not yet in a record.
    pending: u64,
    last_status: u16,
}

/// The tallies by address.
#[derive(Debug)]
pub(crate) struct RefusalTally {
    interval: Duration,
    capacity: usize,
    /// A std `Mutex`: it is held for one hash map operation (or one pass
    /// of [`RefusalTally::drain`] over at most `capacity` entries), never
    /// across an await, so an async mutex would buy nothing.
    tallies: Mutex<HashMap<Source, Tally>>,
}

impl RefusalTally {
    pub(crate) fn new(interval: Duration, capacity: usize) -> RefusalTally {
        RefusalTally {
            interval,
            capacity: capacity.max(1),
            tallies: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one refusal. Returns the record to write at once, if one is
    /// due: for the first refusal of an address that is not tallied.
    pub(crate) fn note(&self, peer: Option<IpAddr>, status: u16, now: Instant) -> Option<Due> {
        // A panic while the lock was held cannot leave a tally half
        // updated (each update is whole before the next statement), so a
        // poisoned lock is used as it is.
        let mut tallies = self.tallies.lock().unwrap_or_else(PoisonError::into_inner);
        let source = match peer {
            Some(ip)
                if tallies.contains_key(&Source::Address(ip)) || tallies.len() < self.capacity =>
            {
                Source::Address(ip)
            }
            _ => Source::Other,
        };
        match tallies.entry(source) {
            Entry::Occupied(mut entry) => {
                let tally = entry.get_mut();
                tally.pending += 1;
                tally.last_status = status;
                None
            }
            Entry::Vacant(entry) => {
                entry.insert(Tally {
                    since: now,
                    pending: 0,
                    last_status: status,
                });
                Some(Due {
                    source,
                    count: 1,
                    status,
                })
            }
        }
    }

    /// The records due at `now`: one for each address whose interval has
    /// ended with refusals pending (its next interval starts now). An
    /// address whose interval ended with none is forgotten, so the table
    /// holds only addresses refused within the last interval or two.
    pub(crate) fn drain(&self, now: Instant) -> Vec<Due> {
        let mut due = Vec::new();
        let mut tallies = self.tallies.lock().unwrap_or_else(PoisonError::into_inner);
        tallies.retain(|source, tally| {
            if now.saturating_duration_since(tally.since) < self.interval {
                return true;
            }
            if tally.pending == 0 {
                return false;
            }
            due.push(Due {
                source: *source,
                count: tally.pending,
                status: tally.last_status,
            });
            tally.pending = 0;
            tally.since = now;
            true
        });
        due
    }

    /// How many addresses are tallied.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.tallies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([192, 0, 2, last]))
    }

    #[test]
    fn an_address_gets_one_record_at_once_then_one_per_interval_with_the_count() {
        let tally = RefusalTally::new(Duration::from_secs(60), 16);
        let t0 = Instant::now();
        let first = tally.note(ip(1), 401, t0).unwrap();
        assert_eq!(first.count, 1);
        assert_eq!(first.source, Source::Address(IpAddr::from([192, 0, 2, 1])));
        for i in 0..999 {
            assert_eq!(tally.note(ip(1), 401, t0 + Duration::from_millis(i)), None);
        }
        // Not before the interval has passed.
        assert!(tally.drain(t0 + Duration::from_secs(59)).is_empty());
        let due = tally.drain(t0 + Duration::from_secs(60));
        assert_eq!(
            due,
            vec![Due {
                source: Source::Address(IpAddr::from([192, 0, 2, 1])),
                count: 999,
                status: 401
            }]
        );
        // The next interval counts from the record; nothing pending, nothing due.
        assert!(tally.drain(t0 + Duration::from_secs(90)).is_empty());
        assert_eq!(tally.note(ip(1), 429, t0 + Duration::from_secs(100)), None);
        let due = tally.drain(t0 + Duration::from_secs(120));
        assert_eq!((due[0].count, due[0].status), (1, 429));
        // A quiet interval forgets the address: its next refusal is news again.
        assert!(tally.drain(t0 + Duration::from_secs(180)).is_empty());
        assert_eq!(tally.len(), 0);
        assert!(
            tally
                .note(ip(1), 401, t0 + Duration::from_secs(181))
                .is_some()
        );
    }

    #[test]
    fn addresses_beyond_the_capacity_are_counted_together() {
        let tally = RefusalTally::new(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        let mut at_once = Vec::new();
        for last in 0..200 {
            at_once.extend(tally.note(ip(last), 401, t0));
        }
        // Three addresses of their own, then the shared tally: four records
        // at once, however many addresses there were.
        assert_eq!(at_once.len(), 4);
        assert_eq!(at_once[3].source, Source::Other);
        assert_eq!(tally.len(), 4);
        // A known address keeps its own tally even when the table is full;
        // an unknown peer counts with the others.
        assert_eq!(tally.note(ip(0), 401, t0), None);
        assert_eq!(tally.note(None, 401, t0), None);
        let mut due = tally.drain(t0 + Duration::from_secs(60));
        due.sort_by_key(|d| d.count);
        assert_eq!(due.len(), 2, "{due:?}");
        let first = Source::Address(IpAddr::from([192, 0, 2, 0]));
        assert_eq!((due[0].source, due[0].count), (first, 1));
        // 197 addresses beyond the capacity, one record at once, then the
        // unknown peer.
        assert_eq!((due[1].source, due[1].count), (Source::Other, 197));
    }
}
