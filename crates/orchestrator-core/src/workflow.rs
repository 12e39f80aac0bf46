//! Workflows: a submission that created a set of tasks, some depending on
//! others, and the decisions about dependents when a task finishes.

use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::period::Keep;
use crate::{FailurePolicy, Priority, Task, TaskId, TaskStatus, WorkflowId};

/// A submitted workflow: one run of a template (or of a built-in plan)
/// with its inputs, and the tasks it created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Workflow {
    pub id: WorkflowId,
    /// The template's `ref_name` (built-ins use theirs, e.g. `servers/create`).
    pub kind: String,
    /// The template's `schema_version`, when it came from a template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_version: Option<u32>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The submission as received, for audit and re-submission. Shared:
    /// it can hold a whole inline template, and the engine reads the
    /// workflow record after every finished step.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Arc<Value>,
    pub check_mode: bool,
    pub priority: Priority,
    pub status: WorkflowStatus,
    #[serde(default)]
    pub on_failure: FailurePolicy,
    /// Most of its tasks that may run at once; unbounded when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_limit: Option<usize>,
    /// The caller's own name for what this workflow does (`meta.ref`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// 1 for a new `reference`; n+1 when the same reference comes back with
    /// a different body.
    #[serde(default = "first_revision")]
    pub revision: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_revision: Option<WorkflowId>,
    /// From the `Idempotency-Key` header; unique across workflows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Digest of the submission body, to tell a repeat from a revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_digest: Option<String>,
    /// The API token that submitted it (for a re-run, the one that asked
    /// for it; for a schedule's run, the schedule's); absent without
    /// tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// How long to keep it once finished (`meta.retain`), instead of the
    /// service's `--retain-finished`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain: Option<Keep>,
    /// Scheduled start; nothing runs before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    /// The workflow inputs after defaults: what `${workflow.input.*}` reads.
    #[serde(default)]
    pub vars: Value,
    /// Set when a step failed under the `fail` or `rollback` policy:
    /// nothing new starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt: Option<Halt>,
    /// Set, and persisted, before running steps are stopped.
    #[serde(default)]
    pub cancel_requested: bool,
    pub task_ids: Vec<TaskId>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// Optimistic-concurrency version, as on tasks.
    pub version: u64,
    /// Paused by an operator: no new step of it starts (queued ones stay
    /// queued) until it is resumed; running ones finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// When it was last paused, while it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<DateTime<Utc>>,
}

fn first_revision() -> u32 {
    1
}

/// Why a workflow stopped starting new steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Halt {
    pub reason: String,
    /// Undo completed steps once nothing runs any more.
    pub rollback: bool,
    /// The rollback tasks exist.
    #[serde(default)]
    pub rollback_started: bool,
}

impl Workflow {
    /// A task of it was claimed: a queued or scheduled workflow is running
    /// from now on. Whether that changed it (any other status stays).
    pub fn start_running(&mut self, now: DateTime<Utc>) -> bool {
        if !matches!(
            self.status,
            WorkflowStatus::Queued | WorkflowStatus::Scheduled
        ) {
            return false;
        }
        self.status = WorkflowStatus::Running;
        self.started_at.get_or_insert(now);
        self.updated_at = now;
        true
    }

    /// A new, queued workflow with no tasks yet and every option at its default.
    pub fn new(kind: impl Into<String>, name: impl Into<String>, now: DateTime<Utc>) -> Workflow {
        Workflow {
            id: WorkflowId::new(),
            kind: kind.into(),
            template_version: None,
            name: name.into(),
            description: None,
            input: Arc::new(Value::Null),
            check_mode: false,
            priority: Priority::Normal,
            status: WorkflowStatus::Queued,
            on_failure: FailurePolicy::Fail,
            parallel_limit: None,
            reference: None,
            trace_id: None,
            revision: 1,
            previous_revision: None,
            idempotency_key: None,
            request_digest: None,
            submitted_by: None,
            retain: None,
            start_at: None,
            vars: Value::Null,
            halt: None,
            cancel_requested: false,
            task_ids: Vec::new(),
            created_at: now,
            started_at: None,
            finished_at: None,
            updated_at: now,
            version: 0,
            paused: false,
            paused_at: None,
        }
    }

    /// Pauses it: whether that changed it. A finished workflow refuses,
    /// naming its status.
    pub fn pause(&mut self, now: DateTime<Utc>) -> std::result::Result<bool, String> {
        if self.status.is_terminal() {
            return Err(format!(
                "workflow {} already finished as {}; only an unfinished workflow can be paused",
                self.id, self.status
            ));
        }
        if self.paused {
            return Ok(false);
        }
        self.paused = true;
        self.paused_at = Some(now);
        self.updated_at = now;
        Ok(true)
    }

    /// Resumes it: whether that changed it (it was paused).
    pub fn resume(&mut self, now: DateTime<Utc>) -> bool {
        if !self.paused {
            return false;
        }
        self.paused = false;
        self.paused_at = None;
        self.updated_at = now;
        true
    }
}

/// The overall state of a workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum WorkflowStatus {
    /// Waiting for its scheduled start.
    Scheduled,
    /// Accepted; nothing has started yet.
    Queued,
    Running,
    /// A step failed under the `rollback` policy; undo steps are running.
    RollingBack,
    Completed,
    Failed,
    Cancelled,
}

crate::named_variants!(WorkflowStatus, "status", [
    Scheduled => "scheduled",
    Queued => "queued",
    Running => "running",
    RollingBack => "rolling_back",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
]);

impl WorkflowStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkflowStatus::Completed | WorkflowStatus::Failed | WorkflowStatus::Cancelled
        )
    }
}

/// What the engine should do next for a workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every dependency is satisfied: the task may be queued.
    Release(TaskId),
    /// A dependency ended without completing; the reason names it.
    Skip(TaskId, String),
    /// The workflow stopped (halted or cancelled) before the task ran.
    Abandon(TaskId, String),
    /// A step failed under `fail` or `rollback`: record it, start nothing new.
    Halt(Halt),
    /// Undo these completed tasks, in this order.
    Rollback(Vec<TaskId>),
    /// Every task is finished; the workflow ends with this status.
    Finish(WorkflowStatus),
}

pub(crate) fn is_rollback(task: &Task) -> bool {
    task.step.rollback_of.is_some()
}

/// A failure that counts against the workflow.
fn failed_for_good(task: &Task) -> bool {
    task.status == TaskStatus::Failed && !task.step.optional
}

/// Decides the next moves for a workflow from its stored state. Pure: the
/// engine applies the decisions, persists them, and asks again until the
/// answer is empty.
pub fn decide<T: Borrow<Task>>(workflow: &Workflow, tasks: &[T]) -> Vec<Decision> {
    if workflow.status.is_terminal() {
        return Vec::new();
    }
    let tasks: Vec<&Task> = tasks.iter().map(Borrow::borrow).collect();
    let forward = || tasks.iter().filter(|t| !is_rollback(t));
    if workflow.halt.is_none()
        && !workflow.cancel_requested
        && let Some(task) = tasks.iter().find(|t| halts(workflow, t))
    {
        let policy = task.step.on_failure.unwrap_or(workflow.on_failure);
        return vec![Decision::Halt(Halt {
            reason: format!("step {} failed", task.name),
            rollback: policy == FailurePolicy::Rollback,
            rollback_started: false,
        })];
    }

    let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, *t)).collect();
    let decisions: Vec<Decision> = tasks
        .iter()
        .filter_map(|task| decide_task(workflow, task, |id| by_id.get(&id).copied()))
        .collect();
    if !decisions.is_empty() {
        return decisions;
    }

    let all_ended = tasks.iter().all(|t| t.status.is_terminal());
    if let Some(halt) = &workflow.halt
        && halt.rollback
        && !halt.rollback_started
        && !workflow.cancel_requested
        && forward().all(|t| t.status.is_terminal())
    {
        // Tasks are stored in topological order, so the reverse of it undoes
        // dependents before what they depend on.
        let undo = forward()
            .rev()
            .filter(|t| t.status == TaskStatus::Completed && t.step.rollback.is_some())
            .map(|t| t.id)
            .collect();
        return vec![Decision::Rollback(undo)];
    }
    if all_ended {
        let failed = workflow.halt.is_some() || tasks.iter().any(|t| failed_for_good(t));
        let cancelled = tasks.iter().any(|t| t.status == TaskStatus::Cancelled);
        let skipped = skipped_for_good(&tasks);
        let status = if workflow.cancel_requested {
            WorkflowStatus::Cancelled
        } else if failed {
            WorkflowStatus::Failed
        } else if cancelled {
            // A step cancelled on its own (its dependents are skipped).
            WorkflowStatus::Cancelled
        } else if skipped {
            WorkflowStatus::Failed
        } else {
            WorkflowStatus::Completed
        };
        return vec![Decision::Finish(status)];
    }
    Vec::new()
}

/// Whether a task was skipped for a reason that fails the workflow: not
/// its own `when:` condition, nor a dependency a condition skipped (with
/// every other one completed, or failed while optional). So a step after
/// one that a condition skipped is skipped too, and that is no failure
/// either.
fn skipped_for_good(tasks: &[&Task]) -> bool {
    let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, *t)).collect();
    let mut by_condition: HashSet<TaskId> = HashSet::new();
    // Tasks are stored in topological order: dependencies come first.
    for task in tasks.iter().filter(|t| t.status == TaskStatus::Skipped) {
        let benign = task.skipped_by_condition()
            || (task.depends_on.iter().any(|id| by_condition.contains(id))
                && task.depends_on.iter().all(|id| {
                    by_condition.contains(id)
                        || by_id.get(id).is_some_and(|dep| {
                            dep.status == TaskStatus::Completed
                                || (dep.status == TaskStatus::Failed && dep.step.optional)
                        })
                }));
        if !benign {
            return true;
        }
        by_condition.insert(task.id);
    }
    false
}

/// Whether a task is still to run (or to be released).
fn waiting(task: &Task) -> bool {
    matches!(
        task.status,
        TaskStatus::Pending | TaskStatus::Queued | TaskStatus::RetryWaiting
    )
}

/// The decision about one task of the workflow, if any: abandoned (the
/// workflow stopped), released (its dependencies allow it) or skipped (a
/// dependency ended without completing). `dep` finds the workflow's tasks
/// by id; only the task's own dependencies are asked for.
///
/// `decide` asks this of every task; the engine's incremental round (see
/// `progress`) asks it only of the dependents of tasks that just
/// ended, which is what keeps a step's cost independent of the workflow's
/// size. Both reach the same decision because it is this one function.
pub fn decide_task<'a>(
    workflow: &Workflow,
    task: &Task,
    dep: impl Fn(TaskId) -> Option<&'a Task>,
) -> Option<Decision> {
    if !waiting(task) {
        return None;
    }
    let stop_reason = if workflow.cancel_requested {
        Some("workflow cancelled".to_owned())
    } else {
        workflow
            .halt
            .as_ref()
            .filter(|_| !task.step.always_run && !is_rollback(task))
            .map(|halt| format!("not started: {}", halt.reason))
    };
    if let Some(reason) = stop_reason {
        return Some(Decision::Abandon(task.id, reason));
    }
    if task.status != TaskStatus::Pending {
        return None;
    }
    // An open approval gate waits for its decisions, not for its
    // dependencies: only a decision (or its timeout) moves it.
    if task
        .approval
        .as_ref()
        .is_some_and(|g| g.opened_at.is_some())
    {
        return None;
    }
    // Rollback and always_run steps wait for their dependencies to end,
    // however they end; the others need them to succeed.
    let runs_regardless = task.step.always_run || is_rollback(task);
    let mut all_ended = true;
    let mut all_satisfied = true;
    let mut blocker = None;
    for dep_id in &task.depends_on {
        let Some(dep) = dep(*dep_id) else {
            blocker.get_or_insert_with(|| format!("dependency {dep_id} does not exist"));
            continue;
        };
        let satisfied = dep.status == TaskStatus::Completed
            || (dep.status == TaskStatus::Failed && dep.step.optional);
        all_ended &= dep.status.is_terminal();
        all_satisfied &= satisfied;
        if dep.status.is_terminal() && !satisfied && blocker.is_none() {
            blocker = Some(format!(
                "dependency {} ({}) {}",
                dep.name, dep.id, dep.status
            ));
        }
    }
    if runs_regardless {
        all_ended.then_some(Decision::Release(task.id))
    } else if let Some(reason) = blocker {
        Some(Decision::Skip(task.id, reason))
    } else if all_satisfied {
        Some(Decision::Release(task.id))
    } else {
        None
    }
}

/// Whether a task that ended this way stops the workflow (`Halt`): it
/// failed for good under the `fail` or `rollback` policy.
pub fn halts(workflow: &Workflow, task: &Task) -> bool {
    !is_rollback(task)
        && failed_for_good(task)
        && task.step.on_failure.unwrap_or(workflow.on_failure) != FailurePolicy::Continue
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{RetryPolicy, StepSettings, TaskSpec};

    fn task(name: &str, depends_on: Vec<TaskId>) -> Task {
        let spec = TaskSpec {
            name: name.into(),
            script: "x.sh".into(),
            input: Value::Null,
            priority: Priority::Normal,
            max_attempts: 1,
            timeout: Duration::from_secs(5),
            check_mode: false,
            depends_on,
            step: StepSettings {
                rollback: Some("undo.sh".into()),
                ..Default::default()
            },
        };
        Task::new(WorkflowId::new(), spec, Utc::now())
    }

    fn finish(task: &mut Task, ok: bool) {
        if task.status == TaskStatus::Pending {
            task.release(Utc::now()).unwrap();
        }
        task.start(Utc::now()).unwrap();
        if ok {
            task.complete(Value::Null, Utc::now()).unwrap();
        } else {
            task.fail(
                "x".into(),
                Some(1),
                &RetryPolicy::default(),
                0.0,
                Utc::now(),
            )
            .unwrap();
        }
    }

    fn workflow(policy: FailurePolicy) -> Workflow {
        let mut w = Workflow::new("t", "t", Utc::now());
        w.on_failure = policy;
        w
    }

    #[test]
    fn releases_only_when_every_dependency_completed() {
        let mut a = task("a", vec![]);
        let b = task("b", vec![]);
        let c = task("c", vec![a.id, b.id]);
        finish(&mut a, true);
        let w = workflow(FailurePolicy::Fail);
        assert!(decide(&w, &[a.clone(), b.clone(), c.clone()]).is_empty());
        let mut b = b;
        finish(&mut b, true);
        assert_eq!(
            decide(&w, &[a, b, c.clone()]),
            vec![Decision::Release(c.id)]
        );
    }

    #[test]
    fn continue_skips_dependents_of_a_failure_and_runs_the_rest() {
        let mut a = task("server-a", vec![]);
        let b = task("b", vec![]);
        let c = task("join", vec![a.id]);
        let d = task("after-b", vec![b.id]);
        finish(&mut a, false);
        let w = workflow(FailurePolicy::Continue);
        let decisions = decide(&w, &[a, b, c.clone(), d]);
        match &decisions[..] {
            [Decision::Skip(id, reason)] => {
                assert_eq!(*id, c.id);
                assert!(
                    reason.contains("server-a") && reason.contains("failed"),
                    "{reason}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn fail_halts_then_abandons_what_did_not_start_and_ends_failed() {
        let mut a = task("a", vec![]);
        let b = task("b", vec![]);
        let c = task("c", vec![a.id]);
        finish(&mut a, false);
        let mut w = workflow(FailurePolicy::Fail);
        let tasks = vec![a.clone(), b.clone(), c.clone()];
        let [Decision::Halt(halt)] = &decide(&w, &tasks)[..] else {
            panic!()
        };
        assert!(!halt.rollback);
        w.halt = Some(halt.clone());
        let decisions = decide(&w, &tasks);
        assert!(decisions.contains(&Decision::Abandon(
            b.id,
            "not started: step a failed".into()
        )));
        assert!(
            decisions
                .iter()
                .any(|d| matches!(d, Decision::Abandon(id, _) if *id == c.id))
        );
        let mut b = b;
        b.abandon("x".into(), Utc::now()).unwrap();
        let mut c = c;
        c.abandon("x".into(), Utc::now()).unwrap();
        assert_eq!(
            decide(&w, &[a, b, c]),
            vec![Decision::Finish(WorkflowStatus::Failed)]
        );
    }

    #[test]
    fn rollback_undoes_completed_steps_in_reverse_order_once_nothing_runs() {
        let mut a = task("a", vec![]);
        let mut b = task("b", vec![a.id]);
        let mut c = task("c", vec![]);
        let d = task("d", vec![]);
        finish(&mut a, true);
        finish(&mut b, true);
        c.start(Utc::now()).unwrap();
        let mut w = workflow(FailurePolicy::Rollback);
        let mut d = d;
        finish(&mut d, false);
        let [Decision::Halt(halt)] = &decide(&w, &[a.clone(), b.clone(), c.clone(), d.clone()])[..]
        else {
            panic!()
        };
        assert!(halt.rollback);
        w.halt = Some(halt.clone());
        // c still runs: wait for it.
        assert!(decide(&w, &[a.clone(), b.clone(), c.clone(), d.clone()]).is_empty());
        c.complete(Value::Null, Utc::now()).unwrap();
        assert_eq!(
            decide(&w, &[a.clone(), b.clone(), c.clone(), d.clone()]),
            vec![Decision::Rollback(vec![c.id, b.id, a.id])]
        );
    }

    #[test]
    fn an_optional_failure_satisfies_dependents_and_does_not_fail_the_workflow() {
        let mut a = task("a", vec![]);
        a.step.optional = true;
        let b = task("b", vec![a.id]);
        finish(&mut a, false);
        let w = workflow(FailurePolicy::Fail);
        assert_eq!(
            decide(&w, &[a.clone(), b.clone()]),
            vec![Decision::Release(b.id)]
        );
        let mut b = b;
        finish(&mut b, true);
        assert_eq!(
            decide(&w, &[a, b]),
            vec![Decision::Finish(WorkflowStatus::Completed)]
        );
    }

    #[test]
    fn always_run_steps_run_after_a_failure() {
        let mut a = task("a", vec![]);
        let mut cleanup = task("cleanup", vec![a.id]);
        cleanup.step.always_run = true;
        finish(&mut a, false);
        let mut w = workflow(FailurePolicy::Fail);
        w.halt = Some(Halt {
            reason: "x".into(),
            rollback: false,
            rollback_started: false,
        });
        assert_eq!(
            decide(&w, &[a, cleanup.clone()]),
            vec![Decision::Release(cleanup.id)]
        );
    }

    #[test]
    fn cancel_abandons_everything_waiting_and_ends_cancelled() {
        let a = task("a", vec![]);
        let mut cleanup = task("cleanup", vec![a.id]);
        cleanup.step.always_run = true;
        let mut w = workflow(FailurePolicy::Fail);
        w.cancel_requested = true;
        let decisions = decide(&w, &[a.clone(), cleanup.clone()]);
        assert_eq!(decisions.len(), 2);
        assert!(
            decisions
                .iter()
                .all(|d| matches!(d, Decision::Abandon(_, r) if r == "workflow cancelled"))
        );
        let (mut a, mut cleanup) = (a, cleanup);
        a.abandon("x".into(), Utc::now()).unwrap();
        cleanup.abandon("x".into(), Utc::now()).unwrap();
        assert_eq!(
            decide(&w, &[a, cleanup]),
            vec![Decision::Finish(WorkflowStatus::Cancelled)]
        );
    }

    #[test]
    fn a_step_skipped_by_its_condition_and_its_dependents_do_not_fail_the_workflow() {
        let mut a = task("a", vec![]);
        let mut b = task("b", vec![a.id]);
        let c = task("c", vec![b.id]);
        finish(&mut a, true);
        b.skip_by_condition("workflow.input.env == 'prod'".into(), Utc::now())
            .unwrap();
        assert_eq!(
            b.error.as_deref(),
            Some("skipped: when `workflow.input.env == 'prod'` is false")
        );
        let w = workflow(FailurePolicy::Fail);
        // The dependent follows the existing skip rule.
        let [Decision::Skip(id, reason)] = &decide(&w, &[a.clone(), b.clone(), c.clone()])[..]
        else {
            panic!()
        };
        assert_eq!(*id, c.id);
        assert!(
            reason.contains("dependency b") && reason.contains("skipped"),
            "{reason}"
        );
        let mut skipped_after = c.clone();
        skipped_after.skip(reason.clone(), Utc::now()).unwrap();
        assert_eq!(
            decide(&w, &[a.clone(), b.clone(), skipped_after]),
            vec![Decision::Finish(WorkflowStatus::Completed)]
        );
        // A skip for another reason still fails it.
        let mut plain = b.clone();
        plain.condition = None;
        let mut c = c;
        c.skip("x".into(), Utc::now()).unwrap();
        assert_eq!(
            decide(&w, &[a, plain, c]),
            vec![Decision::Finish(WorkflowStatus::Failed)]
        );
    }

    #[test]
    fn pause_refuses_a_finished_workflow_and_repeats_change_nothing() {
        let mut w = workflow(FailurePolicy::Fail);
        assert_eq!(w.pause(Utc::now()), Ok(true));
        assert_eq!(w.pause(Utc::now()), Ok(false));
        assert!(w.paused && w.paused_at.is_some());
        assert!(w.resume(Utc::now()));
        assert!(!w.resume(Utc::now()));
        w.status = WorkflowStatus::Completed;
        let e = w.pause(Utc::now()).unwrap_err();
        assert!(e.contains("already finished as completed"), "{e}");
    }

    #[test]
    fn a_finished_workflow_decides_nothing() {
        let mut w = workflow(FailurePolicy::Fail);
        w.status = WorkflowStatus::Completed;
        assert!(decide(&w, &[task("a", vec![])]).is_empty());
    }
}
