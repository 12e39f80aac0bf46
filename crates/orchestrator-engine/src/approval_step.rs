//! The `approval` step kind: its name, its template block checked as a
//! step's input, and the gate a new task of the kind becomes. A gate is
//! never dispatched; its decisions are in `approvals`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::Task;
use orchestrator_core::TaskStatus;
use orchestrator_core::approval::{ApprovalPolicy, Gate};
use orchestrator_executor::{Attempt, InputRefusal, Outcome, StepRunner};
use serde_json::Value;

/// The kind's name, as templates write it.
pub const APPROVAL: &str = "approval";

/// The `approval` kind: its block is checked like any step's input; it is
/// never dispatched (a gate stays `pending` until decided), so `run` only
/// refuses.
pub struct ApprovalRunner;

#[async_trait]
impl StepRunner for ApprovalRunner {
    fn name(&self) -> &'static str {
        APPROVAL
    }

    fn input_field(&self) -> &'static str {
        "approval"
    }

    fn check(&self, _target: &str) -> std::result::Result<(), String> {
        Ok(())
    }

    fn check_input(&self, input: &Value) -> std::result::Result<(), InputRefusal> {
        // At load, `${workflow.input...}` may still stand in for a value.
        if input.to_string().contains("${") {
            return Ok(());
        }
        ApprovalPolicy::parse(input)
            .map(|_| ())
            .map_err(|(at, message)| InputRefusal {
                at: if at.is_empty() { at } else { format!(".{at}") },
                message,
            })
    }

    async fn run(&self, _attempt: Attempt<'_>) -> Outcome {
        Outcome::Failed {
            exit_code: None,
            error: "an approval step is decided through the API, never run".into(),
        }
    }

    fn stop_leftovers(&self, _task_id: &str) -> usize {
        0
    }
}

/// Makes a new task of `kind: approval` a gate: `pending` whatever its
/// dependencies, and open at once if it has none.
pub(crate) fn make_gate(task: &mut Task, submitter: Option<String>, now: DateTime<Utc>) {
    task.approval = Some(Box::new(Gate::new(submitter)));
    task.status = TaskStatus::Pending;
    if task.depends_on.is_empty()
        && let Ok(timeout) = ApprovalPolicy::parse(&task.input)
            .map_err(|_| ())
            .and_then(|p| p.timeout_duration().map_err(|_| ()))
    {
        task.open_gate(timeout, now);
    }
}
