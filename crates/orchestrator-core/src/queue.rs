//! The ready queue: which task a free worker takes next.
//!
//! Highest priority first, FIFO within a priority. Retries wait in a second
//! heap ordered by due time until `now` reaches them. The queue holds ids
//! only; whoever pops an id re-checks the task's stored status, so a task
//! cancelled while queued is dropped at pop time instead of being searched for.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

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
    /// Ids in either heap: pushing one again is a no-op, so sources that
    /// may offer the same task twice (a poll of shared storage) are safe.
    members: std::collections::HashSet<TaskId>,
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
        if self.members.insert(id) {
            let seq = self.seq();
            self.ready.push(ReadyEntry { priority, seq, id });
        }
    }

    /// Adds a task that may run from `due` on (unless it is queued already).
    pub fn push_at(&mut self, id: TaskId, priority: Priority, due: DateTime<Utc>) {
        if self.members.insert(id) {
            let seq = self.seq();
            self.delayed.push(Reverse((due, seq, priority, id)));
        }
    }

    pub fn contains(&self, id: TaskId) -> bool {
        self.members.contains(&id)
    }

    /// The next task to run at `now`, if any.
    pub fn pop(&mut self, now: DateTime<Utc>) -> Option<TaskId> {
        while let Some(Reverse((due, _, priority, id))) = self.delayed.peek().copied() {
            if due > now {
                break;
            }
            self.delayed.pop();
            let seq = self.seq();
            self.ready.push(ReadyEntry { priority, seq, id });
        }
        let id = self.ready.pop()?.id;
        self.members.remove(&id);
        Some(id)
    }

    /// When the earliest delayed task becomes due, if any is waiting.
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
        for entry in &self.ready {
            counts[entry.priority as usize].1 += 1;
        }
        counts
    }

    pub fn len(&self) -> usize {
        self.ready.len() + self.delayed.len()
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
}
