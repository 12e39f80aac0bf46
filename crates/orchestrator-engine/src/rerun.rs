//! Re-running a finished workflow from a chosen step, as a new revision.
//!
//! The template the workflow ran is expanded again (with new `vars` if
//! given, checked like a submission's), and the new tasks are matched to
//! the old ones by step and `for_each` values. Steps upstream of `from`
//! (every step that is neither `from` nor, by default, downstream of it)
//! keep their output: their tasks are stored already `completed`, copies
//! of the old ones (`kept_from`), and never run. `from` and its downstream
//! steps run again. The old workflow is not touched: the history keeps
//! both revisions, each with its report.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use orchestrator_core::template::Template;
use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId};
use orchestrator_storage::WorkflowQuery;
use serde_json::{Map, Value, json};

use crate::engine::Engine;
use crate::submit::{Meta, SubmitRequest, TemplateSource};
use crate::{Error, Result, WorkflowView};

/// What `POST /workflows/{id}/rerun` asks for.
#[derive(Debug, Clone)]
pub struct RerunRequest {
    /// The `ref_name` of the first step to run again.
    pub from: String,
    /// Whether the steps downstream of `from` run again too (else they
    /// keep their outputs, like the upstream ones).
    pub include_downstream: bool,
    /// Inputs that replace the workflow's (top-level keys); `steps.<step>`
    /// gives per-step inputs of steps that run again.
    pub vars: Map<String, Value>,
    /// The token that asks for the re-run: the new revision's submitter
    /// (see [`crate::Meta::submitted_by`]).
    pub submitted_by: Option<String>,
}

impl Engine {
    /// Re-runs a finished workflow from `request.from` as a new revision;
    /// returns the new revision.
    pub async fn rerun_workflow(
        &self,
        id: WorkflowId,
        request: RerunRequest,
    ) -> Result<WorkflowView> {
        self.accepting()?;
        let old = self.inner.lifecycle.load_workflow(id).await?;
        if !old.status.is_terminal() {
            return Err(Error::Conflict(format!(
                "workflow {id} is {}; only a finished workflow can be re-run",
                old.status
            )));
        }
        let old_tasks = self.inner.store.tasks().workflow_tasks(id).await?;
        let template = self.template_of(&old)?;
        if template.step(&request.from).is_none() {
            let steps: Vec<&str> = template.steps.iter().map(|s| s.ref_name.as_str()).collect();
            return Err(Error::validation(
                "from",
                format!(
                    "template `{}` has no step `{}` (its steps: {})",
                    template.ref_name,
                    request.from,
                    steps.join(", ")
                ),
            ));
        }
        let submission = rerun_submission(&old, template, &request);
        let (mut workflow, mut tasks) = self.plan_off_workers(&submission).await?;
        // The re-run is submitted with the template as read back; secrets
        // are allowed as for the workflow it re-runs.
        self.check_secret_use(crate::secrets::secret_user_of(&old), &tasks)
            .await?;
        let rerun = steps_to_rerun(&tasks, &request);
        if let Some(Value::Object(per_step)) = request.vars.get("steps")
            && let Some(kept) = per_step.keys().find(|s| !rerun.contains(*s))
        {
            return Err(Error::validation(
                format!("vars.steps.{kept}"),
                format!("step `{kept}` is not re-run (it keeps its output)"),
            ));
        }
        keep_upstream(&mut tasks, &old_tasks, &rerun);
        workflow.previous_revision = Some(old.id);
        workflow.started_at = None;
        loop {
            workflow.revision = self.next_revision(&old).await?;
            match self.inner.records.insert_workflow(&workflow, &tasks).await {
                Ok(()) => break,
                // Another re-run (or submission) of the reference took the
                // revision first: take the next one.
                Err(Error::Storage(orchestrator_storage::Error::AlreadyExists {
                    what: "workflow revision",
                    ..
                })) => continue,
                Err(e) => return Err(e),
            }
        }
        let kept = tasks.iter().filter(|t| t.kept_from.is_some()).count();
        tracing::info!(workflow = %workflow.id, previous = %old.id, from = %request.from, kept, "workflow re-run as a new revision");
        self.start_stored(&workflow, &tasks).await?;
        self.workflow(workflow.id).await
    }

    /// The template the workflow ran: the registered one of its name and
    /// version, or the inline one it was submitted with.
    fn template_of(&self, workflow: &Workflow) -> Result<Arc<Template>> {
        if let Some(template) = self
            .templates()
            .get(&workflow.kind, workflow.template_version)
            .filter(|t| Some(t.schema_version) == workflow.template_version)
        {
            return Ok(template);
        }
        if let Some(inline @ Value::Object(_)) = workflow.input.get("template") {
            return serde_json::from_value(inline.clone())
                .map(Arc::new)
                .map_err(|e| {
                    Error::validation(
                        "template",
                        format!(
                            "the inline template of workflow {} no longer reads: {e}",
                            workflow.id
                        ),
                    )
                });
        }
        Err(Error::validation(
            "template",
            format!(
                "template `{}@{}` that workflow {} ran is no longer registered",
                workflow.kind,
                workflow.template_version.unwrap_or(0),
                workflow.id
            ),
        ))
    }

    /// The revision after the newest of the workflow's reference (or
    /// after the workflow's own, without one).
    async fn next_revision(&self, old: &Workflow) -> Result<u32> {
        let Some(reference) = &old.reference else {
            return Ok(old.revision + 1);
        };
        let query = WorkflowQuery {
            reference: Some(reference.clone()),
            limit: 1,
            ..Default::default()
        };
        let latest = self.inner.store.tasks().list_workflows(&query).await?;
        Ok(latest
            .items
            .first()
            .map_or(old.revision, |w| w.revision.max(old.revision))
            + 1)
    }
}

/// The submission of the re-run: the old workflow's, with the new vars
/// over its inputs (per-step inputs merged step by step).
fn rerun_submission(
    old: &Workflow,
    template: Arc<Template>,
    request: &RerunRequest,
) -> SubmitRequest {
    let mut vars = old.vars.as_object().cloned().unwrap_or_default();
    let mut per_step = old
        .input
        .get("vars")
        .and_then(|v| v.get("steps"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (key, value) in &request.vars {
        match (key.as_str(), value) {
            ("steps", Value::Object(steps)) => per_step.extend(steps.clone()),
            _ => {
                vars.insert(key.clone(), value.clone());
            }
        }
    }
    if !per_step.is_empty() {
        vars.insert("steps".into(), Value::Object(per_step));
    }
    let mut body = match &*old.input {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    if !request.vars.is_empty() || body.contains_key("vars") {
        body.insert("vars".into(), Value::Object(vars.clone()));
    }
    body.insert(
        "rerun".into(),
        json!({"of": old.id, "from": request.from, "include_downstream": request.include_downstream}),
    );
    SubmitRequest {
        template: TemplateSource::Inline(Box::new((*template).clone())),
        vars,
        meta: Meta {
            reference: old.reference.clone(),
            trace_id: old.trace_id.clone(),
            name: Some(old.name.clone()),
            description: old.description.clone(),
            retain: old.retain,
            submitted_by: request.submitted_by.clone(),
        },
        start_at: None,
        check_mode: old.check_mode,
        priority: old.priority,
        max_attempts: None,
        timeout: None,
        parallel_limit: old.parallel_limit,
        idempotency_key: None,
        body: Value::Object(body),
    }
}

/// `from`, and with `include_downstream` every step that depends on it,
/// directly or not, by the planned tasks' dependencies.
fn steps_to_rerun(tasks: &[Task], request: &RerunRequest) -> BTreeSet<String> {
    let step_of: HashMap<TaskId, &str> = tasks
        .iter()
        .filter_map(|t| t.step.ref_name.as_deref().map(|r| (t.id, r)))
        .collect();
    let mut rerun = BTreeSet::from([request.from.clone()]);
    if !request.include_downstream {
        return rerun;
    }
    // Tasks come in a topological order: one pass reaches every dependent.
    for task in tasks {
        let Some(step) = task.step.ref_name.as_deref() else {
            continue;
        };
        if task
            .depends_on
            .iter()
            .filter_map(|d| step_of.get(d))
            .any(|d| rerun.contains(*d))
        {
            rerun.insert(step.to_owned());
        }
    }
    rerun
}

/// Turns every planned task of a step that is not re-run into a copy of
/// its completed counterpart in the old revision (same step, same
/// `for_each` values). A task without one (it did not complete, or a
/// rollback undid it) runs, since it has no output to keep.
fn keep_upstream(tasks: &mut [Task], old_tasks: &[Arc<Task>], rerun: &BTreeSet<String>) {
    let undone: HashSet<TaskId> = old_tasks
        .iter()
        .filter(|t| t.status == TaskStatus::Completed)
        .filter_map(|t| t.step.rollback_of)
        .collect();
    let instance = |t: &Task| {
        (
            t.step.ref_name.clone(),
            t.step.each.as_ref().map(Value::to_string),
        )
    };
    let old_by_instance: HashMap<_, &Task> = old_tasks
        .iter()
        .filter(|t| t.step.rollback_of.is_none())
        .map(|t| (instance(t), &**t))
        .collect();
    for task in tasks.iter_mut() {
        let Some(old) = old_by_instance.get(&instance(task)) else {
            continue;
        };
        // Attempts and timeouts as the old revision had them, whatever the
        // submission's options were.
        task.max_attempts = old.max_attempts;
        task.timeout_secs = old.timeout_secs;
        let keep = task
            .step
            .ref_name
            .as_ref()
            .is_some_and(|r| !rerun.contains(r))
            && old.status == TaskStatus::Completed
            && !undone.contains(&old.id);
        if keep {
            task.status = TaskStatus::Completed;
            task.kept_from = Some(old.id);
            task.input = old.input.clone();
            task.output = old.output.clone();
            task.exit_code = old.exit_code;
            task.attempts = old.attempts;
            task.interruptions = old.interruptions;
            task.history = old.history.clone();
            task.node = old.node.clone();
            task.started_at = old.started_at;
            task.finished_at = old.finished_at;
            task.checkpoint = old.checkpoint.clone();
        }
    }
}
