//! Workflows: a submission that created a set of tasks, some depending on
//! others, and the decisions about dependents when a task finishes.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{FailurePolicy, Priority, Task, TaskId, TaskStatus, WorkflowId};

/// A submitted workflow: one run of a template (or of a built-in plan)
/// with its inputs, and the tasks it created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The submission as received, for audit and re-submission.
    pub input: Value,
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
    /// Scheduled start; nothing runs before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    pub task_ids: Vec<TaskId>,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// Optimistic-concurrency version, as on tasks.
    pub version: u64,
}

fn first_revision() -> u32 {
    1
}

/// The overall state of a workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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

impl WorkflowStatus {
    pub const ALL: [WorkflowStatus; 7] = [
        WorkflowStatus::Scheduled,
        WorkflowStatus::Queued,
        WorkflowStatus::Running,
        WorkflowStatus::RollingBack,
        WorkflowStatus::Completed,
        WorkflowStatus::Failed,
        WorkflowStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowStatus::Scheduled => "scheduled",
            WorkflowStatus::Queued => "queued",
            WorkflowStatus::Running => "running",
            WorkflowStatus::RollingBack => "rolling_back",
            WorkflowStatus::Completed => "completed",
            WorkflowStatus::Failed => "failed",
            WorkflowStatus::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for WorkflowStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WorkflowStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WorkflowStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = WorkflowStatus::ALL.iter().map(|s| s.as_str()).collect();
                format!(
                    "unknown status `{s}` (expected one of {})",
                    known.join(", ")
                )
            })
    }
}

impl WorkflowStatus {
    pub fn of<'a>(tasks: impl IntoIterator<Item = &'a Task>) -> WorkflowStatus {
        let (mut all_finished, mut any_started, mut failed, mut cancelled) =
            (true, false, false, false);
        for task in tasks {
            all_finished &= task.status.is_terminal();
            any_started |= task.attempts > 0;
            failed |= matches!(task.status, TaskStatus::Failed | TaskStatus::Skipped);
            cancelled |= task.status == TaskStatus::Cancelled;
        }
        match (all_finished, any_started) {
            (false, false) => WorkflowStatus::Queued,
            (false, true) => WorkflowStatus::Running,
            (true, _) if failed => WorkflowStatus::Failed,
            (true, _) if cancelled => WorkflowStatus::Cancelled,
            (true, _) => WorkflowStatus::Completed,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            WorkflowStatus::Completed | WorkflowStatus::Failed | WorkflowStatus::Cancelled
        )
    }
}

/// What should happen to a pending task now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DependencyDecision {
    /// Every dependency completed.
    Release(TaskId),
    /// A dependency ended without completing; the reason names it.
    Skip(TaskId, String),
}

/// For every pending task of a workflow, decide whether it can run now,
/// must be skipped, or keeps waiting (then it is not listed).
pub fn decide_dependents(tasks: &[Task]) -> Vec<DependencyDecision> {
    let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, t)).collect();
    let mut decisions = Vec::new();
    for task in tasks.iter().filter(|t| t.status == TaskStatus::Pending) {
        let mut all_completed = true;
        let mut blocker = None;
        for dep_id in &task.depends_on {
            match by_id.get(dep_id) {
                Some(dep) if dep.status == TaskStatus::Completed => {}
                Some(dep) if dep.status.is_terminal() => {
                    blocker = Some(format!(
                        "dependency {} ({}) {}",
                        dep.name, dep.id, dep.status
                    ));
                    break;
                }
                Some(_) => all_completed = false,
                None => {
                    blocker = Some(format!("dependency {dep_id} does not exist"));
                    break;
                }
            }
        }
        match blocker {
            Some(reason) => decisions.push(DependencyDecision::Skip(task.id, reason)),
            None if all_completed => decisions.push(DependencyDecision::Release(task.id)),
            None => {}
        }
    }
    decisions
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{RetryPolicy, TaskSpec};

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
            step: Default::default(),
        };
        Task::new(WorkflowId::new(), spec, Utc::now())
    }

    fn finish(task: &mut Task, ok: bool) {
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

    #[test]
    fn releases_only_when_every_dependency_completed() {
        let mut a = task("a", vec![]);
        let b = task("b", vec![]);
        let c = task("c", vec![a.id, b.id]);
        finish(&mut a, true);
        let tasks = vec![a.clone(), b.clone(), c.clone()];
        assert!(decide_dependents(&tasks).is_empty());

        let mut b = b;
        finish(&mut b, true);
        let tasks = vec![a, b, c.clone()];
        assert_eq!(
            decide_dependents(&tasks),
            vec![DependencyDecision::Release(c.id)]
        );
    }

    #[test]
    fn skips_when_a_dependency_failed_and_names_it() {
        let mut a = task("server-web-01", vec![]);
        let c = task("join", vec![a.id]);
        finish(&mut a, false);
        let decisions = decide_dependents(&[a, c.clone()]);
        match &decisions[..] {
            [DependencyDecision::Skip(id, reason)] => {
                assert_eq!(*id, c.id);
                assert!(reason.contains("server-web-01"), "{reason}");
                assert!(reason.contains("failed"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn workflow_status_follows_tasks() {
        let mut a = task("a", vec![]);
        let mut b = task("b", vec![]);
        assert_eq!(WorkflowStatus::of([&a, &b]), WorkflowStatus::Queued);
        a.start(Utc::now()).unwrap();
        assert_eq!(WorkflowStatus::of([&a, &b]), WorkflowStatus::Running);
        a.complete(Value::Null, Utc::now()).unwrap();
        b.request_cancel(Utc::now()).unwrap();
        assert_eq!(WorkflowStatus::of([&a, &b]), WorkflowStatus::Cancelled);
        let mut c = task("c", vec![]);
        finish(&mut c, false);
        assert_eq!(WorkflowStatus::of([&a, &b, &c]), WorkflowStatus::Failed);
        assert_eq!(WorkflowStatus::of([&a]), WorkflowStatus::Completed);
    }
}
