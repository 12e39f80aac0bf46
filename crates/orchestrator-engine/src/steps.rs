//! The step kinds this engine runs, by the name templates use. The engine
//! asks for the runner of a task's kind and never looks further.

use std::collections::HashMap;
use std::sync::Arc;

use orchestrator_core::StepKind;
use orchestrator_executor::{ScriptExecutor, StepRunner};

/// Runners by kind.
#[derive(Clone)]
pub struct Steps {
    by_kind: HashMap<StepKind, Arc<dyn StepRunner>>,
}

impl Steps {
    /// The built-in kinds: `script`, run by `scripts`.
    pub fn new(scripts: ScriptExecutor) -> Steps {
        let mut by_kind: HashMap<StepKind, Arc<dyn StepRunner>> = HashMap::new();
        by_kind.insert(StepKind::Script, Arc::new(scripts));
        Steps { by_kind }
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
}
