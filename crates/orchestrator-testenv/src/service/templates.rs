//! The templates of an environment's workflows (`testenv-create`,
//! `testenv-run`, `testenv-delete`): their steps, each a `testenv` step
//! with the plan.

use orchestrator_core::template::Template;
use serde_json::{Value, json};

use super::{CREATE, DELETE, RUN};
use crate::model::{CheckPlan, EnvPlan, NodePlan};
use crate::{Error, Result};

pub(super) fn check_step(index: usize) -> String {
    format!("check_{index}")
}

/// A step of an environment's workflow: `testenv/<action>` with the plan.
fn step(
    ref_name: String,
    name: String,
    action: &str,
    plan: &EnvPlan,
    extra: Value,
    depends_on: Vec<String>,
    retries: u32,
) -> Value {
    let mut input = json!({"env": plan});
    if let (Some(input), Value::Object(extra)) = (input.as_object_mut(), extra) {
        input.extend(extra);
    }
    json!({
        "ref_name": ref_name,
        "name": name,
        "kind": "testenv",
        "script": format!("testenv/{action}"),
        "input": input,
        "depends_on": depends_on,
        "retries": retries,
        "timeout": "300s",
    })
}

fn template(
    ref_name: &str,
    name: &str,
    on_failure: &str,
    steps: Vec<Value>,
    create: bool,
) -> Result<Template> {
    let mut inputs = json!({"env_id": {"type": "string"}});
    if create {
        inputs["env"] = json!({"type": "object"});
    }
    serde_json::from_value(json!({
        "name": name,
        "ref_name": ref_name,
        "schema_version": 1,
        "on_failure": on_failure,
        "inputs": inputs,
        "steps": steps,
    }))
    .map_err(|e| Error::Provider(format!("cannot build the {ref_name} workflow: {e}")))
}

fn start_steps(plan: &EnvPlan, after: impl Fn(&NodePlan) -> Vec<String>) -> Vec<Value> {
    plan.nodes
        .iter()
        .map(|node| {
            step(
                format!("start_{}", node.index),
                format!("start the taskservs of {}", node.name),
                "start",
                plan,
                json!({"node": node.name}),
                after(node),
                2,
            )
        })
        .collect()
}

/// Make the nodes; install each node's taskservs with the production
/// scripts; start them (with `auto_start`).
pub(super) fn create_template(plan: &EnvPlan) -> Result<Template> {
    let mut steps = vec![step(
        "nodes".to_owned(),
        format!("make the nodes of {}", plan.name),
        "nodes",
        plan,
        json!({}),
        vec![],
        2,
    )];
    for node in &plan.nodes {
        steps.push(step(
            format!("install_{}", node.index),
            format!("install {} on {}", node.taskservs.join(", "), node.name),
            "install",
            plan,
            json!({"node": node.name}),
            vec!["nodes".to_owned()],
            2,
        ));
    }
    if plan.auto_start {
        steps.extend(start_steps(plan, |node| {
            vec![format!("install_{}", node.index)]
        }));
    }
    template(CREATE, "test environment", "fail", steps, true)
}

/// The checks, each on its own (a failed check stops none of the others);
/// the services first if the create did not start them.
pub(super) fn run_template(plan: &EnvPlan) -> Result<Template> {
    let mut steps = Vec::new();
    let mut after = Vec::new();
    if !plan.auto_start {
        steps.extend(start_steps(plan, |_| vec![]));
        after = plan
            .nodes
            .iter()
            .map(|n| format!("start_{}", n.index))
            .collect();
    }
    for (i, check) in plan.checks.iter().enumerate() {
        steps.push(check_step_value(plan, i, check, after.clone()));
    }
    template(RUN, "test run", "continue", steps, false)
}

fn check_step_value(plan: &EnvPlan, index: usize, check: &CheckPlan, after: Vec<String>) -> Value {
    step(
        check_step(index),
        format!("check {}", check.name),
        "check",
        plan,
        json!({"check": check}),
        after,
        0,
    )
}

pub(super) fn delete_template(plan: &EnvPlan) -> Result<Template> {
    let steps = vec![step(
        "teardown".to_owned(),
        format!("tear down {}", plan.name),
        "teardown",
        plan,
        json!({}),
        vec![],
        3,
    )];
    template(DELETE, "test environment teardown", "fail", steps, false)
}
