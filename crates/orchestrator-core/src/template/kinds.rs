//! The step kinds a template may use, as a service's runners declare them:
//! each kind's name and the template field its steps take their input
//! from. The core names no kind here; the engine builds the catalogue from
//! the runners it registers, so a new kind needs no change to the core.

use crate::StepKind;

/// The field of a template step that becomes its tasks' input (and that
/// errors about the input name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepInput {
    /// The step's `input` object; the step names its target in `script`.
    Input,
    /// The step's `http` block (see [`crate::http`]); the step has no
    /// `script` and no `input`.
    Http,
    /// The step's `approval` block (docs/approvals.md); the step has no
    /// `script` and no `input`.
    Approval,
}

impl StepInput {
    const ALL: [StepInput; 3] = [StepInput::Input, StepInput::Http, StepInput::Approval];

    /// The template field, as it is written.
    pub fn field(self) -> &'static str {
        match self {
            StepInput::Input => "input",
            StepInput::Http => "http",
            StepInput::Approval => "approval",
        }
    }

    /// The field a runner declares, by its name.
    pub fn from_field(field: &str) -> Result<StepInput, String> {
        StepInput::ALL
            .into_iter()
            .find(|input| input.field() == field)
            .ok_or_else(|| {
                format!("`{field}` is not a template field a step's input can come from (expected input, http or approval)")
            })
    }
}

/// The kinds a service runs, in the order they were registered, each with
/// the field its steps take their input from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepKinds {
    kinds: Vec<(StepKind, StepInput)>,
}

impl StepKinds {
    pub fn new() -> StepKinds {
        StepKinds::default()
    }

    /// Adds `kind`, or changes the field of a kind already there.
    pub fn insert(&mut self, kind: StepKind, input: StepInput) {
        match self.kinds.iter_mut().find(|(known, _)| *known == kind) {
            Some(entry) => entry.1 = input,
            None => self.kinds.push((kind, input)),
        }
    }

    /// `insert`, as a builder.
    pub fn with(mut self, kind: StepKind, input: StepInput) -> StepKinds {
        self.insert(kind, input);
        self
    }

    /// The field a step of `kind` takes its input from; for a kind this
    /// service does not run, the error a template gets, naming the kinds
    /// it could have used.
    pub fn input_of(&self, kind: StepKind) -> Result<StepInput, String> {
        self.kinds
            .iter()
            .find(|(known, _)| *known == kind)
            .map(|(_, input)| *input)
            .ok_or_else(|| {
                let known: Vec<&str> = self.names().collect();
                format!(
                    "unknown step kind `{kind}` (expected one of {})",
                    known.join(", ")
                )
            })
    }

    /// The kinds' names, in the order they were registered.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.kinds.iter().map(|(kind, _)| kind.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(name: &str) -> StepKind {
        StepKind::new(name).unwrap()
    }

    #[test]
    fn an_unknown_kind_is_named_with_the_known_ones() {
        let kinds = StepKinds::new()
            .with(StepKind::script(), StepInput::Input)
            .with(kind("http"), StepInput::Http);
        assert_eq!(kinds.input_of(kind("http")), Ok(StepInput::Http));
        assert_eq!(
            kinds.input_of(kind("teleport")),
            Err("unknown step kind `teleport` (expected one of script, http)".to_owned())
        );
    }

    #[test]
    fn a_kind_registered_again_keeps_its_place_and_takes_the_new_field() {
        let kinds = StepKinds::new()
            .with(kind("a"), StepInput::Input)
            .with(kind("b"), StepInput::Input)
            .with(kind("a"), StepInput::Http);
        assert_eq!(kinds.names().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(kinds.input_of(kind("a")), Ok(StepInput::Http));
    }

    #[test]
    fn a_runner_declares_its_field_by_name() {
        assert_eq!(StepInput::from_field("http"), Ok(StepInput::Http));
        assert_eq!(StepInput::from_field("input"), Ok(StepInput::Input));
        assert!(
            StepInput::from_field("body")
                .unwrap_err()
                .contains("`body`")
        );
    }
}
