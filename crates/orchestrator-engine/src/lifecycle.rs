//! Moving a workflow along its DAG: applies the core's decisions
//! (release, skip, abandon, halt, rollback, finish), and the workflow-wide
//! cancel and retry.

use std::collections::HashMap;

use chrono::Utc;
use futures_util::future::join_all;
use orchestrator_core::refs::{Scope, StepOutputs};
use orchestrator_core::{
    Decision, StepSettings, Task, TaskId, TaskSpec, TaskStatus, Workflow, WorkflowId,
    WorkflowStatus, decide,
};
use serde_json::{Value, json};

use crate::dispatch::is_conflict;
use crate::engine::{Engine, Inner, WorkflowView, lock};
use crate::{Error, Result};

impl Inner {
    /// `advance`, coalesced: when this node is already advancing the
    /// workflow, the running call takes one more round instead of a second
    /// call racing it. Steps of a wide DAG finish in bursts; each would
    /// otherwise re-read the whole workflow, and most would lose their
    /// compare-and-set races to the others.
    pub(crate) async fn advance_soon(&self, id: WorkflowId) -> Result<()> {
        {
            let mut advancing = lock(&self.advancing);
            if let Some(again) = advancing.get_mut(&id) {
                *again = true;
                return Ok(());
            }
            advancing.insert(id, false);
        }
        loop {
            let result = self.advance(id).await;
            let mut advancing = lock(&self.advancing);
            let again = advancing.get(&id).copied().unwrap_or(false);
            if result.is_err() || !again {
                advancing.remove(&id);
                return result;
            }
            advancing.insert(id, false);
        }
    }

    /// Applies decisions until the workflow needs nothing more right now.
    pub(crate) async fn advance(&self, id: WorkflowId) -> Result<()> {
        loop {
            let workflow = self.load_workflow(id).await?;
            let tasks = self.store.tasks().workflow_tasks(id).await?;
            let decisions = decide(&workflow, &tasks);
            if decisions.is_empty() {
                return Ok(());
            }
            let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, &**t)).collect();
            // Another round is needed only when a decision ended a task or
            // changed the workflow (which may enable further decisions), or
            // lost a race; a plain release does neither. Each round re-reads
            // the whole workflow, so skipping the needless one matters.
            let mut again = false;
            // Task decisions are independent of each other: their writes go
            // out together, so the storage can make them durable in one go.
            let mut changed: Vec<Task> = Vec::new();
            for decision in decisions {
                let now = Utc::now();
                match decision {
                    Decision::Release(task_id) => {
                        let mut task = by_id[&task_id].clone();
                        match resolve_input(&workflow, &task, &by_id) {
                            Ok(input) => {
                                task.input = input;
                                task.not_before = workflow.start_at.filter(|at| *at > now);
                                task.release(now)?;
                            }
                            Err(error) => task.fail_unrunnable(error, now)?,
                        }
                        changed.push(task);
                    }
                    Decision::Skip(task_id, reason) => {
                        let mut task = by_id[&task_id].clone();
                        task.skip(reason, now)?;
                        changed.push(task);
                    }
                    Decision::Abandon(task_id, reason) => {
                        let mut task = by_id[&task_id].clone();
                        task.abandon(reason, now)?;
                        changed.push(task);
                    }
                    Decision::Halt(halt) => {
                        tracing::warn!(workflow = %id, reason = %halt.reason, rollback = halt.rollback, "workflow halted");
                        let mut workflow = workflow.clone();
                        workflow.halt = Some(halt);
                        workflow.updated_at = now;
                        self.store_workflow(&workflow, &[]).await?;
                        again = true;
                        break;
                    }
                    Decision::Rollback(undo) => {
                        self.start_rollback(&workflow, &undo, &by_id).await?;
                        again = true;
                        break;
                    }
                    Decision::Finish(status) => {
                        let mut workflow = workflow.clone();
                        workflow.status = status;
                        workflow.finished_at = Some(now);
                        workflow.updated_at = now;
                        if self.store_workflow(&workflow, &[]).await?.is_some() {
                            tracing::info!(workflow = %id, %status, "workflow finished");
                            lock(&self.slots).remove(&id);
                            lock(&self.running_workflows).remove(&id);
                            self.finished.send_modify(|n| *n += 1);
                        } else {
                            again = true;
                        }
                        break;
                    }
                }
            }
            let stored = join_all(changed.iter().map(|task| self.store_task(task))).await;
            for stored in stored {
                match stored? {
                    Some(task) if task.status == TaskStatus::Queued => self.enqueue(&task),
                    // Ended (skipped, abandoned, unrunnable), or lost a race.
                    _ => again = true,
                }
            }
            if !again {
                return Ok(());
            }
        }
    }

    /// Stores a task; `None` if someone else changed it first (the next
    /// round of decisions sees their change).
    async fn store_task(&self, task: &Task) -> Result<Option<Task>> {
        match self.store.tasks().update_task(task).await {
            Ok(stored) => Ok(Some(stored)),
            Err(e) if is_conflict(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn store_workflow(
        &self,
        workflow: &Workflow,
        new_tasks: &[Task],
    ) -> Result<Option<Workflow>> {
        match self
            .store
            .tasks()
            .update_workflow(workflow, new_tasks)
            .await
        {
            Ok(stored) => Ok(Some(stored)),
            Err(e) if is_conflict(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates one rollback task per step to undo, chained in the given
    /// order, in the same write that marks the rollback as started.
    async fn start_rollback(
        &self,
        workflow: &Workflow,
        undo: &[TaskId],
        by_id: &HashMap<TaskId, &Task>,
    ) -> Result<()> {
        let now = Utc::now();
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
                    ..Default::default()
                },
            };
            tasks.push(Task::new(workflow.id, spec, now));
        }
        let mut workflow = workflow.clone();
        if let Some(halt) = workflow.halt.as_mut() {
            halt.rollback_started = true;
        }
        workflow.status = if tasks.is_empty() {
            workflow.status
        } else {
            WorkflowStatus::RollingBack
        };
        workflow.task_ids.extend(tasks.iter().map(|t| t.id));
        workflow.updated_at = now;
        if self.store_workflow(&workflow, &tasks).await?.is_some() {
            tracing::warn!(workflow = %workflow.id, steps = tasks.len(), "rolling back completed steps");
            for task in tasks.iter().filter(|t| t.status == TaskStatus::Queued) {
                self.enqueue(task);
            }
        }
        Ok(())
    }
}

/// The task's input with every reference resolved against the workflow's
/// inputs, its `for_each` values and its dependencies' outputs.
fn resolve_input(
    workflow: &Workflow,
    task: &Task,
    by_id: &HashMap<TaskId, &Task>,
) -> Result<Value, String> {
    let Some(template) = &task.step.input_template else {
        return Ok(task.input.clone());
    };
    let mut grouped: HashMap<String, Vec<&Task>> = HashMap::new();
    for dep in task.depends_on.iter().filter_map(|id| by_id.get(id)) {
        if let Some(step) = &dep.step.ref_name {
            grouped.entry(step.clone()).or_default().push(dep);
        }
    }
    let mut outputs = HashMap::new();
    // A step it reads from but does not depend on ran no instance at all
    // (a for_each over an empty list): its outputs are an empty list.
    for (_, reference) in orchestrator_core::refs::references_in(template, "").unwrap_or_default() {
        if let orchestrator_core::refs::Root::StepOutput(step) = reference.root
            && !grouped.contains_key(&step)
        {
            outputs.insert(step, StepOutputs::Many(Vec::new()));
        }
    }
    for (step, deps) in grouped {
        let output = |t: &Task| t.output.clone().unwrap_or(Value::Null);
        // One instance seen from an instance that shares all its for_each
        // values is "the" output; otherwise the step is a list of outputs.
        let single = deps.len() == 1 && covers(task.step.each.as_ref(), deps[0].step.each.as_ref());
        let value = if single {
            StepOutputs::One(output(deps[0]))
        } else {
            StepOutputs::Many(deps.iter().map(|t| output(t)).collect())
        };
        outputs.insert(step, value);
    }
    let scope = Scope {
        workflow_input: Some(&workflow.vars),
        check_mode: workflow.check_mode,
        each: task.step.each.as_ref(),
        outputs,
    };
    scope
        .resolve(template, "input")
        .map_err(|(at, message)| format!("cannot resolve {at}: {message}"))
}

fn covers(mine: Option<&Value>, theirs: Option<&Value>) -> bool {
    match (mine, theirs) {
        (_, None) => true,
        (Some(Value::Object(mine)), Some(Value::Object(theirs))) => {
            theirs.iter().all(|(k, v)| mine.get(k) == Some(v))
        }
        _ => false,
    }
}

impl Engine {
    /// Cancels a workflow: pending steps never start, running ones are stopped.
    pub async fn cancel_workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        let inner = &self.inner;
        loop {
            let mut workflow = inner.load_workflow(id).await?;
            if workflow.status.is_terminal() {
                return Err(Error::Conflict(format!(
                    "workflow {id} already finished as {}",
                    workflow.status
                )));
            }
            if !workflow.cancel_requested {
                workflow.cancel_requested = true;
                workflow.updated_at = Utc::now();
                match inner.store.tasks().update_workflow(&workflow, &[]).await {
                    Ok(_) => {}
                    Err(e) if is_conflict(&e) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            break;
        }
        inner.advance(id).await?;
        for task in inner.store.tasks().workflow_tasks(id).await? {
            if task.status == TaskStatus::Running {
                match inner.cancel_task(task.id).await {
                    Ok(_) | Err(Error::Conflict(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        tracing::info!(workflow = %id, "workflow cancel requested");
        self.workflow(id).await
    }

    /// Runs a finished workflow again: failed, cancelled, skipped and
    /// not-started steps, and `always_run` steps. Completed steps keep their
    /// outputs and do not run again.
    pub async fn retry_workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        let inner = &self.inner;
        let now = Utc::now();
        let mut workflow = inner.load_workflow(id).await?;
        if !workflow.status.is_terminal() {
            return Err(Error::Conflict(format!(
                "workflow {id} is {}; only a finished workflow can be retried",
                workflow.status
            )));
        }
        if workflow.status == WorkflowStatus::Completed
            && !inner
                .store
                .tasks()
                .workflow_tasks(id)
                .await?
                .iter()
                .any(|t| t.reruns_on_retry() && t.step.rollback_of.is_none())
        {
            return Err(Error::Conflict(format!(
                "workflow {id} completed; it has nothing to retry"
            )));
        }
        // The workflow first: a crash before the tasks follow leaves a
        // running workflow whose tasks all ended, which simply finishes again.
        workflow.status = WorkflowStatus::Running;
        workflow.halt = None;
        workflow.cancel_requested = false;
        workflow.finished_at = None;
        workflow.updated_at = now;
        inner
            .store
            .tasks()
            .update_workflow(&workflow, &[])
            .await
            .map_err(|e| {
                if is_conflict(&e) {
                    Error::Conflict(format!("workflow {id} changed meanwhile; try again"))
                } else {
                    e.into()
                }
            })?;
        inner.register_limit(&workflow);
        let tasks = inner.store.tasks().workflow_tasks(id).await?;
        // Steps a rollback undid must run again too, or later steps would
        // read outputs describing what no longer exists.
        let undone: std::collections::HashSet<TaskId> = tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Completed)
            .filter_map(|t| t.step.rollback_of)
            .collect();
        for task in tasks {
            if task.step.rollback_of.is_none()
                && (task.reruns_on_retry() || undone.contains(&task.id))
            {
                let mut task = Task::clone(&task);
                task.rerun_even_if_completed(now)?;
                inner.store.tasks().update_task(&task).await?;
            }
        }
        tracing::info!(workflow = %id, "workflow retried");
        inner.advance(id).await?;
        self.workflow(id).await
    }
}

impl From<orchestrator_core::Error> for Error {
    fn from(e: orchestrator_core::Error) -> Self {
        Error::Conflict(e.to_string())
    }
}
