//! Storage: traits by concern ([`Backend`], [`TaskStore`], [`NodeStore`],
//! [`AccessStore`], [`ScheduleStore`], [`BulkTransfer`], [`WebhookStore`])
//! and the backends behind them.
//!
//! Callers hold a [`Storage`], a cheap clonable handle with one trait
//! object per concern, and never name a concrete backend. [`StorageType`] lists every
//! backend whether or not its cargo feature is compiled in, so a request for a
//! missing one is answered with the feature to enable instead of "unknown".

pub mod backup;
mod changes;
mod error;
pub mod faults;
pub mod fs;
pub mod live;
pub mod schema;
mod spec;
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
use orchestrator_core::lock::LockRecord;
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::webhook::{Delivery, DeliveryStatus, Subscription};
use orchestrator_core::{
    Node, ScheduleId, Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus,
};

pub use changes::{Change, ChangeFeed, ChangeSink};
pub use error::{Error, Result};

/// How much a store keeps of the tasks it read lately, parsed, in bytes of
/// their stored form (a parsed task takes a few times that): the
/// filesystem's finished tasks read back, the embedded SurrealDB's point
/// reads.
const RECENT_TASK_BYTES: u64 = 2 << 20;

/// The backend as a whole: its identity and lifecycle.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The backend's name as used by `--storage-type`.
    fn name(&self) -> &'static str;

    /// Whether the backend can serve reads and writes right now: `Ok` when
    /// it can, otherwise the reason (closed, poisoned by a failed write, a
    /// database server that does not answer).
    async fn health(&self) -> Result<()>;

    /// Flushes and releases the backend. Later calls fail.
    async fn close(&self) -> Result<()>;
}

/// Tasks, workflows and their logs. Every write is durable when the
/// returned future resolves: an acknowledged write survives a crash or a
/// power cut.
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// Stores a new workflow and all its tasks atomically: after a crash
    /// either all of them exist or none does. Refused with
    /// [`Error::AlreadyExists`] if the workflow id, a task id, the
    /// workflow's `idempotency_key`, or its (`reference`, `revision`) pair
    /// is taken, so racing duplicate submissions create one workflow.
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()>;

    /// Replaces a workflow by compare-and-set on `version`, as
    /// [`TaskStore::update_task`] does, and adds `new_tasks` in the same
    /// atomic write (a workflow that grows, e.g. by rollback steps).
    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow>;

    /// Replaces a workflow and some of its stored tasks in one atomic
    /// write: a compare-and-set on the workflow's `version` and on each
    /// task's, all or nothing (a retry resets many tasks at once, and must
    /// never leave some reset and some not). Returns them as stored, each
    /// one version higher.
    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)>;

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

    /// Appends to a task's log; returns the log's length in bytes after the append.
    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64>;

    /// Reads up to `max_bytes` of a task's log from `offset`.
    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk>;
}

/// Nodes and leases: life among other services sharing the store.
#[async_trait]
pub trait NodeStore: Send + Sync {
    /// Whether several services may use this store at once (then they
    /// coordinate through leases). Only a database server is shared.
    fn shared(&self) -> bool;

    /// Records a node's heartbeat (replacing its previous one).
    async fn heartbeat(&self, node: &Node) -> Result<()>;

    /// Every node that ever sent a heartbeat, by id.
    async fn nodes(&self) -> Result<Vec<Node>>;

    /// A feed of changes committed by any node sharing the store; `None`
    /// where the store is not shared (one node: the engine knows its own
    /// writes). Each call starts a feed of its own; see [`ChangeFeed`] for
    /// what it promises.
    fn changes(&self) -> Option<ChangeFeed>;
}

/// API tokens, secrets and the audit log. Few records, read rarely (tokens
/// and secrets are cached by their users).
#[async_trait]
pub trait AccessStore: Send + Sync {
    /// Stores a token record, replacing the one with the same id (a revoke).
    async fn put_token(&self, token: &ApiToken) -> Result<()>;

    /// Every token record, active or revoked, oldest first.
    async fn tokens(&self) -> Result<Vec<ApiToken>>;

    /// Deletes the token records `ids` (ended dashboard sessions, which
    /// nothing accepts again); how many there were. Durable on return.
    async fn delete_tokens(&self, ids: &[String]) -> Result<u64>;

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
}

/// Recurring schedules, and the claims on their due times. Few schedules;
/// claims accumulate (one per due time that came due while a node ran).
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Stores a new schedule. Refused with [`Error::AlreadyExists`] if its
    /// id is taken.
    async fn insert_schedule(&self, schedule: &Schedule) -> Result<()>;

    /// Replaces a schedule if, and only if, the stored `version` equals
    /// `schedule.version` (compare-and-set), as [`TaskStore::update_task`]
    /// does; returns the stored schedule, one version higher.
    async fn update_schedule(&self, schedule: &Schedule) -> Result<Schedule>;

    /// Deletes a schedule; whether there was one. Its claims stay, as the
    /// history of its runs.
    async fn delete_schedule(&self, id: ScheduleId) -> Result<bool>;

    async fn get_schedule(&self, id: ScheduleId) -> Result<Option<Schedule>>;

    /// Every schedule, oldest first.
    async fn schedules(&self) -> Result<Vec<Schedule>>;

    /// Creates the claim on (`claim.schedule_id`, `claim.due`) unless one
    /// exists: `true` if this call created it. Atomic in the store, so of
    /// nodes racing for one due time, exactly one gets `true`, and only it
    /// acts on that due time.
    async fn claim(&self, claim: &ScheduleClaim) -> Result<bool>;

    /// Replaces a claim by compare-and-set on `version`; returns it stored.
    async fn update_claim(&self, claim: &ScheduleClaim) -> Result<ScheduleClaim>;

    /// A schedule's claims, newest due time first, at most `limit`.
    async fn claims(&self, schedule: ScheduleId, limit: usize) -> Result<Vec<ScheduleClaim>>;
}

/// Named resource locks: one [`LockRecord`] per name (holders, waiters in
/// order, the fencing counter), changed only by compare-and-set on its
/// `version`, so that of nodes racing to change one lock exactly one
/// write lands and the others read again. Records are never deleted: an
/// idle one keeps its fencing counter, which must only grow. Who gets a
/// lock is the core's decision (`orchestrator_core::lock`).
#[async_trait]
pub trait LockStore: Send + Sync {
    /// The lock named `name`, if anyone ever asked for it.
    async fn get_lock(&self, name: &str) -> Result<Option<LockRecord>>;

    /// Stores `lock` if the stored version is `lock.version` (`0`: none
    /// is stored yet); returns it as stored, one version higher.
    /// [`Error::Conflict`] otherwise.
    async fn put_lock(&self, lock: &LockRecord) -> Result<LockRecord>;

    /// Every lock record, by name.
    async fn locks(&self) -> Result<Vec<LockRecord>>;
}

/// Retention: deleting what is old enough. Which records are old enough is
/// the engine's decision (`orchestrator_core::retention`); a store deletes
/// only what still matches that decision when it writes.
#[async_trait]
pub trait RetentionStore: Send + Sync {
    /// Deletes each named workflow, with its tasks and their logs, if it is
    /// still finished and still at the given version: a workflow that was
    /// retried or changed since the decision stays. Each workflow goes with
    /// its tasks in one write, so a crash keeps all of it or none.
    async fn prune_workflows(&self, workflows: &[(WorkflowId, u64)]) -> Result<Pruned>;

    /// Deletes the audit records older than `before`; returns how many.
    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64>;
}

/// Webhook subscriptions, and their deliveries: the outbox (pending
/// ones) and the delivery log (every one, with its attempts) in one
/// record each. Few subscriptions; deliveries are bounded by the
/// engine's retention.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Stores a new subscription. Refused with [`Error::AlreadyExists`]
    /// if its id is taken.
    async fn insert_subscription(&self, subscription: &Subscription) -> Result<()>;

    /// Deletes a subscription; whether there was one. Its deliveries stay
    /// in the log until retention deletes them; pending ones are not sent.
    async fn delete_subscription(&self, id: &str) -> Result<bool>;

    async fn get_subscription(&self, id: &str) -> Result<Option<Subscription>>;

    /// Every subscription, oldest first.
    async fn subscriptions(&self) -> Result<Vec<Subscription>>;

    /// Creates a delivery unless one with its id exists: `true` if this
    /// call created it. Atomic in the store, so of nodes that each see one
    /// event, exactly one stores its delivery. Durable on return.
    async fn insert_delivery(&self, delivery: &Delivery) -> Result<bool>;

    /// Replaces a delivery by compare-and-set on `version`, as
    /// [`TaskStore::update_task`] does; returns it stored, one version
    /// higher.
    async fn update_delivery(&self, delivery: &Delivery) -> Result<Delivery>;

    async fn get_delivery(&self, id: &str) -> Result<Option<Delivery>>;

    /// Deliveries matching the query, newest first (by `created_at`, then
    /// id), and how many matched in all.
    async fn deliveries(&self, query: &DeliveryQuery) -> Result<Page<Delivery>>;

    /// Deletes the named deliveries that are no longer pending; returns
    /// how many it deleted. Which ones is the engine's retention decision.
    async fn prune_deliveries(&self, ids: &[String]) -> Result<u64>;
}

/// Filters for [`WebhookStore::deliveries`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryQuery {
    pub subscription: Option<String>,
    pub status: Option<DeliveryStatus>,
    pub limit: usize,
    pub offset: usize,
}

impl DeliveryQuery {
    pub fn matches(&self, delivery: &Delivery) -> bool {
        self.subscription
            .as_ref()
            .is_none_or(|s| &delivery.subscription_id == s)
            && self.status.is_none_or(|s| delivery.status == s)
    }
}

/// What [`RetentionStore::prune_workflows`] deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    pub workflows: Vec<WorkflowId>,
    /// Tasks deleted with them.
    pub tasks: u64,
}

/// A workflow and tasks as a compare-and-set stores them: each one version
/// higher (what every backend's `update_workflow_and_tasks` returns).
pub(crate) fn next_versions(workflow: &Workflow, tasks: &[Task]) -> (Workflow, Vec<Task>) {
    let mut stored = workflow.clone();
    stored.version += 1;
    let tasks = tasks
        .iter()
        .map(|task| {
            let mut task = task.clone();
            task.version += 1;
            task
        })
        .collect();
    (stored, tasks)
}

/// Bulk transfer, for `orchestrator migrate`: records move as they are
/// stored, ids, versions and timestamps included, never through the state
/// machine's update paths.
#[async_trait]
pub trait BulkTransfer: Send + Sync {
    /// The backend's name as used by `--storage-type`.
    fn name(&self) -> &'static str;

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
    /// copy can simply be run again. A store opened read-only refuses it
    /// with [`Error::ReadOnly`].
    async fn import(&self, records: &[Record]) -> Result<()>;

    /// The length in bytes of each task's log (0 for none), in the order asked.
    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>>;

    /// Reads a piece of each of several logs, as [`TaskStore::read_log`]
    /// would one at a time: `(task, offset, max_bytes)` each, answered in
    /// the order asked. An answer may be shorter than asked even before
    /// the end of its log; read on from its `next_offset`.
    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>>;

    /// Writes pieces of task logs, each at its `offset`, which must be its
    /// log's length when the piece is written (else [`Error::Conflict`]),
    /// so a repeated import never writes a byte twice. Pieces of one task
    /// come in order. Durable on return: many small logs cost one sync. A
    /// store opened read-only refuses it with [`Error::ReadOnly`].
    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()>;

    /// After imports: brings the store into the shape its service wants,
    /// and waits for it (the filesystem compacts the journal the imports
    /// made long, which they leave to it rather than compact again and
    /// again as the store grows). Nothing elsewhere.
    async fn settle(&self) -> Result<()> {
        Ok(())
    }

    /// Flushes and releases the store. Later calls fail.
    async fn close(&self) -> Result<()>;
}

/// A piece of a task's log being imported: `data` belongs at byte `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPiece {
    pub task: TaskId,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// Filters for [`AccessStore::list_audit`]; every set field must match.
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
/// move encrypted, as they are stored. Schedules move with their claims,
/// so a moved schedule neither starts a due run twice nor catches up on
/// runs it already made. Webhook subscriptions move with their signing
/// secrets sealed, and deliveries with their attempts, so a pending
/// delivery is sent from the new store and a sent one is not sent again.
/// Lock records do not move (see `fs::locks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    Workflow,
    Task,
    Token,
    Secret,
    Audit,
    Schedule,
    ScheduleClaim,
    WebhookSubscription,
    WebhookDelivery,
}

impl RecordKind {
    pub const ALL: [RecordKind; 9] = [
        RecordKind::Workflow,
        RecordKind::Task,
        RecordKind::Token,
        RecordKind::Secret,
        RecordKind::Audit,
        RecordKind::Schedule,
        RecordKind::ScheduleClaim,
        RecordKind::WebhookSubscription,
        RecordKind::WebhookDelivery,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Workflow => "workflow",
            RecordKind::Task => "task",
            RecordKind::Token => "token",
            RecordKind::Secret => "secret",
            RecordKind::Audit => "audit",
            RecordKind::Schedule => "schedule",
            RecordKind::ScheduleClaim => "schedule_claim",
            RecordKind::WebhookSubscription => "webhook_subscription",
            RecordKind::WebhookDelivery => "webhook_delivery",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            RecordKind::Workflow => "workflows",
            RecordKind::Task => "tasks",
            RecordKind::Token => "tokens",
            RecordKind::Secret => "secrets",
            RecordKind::Audit => "audit",
            RecordKind::Schedule => "schedules",
            RecordKind::ScheduleClaim => "claims",
            RecordKind::WebhookSubscription => "webhook subscriptions",
            RecordKind::WebhookDelivery => "webhook deliveries",
        }
    }
}

impl fmt::Display for RecordKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stored record of any kind.
// Records stream one at a time and are mostly tasks and workflows: boxing
// them would cost an allocation per record to save the stack of the rare
// small variants.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Workflow(Workflow),
    Task(Task),
    Token(ApiToken),
    Secret(SecretRecord),
    Audit(AuditRecord),
    Schedule(Schedule),
    ScheduleClaim(ScheduleClaim),
    WebhookSubscription(orchestrator_core::webhook::Subscription),
    WebhookDelivery(orchestrator_core::webhook::Delivery),
}

impl Record {
    pub fn kind(&self) -> RecordKind {
        match self {
            Record::Workflow(_) => RecordKind::Workflow,
            Record::Task(_) => RecordKind::Task,
            Record::Token(_) => RecordKind::Token,
            Record::Secret(_) => RecordKind::Secret,
            Record::Audit(_) => RecordKind::Audit,
            Record::Schedule(_) => RecordKind::Schedule,
            Record::ScheduleClaim(_) => RecordKind::ScheduleClaim,
            Record::WebhookSubscription(_) => RecordKind::WebhookSubscription,
            Record::WebhookDelivery(_) => RecordKind::WebhookDelivery,
        }
    }

    /// The key it is stored under: its id (a secret's name, a claim's
    /// schedule and due time) as text.
    pub fn key(&self) -> String {
        match self {
            Record::Workflow(w) => w.id.to_string(),
            Record::Task(t) => t.id.to_string(),
            Record::Token(t) => t.id.clone(),
            Record::Secret(s) => s.name.clone(),
            Record::Audit(a) => a.id.clone(),
            Record::Schedule(s) => s.id.to_string(),
            Record::ScheduleClaim(c) => c.key(),
            Record::WebhookSubscription(s) => s.id.clone(),
            Record::WebhookDelivery(d) => d.id.clone(),
        }
    }

    /// Its compare-and-set version: higher is newer. Audit records and
    /// webhook subscriptions never change.
    pub fn version(&self) -> u64 {
        match self {
            Record::Workflow(w) => w.version,
            Record::Task(t) => t.version,
            Record::Token(t) => t.version,
            Record::Secret(s) => s.version,
            Record::Audit(_) => 0,
            Record::Schedule(s) => s.version,
            Record::ScheduleClaim(c) => c.version,
            Record::WebhookSubscription(_) => 0,
            Record::WebhookDelivery(d) => d.version,
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
            Record::Schedule(s) => serde_json::to_vec(s),
            Record::ScheduleClaim(c) => serde_json::to_vec(c),
            Record::WebhookSubscription(s) => serde_json::to_vec(s),
            Record::WebhookDelivery(d) => serde_json::to_vec(d),
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
            RecordKind::Schedule => serde_json::from_slice(json).map(Record::Schedule),
            RecordKind::ScheduleClaim => serde_json::from_slice(json).map(Record::ScheduleClaim),
            RecordKind::WebhookSubscription => {
                serde_json::from_slice(json).map(Record::WebhookSubscription)
            }
            RecordKind::WebhookDelivery => {
                serde_json::from_slice(json).map(Record::WebhookDelivery)
            }
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

/// Filters for [`TaskStore::list_tasks`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskQuery {
    pub status: Option<TaskStatus>,
    pub workflow: Option<WorkflowId>,
    /// Keyset paging: only tasks older than this one (listings are newest
    /// first), before `offset` applies. The task need not exist. Unlike
    /// an offset, it stays exact while tasks are added, and the store
    /// seeks to it instead of counting its way there. `total` ignores it.
    pub after: Option<TaskId>,
    pub limit: usize,
    pub offset: usize,
}

/// Filters for [`TaskStore::list_workflows`]; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkflowQuery {
    pub status: Option<WorkflowStatus>,
    /// The template `ref_name` (the workflow's `kind`).
    pub kind: Option<String>,
    pub reference: Option<String>,
    pub trace_id: Option<String>,
    pub idempotency_key: Option<String>,
    /// Free text: the workflow matches when its name, template, reference
    /// or one of its input values holds it, ignoring case (see
    /// [`workflow_search_text`]).
    pub text: Option<String>,
    /// Keyset paging, as [`TaskQuery::after`].
    pub after: Option<WorkflowId>,
    pub limit: usize,
    pub offset: usize,
}

/// What a [`WorkflowQuery::text`] search looks in: the name, template,
/// reference and every input value (`vars`, after defaults: strings,
/// numbers and booleans, at any depth), lowercased, one per line. Both
/// backends match against this same text (the SurrealDB one stores it
/// with the record), so they answer the same; a needle holds no line
/// break (the API refuses control characters), so it never spans two
/// values.
pub fn workflow_search_text(workflow: &Workflow) -> String {
    fn leaves(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Null => {}
            serde_json::Value::String(s) => {
                out.push('\n');
                out.push_str(s);
            }
            serde_json::Value::Number(n) => {
                out.push('\n');
                out.push_str(&n.to_string());
            }
            serde_json::Value::Bool(b) => {
                out.push('\n');
                out.push_str(if *b { "true" } else { "false" });
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| leaves(v, out)),
            serde_json::Value::Object(map) => map.values().for_each(|v| leaves(v, out)),
        }
    }
    let mut text = String::new();
    text.push_str(&workflow.name);
    text.push('\n');
    text.push_str(&workflow.kind);
    if let Some(reference) = &workflow.reference {
        text.push('\n');
        text.push_str(reference);
    }
    leaves(&workflow.vars, &mut text);
    text.to_lowercase()
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

/// The clonable storage handle every other crate uses: one backend seen
/// through its concerns. Each concern is its own trait object, so a
/// wrapper (timing, fault injection) can wrap one concern and leave the
/// others as they are.
#[derive(Clone)]
pub struct Storage {
    backend: Arc<dyn Backend>,
    tasks: Arc<dyn TaskStore>,
    nodes: Arc<dyn NodeStore>,
    access: Arc<dyn AccessStore>,
    schedules: Arc<dyn ScheduleStore>,
    retention: Arc<dyn RetentionStore>,
    transfer: Arc<dyn BulkTransfer>,
    webhooks: Arc<dyn WebhookStore>,
    locks: Arc<dyn LockStore>,
}

impl Storage {
    pub fn new<B>(backend: B) -> Storage
    where
        B: Backend
            + TaskStore
            + NodeStore
            + AccessStore
            + ScheduleStore
            + RetentionStore
            + BulkTransfer
            + WebhookStore
            + LockStore
            + 'static,
    {
        let backend = Arc::new(backend);
        Storage {
            backend: backend.clone(),
            tasks: backend.clone(),
            nodes: backend.clone(),
            access: backend.clone(),
            schedules: backend.clone(),
            retention: backend.clone(),
            transfer: backend.clone(),
            webhooks: backend.clone(),
            locks: backend,
        }
    }

    /// The backend's name as used by `--storage-type`.
    pub fn name(&self) -> &'static str {
        self.backend.name()
    }

    /// See [`Backend::health`].
    pub async fn health(&self) -> Result<()> {
        self.backend.health().await
    }

    /// See [`Backend::close`].
    pub async fn close(&self) -> Result<()> {
        self.backend.close().await
    }

    pub fn tasks(&self) -> &dyn TaskStore {
        &*self.tasks
    }

    pub fn nodes(&self) -> &dyn NodeStore {
        &*self.nodes
    }

    pub fn access(&self) -> &dyn AccessStore {
        &*self.access
    }

    pub fn schedules(&self) -> &dyn ScheduleStore {
        &*self.schedules
    }

    pub fn retention(&self) -> &dyn RetentionStore {
        &*self.retention
    }

    pub fn transfer(&self) -> &dyn BulkTransfer {
        &*self.transfer
    }

    pub fn webhooks(&self) -> &dyn WebhookStore {
        &*self.webhooks
    }

    pub fn locks(&self) -> &dyn LockStore {
        &*self.locks
    }

    /// The same store with its [`Backend`] side wrapped.
    pub fn map_backend(self, wrap: impl FnOnce(Arc<dyn Backend>) -> Arc<dyn Backend>) -> Storage {
        Storage {
            backend: wrap(self.backend),
            ..self
        }
    }

    /// The same store with its [`TaskStore`] side wrapped.
    pub fn map_tasks(self, wrap: impl FnOnce(Arc<dyn TaskStore>) -> Arc<dyn TaskStore>) -> Storage {
        Storage {
            tasks: wrap(self.tasks),
            ..self
        }
    }

    /// The same store with its [`NodeStore`] side wrapped.
    pub fn map_nodes(self, wrap: impl FnOnce(Arc<dyn NodeStore>) -> Arc<dyn NodeStore>) -> Storage {
        Storage {
            nodes: wrap(self.nodes),
            ..self
        }
    }

    /// The same store with its [`AccessStore`] side wrapped.
    pub fn map_access(
        self,
        wrap: impl FnOnce(Arc<dyn AccessStore>) -> Arc<dyn AccessStore>,
    ) -> Storage {
        Storage {
            access: wrap(self.access),
            ..self
        }
    }

    /// The same store with its [`ScheduleStore`] side wrapped.
    pub fn map_schedules(
        self,
        wrap: impl FnOnce(Arc<dyn ScheduleStore>) -> Arc<dyn ScheduleStore>,
    ) -> Storage {
        Storage {
            schedules: wrap(self.schedules),
            ..self
        }
    }

    /// The same store with its [`RetentionStore`] side wrapped.
    pub fn map_retention(
        self,
        wrap: impl FnOnce(Arc<dyn RetentionStore>) -> Arc<dyn RetentionStore>,
    ) -> Storage {
        Storage {
            retention: wrap(self.retention),
            ..self
        }
    }

    /// The same store with its [`WebhookStore`] side wrapped.
    pub fn map_webhooks(
        self,
        wrap: impl FnOnce(Arc<dyn WebhookStore>) -> Arc<dyn WebhookStore>,
    ) -> Storage {
        Storage {
            webhooks: wrap(self.webhooks),
            ..self
        }
    }

    /// The same store with its [`BulkTransfer`] side wrapped.
    pub fn map_transfer(
        self,
        wrap: impl FnOnce(Arc<dyn BulkTransfer>) -> Arc<dyn BulkTransfer>,
    ) -> Storage {
        Storage {
            transfer: wrap(self.transfer),
            ..self
        }
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Storage").field(&self.name()).finish()
    }
}

/// A store opened only to be copied from or into (`orchestrator migrate`):
/// its bulk-transfer side and nothing else, so a store opened read-only
/// has no task, node or access calls to refuse.
///
/// ```compile_fail,E0599
/// # async fn f(store: orchestrator_storage::TransferStore, w: orchestrator_core::Workflow) {
/// store.insert_workflow(&w, &[]).await; // a migration source has no task writes
/// # }
/// ```
#[derive(Clone)]
pub struct TransferStore(Arc<dyn BulkTransfer>);

impl TransferStore {
    pub fn new(store: impl BulkTransfer + 'static) -> TransferStore {
        TransferStore(Arc::new(store))
    }
}

impl From<Storage> for TransferStore {
    fn from(storage: Storage) -> TransferStore {
        TransferStore(storage.transfer)
    }
}

impl Deref for TransferStore {
    type Target = dyn BulkTransfer;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for TransferStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TransferStore")
            .field(&self.0.name())
            .finish()
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

    /// Why this build cannot open the backend (see [`Self::is_compiled_in`]).
    pub fn not_compiled(self) -> Error {
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
/// read while its service runs. Only the bulk-transfer side is there, and
/// its writes are refused with [`Error::ReadOnly`]. A filesystem store's
/// damaged records are reported by [`BulkTransfer::scan`] instead of
/// failing the open.
pub async fn open_read_only(config: &StorageConfig) -> Result<TransferStore> {
    match config.storage_type {
        StorageType::Filesystem => Ok(TransferStore::new(
            fs::IndexedStore::open(&config.data_dir).await?,
        )),
        #[cfg(feature = "surrealdb")]
        StorageType::SurrealdbEmbedded | StorageType::SurrealdbServer => Ok(TransferStore::new(
            surreal::SurrealBackend::open_read_only(config).await?,
        )),
        #[cfg(not(feature = "surrealdb"))]
        other => Err(other.not_compiled()),
    }
}

/// Opens the target of `orchestrator migrate`, as [`open`] does, except
/// that a filesystem store keeps where its records are instead of the
/// records (see [`fs::IndexedStore`]), so that importing a large store
/// does not hold it all in memory.
pub async fn open_for_import(config: &StorageConfig) -> Result<TransferStore> {
    match config.storage_type {
        StorageType::Filesystem => Ok(TransferStore::new(
            fs::IndexedStore::open_for_import(&config.data_dir).await?,
        )),
        _ => Ok(open(config).await?.into()),
    }
}

/// Whether a running process holds the store: the filesystem backend's
/// `LOCK`, or embedded SurrealKV's. Read without taking either. A
/// SurrealDB server is never held, and RocksDB's lock (`fcntl`) is not seen
/// here: opening such a store says so instead.
pub fn in_use(config: &StorageConfig) -> bool {
    let lock = match config.storage_type {
        StorageType::Filesystem => config.data_dir.join("LOCK"),
        StorageType::SurrealdbEmbedded => config
            .data_dir
            .join(config.surrealdb.engine.dir_name())
            .join("LOCK"),
        StorageType::SurrealdbServer => return false,
    };
    let Ok(file) = std::fs::File::open(lock) else {
        return false;
    };
    // A lock taken here is ours only until `file` is dropped at once.
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
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
