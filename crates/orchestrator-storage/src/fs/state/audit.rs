//! The audit log as the state holds it. Every request the API answers
//! writes a record, so the log is most of a store's history; once a
//! record's line is durable it leaves memory, and what stays (its place and
//! the summary the filters need) is kept in a sorted array, at the size of
//! an entry. A tree filled with ascending ids (UUIDv7) keeps its nodes
//! about half full, and each key's text on the heap: the array took the
//! live heap of a one-step workflow with its audit record from about 590
//! to 530 bytes (docs/benchmarks.md).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use std::ops::Bound::{Excluded, Unbounded};

use uuid::Uuid;

use super::HeldAudit;
use crate::fs::history::Held;

/// Audit records by id, in the order of the ids' text.
#[derive(Default)]
pub(super) struct AuditLog {
    /// In memory until its line is durable; and, on disk, any whose id is
    /// not a UUID in its canonical text (the service never makes one, but
    /// an imported store may hold them). Few.
    held: BTreeMap<String, HeldAudit>,
    /// On disk (always `Held::Disk`), by id: a UUID's bytes sort as its
    /// canonical (lowercase, hyphenated) text does.
    settled: Vec<([u8; 16], HeldAudit)>,
}

/// An audit record's id as the log holds it.
#[derive(Debug, Clone, Copy)]
pub(in crate::fs) enum AuditId<'a> {
    Text(&'a str),
    Uuid(&'a [u8; 16]),
}

impl<'a> AuditId<'a> {
    pub(in crate::fs) fn text(self) -> Cow<'a, str> {
        match self {
            AuditId::Text(text) => Cow::Borrowed(text),
            AuditId::Uuid(bytes) => Cow::Owned(Uuid::from_bytes(*bytes).to_string()),
        }
    }

    /// Compares with `other` as their texts compare.
    fn cmp_text(self, other: AuditId<'_>) -> Ordering {
        match (self, other) {
            (AuditId::Uuid(a), AuditId::Uuid(b)) => a.cmp(b),
            (a, b) => with_text(a, |a| with_text(b, |b| a.cmp(b))),
        }
    }
}

/// Calls `f` with the text of `id`, formatted on the stack.
fn with_text<T>(id: AuditId<'_>, f: impl FnOnce(&str) -> T) -> T {
    match id {
        AuditId::Text(text) => f(text),
        AuditId::Uuid(bytes) => {
            let mut buffer = Uuid::encode_buffer();
            f(Uuid::from_bytes(*bytes)
                .hyphenated()
                .encode_lower(&mut buffer))
        }
    }
}

/// The bytes of `id` if it is a UUID in its canonical text.
fn canonical(id: &str) -> Option<[u8; 16]> {
    let uuid = Uuid::try_parse(id).ok()?;
    let mut buffer = Uuid::encode_buffer();
    (uuid.hyphenated().encode_lower(&mut buffer) == id).then(|| *uuid.as_bytes())
}

impl AuditLog {
    pub(super) fn len(&self) -> usize {
        self.held.len() + self.settled.len()
    }

    pub(super) fn in_memory(&self) -> usize {
        (self.held.values())
            .filter(|h| matches!(h, Held::Memory { .. }))
            .count()
    }

    fn settled_index(&self, bytes: &[u8; 16]) -> std::result::Result<usize, usize> {
        self.settled.binary_search_by(|(id, _)| id.cmp(bytes))
    }

    pub(super) fn get(&self, id: &str) -> Option<&HeldAudit> {
        if let Some(held) = self.held.get(id) {
            return Some(held);
        }
        let bytes = canonical(id)?;
        let at = self.settled_index(&bytes).ok()?;
        Some(&self.settled[at].1)
    }

    pub(super) fn get_mut(&mut self, id: &str) -> Option<&mut HeldAudit> {
        if self.held.contains_key(id) {
            return self.held.get_mut(id);
        }
        let bytes = canonical(id)?;
        let at = self.settled_index(&bytes).ok()?;
        Some(&mut self.settled[at].1)
    }

    /// Puts `held` under `id`: an entry on disk with a canonical id goes to
    /// the array (at its end, but for ids made out of order), anything
    /// else to the tree. Replaces what was under `id`.
    pub(super) fn insert(&mut self, id: String, held: HeldAudit) {
        let Some(bytes) = canonical(&id) else {
            self.held.insert(id, held);
            return;
        };
        let found = self.settled_index(&bytes);
        if matches!(held, Held::Disk { .. }) {
            self.held.remove(&id);
            match found {
                Ok(at) => self.settled[at].1 = held,
                Err(at) => self.settled.insert(at, (bytes, held)),
            }
        } else {
            if let Ok(at) = found {
                self.settled.remove(at);
            }
            self.held.insert(id, held);
        }
    }

    /// Removes every record of `ids`.
    pub(super) fn remove(&mut self, ids: &[String]) {
        let mut settled = HashSet::new();
        for id in ids {
            if self.held.remove(id).is_none()
                && let Some(bytes) = canonical(id)
            {
                settled.insert(bytes);
            }
        }
        if !settled.is_empty() {
            self.settled.retain(|(id, _)| !settled.contains(id));
        }
    }

    /// Every record, in id order (and back).
    pub(super) fn iter(&self) -> Merged<'_> {
        Merged {
            held: Side::new(self.held.range::<str, _>((Unbounded, Unbounded))),
            settled: Side::new(self.settled.iter()),
        }
    }

    /// The records whose ids sort after `after`, in id order.
    pub(super) fn after(&self, after: Option<&str>) -> Merged<'_> {
        let Some(after) = after else {
            return self.iter();
        };
        let from = self
            .settled
            .partition_point(|(id, _)| AuditId::Uuid(id).cmp_text(AuditId::Text(after)).is_le());
        Merged {
            held: Side::new(self.held.range::<str, _>((Excluded(after), Unbounded))),
            settled: Side::new(self.settled[from..].iter()),
        }
    }
}

type HeldIter<'a> = std::collections::btree_map::Range<'a, String, HeldAudit>;
type SettledIter<'a> = std::slice::Iter<'a, ([u8; 16], HeldAudit)>;

/// The tree's entries and the array's merged in id order, from both ends.
pub(super) struct Merged<'a> {
    held: Side<HeldIter<'a>>,
    settled: Side<SettledIter<'a>>,
}

/// One sorted source of [`Merged`], with the entry looked at, but not yet
/// taken, at each end.
struct Side<I: DoubleEndedIterator> {
    inner: I,
    front: Option<I::Item>,
    back: Option<I::Item>,
}

impl<I: DoubleEndedIterator> Side<I>
where
    I::Item: Copy,
{
    fn new(inner: I) -> Self {
        Side {
            inner,
            front: None,
            back: None,
        }
    }

    fn peek_front(&mut self) -> Option<I::Item> {
        if self.front.is_none() {
            self.front = self.inner.next().or_else(|| self.back.take());
        }
        self.front
    }

    fn peek_back(&mut self) -> Option<I::Item> {
        if self.back.is_none() {
            self.back = self.inner.next_back().or_else(|| self.front.take());
        }
        self.back
    }
}

fn of_held<'a>((id, held): (&'a String, &'a HeldAudit)) -> (AuditId<'a>, &'a HeldAudit) {
    (AuditId::Text(id), held)
}

fn of_settled<'a>((id, held): &'a ([u8; 16], HeldAudit)) -> (AuditId<'a>, &'a HeldAudit) {
    (AuditId::Uuid(id), held)
}

impl<'a> Iterator for Merged<'a> {
    type Item = (AuditId<'a>, &'a HeldAudit);

    fn next(&mut self) -> Option<Self::Item> {
        let take_held = match (self.held.peek_front(), self.settled.peek_front()) {
            (None, None) => return None,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(h), Some(s)) => of_held(h).0.cmp_text(of_settled(s).0).is_le(),
        };
        if take_held {
            self.held.front.take().map(of_held)
        } else {
            self.settled.front.take().map(of_settled)
        }
    }
}

impl DoubleEndedIterator for Merged<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        let take_held = match (self.held.peek_back(), self.settled.peek_back()) {
            (None, None) => return None,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(h), Some(s)) => of_held(h).0.cmp_text(of_settled(s).0).is_ge(),
        };
        if take_held {
            self.held.back.take().map(of_held)
        } else {
            self.settled.back.take().map(of_settled)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::history::Place;
    use crate::fs::state::AuditSummary;

    fn on_disk(n: u64) -> HeldAudit {
        Held::Disk {
            at: Place::in_snapshot(n * 100, 10).unwrap(),
            version: 0,
            summary: AuditSummary {
                time: chrono::Utc::now(),
                actor: "a".into(),
                action: "b".into(),
            },
        }
    }

    fn in_memory() -> HeldAudit {
        let record: orchestrator_core::access::AuditRecord = serde_json::from_value(
            serde_json::json!({"id": "x", "time": chrono::Utc::now(), "actor": "a",
                "action": "b", "outcome": "ok", "status": 200}),
        )
        .unwrap();
        Held::Memory {
            record: std::sync::Arc::new(record),
            at: None,
        }
    }

    /// Ids of every shape, settled and held, come out in their texts'
    /// order from the front, from the back, and after any key.
    #[test]
    fn the_tree_and_the_array_merge_in_text_order() {
        let mut log = AuditLog::default();
        let mut ids: Vec<String> = (0..40).map(|_| Uuid::now_v7().to_string()).collect();
        // Not canonical: upper case, no hyphens, not a UUID at all; all
        // kept in the tree wherever their texts sort.
        ids.push(Uuid::now_v7().to_string().to_uppercase());
        ids.push(Uuid::now_v7().simple().to_string());
        ids.extend(["0", "zz", "01", "ffffffff"].map(String::from));
        for (n, id) in ids.iter().enumerate().rev() {
            let held = if n % 3 == 0 {
                in_memory()
            } else {
                on_disk(n as u64)
            };
            log.insert(id.clone(), held);
        }
        let mut sorted = ids.clone();
        sorted.sort();
        let texts = |m: Merged<'_>| m.map(|(id, _)| id.text().into_owned()).collect::<Vec<_>>();
        assert_eq!(texts(log.iter()), sorted);
        let mut backwards = texts_back(&log);
        backwards.reverse();
        assert_eq!(backwards, sorted);
        assert_eq!(log.len(), ids.len());
        assert!(log.settled.len() > 20, "most settle: {}", log.settled.len());
        for (n, after) in sorted.iter().enumerate() {
            assert_eq!(
                texts(log.after(Some(after))),
                sorted[n + 1..],
                "after {after}"
            );
        }
        // Alternating ends meet in the middle without losing or repeating.
        let mut both = log.iter();
        let (mut front, mut back) = (Vec::new(), Vec::new());
        while let Some((id, _)) = both.next() {
            front.push(id.text().into_owned());
            match both.next_back() {
                Some((id, _)) => back.push(id.text().into_owned()),
                None => break,
            }
        }
        back.reverse();
        front.extend(back);
        assert_eq!(front, sorted);
        // Settling moves a record from the tree to the array, found either way.
        let first = &ids[0];
        assert!(matches!(log.get(first), Some(Held::Memory { .. })));
        log.insert(first.clone(), on_disk(7));
        assert!(matches!(log.get(first), Some(Held::Disk { .. })));
        assert_eq!(log.len(), ids.len());
        log.remove(&ids[..10]);
        assert_eq!(log.len(), ids.len() - 10);
        assert!(ids[..10].iter().all(|id| log.get(id).is_none()));
        assert!(ids[10..].iter().all(|id| log.get(id).is_some()));
    }

    fn texts_back(log: &AuditLog) -> Vec<String> {
        log.iter()
            .rev()
            .map(|(id, _)| id.text().into_owned())
            .collect()
    }
}
