//! A store wrapper that fails on demand, in the spirit of Temporal's
//! fault-injection persistence layer: tests turn write failures on and off
//! to show that a failed write surfaces as an error, never as silent loss.
//! They can also hold back the writes that end a task, to show what goes on
//! while an outcome is still on its way to storage.
//!
//! It wraps only the concerns it faults: the task store (workflow and task
//! writes, log appends) and bulk transfer (imports). Reads, nodes and
//! access records pass straight through, unwrapped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use orchestrator_core::{Task, TaskId, Workflow, WorkflowId};
use tokio::sync::watch;

use crate::{
    BulkTransfer, Error, LogChunk, LogPiece, Page, Record, RecordKind, Result, Scanned, Storage,
    TaskQuery, TaskStore, WorkflowQuery,
};

/// Wraps a store: while `failing` is set, every task-store or import write
/// returns an I/O error without reaching it; while `holding` is set, a
/// write that ends a task (a terminal status) waits.
pub struct FaultyBackend;

impl FaultyBackend {
    pub fn wrap(inner: Storage) -> (Storage, FaultSwitch) {
        let switch = FaultSwitch {
            failing: Arc::new(AtomicBool::new(false)),
            holding: watch::Sender::new(false),
        };
        let storage = inner
            .map_tasks(|inner| Arc::new(Faulty::new(inner, &switch)))
            .map_transfer(|inner| Arc::new(Faulty::new(inner, &switch)));
        (storage, switch)
    }
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

/// One concern of a store, behind the fault switch.
struct Faulty<T: ?Sized> {
    inner: Arc<T>,
    switch: FaultSwitch,
}

impl<T: ?Sized> Faulty<T> {
    fn new(inner: Arc<T>, switch: &FaultSwitch) -> Faulty<T> {
        Faulty {
            inner,
            switch: switch.clone(),
        }
    }
}

#[async_trait]
impl TaskStore for Faulty<dyn TaskStore> {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        self.switch.check("insert workflow")?;
        self.inner.insert_workflow(workflow, tasks).await
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        self.switch.check("update workflow")?;
        self.inner.update_workflow(workflow, new_tasks).await
    }

    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)> {
        self.switch.check("update workflow")?;
        self.inner.update_workflow_and_tasks(workflow, tasks).await
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        if task.status.is_terminal() {
            // Never errs: the sender lives in `self.switch`.
            let _ = self.switch.holding.subscribe().wait_for(|held| !held).await;
        }
        self.switch.check("update task")?;
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

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64> {
        self.switch.check("append log")?;
        self.inner.append_log(id, chunk).await
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        self.inner.read_log(id, offset, max_bytes).await
    }
}

#[async_trait]
impl BulkTransfer for Faulty<dyn BulkTransfer> {
    fn name(&self) -> &'static str {
        self.inner.name()
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
        self.switch.check("import records")?;
        self.inner.import(records).await
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        self.inner.log_lengths(ids).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        self.inner.read_logs(asks).await
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.switch.check("import logs")?;
        self.inner.import_logs(pieces).await
    }

    async fn settle(&self) -> Result<()> {
        self.inner.settle().await
    }

    async fn close(&self) -> Result<()> {
        self.inner.close().await
    }
}
