//! The journal, `journal.jsonl`: every change since the last compaction,
//! one line each (see [`super::line`]), appended by the [`writer`] with
//! group commit, and read, with the snapshot, by the one [`reader`], which
//! holds the one rule for a line torn by a crash.

pub(super) mod reader;
mod writer;

pub(crate) use self::writer::{JournalWriter, Pending, SnapshotJob};
