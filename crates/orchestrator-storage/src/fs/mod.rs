//! The filesystem backend: the embedded default, no database.
//!
//! Layout of `--data-dir` (see `docs/storage.md`):
//!
//! ```text
//! layout.json      {"layout_version": 2}; upgraded if older, refused if newer than this build
//! LOCK             held (flock) while a service has the dir open
//! snapshot.jsonl   every record as of the last compaction, one checksummed line each
//! journal.jsonl    every change since, appended with group commit
//! logs/<task>.log  captured script output
//! ```
//!
//! All records live in memory with their indexes, rebuilt at open from the
//! snapshot and the journal. A write changes memory and queues its journal
//! line under one lock (so the journal order is the memory order), then
//! waits, outside the lock, until the line is durable.
//!
//! This module is the backend's facade: it opens the dir and implements the
//! storage traits. The rest is by concern: `line`, the one format of a
//! journal or snapshot line; `journal`, its writer (group commit) and its
//! one reader, with the one rule for a line torn by a crash; `snapshot`,
//! what a compaction writes; `logs`, the task log files; `layout`,
//! `layout.json`; `state`, the records in memory with their indexes; and
//! `indexed`, the migration's view, which keeps only where records are.

mod indexed;
pub(crate) mod journal;
mod layout;
mod line;
mod logs;
mod snapshot;
mod state;

pub use self::indexed::IndexedStore;
pub use self::layout::{LAYOUT_VERSION, layout_version};

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::{Node, ScheduleId, Task, TaskId, Workflow, WorkflowId};

use self::journal::reader::{LineFile, read_strictly};
use self::journal::{JournalWriter, Pending};
pub(crate) use self::layout::layout_status;
use self::layout::{Access, check_layout};
use self::line::Line;
use self::logs::{
    append_log_file, import_log_files, log_file_length, log_file_lengths_off, log_path,
    read_log_file, read_log_files_off, remove_logs,
};
use self::snapshot::SnapshotRecords;
use self::state::State;
use crate::{
    AccessStore, AuditQuery, Backend, BulkTransfer, ChangeFeed, Error, LogChunk, LogPiece,
    NodeStore, Page, Pruned, Record, RecordKind, Result, RetentionStore, Scanned, ScheduleStore,
    TaskQuery, TaskStore, WorkflowQuery, next_versions,
};

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

/// Tuning knobs; the defaults suit production.
#[derive(Debug, Clone)]
pub struct FsOptions {
    /// Compact the journal into the snapshot once it grows past this size.
    pub compact_after_bytes: u64,
}

impl Default for FsOptions {
    fn default() -> Self {
        FsOptions {
            compact_after_bytes: 64 * 1024 * 1024,
        }
    }
}

pub struct FsBackend {
    dir: PathBuf,
    logs_dir: PathBuf,
    options: FsOptions,
    /// A std mutex: it guards plain in-memory maps and is never held across
    /// an `.await`; durability is awaited after it is released.
    state: Mutex<State>,
    /// The journal writer. (Always there: a read-only open is an
    /// [`IndexedStore`].)
    journal: Option<JournalWriter>,
    /// Heartbeats. Only this process can use the dir (the lock), so there
    /// is one node, and its heartbeats need not outlive it.
    nodes: Mutex<std::collections::BTreeMap<String, Node>>,
    /// Holds the `LOCK` file's advisory lock until the store is closed
    /// (or dropped), so that a restart in the same process can reopen it.
    lock: Mutex<Option<File>>,
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
        let mut state = State::default();
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        read_strictly(&snapshot_path, LineFile::Snapshot, |line, _| {
            line.apply(&mut state)
        })?;
        let journal_bytes = read_strictly(&journal_path, LineFile::Journal, |line, _| {
            line.apply(&mut state)
        })?;
        state.journal_bytes = journal_bytes;
        tracing::info!(
            dir = %dir.display(),
            tasks = state.task_count(),
            workflows = state.workflow_count(),
            "filesystem storage opened"
        );
        let journal = JournalWriter::start(journal_path, snapshot_path)?;
        Ok(FsBackend {
            dir,
            logs_dir,
            options,
            state: Mutex::new(state),
            journal: Some(journal),
            nodes: Mutex::new(Default::default()),
            lock: Mutex::new(Some(lock)),
        })
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

    fn log_path(&self, id: TaskId) -> PathBuf {
        log_path(&self.logs_dir, id)
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
    /// for: a bulk import (a live migration's copy into this store) would
    /// otherwise snapshot the growing store again every
    /// `compact_after_bytes`; the first ordinary write after it compacts
    /// once.
    fn append(&self, state: &mut State, record: Line) -> Result<Pending> {
        let mut bytes = Vec::new();
        record
            .encode_into(&mut bytes)
            .map_err(|e| Error::io("serialize record", std::io::Error::other(e)))?;
        state.journal_bytes += bytes.len() as u64;
        let pending = self.writer()?.append(bytes)?;
        record.apply(state);
        Ok(pending)
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
        let records = SnapshotRecords::take(state);
        state.journal_bytes = 0;
        // A failed snapshot poisons the journal, and every later write
        // reports it, whether or not anyone awaits it.
        self.writer()?.snapshot(Box::new(move || records.encode()))
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
        self.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
        tracing::info!(dir = %self.dir.display(), "filesystem storage closed");
        Ok(())
    }
}

#[async_trait]
impl TaskStore for FsBackend {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            if state.workflow(workflow.id).is_some() {
                return Err(Error::AlreadyExists {
                    what: "workflow",
                    id: workflow.id.to_string(),
                });
            }
            if let Some(task) = tasks.iter().find(|t| state.task(t.id).is_some()) {
                return Err(Error::AlreadyExists {
                    what: "task",
                    id: task.id.to_string(),
                });
            }
            if let Some(key) = &workflow.idempotency_key
                && state.workflow_by_idempotency_key(key).is_some()
            {
                return Err(Error::AlreadyExists {
                    what: "idempotency key",
                    id: key.clone(),
                });
            }
            if let Some(reference) = &workflow.reference
                && state
                    .workflow_revision(reference, workflow.revision)
                    .is_some()
            {
                return Err(Error::AlreadyExists {
                    what: "workflow revision",
                    id: format!("{reference}#{}", workflow.revision),
                });
            }
            let record = Line::Submission {
                workflow: workflow.clone(),
                tasks: tasks.to_vec(),
            };
            self.commit(&mut state, record)?
        };
        pending.durable().await
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        let (pending, stored) = {
            let mut state = self.lock_state();
            let current = state.task(task.id).ok_or(Error::TaskNotFound(task.id))?;
            same_version("task", task.id, task.version, current.version)?;
            let mut stored = task.clone();
            stored.version += 1;
            let pending = self.commit(&mut state, Line::Task(stored.clone()))?;
            (pending, stored)
        };
        pending.durable().await?;
        Ok(stored)
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        let (pending, stored) = {
            let mut state = self.lock_state();
            let current = state
                .workflow(workflow.id)
                .ok_or(Error::WorkflowNotFound(workflow.id))?;
            same_version("workflow", workflow.id, workflow.version, current.version)?;
            if let Some(task) = new_tasks.iter().find(|t| state.task(t.id).is_some()) {
                return Err(Error::AlreadyExists {
                    what: "task",
                    id: task.id.to_string(),
                });
            }
            let mut stored = workflow.clone();
            stored.version += 1;
            let record = Line::Submission {
                workflow: stored.clone(),
                tasks: new_tasks.to_vec(),
            };
            (self.commit(&mut state, record)?, stored)
        };
        pending.durable().await?;
        Ok(stored)
    }

    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)> {
        let (pending, stored) = {
            let mut state = self.lock_state();
            let current = state
                .workflow(workflow.id)
                .ok_or(Error::WorkflowNotFound(workflow.id))?;
            same_version("workflow", workflow.id, workflow.version, current.version)?;
            for task in tasks {
                let current = state.task(task.id).ok_or(Error::TaskNotFound(task.id))?;
                same_version("task", task.id, task.version, current.version)?;
            }
            let (stored, stored_tasks) = next_versions(workflow, tasks);
            // One checksummed line: a crash keeps all of it or none.
            let record = Line::Submission {
                workflow: stored.clone(),
                tasks: stored_tasks.clone(),
            };
            (self.commit(&mut state, record)?, (stored, stored_tasks))
        };
        pending.durable().await?;
        Ok(stored)
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>> {
        Ok(self.lock_state().task(id).cloned())
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        Ok(self.lock_state().list_tasks(query))
    }

    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        Ok(self.lock_state().workflow_tasks(id))
    }

    async fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        Ok(self.lock_state().unfinished_tasks())
    }

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>> {
        Ok(self.lock_state().workflow(id).cloned())
    }

    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        Ok(self.lock_state().list_workflows(query))
    }

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64> {
        self.writer()?.check_usable()?;
        let path = self.log_path(id);
        if chunk.is_empty() {
            return blocking(move || log_file_length(&path)).await;
        }
        // Off the async workers: a write can stall on a slow or full disk.
        // The pump batches a task's output, so this is one hop per batch.
        let chunk = chunk.to_vec();
        blocking(move || append_log_file(&path, &chunk)).await
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        let path = self.log_path(id);
        blocking(move || read_log_file(&path, offset, max_bytes)).await
    }
}

/// Runs file I/O on the blocking pool, not on an async worker.
async fn blocking<T: Send + 'static>(io: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(io)
        .await
        .map_err(|e| Error::io("file I/O", std::io::Error::other(e)))?
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

#[async_trait]
impl AccessStore for FsBackend {
    async fn put_token(&self, token: &ApiToken) -> Result<()> {
        self.write(Line::Token(token.clone())).await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>> {
        Ok(self.lock_state().tokens().cloned().collect())
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.write(Line::Secret(secret.clone())).await
    }

    async fn delete_secret(&self, name: &str) -> Result<bool> {
        let pending = {
            let mut state = self.lock_state();
            if state.record(RecordKind::Secret, name).is_none() {
                return Ok(false);
            }
            let line = Line::SecretDeleted {
                name: name.to_owned(),
            };
            self.commit(&mut state, line)?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        Ok(self.lock_state().secrets().cloned().collect())
    }

    async fn append_audit(&self, record: &AuditRecord) -> Result<()> {
        self.write(Line::Audit(record.clone())).await
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        Ok(self.lock_state().list_audit(query))
    }
}

/// A compare-and-set's check: the record is stored at the version the
/// caller read, or the write is a conflict.
fn same_version(what: &'static str, id: impl ToString, expected: u64, found: u64) -> Result<()> {
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

/// Audit records deleted per journal line: bounds the line, not the prune.
const AUDIT_PRUNED_PER_LINE: usize = 1000;

#[async_trait]
impl RetentionStore for FsBackend {
    async fn prune_workflows(&self, workflows: &[(WorkflowId, u64)]) -> Result<Pruned> {
        let mut pruned = Pruned::default();
        let mut task_ids = Vec::new();
        let pending = {
            let mut state = self.lock_state();
            let mut pending = None;
            for &(id, version) in workflows {
                // Checked under the lock that orders every write: a retry
                // that revived it, or any change, has bumped its version.
                let still_finished = state
                    .workflow(id)
                    .is_some_and(|w| w.version == version && w.status.is_terminal());
                if !still_finished {
                    continue;
                }
                let tasks = state.workflow_task_ids(id);
                let line = Line::Pruned {
                    workflows: vec![id],
                    tasks: tasks.clone(),
                    audit: Vec::new(),
                };
                pending = Some(self.commit(&mut state, line)?);
                pruned.workflows.push(id);
                pruned.tasks += tasks.len() as u64;
                task_ids.extend(tasks);
            }
            if pending.is_some() {
                // Compact now, so that the deleted records leave the disk
                // too, not only memory.
                self.queue_compaction(&mut state)?;
            }
            pending
        };
        if let Some(pending) = pending {
            // Lines are durable in order: the last one covers the others.
            pending.durable().await?;
        }
        // The records are gone for good; their logs go after them. A crash
        // in between leaves log files that no task names, which the next
        // prune removes.
        let logs_dir = self.logs_dir.clone();
        let live: std::collections::HashSet<TaskId> = if pruned.workflows.is_empty() {
            Default::default()
        } else {
            self.lock_state().tasks().map(|t| t.id).collect()
        };
        let removed = pruned.workflows.len();
        tokio::task::spawn_blocking(move || remove_logs(&logs_dir, &task_ids, removed > 0, &live))
            .await
            .map_err(|e| Error::io("remove logs", std::io::Error::other(e)))??;
        Ok(pruned)
    }

    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64> {
        let (pending, count) = {
            let mut state = self.lock_state();
            let old: Vec<String> = state
                .audit()
                .take_while(|a| a.time < before)
                .map(|a| a.id.clone())
                .collect();
            let mut pending = None;
            for ids in old.chunks(AUDIT_PRUNED_PER_LINE) {
                let line = Line::Pruned {
                    workflows: Vec::new(),
                    tasks: Vec::new(),
                    audit: ids.to_vec(),
                };
                pending = Some(self.commit(&mut state, line)?);
            }
            if pending.is_some() {
                self.queue_compaction(&mut state)?;
            }
            (pending, old.len() as u64)
        };
        if let Some(pending) = pending {
            pending.durable().await?;
        }
        Ok(count)
    }
}

#[async_trait]
impl ScheduleStore for FsBackend {
    async fn insert_schedule(&self, schedule: &Schedule) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            let id = schedule.id.to_string();
            if state.schedule(&id).is_some() {
                return Err(Error::AlreadyExists {
                    what: "schedule",
                    id,
                });
            }
            self.commit(&mut state, Line::Schedule(schedule.clone()))?
        };
        pending.durable().await
    }

    async fn update_schedule(&self, schedule: &Schedule) -> Result<Schedule> {
        let mut stored = schedule.clone();
        stored.version += 1;
        let version = |state: &State, key: &str| state.schedule(key).map(|s| s.version);
        let (key, line) = (schedule.id.to_string(), Line::Schedule(stored.clone()));
        self.compare_and_set("schedule", key, schedule.version, version, line)
            .await?;
        Ok(stored)
    }

    async fn delete_schedule(&self, id: ScheduleId) -> Result<bool> {
        let pending = {
            let mut state = self.lock_state();
            let id = id.to_string();
            if state.schedule(&id).is_none() {
                return Ok(false);
            }
            self.commit(&mut state, Line::ScheduleDeleted { id })?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn get_schedule(&self, id: ScheduleId) -> Result<Option<Schedule>> {
        Ok(self.lock_state().schedule(&id.to_string()).cloned())
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        Ok(self.lock_state().schedules().cloned().collect())
    }

    async fn claim(&self, claim: &ScheduleClaim) -> Result<bool> {
        let pending = {
            // The check and the insert happen under one lock: one process
            // has the store, so of racing claims exactly one inserts.
            let mut state = self.lock_state();
            if state.claim(&claim.key()).is_some() {
                return Ok(false);
            }
            self.commit(&mut state, Line::ScheduleClaim(claim.clone()))?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn update_claim(&self, claim: &ScheduleClaim) -> Result<ScheduleClaim> {
        let mut stored = claim.clone();
        stored.version += 1;
        let version = |state: &State, key: &str| state.claim(key).map(|c| c.version);
        let line = Line::ScheduleClaim(stored.clone());
        self.compare_and_set("schedule claim", claim.key(), claim.version, version, line)
            .await?;
        Ok(stored)
    }

    async fn claims(&self, schedule: ScheduleId, limit: usize) -> Result<Vec<ScheduleClaim>> {
        Ok(self.lock_state().claims_of(&schedule.to_string(), limit))
    }
}

#[async_trait]
impl BulkTransfer for FsBackend {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        // Opened with the lock, a store has no damaged record: damage
        // refuses the open (a migration reads through `IndexedStore`).
        Ok(self
            .lock_state()
            .records_after(kind, after)
            .take(limit)
            .map(|record| Scanned {
                key: record.key(),
                record: Ok(record),
            })
            .collect())
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        let state = self.lock_state();
        let mut found: Vec<Scanned> = keys
            .iter()
            .filter_map(|key| {
                state.record(kind, key).map(|record| Scanned {
                    key: key.clone(),
                    record: Ok(record),
                })
            })
            .collect();
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        Ok(self.lock_state().count(kind) as u64)
    }

    /// Compacts a journal that imports left longer than the threshold, and
    /// waits for it: a live migration does it after its copy, while the
    /// service still works on the other store, rather than at the first
    /// write after its switch.
    async fn settle(&self) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            if state.journal_bytes <= self.options.compact_after_bytes {
                return Ok(());
            }
            self.compaction(&mut state)?
        };
        pending.durable().await
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        self.writer()?.check_usable()?;
        let pending = {
            let mut state = self.lock_state();
            records
                .iter()
                .map(|record| self.append(&mut state, Line::of(record.clone())))
                .collect::<Result<Vec<_>>>()?
        };
        // Queued together, so the writer makes them durable with one sync.
        for write in pending {
            write.durable().await?;
        }
        Ok(())
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        log_file_lengths_off(&self.logs_dir, ids).await
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.writer()?.check_usable()?;
        if pieces.is_empty() {
            return Ok(());
        }
        import_log_files(&self.logs_dir, pieces).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        read_log_files_off(&self.logs_dir, asks).await
    }

    async fn close(&self) -> Result<()> {
        Backend::close(self).await
    }
}

impl Drop for FsBackend {
    fn drop(&mut self) {
        if let Some(journal) = &self.journal {
            journal.shutdown();
        }
    }
}
