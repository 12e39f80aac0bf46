//! The change feed: committed changes that any node made to a shared store,
//! as values, through a bounded channel that never blocks its producer.
//!
//! A producer (a backend's pump) holds the [`ChangeSink`], the consumer the
//! [`ChangeFeed`]. When the consumer falls behind and the channel is full,
//! changes are dropped, not queued, and the consumer is told once, with
//! [`Change::Lost`], as soon as there is room again: memory stays bounded
//! and the producer never waits on a slow consumer.

use orchestrator_core::{Task, TaskId, Workflow};
use tokio::sync::mpsc;

/// One committed change, or the news that some were missed.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A task was created (`created`) or replaced.
    Task { created: bool, task: Task },
    /// A workflow was created (`created`) or replaced.
    Workflow { created: bool, workflow: Workflow },
    /// A task's log grew to `length` bytes.
    Log { task: TaskId, length: u64 },
    /// The feed broke (connection lost, notifications dropped) and was
    /// re-established: changes in between may be missing, so re-read state.
    Lost { reason: String },
}

/// The receiving end of a change feed. `recv` answers `None` once the
/// store is closed (or the producer is gone).
#[derive(Debug)]
pub struct ChangeFeed {
    changes: mpsc::Receiver<Change>,
}

impl ChangeFeed {
    /// A feed that holds at most `capacity` changes not yet received, and
    /// the sink that fills it.
    pub fn channel(capacity: usize) -> (ChangeSink, ChangeFeed) {
        let (sender, changes) = mpsc::channel(capacity.max(1));
        (
            ChangeSink {
                sender,
                owed_loss: None,
            },
            ChangeFeed { changes },
        )
    }

    /// The next change; `None` once the store is closed.
    pub async fn recv(&mut self) -> Option<Change> {
        self.changes.recv().await
    }
}

/// The producing end of a change feed: it never waits for room.
#[derive(Debug)]
pub struct ChangeSink {
    sender: mpsc::Sender<Change>,
    /// Why changes were dropped, until a [`Change::Lost`] saying so is
    /// delivered.
    owed_loss: Option<String>,
}

impl ChangeSink {
    /// Offers a change without waiting. A full feed drops it (and owes the
    /// consumer a [`Change::Lost`]). Returns `false` once the consumer is
    /// gone, so the producer can stop.
    pub fn send(&mut self, change: Change) -> bool {
        if self.owed_loss.is_some() {
            // A change after a gap must not arrive before the news of the
            // gap: deliver the `Lost` first, or drop this change as well.
            match self.try_deliver_loss() {
                Delivery::Sent => {}
                Delivery::Full => return true,
                Delivery::Closed => return false,
            }
        }
        match self.sender.try_send(change) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.owed_loss = Some("the change feed was full: its reader fell behind".into());
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Records that changes were missed for `reason` (a broken connection):
    /// a [`Change::Lost`] is delivered before the next change.
    pub fn lost(&mut self, reason: impl Into<String>) -> bool {
        let reason = reason.into();
        self.owed_loss = Some(match self.owed_loss.take() {
            Some(earlier) if earlier != reason => format!("{earlier}; {reason}"),
            _ => reason,
        });
        !matches!(self.try_deliver_loss(), Delivery::Closed)
    }

    /// Whether a [`Change::Lost`] is waiting for room in the feed.
    pub fn owes_loss(&self) -> bool {
        self.owed_loss.is_some()
    }

    /// Waits for room and delivers the owed [`Change::Lost`], if any.
    /// Cancel-safe: dropped before room appears, it delivers nothing.
    /// Returns `false` once the consumer is gone.
    pub async fn settle(&mut self) -> bool {
        let Some(reason) = self.owed_loss.clone() else {
            return !self.sender.is_closed();
        };
        match self.sender.reserve().await {
            Ok(permit) => {
                permit.send(Change::Lost { reason });
                self.owed_loss = None;
                true
            }
            Err(_) => false,
        }
    }

    /// Resolves once the consumer is gone (the feed dropped).
    pub async fn closed(&self) {
        self.sender.closed().await;
    }

    /// Whether the consumer is gone.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    fn try_deliver_loss(&mut self) -> Delivery {
        let Some(reason) = self.owed_loss.take() else {
            return Delivery::Sent;
        };
        match self.sender.try_send(Change::Lost { reason }) {
            Ok(()) => Delivery::Sent,
            Err(mpsc::error::TrySendError::Full(Change::Lost { reason })) => {
                self.owed_loss = Some(reason);
                Delivery::Full
            }
            Err(mpsc::error::TrySendError::Full(_)) => Delivery::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Closed,
        }
    }
}

enum Delivery {
    Sent,
    Full,
    Closed,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly by design
mod tests {
    use super::*;

    fn log(length: u64) -> Change {
        Change::Log {
            task: TaskId::from_uuid(uuid::Uuid::nil()),
            length,
        }
    }

    #[tokio::test]
    async fn a_full_feed_drops_changes_and_says_so_once_when_there_is_room() {
        let (mut sink, mut feed) = ChangeFeed::channel(2);
        assert!(sink.send(log(1)));
        assert!(sink.send(log(2)));
        assert!(sink.send(log(3)), "dropped, not refused");
        assert!(sink.send(log(4)));
        assert!(sink.owes_loss());
        assert_eq!(feed.recv().await, Some(log(1)));
        assert_eq!(feed.recv().await, Some(log(2)));
        // Room again: the news of the gap goes first, then the change.
        assert!(sink.send(log(5)));
        assert!(matches!(feed.recv().await, Some(Change::Lost { .. })));
        assert_eq!(feed.recv().await, Some(log(5)));
        assert!(!sink.owes_loss());
    }

    #[tokio::test]
    async fn a_loss_is_delivered_when_room_appears_even_without_new_changes() {
        let (mut sink, mut feed) = ChangeFeed::channel(1);
        assert!(sink.send(log(1)));
        assert!(sink.lost("connection lost"));
        assert!(sink.owes_loss());
        let settled = tokio::spawn(async move {
            assert!(sink.settle().await);
            sink
        });
        assert_eq!(feed.recv().await, Some(log(1)));
        assert_eq!(
            feed.recv().await,
            Some(Change::Lost {
                reason: "connection lost".into()
            })
        );
        let sink = settled.await.unwrap();
        drop(feed);
        assert!(sink.is_closed());
    }

    #[tokio::test]
    async fn a_dropped_feed_stops_the_producer() {
        let (mut sink, feed) = ChangeFeed::channel(4);
        drop(feed);
        assert!(!sink.send(log(1)));
        assert!(!sink.lost("gone"));
    }
}
