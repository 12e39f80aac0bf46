//! Workflows: a submission that created a set of tasks, some depending on
//! others, and the decisions about dependents when a task finishes.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Priority, Task, TaskId, TaskStatus, WorkflowId};

/// A submitted workflow. Its status is derived from its tasks, never stored,
/// so the two can not disagree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub id: WorkflowId,
    /// What kind of workflow this is, e.g. `servers/create`.
    pub kind: String,
    pub name: String,
    /// The submission as received, for audit and re-submission.
    pub input: Value,
    pub check_mode: bool,
    pub priority: Priority,
    pub task_ids: Vec<TaskId>,
    pub created_at: DateTime<Utc>,
    pub version: u64,
}

/// The overall state of a workflow, derived from its tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkflowStatus {
    /// Nothing has started yet.
    Queued,
    /// Some tasks are not finished and at least one has started.
    Running,
    Completed,
    /// Every task finished and at least one failed or was skipped.
    Failed,
    /// Every task finished, none failed, and at least one was cancelled.
    Cancelled,
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
