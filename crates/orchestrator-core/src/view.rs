//! A workflow as a reader sees it: its tasks grouped into template steps,
//! each step with one overall status, and the DAG's edges.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Task, TaskId, TaskStatus, Workflow};

/// One template step of a workflow: its instances and their overall state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepView {
    pub ref_name: String,
    /// The worst status among its instances (see [`severity`]).
    pub status: TaskStatus,
    pub task_ids: Vec<TaskId>,
}

/// A workflow with its tasks, steps and DAG edges.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowView {
    #[serde(flatten)]
    pub workflow: Workflow,
    pub steps: Vec<StepView>,
    /// `[from, to]`: `to` depends on `from`.
    pub edges: Vec<[TaskId; 2]>,
    /// Each step's output by `ref_name`, as a later step would read
    /// `${<step>.output}`: one object (`null` until it completed), or for a
    /// `for_each` step the list of its instances' outputs. What a caller
    /// one level up (another orchestrator's http step) reads by JSON
    /// pointer, `/outputs/<step>/<key>`.
    pub outputs: BTreeMap<String, Value>,
    pub tasks: Vec<Task>,
}

impl WorkflowView {
    /// Groups the tasks by template step, in the order steps first appear;
    /// rollback tasks belong to no step.
    pub fn new(workflow: Workflow, tasks: Vec<Task>) -> WorkflowView {
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
        let by_id: HashMap<TaskId, &Task> = tasks.iter().map(|t| (t.id, t)).collect();
        let outputs = steps
            .iter()
            .map(|step| {
                let instances: Vec<&Task> = step.task_ids.iter().map(|id| by_id[id]).collect();
                let output = |t: &Task| t.output.clone().unwrap_or(Value::Null);
                let value = match instances.as_slice() {
                    [one] if one.step.each.is_none() => output(one),
                    many => Value::Array(many.iter().map(|t| output(t)).collect()),
                };
                (step.ref_name.clone(), value)
            })
            .collect();
        WorkflowView {
            workflow,
            steps,
            edges,
            outputs,
            tasks,
        }
    }
}

/// How much a status says about a step's trouble: a step shows its worst
/// instance (failed > cancelled > skipped > not started > running >
/// retry waiting > queued > pending > completed), so one failed server
/// among many completed ones is what the step reports.
pub fn severity(status: TaskStatus) -> u8 {
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

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use crate::WorkflowId;
    use crate::task::test_support::task_of;

    fn task(workflow: WorkflowId, step: &str, status: TaskStatus, deps: Vec<TaskId>) -> Task {
        let mut task = task_of(workflow, Some(step), deps);
        task.status = status;
        task
    }

    #[test]
    fn every_status_has_its_own_rank_with_failed_worst() {
        let mut ranks: Vec<u8> = TaskStatus::ALL.iter().map(|s| severity(*s)).collect();
        ranks.sort();
        ranks.dedup();
        assert_eq!(ranks.len(), TaskStatus::ALL.len());
        assert_eq!(severity(TaskStatus::Failed), 8);
        assert_eq!(severity(TaskStatus::Completed), 0);
        assert!(severity(TaskStatus::Running) > severity(TaskStatus::Queued));
    }

    #[test]
    fn a_step_shows_its_worst_instance_and_rollbacks_are_no_step() {
        let workflow = Workflow::new("tpl", "wf", Utc::now());
        let a = task(workflow.id, "make", TaskStatus::Completed, vec![]);
        let b = task(workflow.id, "make", TaskStatus::Failed, vec![]);
        let c = task(workflow.id, "join", TaskStatus::Skipped, vec![a.id, b.id]);
        let mut undo = task(workflow.id, "make", TaskStatus::Completed, vec![]);
        undo.step.rollback_of = Some(a.id);
        let view = WorkflowView::new(workflow, vec![a.clone(), b.clone(), c.clone(), undo]);
        let steps: Vec<(&str, TaskStatus, usize)> = view
            .steps
            .iter()
            .map(|s| (s.ref_name.as_str(), s.status, s.task_ids.len()))
            .collect();
        assert_eq!(
            steps,
            [
                ("make", TaskStatus::Failed, 2),
                ("join", TaskStatus::Skipped, 1)
            ]
        );
        assert_eq!(view.edges, vec![[a.id, c.id], [b.id, c.id]]);
        assert_eq!(view.tasks.len(), 4);
    }

    #[test]
    fn outputs_are_keyed_by_step_as_a_later_step_reads_them() {
        let workflow = Workflow::new("tpl", "wf", Utc::now());
        let mut one = task(workflow.id, "net", TaskStatus::Completed, vec![]);
        one.output = Some(serde_json::json!({"cidr": "10.0.0.0/24"}));
        let mut vm = task(workflow.id, "vm", TaskStatus::Completed, vec![]);
        vm.step.each = Some(serde_json::json!({"host": "a"}));
        vm.output = Some(serde_json::json!({"ip": "10.0.0.2"}));
        let pending = task(workflow.id, "join", TaskStatus::Pending, vec![one.id]);
        let view = WorkflowView::new(workflow, vec![one, vm, pending]);
        assert_eq!(
            serde_json::to_value(&view.outputs).unwrap(),
            serde_json::json!({"net": {"cidr": "10.0.0.0/24"}, "vm": [{"ip": "10.0.0.2"}], "join": null})
        );
    }
}
