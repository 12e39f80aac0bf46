//! The engine's public face and shared state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use orchestrator_core::{
    ReadyQueue, RetryPolicy, Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus,
};
use orchestrator_executor::ScriptExecutor;
use orchestrator_storage::{Page, Storage, TaskQuery, WorkflowQuery};
use serde::Serialize;
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::templates::Templates;
use crate::{Error, Result};

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Scripts that may run at once.
    pub workers: usize,
    /// Attempts per task when neither the template nor the submission says.
    pub default_max_attempts: u32,
    /// Per-attempt timeout when neither the template nor the submission says.
    pub default_timeout: Duration,
    pub retry: RetryPolicy,
    /// This instance's stable id, recorded on every attempt it runs.
    pub node_id: String,
    /// Where this instance's API listens, for `GET /cluster/nodes`.
    pub address: String,
    /// How long a claim on a running task holds without renewal; heartbeats
    /// renew it three times per period. Past it, another node takes over.
    pub lease: Duration,
    /// Tokens, roles and rate limits.
    pub access: crate::access::AccessConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            default_max_attempts: 3,
            default_timeout: Duration::from_secs(3600),
            retry: RetryPolicy::default(),
            node_id: "local".to_owned(),
            address: String::new(),
            lease: Duration::from_secs(15),
            access: crate::access::AccessConfig::default(),
        }
    }
}

/// One template step of a workflow: its instances and their overall state.
#[derive(Debug, Clone, Serialize)]
pub struct StepView {
    pub ref_name: String,
    /// Worst status among its instances (failed > cancelled > skipped >
    /// not_started > running ... > completed).
    pub status: TaskStatus,
    pub task_ids: Vec<TaskId>,
}

/// A workflow with its tasks, steps and DAG edges.
#[derive(Debug, Clone, Serialize)]
pub struct WorkflowView {
    #[serde(flatten)]
    pub workflow: Workflow,
    pub steps: Vec<StepView>,
    /// `[from, to]`: `to` depends on `from`.
    pub edges: Vec<[TaskId; 2]>,
    pub tasks: Vec<Task>,
}

impl WorkflowView {
    pub(crate) fn new(workflow: Workflow, tasks: Vec<Task>) -> WorkflowView {
        let mut steps: Vec<StepView> = Vec::new();
        for task in &tasks {
            let Some(ref_name) = task
                .step
                .ref_name
                .as_ref()
                .filter(|_| task.step.rollback_of.is_none())
            else {
                continue;
            };
            match steps.iter_mut().find(|s| &s.ref_name == ref_name) {
                Some(step) => {
                    step.task_ids.push(task.id);
                    if severity(task.status) > severity(step.status) {
                        step.status = task.status;
                    }
                }
                None => steps.push(StepView {
                    ref_name: ref_name.clone(),
                    status: task.status,
                    task_ids: vec![task.id],
                }),
            }
        }
        let edges = tasks
            .iter()
            .flat_map(|t| t.depends_on.iter().map(move |from| [*from, t.id]))
            .collect();
        WorkflowView {
            workflow,
            steps,
            edges,
            tasks,
        }
    }
}

fn severity(status: TaskStatus) -> u8 {
    match status {
        TaskStatus::Completed => 0,
        TaskStatus::Pending => 1,
        TaskStatus::Queued => 2,
        TaskStatus::RetryWaiting => 3,
        TaskStatus::Running => 4,
        TaskStatus::NotStarted => 5,
        TaskStatus::Skipped => 6,
        TaskStatus::Cancelled => 7,
        TaskStatus::Failed => 8,
    }
}

/// The running engine. Clones share one runtime.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

/// Per-workflow concurrency for `parallel_limit`.
#[derive(Debug, Default)]
pub(crate) struct Slots {
    pub(crate) limit: usize,
    pub(crate) running: usize,
    /// Tasks popped while the workflow was at its limit, waiting for a slot.
    pub(crate) deferred: std::collections::VecDeque<(TaskId, orchestrator_core::Priority)>,
}

pub(crate) struct Inner {
    pub(crate) store: Storage,
    pub(crate) access: crate::access::Access,
    /// Shared with each attempt's log pump, which redacts as it stores.
    pub(crate) secrets: Arc<crate::secrets::Secrets>,
    pub(crate) executor: ScriptExecutor,
    pub(crate) templates: Templates,
    pub(crate) config: EngineConfig,
    /// A std mutex: pushes and pops are short and never await.
    pub(crate) queue: Mutex<ReadyQueue>,
    /// Wakes the dispatcher when the queue gains a task.
    pub(crate) queue_changed: Notify,
    /// One permit per worker; a script runs while it holds one.
    pub(crate) workers: Arc<Semaphore>,
    /// Every attempt from its claim until its outcome is stored and its
    /// workflow advanced; shutdown waits for them.
    pub(crate) in_flight: TaskTracker,
    /// Cancel tokens of the attempts in flight. Registered before the task
    /// is marked running, so a cancel that sees "running" always finds it.
    pub(crate) running: Mutex<HashMap<TaskId, CancellationToken>>,
    /// Workflows this node saw running, so that claims need not re-read
    /// them; forgotten when they finish.
    pub(crate) running_workflows: Mutex<std::collections::HashSet<WorkflowId>>,
    /// Workflows this node is advancing in `advance_soon`, and whether
    /// another round was asked for meanwhile.
    pub(crate) advancing: Mutex<HashMap<WorkflowId, bool>>,
    /// Workflows with a `parallel_limit`, and how many of their tasks run.
    pub(crate) slots: Mutex<HashMap<WorkflowId, Slots>>,
    /// Bumped whenever a workflow finishes; waiters watch it.
    pub(crate) finished: watch::Sender<u64>,
    /// Set when shutdown begins: nothing new is dispatched or accepted.
    pub(crate) stopping: CancellationToken,
    /// Set when shutdown is over: heartbeats and lease renewal stop.
    pub(crate) closed: CancellationToken,
    pub(crate) started_at: chrono::DateTime<Utc>,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a few map operations that can not leave
    // the data half-changed, so a poisoned lock is still consistent.
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Engine {
    /// Recovers unfinished work from storage and starts dispatching.
    pub async fn start(
        store: Storage,
        executor: ScriptExecutor,
        templates: Templates,
        config: EngineConfig,
    ) -> Result<Engine> {
        let workers = config.workers.max(1);
        let access = crate::access::Access::load(store.clone(), config.access.clone()).await?;
        let secret_key = config.access.secret_key.unwrap_or_else(|| {
            let mut key = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rand::rng(), &mut key);
            key
        });
        let secrets = Arc::new(crate::secrets::Secrets::load(store.clone(), secret_key).await?);
        let inner = Arc::new(Inner {
            access,
            secrets,
            store,
            executor,
            templates,
            config: EngineConfig { workers, ..config },
            queue: Mutex::new(ReadyQueue::new()),
            queue_changed: Notify::new(),
            workers: Arc::new(Semaphore::new(workers)),
            in_flight: TaskTracker::new(),
            running: Mutex::new(HashMap::new()),
            slots: Mutex::new(HashMap::new()),
            advancing: Mutex::new(HashMap::new()),
            running_workflows: Mutex::new(Default::default()),
            finished: watch::Sender::new(0),
            stopping: CancellationToken::new(),
            closed: CancellationToken::new(),
            started_at: Utc::now(),
        });
        inner.heartbeat().await?;
        inner.recover().await?;
        tokio::spawn(inner.clone().dispatch_loop());
        tokio::spawn(inner.clone().housekeeping_loop());
        Ok(Engine { inner })
    }

    pub fn store(&self) -> &Storage {
        &self.inner.store
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Tokens and the audit log.
    pub fn access(&self) -> &crate::access::Access {
        &self.inner.access
    }

    /// Encrypted secrets, and the redaction of their values.
    pub fn secrets(&self) -> &crate::secrets::Secrets {
        &self.inner.secrets
    }

    pub fn templates(&self) -> &Templates {
        &self.inner.templates
    }

    pub fn executor(&self) -> &ScriptExecutor {
        &self.inner.executor
    }

    /// Every node that shares the store, and whether it is alive.
    pub async fn nodes(&self) -> Result<Vec<(orchestrator_core::Node, bool)>> {
        let lease = chrono::Duration::from_std(self.inner.config.lease).unwrap_or_default();
        let now = Utc::now();
        Ok(self
            .inner
            .store
            .nodes()
            .nodes()
            .await?
            .into_iter()
            .map(|n| {
                let alive = n.alive(lease, now);
                (n, alive)
            })
            .collect())
    }

    /// Entries in the queue (cancelled ones until they are popped) and
    /// attempts running now.
    pub fn load(&self) -> (usize, usize) {
        (
            lock(&self.inner.queue).len(),
            lock(&self.inner.running).len(),
        )
    }

    /// Tasks in the ready queue that may run now, by priority (lowest
    /// first), and those waiting for a due time (retries, scheduled
    /// starts): what `GET /metrics` reports as the queue depth.
    pub fn queue_depth(&self) -> ([(orchestrator_core::Priority, usize); 4], usize) {
        let queue = lock(&self.inner.queue);
        let ready = queue.ready_by_priority();
        let n_ready: usize = ready.iter().map(|(_, n)| n).sum();
        (ready, queue.len() - n_ready)
    }

    pub async fn task(&self, id: TaskId) -> Result<Task> {
        self.inner
            .store
            .tasks()
            .get_task(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "task",
                id: id.to_string(),
            })
    }

    pub async fn workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        let workflow = self.inner.load_workflow(id).await?;
        let tasks = self.inner.store.tasks().workflow_tasks(id).await?;
        let tasks = tasks.into_iter().map(Arc::unwrap_or_clone).collect();
        Ok(WorkflowView::new(workflow, tasks))
    }

    pub async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        Ok(self.inner.store.tasks().list_tasks(query).await?)
    }

    pub async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        Ok(self.inner.store.tasks().list_workflows(query).await?)
    }

    /// Cancels a task: at once if it is not running; a running one gets
    /// "cancel requested" persisted first, then its process group stopped.
    pub async fn cancel_task(&self, id: TaskId) -> Result<Task> {
        self.inner.cancel_task(id).await
    }

    /// Saves checkpoint entries of a running task, durably.
    pub async fn save_checkpoint(
        &self,
        id: TaskId,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Task> {
        self.inner.save_checkpoint(id, entries).await
    }

    /// Waits until the workflow has finished or `limit` passes. Returns
    /// whether it finished.
    pub async fn wait_for_workflow(&self, id: WorkflowId, limit: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut finished = self.inner.finished.subscribe();
        loop {
            finished.borrow_and_update();
            if self.inner.load_workflow(id).await?.status.is_terminal() {
                return Ok(true);
            }
            // Another node may finish it: look again now and then too.
            tokio::select! {
                changed = finished.changed() => if changed.is_err() { return Ok(false) },
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
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
        inner.in_flight.close();
        let idle = tokio::time::timeout(grace, inner.in_flight.wait()).await;
        if idle.is_err() {
            let tokens: Vec<_> = lock(&inner.running).values().cloned().collect();
            tracing::warn!(
                running = tokens.len(),
                "grace period over; stopping running scripts"
            );
            for token in tokens {
                token.cancel();
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), inner.in_flight.wait()).await;
        }
        inner.closed.cancel();
        if let Err(e) = inner.store.close().await {
            tracing::error!(error = %e, "closing storage failed");
        }
    }
}

impl Inner {
    pub(crate) async fn load_workflow(&self, id: WorkflowId) -> Result<Workflow> {
        self.store
            .tasks()
            .get_workflow(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "workflow",
                id: id.to_string(),
            })
    }

    /// Puts unfinished work back in motion after a start.
    async fn recover(&self) -> Result<()> {
        let mut requeued = 0usize;
        for task in self.store.tasks().unfinished_tasks().await? {
            match task.status {
                TaskStatus::Queued => {
                    self.enqueue(&task);
                    requeued += 1;
                }
                TaskStatus::RetryWaiting => {
                    self.enqueue(&task);
                    requeued += 1;
                }
                TaskStatus::Running => {
                    // The previous life of this node died during this
                    // attempt. On a shared store the task may instead be
                    // another live node's: leave those to their lease.
                    let ours = !self.store.nodes().shared()
                        || task.node.as_deref() == Some(self.config.node_id.as_str())
                        || task.lease_until.is_none_or(|until| until < Utc::now());
                    if ours {
                        let error = format!(
                            "interrupted: the service stopped during attempt {}",
                            task.attempts
                        );
                        let stored = self.take_over(task, error).await?;
                        if stored.is_some_and(|t| t.status == TaskStatus::RetryWaiting) {
                            requeued += 1;
                        }
                    }
                }
                _ => {}
            }
        }
        self.advance_unfinished_workflows().await?;
        if requeued > 0 {
            tracing::info!(tasks = requeued, "resumed unfinished tasks");
        }
        Ok(())
    }

    /// Ends an attempt whose runner is gone (this service's previous life,
    /// or a node whose lease ran out): its left-over processes are killed,
    /// never adopted, then the attempt counts as failed (or the task ends
    /// cancelled, if that was asked). Returns the stored task, or `None`
    /// if someone else moved it first.
    pub(crate) async fn take_over(&self, mut task: Task, error: String) -> Result<Option<Task>> {
        let leftovers = orchestrator_executor::kill_leftovers(&task.id.to_string());
        if leftovers > 0 {
            tracing::warn!(task = %task.id, processes = leftovers, "killed a script left running by a stopped service");
        }
        let now = Utc::now();
        if task.cancel_requested {
            task.finish_cancel(now)?;
        } else {
            task.fail(error, None, &self.config.retry, rand::random(), now)?;
        }
        let stored = match self.store.tasks().update_task(&task).await {
            Ok(stored) => stored,
            Err(e) if crate::dispatch::is_conflict(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        tracing::warn!(task = %stored.id, status = %stored.status, "recovered an interrupted attempt");
        match stored.status {
            TaskStatus::RetryWaiting => self.enqueue(&stored),
            _ => self.advance(stored.workflow_id).await?,
        }
        Ok(Some(stored))
    }

    /// Moves every unfinished workflow along: after a start, and now and
    /// then on a shared store, in case the node that should have stopped
    /// half-way.
    pub(crate) async fn advance_unfinished_workflows(&self) -> Result<()> {
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
            for workflow in self.store.tasks().list_workflows(&query).await?.items {
                self.register_limit(&workflow);
                self.advance(workflow.id).await?;
            }
        }
        Ok(())
    }

    pub(crate) fn register_limit(&self, workflow: &Workflow) {
        if let Some(limit) = workflow.parallel_limit {
            lock(&self.slots).entry(workflow.id).or_default().limit = limit;
        }
    }

    /// Puts a queued or retry-waiting task in the ready queue, honouring
    /// its retry time or scheduled start.
    pub(crate) fn enqueue(&self, task: &Task) {
        let due = match task.status {
            TaskStatus::RetryWaiting => task.retry_at,
            _ => task.not_before,
        };
        {
            let mut queue = lock(&self.queue);
            match due {
                Some(due) if due > Utc::now() => queue.push_at(task.id, task.priority, due),
                _ => queue.push(task.id, task.priority),
            }
        }
        self.queue_changed.notify_one();
    }
}
