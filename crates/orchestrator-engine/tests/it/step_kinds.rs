//! A step kind is a runner registered with the engine under the name it
//! declares: a kind that exists only in this test runs a template's steps
//! with no change to the core, and a kind no runner declares is refused
//! by name, with the kinds the engine runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orchestrator_core::TaskStatus;
use orchestrator_engine::steps::Steps;
use orchestrator_engine::templates::Templates;
use orchestrator_engine::{Engine, EngineConfig, Error};
use orchestrator_executor::{
    Attempt, ExecutorConfig, InputRefusal, Outcome, ScriptExecutor, StepRunner,
};
use serde_json::json;

use super::{Setup, request_of};

/// The `greet` kind: its target is a greeting, its input names whom to
/// greet, and its output is the greeting.
struct Greeter;

#[async_trait::async_trait]
impl StepRunner for Greeter {
    fn name(&self) -> &'static str {
        "greet"
    }

    fn check(&self, target: &str) -> Result<(), String> {
        match target {
            "hello" | "goodbye" => Ok(()),
            other => Err(format!("`{other}` is not a greeting")),
        }
    }

    fn check_input(&self, input: &serde_json::Value) -> Result<(), InputRefusal> {
        match input.get("name") {
            Some(_) => Ok(()),
            None => Err(InputRefusal {
                at: ".name".into(),
                message: "whom to greet is missing".into(),
            }),
        }
    }

    async fn run(&self, attempt: Attempt<'_>) -> Outcome {
        let name = attempt.input["name"].as_str().unwrap_or("nobody");
        Outcome::Succeeded {
            output: json!({"greeting": format!("{}, {name}", attempt.target)}),
        }
    }

    fn stop_leftovers(&self, _task_id: &str) -> usize {
        0
    }
}

async fn engine(setup: &Setup, steps: impl FnOnce(Steps) -> Steps) -> Engine {
    let scripts = ScriptExecutor::new(ExecutorConfig {
        scripts_dir: setup.dir.path().join("scripts"),
        work_dir: setup.dir.path().join("work"),
        data_dir: setup.dir.path().join("data"),
        kill_grace: Duration::from_millis(200),
        interpreters: HashMap::new(),
        service_url: None,
        sandbox: orchestrator_executor::Sandbox::None,
    })
    .unwrap();
    Engine::start_with_steps(
        setup.fs().await,
        steps(Steps::new(scripts)),
        Templates::default(),
        EngineConfig::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_kind_registered_with_the_engine_runs_its_steps() {
    let setup = Setup::new();
    let engine = engine(&setup, |steps| steps.with(Arc::new(Greeter))).await;
    let (view, _) = engine
        .submit(request_of(json!([
            {"ref_name": "hi", "kind": "greet", "script": "hello", "input": {"name": "ada"}},
            {"ref_name": "after", "script": "mark.sh", "depends_on": ["hi"],
             "input": {"greeting": "${hi.output.greeting}"}}
        ])))
        .await
        .unwrap();
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let view = engine.workflow(view.workflow.id).await.unwrap();
    let (hi, after) = (&view.tasks[0], &view.tasks[1]);
    assert_eq!(hi.status, TaskStatus::Completed, "{:?}", hi.error);
    assert_eq!(hi.output, Some(json!({"greeting": "hello, ada"})));
    assert_eq!(after.status, TaskStatus::Completed, "{:?}", after.error);
    assert_eq!(after.input, json!({"greeting": "hello, ada"}));
    // The kind is stored by its name.
    let stored = serde_json::to_value(engine.task(hi.id).await.unwrap()).unwrap();
    assert_eq!(stored["step"]["kind"], "greet");
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_registered_kind_checks_its_steps_and_names_its_input_field() {
    let setup = Setup::new();
    let engine = engine(&setup, |steps| steps.with(Arc::new(Greeter))).await;
    for (step, field, message) in [
        (
            json!({"ref_name": "hi", "kind": "greet", "script": "howdy", "input": {"name": "ada"}}),
            "template.steps.hi.script",
            "`howdy` is not a greeting",
        ),
        (
            json!({"ref_name": "hi", "kind": "greet", "script": "hello"}),
            "template.steps.hi.input.name",
            "whom to greet is missing",
        ),
    ] {
        let e = engine.submit(request_of(json!([step]))).await.unwrap_err();
        let Error::Validation {
            field: at,
            message: why,
        } = &e
        else {
            panic!("not a validation error: {e}");
        };
        assert_eq!((at.as_str(), why.as_str()), (field, message));
    }
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_kind_no_runner_declares_is_refused_with_the_known_ones() {
    let setup = Setup::new();
    let engine = engine(&setup, |steps| steps).await;
    let e = engine
        .submit(request_of(json!([
            {"ref_name": "hi", "kind": "greet", "script": "hello", "input": {"name": "ada"}}
        ])))
        .await
        .unwrap_err();
    let Error::Validation { field, message } = &e else {
        panic!("not a validation error: {e}");
    };
    assert_eq!(field, "template.steps.hi.kind");
    assert_eq!(
        message,
        "unknown step kind `greet` (expected one of script, approval)"
    );
    engine.shutdown(Duration::from_secs(5)).await;
}
