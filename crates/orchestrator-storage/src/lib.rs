//! Storage: one trait, [`Backend`], and the backends behind it.
//!
//! Callers hold a [`Storage`], a cheap clonable handle around `Arc<dyn
//! Backend>`, and never name a concrete backend. [`StorageType`] lists every
//! backend whether or not its cargo feature is compiled in, so a request for a
//! missing one is answered with the feature to enable instead of "unknown".

mod error;
pub mod faults;
pub mod fs;
pub mod schema;
#[cfg(feature = "surrealdb")]
pub mod surreal;
pub mod timed;
pub mod transfer;

use std::fmt;
use std::ops::Deref;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::{Node, Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus};

pub use error::{Error, Result};

/// Everything the orchestrator persists. Every write is durable when the
/// returned future resolves: an acknowledged write survives a crash or a
/// power cut.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The backend's name as used by `--storage-type`.
    fn name(&self) -> &'static str;

    /// Stores a new workflow and all its tasks atomically: after a crash
    /// either all of them exist or none does. Refused with
    /// [`Error::AlreadyExists`] if the workflow id, a task id, the
    /// workflow's `idempotency_key`, or its (`reference`, `revision`) pair
    /// is taken, so racing duplicate submissions create one workflow.
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()>;

    /// Replaces a workflow by compare-and-set on `version`, as
    /// [`Backend::update_task`] does, and adds `new_tasks` in the same atomic
    /// write (a workflow that grows, e.g. by rollback steps).
    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow>;

    /// Replaces a task if, and only if, the stored version equals
    /// `task.version` (compare-and-set). Returns the stored task, whose
    /// version is one higher. A stale version gives [`Error::Conflict`], so
    /// two workers can never both claim the same task.
    async fn update_task(&self, task: &Task) -> Result<Task>;

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>>;

    /// Tasks matching the query, newest first, and how many matched in all.
    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>>;

    /// All tasks of one workflow, oldest first.
    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>>;

    /// Tasks in a non-terminal status, oldest first: the work to resume at start.
    async fn unfinished_tasks(&self) -> Result<Vec<Task>>;

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>>;

    /// Workflows matching the query, newest first.
    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>>;

    /// Appends captured script output to a task's log.
    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<()>;

    /// Reads up to `max_bytes` of a task's log from `offset`.
    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk>;

    /// Whether the backend can serve reads and writes right now: `Ok` when
    /// it can, otherwise the reason (closed, poisoned by a failed write, a
    /// database server that does not answer).
    async fn health(&self) -> Result<()>;

    /// Whether several services may use this store at once (then they
    /// coordinate through leases). Only a database server is shared.
    fn shared(&self) -> bool {
        false
    }

    /// Records a node's heartbeat (replacing its previous one).
    async fn heartbeat(&self, node: &Node) -> Result<()>;

    /// Every node that ever sent a heartbeat, by id.
    async fn nodes(&self) -> Result<Vec<Node>>;

    /// Flushes and releases the backend. Later calls fail.
    async fn close(&self) -> Result<()>;

    // Bulk transfer, for `orchestrator migrate`: records move as they are
    // stored, ids, versions and timestamps included, never through the
    // state machine's update paths.

    /// Up to `limit` records of `kind` whose keys sort after `after`, in
    /// key order. A record that cannot be read comes back as
    /// [`Scanned::record`] `Err`, named by its key, instead of failing the
    /// whole batch, so the caller can report it and decide.
    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>>;

    /// The records of `kind` stored under these keys, in key order; keys
    /// without a record are left out.
    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>>;

    /// How many records of `kind` are stored, readable or not.
    async fn count(&self, kind: RecordKind) -> Result<u64>;

    /// Stores records exactly as given, replacing any under the same key.
    /// Durable on return; repeating it changes nothing, so an interrupted
    /// copy can simply be run again.
    async fn import(&self, records: &[Record]) -> Result<()>;

    /// The length in bytes of each task's log (0 for none), in the order asked.
    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>>;

    /// Reads a piece of each of several logs, as [`Backend::read_log`]
    /// would one at a time: `(task, offset, max_bytes)` each, answered in
    /// the order asked. An answer may be shorter than asked even before
    /// the end of its log; read on from its `next_offset`. A backend that
    /// can answer many in one round trip overrides this.
    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        let mut chunks = Vec::with_capacity(asks.len());
        for &(id, offset, max_bytes) in asks {
            chunks.push(self.read_log(id, offset, max_bytes).await?);
        }
        Ok(chunks)
    }

    // Access: API tokens, secrets and the audit log. Few records, read
    // rarely (tokens and secrets are cached by their users).

    /// Stores a token record, replacing the one with the same id (a revoke).
    async fn put_token(&self, token: &ApiToken) -> Result<()>;

    /// Every token record, active or revoked, oldest first.
    async fn tokens(&self) -> Result<Vec<ApiToken>>;

    /// Stores a secret, replacing the one with the same name.
    async fn put_secret(&self, secret: &SecretRecord) -> Result<()>;

    /// Deletes a secret; whether there was one.
    async fn delete_secret(&self, name: &str) -> Result<bool>;

    /// Every secret, by name.
    async fn secrets(&self) -> Result<Vec<SecretRecord>>;

    /// Appends an audit record; durable on return.
    async fn append_audit(&self, record: &AuditRecord) -> Result<()>;

    /// Audit records matching the query, newest first.
    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>>;

    /// Writes pieces of task logs, each at its `offset`, which must be its
    /// log's length when the piece is written (else [`Error::Conflict`]),
    /// so a repeated import never writes a byte twice. Pieces of one task
    /// come in order. Durable on return: many small logs cost one sync.
    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()>;
}

/// A piece of a task's log being imported: `data` belongs at byte `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPiece {
    pub task: TaskId,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// Filters for [`Backend::list_audit`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// At or after.
    pub since: Option<DateTime<Utc>>,
    /// Before.
    pub until: Option<DateTime<Utc>>,
    pub actor: Option<String>,
    pub action: Option<String>,
    pub target: Option<String>,
    pub limit: usize,
    pub offset: usize,
}

impl AuditQuery {
    pub fn matches(&self, record: &AuditRecord) -> bool {
        self.since.is_none_or(|t| record.time >= t)
            && self.until.is_none_or(|t| record.time < t)
            && self.actor.as_ref().is_none_or(|a| &record.actor == a)
            && self.action.as_ref().is_none_or(|a| &record.action == a)
            && self
                .target
                .as_ref()
                .is_none_or(|t| record.target.as_ref() == Some(t))
    }
}

/// The kinds of record `orchestrator migrate` moves, in the order it moves
/// them: a task's workflow is in place before the task. A task's log and
/// checkpoint travel with the task; heartbeats of nodes do not move (they
/// describe live processes, which re-register on the new store). Secrets
/// move encrypted, as they are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    Workflow,
    Task,
    Token,
    Secret,
    Audit,
}

impl RecordKind {
    pub const ALL: [RecordKind; 5] = [
        RecordKind::Workflow,
        RecordKind::Task,
        RecordKind::Token,
        RecordKind::Secret,
        RecordKind::Audit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Workflow => "workflow",
            RecordKind::Task => "task",
            RecordKind::Token => "token",
            RecordKind::Secret => "secret",
            RecordKind::Audit => "audit",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            RecordKind::Workflow => "workflows",
            RecordKind::Task => "tasks",
            RecordKind::Token => "tokens",
            RecordKind::Secret => "secrets",
            RecordKind::Audit => "audit",
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stored record of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Workflow(Workflow),
    Task(Task),
    Token(ApiToken),
    Secret(SecretRecord),
    Audit(AuditRecord),
}

impl Record {
    pub fn kind(&self) -> RecordKind {
        match self {
            Record::Workflow(_) => RecordKind::Workflow,
            Record::Task(_) => RecordKind::Task,
            Record::Token(_) => RecordKind::Token,
            Record::Secret(_) => RecordKind::Secret,
            Record::Audit(_) => RecordKind::Audit,
        }
    }

    /// The key it is stored under: its id (a secret's name) as text.
    pub fn key(&self) -> String {
        match self {
            Record::Workflow(w) => w.id.to_string(),
            Record::Task(t) => t.id.to_string(),
            Record::Token(t) => t.id.clone(),
            Record::Secret(s) => s.name.clone(),
            Record::Audit(a) => a.id.clone(),
        }
    }

    /// Its compare-and-set version: higher is newer. Audit records never
    /// change.
    pub fn version(&self) -> u64 {
        match self {
            Record::Workflow(w) => w.version,
            Record::Task(t) => t.version,
            Record::Token(t) => t.version,
            Record::Secret(s) => s.version,
            Record::Audit(_) => 0,
        }
    }

    /// The record as JSON, the same bytes for the same content on every
    /// backend: what checksums are taken of.
    pub fn to_json(&self) -> Vec<u8> {
        let json = match self {
            Record::Workflow(w) => serde_json::to_vec(w),
            Record::Task(t) => serde_json::to_vec(t),
            Record::Token(t) => serde_json::to_vec(t),
            Record::Secret(s) => serde_json::to_vec(s),
            Record::Audit(a) => serde_json::to_vec(a),
        };
        // Plain data with string keys: serialization cannot fail.
        json.unwrap_or_default()
    }

    /// Reads a record of `kind` from its JSON.
    pub fn from_json(kind: RecordKind, json: &[u8]) -> std::result::Result<Record, String> {
        let record = match kind {
            RecordKind::Workflow => serde_json::from_slice(json).map(Record::Workflow),
            RecordKind::Task => serde_json::from_slice(json).map(Record::Task),
            RecordKind::Token => serde_json::from_slice(json).map(Record::Token),
            RecordKind::Secret => serde_json::from_slice(json).map(Record::Secret),
            RecordKind::Audit => serde_json::from_slice(json).map(Record::Audit),
        };
        record.map_err(|e| format!("unreadable {kind}: {e}"))
    }
}

/// A record as a bulk read found it: readable, or why not.
#[derive(Debug, Clone)]
pub struct Scanned {
    pub key: String,
    pub record: std::result::Result<Record, String>,
}

/// Filters for [`Backend::list_tasks`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskQuery {
    pub status: Option<TaskStatus>,
    pub workflow: Option<WorkflowId>,
    pub limit: usize,
    pub offset: usize,
}

/// Filters for [`Backend::list_workflows`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkflowQuery {
    pub status: Option<WorkflowStatus>,
    /// The template `ref_name` (the workflow's `kind`).
    pub kind: Option<String>,
    pub reference: Option<String>,
    pub trace_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub limit: usize,
    pub offset: usize,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// How many records matched, across all pages.
    pub total: usize,
}

/// A slice of a task's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogChunk {
    pub data: Vec<u8>,
    /// Where the next read should start.
    pub next_offset: u64,
}

/// The clonable storage handle every other crate uses.
#[derive(Clone)]
pub struct Storage(Arc<dyn Backend>);

impl Storage {
    pub fn new(backend: impl Backend + 'static) -> Storage {
        Storage(Arc::new(backend))
    }
}

impl Deref for Storage {
    type Target = dyn Backend;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Storage").field(&self.0.name()).finish()
    }
}

/// Every backend, compiled in or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageType {
    Filesystem,
    SurrealdbEmbedded,
    SurrealdbServer,
}

impl StorageType {
    pub const ALL: [StorageType; 3] = [
        StorageType::Filesystem,
        StorageType::SurrealdbEmbedded,
        StorageType::SurrealdbServer,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StorageType::Filesystem => "filesystem",
            StorageType::SurrealdbEmbedded => "surrealdb-embedded",
            StorageType::SurrealdbServer => "surrealdb-server",
        }
    }

    /// The cargo feature that compiles this backend in, if it needs one.
    pub fn cargo_feature(self) -> Option<&'static str> {
        match self {
            StorageType::Filesystem => None,
            StorageType::SurrealdbEmbedded | StorageType::SurrealdbServer => Some("surrealdb"),
        }
    }

    /// Whether this build can open the backend.
    pub fn is_compiled_in(self) -> bool {
        match self {
            StorageType::Filesystem => true,
            StorageType::SurrealdbEmbedded | StorageType::SurrealdbServer => {
                cfg!(feature = "surrealdb")
            }
        }
    }

    #[cfg(not(feature = "surrealdb"))]
    fn not_compiled(self) -> Error {
        Error::BackendNotCompiled {
            backend: self.as_str(),
            feature: self.cargo_feature().unwrap_or("?"),
        }
    }
}

impl fmt::Display for StorageType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StorageType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        StorageType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown storage type `{s}` (expected filesystem, surrealdb-embedded or surrealdb-server)"
                )
            })
    }
}

/// Where and how to open storage.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub storage_type: StorageType,
    /// The filesystem backend's directory, and where embedded SurrealDB
    /// keeps its files (`<data-dir>/surrealdb`).
    pub data_dir: PathBuf,
    /// Used by the two SurrealDB backends only.
    pub surrealdb: SurrealdbConfig,
}

/// How to reach SurrealDB. The defaults suit a local `make surreal` server.
#[derive(Debug, Clone)]
pub struct SurrealdbConfig {
    /// `ws://host:port` (or `wss://`) of a SurrealDB server.
    pub url: String,
    pub username: String,
    pub password: Secret,
    pub namespace: String,
    pub database: String,
    /// The embedded key-value engine.
    pub engine: EmbeddedEngine,
    /// How long connecting and signing in may take before start-up fails.
    pub connect_timeout: Duration,
    /// How long one storage call may wait for the database before it fails
    /// with [`Error::Unavailable`]; a dropped server must not hang workers.
    pub request_timeout: Duration,
}

impl Default for SurrealdbConfig {
    fn default() -> Self {
        SurrealdbConfig {
            url: "ws://127.0.0.1:8000".into(),
            username: "root".into(),
            password: Secret::new("root"),
            namespace: "orchestrator".into(),
            database: "orchestrator".into(),
            engine: EmbeddedEngine::SurrealKv,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// A password. Its `Debug` prints `***` and it has no `Display`, so it
/// cannot reach a log line or an error message by accident.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

/// For clap: any text is a password.
impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(Secret::new(s))
    }
}

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The password itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// The key-value engine under embedded SurrealDB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmbeddedEngine {
    /// SurrealKV: pure Rust, compiled with the `surrealdb` feature.
    #[default]
    SurrealKv,
    /// RocksDB: C++, compiled with the `surrealdb-rocksdb` feature.
    RocksDb,
}

impl EmbeddedEngine {
    pub fn as_str(self) -> &'static str {
        match self {
            EmbeddedEngine::SurrealKv => "surrealkv",
            EmbeddedEngine::RocksDb => "rocksdb",
        }
    }

    /// The subdirectory of the data dir that holds this engine's files.
    /// Each engine has its own, so switching engines never misreads files.
    pub fn dir_name(self) -> &'static str {
        match self {
            EmbeddedEngine::SurrealKv => "surrealdb",
            EmbeddedEngine::RocksDb => "surrealdb-rocksdb",
        }
    }
}

impl fmt::Display for EmbeddedEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EmbeddedEngine {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "surrealkv" => Ok(EmbeddedEngine::SurrealKv),
            "rocksdb" => Ok(EmbeddedEngine::RocksDb),
            _ => Err(format!(
                "unknown embedded engine `{s}` (expected surrealkv or rocksdb)"
            )),
        }
    }
}

/// Opens the configured backend, or explains which cargo feature is missing.
/// A SurrealDB backend brings its schema up to date first (see
/// [`schema`]), and refuses to open if it cannot.
pub async fn open(config: &StorageConfig) -> Result<Storage> {
    match config.storage_type {
        StorageType::Filesystem => {
            let backend = fs::FsBackend::open(&config.data_dir, fs::FsOptions::default()).await?;
            Ok(Storage::new(backend))
        }
        #[cfg(feature = "surrealdb")]
        StorageType::SurrealdbEmbedded | StorageType::SurrealdbServer => {
            Ok(Storage::new(surreal::SurrealBackend::open(config).await?))
        }
        #[cfg(not(feature = "surrealdb"))]
        other => Err(other.not_compiled()),
    }
}

/// Opens a store to read it only, for `orchestrator migrate`: no lock is
/// taken and nothing is created or changed, so a filesystem store can be
/// read while its service runs. Every write is refused with
/// [`Error::ReadOnly`]. A filesystem store's damaged records are reported
/// by [`Backend::scan`] instead of failing the open.
pub async fn open_read_only(config: &StorageConfig) -> Result<Storage> {
    match config.storage_type {
        StorageType::Filesystem => Ok(Storage::new(
            fs::IndexedStore::open(&config.data_dir).await?,
        )),
        #[cfg(feature = "surrealdb")]
        StorageType::SurrealdbEmbedded | StorageType::SurrealdbServer => Ok(Storage::new(
            surreal::SurrealBackend::open_read_only(config).await?,
        )),
        #[cfg(not(feature = "surrealdb"))]
        other => Err(other.not_compiled()),
    }
}

/// Opens the target of `orchestrator migrate`, as [`open`] does, except
/// that a filesystem store keeps where its records are instead of the
/// records (see [`fs::IndexedStore`]), so that importing a large store
/// does not hold it all in memory. Only the bulk-transfer calls of such a
/// store are fast; it is not for serving.
pub async fn open_for_import(config: &StorageConfig) -> Result<Storage> {
    match config.storage_type {
        StorageType::Filesystem => Ok(Storage::new(
            fs::IndexedStore::open_for_import(&config.data_dir).await?,
        )),
        _ => open(config).await,
    }
}

/// What the store's schema looks like against this build, without changing
/// anything: `orchestrator db status`.
pub async fn schema_status(config: &StorageConfig) -> Result<schema::SchemaStatus> {
    match config.storage_type {
        StorageType::Filesystem => fs::layout_status(&config.data_dir),
        #[cfg(feature = "surrealdb")]
        StorageType::SurrealdbEmbedded | StorageType::SurrealdbServer => {
            surreal::schema_status(config).await
        }
        #[cfg(not(feature = "surrealdb"))]
        other => Err(other.not_compiled()),
    }
}
