//! What a task's input becomes when it is released: its `${...}`
//! references resolved against the workflow's inputs, its `for_each`
//! values and the outputs of the tasks it depends on.

use std::collections::HashMap;

use serde_json::Value;

use crate::refs::{Reference, Root, Scope, StepOutputs, references_in};
use crate::template::condition::{Condition, ConditionError};
use crate::{Task, TaskId, Workflow};

/// The task's input with every reference resolved, or why it cannot be
/// (then the task can never run). `by_id` holds the workflow's tasks.
pub fn resolve_input(
    workflow: &Workflow,
    task: &Task,
    by_id: &HashMap<TaskId, &Task>,
) -> Result<Value, String> {
    let Some(template) = &task.step.input_template else {
        return Ok(task.input.clone());
    };
    let read = references_in(template, "").unwrap_or_default();
    let scope = scope_of(workflow, task, by_id, read.iter().map(|(_, r)| r));
    scope
        .resolve(template, "input")
        .map_err(|(at, message)| format!("cannot resolve {at}: {message}"))
}

/// The task's `when:` condition, evaluated against what its input would
/// see: `None` without one; otherwise its value, or why it has none (then
/// the task can never run). `by_id` holds (at least) its dependencies.
pub fn evaluate_condition(
    workflow: &Workflow,
    task: &Task,
    by_id: &HashMap<TaskId, &Task>,
) -> Option<Result<bool, String>> {
    let when = task.step.when.as_ref()?;
    let failed = |e: ConditionError| format!("when `{when}`: {e}");
    let condition = match Condition::parse(when) {
        Ok(condition) => condition,
        Err(e) => return Some(Err(failed(e))),
    };
    let scope = scope_of(
        workflow,
        task,
        by_id,
        condition.references().into_iter().map(|(_, r)| r),
    );
    Some(condition.evaluate(&scope).map_err(failed))
}

/// What references of `task` resolve against: the workflow's inputs, its
/// `for_each` values and its dependencies' outputs. `read` are the
/// references it will resolve.
fn scope_of<'a, 'r>(
    workflow: &'a Workflow,
    task: &'a Task,
    by_id: &HashMap<TaskId, &Task>,
    read: impl Iterator<Item = &'r Reference>,
) -> Scope<'a> {
    let mut grouped: HashMap<String, Vec<&Task>> = HashMap::new();
    for dep in task.depends_on.iter().filter_map(|id| by_id.get(id)) {
        if let Some(step) = &dep.step.ref_name {
            grouped.entry(step.clone()).or_default().push(dep);
        }
    }
    let mut outputs = HashMap::new();
    // A step it reads from but does not depend on ran no instance at all
    // (a for_each over an empty list): its outputs are an empty list.
    for reference in read {
        if let Root::StepOutput(step) = &reference.root
            && !grouped.contains_key(step)
        {
            outputs.insert(step.clone(), StepOutputs::Many(Vec::new()));
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
    Scope {
        workflow_input: Some(&workflow.vars),
        check_mode: workflow.check_mode,
        each: task.step.each.as_ref(),
        outputs,
    }
}

/// Whether an instance with `for_each` values `mine` sees the instance with
/// values `theirs` as its own counterpart: every value of theirs is one of
/// mine (an instance without values is everyone's).
pub fn covers(mine: Option<&Value>, theirs: Option<&Value>) -> bool {
    match (mine, theirs) {
        (_, None) => true,
        (Some(Value::Object(mine)), Some(Value::Object(theirs))) => {
            theirs.iter().all(|(k, v)| mine.get(k) == Some(v))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use serde_json::json;

    use super::*;
    use crate::WorkflowId;
    use crate::task::test_support::task_of;

    #[test]
    fn covers_is_a_subset_test_of_for_each_values() {
        let a = json!({"server": "a", "zone": "z1"});
        assert!(covers(Some(&a), None));
        assert!(covers(None, None));
        assert!(covers(Some(&a), Some(&json!({"server": "a"}))));
        assert!(!covers(Some(&a), Some(&json!({"server": "b"}))));
        assert!(!covers(None, Some(&json!({"server": "a"}))));
        assert!(!covers(Some(&json!({"zone": "z1"})), Some(&a)));
    }

    fn step_task(
        workflow: WorkflowId,
        ref_name: &str,
        each: Option<Value>,
        deps: Vec<TaskId>,
    ) -> Task {
        let mut task = task_of(workflow, Some(ref_name), deps);
        task.step.each = each;
        task
    }

    #[test]
    fn outputs_of_one_counterpart_or_of_every_instance() {
        let mut workflow = Workflow::new("tpl", "wf", Utc::now());
        workflow.vars = json!({"env": "demo"});
        let mut a = step_task(workflow.id, "make", Some(json!({"server": "a"})), vec![]);
        a.output = Some(json!({"ip": "10.0.0.1"}));
        let mut b = step_task(workflow.id, "make", Some(json!({"server": "b"})), vec![]);
        b.output = Some(json!({"ip": "10.0.0.2"}));
        let mut per_server = step_task(
            workflow.id,
            "conf",
            Some(json!({"server": "a"})),
            vec![a.id],
        );
        per_server.step.input_template =
            Some(json!({"ip": "${make.output.ip}", "env": "${workflow.input.env}"}));
        let mut join = step_task(workflow.id, "join", None, vec![a.id, b.id]);
        join.step.input_template =
            Some(json!({"ips": "${make.output.ip}", "none": "${later.output}"}));
        let by_id: HashMap<TaskId, &Task> = [(a.id, &a), (b.id, &b)].into_iter().collect();
        assert_eq!(
            resolve_input(&workflow, &per_server, &by_id),
            Ok(json!({"ip": "10.0.0.1", "env": "demo"}))
        );
        assert_eq!(
            resolve_input(&workflow, &join, &by_id),
            Ok(json!({"ips": ["10.0.0.1", "10.0.0.2"], "none": []}))
        );
        let mut broken = step_task(workflow.id, "x", None, vec![a.id]);
        broken.step.input_template = Some(json!({"v": "${make.output.missing.deep}"}));
        let error = resolve_input(&workflow, &broken, &by_id).unwrap_err();
        assert!(error.starts_with("cannot resolve input.v"), "{error}");
    }

    #[test]
    fn a_condition_reads_inputs_and_the_outputs_of_its_dependencies() {
        let mut workflow = Workflow::new("tpl", "wf", Utc::now());
        workflow.vars = json!({"env": "prod"});
        let mut plan = step_task(workflow.id, "plan", None, vec![]);
        plan.output = Some(json!({"changes": 2}));
        let by_id: HashMap<TaskId, &Task> = [(plan.id, &plan)].into_iter().collect();
        let mut apply = step_task(workflow.id, "apply", None, vec![plan.id]);
        assert_eq!(evaluate_condition(&workflow, &apply, &by_id), None);
        let mut check = |when: &str| {
            apply.step.when = Some(when.to_owned());
            evaluate_condition(&workflow, &apply, &by_id).unwrap()
        };
        assert_eq!(check("plan.output.changes > 0"), Ok(true));
        assert_eq!(
            check("workflow.input.env == 'prod' && plan.output.changes == 0"),
            Ok(false)
        );
        assert_eq!(
            check("plan.output.summary == 1"),
            Err(
                "when `plan.output.summary == 1`: column 1: `plan.output.summary`: the output of step `plan` has no such key"
                    .to_owned()
            )
        );
    }
}
