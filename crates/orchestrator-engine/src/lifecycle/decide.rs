//! The lifecycle's decisions, apart from its I/O: what an attempt's end,
//! an interruption, a round of the core's `Decision`s, a cancel or a
//! workflow retry makes of the records as read. Plain functions of those
//! records, `now` and a random sample, with no store, clock or queue: the
//! lifecycle reads, calls these, and writes what they return (a lost race
//! only means reading and deciding again).

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use orchestrator_core::event::TaskMark;
use orchestrator_core::release::{evaluate_condition, resolve_input};
use orchestrator_core::{
    ConditionOutcome, Decision, Halt, RetryPolicy, StepSettings, Task, TaskId, TaskSpec,
    TaskStatus, Workflow, WorkflowStatus,
};
use orchestrator_executor::Outcome;
use serde_json::json;

use crate::{Error, Result};

/// Whether `task`, as stored now, is still running the attempt this node
/// claimed (`claimed`, as the claim stored it).
pub(super) fn holds(task: &Task, claimed: &Task) -> bool {
    task.status == TaskStatus::Running
        && task.attempts == claimed.attempts
        && task.node == claimed.node
}

/// At a start, whether the running `task` is this node's to take over:
/// always on a store of its own (its previous life died during the
/// attempt); on a shared store only if this node ran it or its lease ran
/// out, since another live node may be running it.
pub(super) fn is_orphaned(task: &Task, shared: bool, node_id: &str, now: DateTime<Utc>) -> bool {
    !shared
        || task.node.as_deref() == Some(node_id)
        || task.lease_until.is_none_or(|until| until < now)
}

/// The error an attempt gets when this service's previous life stopped
/// during it.
pub(super) fn stopped_during(attempt: u32) -> String {
    format!("interrupted: the service stopped during attempt {attempt}")
}

/// Ends the running `task`'s attempt as `outcome` says. A cancelled step
/// that nobody asked to cancel was stopped by a shutdown: it goes back to
/// the queue without using up an attempt. `jitter` is a sample in
/// `[0, 1)` for the retry's backoff.
pub(super) fn end_attempt(
    task: &mut Task,
    outcome: &Outcome,
    retry: &RetryPolicy,
    jitter: f64,
    now: DateTime<Utc>,
) -> Result<()> {
    match outcome {
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
            task.fail(error.clone(), None, retry, jitter, now)?;
        }
        Outcome::Failed { exit_code, error } => {
            task.fail(error.clone(), *exit_code, retry, jitter, now)?;
        }
    }
    Ok(())
}

/// Ends the running `task`'s attempt whose runner is gone (a crash, a
/// node whose lease ran out): cancelled if that was asked, else failed as
/// interrupted, which does not use up the task's attempts (up to the
/// core's cap).
pub(super) fn end_orphaned(
    task: &mut Task,
    error: String,
    retry: &RetryPolicy,
    jitter: f64,
    now: DateTime<Utc>,
) -> Result<()> {
    if task.cancel_requested {
        task.finish_cancel(now)?;
    } else {
        task.fail_interrupted(error, retry, jitter, now)?;
    }
    Ok(())
}

/// What follows a task's end once it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterEnd {
    /// It runs again (a retry, or an attempt a shutdown interrupted):
    /// back in the queue.
    Queue,
    /// It ended: its workflow moves on.
    FollowUp,
}

pub(super) fn after_end(status: TaskStatus) -> AfterEnd {
    if waits_in_queue(status) {
        AfterEnd::Queue
    } else {
        AfterEnd::FollowUp
    }
}

/// Whether a task stored with `status` belongs in the queue: it waits to
/// be claimed, now or at its retry time.
pub(super) fn waits_in_queue(status: TaskStatus) -> bool {
    matches!(status, TaskStatus::Queued | TaskStatus::RetryWaiting)
}

/// Whether a workflow whose follow-up failed with `error` stays noted as
/// stalled, to be read again at the next look: unless it is gone (deleted
/// by retention, or a submission whose write did not land after all).
pub(super) fn stays_stalled(error: &Error) -> bool {
    !matches!(error, Error::NotFound { .. })
}

/// Resolves `task`'s input and releases it (not before the workflow's
/// start time), or fails it as unrunnable if its input cannot be resolved.
/// `by_id` holds (at least) its dependencies.
pub(super) fn release(
    workflow: &Workflow,
    task: &mut Task,
    by_id: &HashMap<TaskId, &Task>,
    now: DateTime<Utc>,
) -> Result<()> {
    // Its `when:` first: false skips it, an error fails it, and either is
    // stored before anything follows from it.
    match evaluate_condition(workflow, task, by_id) {
        None => {}
        Some(Ok(value)) => {
            let expression = task.step.when.clone().unwrap_or_default();
            if !value {
                return Ok(task.skip_by_condition(expression, now)?);
            }
            task.condition = Some(Box::new(ConditionOutcome { expression, value }));
        }
        Some(Err(error)) => return Ok(task.fail_unrunnable(error, now)?),
    }
    match resolve_input(workflow, task, by_id) {
        // An approval gate is never queued: it opens and waits for its
        // decisions (`approvals`).
        Ok(input) if task.approval.is_some() => {
            match orchestrator_core::approval::ApprovalPolicy::parse(&input)
                .and_then(|p| p.timeout_duration().map_err(|m| ("timeout".to_owned(), m)))
            {
                Ok(timeout) => {
                    task.input = input;
                    task.open_gate(timeout, now);
                }
                Err((at, message)) => {
                    task.fail_unrunnable(format!("approval.{at}: {message}"), now)?
                }
            }
        }
        Ok(input) => {
            task.input = input;
            task.not_before = workflow.start_at.filter(|at| *at > now);
            task.release(now)?;
        }
        Err(error) => task.fail_unrunnable(error, now)?,
    }
    Ok(())
}

/// A round of the core's decisions about a workflow, made into records to
/// write: the task changes up to the first decision about the workflow
/// itself, and that one. The round stops there, since the workflow's
/// write changes what the next round reads.
#[derive(Debug)]
pub(super) struct Round {
    /// Tasks released, skipped or abandoned, each with its mark as read.
    /// Independent of each other: they can be written together.
    pub(super) tasks: Vec<(Task, TaskMark)>,
    pub(super) workflow: Option<WorkflowChange>,
}

/// A change of the workflow record a round makes, to be written before
/// the round's task changes.
#[derive(Debug)]
pub(super) enum WorkflowChange {
    /// A failure halted it: new steps do not start. Its status stays.
    Halt(Workflow),
    /// Its rollback starts: the rollback tasks, chained in the order to
    /// undo, created in the same write that marks the rollback as started.
    Rollback {
        workflow: Workflow,
        before: WorkflowStatus,
        tasks: Vec<Task>,
    },
    /// Every task ended: it finishes with its new status.
    Finish {
        workflow: Workflow,
        before: WorkflowStatus,
    },
}

/// Makes `decisions` (the core's `decide` on `workflow` and its tasks
/// `by_id`) into a [`Round`].
pub(super) fn round(
    workflow: &Workflow,
    decisions: Vec<Decision>,
    by_id: &HashMap<TaskId, &Task>,
    now: DateTime<Utc>,
) -> Result<Round> {
    let mut tasks = Vec::new();
    for decision in decisions {
        let change = match decision {
            Decision::Release(id) => {
                tasks.push(changed(by_id, id, |t| release(workflow, t, by_id, now))?);
                continue;
            }
            Decision::Skip(id, reason) => {
                tasks.push(changed(by_id, id, |t| Ok(t.skip(reason, now)?))?);
                continue;
            }
            Decision::Abandon(id, reason) => {
                tasks.push(changed(by_id, id, |t| Ok(t.abandon(reason, now)?))?);
                continue;
            }
            Decision::Halt(halt) => halted(workflow, halt, now),
            Decision::Rollback(undo) => rollback(workflow, &undo, by_id, now),
            Decision::Finish(status) => finished(workflow, status, now),
        };
        return Ok(Round {
            tasks,
            workflow: Some(change),
        });
    }
    Ok(Round {
        tasks,
        workflow: None,
    })
}

/// Task `id` of `by_id` changed by `change`, with its mark as read.
fn changed(
    by_id: &HashMap<TaskId, &Task>,
    id: TaskId,
    change: impl FnOnce(&mut Task) -> Result<()>,
) -> Result<(Task, TaskMark)> {
    let mut task = by_id[&id].clone();
    let before = TaskMark::of(&task);
    change(&mut task)?;
    Ok((task, before))
}

fn halted(workflow: &Workflow, halt: Halt, now: DateTime<Utc>) -> WorkflowChange {
    let mut workflow = workflow.clone();
    workflow.halt = Some(halt);
    workflow.updated_at = now;
    WorkflowChange::Halt(workflow)
}

fn finished(workflow: &Workflow, status: WorkflowStatus, now: DateTime<Utc>) -> WorkflowChange {
    let before = workflow.status;
    let mut workflow = workflow.clone();
    workflow.status = status;
    // A finished workflow is no longer paused: nothing of it is left to hold.
    workflow.resume(now);
    workflow.finished_at = Some(now);
    workflow.updated_at = now;
    WorkflowChange::Finish { workflow, before }
}

/// One rollback task per step in `undo` that has an undo script, each
/// depending on the one before.
fn rollback(
    workflow: &Workflow,
    undo: &[TaskId],
    by_id: &HashMap<TaskId, &Task>,
    now: DateTime<Utc>,
) -> WorkflowChange {
    let mut tasks: Vec<Task> = Vec::with_capacity(undo.len());
    for id in undo {
        let done = by_id[id];
        let Some(script) = done.step.rollback.clone() else {
            continue;
        };
        let spec = TaskSpec {
            name: format!("rollback {}", done.name),
            script,
            // The undo script sees what the step was given and what it made.
            input: json!({"step": done.step.ref_name, "each": done.step.each, "input": done.input, "output": done.output}),
            priority: done.priority,
            max_attempts: done.max_attempts,
            timeout: done.timeout(),
            check_mode: done.check_mode,
            depends_on: tasks.last().map(|t| vec![t.id]).unwrap_or_default(),
            step: StepSettings {
                ref_name: done.step.ref_name.clone(),
                rollback_of: Some(done.id),
                // The undo touches what the step touched: under its locks.
                locks: done.step.locks.clone(),
                ..Default::default()
            },
        };
        tasks.push(Task::new(workflow.id, spec, now));
    }
    let before = workflow.status;
    let mut workflow = workflow.clone();
    if let Some(halt) = workflow.halt.as_mut() {
        halt.rollback_started = true;
    }
    if !tasks.is_empty() {
        workflow.status = WorkflowStatus::RollingBack;
    }
    workflow.task_ids.extend(tasks.iter().map(|t| t.id));
    workflow.updated_at = now;
    WorkflowChange::Rollback {
        workflow,
        before,
        tasks,
    }
}

/// Marks `workflow`'s cancel as requested; whether that changed it. A
/// finished workflow refuses.
pub(super) fn request_cancel(workflow: &mut Workflow, now: DateTime<Utc>) -> Result<bool> {
    if workflow.status.is_terminal() {
        return Err(Error::Conflict(format!(
            "workflow {} already finished as {}",
            workflow.id, workflow.status
        )));
    }
    if workflow.cancel_requested {
        return Ok(false);
    }
    workflow.cancel_requested = true;
    workflow.updated_at = now;
    Ok(true)
}

/// A workflow retry to write in one go: the workflow running again and
/// every task it runs again, each with its mark as read.
#[derive(Debug)]
pub(super) struct Retry {
    pub(super) workflow: Workflow,
    pub(super) before: WorkflowStatus,
    pub(super) reset: Vec<(Task, TaskMark)>,
}

/// Runs a finished `workflow` (with its `tasks`) again: its failed,
/// cancelled, skipped and not-started steps, its `always_run` steps, and
/// the completed steps a rollback undid (or later steps would read
/// outputs describing what no longer exists). Completed steps keep their
/// outputs. Refused while it runs, or if it completed with nothing to run
/// again.
pub(super) fn retry<T: Borrow<Task>>(
    workflow: &Workflow,
    tasks: &[T],
    now: DateTime<Utc>,
) -> Result<Retry> {
    let id = workflow.id;
    if !workflow.status.is_terminal() {
        return Err(Error::Conflict(format!(
            "workflow {id} is {}; only a finished workflow can be retried",
            workflow.status
        )));
    }
    let tasks = || tasks.iter().map(Borrow::borrow);
    if workflow.status == WorkflowStatus::Completed
        && !tasks().any(|t: &Task| t.reruns_on_retry() && t.step.rollback_of.is_none())
    {
        return Err(Error::Conflict(format!(
            "workflow {id} completed; it has nothing to retry"
        )));
    }
    let undone: HashSet<TaskId> = tasks()
        .filter(|t| t.status == TaskStatus::Completed)
        .filter_map(|t| t.step.rollback_of)
        .collect();
    let mut reset = Vec::new();
    for task in tasks() {
        if task.step.rollback_of.is_none() && (task.reruns_on_retry() || undone.contains(&task.id))
        {
            let before = TaskMark::of(task);
            let mut task = task.clone();
            task.rerun_even_if_completed(now)?;
            reset.push((task, before));
        }
    }
    let before = workflow.status;
    let mut workflow = workflow.clone();
    workflow.status = WorkflowStatus::Running;
    workflow.halt = None;
    workflow.cancel_requested = false;
    workflow.finished_at = None;
    workflow.updated_at = now;
    Ok(Retry {
        workflow,
        before,
        reset,
    })
}

#[cfg(test)]
mod tests;
