//! The filesystem backend: the embedded default, no database.
//!
//! Layout of `--data-dir` (see `docs/storage.md`):
//!
//! ```text
//! layout.json      {"layout_version": 3}; upgraded if older, refused if newer than this build
//! LOCK             held (flock) while a service has the dir open
//! snapshot.jsonl   every record as of the last compaction, one checksummed line each
//! journal.jsonl    every change since, appended with group commit
//! logs/<n>.pack    captured script output, many logs a file
//! ```
//!
//! Every index lives in memory, rebuilt at open from the snapshot and the
//! journal, and so does every record except finished work, which is read
//! back from its line (`history`). A write changes memory and queues its
//! journal line under one lock (so the journal order is the memory order),
//! then waits, outside the lock, until the line is durable.
//!
//! This module is the backend's facade: it opens the dir, orders every
//! write (commit, compare-and-set, compaction) and holds the lifecycle and
//! the node's heartbeats. Each other storage trait has a file, as the
//! SurrealDB backend's do: `tasks`, `access`, `schedules`, `retention`,
//! `transfer`, `webhooks`. The files on disk are handled by concern: `line`, the one
//! format of a journal or snapshot line; `journal`, its writer (group
//! commit) and its one reader, with the one rule for a line torn by a
//! crash; `snapshot`, what a compaction writes; `logs`, the task logs'
//! packs; `layout`, `layout.json`; `atomic`, writing a file whole. `state` holds the records with their
//! indexes, `history` the finished ones kept on disk, and `indexed` is the
//! migration's view of a store, which keeps only where its records are.

mod access;
pub(crate) mod atomic;
mod history;
mod indexed;
pub(crate) mod journal;
mod layout;
mod line;
mod locks;
mod logs;
mod retention;
mod schedules;
pub(crate) mod snapshot;
mod state;
mod tasks;
mod transfer;
mod webhooks;

pub use self::indexed::IndexedStore;
pub use self::layout::{LAYOUT_VERSION, layout_version};
pub use self::logs::{read_task_logs, write_task_logs};
pub use self::state::InMemory;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use orchestrator_core::{Node, WorkflowId};

use self::history::{Files, Place};
use self::journal::reader::{LineFile, read_strictly};
use self::journal::{JournalWriter, Pending};
pub(crate) use self::layout::layout_status;
use self::layout::{Access, check_layout};
use self::line::Line;
use self::logs::{Logs, Mode};
use self::snapshot::Compaction;
use self::state::{Applied, State};
use crate::{Backend, ChangeFeed, Error, NodeStore, Result};

const SNAPSHOT_FILE: &str = "snapshot.jsonl";

const JOURNAL_FILE: &str = "journal.jsonl";

const LOGS_DIR: &str = "logs";

/// Prepares `dir` for a store that writes to it, the service's or an
/// import's: creates it, takes its lock (held while the returned file is
/// open), brings its layout up to date, and creates `logs/`.
fn open_data_dir(dir: &Path) -> Result<File> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("create data dir {}", dir.display()), e))?;
    let lock_path = dir.join("LOCK");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io(format!("open {}", lock_path.display()), e))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(Error::Locked {
                dir: dir.to_path_buf(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(Error::io(format!("lock {}", lock_path.display()), e));
        }
    }
    check_layout(dir, Access::Upgrade)?;
    let logs_dir = dir.join(LOGS_DIR);
    std::fs::create_dir_all(&logs_dir)
        .map_err(|e| Error::io(format!("create {}", logs_dir.display()), e))?;
    Ok(lock)
}

/// Lets go of a data dir's lock (from [`open_data_dir`]). Unlocked, not
/// only closed: a child process forked meanwhile (a script being spawned
/// by this process) holds a copy of the descriptor until it execs, and a
/// lock left to the closing would last as long as that copy, so that a
/// restart in this process could find its own dir still locked.
fn release_data_dir(lock: Option<File>) {
    if let Some(lock) = lock
        && let Err(e) = lock.unlock()
    {
        tracing::warn!(error = %e, "cannot unlock the data dir; closing its lock file instead");
    }
}

/// `path` opened to read, if it exists.
fn open_to_read(path: &Path) -> Result<Option<Arc<File>>> {
    match File::open(path) {
        Ok(file) => Ok(Some(Arc::new(file))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("open {}", path.display()), e)),
    }
}

/// Tuning knobs; the defaults suit production.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Compact the journal into the snapshot once it grows past this size.
    pub compact_after_bytes: u64,
    /// Keep unfinished work on disk too, as finished work is, so that
    /// every read is a read back from its line. For tests: it makes every
    /// step of running work parse its records again.
    pub evict_unfinished: bool,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            compact_after_bytes: 64 * 1024 * 1024,
            evict_unfinished: false,
        }
    }
}

pub struct FsBackend {
    dir: PathBuf,
    /// The task logs; shared with the blocking pool, where they are read
    /// and written.
    logs: Arc<Logs>,
    options: FsOptions,
    /// A std mutex: it guards plain in-memory maps and is never held across
    /// an `.await`; durability is awaited after it is released. Shared with
    /// the journal writer thread, which points records at their new lines
    /// when a compaction is done.
    state: Arc<Mutex<State>>,
    /// The journal writer. (Always there: a read-only open is an
    /// [`IndexedStore`].)
    journal: Option<JournalWriter>,
    /// Heartbeats. Only this process can use the dir (the lock), so there
    /// is one node, and its heartbeats need not outlive it.
    nodes: Mutex<std::collections::BTreeMap<String, Node>>,
    /// Holds the `LOCK` file's advisory lock until the store is closed
    /// (or dropped), so that a restart in the same process can reopen it.
    lock: Mutex<Option<File>>,
    /// The named locks (`locks.json`); a tokio mutex, as it is held
    /// across the file's write.
    locks:
        tokio::sync::Mutex<std::collections::BTreeMap<String, orchestrator_core::lock::LockRecord>>,
}

impl FsBackend {
    pub async fn open(dir: &Path, options: FsOptions) -> Result<FsBackend> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(dir, options))
            .await
            .map_err(|e| Error::io("open storage", std::io::Error::other(e)))?
    }

    fn open_blocking(dir: PathBuf, options: FsOptions) -> Result<FsBackend> {
        let lock = open_data_dir(&dir)?;
        let logs_dir = dir.join(LOGS_DIR);
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        // Opened before reading: finished records are read back from them.
        let files = Files {
            dir: dir.clone(),
            snapshot: open_to_read(&snapshot_path)?,
            journal: open_to_read(&journal_path)?,
        };
        let mut state = State::new(files, options.evict_unfinished);
        // Every line read back is durable: what finished is evicted as it
        // is read.
        read_strictly(&snapshot_path, LineFile::Snapshot, |line, place| {
            let at = Place::in_snapshot(place.offset, place.len);
            state.apply(line, Applied { at, durable: true })
        })?;
        let mut seq = 0;
        let journal_bytes = read_strictly(&journal_path, LineFile::Journal, |line, place| {
            seq += 1;
            let at = Place::in_journal(place.offset, place.len, seq);
            state.apply(line, Applied { at, durable: true })
        })?;
        state.journal_bytes = journal_bytes;
        state.last_seq = seq;
        // After the records: a log whose task is not among them was left by
        // a crash in the middle of a prune.
        let logs = Logs::open(&logs_dir, Mode::Write, |id| {
            state.task_version(id).is_some()
        })?;
        let in_memory = state.in_memory();
        tracing::info!(
            dir = %dir.display(),
            tasks = state.task_count(),
            workflows = state.workflow_count(),
            tasks_in_memory = in_memory.tasks,
            workflows_in_memory = in_memory.workflows,
            audit_records_in_memory = in_memory.audit,
            "filesystem storage opened"
        );
        let journal = JournalWriter::start(journal_path.clone(), snapshot_path)?;
        if state.files().journal.is_none() {
            // The writer has just created it.
            state.set_journal(open_to_read(&journal_path)?);
        }
        let locks = locks::read(&dir)?;
        Ok(FsBackend {
            dir,
            logs: Arc::new(logs),
            options,
            state: Arc::new(Mutex::new(state)),
            journal: Some(journal),
            nodes: Mutex::new(Default::default()),
            lock: Mutex::new(Some(lock)),
            locks: tokio::sync::Mutex::new(locks),
        })
    }

    /// How many workflows, tasks and audit records are held in memory
    /// rather than read back from disk: what is running, and what changed
    /// since the last compaction and could not be evicted yet.
    pub fn records_in_memory(&self) -> InMemory {
        self.lock_state().in_memory()
    }

    fn writer(&self) -> Result<&JournalWriter> {
        self.journal
            .as_ref()
            .ok_or_else(|| Error::ReadOnly(self.dir.display().to_string()))
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied change:
        // every mutation is one map insert after all checks.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies records in memory and queues their journal lines, under the
    /// state lock; returns the write to await once the lock is released.
    fn commit(&self, state: &mut State, record: Line) -> Result<Pending> {
        let pending = self.append(state, record)?;
        if state.journal_bytes > self.options.compact_after_bytes {
            self.queue_compaction(state)?;
        }
        Ok(pending)
    }

    /// [`FsBackend::commit`] without the compaction a long journal calls
    /// for: a bulk import (a storage move's copy into this store) would
    /// otherwise snapshot the growing store again every
    /// `compact_after_bytes`; the first ordinary write after it compacts
    /// once.
    fn append(&self, state: &mut State, record: Line) -> Result<Pending> {
        let mut bytes = Vec::new();
        record
            .encode_into(&mut bytes)
            .map_err(|e| Error::io("serialize record", std::io::Error::other(e)))?;
        // The journal holds exactly the bytes appended since the last
        // compaction emptied it, in this order: the line lands there.
        let (offset, len, seq) = (state.journal_bytes, bytes.len(), state.last_seq + 1);
        let pending = self.writer()?.append(bytes)?;
        state.journal_bytes += len as u64;
        state.last_seq = seq;
        let at = Place::in_journal(offset, len - 1, seq);
        state.apply(record, Applied { at, durable: false });
        Ok(pending)
    }

    /// Once a write that touched workflow `id` is durable (its line, `seq`,
    /// and with it every line before), drops the workflow from memory if
    /// it has finished.
    fn evict_finished(&self, id: WorkflowId, seq: u64) {
        self.lock_state().evict_finished(id, seq, true);
    }

    /// Commits one line and waits until it is durable.
    async fn write(&self, line: Line) -> Result<()> {
        let pending = self.commit(&mut self.lock_state(), line)?;
        pending.durable().await
    }

    /// Commits `line` if the record under `key` is stored at version
    /// `expected` (compare-and-set, checked and applied under the state
    /// lock), and waits until it is durable.
    async fn compare_and_set(
        &self,
        what: &'static str,
        key: String,
        expected: u64,
        stored_version: impl Fn(&State, &str) -> Option<u64>,
        line: Line,
    ) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            let found = stored_version(&state, &key).ok_or_else(|| Error::NotFound {
                what,
                id: key.clone(),
            })?;
            same_version(what, key, expected, found)?;
            self.commit(&mut state, line)?
        };
        pending.durable().await
    }

    /// Queues a compaction of everything in `state`. Only copies are made
    /// under the state lock (tasks are shared, so those are pointer copies);
    /// the journal writer encodes them, outside the lock.
    fn queue_compaction(&self, state: &mut State) -> Result<()> {
        drop(self.compaction(state)?);
        Ok(())
    }

    /// [`FsBackend::queue_compaction`], with the write to await.
    fn compaction(&self, state: &mut State) -> Result<Pending> {
        let job = Compaction::take(state, self.state.clone())?;
        state.journal_bytes = 0;
        // A failed snapshot poisons the journal, and every later write
        // reports it, whether or not anyone awaits it.
        self.writer()?.snapshot(Box::new(job))
    }
}

#[async_trait]
impl Backend for FsBackend {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    async fn health(&self) -> Result<()> {
        match &self.journal {
            Some(journal) => journal.check_open(),
            // Read-only: reads are served from memory.
            None => Ok(()),
        }
    }

    async fn close(&self) -> Result<()> {
        if let Some(journal) = &self.journal {
            journal.shutdown();
        }
        release_data_dir(self.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
        tracing::info!(dir = %self.dir.display(), "filesystem storage closed");
        Ok(())
    }
}

#[async_trait]
impl NodeStore for FsBackend {
    fn shared(&self) -> bool {
        false
    }

    async fn heartbeat(&self, node: &Node) -> Result<()> {
        self.writer()?.check_usable()?;
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.id.clone(), node.clone());
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<Node>> {
        Ok(self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect())
    }

    /// One process per data dir: the engine knows its own writes.
    fn changes(&self) -> Option<ChangeFeed> {
        None
    }
}

/// A compare-and-set's check: the record is stored at the version the
/// caller read, or the write is a conflict.
pub(super) fn same_version(
    what: &'static str,
    id: impl ToString,
    expected: u64,
    found: u64,
) -> Result<()> {
    if found == expected {
        Ok(())
    } else {
        Err(Error::Conflict {
            what,
            id: id.to_string(),
            expected,
            found,
        })
    }
}

impl Drop for FsBackend {
    fn drop(&mut self) {
        if let Some(journal) = &self.journal {
            journal.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use super::*;

    /// A copy of the lock's descriptor that outlives the store, as a child
    /// forked while a script was being spawned holds one until it execs,
    /// does not keep the dir locked once the store lets go of it.
    #[test]
    fn a_released_dir_opens_again_while_a_copy_of_its_lock_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let lock = open_data_dir(dir.path()).unwrap();
        let copy = lock.try_clone().unwrap();
        assert!(matches!(
            open_data_dir(dir.path()),
            Err(Error::Locked { .. })
        ));
        release_data_dir(Some(lock));
        let reopened = open_data_dir(dir.path());
        drop(copy);
        reopened.unwrap();
    }
}
