//! A store wrapper that fails on demand, in the spirit of Temporal's
//! fault-injection persistence layer: tests turn write failures on and off
//! to show that a failed write surfaces as an error, never as silent loss.
//! They can also hold back the writes that end a task, to show what goes on
//! while an outcome is still on its way to storage, and hold back or fail
//! the writes that claim one, to show what goes on while a claim is.
//!
//! It wraps only the concerns it faults: the task store (workflow and task
//! writes, log appends) and bulk transfer (imports). Reads, nodes and
//! access records pass straight through, unwrapped.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId};
use tokio::sync::watch;

use crate::{
    BulkTransfer, Error, LogChunk, LogPiece, Page, Record, RecordKind, Result, Scanned, Storage,
    TaskQuery, TaskStore, WorkflowQuery,
};

/// A task write a test can single out, by the move it makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskMove {
    /// Stores as running a task that is not: a claim.
    Claim,
    /// Stores as queued a task that was pending: a step released once its
    /// dependencies ended.
    Release,
}

impl TaskMove {
    /// The move `task`, written over `stored`, makes, if it is one of these.
    fn of(task: &Task, stored: Option<TaskStatus>) -> Option<TaskMove> {
        match (stored, task.status) {
            (Some(from), TaskStatus::Running) if from != TaskStatus::Running => {
                Some(TaskMove::Claim)
            }
            (Some(TaskStatus::Pending), TaskStatus::Queued) => Some(TaskMove::Release),
            _ => None,
        }
    }
}

/// Wraps a store: while `failing` is set, every task-store or import write
/// returns an I/O error without reaching it; while `holding` is set, a
/// write that ends a task (a terminal status) waits; a [`TaskMove`] can be
/// held back or failed on its own.
pub struct FaultyBackend;

impl FaultyBackend {
    pub fn wrap(inner: Storage) -> (Storage, FaultSwitch) {
        let switch = FaultSwitch {
            failing: Arc::new(AtomicBool::new(false)),
            holding: watch::Sender::new(false),
            moves: watch::Sender::new(Moves::default()),
        };
        let storage = inner
            .map_tasks(|inner| Arc::new(Faulty::new(inner, &switch)))
            .map_transfer(|inner| Arc::new(Faulty::new(inner, &switch)));
        (storage, switch)
    }
}

/// Which moves are held back or failed, and how many met their switch.
#[derive(Default)]
struct Moves {
    held: HashSet<TaskMove>,
    failed: HashSet<TaskMove>,
    faulted: HashMap<TaskMove, usize>,
}

/// The switches of a [`FaultyBackend`], kept by the test.
#[derive(Clone)]
pub struct FaultSwitch {
    failing: Arc<AtomicBool>,
    holding: watch::Sender<bool>,
    /// A watch, so that held writes wake when let through and tests wake
    /// when a count grows.
    moves: watch::Sender<Moves>,
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

    /// Holds back (`true`) or lets through (`false`) the writes that make
    /// `move_`; held writes go on once let through.
    pub fn hold(&self, move_: TaskMove, holding: bool) {
        self.moves
            .send_modify(|moves| toggle(&mut moves.held, move_, holding));
    }

    /// Fails (`true`) the writes that make `move_`, without reaching the
    /// store, or lets them through again (`false`).
    pub fn fail(&self, move_: TaskMove, failing: bool) {
        self.moves
            .send_modify(|moves| toggle(&mut moves.failed, move_, failing));
    }

    /// Waits until `n` writes that make `move_` were held back or failed.
    pub async fn faulted(&self, move_: TaskMove, n: usize) {
        // Never errs: the sender lives in `self`.
        let _ = self
            .moves
            .subscribe()
            .wait_for(|moves| moves.faulted.get(&move_).copied().unwrap_or(0) >= n)
            .await;
    }

    fn any_move_switched(&self) -> bool {
        let moves = self.moves.borrow();
        !moves.held.is_empty() || !moves.failed.is_empty()
    }

    /// Holds back or fails a write that makes `move_`, as the switches say.
    async fn on_move(&self, move_: TaskMove) -> Result<()> {
        let count = |moves: &mut Moves| *moves.faulted.entry(move_).or_default() += 1;
        if self.moves.borrow().held.contains(&move_) {
            self.moves.send_modify(count);
            let _ = self
                .moves
                .subscribe()
                .wait_for(|moves| !moves.held.contains(&move_))
                .await;
        }
        if self.moves.borrow().failed.contains(&move_) {
            self.moves.send_modify(count);
            return Err(Error::io(
                format!("{move_:?} task (injected fault)"),
                std::io::Error::other("the fault switch of this move is on"),
            ));
        }
        Ok(())
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

impl Faulty<dyn TaskStore> {
    /// Holds back or fails a write of `task` that makes a [`TaskMove`],
    /// as the switches say.
    async fn task_move(&self, task: &Task) -> Result<()> {
        // Telling the move needs a read: only while a move is switched, so
        // that the other fault tests see the writes they always saw.
        if !self.switch.any_move_switched() {
            return Ok(());
        }
        let stored = self.inner.get_task(task.id).await?.map(|t| t.status);
        match TaskMove::of(task, stored) {
            Some(move_) => self.switch.on_move(move_).await,
            None => Ok(()),
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
        for task in tasks {
            self.task_move(task).await?;
        }
        self.inner.update_workflow_and_tasks(workflow, tasks).await
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        let switch = &self.switch;
        if task.status.is_terminal() {
            // Never errs: the sender lives in `self.switch`.
            let _ = switch.holding.subscribe().wait_for(|held| !held).await;
        }
        self.task_move(task).await?;
        switch.check("update task")?;
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

fn toggle(set: &mut HashSet<TaskMove>, move_: TaskMove, on: bool) {
    if on {
        set.insert(move_);
    } else {
        set.remove(&move_);
    }
}
