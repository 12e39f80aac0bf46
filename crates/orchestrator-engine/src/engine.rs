//! The engine proper: submission, dispatch, workers, completion, cancel,
//! recovery at start and graceful shutdown.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use orchestrator_core::{
    DependencyDecision, ReadyQueue, RetryPolicy, Task, TaskId, TaskSpec, TaskStatus, Workflow,
    WorkflowId, WorkflowStatus, decide_dependents,
};
use orchestrator_executor::{Job, Outcome, ScriptExecutor};
use orchestrator_storage::{Storage, TaskQuery};
use serde::Serialize;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio_util::sync::CancellationToken;

use crate::builtin::WorkflowPlan;
use crate::{Error, Result};

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Scripts that may run at once.
    pub workers: usize,
    /// Attempts per task when a submission does not say.
    pub default_max_attempts: u32,
    /// Per-attempt timeout when a submission does not say.
    pub default_timeout: Duration,
    pub retry: RetryPolicy,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            default_max_attempts: 3,
            default_timeout: Duration::from_secs(3600),
            retry: RetryPolicy::default(),
        }
    }
}

/// A workflow with its tasks and derived status.
#[derive(Debug, Clone, Serialize)]
pub struct WorkflowView {
    #[serde(flatten)]
    pub workflow: Workflow,
    pub status: WorkflowStatus,
    pub tasks: Vec<Task>,
}

/// What [`Engine::submit`] created.
#[derive(Debug, Clone)]
pub struct Submission {
    pub workflow: Workflow,
    pub tasks: Vec<Task>,
}

/// The running engine. Clones share one runtime.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: Storage,
    executor: ScriptExecutor,
    config: EngineConfig,
    /// A std mutex: pushes and pops are short and never await.
    queue: Mutex<ReadyQueue>,
    /// Wakes the dispatcher when the queue gains a task.
    queue_changed: Notify,
    /// One permit per worker; a task runs while it holds one.
    workers: Arc<Semaphore>,
    /// Cancel tokens of the attempts in flight. Registered before the task
    /// is marked running, so a cancel that sees "running" always finds it.
    running: Mutex<HashMap<TaskId, CancellationToken>>,
    /// Bumped whenever a task reaches a terminal state; waiters watch it.
    finished: watch::Sender<u64>,
    /// Set when shutdown begins: nothing new is dispatched or accepted.
    stopping: CancellationToken,
}

impl Engine {
    /// Recovers unfinished work from storage and starts dispatching.
    pub async fn start(
        store: Storage,
        executor: ScriptExecutor,
        config: EngineConfig,
    ) -> Result<Engine> {
        let workers = config.workers.max(1);
        let inner = Arc::new(Inner {
            store,
            executor,
            config: EngineConfig { workers, ..config },
            queue: Mutex::new(ReadyQueue::new()),
            queue_changed: Notify::new(),
            workers: Arc::new(Semaphore::new(workers)),
            running: Mutex::new(HashMap::new()),
            finished: watch::Sender::new(0),
            stopping: CancellationToken::new(),
        });
        inner.recover().await?;
        tokio::spawn(inner.clone().dispatch_loop());
        Ok(Engine { inner })
    }

    pub fn store(&self) -> &Storage {
        &self.inner.store
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Tasks waiting in the queue, by priority, and tasks running now.
    pub fn load(&self) -> (usize, usize) {
        let queued = self.inner.lock_queue().len();
        let running = self
            .inner
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        (queued, running)
    }

    /// Validates the scripts of a plan, then persists the workflow with all
    /// its tasks in one atomic write and queues the ready ones.
    pub async fn submit(&self, plan: WorkflowPlan) -> Result<Submission> {
        if self.inner.stopping.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let mut checked = HashSet::new();
        for (i, planned) in plan.tasks.iter().enumerate() {
            if checked.insert(planned.script.as_str()) {
                self.inner
                    .executor
                    .resolve(&planned.script)
                    .map_err(|e| Error::validation(format!("tasks[{i}].script"), e.to_string()))?;
            }
        }
        let now = Utc::now();
        let workflow_id = WorkflowId::new();
        let options = &plan.options;
        let max_attempts = options
            .max_attempts
            .unwrap_or(self.inner.config.default_max_attempts);
        let timeout = options
            .timeout_secs
            .map_or(self.inner.config.default_timeout, Duration::from_secs);
        let mut tasks: Vec<Task> = Vec::with_capacity(plan.tasks.len());
        for (i, planned) in plan.tasks.into_iter().enumerate() {
            let mut depends_on = Vec::with_capacity(planned.depends_on.len());
            for &dep in &planned.depends_on {
                let dep_task = tasks.get(dep).ok_or_else(|| {
                    Error::validation(
                        format!("tasks[{i}].depends_on"),
                        format!("{dep} is not an earlier task"),
                    )
                })?;
                depends_on.push(dep_task.id);
            }
            let spec = TaskSpec {
                name: planned.name,
                script: planned.script,
                input: planned.input,
                priority: options.priority,
                max_attempts,
                timeout,
                check_mode: options.check_mode,
                depends_on,
                step: Default::default(),
            };
            tasks.push(Task::new(workflow_id, spec, now));
        }
        let workflow = Workflow {
            id: workflow_id,
            kind: plan.kind,
            template_version: None,
            name: plan.name,
            description: None,
            input: plan.request,
            check_mode: options.check_mode,
            priority: options.priority,
            status: WorkflowStatus::Queued,
            on_failure: Default::default(),
            parallel_limit: None,
            reference: None,
            trace_id: None,
            revision: 1,
            previous_revision: None,
            idempotency_key: None,
            request_digest: None,
            start_at: None,
            task_ids: tasks.iter().map(|t| t.id).collect(),
            created_at: now,
            started_at: None,
            finished_at: None,
            updated_at: now,
            version: 0,
        };
        self.inner.store.insert_workflow(&workflow, &tasks).await?;
        tracing::info!(workflow = %workflow.id, kind = %workflow.kind, tasks = tasks.len(), "workflow submitted");
        {
            let mut queue = self.inner.lock_queue();
            for task in tasks.iter().filter(|t| t.status == TaskStatus::Queued) {
                queue.push(task.id, task.priority);
            }
        }
        self.inner.queue_changed.notify_one();
        Ok(Submission { workflow, tasks })
    }

    pub async fn task(&self, id: TaskId) -> Result<Task> {
        self.inner
            .store
            .get_task(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "task",
                id: id.to_string(),
            })
    }

    pub async fn workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        let workflow = self
            .inner
            .store
            .get_workflow(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "workflow",
                id: id.to_string(),
            })?;
        let tasks = self.inner.store.workflow_tasks(id).await?;
        Ok(WorkflowView {
            status: workflow.status,
            workflow,
            tasks,
        })
    }

    pub async fn list_tasks(&self, query: &TaskQuery) -> Result<orchestrator_storage::Page<Task>> {
        Ok(self.inner.store.list_tasks(query).await?)
    }

    /// Cancels a task: at once if it is not running; a running one gets
    /// "cancel requested" persisted first, then its process group stopped.
    pub async fn cancel_task(&self, id: TaskId) -> Result<Task> {
        loop {
            let mut task = self.task(id).await?;
            let immediate = task
                .request_cancel(Utc::now())
                .map_err(|e| Error::Conflict(e.to_string()))?;
            match self.inner.store.update_task(&task).await {
                Ok(stored) => {
                    if immediate {
                        self.inner.task_finished(&stored).await?;
                    } else if let Some(token) = self
                        .inner
                        .running
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get(&id)
                    {
                        token.cancel();
                    }
                    tracing::info!(task = %id, immediate, "task cancel requested");
                    return Ok(stored);
                }
                // Someone moved the task meanwhile; decide again on fresh state.
                Err(orchestrator_storage::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits until every task of the workflow is finished or `limit` passes.
    /// Returns whether the workflow finished.
    pub async fn wait_for_workflow(&self, id: WorkflowId, limit: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut finished = self.inner.finished.subscribe();
        loop {
            finished.borrow_and_update();
            if self.workflow(id).await?.status.is_terminal() {
                return Ok(true);
            }
            tokio::select! {
                changed = finished.changed() => if changed.is_err() { return Ok(false) },
                () = tokio::time::sleep_until(deadline) => return Ok(false),
            }
        }
    }

    /// Stops dispatching, lets running scripts finish within `grace`, then
    /// stops the rest (they return to the queue, their attempt not counted)
    /// and closes storage.
    pub async fn shutdown(&self, grace: Duration) {
        let inner = &self.inner;
        inner.stopping.cancel();
        let all = u32::try_from(inner.config.workers).unwrap_or(u32::MAX);
        let idle = tokio::time::timeout(grace, inner.workers.acquire_many(all)).await;
        if idle.is_err() {
            let tokens: Vec<_> = inner
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            tracing::warn!(
                running = tokens.len(),
                "grace period over; stopping running scripts"
            );
            for token in tokens {
                token.cancel();
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), inner.workers.acquire_many(all))
                .await;
        }
        if let Err(e) = inner.store.close().await {
            tracing::error!(error = %e, "closing storage failed");
        }
    }
}

impl Inner {
    fn lock_queue(&self) -> std::sync::MutexGuard<'_, ReadyQueue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts unfinished work back in motion after a start.
    async fn recover(&self) -> Result<()> {
        let unfinished = self.store.unfinished_tasks().await?;
        let mut workflows_with_pending = HashSet::new();
        let mut requeued = 0usize;
        for mut task in unfinished {
            match task.status {
                TaskStatus::Queued => {
                    self.lock_queue().push(task.id, task.priority);
                    requeued += 1;
                }
                TaskStatus::RetryWaiting => {
                    let due = task.retry_at.unwrap_or_else(Utc::now);
                    self.lock_queue().push_at(task.id, task.priority, due);
                    requeued += 1;
                }
                TaskStatus::Running => {
                    // The previous instance died during this attempt.
                    let now = Utc::now();
                    if task.cancel_requested {
                        task.finish_cancel(now)?;
                    } else {
                        let error = format!(
                            "interrupted: the service stopped during attempt {}",
                            task.attempts
                        );
                        task.fail(error, None, &self.config.retry, rand::random(), now)?;
                    }
                    let stored = self.store.update_task(&task).await?;
                    tracing::warn!(task = %task.id, status = %stored.status, "recovered an interrupted attempt");
                    if stored.status == TaskStatus::RetryWaiting {
                        let due = stored.retry_at.unwrap_or(now);
                        self.lock_queue().push_at(stored.id, stored.priority, due);
                        requeued += 1;
                    } else {
                        workflows_with_pending.insert(stored.workflow_id);
                    }
                }
                TaskStatus::Pending => {
                    workflows_with_pending.insert(task.workflow_id);
                }
                _ => {}
            }
        }
        for workflow in workflows_with_pending {
            self.settle_dependents(workflow).await?;
        }
        if requeued > 0 {
            tracing::info!(tasks = requeued, "resumed unfinished tasks");
        }
        Ok(())
    }

    async fn dispatch_loop(self: Arc<Self>) {
        loop {
            let permit = tokio::select! {
                permit = self.workers.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                () = self.stopping.cancelled() => return,
            };
            let id = loop {
                let (next, next_due) = {
                    let mut queue = self.lock_queue();
                    (queue.pop(Utc::now()), queue.next_due())
                };
                if let Some(id) = next {
                    break id;
                }
                let sleep_for = next_due
                    .map(|due| (due - Utc::now()).to_std().unwrap_or_default())
                    .unwrap_or(Duration::from_secs(3600));
                tokio::select! {
                    () = self.queue_changed.notified() => {}
                    () = tokio::time::sleep(sleep_for) => {}
                    () = self.stopping.cancelled() => return,
                }
            };
            tokio::spawn(self.clone().run_task(id, permit));
        }
    }

    async fn run_task(self: Arc<Self>, id: TaskId, permit: OwnedSemaphorePermit) {
        if let Err(e) = self.run_attempt(id).await {
            tracing::error!(task = %id, error = %e, "task attempt could not be recorded");
        }
        drop(permit);
    }

    async fn run_attempt(&self, id: TaskId) -> Result<()> {
        let Some(task) = self.store.get_task(id).await? else {
            return Ok(());
        };
        if !matches!(task.status, TaskStatus::Queued | TaskStatus::RetryWaiting) {
            // Cancelled (or otherwise moved on) while it sat in the queue.
            return Ok(());
        }
        let token = CancellationToken::new();
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, token.clone());
        let outcome = self.claim_and_execute(task, token).await;
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        match outcome? {
            Some((task, outcome)) => self.record_outcome(task, outcome).await,
            None => Ok(()),
        }
    }

    /// Persists "running" (the claim), then runs the script.
    async fn claim_and_execute(
        &self,
        task: Task,
        token: CancellationToken,
    ) -> Result<Option<(Task, Outcome)>> {
        let mut claim = task;
        claim.start(Utc::now())?;
        let task = match self.store.update_task(&claim).await {
            Ok(task) => task,
            Err(orchestrator_storage::Error::Conflict { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        tracing::debug!(task = %task.id, attempt = task.attempts, script = %task.script, "attempt started");

        let (logs, mut log_lines) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let store = self.store.clone();
        let task_id = task.id;
        let log_pump = tokio::spawn(async move {
            while let Some(chunk) = log_lines.recv().await {
                if let Err(e) = store.append_log(task_id, &chunk).await {
                    tracing::warn!(task = %task_id, error = %e, "log append failed");
                }
            }
        });
        let job = Job {
            script: &task.script,
            input: &task.input,
            task_id: task.id.to_string(),
            workflow_id: task.workflow_id.to_string(),
            attempt: task.attempts,
            check_mode: task.check_mode,
            timeout: task.timeout(),
        };
        let outcome = self.executor.run(job, logs, token).await;
        // The log is complete before the final state is stored.
        let _ = log_pump.await;
        Ok(Some((task, outcome)))
    }

    /// Stores how the attempt ended, re-reading the task on conflicts (a
    /// cancel request may have landed while the script ran).
    async fn record_outcome(&self, task: Task, outcome: Outcome) -> Result<()> {
        let id = task.id;
        loop {
            let mut task = self.store.get_task(id).await?.ok_or(Error::NotFound {
                what: "task",
                id: id.to_string(),
            })?;
            let now = Utc::now();
            match &outcome {
                Outcome::Succeeded { output } => task.complete(output.clone(), now)?,
                Outcome::Cancelled if !task.cancel_requested => task.interrupt(
                    format!(
                        "interrupted: the service shut down during attempt {}",
                        task.attempts
                    ),
                    now,
                )?,
                Outcome::Cancelled => task.finish_cancel(now)?,
                Outcome::TimedOut { error } => {
                    task.fail(error.clone(), None, &self.config.retry, rand::random(), now)?;
                }
                Outcome::Failed { exit_code, error } => {
                    task.fail(
                        error.clone(),
                        *exit_code,
                        &self.config.retry,
                        rand::random(),
                        now,
                    )?;
                }
            }
            let stored = match self.store.update_task(&task).await {
                Ok(stored) => stored,
                Err(orchestrator_storage::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            tracing::info!(task = %id, status = %stored.status, attempt = stored.attempts, "attempt ended");
            match stored.status {
                TaskStatus::RetryWaiting => {
                    let due = stored.retry_at.unwrap_or(now);
                    self.lock_queue().push_at(id, stored.priority, due);
                    self.queue_changed.notify_one();
                }
                TaskStatus::Queued => {
                    // Interrupted by shutdown: back in the queue for the next start.
                    self.lock_queue().push(id, stored.priority);
                }
                _ => self.task_finished(&stored).await?,
            }
            return Ok(());
        }
    }

    async fn task_finished(&self, task: &Task) -> Result<()> {
        self.settle_dependents(task.workflow_id).await?;
        self.refresh_workflow_status(task.workflow_id).await?;
        self.finished.send_modify(|n| *n += 1);
        Ok(())
    }

    /// Stores the workflow status its tasks now imply, if it changed.
    async fn refresh_workflow_status(&self, id: WorkflowId) -> Result<()> {
        loop {
            let Some(mut workflow) = self.store.get_workflow(id).await? else {
                return Ok(());
            };
            let tasks = self.store.workflow_tasks(id).await?;
            let status = WorkflowStatus::of(&tasks);
            if status == workflow.status {
                return Ok(());
            }
            let now = Utc::now();
            if workflow.started_at.is_none() && status != WorkflowStatus::Queued {
                workflow.started_at = tasks
                    .iter()
                    .filter_map(|t| t.started_at)
                    .min()
                    .or(Some(now));
            }
            if status.is_terminal() {
                workflow.finished_at = Some(now);
            }
            workflow.status = status;
            workflow.updated_at = now;
            match self.store.update_workflow(&workflow, &[]).await {
                Ok(_) => return Ok(()),
                Err(orchestrator_storage::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Releases pending tasks whose dependencies all completed and skips
    /// those with a dependency that did not, until nothing changes.
    async fn settle_dependents(&self, workflow: WorkflowId) -> Result<()> {
        loop {
            let tasks = self.store.workflow_tasks(workflow).await?;
            let decisions = decide_dependents(&tasks);
            if decisions.is_empty() {
                return Ok(());
            }
            let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, t)).collect();
            let mut released = Vec::new();
            for decision in decisions {
                let now = Utc::now();
                let (id, mut task) = match &decision {
                    DependencyDecision::Release(id) | DependencyDecision::Skip(id, _) => {
                        (*id, (*by_id[id]).clone())
                    }
                };
                match decision {
                    DependencyDecision::Release(_) => task.release(now)?,
                    DependencyDecision::Skip(_, reason) => task.skip(reason, now)?,
                }
                match self.store.update_task(&task).await {
                    Ok(stored) if stored.status == TaskStatus::Queued => released.push(stored),
                    Ok(_) => {}
                    // Settled concurrently by another finishing task.
                    Err(orchestrator_storage::Error::Conflict { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                tracing::debug!(task = %id, "dependent settled");
            }
            if !released.is_empty() {
                let mut queue = self.lock_queue();
                for task in &released {
                    queue.push(task.id, task.priority);
                }
                drop(queue);
                self.queue_changed.notify_one();
            }
        }
    }
}

impl From<orchestrator_core::Error> for Error {
    fn from(e: orchestrator_core::Error) -> Self {
        Error::Conflict(e.to_string())
    }
}
