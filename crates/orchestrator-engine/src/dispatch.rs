//! Dispatch: a free worker takes the next ready task, claims it (stores
//! "running"), runs its step through the runner of its kind, and hands
//! the outcome to the lifecycle.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::FutureExt as _;
use orchestrator_core::event::{Change, TaskMark};
use orchestrator_core::{Priority, Task, TaskId, TaskStatus, WorkflowId};
use orchestrator_executor::{Attempt, CheckpointSink, LogSink, Outcome, Redactor, StreamRedactor};
use serde_json::{Map, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::Result;
use crate::access::Access;
use crate::attempts::{Attempts, StopTokens};
use crate::lifecycle::Lifecycle;
use crate::locks::{LOCK_RETRY, Locks};
use crate::queue::Queue;
use crate::records::Records;
use crate::secrets::Secrets;
use crate::steps::Steps;

/// Rounds of count-then-claim for a task of a limited workflow on a shared
/// store, before it goes back to the queue.
const LIMITED_CLAIM_ATTEMPTS: usize = 5;
/// How long a task of a workflow at its limit on other nodes waits before
/// it is tried again.
const LIMITED_CLAIM_RETRY: Duration = Duration::from_millis(200);

/// How long a task whose claim could not be stored waits before it is
/// tried again: storage that just failed is given a moment.
const CLAIM_RETRY: Duration = Duration::from_secs(1);

/// How many chunks (lines, or pieces of long ones) of a step's output may
/// wait to be stored; past that, the step waits (a script at its pipe).
const LOG_CHUNKS_IN_FLIGHT: usize = 256;
/// The most chunks stored in one write: what arrived while the previous
/// write was on its way goes out together, one transaction.
const LOG_CHUNKS_PER_WRITE: usize = 256;

/// Stores a step's output as it comes, redacted, many chunks per write,
/// until the step's side of the channel is gone.
async fn store_log(
    records: Arc<Records>,
    mut redactor: StreamRedactor,
    (task, workflow): (TaskId, WorkflowId),
    mut chunks: tokio::sync::mpsc::Receiver<Vec<u8>>,
) {
    let append = |bytes: Vec<u8>| {
        let records = records.clone();
        async move {
            if bytes.is_empty() {
                return;
            }
            if let Err(e) = records.append_log(task, workflow, &bytes).await {
                tracing::warn!(task = %task, error = %e, "log append failed");
            }
        }
    };
    let mut batch = Vec::with_capacity(LOG_CHUNKS_PER_WRITE);
    while chunks.recv_many(&mut batch, LOG_CHUNKS_PER_WRITE).await > 0 {
        let bytes: Vec<u8> = batch.drain(..).flatten().collect();
        append(redactor.push(&bytes)).await;
    }
    append(redactor.finish()).await;
}

/// The workers of one node.
pub(crate) struct Dispatcher {
    records: Arc<Records>,
    queue: Arc<Queue>,
    attempts: Arc<Attempts>,
    lifecycle: Arc<Lifecycle>,
    steps: Steps,
    secrets: Arc<Secrets>,
    access: Arc<Access>,
    node_id: String,
    lease: Duration,
    locks: Arc<Locks>,
    /// The one party of every attempt when auth is off (`Dispatcher::party`),
    /// made once rather than per attempt.
    anyone: Arc<str>,
    /// One permit per worker; a step runs while it holds one.
    workers: Arc<Semaphore>,
    /// Every attempt from its claim until its outcome is stored and its
    /// workflow advanced; shutdown waits for them.
    in_flight: TaskTracker,
}

/// What a dispatcher needs.
pub(crate) struct DispatcherParts {
    pub(crate) records: Arc<Records>,
    pub(crate) queue: Arc<Queue>,
    pub(crate) attempts: Arc<Attempts>,
    pub(crate) lifecycle: Arc<Lifecycle>,
    pub(crate) steps: Steps,
    pub(crate) secrets: Arc<Secrets>,
    pub(crate) access: Arc<Access>,
    pub(crate) node_id: String,
    pub(crate) lease: Duration,
    pub(crate) workers: usize,
    pub(crate) locks: Arc<Locks>,
}

impl Dispatcher {
    pub(crate) fn new(parts: DispatcherParts) -> Dispatcher {
        Dispatcher {
            records: parts.records,
            queue: parts.queue,
            attempts: parts.attempts,
            lifecycle: parts.lifecycle,
            steps: parts.steps,
            secrets: parts.secrets,
            access: parts.access,
            node_id: parts.node_id,
            lease: parts.lease,
            locks: parts.locks,
            anyone: Arc::from(crate::access::LOCAL_ACTOR),
            workers: Arc::new(Semaphore::new(parts.workers.max(1))),
            in_flight: TaskTracker::new(),
        }
    }

    /// Pops the next ready task whenever a worker is free, until `stopping`.
    /// A worker is free again as soon as its step ends, so the next claim's
    /// durable write goes out together with the previous outcome's (group
    /// commit) rather than after it.
    pub(crate) async fn run(self: Arc<Self>, stopping: CancellationToken) {
        loop {
            let worker = tokio::select! {
                permit = self.workers.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                () = stopping.cancelled() => return,
            };
            let id = loop {
                let sleep_for = match self.queue.pop(Utc::now()) {
                    Ok(id) => break id,
                    Err(sleep_for) => sleep_for,
                };
                tokio::select! {
                    () = self.queue.changed() => {}
                    () = tokio::time::sleep(sleep_for) => {}
                    () = stopping.cancelled() => return,
                }
            };
            self.in_flight.spawn(self.clone().run_task(id, worker));
        }
    }

    /// Waits up to `grace` for the attempts in flight; then stops their
    /// steps (they go back to the queue, uncounted) and waits for that.
    pub(crate) async fn drain(&self, grace: Duration) {
        self.in_flight.close();
        if tokio::time::timeout(grace, self.in_flight.wait())
            .await
            .is_err()
        {
            let running = self.attempts.snapshot();
            tracing::warn!(
                running = running.len(),
                "grace period over; stopping running scripts"
            );
            for (_, tokens) in running {
                // The tasks go on (back to the queue): only their steps stop.
                tokens.stop_attempt();
            }
            let _ = tokio::time::timeout(Duration::from_secs(30), self.in_flight.wait()).await;
        }
    }

    async fn run_task(self: Arc<Self>, id: TaskId, worker: OwnedSemaphorePermit) {
        if let Err(e) = self.run_attempt(id, worker).await {
            tracing::error!(task = %id, error = %e, "task attempt could not be recorded");
        }
    }

    async fn run_attempt(&self, id: TaskId, worker: OwnedSemaphorePermit) -> Result<()> {
        if self.attempts.contains(id) {
            // Queued twice; the attempt under way is the one.
            return Ok(());
        }
        let (task, guessed) = match self.still_ready(id).await {
            Ok(Some(ready)) => ready,
            Ok(None) => return Ok(()),
            Err(e) => {
                // Nothing else would offer the task again before a restart
                // (on a store of one node): it goes back to the queue.
                self.queue.retry_later(id, Priority::Normal, CLAIM_RETRY);
                return Err(e);
            }
        };
        if self.queue.park_if_paused(&task) {
            // Its workflow is paused: it stays queued, held aside here
            // until the workflow is resumed.
            return Ok(());
        }
        // Its locks first: a task that must wait goes back to the queue,
        // and its worker is free again when this returns.
        let lock_tokens = match self.locks.acquire(&task).await {
            Ok(Some(tokens)) => tokens,
            Ok(None) => {
                self.queue.push_after(&task, LOCK_RETRY);
                return Ok(());
            }
            Err(e) => {
                self.queue.push_after(&task, CLAIM_RETRY);
                return Err(e);
            }
        };
        let lock_names: Vec<String> = task.step.locks.iter().map(|c| c.name.clone()).collect();
        let Some(tokens) = self.attempts.begin(id) else {
            return Ok(());
        };
        if !self.queue.take_slot(&task) {
            self.attempts.end(id);
            return Ok(());
        }
        let workflow = task.workflow_id;
        let (retry_id, priority) = (task.id, task.priority);
        let attempt = self
            .claim_and_run(task, tokens, worker, lock_tokens, guessed)
            .await;
        self.attempts.end(id);
        let result = match attempt {
            Ok(Some((task, outcome))) => {
                let finished = self.lifecycle.finish_attempt(task, outcome).await;
                // Stored first: a lock is let go only once the step's end is.
                if let Err(e) = self.locks.release_unneeded(workflow, &lock_names).await {
                    tracing::warn!(workflow = %workflow, error = %e, "could not release locks; the sweep will");
                }
                finished
            }
            Ok(None) => Ok(()),
            Err(e) => {
                // The claim could not be stored: the task is still queued
                // there (or, if the write landed after all, running under a
                // lease that nothing renews, which the lease check takes
                // over). Either way it is tried again, not stranded.
                self.queue.retry_later(retry_id, priority, CLAIM_RETRY);
                Err(e)
            }
        };
        self.queue.release_slot(workflow);
        result
    }

    /// The popped task as stored now, if it may still be claimed, with its
    /// workflow's `parallel_limit` (or that it has none) known here: read
    /// once per workflow that reached this node only as tasks from the
    /// change feed. The record kept when it was queued stands in for the
    /// read (then `true`: a guess, which the claim's compare-and-set
    /// checks), unless the task needs locks: those are taken before the
    /// claim, and a task cancelled meanwhile must not take them.
    async fn still_ready(&self, id: TaskId) -> Result<Option<(Task, bool)>> {
        if let Some(task) = self.queue.take_record(id)
            && matches!(task.status, TaskStatus::Queued | TaskStatus::RetryWaiting)
            && task.step.locks.is_empty()
            && self.queue.knows_limit(task.workflow_id)
        {
            return Ok(Some((task, true)));
        }
        let store = self.records.store().tasks();
        let Some(task) = store.get_task(id).await? else {
            return Ok(None);
        };
        if !matches!(task.status, TaskStatus::Queued | TaskStatus::RetryWaiting) {
            // Cancelled (or otherwise moved on) while it sat in the queue.
            return Ok(None);
        }
        if !self.queue.knows_limit(task.workflow_id)
            && let Some(workflow) = store.get_workflow(task.workflow_id).await?
        {
            self.queue.register_limit(&workflow);
        }
        Ok(Some((task, false)))
    }

    /// Stores "running" (the claim), then runs the step. The worker is
    /// given back as soon as the step ends: storing the outcome and
    /// advancing the workflow happen outside it, so the next step starts
    /// without waiting for those writes.
    async fn claim_and_run(
        &self,
        task: Task,
        tokens: StopTokens,
        worker: OwnedSemaphorePermit,
        lock_tokens: orchestrator_core::lock::Tokens,
        guessed: bool,
    ) -> Result<Option<(Task, Outcome)>> {
        let before = TaskMark::of(&task);
        let (id, priority) = (task.id, task.priority);
        let mut claim = task;
        let now = Utc::now();
        claim.start(now)?;
        claim.node = Some(self.node_id.clone());
        claim.lease_until = Some(now + chrono::Duration::from_std(self.lease).unwrap_or_default());
        let limit = self.queue.limit_of(claim.workflow_id);
        let claimed = match limit {
            // On a shared store the limit holds across nodes: see
            // `claim_within_limit`.
            Some(limit) if self.records.store().nodes().shared() => {
                self.claim_within_limit(&claim, before, limit).await
            }
            _ => self.records.update_task(&claim, before).await.map(Some),
        };
        let task = match claimed {
            Ok(Some(task)) => task,
            Ok(None) => return Ok(None),
            // Another node claimed it, or it was cancelled or changed
            // since the record this claim started from. A guessed record
            // may just be old: the task is read when popped again.
            Err(e) if e.is_conflict() => {
                if guessed {
                    self.queue.retry_later(id, priority, Duration::ZERO);
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        self.attempts.claimed(task.id, task.attempts);
        // The claim is what makes a crash recoverable; the workflow's
        // "running" is bookkeeping, so its write goes out alongside the
        // step instead of delaying it.
        let (marked, outcome) = tokio::join!(
            self.lifecycle.mark_workflow_running(task.workflow_id),
            self.run_step(&task, tokens, worker, &lock_tokens)
        );
        if let Err(e) = marked {
            tracing::warn!(workflow = %task.workflow_id, error = %e, "could not mark the workflow running");
        }
        Ok(Some((task, outcome)))
    }

    /// Claims a task of a workflow with a `parallel_limit` on a store that
    /// several nodes share. Each node counts only the slots it holds, so
    /// the count that matters is the store's: the workflow's running tasks.
    /// The claim is written together with the workflow record (its version
    /// bumped) in one compare-and-set, so two nodes that counted the same
    /// free slot cannot both take it: one write wins, the other finds the
    /// workflow changed, and counts again. At the limit the task goes back
    /// to the queue for a little while: the slot will be freed on another
    /// node, and nothing here would wake it.
    async fn claim_within_limit(
        &self,
        claim: &Task,
        before: TaskMark,
        limit: usize,
    ) -> Result<Option<Task>> {
        let store = self.records.store().tasks();
        for _ in 0..LIMITED_CLAIM_ATTEMPTS {
            let Some(workflow) = store.get_workflow(claim.workflow_id).await? else {
                return Ok(None);
            };
            let running = store
                .list_tasks(&orchestrator_storage::TaskQuery {
                    workflow: Some(claim.workflow_id),
                    status: Some(TaskStatus::Running),
                    limit: 0,
                    ..orchestrator_storage::TaskQuery::default()
                })
                .await?
                .total;
            if running >= limit {
                self.queue.push_after(claim, LIMITED_CLAIM_RETRY);
                return Ok(None);
            }
            // Stamped now, after the count: the claim's start is never
            // earlier than the end it waited for.
            let mut claim = claim.clone();
            let now = Utc::now();
            claim.started_at = Some(now);
            claim.lease_until =
                Some(now + chrono::Duration::from_std(self.lease).unwrap_or_default());
            match self
                .records
                .update_workflow_and_tasks(&workflow, workflow.status, &[(claim, before)])
                .await
            {
                Ok((_, mut tasks)) => return Ok(tasks.pop()),
                // The workflow moved on (another node's claim, a change of
                // its own): count again.
                Err(crate::Error::Storage(orchestrator_storage::Error::Conflict {
                    what: "workflow",
                    ..
                })) => {}
                Err(e) => return Err(e),
            }
        }
        // Much contention: try again shortly, as at the limit.
        self.queue.push_after(claim, LIMITED_CLAIM_RETRY);
        Ok(None)
    }

    /// Runs the claimed attempt's step and gives the worker back as soon
    /// as it ends. Its log is stored, redacted, before this returns.
    async fn run_step(
        &self,
        task: &Task,
        tokens: StopTokens,
        worker: OwnedSemaphorePermit,
        lock_tokens: &orchestrator_core::lock::Tokens,
    ) -> Outcome {
        tracing::debug!(task = %task.id, attempt = task.attempts, script = %task.script, "attempt started");
        metrics::counter!("orchestrator_task_attempts_total", "script" => task.script.clone())
            .increment(1);
        let runner = match self.steps.runner(task.step.kind) {
            Ok(runner) => runner.clone(),
            Err(error) => {
                return Outcome::Failed {
                    exit_code: None,
                    error,
                };
            }
        };
        // Secrets go into the step's input here, and nowhere else; their
        // scope is checked again, as the input may have gained a reference
        // since the submission (from a step's output).
        let holds_secrets = match self.check_secret_use(task).await {
            Ok(holds_secrets) => holds_secrets,
            Err(error) => {
                return Outcome::Failed {
                    exit_code: None,
                    error,
                };
            }
        };
        // Fencing tokens go in before secrets, into a copy only where the
        // task holds locks.
        let with_tokens;
        let input = if lock_tokens.is_empty() {
            &task.input
        } else {
            match orchestrator_core::lock::put_tokens(&task.input, lock_tokens) {
                Ok(input) => {
                    with_tokens = input;
                    &with_tokens
                }
                Err(error) => {
                    return Outcome::Failed {
                        exit_code: None,
                        error,
                    };
                }
            }
        };
        let input = match self.secrets.resolve(input).await {
            Ok(input) => input,
            Err(error) => {
                return Outcome::Failed {
                    exit_code: None,
                    error,
                };
            }
        };
        // The secrets as they are now, for the whole attempt: the step
        // redacts with it before it cuts anything, the log and the outcome
        // are redacted with it again on their way to the store.
        let redactor = self.secrets.redactor();
        let (logs, log_chunks) = LogSink::channel(LOG_CHUNKS_IN_FLIGHT);
        let log_pump = tokio::spawn(store_log(
            self.records.clone(),
            StreamRedactor::new(redactor.clone()),
            (task.id, task.workflow_id),
            log_chunks,
        ));
        let checkpoints = ClaimedCheckpoint {
            lifecycle: self.lifecycle.clone(),
            claim: task,
            redactor: redactor.clone(),
        };
        let attempt = Attempt {
            task_id: task.id.to_string(),
            workflow_id: task.workflow_id.to_string(),
            attempt: task.attempts,
            target: &task.script,
            input: &input,
            holds_secrets,
            more_steps: !self.queue.has_one_step(task.workflow_id),
            party: self.party(task.workflow_id),
            checkpoint: &task.checkpoint,
            checkpoints: &checkpoints,
            check_mode: task.check_mode,
            cancel: tokens.attempt,
            task_cancel: tokens.task,
            timeout: task.timeout(),
            // Checked: a stored timeout is bounded when submitted, but an
            // older record may not be, and an overflow here would panic.
            deadline: deadline_after(task.timeout()),
            log: logs,
            redactor: redactor.clone(),
            token: Some(self.access.task_token(task.id)),
            lock_tokens: task
                .step
                .locks
                .iter()
                .filter_map(|c| {
                    let token = lock_tokens.get(&c.key)?;
                    Some((orchestrator_core::lock::env_var(&c.key), *token))
                })
                .collect(),
        };
        self.records.announce(Change::started(task));
        // A step that panics fails its attempt, with the panic's message:
        // uncaught, it would end this worker's future with the task left
        // `running` and its lease renewed for ever.
        let outcome = AssertUnwindSafe(runner.run(attempt))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                let error = format!("the step panicked: {}", panic_message(panic.as_ref()));
                tracing::error!(task = %task.id, %error, "step panicked");
                Outcome::Failed {
                    exit_code: None,
                    error,
                }
            });
        drop(worker);
        let outcome = redact(&redactor, outcome);
        // The log is complete before the final state is stored.
        let _ = log_pump.await;
        outcome
    }
}

impl Dispatcher {
    /// Who submitted the workflow, as far as sharing what a step kind
    /// keeps goes (`Attempt::party`): its token; without auth every
    /// caller is the same one, whatever token its workflow came with.
    fn party(&self, workflow: WorkflowId) -> Option<Arc<str>> {
        if self.access.config().auth {
            self.queue.submitted_by(workflow)
        } else {
            Some(self.anyone.clone())
        }
    }

    /// Whether the task's workflow may use the secrets its input names;
    /// if so, whether it names any (the step then receives a secret).
    async fn check_secret_use(&self, task: &Task) -> std::result::Result<bool, String> {
        let names = crate::secrets::secrets_named(&task.input);
        if names.is_empty() {
            return Ok(false);
        }
        let workflow = self
            .lifecycle
            .load_workflow(task.workflow_id)
            .await
            .map_err(|e| format!("cannot check the scope of secrets: {e}"))?;
        let user = crate::secrets::secret_user_of(&workflow);
        self.secrets
            .check_use(user, &names)
            .await
            .map(|()| true)
            .map_err(|e| e.to_string())
    }
}

/// What a step said, with every secret value taken out before it is
/// stored or shown.
fn redact(redactor: &Redactor, outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Succeeded { output } => Outcome::Succeeded {
            output: redactor.value(output),
        },
        Outcome::Failed { exit_code, error } => Outcome::Failed {
            exit_code,
            error: redactor.text(&error),
        },
        Outcome::TimedOut { error } => Outcome::TimedOut {
            error: redactor.text(&error),
        },
        Outcome::Cancelled => Outcome::Cancelled,
    }
}

/// When an attempt of `timeout` started now must end; far in the future
/// (a year) where the clock can not add it.
fn deadline_after(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

/// What a panic said: its `&str` or `String` payload, as `panic!` makes them.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// The checkpoint of one claimed attempt, as its step saves it: through
/// the lifecycle, and only while the task still holds this attempt.
struct ClaimedCheckpoint<'a> {
    lifecycle: Arc<Lifecycle>,
    /// The task as the claim stored it: its attempt number and node.
    claim: &'a Task,
    redactor: Arc<Redactor>,
}

#[async_trait::async_trait]
impl CheckpointSink for ClaimedCheckpoint<'_> {
    async fn save(&self, entries: Map<String, Value>) -> std::result::Result<(), String> {
        let entries = crate::secrets::redacted_entries(&self.redactor, entries);
        self.lifecycle
            .save_attempt_checkpoint(self.claim, entries)
            .await
            .map(|_| ())
            .map_err(|e| format!("cannot save the checkpoint: {e}"))
    }
}
