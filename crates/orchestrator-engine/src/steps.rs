//! The step kinds this engine runs, by the name templates use. Each runner
//! declares its kind's name and the template field its input comes from;
//! the engine asks for the runner of a task's kind and never looks further.

use std::collections::HashMap;
use std::sync::Arc;

use orchestrator_core::StepKind;
use orchestrator_core::template::{StepInput, StepKinds};
use orchestrator_executor::{InputRefusal, ScriptExecutor, StepRunner};
use serde_json::Value;

/// Runners by kind.
#[derive(Clone)]
pub struct Steps {
    by_kind: HashMap<StepKind, Arc<dyn StepRunner>>,
    /// What templates are checked against: every registered kind, in the
    /// order registered, with its input field.
    kinds: StepKinds,
    /// The `script` runner, also known by its type: rollbacks are scripts
    /// whatever the step's kind, and callers ask for its configuration.
    scripts: ScriptExecutor,
}

impl Steps {
    /// The `script` kind, run by `scripts`. Other kinds are added with
    /// [`Steps::with`] by whoever builds the service (the `http` kind
    /// needs its allowlist).
    pub fn new(scripts: ScriptExecutor) -> Steps {
        Steps {
            by_kind: HashMap::new(),
            kinds: StepKinds::new(),
            scripts: scripts.clone(),
        }
        .with(Arc::new(scripts))
        // Gates run nothing and need nothing of the service: every
        // engine decides them.
        .with(Arc::new(crate::approval_step::ApprovalRunner))
    }

    pub fn scripts(&self) -> &ScriptExecutor {
        &self.scripts
    }

    /// Adds (or replaces) the runner of the kind it declares.
    ///
    /// # Panics
    ///
    /// If the runner's name is no kind name, or its input field is none
    /// of a template's: a mistake in the runner's code, which any start
    /// of a service with it shows.
    pub fn with(mut self, runner: Arc<dyn StepRunner>) -> Steps {
        let declared = StepKind::new(runner.name())
            .and_then(|kind| Ok((kind, StepInput::from_field(runner.input_field())?)));
        let (kind, input) = match declared {
            Ok(declared) => declared,
            Err(e) => panic!("step runner `{}`: {e}", runner.name()),
        };
        self.kinds.insert(kind, input);
        self.by_kind.insert(kind, runner);
        self
    }

    /// Every kind this engine runs, with the template field of its input.
    pub fn kinds(&self) -> &StepKinds {
        &self.kinds
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

    /// The template field a step of `kind` takes its input from, as
    /// errors about the input name it (`input` for a kind this engine
    /// does not run: template validation refuses those first).
    pub fn input_field(&self, kind: StepKind) -> &'static str {
        self.kinds
            .input_of(kind)
            .map_or(StepInput::Input.field(), StepInput::field)
    }
}
