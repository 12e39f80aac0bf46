//! A step whose future panics fails its attempt with the panic's message,
//! instead of leaving its task `running` under a lease renewed for ever.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use orchestrator_core::TaskStatus;
use orchestrator_engine::steps::Steps;
use orchestrator_engine::templates::Templates;
use orchestrator_engine::{Engine, EngineConfig};
use orchestrator_executor::{Attempt, ExecutorConfig, Outcome, ScriptExecutor, StepRunner};
use serde_json::json;

use super::{Setup, request_of};

/// A step kind that exists only here: every attempt panics.
struct Panicking;

#[async_trait::async_trait]
impl StepRunner for Panicking {
    fn name(&self) -> &'static str {
        "panicking"
    }

    fn check(&self, _target: &str) -> Result<(), String> {
        Ok(())
    }

    async fn run(&self, _attempt: Attempt<'_>) -> Outcome {
        panic!("the test step gave up")
    }

    fn stop_leftovers(&self, _task_id: &str) -> usize {
        0
    }
}

#[tokio::test]
async fn a_step_that_panics_fails_its_attempt_with_the_reason() {
    let setup = Setup::new();
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
    let steps = Steps::new(scripts).with(Arc::new(Panicking));
    let engine = Engine::start_with_steps(
        setup.fs().await,
        steps,
        Templates::default(),
        EngineConfig {
            workers: 1,
            ..EngineConfig::default()
        },
    )
    .await
    .unwrap();
    // Two independent steps on one worker: the one after the panic runs
    // too, so the worker survived it.
    let mut request = request_of(json!([
        {"ref_name": "boom", "kind": "panicking", "script": "anything"},
        {"ref_name": "after", "script": "mark.sh"}
    ]));
    request.max_attempts = Some(1);
    let (view, _) = engine.submit(request).await.unwrap();
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(60))
            .await
            .unwrap(),
        "the workflow ends"
    );
    let view = engine.workflow(view.workflow.id).await.unwrap();
    let boom = &view.tasks[0];
    assert_eq!(boom.status, TaskStatus::Failed);
    let error = boom.error.clone().unwrap_or_default();
    assert!(
        error.contains("the step panicked: the test step gave up"),
        "{error}"
    );
    assert_eq!(view.tasks[1].status, TaskStatus::Completed);
    assert!(
        !setup.ran().is_empty(),
        "the next step ran on the same worker"
    );
}
