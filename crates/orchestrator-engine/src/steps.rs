//! The step kinds this engine runs, by the name templates use. The engine
//! asks for the runner of a task's kind and never looks further.

use std::collections::HashMap;
use std::sync::Arc;

use orchestrator_core::StepKind;
use orchestrator_executor::{InputRefusal, ScriptExecutor, StepRunner};
use serde_json::Value;

/// Runners by kind.
#[derive(Clone)]
pub struct Steps {
    by_kind: HashMap<StepKind, Arc<dyn StepRunner>>,
    /// The `script` runner, also known by its type: rollbacks are scripts
    /// whatever the step's kind, and callers ask for its configuration.
    scripts: ScriptExecutor,
}

impl Steps {
    /// The `script` kind, run by `scripts`. Other kinds are added with
    /// [`Steps::with`] by whoever builds the service (the `http` kind
    /// needs its allowlist).
    pub fn new(scripts: ScriptExecutor) -> Steps {
        let mut by_kind: HashMap<StepKind, Arc<dyn StepRunner>> = HashMap::new();
        by_kind.insert(StepKind::Script, Arc::new(scripts.clone()));
        Steps { by_kind, scripts }
    }

    pub fn scripts(&self) -> &ScriptExecutor {
        &self.scripts
    }

    /// Adds (or replaces) the runner of a kind.
    pub fn with(mut self, kind: StepKind, runner: Arc<dyn StepRunner>) -> Steps {
        self.by_kind.insert(kind, runner);
        self
    }

    /// The runner of `kind`; the reason if this engine has none.
    pub fn runner(&self, kind: StepKind) -> Result<&Arc<dyn StepRunner>, String> {
        self.by_kind
            .get(&kind)
            .ok_or_else(|| format!("this service cannot run steps of kind `{kind}`"))
    }

    /// Whether `target` can run as a step of `kind`.
    pub fn check(&self, kind: StepKind, target: &str) -> Result<(), String> {
        self.runner(kind)?.check(target)
    }

    /// Whether a step's input can run as a step of `kind`, as far as it is
    /// known (see [`StepRunner::check_input`]).
    pub fn check_input(&self, kind: StepKind, input: &Value) -> Result<(), InputRefusal> {
        self.runner(kind)
            .map_err(|message| InputRefusal {
                at: String::new(),
                message,
            })?
            .check_input(input)
    }
}
