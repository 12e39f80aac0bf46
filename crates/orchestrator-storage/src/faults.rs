//! A store wrapper that fails on demand, in the spirit of Temporal's
//! fault-injection persistence layer: tests turn write failures on and off
//! to show that a failed write surfaces as an error, never as silent loss.
//! They can also hold back the writes that end a task, to show what goes on
//! while an outcome is still on its way to storage, and hold back or fail
//! the writes that claim one, to show what goes on while a claim is.
//!
//! And a write can be made *ambiguous*: it reaches the store and commits,
//! then its caller is told it failed, as when a connection drops after the
//! database committed but before the answer came back. The caller cannot
//! tell this from a write that never landed, so the engine must act
//! correctly on either. Chosen by move, or at random under a seed.
//!
//! It wraps only the concerns it faults: the task store (workflow and task
//! writes, log appends) and bulk transfer (imports). Reads, nodes and
//! access records pass straight through, unwrapped.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// Changes the checkpoint of a running task (an http step saves its
    /// launch key and its job id this way).
    Checkpoint,
    /// Stores the end of an attempt: a terminal status, or a retry's wait.
    End,
}

impl TaskMove {
    /// The move `task`, written over `stored`, makes, if it is one of these.
    fn of(task: &Task, stored: Option<&Task>) -> Option<TaskMove> {
        let from = stored?;
        match (from.status, task.status) {
            (from, TaskStatus::Running) if from != TaskStatus::Running => Some(TaskMove::Claim),
            (TaskStatus::Pending, TaskStatus::Queued) => Some(TaskMove::Release),
            (TaskStatus::Running, TaskStatus::Running) if task.checkpoint != from.checkpoint => {
                Some(TaskMove::Checkpoint)
            }
            (TaskStatus::Running, to) if to.is_terminal() || to == TaskStatus::RetryWaiting => {
                Some(TaskMove::End)
            }
            _ => None,
        }
    }
}

/// Which writes are made ambiguous at random: each task-store write
/// (workflow and task writes and log appends) with odds of one in
/// `one_in`, drawn from a generator seeded by `seed`, so that a failing
/// run can be replayed.
#[derive(Clone, Copy, Debug)]
pub struct AmbiguousOdds {
    pub one_in: u32,
    pub seed: u64,
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
            random: Arc::new(Mutex::new(None)),
            ambiguous_count: Arc::new(AtomicU64::new(0)),
        };
        let storage = inner
            .map_tasks(|inner| Arc::new(Faulty::new(inner, &switch)))
            .map_transfer(|inner| Arc::new(Faulty::new(inner, &switch)));
        (storage, switch)
    }
}

/// Which moves are held back, failed or made ambiguous, and how many met
/// their switch.
#[derive(Default)]
struct Moves {
    held: HashSet<TaskMove>,
    failed: HashSet<TaskMove>,
    /// How many more writes of each move are to be ambiguous.
    ambiguous: HashMap<TaskMove, usize>,
    faulted: HashMap<TaskMove, usize>,
}

/// The random draw of ambiguous writes: a xorshift64* generator, small
/// and replayable from its seed.
struct Draw {
    state: u64,
    one_in: u64,
}

impl Draw {
    fn hit(&mut self) -> bool {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state
            .wrapping_mul(0x2545_F491_4F6C_DD1D)
            .is_multiple_of(self.one_in)
    }
}

/// The switches of a [`FaultyBackend`], kept by the test.
#[derive(Clone)]
pub struct FaultSwitch {
    failing: Arc<AtomicBool>,
    holding: watch::Sender<bool>,
    /// A watch, so that held writes wake when let through and tests wake
    /// when a count grows.
    moves: watch::Sender<Moves>,
    /// The random draw of ambiguous writes, when on. A std mutex: a draw
    /// is a few arithmetic steps and never awaits.
    random: Arc<Mutex<Option<Draw>>>,
    /// How many writes were made ambiguous, by move or at random.
    ambiguous_count: Arc<AtomicU64>,
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

    /// Makes the next `times` writes that make `move_` ambiguous: they
    /// commit, then report an error. (Every claim ambiguous for ever would
    /// never let a step run: a count, not a switch.)
    pub fn ambiguous(&self, move_: TaskMove, times: usize) {
        self.moves.send_modify(|moves| {
            moves.ambiguous.insert(move_, times);
        });
    }

    /// Makes task-store writes ambiguous at random (`Some`), or stops
    /// (`None`).
    pub fn ambiguous_at_random(&self, odds: Option<AmbiguousOdds>) {
        *lock(&self.random) = odds.map(|odds| Draw {
            // xorshift stays at zero from zero.
            state: odds.seed.max(1),
            one_in: u64::from(odds.one_in.max(1)),
        });
    }

    /// How many writes so far committed and then reported an error.
    pub fn ambiguous_writes(&self) -> u64 {
        self.ambiguous_count.load(Ordering::SeqCst)
    }

    /// Whether this write, once committed, is to report an error: drawn
    /// at random, or `move_` is switched to ambiguous.
    fn make_ambiguous(&self, move_: Option<TaskMove>) -> bool {
        let mut by_move = false;
        if let Some(move_) = move_ {
            self.moves
                .send_if_modified(|moves| match moves.ambiguous.get_mut(&move_) {
                    Some(left) if *left > 0 => {
                        *left -= 1;
                        by_move = true;
                        true
                    }
                    _ => false,
                });
        }
        let drawn = lock(&self.random).as_mut().is_some_and(Draw::hit);
        let ambiguous = by_move || drawn;
        if let Some(move_) = move_.filter(|_| by_move) {
            self.moves
                .send_modify(|moves| *moves.faulted.entry(move_).or_default() += 1);
        }
        if ambiguous {
            self.ambiguous_count.fetch_add(1, Ordering::SeqCst);
        }
        ambiguous
    }

    /// The answer to a write that committed: its own, or, if it is to be
    /// ambiguous, an error that says nothing of the commit.
    fn answer<T>(&self, what: &str, move_: Option<TaskMove>, result: Result<T>) -> Result<T> {
        match result {
            Ok(_) if self.make_ambiguous(move_) => Err(Error::io(
                format!("{what} (injected fault)"),
                std::io::Error::other("the connection dropped after the write was sent"),
            )),
            other => other,
        }
    }

    /// Waits until `n` writes that make `move_` were held back, failed or
    /// made ambiguous.
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
        !moves.held.is_empty()
            || !moves.failed.is_empty()
            || moves.ambiguous.values().any(|n| *n > 0)
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
    /// as the switches say; returns the move, for [`FaultSwitch::answer`].
    async fn task_move(&self, task: &Task) -> Result<Option<TaskMove>> {
        // Telling the move needs a read: only while a move is switched, so
        // that the other fault tests see the writes they always saw.
        if !self.switch.any_move_switched() {
            return Ok(None);
        }
        let stored = self.inner.get_task(task.id).await?;
        let move_ = TaskMove::of(task, stored.as_ref());
        if let Some(move_) = move_ {
            self.switch.on_move(move_).await?;
        }
        Ok(move_)
    }
}

#[async_trait]
impl TaskStore for Faulty<dyn TaskStore> {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        self.switch.check("insert workflow")?;
        let result = self.inner.insert_workflow(workflow, tasks).await;
        self.switch.answer("insert workflow", None, result)
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        self.switch.check("update workflow")?;
        let result = self.inner.update_workflow(workflow, new_tasks).await;
        self.switch.answer("update workflow", None, result)
    }

    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)> {
        self.switch.check("update workflow")?;
        let mut moves = Vec::new();
        for task in tasks {
            moves.extend(self.task_move(task).await?);
        }
        let result = self.inner.update_workflow_and_tasks(workflow, tasks).await;
        // Ambiguous as a whole if any of its moves is to be.
        let move_ = moves.into_iter().find(|m| {
            self.switch
                .moves
                .borrow()
                .ambiguous
                .get(m)
                .is_some_and(|left| *left > 0)
        });
        self.switch.answer("update workflow", move_, result)
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        let switch = &self.switch;
        if task.status.is_terminal() {
            // Never errs: the sender lives in `self.switch`.
            let _ = switch.holding.subscribe().wait_for(|held| !held).await;
        }
        let move_ = self.task_move(task).await?;
        switch.check("update task")?;
        let result = self.inner.update_task(task).await;
        switch.answer("update task", move_, result)
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
        let result = self.inner.append_log(id, chunk).await;
        self.switch.answer("append log", None, result)
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

/// Locks a std mutex; a panic elsewhere while holding it cannot leave
/// the draw's state inconsistent (a number), so poisoning is ignored.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn toggle(set: &mut HashSet<TaskMove>, move_: TaskMove, on: bool) {
    if on {
        set.insert(move_);
    } else {
        set.remove(&move_);
    }
}
