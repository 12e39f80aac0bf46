//! Finished work kept on disk, not in memory.
//!
//! Every workflow, task and audit record in memory remembers where its
//! latest line is ([`Place`]). Once a workflow has finished and that line
//! is durable, the workflow and its tasks are dropped from memory and kept
//! as [`Held::Disk`]: the place, the version (for compare-and-set and
//! replay) and the few fields the indexes and filters need; an audit
//! record, which never changes, as soon as its line is durable. Reading
//! one back reads its line ([`Files::read`]); the state keeps the ones read
//! lately parsed, in a bounded cache. A compaction copies them into the new
//! snapshot and points them there, one record a line.
//!
//! So memory holds what is running, what changed since the last compaction
//! and could not be evicted yet, that cache, and a few dozen bytes per
//! finished record.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use super::journal::reader::{Damage, parse_line};
use super::{JOURNAL_FILE, SNAPSHOT_FILE};
use crate::{Error, Record, RecordKind, Result};

/// A line longer than this is not read back for one record: its records
/// stay in memory until a compaction gives each a line of its own. (A
/// workflow's first line holds all its tasks.)
pub(super) const MAX_READ_BACK: usize = 16 * 1024;

/// Where a record's latest line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Place {
    pub offset: u64,
    /// Without the newline.
    pub len: u32,
    /// The journal line's number since the store opened, which orders its
    /// durability: a line is durable once any line numbered at or after it
    /// is. `0` for a snapshot line, durable before it is ever named.
    pub seq: u64,
}

impl Place {
    pub(super) fn in_snapshot(offset: u64, len: usize) -> Option<Place> {
        Some(Place {
            offset,
            len: u32::try_from(len).ok()?,
            seq: 0,
        })
    }

    pub(super) fn in_journal(offset: u64, len: usize, seq: u64) -> Option<Place> {
        (len <= MAX_READ_BACK).then_some(Place {
            offset,
            len: len as u32,
            seq,
        })
    }

    pub(super) fn in_journal_file(&self) -> bool {
        self.seq != 0
    }

    /// Whether the line is known to be durable once line `durable` is.
    pub(super) fn durable_with(&self, durable: u64) -> bool {
        self.seq <= durable
    }
}

/// A workflow, task or audit record as the state holds it.
#[derive(Debug, Clone)]
pub(super) enum Held<T, S> {
    /// In memory, with its latest line's place when that line can be read
    /// back for it.
    Memory { record: Arc<T>, at: Option<Place> },
    /// Finished and durable: only on disk, with what the indexes need.
    Disk { at: Place, version: u64, summary: S },
}

/// The files records are read back from. The snapshot is the one renamed
/// into place last; a compaction opens the new one and repoints every
/// record before the old one is gone and the journal emptied.
#[derive(Clone)]
pub(super) struct Files {
    pub dir: PathBuf,
    pub snapshot: Option<Arc<File>>,
    /// Opened to read (once it exists): appends and the compaction's
    /// emptying change it in place.
    pub journal: Option<Arc<File>>,
}

impl Files {
    /// The record of `kind` under `key` from the line at `at`.
    pub(super) fn read(&self, kind: RecordKind, key: &str, at: Place) -> Result<Record> {
        let bytes = self.read_line(at)?;
        let name = self.name(at);
        let line = parse_line(&bytes).map_err(|damage| self.damaged(name, at, &damage))?;
        line.into_records()
            .into_iter()
            .rev()
            .find(|r| r.kind() == kind && r.key() == key)
            .ok_or_else(|| Error::Corrupt {
                path: self.dir.join(name),
                line: 0,
                reason: format!(
                    "the line at byte {} no longer holds {kind} {key}; \
                     restore the data dir from a backup",
                    at.offset
                ),
            })
    }

    /// The line at `at`, framed as on disk, without its newline.
    pub(super) fn read_line(&self, at: Place) -> Result<Vec<u8>> {
        let name = self.name(at);
        let file = if at.in_journal_file() {
            &self.journal
        } else {
            &self.snapshot
        };
        let file = file.as_ref().ok_or_else(|| {
            Error::io(
                format!("read {}", self.dir.join(name).display()),
                std::io::Error::other("the file does not exist"),
            )
        })?;
        let mut bytes = vec![0; at.len as usize];
        file.read_exact_at(&mut bytes, at.offset)
            .map_err(|e| Error::io(format!("read {}", self.dir.join(name).display()), e))?;
        Ok(bytes)
    }

    fn name(&self, at: Place) -> &'static str {
        if at.in_journal_file() {
            JOURNAL_FILE
        } else {
            SNAPSHOT_FILE
        }
    }

    fn damaged(&self, name: &str, at: Place, damage: &Damage) -> Error {
        Error::Corrupt {
            path: self.dir.join(name),
            line: 0,
            reason: format!(
                "{damage} at byte {} on reading a finished record back; \
                 restore the data dir from a backup",
                at.offset
            ),
        }
    }
}
