//! A [`Backend`] wrapper that fails on demand, in the spirit of Temporal's
//! fault-injection persistence layer: tests turn write failures on and off
//! to show that a failed write surfaces as an error, never as silent loss.
//! They can also hold back the writes that end a task, to show what goes on
//! while an outcome is still on its way to storage. Reads always pass through.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::{Node, Task, TaskId, Workflow, WorkflowId};
use tokio::sync::watch;

use crate::{
    AuditQuery, Backend, Error, LogChunk, LogPiece, Page, Record, RecordKind, Result, Scanned,
    Storage, TaskQuery, WorkflowQuery,
};

/// Wraps a store; while `failing` is set, every write returns an I/O error
/// without reaching it; while `holding` is set, a write that ends a task
/// (a terminal status) waits.
pub struct FaultyBackend {
    inner: Storage,
    failing: Arc<AtomicBool>,
    holding: watch::Sender<bool>,
}

/// The switches of a [`FaultyBackend`], kept by the test.
#[derive(Clone)]
pub struct FaultSwitch {
    failing: Arc<AtomicBool>,
    holding: watch::Sender<bool>,
}

impl FaultSwitch {
    pub fn fail_writes(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Holds back (`true`) or lets through (`false`) the writes that end a
    /// task; held writes go on once let through.
    pub fn hold_task_endings(&self, holding: bool) {
        self.holding.send_replace(holding);
    }
}

impl FaultyBackend {
    pub fn wrap(inner: Storage) -> (Storage, FaultSwitch) {
        let failing = Arc::new(AtomicBool::new(false));
        let holding = watch::Sender::new(false);
        let backend = FaultyBackend {
            inner,
            failing: failing.clone(),
            holding: holding.clone(),
        };
        (Storage::new(backend), FaultSwitch { failing, holding })
    }

    fn check(&self, what: &str) -> Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(Error::io(
                format!("{what} (injected fault)"),
                std::io::Error::other("the fault switch is on"),
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for FaultyBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        self.check("insert workflow")?;
        self.inner.insert_workflow(workflow, tasks).await
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        self.check("update workflow")?;
        self.inner.update_workflow(workflow, new_tasks).await
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        if task.status.is_terminal() {
            // Never errs: the sender lives in `self`.
            let _ = self.holding.subscribe().wait_for(|held| !held).await;
        }
        self.check("update task")?;
        self.inner.update_task(task).await
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>> {
        self.inner.get_task(id).await
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        self.inner.list_tasks(query).await
    }

    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        self.inner.workflow_tasks(id).await
    }

    async fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        self.inner.unfinished_tasks().await
    }

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>> {
        self.inner.get_workflow(id).await
    }

    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        self.inner.list_workflows(query).await
    }

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<()> {
        self.check("append log")?;
        self.inner.append_log(id, chunk).await
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        self.inner.read_log(id, offset, max_bytes).await
    }

    async fn health(&self) -> Result<()> {
        self.check("health")?;
        self.inner.health().await
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }

    async fn heartbeat(&self, node: &Node) -> Result<()> {
        self.check("heartbeat")?;
        self.inner.heartbeat(node).await
    }

    async fn nodes(&self) -> Result<Vec<Node>> {
        self.inner.nodes().await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        self.inner.scan(kind, after, limit).await
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        self.inner.fetch(kind, keys).await
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        self.inner.count(kind).await
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        self.check("import records")?;
        self.inner.import(records).await
    }

    async fn put_token(&self, token: &ApiToken) -> Result<()> {
        self.check("store a token")?;
        self.inner.put_token(token).await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>> {
        self.inner.tokens().await
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.check("store a secret")?;
        self.inner.put_secret(secret).await
    }

    async fn delete_secret(&self, name: &str) -> Result<bool> {
        self.check("delete a secret")?;
        self.inner.delete_secret(name).await
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        self.inner.secrets().await
    }

    async fn append_audit(&self, record: &AuditRecord) -> Result<()> {
        self.check("append an audit record")?;
        self.inner.append_audit(record).await
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        self.inner.list_audit(query).await
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        self.inner.log_lengths(ids).await
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.check("import logs")?;
        self.inner.import_logs(pieces).await
    }
}
