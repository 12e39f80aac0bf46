//! Dispatch: a free worker takes the next ready task, claims it (stores
//! "running"), runs its script, and stores how the attempt ended.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use orchestrator_core::{Task, TaskId, TaskStatus, WorkflowId, WorkflowStatus};
use orchestrator_executor::{Job, Outcome};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::engine::{Inner, lock};
use crate::{Error, Result};

/// Whether an update lost a compare-and-set race (then re-read and decide again).
pub(crate) fn is_conflict(e: &orchestrator_storage::Error) -> bool {
    matches!(e, orchestrator_storage::Error::Conflict { .. })
}

impl Inner {
    /// Pops the next ready task whenever a worker is free. A worker is
    /// free again as soon as its script exits, so the next claim's durable
    /// write goes out together with the previous outcome's (group commit)
    /// rather than after it.
    pub(crate) async fn dispatch_loop(self: Arc<Self>) {
        loop {
            let worker = tokio::select! {
                permit = self.workers.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                () = self.stopping.cancelled() => return,
            };
            let id = loop {
                let (next, next_due) = {
                    let mut queue = lock(&self.queue);
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
            self.in_flight.spawn(self.clone().run_task(id, worker));
        }
    }

    async fn run_task(self: Arc<Self>, id: TaskId, worker: OwnedSemaphorePermit) {
        if let Err(e) = self.run_attempt(id, worker).await {
            tracing::error!(task = %id, error = %e, "task attempt could not be recorded");
        }
    }

    /// Takes a slot of the task's workflow if it has a `parallel_limit`;
    /// otherwise parks the task until a slot frees up.
    fn take_slot(&self, task: &Task) -> bool {
        let mut slots = lock(&self.slots);
        let Some(slots) = slots.get_mut(&task.workflow_id) else {
            return true;
        };
        if slots.running < slots.limit {
            slots.running += 1;
            true
        } else {
            slots.deferred.push_back((task.id, task.priority));
            false
        }
    }

    fn release_slot(&self, workflow: WorkflowId) {
        let next = {
            let mut slots = lock(&self.slots);
            let Some(slots) = slots.get_mut(&workflow) else {
                return;
            };
            slots.running = slots.running.saturating_sub(1);
            slots.deferred.pop_front()
        };
        if let Some((id, priority)) = next {
            lock(&self.queue).push(id, priority);
            self.queue_changed.notify_one();
        }
    }

    async fn run_attempt(&self, id: TaskId, worker: OwnedSemaphorePermit) -> Result<()> {
        let Some(task) = self.store.tasks().get_task(id).await? else {
            return Ok(());
        };
        if !matches!(task.status, TaskStatus::Queued | TaskStatus::RetryWaiting) {
            // Cancelled (or otherwise moved on) while it sat in the queue.
            return Ok(());
        }
        if !self.take_slot(&task) {
            return Ok(());
        }
        let workflow = task.workflow_id;
        let token = CancellationToken::new();
        lock(&self.running).insert(id, token.clone());
        let attempt = self.claim_and_execute(task, token, worker).await;
        lock(&self.running).remove(&id);
        let result = match attempt {
            Ok(Some((task, outcome))) => self.record_outcome(task, outcome).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        self.release_slot(workflow);
        result
    }

    /// What a script said, with every secret value taken out before it is
    /// stored or shown.
    fn redact(&self, outcome: Outcome) -> Outcome {
        let text = |error: String| self.secrets.redact_text(&error);
        match outcome {
            Outcome::Succeeded { output } => Outcome::Succeeded {
                output: self.secrets.redact_value(output),
            },
            Outcome::Failed { exit_code, error } => Outcome::Failed {
                exit_code,
                error: text(error),
            },
            Outcome::TimedOut { error } => Outcome::TimedOut { error: text(error) },
            Outcome::Cancelled => Outcome::Cancelled,
        }
    }

    /// Persists "running" (the claim), then runs the script. The worker is
    /// given back as soon as the script exits: storing the outcome and
    /// advancing the workflow happen outside it, so the next script starts
    /// without waiting for those writes.
    async fn claim_and_execute(
        &self,
        task: Task,
        token: CancellationToken,
        worker: OwnedSemaphorePermit,
    ) -> Result<Option<(Task, Outcome)>> {
        let mut claim = task;
        let now = Utc::now();
        claim.start(now)?;
        claim.node = Some(self.config.node_id.clone());
        claim.lease_until =
            Some(now + chrono::Duration::from_std(self.config.lease).unwrap_or_default());
        let task = match self.store.tasks().update_task(&claim).await {
            Ok(task) => task,
            Err(e) if is_conflict(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        // The claim is what makes a crash recoverable; the workflow's
        // "running" is bookkeeping, so its write goes out alongside the
        // script instead of delaying it.
        let (marked, outcome) = tokio::join!(
            self.mark_workflow_running(task.workflow_id),
            self.execute(&task, token, worker)
        );
        if let Err(e) = marked {
            tracing::warn!(workflow = %task.workflow_id, error = %e, "could not mark the workflow running");
        }
        Ok(Some((task, outcome)))
    }

    /// Runs the claimed attempt's script and gives the worker back as soon
    /// as it exits.
    async fn execute(
        &self,
        task: &Task,
        token: CancellationToken,
        worker: OwnedSemaphorePermit,
    ) -> Outcome {
        tracing::debug!(task = %task.id, attempt = task.attempts, script = %task.script, "attempt started");
        metrics::counter!("orchestrator_task_attempts_total", "script" => task.script.clone())
            .increment(1);
        // Secrets go into the script's input here, and nowhere else.
        let input = match self.secrets.resolve(&task.input).await {
            Ok(input) => input,
            Err(error) => {
                return Outcome::Failed {
                    exit_code: None,
                    error,
                };
            }
        };
        let (logs, mut log_lines) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        let store = self.store.clone();
        let task_id = task.id;
        let secrets = self.secrets.clone();
        let log_pump = tokio::spawn(async move {
            while let Some(chunk) = log_lines.recv().await {
                let chunk = secrets.redact_bytes(&chunk);
                if let Err(e) = store.tasks().append_log(task_id, &chunk).await {
                    tracing::warn!(task = %task_id, error = %e, "log append failed");
                }
            }
        });
        let job = Job {
            script: &task.script,
            input: &input,
            task_id: task.id.to_string(),
            workflow_id: task.workflow_id.to_string(),
            attempt: task.attempts,
            check_mode: task.check_mode,
            timeout: task.timeout(),
            checkpoint: &task.checkpoint,
            token: Some(self.access.task_token(task.id)),
        };
        let outcome = self.executor.run(job, logs, token).await;
        drop(worker);
        let outcome = self.redact(outcome);
        // The log is complete before the final state is stored.
        let _ = log_pump.await;
        outcome
    }

    /// A workflow's first claim moves it to running.
    async fn mark_workflow_running(&self, id: WorkflowId) -> Result<()> {
        // Known running: skip re-reading the workflow on every claim.
        if lock(&self.running_workflows).contains(&id) {
            return Ok(());
        }
        loop {
            let mut workflow = self.load_workflow(id).await?;
            if !matches!(
                workflow.status,
                WorkflowStatus::Queued | WorkflowStatus::Scheduled
            ) {
                return Ok(());
            }
            let now = Utc::now();
            workflow.status = WorkflowStatus::Running;
            workflow.started_at.get_or_insert(now);
            workflow.updated_at = now;
            match self.store.tasks().update_workflow(&workflow, &[]).await {
                Ok(_) => {
                    lock(&self.running_workflows).insert(id);
                    return Ok(());
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Stores how the attempt ended, re-reading the task on conflicts (a
    /// cancel request may have landed while the script ran).
    async fn record_outcome(&self, claimed: Task, outcome: Outcome) -> Result<()> {
        let id = claimed.id;
        loop {
            let mut task = self.load_task(id).await?;
            // Only the attempt this node claimed may be ended by it: if its
            // lease ran out and another node took the task over, this
            // outcome is stale and must not land on the newer attempt.
            if task.status != TaskStatus::Running
                || task.attempts != claimed.attempts
                || task.node != claimed.node
            {
                tracing::warn!(
                    task = %id, attempt = claimed.attempts,
                    "the attempt ended after another node took the task over; its outcome is discarded"
                );
                return Ok(());
            }
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
            let stored = match self.store.tasks().update_task(&task).await {
                Ok(stored) => stored,
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
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
            match stored.status {
                // Interrupted by shutdown: back in the queue for the next start.
                TaskStatus::RetryWaiting | TaskStatus::Queued => self.enqueue(&stored),
                _ => self.advance_soon(stored.workflow_id).await?,
            }
            return Ok(());
        }
    }

    pub(crate) async fn load_task(&self, id: TaskId) -> Result<Task> {
        self.store
            .tasks()
            .get_task(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "task",
                id: id.to_string(),
            })
    }

    /// Merges entries into a running task's checkpoint; returns once durable.
    pub(crate) async fn save_checkpoint(
        &self,
        id: TaskId,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Task> {
        loop {
            let mut task = self.load_task(id).await?;
            task.save_checkpoint(entries.clone(), Utc::now())?;
            match self.store.tasks().update_task(&task).await {
                Ok(stored) => return Ok(stored),
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub(crate) async fn cancel_task(&self, id: TaskId) -> Result<Task> {
        loop {
            let mut task = self.load_task(id).await?;
            let immediate = task
                .request_cancel(Utc::now())
                .map_err(|e| Error::Conflict(e.to_string()))?;
            match self.store.tasks().update_task(&task).await {
                Ok(stored) => {
                    if immediate {
                        self.advance(stored.workflow_id).await?;
                    } else if let Some(token) = lock(&self.running).get(&id) {
                        token.cancel();
                    }
                    tracing::info!(task = %id, immediate, "task cancel requested");
                    return Ok(stored);
                }
                Err(e) if is_conflict(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}
