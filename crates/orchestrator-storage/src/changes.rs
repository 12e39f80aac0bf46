//! The change feed: committed changes that any node made to a shared store,
//! as values, through a bounded channel that never blocks its producer.
//!
//! A producer (a backend's pump) holds the [`ChangeSink`], the consumer the
//! [`ChangeFeed`]. When the consumer falls behind and the channel is full,
//! changes are dropped, not queued, and the consumer is told once, with
//! [`Change::Lost`], as soon as there is room again: memory stays bounded
//! and the producer never waits on a slow consumer.

use orchestrator_core::{Task, TaskId, Workflow};
use tokio::sync::{mpsc, watch};

/// One committed change, or the news that some were missed.
// Almost every change is a task's: boxing it would cost an allocation per
// change to save the stack of the rare small variants.
#[allow(clippy::large_enum_variant)]
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
///
/// What a feed promises (see `docs/storage.md`): only committed changes;
/// each at most once; every change committed while it follows the store,
/// unless a [`Change::Lost`] says some are missing (the feed broke, or
/// its reader fell behind), after which the reader should re-read what it
/// cares about. It does **not** promise commit order: a SurrealDB server
/// may deliver the notifications of two transactions swapped, even for one
/// record. Each change carries what orders it: a task's or workflow's
/// `version`, a log's `length`; a change below what the reader has seen is
/// stale.
#[derive(Debug)]
pub struct ChangeFeed {
    changes: mpsc::Receiver<Change>,
    /// Whether the producer follows the store right now.
    following: watch::Receiver<bool>,
}

impl ChangeFeed {
    /// A feed that holds at most `capacity` changes not yet received, and
    /// the sink that fills it.
    pub fn channel(capacity: usize) -> (ChangeSink, ChangeFeed) {
        let (sender, changes) = mpsc::channel(capacity.max(1));
        let following = watch::Sender::new(false);
        let feed = ChangeFeed {
            changes,
            following: following.subscribe(),
        };
        let sink = ChangeSink {
            sender,
            owed_loss: None,
            following,
        };
        (sink, feed)
    }

    /// The next change; `None` once the store is closed.
    pub async fn recv(&mut self) -> Option<Change> {
        self.changes.recv().await
    }

    /// Waits until the feed follows the store: every change committed from
    /// then on is delivered (until a [`Change::Lost`]). A feed starts to
    /// follow a moment after it is made, once its subscriptions are
    /// registered. `false` if the feed ended first.
    pub async fn following(&mut self) -> bool {
        self.following
            .wait_for(|following| *following)
            .await
            .is_ok()
    }
}

/// The producing end of a change feed: it never waits for room.
#[derive(Debug)]
pub struct ChangeSink {
    sender: mpsc::Sender<Change>,
    /// Why changes were dropped, until a [`Change::Lost`] saying so is
    /// delivered.
    owed_loss: Option<String>,
    /// Whether the producer follows the store, for [`ChangeFeed::following`].
    following: watch::Sender<bool>,
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

    /// Records that changes were missed, for `reason` (a broken
    /// connection): a [`Change::Lost`] is delivered before the next change,
    /// or by [`ChangeSink::tend`].
    pub fn lost(&mut self, reason: impl Into<String>) {
        let reason = reason.into();
        self.owed_loss = Some(match self.owed_loss.take() {
            Some(earlier) if earlier != reason => format!("{earlier}; {reason}"),
            _ => reason,
        });
    }

    /// Whether a [`Change::Lost`] is waiting for room in the feed.
    pub fn owes_loss(&self) -> bool {
        self.owed_loss.is_some()
    }

    /// Says whether the producer follows the store right now (see
    /// [`ChangeFeed::following`]).
    pub fn set_following(&self, following: bool) {
        self.following.send_replace(following);
    }

    /// What the sink needs between changes: waits for room and delivers an
    /// owed [`Change::Lost`] (then `true`), or notices that the consumer is
    /// gone (then `false`; with nothing owed, that is all it waits for).
    /// Cancel-safe: dropped before it resolves, it delivers nothing.
    pub async fn tend(&mut self) -> bool {
        let Some(reason) = self.owed_loss.clone() else {
            self.sender.closed().await;
            return false;
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
        sink.lost("connection lost");
        assert!(sink.owes_loss());
        let tended = tokio::spawn(async move {
            assert!(sink.tend().await, "delivered");
            sink
        });
        assert_eq!(feed.recv().await, Some(log(1)));
        assert_eq!(
            feed.recv().await,
            Some(Change::Lost {
                reason: "connection lost".into()
            })
        );
        let mut sink = tended.await.unwrap();
        assert!(!sink.owes_loss());
        drop(feed);
        assert!(!sink.tend().await, "the reader is gone");
        assert!(sink.is_closed());
    }

    #[tokio::test]
    async fn a_dropped_feed_stops_the_producer() {
        let (mut sink, feed) = ChangeFeed::channel(4);
        drop(feed);
        assert!(!sink.send(log(1)));
        sink.lost("gone");
        assert!(!sink.tend().await);
    }

    #[tokio::test]
    async fn a_feed_says_when_it_follows_and_when_it_ended() {
        let (sink, mut feed) = ChangeFeed::channel(4);
        sink.set_following(true);
        assert!(feed.following().await);
        sink.set_following(false);
        drop(sink);
        assert!(!feed.following().await);
        assert_eq!(feed.recv().await, None);
    }
}
