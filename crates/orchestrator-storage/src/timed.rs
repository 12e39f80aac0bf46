//! A store wrapper that times every call, in the spirit of
//! [`crate::faults`]: the service wraps whatever store it opened, so every
//! backend reports the same metrics without knowing about them. Each
//! concern is wrapped by its own impl, so the compiler names any call a
//! wrapper forgets.
//!
//! It records through the `metrics` facade only (no I/O, no HTTP):
//! `orchestrator_storage_operation_duration_seconds{backend, operation}`
//! for every call, and `orchestrator_storage_errors_total{backend,
//! operation}` for calls that failed for a reason other than a lost
//! compare-and-set or a duplicate (those are normal answers, not faults).
//! Without an installed recorder the calls cost next to nothing.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::{Node, ScheduleId, Task, TaskId, Workflow, WorkflowId};

use crate::{
    AccessStore, AuditQuery, Backend, BulkTransfer, ChangeFeed, Error, LogChunk, LogPiece,
    NodeStore, Page, Pruned, Record, RecordKind, Result, RetentionStore, Scanned, ScheduleStore,
    Storage, TaskQuery, TaskStore, WorkflowQuery,
};

/// Wraps every concern of a store and times each of its calls.
pub struct TimedBackend;

impl TimedBackend {
    pub fn wrap(inner: Storage) -> Storage {
        let b = inner.backend.clone();
        inner
            .map_backend(|inner| Arc::new(Timed::new(inner, &b)))
            .map_tasks(|inner| Arc::new(Timed::new(inner, &b)))
            .map_nodes(|inner| Arc::new(Timed::new(inner, &b)))
            .map_access(|inner| Arc::new(Timed::new(inner, &b)))
            .map_schedules(|inner| Arc::new(Timed::new(inner, &b)))
            .map_retention(|inner| Arc::new(Timed::new(inner, &b)))
            .map_transfer(|inner| Arc::new(Timed::new(inner, &b)))
    }
}

/// One concern of a store, timed.
struct Timed<T: ?Sized> {
    inner: Arc<T>,
    /// The inner backend, whose name is the `backend` label: asked at
    /// each call, since a storage move changes it.
    backend: Arc<dyn Backend>,
}

impl<T: ?Sized> Timed<T> {
    fn new(inner: Arc<T>, backend: &Arc<dyn Backend>) -> Timed<T> {
        Timed {
            inner,
            backend: backend.clone(),
        }
    }

    async fn timed<R>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<R>>,
    ) -> Result<R> {
        let started = Instant::now();
        let result = call.await;
        metrics::histogram!(
            "orchestrator_storage_operation_duration_seconds",
            "backend" => self.backend.name(),
            "operation" => operation,
        )
        .record(started.elapsed().as_secs_f64());
        if let Err(e) = &result
            && !matches!(e, Error::Conflict { .. } | Error::AlreadyExists { .. })
        {
            metrics::counter!(
                "orchestrator_storage_errors_total",
                "backend" => self.backend.name(),
                "operation" => operation,
            )
            .increment(1);
        }
        result
    }
}

#[async_trait]
impl Backend for Timed<dyn Backend> {
    fn name(&self) -> &'static str {
        self.backend.name()
    }

    async fn health(&self) -> Result<()> {
        self.timed("health", self.inner.health()).await
    }

    async fn close(&self) -> Result<()> {
        self.timed("close", self.inner.close()).await
    }
}

#[async_trait]
impl TaskStore for Timed<dyn TaskStore> {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        self.timed(
            "insert_workflow",
            self.inner.insert_workflow(workflow, tasks),
        )
        .await
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        self.timed(
            "update_workflow",
            self.inner.update_workflow(workflow, new_tasks),
        )
        .await
    }

    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)> {
        self.timed(
            "update_workflow_and_tasks",
            self.inner.update_workflow_and_tasks(workflow, tasks),
        )
        .await
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        self.timed("update_task", self.inner.update_task(task))
            .await
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>> {
        self.timed("get_task", self.inner.get_task(id)).await
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        self.timed("list_tasks", self.inner.list_tasks(query)).await
    }

    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        self.timed("workflow_tasks", self.inner.workflow_tasks(id))
            .await
    }

    async fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        self.timed("unfinished_tasks", self.inner.unfinished_tasks())
            .await
    }

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>> {
        self.timed("get_workflow", self.inner.get_workflow(id))
            .await
    }

    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        self.timed("list_workflows", self.inner.list_workflows(query))
            .await
    }

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64> {
        self.timed("append_log", self.inner.append_log(id, chunk))
            .await
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        self.timed("read_log", self.inner.read_log(id, offset, max_bytes))
            .await
    }
}

#[async_trait]
impl NodeStore for Timed<dyn NodeStore> {
    fn shared(&self) -> bool {
        self.inner.shared()
    }

    async fn heartbeat(&self, node: &Node) -> Result<()> {
        self.timed("heartbeat", self.inner.heartbeat(node)).await
    }

    async fn nodes(&self) -> Result<Vec<Node>> {
        self.timed("nodes", self.inner.nodes()).await
    }

    fn changes(&self) -> Option<ChangeFeed> {
        self.inner.changes()
    }
}

#[async_trait]
impl AccessStore for Timed<dyn AccessStore> {
    async fn put_token(&self, token: &ApiToken) -> Result<()> {
        self.timed("put_token", self.inner.put_token(token)).await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>> {
        self.timed("tokens", self.inner.tokens()).await
    }

    async fn delete_tokens(&self, ids: &[String]) -> Result<u64> {
        self.timed("delete_tokens", self.inner.delete_tokens(ids))
            .await
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.timed("put_secret", self.inner.put_secret(secret))
            .await
    }

    async fn delete_secret(&self, name: &str) -> Result<bool> {
        self.timed("delete_secret", self.inner.delete_secret(name))
            .await
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        self.timed("secrets", self.inner.secrets()).await
    }

    async fn append_audit(&self, record: &AuditRecord) -> Result<()> {
        self.timed("append_audit", self.inner.append_audit(record))
            .await
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        self.timed("list_audit", self.inner.list_audit(query)).await
    }
}

#[async_trait]
impl ScheduleStore for Timed<dyn ScheduleStore> {
    async fn insert_schedule(&self, schedule: &Schedule) -> Result<()> {
        self.timed("insert_schedule", self.inner.insert_schedule(schedule))
            .await
    }

    async fn update_schedule(&self, schedule: &Schedule) -> Result<Schedule> {
        self.timed("update_schedule", self.inner.update_schedule(schedule))
            .await
    }

    async fn delete_schedule(&self, id: ScheduleId) -> Result<bool> {
        self.timed("delete_schedule", self.inner.delete_schedule(id))
            .await
    }

    async fn get_schedule(&self, id: ScheduleId) -> Result<Option<Schedule>> {
        self.timed("get_schedule", self.inner.get_schedule(id))
            .await
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        self.timed("schedules", self.inner.schedules()).await
    }

    async fn claim(&self, claim: &ScheduleClaim) -> Result<bool> {
        self.timed("claim", self.inner.claim(claim)).await
    }

    async fn update_claim(&self, claim: &ScheduleClaim) -> Result<ScheduleClaim> {
        self.timed("update_claim", self.inner.update_claim(claim))
            .await
    }

    async fn claims(&self, schedule: ScheduleId, limit: usize) -> Result<Vec<ScheduleClaim>> {
        self.timed("claims", self.inner.claims(schedule, limit))
            .await
    }
}

#[async_trait]
impl RetentionStore for Timed<dyn RetentionStore> {
    async fn prune_workflows(&self, workflows: &[(WorkflowId, u64)]) -> Result<Pruned> {
        self.timed("prune_workflows", self.inner.prune_workflows(workflows))
            .await
    }

    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64> {
        self.timed("prune_audit", self.inner.prune_audit(before))
            .await
    }
}

#[async_trait]
impl BulkTransfer for Timed<dyn BulkTransfer> {
    fn name(&self) -> &'static str {
        self.backend.name()
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        self.timed("scan", self.inner.scan(kind, after, limit))
            .await
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        self.timed("fetch", self.inner.fetch(kind, keys)).await
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        self.timed("count", self.inner.count(kind)).await
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        self.timed("import", self.inner.import(records)).await
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        self.timed("log_lengths", self.inner.log_lengths(ids)).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        self.timed("read_logs", self.inner.read_logs(asks)).await
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.timed("import_logs", self.inner.import_logs(pieces))
            .await
    }

    async fn settle(&self) -> Result<()> {
        self.timed("settle", self.inner.settle()).await
    }

    async fn close(&self) -> Result<()> {
        self.timed("close", self.inner.close()).await
    }
}
