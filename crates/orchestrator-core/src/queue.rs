//! The ready queue: which task a free worker takes next.
//!
//! Highest priority first, FIFO within a priority. Retries wait in a second
//! heap ordered by due time until `now` reaches them. The queue holds ids
//! only; whoever pops an id re-checks the task's stored status, so a task
//! cancelled while queued is dropped at pop time instead of being searched for.
//! A task known to be claimed elsewhere can be withdrawn, to spare that
//! re-check.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use chrono::{DateTime, Utc};

use crate::{Priority, TaskId};

#[derive(Debug, PartialEq, Eq)]
struct ReadyEntry {
    priority: Priority,
    /// Arrival order; lower arrived earlier.
    seq: u64,
    id: TaskId,
}

impl Ord for ReadyEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

impl PartialOrd for ReadyEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A task waiting for its due time: (due, arrival, priority, id), earliest first.
type DelayedEntry = Reverse<(DateTime<Utc>, u64, Priority, TaskId)>;

#[derive(Debug, Default)]
pub struct ReadyQueue {
    ready: BinaryHeap<ReadyEntry>,
    delayed: BinaryHeap<DelayedEntry>,
    /// Each queued id, with the `seq` of its one live entry. Pushing an id
    /// that is here is a no-op, so sources that may offer the same task
    /// twice (a poll of shared storage) are safe. An entry whose `seq` is
    /// not its id's here was withdrawn: a heap cannot remove from the
    /// middle, so such entries are dropped when they reach the top.
    members: HashMap<TaskId, u64>,
    next_seq: u64,
}

impl ReadyQueue {
    pub fn new() -> Self {
        Self::default()
    }

    fn seq(&mut self) -> u64 {
        self.next_seq += 1;
        self.next_seq
    }

    /// Adds a task that may run now (unless it is queued already).
    pub fn push(&mut self, id: TaskId, priority: Priority) {
        if !self.members.contains_key(&id) {
            let seq = self.seq();
            self.members.insert(id, seq);
            self.ready.push(ReadyEntry { priority, seq, id });
        }
    }

    /// Adds a task that may run from `due` on (unless it is queued already).
    pub fn push_at(&mut self, id: TaskId, priority: Priority, due: DateTime<Utc>) {
        if !self.members.contains_key(&id) {
            let seq = self.seq();
            self.members.insert(id, seq);
            self.delayed.push(Reverse((due, seq, priority, id)));
        }
    }

    /// Takes a task out (it was claimed elsewhere); whether it was queued.
    pub fn withdraw(&mut self, id: TaskId) -> bool {
        self.members.remove(&id).is_some()
    }

    pub fn contains(&self, id: TaskId) -> bool {
        self.members.contains_key(&id)
    }

    fn is_live(&self, id: TaskId, seq: u64) -> bool {
        self.members.get(&id) == Some(&seq)
    }

    /// The next task to run at `now`, if any.
    pub fn pop(&mut self, now: DateTime<Utc>) -> Option<TaskId> {
        while let Some(Reverse((due, seq, priority, id))) = self.delayed.peek().copied() {
            if due > now {
                break;
            }
            self.delayed.pop();
            if self.is_live(id, seq) {
                // Due now: it joins the ready ones, after those already there.
                let seq = self.seq();
                self.members.insert(id, seq);
                self.ready.push(ReadyEntry { priority, seq, id });
            }
        }
        while let Some(entry) = self.ready.pop() {
            if self.is_live(entry.id, entry.seq) {
                self.members.remove(&entry.id);
                return Some(entry.id);
            }
        }
        None
    }

    /// When the earliest delayed task becomes due, if any is waiting (a
    /// withdrawn one may answer early: the pop then finds nothing due).
    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        self.delayed.peek().map(|Reverse((due, ..))| *due)
    }

    /// Tasks ready now, by priority.
    pub fn ready_by_priority(&self) -> [(Priority, usize); 4] {
        let mut counts = [
            Priority::Low,
            Priority::Normal,
            Priority::High,
            Priority::Critical,
        ]
        .map(|p| (p, 0));
        for entry in self.ready.iter().filter(|e| self.is_live(e.id, e.seq)) {
            counts[entry.priority as usize].1 += 1;
        }
        counts
    }

    /// Tasks queued, ready or waiting for their due time.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn higher_priority_first_then_fifo() {
        let mut q = ReadyQueue::new();
        let ids: Vec<TaskId> = (0..6).map(|_| TaskId::new()).collect();
        q.push(ids[0], Priority::Low);
        q.push(ids[1], Priority::Normal);
        q.push(ids[2], Priority::Critical);
        q.push(ids[3], Priority::Normal);
        q.push(ids[4], Priority::High);
        q.push(ids[5], Priority::Critical);
        let order: Vec<TaskId> = std::iter::from_fn(|| q.pop(at(0))).collect();
        assert_eq!(order, vec![ids[2], ids[5], ids[4], ids[1], ids[3], ids[0]]);
        assert!(q.is_empty());
    }

    #[test]
    fn delayed_tasks_wait_until_due() {
        let mut q = ReadyQueue::new();
        let later = TaskId::new();
        let now_task = TaskId::new();
        q.push_at(later, Priority::Critical, at(10));
        q.push(now_task, Priority::Low);
        assert_eq!(q.next_due(), Some(at(10)));
        assert_eq!(q.pop(at(5)), Some(now_task));
        assert_eq!(q.pop(at(5)), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop(at(10)), Some(later));
        assert_eq!(q.next_due(), None);
    }

    #[test]
    fn a_due_retry_competes_by_priority() {
        let mut q = ReadyQueue::new();
        let retry = TaskId::new();
        let fresh = TaskId::new();
        q.push(fresh, Priority::Normal);
        q.push_at(retry, Priority::High, at(1));
        assert_eq!(q.pop(at(2)), Some(retry));
        assert_eq!(q.pop(at(2)), Some(fresh));
    }

    #[test]
    fn a_task_is_queued_once_however_often_it_is_offered() {
        let mut q = ReadyQueue::new();
        let id = TaskId::new();
        q.push(id, Priority::Normal);
        q.push(id, Priority::Normal);
        q.push_at(id, Priority::Normal, at(5));
        assert_eq!(q.len(), 1);
        assert!(q.contains(id));
        assert_eq!(q.pop(at(0)), Some(id));
        assert_eq!(q.pop(at(10)), None);
        q.push(id, Priority::Normal);
        assert_eq!(q.len(), 1, "after a pop it may be queued again");
    }

    #[test]
    fn counts_ready_tasks_by_priority() {
        let mut q = ReadyQueue::new();
        q.push(TaskId::new(), Priority::High);
        q.push(TaskId::new(), Priority::High);
        q.push(TaskId::new(), Priority::Low);
        q.push_at(TaskId::new(), Priority::Low, at(100));
        let counts = q.ready_by_priority();
        assert_eq!(counts[Priority::High as usize], (Priority::High, 2));
        assert_eq!(counts[Priority::Low as usize], (Priority::Low, 1));
        assert_eq!(q.len(), 4);
    }

    #[test]
    fn a_withdrawn_task_is_never_popped_and_may_be_queued_again() {
        let mut q = ReadyQueue::new();
        let (a, b, c) = (TaskId::new(), TaskId::new(), TaskId::new());
        q.push(a, Priority::High);
        q.push(b, Priority::Normal);
        q.push_at(c, Priority::Normal, at(5));
        assert!(q.withdraw(a));
        assert!(q.withdraw(c));
        assert!(!q.withdraw(c), "withdrawn once");
        assert_eq!((q.len(), q.contains(a)), (1, false));
        assert_eq!(q.ready_by_priority()[Priority::High as usize].1, 0);
        assert_eq!(q.pop(at(10)), Some(b));
        assert_eq!(q.pop(at(10)), None);
        // Queued again later (say, interrupted elsewhere): the new entry
        // counts, the stale one never comes back.
        q.push(a, Priority::Low);
        q.push_at(c, Priority::Normal, at(20));
        assert_eq!(q.pop(at(10)), Some(a));
        assert_eq!(q.pop(at(10)), None);
        assert_eq!(q.pop(at(20)), Some(c));
        assert!(q.is_empty());
    }
}
