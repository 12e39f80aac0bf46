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

mod indexed;
pub(crate) mod journal;
mod layout;
mod logs;
mod state;

pub use self::indexed::IndexedStore;
pub use self::layout::{LAYOUT_VERSION, layout_version};

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::{Node, ScheduleId, Task, TaskId, Workflow, WorkflowId};
use serde::{Deserialize, Serialize};

use self::journal::{JournalWriter, decode_line, encode_line};
pub(crate) use self::layout::layout_status;
use self::layout::{Access, check_layout};
use self::logs::{
    import_log_files, log_file_length, log_file_lengths_off, log_path, read_log_file,
    read_log_files_off,
};
use self::state::State;
use crate::{
    AccessStore, AuditQuery, Backend, BulkTransfer, ChangeFeed, Error, LogChunk, LogPiece,
    NodeStore, Page, Pruned, Record, RecordKind, Result, RetentionStore, Scanned, ScheduleStore,
    TaskQuery, TaskStore, WorkflowQuery, next_versions,
};

const SNAPSHOT_FILE: &str = "snapshot.jsonl";

const JOURNAL_FILE: &str = "journal.jsonl";

const LOGS_DIR: &str = "logs";

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

/// One journal or snapshot line: a record, or several written as one.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
enum Line {
    Workflow(Workflow),
    Task(Task),
    /// A workflow with the tasks it gained (all of them when it is new) in
    /// one checksummed line, so a torn write keeps all of it or none.
    Submission {
        workflow: Workflow,
        tasks: Vec<Task>,
    },
    Token(ApiToken),
    Secret(SecretRecord),
    SecretDeleted {
        name: String,
    },
    Audit(AuditRecord),
    Schedule(Schedule),
    ScheduleDeleted {
        id: String,
    },
    ScheduleClaim(ScheduleClaim),
    /// Records deleted by retention: workflows with their tasks (listed,
    /// so that a reader of lines alone knows them), and audit records.
    Pruned {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        workflows: Vec<WorkflowId>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tasks: Vec<TaskId>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        audit: Vec<String>,
    },
}

impl Line {
    fn apply(self, state: &mut State) {
        match self {
            Line::Workflow(w) => state.put_workflow(w),
            Line::Task(t) => state.put_task(t),
            Line::Submission { workflow, tasks } => {
                state.put_workflow(workflow);
                tasks.into_iter().for_each(|t| state.put_task(t));
            }
            Line::Token(t) => state.put_token(t),
            Line::Secret(s) => state.put_secret(s),
            Line::SecretDeleted { name } => {
                state.delete_secret(&name);
            }
            Line::Audit(a) => state.put_audit(a),
            Line::Schedule(s) => state.put_schedule(s),
            Line::ScheduleDeleted { id } => {
                state.delete_schedule(&id);
            }
            Line::ScheduleClaim(c) => state.put_claim(c),
            Line::Pruned {
                workflows, audit, ..
            } => {
                for id in workflows {
                    state.remove_workflow(id);
                }
                state.remove_audit(&audit);
            }
        }
    }

    /// The line that stores `record`.
    fn of(record: Record) -> Line {
        match record {
            Record::Workflow(w) => Line::Workflow(w),
            Record::Task(t) => Line::Task(t),
            Record::Token(t) => Line::Token(t),
            Record::Secret(s) => Line::Secret(s),
            Record::Audit(a) => Line::Audit(a),
            Record::Schedule(s) => Line::Schedule(s),
            Record::ScheduleClaim(c) => Line::ScheduleClaim(c),
        }
    }
}

impl Line {
    /// The records this line writes.
    fn keys(&self) -> Vec<(RecordKind, String)> {
        match self {
            Line::Workflow(w) => vec![(RecordKind::Workflow, w.id.to_string())],
            Line::Task(t) => vec![(RecordKind::Task, t.id.to_string())],
            Line::Submission { workflow, tasks } => {
                std::iter::once((RecordKind::Workflow, workflow.id.to_string()))
                    .chain(tasks.iter().map(|t| (RecordKind::Task, t.id.to_string())))
                    .collect()
            }
            Line::Token(t) => vec![(RecordKind::Token, t.id.clone())],
            Line::Secret(s) => vec![(RecordKind::Secret, s.name.clone())],
            Line::SecretDeleted { name } => vec![(RecordKind::Secret, name.clone())],
            Line::Audit(a) => vec![(RecordKind::Audit, a.id.clone())],
            Line::Schedule(s) => vec![(RecordKind::Schedule, s.id.to_string())],
            Line::ScheduleDeleted { id } => vec![(RecordKind::Schedule, id.clone())],
            Line::ScheduleClaim(c) => vec![(RecordKind::ScheduleClaim, c.key())],
            Line::Pruned {
                workflows,
                tasks,
                audit,
            } => (workflows
                .iter()
                .map(|w| (RecordKind::Workflow, w.to_string())))
            .chain(tasks.iter().map(|t| (RecordKind::Task, t.to_string())))
            .chain(audit.iter().map(|a| (RecordKind::Audit, a.clone())))
            .collect(),
        }
    }

    /// The records a damaged line seems to name, read as loosely as
    /// possible: a flipped byte in a value should still name its record.
    fn keys_in_damaged(payload: &[u8]) -> Vec<(RecordKind, String)> {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
            return Vec::new();
        };
        let id = |v: &serde_json::Value| v.get("id").and_then(|id| id.as_str()).map(str::to_owned);
        let data = &value["data"];
        let mut keys = Vec::new();
        match value["type"].as_str() {
            Some("workflow") => keys.extend(id(data).map(|k| (RecordKind::Workflow, k))),
            Some("task") => keys.extend(id(data).map(|k| (RecordKind::Task, k))),
            Some("submission") => {
                keys.extend(id(&data["workflow"]).map(|k| (RecordKind::Workflow, k)));
                let tasks = data["tasks"].as_array().into_iter().flatten();
                keys.extend(tasks.filter_map(id).map(|k| (RecordKind::Task, k)));
            }
            Some("token") => keys.extend(id(data).map(|k| (RecordKind::Token, k))),
            Some("audit") => keys.extend(id(data).map(|k| (RecordKind::Audit, k))),
            Some("schedule" | "schedule_deleted") => {
                keys.extend(id(data).map(|k| (RecordKind::Schedule, k)));
            }
            Some("schedule_claim") => keys.extend(
                serde_json::from_value::<ScheduleClaim>(data.clone())
                    .ok()
                    .map(|c| (RecordKind::ScheduleClaim, c.key())),
            ),
            Some("pruned") => {
                let listed = |field: &str| {
                    data[field]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect::<Vec<_>>()
                };
                keys.extend(
                    listed("workflows")
                        .into_iter()
                        .map(|k| (RecordKind::Workflow, k)),
                );
                keys.extend(listed("tasks").into_iter().map(|k| (RecordKind::Task, k)));
                keys.extend(listed("audit").into_iter().map(|k| (RecordKind::Audit, k)));
            }
            Some("secret" | "secret_deleted") => keys.extend(
                data.get("name")
                    .and_then(|n| n.as_str())
                    .map(|n| (RecordKind::Secret, n.to_owned())),
            ),
            _ => {}
        }
        keys
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
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create data dir {}", dir.display()), e))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(|e| Error::io(format!("open {}", dir.join("LOCK").display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(Error::Locked { dir }),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::io(format!("lock {}", dir.join("LOCK").display()), e));
            }
        }
        check_layout(&dir, Access::Upgrade)?;
        let logs_dir = dir.join(LOGS_DIR);
        std::fs::create_dir_all(&logs_dir)
            .map_err(|e| Error::io(format!("create {}", logs_dir.display()), e))?;

        let mut state = State::default();
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        replay(&snapshot_path, &mut state, TornTail::Refuse)?;
        state.journal_bytes = replay(&journal_path, &mut state, TornTail::Truncate)?;
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
    fn commit(&self, state: &mut State, record: Line) -> Result<journal::Pending> {
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
    fn append(&self, state: &mut State, record: Line) -> Result<journal::Pending> {
        let mut bytes = Vec::new();
        let json = serde_json::to_vec(&record)
            .map_err(|e| Error::io("serialize record", std::io::Error::other(e)))?;
        encode_line(&json, &mut bytes);
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
    fn compaction(&self, state: &mut State) -> Result<journal::Pending> {
        let workflows: Vec<Workflow> = state.workflows().cloned().collect();
        let tasks: Vec<Arc<Task>> = state.shared_tasks().cloned().collect();
        let tokens: Vec<ApiToken> = state.tokens().cloned().collect();
        let secrets: Vec<SecretRecord> = state.secrets().cloned().collect();
        let audit: Vec<AuditRecord> = state.audit().cloned().collect();
        let schedules: Vec<Schedule> = state.schedules().cloned().collect();
        let claims: Vec<ScheduleClaim> = state.all_claims().cloned().collect();
        state.journal_bytes = 0;
        let build = move || -> std::io::Result<Vec<u8>> {
            let mut bytes = Vec::new();
            let lines = (workflows.into_iter().map(Line::Workflow))
                .chain(
                    tasks
                        .into_iter()
                        .map(|t| Line::Task(Arc::unwrap_or_clone(t))),
                )
                .chain(tokens.into_iter().map(Line::Token))
                .chain(secrets.into_iter().map(Line::Secret))
                .chain(audit.into_iter().map(Line::Audit))
                .chain(schedules.into_iter().map(Line::Schedule))
                .chain(claims.into_iter().map(Line::ScheduleClaim));
            for line in lines {
                encode_line(&serde_json::to_vec(&line)?, &mut bytes);
            }
            Ok(bytes)
        };
        // A failed snapshot poisons the journal, and every later write
        // reports it, whether or not anyone awaits it.
        self.writer()?.snapshot(Box::new(build))
    }
}

#[derive(PartialEq)]
enum TornTail {
    /// The journal may end in a write cut short by a crash: drop it.
    Truncate,
    /// The snapshot is written atomically: any damage is corruption.
    Refuse,
}

/// Loads every record of a file into `state`; returns the bytes kept.
fn replay(path: &Path, state: &mut State, torn_tail: TornTail) -> Result<u64> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    let mut offset = 0usize;
    let mut line_no = 0usize;
    while offset < bytes.len() {
        line_no += 1;
        let rest = &bytes[offset..];
        let (line, complete) = match rest.iter().position(|&b| b == b'\n') {
            Some(end) => (&rest[..end], true),
            None => (rest, false),
        };
        let parsed = decode_line(line)
            .filter(|_| complete)
            .and_then(|json| serde_json::from_slice::<Line>(json).ok());
        let Some(record) = parsed else {
            let is_last = !complete || offset + line.len() + 1 >= bytes.len();
            if torn_tail == TornTail::Truncate && is_last {
                tracing::warn!(
                    path = %path.display(), line = line_no,
                    "dropping a torn write at the end of the journal"
                );
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
                file.set_len(offset as u64)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| Error::io(format!("truncate {}", path.display()), e))?;
                return Ok(offset as u64);
            }
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                line: line_no,
                reason: "checksum mismatch or unreadable record in the middle of the file; \
                         restore the data dir from a backup"
                    .into(),
            });
        };
        record.apply(state);
        offset += line.len() + 1;
    }
    Ok(offset as u64)
}

/// Which file a path names right now (device and inode), to notice a
/// rename over it.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
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
        // An append-mode write leaves this handle's position at the end of
        // what it wrote, even with other appends racing it.
        let chunk = chunk.to_vec();
        blocking(move || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut file| {
                    file.write_all(&chunk)?;
                    file.stream_position()
                })
                .map_err(|e| Error::io(format!("append to {}", path.display()), e))
        })
        .await
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

/// Removes the logs of pruned tasks; after a prune that deleted something,
/// also any log that no stored task names (left by a crash mid-prune).
fn remove_logs(
    logs_dir: &Path,
    pruned: &[TaskId],
    sweep: bool,
    live: &std::collections::HashSet<TaskId>,
) -> Result<()> {
    let remove = |path: &Path| match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    };
    for id in pruned {
        remove(&log_path(logs_dir, *id))?;
    }
    if !sweep {
        return Ok(());
    }
    let entries = std::fs::read_dir(logs_dir)
        .map_err(|e| Error::io(format!("read {}", logs_dir.display()), e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let orphan = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|id| id.parse::<uuid::Uuid>().ok())
            .is_some_and(|id| !live.contains(&TaskId::from_uuid(id)));
        if orphan {
            remove(&entry.path())?;
        }
    }
    Ok(())
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
