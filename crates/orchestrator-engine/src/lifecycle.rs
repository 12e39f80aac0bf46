//! The life of tasks and workflows after submission: how an attempt's
//! outcome is stored, how a workflow moves along its DAG (the core's
//! `decide`, applied), cancels, retries, checkpoints, and what happens to
//! attempts whose runner is gone (a crash, a dead node).
//!
//! Every change is a compare-and-set write through `records`; a lost race
//! only means reading again and deciding again.
//!
//! After a step ends, the workflow is followed up incrementally: only the
//! ended task's dependents are read and decided about, and the whole
//! workflow only when it may have finished or changed beyond that (the
//! core's `progress`). A step's cost thus does not grow with the size of
//! its workflow (issue 18). The index this needs is memory only, derived
//! from the store and checked against the workflow's version on every use.
//!
//! What each move makes of the records is decided in [`decide`], with no
//! I/O; this module reads, calls it, and writes and announces the result.

mod decide;
mod pause;

use std::collections::{HashMap, HashSet};
use std::mem;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use futures_util::future::join_all;
use orchestrator_core::event::TaskMark;
use orchestrator_core::progress::{Progress, Scan, follows_incrementally};
use orchestrator_core::{
    Decision, RetryPolicy, Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus,
    decide_task,
};
use orchestrator_executor::Outcome;
use orchestrator_storage::{Storage, WorkflowQuery};
use tokio::sync::watch;

use crate::attempts::Attempts;
use crate::queue::Queue;
use crate::records::Records;
use crate::steps::Steps;
use crate::{Error, Result, lock};
use decide::{AfterEnd, WorkflowChange};

/// Workflows kept for the mark of their first claim, at most (see
/// `Lifecycle::fresh_workflows`).
const FRESH_WORKFLOWS: usize = 1024;

/// Tasks' and workflows' moves.
pub(crate) struct Lifecycle {
    records: Arc<Records>,
    queue: Arc<Queue>,
    attempts: Arc<Attempts>,
    steps: Steps,
    retry: RetryPolicy,
    node_id: String,
    /// Workflows this node is following up in `advance_soon`, with the
    /// tasks that ended meanwhile, which the running call takes on next.
    /// A std mutex: only map operations, never held across an await.
    advancing: Mutex<HashMap<WorkflowId, Vec<Task>>>,
    /// Per workflow followed up here, its dependents index and how far
    /// its tasks are known to have ended. Derived from the store, valid
    /// for one version of the workflow record (checked on every use),
    /// dropped when the workflow finishes or a round fails, so that the
    /// next round starts again from the whole stored workflow. Only
    /// `advance_soon`'s call for that workflow uses an entry, and takes it
    /// out of the map for the round: a std mutex, never held across an
    /// await.
    progress: Mutex<HashMap<WorkflowId, Progress>>,
    /// Workflows this node saw running, so that claims need not re-read
    /// them; forgotten when they finish. A std mutex, as `advancing`.
    running_workflows: Mutex<HashSet<WorkflowId>>,
    /// Workflows this node stored and queued whole, not yet marked
    /// running, as stored: the first claim marks one running from this
    /// record instead of reading it (a round trip on a SurrealDB server).
    /// A guess the store checks: the mark is a compare-and-set, and one it
    /// refuses reads the workflow. At most `FRESH_WORKFLOWS`. A std mutex,
    /// as `advancing`.
    fresh_workflows: Mutex<HashMap<WorkflowId, Workflow>>,
    /// Workflows whose last write may or may not have landed: a follow-up
    /// storage refused, a submission or an attempt's end that reported an
    /// error. An error does not say the write did not commit (a connection
    /// can drop after the commit), so such a workflow may hold a task
    /// queued that no queue here knows of, or an ended task whose
    /// dependents were never released. On a store of one node nothing
    /// else would look at them before a restart, so the cluster loop reads
    /// them again ([`Lifecycle::retry_stalled`]). A std mutex, as
    /// `advancing`.
    stalled: Mutex<HashSet<WorkflowId>>,
    /// Bumped whenever a workflow finishes here; waiters watch it.
    finished: watch::Sender<u64>,
}

impl Lifecycle {
    pub(crate) fn new(
        records: Arc<Records>,
        queue: Arc<Queue>,
        attempts: Arc<Attempts>,
        steps: Steps,
        retry: RetryPolicy,
        node_id: String,
    ) -> Lifecycle {
        Lifecycle {
            records,
            queue,
            attempts,
            steps,
            retry,
            node_id,
            advancing: Mutex::new(HashMap::new()),
            progress: Mutex::new(HashMap::new()),
            running_workflows: Mutex::new(HashSet::new()),
            fresh_workflows: Mutex::new(HashMap::new()),
            stalled: Mutex::new(HashSet::new()),
            finished: watch::Sender::new(0),
        }
    }

    fn store(&self) -> &Storage {
        self.records.store()
    }

    /// Changes whenever a workflow finishes on this node.
    pub(crate) fn finishes(&self) -> watch::Receiver<u64> {
        self.finished.subscribe()
    }

    pub(crate) async fn load_task(&self, id: TaskId) -> Result<Task> {
        self.store()
            .tasks()
            .get_task(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "task",
                id: id.to_string(),
            })
    }

    pub(crate) async fn load_workflow(&self, id: WorkflowId) -> Result<Workflow> {
        self.store()
            .tasks()
            .get_workflow(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "workflow",
                id: id.to_string(),
            })
    }

    /// Puts unfinished work back in motion after a start: queued and
    /// retry-waiting tasks are queued, running ones this node may own are
    /// taken over, and every unfinished workflow is advanced.
    pub(crate) async fn recover(&self) -> Result<()> {
        let shared = self.store().nodes().shared();
        let mut requeued = 0usize;
        for task in self.store().tasks().unfinished_tasks().await? {
            match task.status {
                status if decide::waits_in_queue(status) => {
                    self.queue.push(&task);
                    requeued += 1;
                }
                // The previous life of this node died during this attempt.
                // On a shared store the task may instead be another live
                // node's: those are left to their lease.
                TaskStatus::Running
                    if decide::is_orphaned(&task, shared, &self.node_id, Utc::now()) =>
                {
                    let error = decide::stopped_during(task.attempts);
                    let stored = self.take_over(task, error).await?;
                    if stored.is_some_and(|t| t.status == TaskStatus::RetryWaiting) {
                        requeued += 1;
                    }
                }
                _ => {}
            }
        }
        self.advance_unfinished_workflows(&HashSet::new()).await?;
        if requeued > 0 {
            tracing::info!(tasks = requeued, "resumed unfinished tasks");
        }
        Ok(())
    }

    /// Ends an attempt whose runner is gone (this service's previous life,
    /// or a node whose lease ran out): its left-overs on this machine are
    /// stopped, never adopted, then the attempt ends as interrupted, which
    /// does not use up the task's attempts (or the task ends cancelled, if
    /// that was asked). Returns the stored task, or
    /// `None` if someone else moved it first.
    pub(crate) async fn take_over(&self, mut task: Task, error: String) -> Result<Option<Task>> {
        if let Ok(runner) = self.steps.runner(task.step.kind) {
            // A scan of /proc for scripts: blocking I/O, off the async workers.
            let (runner, id) = (runner.clone(), task.id.to_string());
            let leftovers = tokio::task::spawn_blocking(move || runner.stop_leftovers(&id))
                .await
                .unwrap_or(0);
            if leftovers > 0 {
                tracing::warn!(task = %task.id, processes = leftovers, "killed a script left running by a stopped service");
            }
        }
        let before = TaskMark::of(&task);
        decide::end_orphaned(&mut task, error, &self.retry, rand::random(), Utc::now())?;
        let Some(stored) = self.store_task(&task, before).await? else {
            return Ok(None);
        };
        tracing::warn!(task = %stored.id, status = %stored.status, "recovered an interrupted attempt");
        match decide::after_end(stored.status) {
            AfterEnd::Queue => self.queue.push(&stored),
            AfterEnd::FollowUp => self.advance(stored.workflow_id).await?,
        }
        Ok(Some(stored))
    }

    /// Moves unfinished workflows along, all but those in `moving`: after
    /// a start (with `moving` empty), and now and then on a shared store,
    /// in case the node that should have moved one on stopped half-way.
    /// A workflow with a task queued, waiting for a retry or running is
    /// moving: that task's end brings its next decision, so reading the
    /// whole workflow now would decide nothing.
    pub(crate) async fn advance_unfinished_workflows(
        &self,
        moving: &HashSet<WorkflowId>,
    ) -> Result<()> {
        for status in [
            WorkflowStatus::Scheduled,
            WorkflowStatus::Queued,
            WorkflowStatus::Running,
            WorkflowStatus::RollingBack,
        ] {
            let query = WorkflowQuery {
                status: Some(status),
                limit: usize::MAX,
                ..Default::default()
            };
            for workflow in self.store().tasks().list_workflows(&query).await?.items {
                self.queue.register_limit(&workflow);
                if !moving.contains(&workflow.id) {
                    self.advance_from(workflow.id, Some(workflow), false)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// The workflow finished (here, or on another node as the change feed
    /// tells): what this node kept to follow it goes.
    pub(crate) fn forget_workflow(&self, id: WorkflowId) {
        self.queue.forget(id);
        lock(&self.running_workflows).remove(&id);
        lock(&self.fresh_workflows).remove(&id);
    }

    /// Keeps a workflow just stored, with its tasks queued, for the mark
    /// of its first claim (see `fresh_workflows`), if there is room.
    pub(crate) fn keep_fresh(&self, workflow: &Workflow) {
        let mut fresh = lock(&self.fresh_workflows);
        if fresh.len() < FRESH_WORKFLOWS {
            fresh.insert(workflow.id, workflow.clone());
        }
    }

    /// A workflow's first claim moves it to running.
    pub(crate) async fn mark_workflow_running(&self, id: WorkflowId) -> Result<()> {
        // Known running: skip re-reading the workflow on every claim.
        if lock(&self.running_workflows).contains(&id) {
            return Ok(());
        }
        let mut fresh = lock(&self.fresh_workflows).remove(&id);
        loop {
            let guessed = fresh.is_some();
            let mut workflow = match fresh.take() {
                Some(workflow) => workflow,
                None => self.load_workflow(id).await?,
            };
            let before = workflow.status;
            if before == WorkflowStatus::Running {
                // Marked by another claim: remember it here too, or every
                // claim of this worker would read the workflow again.
                lock(&self.running_workflows).insert(id);
                return Ok(());
            }
            if !workflow.start_running(Utc::now()) {
                if guessed {
                    // Decided on the stored record only.
                    continue;
                }
                return Ok(());
            }
            match self.records.update_workflow(&workflow, before, &[]).await {
                Ok(_) => {
                    lock(&self.running_workflows).insert(id);
                    return Ok(());
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Stores how an attempt ended, re-reading the task on conflicts (a
    /// cancel request may have landed while the step ran), then moves the
    /// workflow on.
    pub(crate) async fn finish_attempt(&self, claimed: Task, outcome: Outcome) -> Result<()> {
        let id = claimed.id;
        // The claim as stored is the first guess, which spares a read per
        // attempt (a round trip on a SurrealDB server). Any write since (a
        // cancel request, a checkpoint, another node's takeover) changed
        // the version, so the store refuses the guess and the task is read.
        let mut guess = Some(claimed.clone());
        loop {
            let mut task = match guess.take() {
                Some(task) => task,
                None => self.load_task(id).await?,
            };
            // Only the attempt this node claimed may be ended by it: if its
            // lease ran out and another node took the task over, this
            // outcome is stale and must not land on the newer attempt.
            if !decide::holds(&task, &claimed) {
                tracing::warn!(
                    task = %id, attempt = claimed.attempts,
                    "the attempt ended after another node took the task over; its outcome is discarded"
                );
                return Ok(());
            }
            let before = TaskMark::of(&task);
            let now = Utc::now();
            decide::end_attempt(&mut task, &outcome, &self.retry, rand::random(), now)?;
            // On an error, stored or not, the next look follows this task
            // up (`store_task`); if it was not stored, its lease runs out
            // and it is taken over.
            let Some(stored) = self.store_task(&task, before).await? else {
                continue;
            };
            tracing::info!(task = %id, status = %stored.status, attempt = stored.attempts, "attempt ended");
            // The attempt's wall time, from its claim to its stored outcome,
            // by script and by the status it led to.
            if let Some(started) = claimed.started_at {
                metrics::histogram!(
                    "orchestrator_task_duration_seconds",
                    "script" => stored.script.clone(),
                    "outcome" => stored.status.as_str(),
                )
                .record((now - started).to_std().unwrap_or_default().as_secs_f64());
            }
            if stored.status == TaskStatus::RetryWaiting {
                metrics::counter!("orchestrator_task_retries_total", "script" => stored.script.clone())
                    .increment(1);
            }
            match decide::after_end(stored.status) {
                // A retry, or interrupted by shutdown: back in the queue
                // (for the next start).
                AfterEnd::Queue => self.queue.push(&stored),
                AfterEnd::FollowUp => self.advance_soon(stored).await?,
            }
            return Ok(());
        }
    }

    /// Merges entries into a running task's checkpoint; returns once durable.
    pub(crate) async fn save_checkpoint(
        &self,
        id: TaskId,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Task> {
        self.merge_checkpoint(id, None, entries).await
    }

    /// As `save_checkpoint`, but only while the task still holds the
    /// attempt `claimed`: a step whose lease another node took over must
    /// not write into the newer attempt's checkpoint.
    pub(crate) async fn save_attempt_checkpoint(
        &self,
        claimed: &Task,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Task> {
        self.merge_checkpoint(claimed.id, Some(claimed), entries)
            .await
    }

    async fn merge_checkpoint(
        &self,
        id: TaskId,
        claimed: Option<&Task>,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Task> {
        loop {
            let mut task = self.load_task(id).await?;
            if let Some(claimed) = claimed
                && !decide::holds(&task, claimed)
            {
                return Err(Error::Conflict(format!(
                    "task {id} is no longer held by attempt {} of this node",
                    claimed.attempts
                )));
            }
            let before = TaskMark::of(&task);
            task.save_checkpoint(entries.clone(), Utc::now())?;
            if let Some(stored) = self.store_task(&task, before).await? {
                return Ok(stored);
            }
        }
    }

    /// Cancels a task: at once if it is not running; a running one gets
    /// "cancel requested" stored first, then its step stopped.
    pub(crate) async fn cancel_task(&self, id: TaskId) -> Result<Task> {
        loop {
            let mut task = self.load_task(id).await?;
            let before = TaskMark::of(&task);
            let immediate = task
                .request_cancel(Utc::now())
                .map_err(|e| Error::Conflict(e.to_string()))?;
            let Some(stored) = self.store_task(&task, before).await? else {
                continue;
            };
            if immediate {
                self.advance(stored.workflow_id).await?;
            } else {
                self.attempts.cancel(id);
            }
            tracing::info!(task = %id, immediate, "task cancel requested");
            return Ok(stored);
        }
    }

    /// Cancels a workflow: pending steps never start, running ones are
    /// stopped.
    pub(crate) async fn cancel_workflow(&self, id: WorkflowId) -> Result<()> {
        loop {
            let mut workflow = self.load_workflow(id).await?;
            let before = workflow.status;
            if decide::request_cancel(&mut workflow, Utc::now())? {
                match self.records.update_workflow(&workflow, before, &[]).await {
                    Ok(_) => {}
                    Err(e) if e.is_conflict() => continue,
                    Err(e) => return Err(e),
                }
            }
            break;
        }
        self.advance(id).await?;
        for task in self.store().tasks().workflow_tasks(id).await? {
            if task.status == TaskStatus::Running {
                match self.cancel_task(task.id).await {
                    Ok(_) | Err(Error::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        tracing::info!(workflow = %id, "workflow cancel requested");
        Ok(())
    }

    /// Runs a finished workflow again: failed, cancelled, skipped and
    /// not-started steps, and `always_run` steps. Completed steps keep their
    /// outputs and do not run again.
    pub(crate) async fn retry_workflow(&self, id: WorkflowId) -> Result<()> {
        let workflow = self.load_workflow(id).await?;
        let tasks = self.store().tasks().workflow_tasks(id).await?;
        let decide::Retry {
            workflow,
            before,
            reset,
        } = decide::retry(&workflow, &tasks, Utc::now())?;
        // The workflow and every task it resets in one write: a conflict or
        // a crash leaves all of it as it was, never a running workflow with
        // only some of its tasks reset.
        self.records
            .update_workflow_and_tasks(&workflow, before, &reset)
            .await
            .map(|(stored, _)| stored)
            .map_err(|e| {
                if e.is_conflict() {
                    Error::Conflict(format!("workflow {id} changed meanwhile; try again"))
                } else {
                    e
                }
            })?;
        self.queue.register_limit(&workflow);
        tracing::info!(workflow = %id, "workflow retried");
        self.advance(id).await
    }

    /// Follows up a task that ended: its dependents, and whether the
    /// workflow finished (`follow_up`). Coalesced: when this node is
    /// already following up the workflow, the running call takes this
    /// task on in its next round instead of a second call racing it.
    /// Steps of a wide DAG finish in bursts; each would otherwise race
    /// the others' compare-and-sets.
    pub(crate) async fn advance_soon(&self, ended: Task) -> Result<()> {
        let id = ended.workflow_id;
        {
            let mut advancing = lock(&self.advancing);
            if let Some(more) = advancing.get_mut(&id) {
                more.push(ended);
                return Ok(());
            }
            advancing.insert(id, Vec::new());
        }
        let mut ended = vec![ended];
        loop {
            let progress = lock(&self.progress).remove(&id);
            // On an error the index is not put back: the next follow-up
            // starts from the whole stored workflow, so that nothing this
            // round left undecided is missed.
            let result = match self.follow_up(id, ended, progress).await {
                Ok(Some(progress)) => {
                    lock(&self.progress).insert(id, progress);
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(e) => {
                    lock(&self.stalled).insert(id);
                    Err(e)
                }
            };
            let mut advancing = lock(&self.advancing);
            let more = advancing.get_mut(&id).map(mem::take).unwrap_or_default();
            if result.is_err() || more.is_empty() {
                advancing.remove(&id);
                return result;
            }
            ended = more;
        }
    }

    /// One follow-up of `ended` (tasks of workflow `id`, as stored when
    /// they ended): decisions about their dependents only, then a check
    /// whether the workflow's first task not known to have ended did end.
    /// Falls back to a full `advance` whenever the core says the
    /// dependents are not enough: the index is of another version of the
    /// workflow (or there is none yet), the workflow stops or rolls back,
    /// a failure halts it, a write lost a race, or every task has ended.
    /// Returns the index to keep for the next follow-up, if any.
    async fn follow_up(
        &self,
        id: WorkflowId,
        mut ended: Vec<Task>,
        progress: Option<Progress>,
    ) -> Result<Option<Progress>> {
        let workflow = self.load_workflow(id).await?;
        if workflow.status.is_terminal() {
            return Ok(None);
        }
        let Some(mut progress) = progress.filter(|p| p.is_of(&workflow)) else {
            return self.advance_from(id, Some(workflow), true).await;
        };
        while !ended.is_empty() {
            if !follows_incrementally(&workflow, &ended) {
                return self.advance_from(id, None, true).await;
            }
            let candidates = progress.dependents_of(&ended);
            // What the decisions read: the ended tasks, and the candidates'
            // dependencies as far as needed. Loaded once per round.
            let mut known: HashMap<TaskId, Task> = mem::take(&mut ended)
                .into_iter()
                .map(|t| (t.id, t))
                .collect();
            let mut decided: Vec<(Task, Decision)> = Vec::new();
            for candidate in candidates {
                let task = self.load_task(candidate.id).await?;
                // Only a pending task can be released or skipped here.
                if task.status != TaskStatus::Pending {
                    continue;
                }
                let decide_now = loop {
                    match progress.scan(&task, candidate.after_unsatisfied, |id| known.get(&id)) {
                        Scan::Read(dep) => match self.store().tasks().get_task(dep).await? {
                            Some(dep) => {
                                known.insert(dep.id, dep);
                            }
                            // A dependency that does not exist: the
                            // decision names it.
                            None => break true,
                        },
                        Scan::Wait => break false,
                        Scan::Decide => break true,
                    }
                };
                if !decide_now {
                    continue;
                }
                for dep in &task.depends_on {
                    if !known.contains_key(dep)
                        && let Some(dep) = self.store().tasks().get_task(*dep).await?
                    {
                        known.insert(dep.id, dep);
                    }
                }
                if let Some(decision) = decide_task(&workflow, &task, |id| known.get(&id)) {
                    decided.push((task, decision));
                }
            }
            let by_id: HashMap<TaskId, &Task> = known.iter().map(|(id, t)| (*id, t)).collect();
            let mut changed: Vec<(Task, TaskMark)> = Vec::with_capacity(decided.len());
            for (mut task, decision) in decided {
                let now = Utc::now();
                let before = TaskMark::of(&task);
                match decision {
                    Decision::Release(_) => decide::release(&workflow, &mut task, &by_id, now)?,
                    Decision::Skip(_, reason) => task.skip(reason, now)?,
                    // Not made about a pending task while the workflow runs
                    // undisturbed; if it ever is, the full round decides.
                    _ => return self.advance_from(id, None, true).await,
                }
                changed.push((task, before));
            }
            let stored = join_all(
                changed
                    .iter()
                    .map(|(task, before)| self.store_task(task, *before)),
            )
            .await;
            for stored in stored {
                match stored? {
                    Some(task) if task.status == TaskStatus::Queued => self.queue.push(&task),
                    // An approval gate opened: it waits for its decisions.
                    Some(task) if task.status == TaskStatus::Pending => {}
                    // Skipped or unrunnable: its dependents are next.
                    Some(task) => ended.push(task),
                    // Someone else moved it: the full round sees how.
                    None => return self.advance_from(id, None, true).await,
                }
            }
        }
        // Finished only once every task has ended: one read per step
        // while the first unfinished task runs, each task read as ended
        // once.
        while let Some(first) = progress.first_unended() {
            let task = self.load_task(first).await?;
            if !task.status.is_terminal() {
                return Ok(Some(progress));
            }
            progress.read_as_ended(&task);
        }
        self.advance_from(id, None, true).await
    }

    /// Notes a workflow whose last write reported an error, so that the
    /// next look reads it again, whether that write landed or not.
    pub(crate) fn mark_uncertain(&self, id: WorkflowId) {
        lock(&self.stalled).insert(id);
    }

    /// Reads again each workflow whose last write may or may not have
    /// landed: queues its tasks that are stored as ready (the queue keeps
    /// each task once, and a worker re-reads a task before it claims it),
    /// then advances it in full. Those that fail again stay for the next
    /// call.
    pub(crate) async fn retry_stalled(&self) {
        let stalled: Vec<WorkflowId> = lock(&self.stalled).drain().collect();
        for id in stalled {
            if let Err(e) = self.requeue_ready(id).await {
                if decide::stays_stalled(&e) {
                    tracing::warn!(workflow = %id, error = %e, "a workflow whose last write failed still cannot be read");
                    lock(&self.stalled).insert(id);
                }
                continue;
            }
            match self.advance(id).await {
                Ok(()) => {
                    tracing::info!(workflow = %id, "advanced a workflow whose follow-up had failed")
                }
                // Deleted meanwhile (retention): nothing left to advance.
                Err(e) if !decide::stays_stalled(&e) => {}
                Err(e) => {
                    tracing::warn!(workflow = %id, error = %e, "a workflow whose follow-up failed still cannot advance");
                    lock(&self.stalled).insert(id);
                }
            }
        }
    }

    /// Queues the tasks of workflow `id` that are stored as queued or
    /// waiting for a retry. `NotFound` if there is no such workflow (a
    /// submission whose write did not land after all).
    async fn requeue_ready(&self, id: WorkflowId) -> Result<()> {
        let workflow = self.load_workflow(id).await?;
        self.queue.register_limit(&workflow);
        for task in self.store().tasks().workflow_tasks(id).await? {
            if decide::waits_in_queue(task.status) {
                self.queue.push(&task);
            }
        }
        Ok(())
    }

    /// Applies decisions until the workflow needs nothing more right now.
    pub(crate) async fn advance(&self, id: WorkflowId) -> Result<()> {
        self.advance_from(id, None, false).await.map(|_| ())
    }

    /// `advance`, starting from `workflow` if it was just read. With
    /// `index`, returns the index of the workflow as its last round read
    /// it, for `follow_up`, unless the workflow finished.
    async fn advance_from(
        &self,
        id: WorkflowId,
        mut read: Option<Workflow>,
        index: bool,
    ) -> Result<Option<Progress>> {
        loop {
            let workflow = match read.take() {
                Some(workflow) => workflow,
                None => self.load_workflow(id).await?,
            };
            let tasks = self.store().tasks().workflow_tasks(id).await?;
            let decisions = orchestrator_core::decide(&workflow, &tasks);
            if decisions.is_empty() {
                let running = !workflow.status.is_terminal();
                return Ok((index && running).then(|| Progress::new(&workflow, &tasks)));
            }
            let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, &**t)).collect();
            let round = decide::round(&workflow, decisions, &by_id, Utc::now())?;
            // Another round is needed only when a decision ended a task or
            // changed the workflow (which may enable further decisions), or
            // lost a race; a plain release does neither. Each round re-reads
            // the whole workflow, so skipping the needless one matters.
            let mut again = false;
            let mut finished = false;
            match round.workflow {
                None => {}
                Some(WorkflowChange::Halt(halted)) => {
                    if let Some(halt) = &halted.halt {
                        tracing::warn!(workflow = %id, reason = %halt.reason, rollback = halt.rollback, "workflow halted");
                    }
                    self.store_workflow(&halted, &[]).await?;
                    again = true;
                }
                Some(WorkflowChange::Rollback {
                    workflow,
                    before,
                    tasks,
                }) => {
                    if self
                        .store_workflow_from(&workflow, before, &tasks)
                        .await?
                        .is_some()
                    {
                        tracing::warn!(workflow = %id, steps = tasks.len(), "rolling back completed steps");
                        for task in tasks.iter().filter(|t| t.status == TaskStatus::Queued) {
                            self.queue.push(task);
                        }
                    }
                    again = true;
                }
                Some(WorkflowChange::Finish { workflow, before }) => {
                    if self
                        .store_workflow_from(&workflow, before, &[])
                        .await?
                        .is_some()
                    {
                        tracing::info!(workflow = %id, status = %workflow.status, "workflow finished");
                        self.forget_workflow(id);
                        self.finished.send_modify(|n| *n += 1);
                        finished = true;
                    } else {
                        again = true;
                    }
                }
            }
            // Task decisions are independent of each other: their writes go
            // out together, so the storage can make them durable in one go.
            let stored = join_all(
                round
                    .tasks
                    .iter()
                    .map(|(task, before)| self.store_task(task, *before)),
            )
            .await;
            for stored in stored {
                match stored? {
                    Some(task) if task.status == TaskStatus::Queued => self.queue.push(&task),
                    // Ended (skipped, abandoned, unrunnable), or lost a race.
                    _ => again = true,
                }
            }
            if !again {
                // Only releases (or a finish): the workflow as read is
                // still the stored version.
                return Ok((index && !finished).then(|| Progress::new(&workflow, &tasks)));
            }
        }
    }

    /// Stores a task; `None` if someone else changed it first (the next
    /// round of decisions sees their change). On any other error the
    /// write may have landed or not, and whatever was to follow it here
    /// (queueing the task, releasing its dependents) did not happen: its
    /// workflow is read again at the next look (see `stalled`).
    async fn store_task(&self, task: &Task, before: TaskMark) -> Result<Option<Task>> {
        match self.records.update_task(task, before).await {
            Ok(stored) => Ok(Some(stored)),
            Err(e) if e.is_conflict() => Ok(None),
            Err(e) => {
                self.mark_uncertain(task.workflow_id);
                Err(e)
            }
        }
    }

    /// Stores a workflow whose status did not change.
    async fn store_workflow(
        &self,
        workflow: &Workflow,
        new_tasks: &[Task],
    ) -> Result<Option<Workflow>> {
        self.store_workflow_from(workflow, workflow.status, new_tasks)
            .await
    }

    /// Stores a workflow that had status `before`; `None` if someone else
    /// changed it first.
    async fn store_workflow_from(
        &self,
        workflow: &Workflow,
        before: WorkflowStatus,
        new_tasks: &[Task],
    ) -> Result<Option<Workflow>> {
        match self
            .records
            .update_workflow(workflow, before, new_tasks)
            .await
        {
            Ok(stored) => Ok(Some(stored)),
            Err(e) if e.is_conflict() => Ok(None),
            Err(e) => {
                // As in `store_task`: read again at the next look.
                self.mark_uncertain(workflow.id);
                Err(e)
            }
        }
    }
}
