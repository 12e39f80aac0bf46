//! The event bus: numbers each announced change and fans it out to every
//! subscriber through a bounded channel.
//!
//! A subscriber that falls behind never slows the engine down and never
//! makes the bus hold more: the channel drops its oldest events for that
//! subscriber, who then receives one `resync` event instead of them. The
//! bus also keeps the last events, so a subscriber that reconnects with the
//! last `seq` it saw resumes without a gap, or learns that it cannot.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use orchestrator_core::event::{Change, Event, EventKind};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use crate::lock;

/// How many events a subscriber may be behind before it must resync, and
/// how many the bus keeps for resumption. About 250 bytes each.
pub const DEFAULT_CAPACITY: usize = 4096;

/// Publishes the events of one node.
pub struct EventBus {
    node: String,
    /// Tells this life of the node from earlier ones: `seq` starts again
    /// at 1 after a restart.
    life: std::sync::Arc<str>,
    capacity: usize,
    sender: broadcast::Sender<Arc<Event>>,
    /// A std mutex, held only to number an event, send it and keep it: it
    /// is never held across an await. Numbering and sending under one lock
    /// makes the channel's order the `seq` order, and lets a subscriber
    /// join "after seq N" without a gap or a repeat between the replayed
    /// and the live events.
    numbered: Mutex<Numbered>,
}

struct Numbered {
    last_seq: u64,
    /// The newest events, oldest first, at most `capacity`.
    recent: VecDeque<Arc<Event>>,
}

impl EventBus {
    pub fn new(node: impl Into<String>, capacity: usize) -> EventBus {
        let capacity = capacity.max(1);
        EventBus {
            node: node.into(),
            life: Utc::now().timestamp_millis().to_string().into(),
            capacity,
            sender: broadcast::channel(capacity).0,
            numbered: Mutex::new(Numbered {
                last_seq: 0,
                recent: VecDeque::with_capacity(capacity.min(256)),
            }),
        }
    }

    /// Numbers and sends changes, in order. Call it only once the change
    /// is durable.
    pub fn publish(&self, changes: impl IntoIterator<Item = Change>) {
        let mut numbered = lock(&self.numbered);
        for change in changes {
            numbered.last_seq += 1;
            let event = Arc::new(change.into_event(numbered.last_seq, &self.node, Utc::now()));
            if numbered.recent.len() == self.capacity {
                numbered.recent.pop_front();
            }
            numbered.recent.push_back(event.clone());
            // No subscriber is not an error: the event is kept for resumption.
            let _ = self.sender.send(event);
        }
    }

    /// This life of the node: resuming from another life's `seq` is
    /// meaningless.
    pub fn life(&self) -> std::sync::Arc<str> {
        self.life.clone()
    }

    /// The `seq` of the newest event (0 before the first).
    pub fn last_seq(&self) -> u64 {
        lock(&self.numbered).last_seq
    }

    /// Events from now on.
    pub fn subscribe(&self) -> Subscription {
        let _numbered = lock(&self.numbered);
        Subscription::new(self.sender.subscribe(), VecDeque::new(), self.capacity)
    }

    /// Events after `seq`: the kept ones first, then live ones. If some
    /// after `seq` are no longer kept (or `seq` is from another life of
    /// this node), the subscription starts with a `resync`.
    pub fn subscribe_after(&self, seq: u64) -> Subscription {
        let numbered = lock(&self.numbered);
        let receiver = self.sender.subscribe();
        let oldest_kept = numbered
            .recent
            .front()
            .map_or(numbered.last_seq + 1, |e| e.seq);
        let mut replay: VecDeque<Arc<Event>> = numbered
            .recent
            .iter()
            .filter(|e| e.seq > seq)
            .cloned()
            .collect();
        if seq > numbered.last_seq || seq + 1 < oldest_kept {
            // From another life of the node, nobody knows how many.
            let missed = (seq <= numbered.last_seq).then(|| oldest_kept - seq - 1);
            replay.push_front(Arc::new(resync(missed, &self.node)));
        }
        Subscription::new(receiver, replay, self.capacity)
    }

    /// The most a subscriber can have waiting.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

fn resync(missed: Option<u64>, node: &str) -> Event {
    // A resync is not one of the node's events: it takes no number.
    Change::resync(missed).into_event(0, node, Utc::now())
}

/// One subscriber's view of the bus.
pub struct Subscription {
    replay: VecDeque<Arc<Event>>,
    receiver: broadcast::Receiver<Arc<Event>>,
    /// The `seq` of the last event handed out, to drop live events that
    /// were also replayed.
    last_seen: u64,
    /// The bus's capacity: the most its shared ring holds.
    capacity: usize,
}

impl Subscription {
    fn new(
        receiver: broadcast::Receiver<Arc<Event>>,
        replay: VecDeque<Arc<Event>>,
        capacity: usize,
    ) -> Subscription {
        Subscription {
            replay,
            receiver,
            last_seen: 0,
            capacity,
        }
    }

    /// The next event; a `resync` (with `missed` set) stands for the events
    /// this subscriber fell too far behind to receive. `None` once the bus
    /// is gone.
    pub async fn recv(&mut self) -> Option<Arc<Event>> {
        if let Some(event) = self.replay.pop_front() {
            self.last_seen = self.last_seen.max(event.seq);
            return Some(event);
        }
        loop {
            match self.receiver.recv().await {
                Ok(event) if event.seq <= self.last_seen => continue,
                Ok(event) => {
                    self.last_seen = event.seq;
                    return Some(event);
                }
                Err(RecvError::Lagged(missed)) => {
                    return Some(Arc::new(Event {
                        missed: Some(missed),
                        ..resync(None, "")
                    }));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }

    /// How many events wait for this subscriber and are still held for it:
    /// never more than the replayed ones plus the bus's capacity, however
    /// far behind it is (the channel counts the ones it dropped too).
    pub fn waiting(&self) -> usize {
        self.replay.len() + self.receiver.len().min(self.capacity)
    }
}

/// Whether an event is a resync.
pub fn is_resync(event: &Event) -> bool {
    event.kind == EventKind::Resync
}

#[cfg(test)]
mod tests {
    use orchestrator_core::TaskId;

    use super::*;

    fn change() -> Change {
        Change::log_appended(None, TaskId::new(), None, 1)
    }

    #[tokio::test]
    async fn events_are_numbered_in_order_and_resumable() {
        let bus = EventBus::new("n1", 8);
        let mut live = bus.subscribe();
        bus.publish([change(), change(), change()]);
        for seq in 1..=3 {
            let event = live.recv().await.unwrap();
            assert_eq!((event.seq, event.node.as_str()), (seq, "n1"));
        }
        let mut resumed = bus.subscribe_after(1);
        bus.publish([change()]);
        let seqs: Vec<u64> = [
            resumed.recv().await.unwrap(),
            resumed.recv().await.unwrap(),
            resumed.recv().await.unwrap(),
        ]
        .iter()
        .map(|e| e.seq)
        .collect();
        assert_eq!(seqs, [2, 3, 4], "replayed, then live, without a repeat");
    }

    #[tokio::test]
    async fn a_slow_subscriber_gets_a_resync_and_costs_bounded_memory() {
        let bus = EventBus::new("n1", 4);
        let mut slow = bus.subscribe();
        bus.publish((0..10).map(|_| change()));
        assert!(slow.waiting() <= 4);
        let first = slow.recv().await.unwrap();
        assert!(is_resync(&first));
        assert_eq!(first.missed, Some(6));
        assert_eq!(slow.recv().await.unwrap().seq, 7);
    }

    #[tokio::test]
    async fn a_gap_that_cannot_be_replayed_is_a_resync() {
        let bus = EventBus::new("n1", 2);
        bus.publish((0..5).map(|_| change()));
        let mut late = bus.subscribe_after(1);
        let first = late.recv().await.unwrap();
        assert!(is_resync(&first));
        assert_eq!(first.missed, Some(2), "seq 2 and 3 are lost");
        assert_eq!(late.recv().await.unwrap().seq, 4);
        // A seq from another life of the node (after a restart).
        let mut confused = bus.subscribe_after(99);
        assert!(is_resync(&confused.recv().await.unwrap()));
        // Exactly caught up: nothing to replay, no resync.
        let current = bus.subscribe_after(5);
        assert_eq!(current.waiting(), 0);
    }
}
