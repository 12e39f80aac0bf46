//! Workflow templates: parsing, validation, and expansion of one
//! submission into a DAG of tasks.
//!
//! Validation answers with a [`TemplateError`] whose `field` names the step
//! and the field at fault (`steps.join.input.members`), so the API can pass
//! it straight to the user.

pub mod condition;
pub mod http;
mod kinds;
pub mod limits;
mod locks;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use self::http::HttpStep;
pub use self::kinds::{StepInput, StepKinds};
pub use self::limits::{Limit, Limits, json_size};
use crate::refs::{Reference, Root, Scope, references_in};
use crate::{FailurePolicy, StepKind, StepSettings};

/// A template, as written in a YAML or JSON file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    pub name: String,
    pub ref_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub schema_version: u32,
    #[serde(default)]
    pub inputs: BTreeMap<String, InputSpec>,
    #[serde(default)]
    pub on_failure: FailurePolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_limit: Option<usize>,
    pub steps: Vec<StepTemplate>,
    /// Named resource locks the workflow holds (see docs/locks.md), by the
    /// key its steps know each one by.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub locks: BTreeMap<String, crate::lock::LockSpec>,
}

/// A workflow-level input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    #[serde(rename = "type", default)]
    pub kind: InputType,
    /// Used when the submission does not give the input; without one the
    /// input is required. `null` makes it optional.
    #[serde(
        default,
        deserialize_with = "some_even_if_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub default: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `name`: the value (or every string of a list value) must be a safe
    /// name: 1-63 letters, digits, `.`, `_` or `-`, starting with a letter
    /// or digit. For inputs that scripts turn into paths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<InputFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    Name,
}

/// Whether a string is a safe name (see [`InputFormat::Name`]).
pub fn is_safe_name(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_format(
    field: &str,
    format: Option<InputFormat>,
    value: &Value,
) -> Result<(), TemplateError> {
    let Some(InputFormat::Name) = format else {
        return Ok(());
    };
    let bad = |at: String, v: &Value| {
        err(
            at,
            format!(
                "{v} is not a valid name (1-63 letters, digits, `.`, `_` or `-`, starting with a letter or digit)"
            ),
        )
    };
    match value {
        Value::String(s) if is_safe_name(s) => Ok(()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) if is_safe_name(s) => {}
                    other => return Err(bad(format!("{field}[{i}]"), other)),
                }
            }
            Ok(())
        }
        Value::Null => Ok(()),
        other => Err(bad(field.to_owned(), other)),
    }
}

/// Makes user data literal: every `${` becomes `$${`, which resolves back
/// to `${` without being read as a reference.
fn literal(value: &Value) -> Value {
    match value {
        Value::String(s) => Value::String(s.replace("${", "$${")),
        Value::Array(items) => Value::Array(items.iter().map(literal).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), literal(v))).collect())
        }
        other => other.clone(),
    }
}

/// Tells `default: null` (optional, null) from no `default` (required).
fn some_even_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputType {
    #[default]
    Any,
    String,
    Number,
    Integer,
    Boolean,
    Array,
    Object,
}

impl InputType {
    fn accepts(self, value: &Value) -> bool {
        match self {
            InputType::Any => true,
            InputType::String => value.is_string(),
            InputType::Number => value.is_number(),
            InputType::Integer => value.is_i64() || value.is_u64(),
            InputType::Boolean => value.is_boolean(),
            InputType::Array => value.is_array(),
            InputType::Object => value.is_object(),
        }
    }
}

/// One step of a template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepTemplate {
    pub ref_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// What runs the step; `script` when not given.
    #[serde(default, skip_serializing_if = "StepKind::is_script")]
    pub kind: StepKind,
    /// The step's target: for a `script` step, the script path (required).
    /// An `http` step has none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub script: String,
    #[serde(default)]
    pub input: Map<String, Value>,
    /// What an `http` step sends and watches (`kind: http`); it becomes
    /// the task's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpStep>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// Who may approve a `kind: approval` step and what the approval
    /// covers (the approval policy, see docs/approvals.md); it becomes the
    /// task's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Map<String, Value>>,
    #[serde(default)]
    pub optional: bool,
    #[serde(default)]
    pub always_run: bool,
    /// Per-attempt timeout: seconds, or a string like `90s`, `5m`, `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Value>,
    /// Retries after the first attempt (so `retries: 2` means 3 attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<FailurePolicy>,
    /// Runs one instance per combination of these lists (each a workflow
    /// input reference), e.g. `{server: "${workflow.input.servers}"}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub for_each: BTreeMap<String, Value>,
    /// A `for_each` key whose instances run one after another, in list
    /// order, among instances that agree on the other keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequential: Option<String>,
    /// A condition (see `condition`): the step runs only if it is true
    /// when its dependencies are done; false skips it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
}

impl StepTemplate {
    /// What the step's tasks get as their input, before references
    /// resolve: `input`, or an http step's block. Once the template is
    /// validated, a step has an http block exactly when its kind takes one.
    pub fn input_value(&self) -> Value {
        match (&self.http, &self.approval) {
            (Some(_), _) => self.http_block(),
            (None, Some(block)) => Value::Object(block.clone()),
            (None, None) => Value::Object(self.input.clone()),
        }
    }

    /// The `http` block as JSON (`null` without one): what references are
    /// found in and what an http task's input is made of.
    fn http_block(&self) -> Value {
        self.http
            .as_ref()
            .and_then(|http| serde_json::to_value(http).ok())
            .unwrap_or(Value::Null)
    }

    /// What its tasks' `script` says: the script path, or `http:<ref_name>`
    /// for an http step (shown in listings, and the `script` label of
    /// the metrics, where a URL would make one series per job).
    fn target(&self) -> String {
        match (&self.http, &self.approval) {
            (Some(_), _) => format!("http:{}", self.ref_name),
            (None, Some(_)) => format!("approval:{}", self.ref_name),
            (None, None) => self.script.clone(),
        }
    }
}

/// A validation failure: `field` says where, `message` what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TemplateError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> TemplateError {
    TemplateError {
        field: field.into(),
        message: message.into(),
    }
}

/// One task of an expanded workflow.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTask {
    pub name: String,
    pub script: String,
    /// Final input, or `Null` when it waits for dependency outputs
    /// (then `step.input_template` holds it).
    pub input: Value,
    /// Indices of earlier planned tasks.
    pub depends_on: Vec<usize>,
    pub step: StepSettings,
    pub max_attempts: Option<u32>,
    pub timeout: Option<Duration>,
}

/// A template applied to a submission's inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Expansion {
    /// The workflow inputs after defaults.
    pub vars: Value,
    /// Tasks in a topological order.
    pub tasks: Vec<PlannedTask>,
    /// Step `ref_name`s in topological order.
    pub step_order: Vec<String>,
}

/// Whether `name` may be a template's or a step's `ref_name`: 1 to 100
/// letters, digits, `_` or `-`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

/// The longest duration a template or request may give (a timeout, a
/// poll interval): generous, and far enough from the clock's range that
/// adding it to an `Instant` or a `chrono` time can not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// Parses a duration: a number of seconds, or `<n>s`, `<n>m`, `<n>h`;
/// from one second to [`MAX_DURATION`].
pub fn parse_timeout(value: &Value) -> Result<Duration, String> {
    let too_long = || {
        format!(
            "{value} is longer than the maximum of {} seconds (30 days)",
            MAX_DURATION.as_secs()
        )
    };
    let seconds = match value {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("{n} is not a whole number of seconds"))?,
        Value::String(s) => {
            let s = s.trim();
            let (digits, unit) =
                s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
            let n: u64 = digits.parse().map_err(|_| {
                format!("`{s}` is not a duration like 90, \"90s\", \"5m\" or \"1h\"")
            })?;
            let per_unit = match unit {
                "" | "s" => 1,
                "m" => 60,
                "h" => 3600,
                _ => return Err(format!("`{s}` has an unknown unit (use s, m or h)")),
            };
            n.checked_mul(per_unit).ok_or_else(too_long)?
        }
        other => {
            return Err(format!(
                "{other} is not a duration like 90, \"90s\", \"5m\" or \"1h\""
            ));
        }
    };
    if seconds == 0 {
        return Err("must be at least one second".into());
    }
    if seconds > MAX_DURATION.as_secs() {
        return Err(too_long());
    }
    Ok(Duration::from_secs(seconds))
}

/// The most retries a step may ask for (so at most 100 attempts).
pub const MAX_RETRIES: u32 = 99;

/// The largest `parallel_limit` (of a template or a submission).
pub const MAX_PARALLEL_LIMIT: usize = 100_000;

impl Template {
    /// Parses YAML (JSON is YAML too, but gets JSON's error messages).
    pub fn parse(text: &str, is_json: bool) -> Result<Template, TemplateError> {
        if is_json {
            serde_json::from_str(text).map_err(|e| err("template", e.to_string()))
        } else {
            serde_norway::from_str(text).map_err(|e| err("template", e.to_string()))
        }
    }

    /// The step named `ref_name`, if the template has one.
    pub fn step(&self, ref_name: &str) -> Option<&StepTemplate> {
        self.steps.iter().find(|s| s.ref_name == ref_name)
    }

    /// Checks everything that does not depend on a submission's inputs,
    /// each step's kind against the `kinds` the service runs. Returns the
    /// step order (dependencies first).
    pub fn validate(&self, kinds: &StepKinds) -> Result<Vec<String>, TemplateError> {
        if self.name.trim().is_empty() {
            return Err(err("name", "must not be empty"));
        }
        if !valid_name(&self.ref_name) {
            return Err(err(
                "ref_name",
                format!(
                    "`{}` must be 1-100 letters, digits, `_` or `-`",
                    self.ref_name
                ),
            ));
        }
        if self.schema_version == 0 {
            return Err(err("schema_version", "must be at least 1"));
        }
        if let Some(n) = self
            .parallel_limit
            .filter(|n| !(1..=MAX_PARALLEL_LIMIT).contains(n))
        {
            return Err(err(
                "parallel_limit",
                format!("{n} is out of range: must be from 1 to {MAX_PARALLEL_LIMIT}"),
            ));
        }
        if self.steps.is_empty() {
            return Err(err("steps", "a template needs at least one step"));
        }
        for (name, spec) in &self.inputs {
            if !valid_name(name) || name == "steps" {
                return Err(err(
                    format!("inputs.{name}"),
                    "is not a valid input name (`steps` is reserved)",
                ));
            }
            if let Some(default) = spec.default.as_ref().filter(|d| !d.is_null())
                && !spec.kind.accepts(default)
            {
                return Err(err(
                    format!("inputs.{name}.default"),
                    format!("{default} is not of type {:?}", spec.kind).to_lowercase(),
                ));
            }
        }
        let mut seen = HashSet::new();
        for (i, step) in self.steps.iter().enumerate() {
            if !valid_name(&step.ref_name) {
                return Err(err(
                    format!("steps[{i}].ref_name"),
                    format!(
                        "`{}` must be 1-100 letters, digits, `_` or `-`",
                        step.ref_name
                    ),
                ));
            }
            if !seen.insert(step.ref_name.as_str()) {
                return Err(err(
                    format!("steps[{i}].ref_name"),
                    format!("`{}` is used by another step", step.ref_name),
                ));
            }
        }
        // Before the steps' references, which name the locks' keys.
        locks::validate(self)?;
        let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        // Names looked up by hash: a linear `step()` per dependency made a
        // template of n steps cost O(n²) to validate.
        let names: HashSet<&str> = self.steps.iter().map(|s| s.ref_name.as_str()).collect();
        for step in &self.steps {
            let at = format!("steps.{}", step.ref_name);
            self.validate_kind(step, &at, kinds)?;
            if let Some(timeout) = &step.timeout {
                parse_timeout(timeout).map_err(|m| err(format!("{at}.timeout"), m))?;
            }
            if let Some(r) = step.retries.filter(|&r| r > MAX_RETRIES) {
                return Err(err(
                    format!("{at}.retries"),
                    format!("{r} is out of range: must be from 0 to {MAX_RETRIES}"),
                ));
            }
            let mut deps: Vec<&str> = Vec::new();
            for (i, dep) in step.depends_on.iter().enumerate() {
                if dep == &step.ref_name {
                    return Err(err(
                        format!("{at}.depends_on[{i}]"),
                        "a step can not depend on itself",
                    ));
                }
                if !names.contains(dep.as_str()) {
                    return Err(err(
                        format!("{at}.depends_on[{i}]"),
                        format!("no step is named `{dep}`"),
                    ));
                }
                deps.push(dep);
            }
            for key in step.for_each.keys() {
                if !valid_name(key) {
                    return Err(err(
                        format!("{at}.for_each.{key}"),
                        "is not a valid key name",
                    ));
                }
            }
            if let Some(seq) = &step.sequential
                && !step.for_each.contains_key(seq)
            {
                return Err(err(
                    format!("{at}.sequential"),
                    format!("`{seq}` is not one of this step's for_each keys"),
                ));
            }
            for (field, value) in [
                (
                    "for_each",
                    Value::Object(step.for_each.clone().into_iter().collect()),
                ),
                ("input", Value::Object(step.input.clone())),
                ("http", step.http_block()),
                (
                    "approval",
                    step.approval
                        .clone()
                        .map(Value::Object)
                        .unwrap_or(Value::Null),
                ),
                (
                    "name",
                    step.name.clone().map(Value::String).unwrap_or(Value::Null),
                ),
            ] {
                let found =
                    references_in(&value, &format!("{at}.{field}")).map_err(|(p, m)| err(p, m))?;
                for (path, reference) in found {
                    self.check_reference(step, field, &path, &reference)?;
                    if let Root::StepOutput(dep) = &reference.root
                        && !deps.contains(&dep.as_str())
                    {
                        deps.push(
                            self.step(dep)
                                .map(|s| s.ref_name.as_str())
                                .unwrap_or_default(),
                        );
                    }
                }
            }
            if let Some(when) = &step.when {
                self.check_condition(step, when, &deps)?;
            }
            edges.insert(&step.ref_name, deps);
        }
        topological_order(&self.steps, &edges)
    }

    /// What a step of its kind needs: a known kind; a step that takes
    /// `input` names a script; an http step has its `http` block and
    /// nothing a script would take.
    fn validate_kind(
        &self,
        step: &StepTemplate,
        at: &str,
        kinds: &StepKinds,
    ) -> Result<(), TemplateError> {
        let input = kinds
            .input_of(step.kind)
            .map_err(|message| err(format!("{at}.kind"), message))?;
        if input != StepInput::Approval && step.approval.is_some() {
            return Err(err(
                format!("{at}.approval"),
                "only a step of `kind: approval` takes an approval block",
            ));
        }
        match (input, &step.http) {
            (StepInput::Approval, http) => {
                let Some(block) = &step.approval else {
                    return Err(err(
                        format!("{at}.approval"),
                        "a step of `kind: approval` needs an approval block",
                    ));
                };
                for (field, present) in [
                    ("script", !step.script.is_empty()),
                    ("input", !step.input.is_empty()),
                    ("http", http.is_some()),
                    ("rollback", step.rollback.is_some()),
                ] {
                    if present {
                        return Err(err(
                            format!("{at}.{field}"),
                            "an approval step runs nothing; it takes only its approval block",
                        ));
                    }
                }
                // Covered outputs must exist when the gate opens.
                if let Some(Value::Array(covers)) = block.get("covers") {
                    for (i, covered) in covers.iter().enumerate() {
                        let named = covered.as_str().unwrap_or_default();
                        if !step.depends_on.iter().any(|d| d == named) {
                            return Err(err(
                                format!("{at}.approval.covers[{i}]"),
                                format!("{covered} is not one of this step's depends_on"),
                            ));
                        }
                    }
                }
                Ok(())
            }
            (StepInput::Input, None) if step.script.trim().is_empty() => {
                Err(err(format!("{at}.script"), "must name a script"))
            }
            (StepInput::Input, None) => Ok(()),
            (StepInput::Input, Some(_)) => Err(err(
                format!("{at}.http"),
                "only a step of `kind: http` takes an http block",
            )),
            (StepInput::Http, None) => Err(err(
                format!("{at}.http"),
                "a step of `kind: http` needs an http block",
            )),
            (StepInput::Http, Some(http)) => {
                if !step.script.is_empty() {
                    return Err(err(
                        format!("{at}.script"),
                        "an http step runs no script; its requests are in `http`",
                    ));
                }
                if !step.input.is_empty() {
                    return Err(err(
                        format!("{at}.input"),
                        "an http step takes no input; its requests are in `http`",
                    ));
                }
                http.validate(&format!("{at}.http"))
            }
        }
    }

    /// A step's `when:` parses, and reads only declared inputs, its own
    /// `for_each` keys and the outputs of steps it depends on (`deps`).
    /// Errors name the step and the column.
    fn check_condition(
        &self,
        step: &StepTemplate,
        when: &str,
        deps: &[&str],
    ) -> Result<(), TemplateError> {
        let at = format!("steps.{}.when", step.ref_name);
        let refuse = |e: condition::ConditionError| err(&at, e.to_string());
        let parsed = condition::Condition::parse(when).map_err(refuse)?;
        for (column, reference) in parsed.references() {
            let path = condition::path_text(reference);
            let message = match &reference.root {
                Root::WorkflowInput => match reference.path.first() {
                    Some(crate::refs::Segment::Key(key)) if self.inputs.contains_key(key) => None,
                    _ => Some(format!(
                        "`{path}` reads an input the template does not declare in `inputs`"
                    )),
                },
                Root::CheckMode => None,
                Root::Each => match reference.path.first() {
                    Some(crate::refs::Segment::Key(key)) if step.for_each.contains_key(key) => None,
                    _ => Some(format!("`{path}`: this step has no such for_each key")),
                },
                Root::StepOutput(dep) if dep == &step.ref_name => {
                    Some(format!("`{path}`: a step can not use its own output"))
                }
                Root::StepOutput(dep) if self.step(dep).is_none() => Some(format!(
                    "`{path}` refers to step `{dep}`, which does not exist"
                )),
                Root::StepOutput(dep) if !deps.contains(&dep.as_str()) => Some(format!(
                    "`{path}`: step `{dep}` is not upstream of step `{}` (name it in depends_on)",
                    step.ref_name
                )),
                Root::StepOutput(_) => None,
                // The parser refuses these; kept out all the same.
                Root::Secret(_) | Root::Job | Root::Lock(_) => {
                    Some(format!("`{path}` can not be read by a condition"))
                }
            };
            if let Some(message) = message {
                return Err(refuse(condition::ConditionError { column, message }));
            }
        }
        Ok(())
    }

    fn check_reference(
        &self,
        step: &StepTemplate,
        field: &str,
        path: &str,
        reference: &Reference,
    ) -> Result<(), TemplateError> {
        if field == "http" {
            let inside = path
                .strip_prefix(&format!("steps.{}", step.ref_name))
                .unwrap_or(path);
            http::reference_allowed(inside, reference.root == Root::Job)
                .map_err(|m| err(path, format!("{reference}: {m}")))?;
        }
        match &reference.root {
            Root::WorkflowInput => {
                let Some(crate::refs::Segment::Key(key)) = reference.path.first() else {
                    return Err(err(path, format!("{reference} must name an input")));
                };
                if !self.inputs.contains_key(key) {
                    return Err(err(
                        path,
                        format!(
                            "{reference} refers to `{key}`, which the template does not declare in `inputs`"
                        ),
                    ));
                }
            }
            Root::CheckMode => {}
            Root::Lock(key) if locks::step_holds(self, key, &step.ref_name) => {}
            Root::Lock(key) => {
                return Err(err(
                    path,
                    format!(
                        "{reference}: step `{}` holds no lock declared as `{key}` in `locks`",
                        step.ref_name
                    ),
                ));
            }
            // Where it may stand was checked above, for an http block.
            Root::Job if field == "http" => {}
            Root::Job => {
                return Err(err(
                    path,
                    format!(
                        "{reference} can only be used in an http step's poll and cancel requests"
                    ),
                ));
            }
            // Whether it exists is known only where secrets are: at run time.
            Root::Secret(name) => {
                if !crate::access::valid_secret_name(name) {
                    return Err(err(
                        path,
                        format!("{reference}: `{name}` is not a secret name"),
                    ));
                }
            }
            Root::Each => {
                let Some(crate::refs::Segment::Key(key)) = reference.path.first() else {
                    return Err(err(path, format!("{reference} must name a for_each key")));
                };
                if field == "for_each" || !step.for_each.contains_key(key) {
                    return Err(err(
                        path,
                        format!("{reference}: this step has no for_each key `{key}`"),
                    ));
                }
            }
            Root::StepOutput(dep) => {
                if field != "input" && field != "http" {
                    return Err(err(
                        path,
                        format!(
                            "{reference}: step outputs can only be used in `input` (the {field} is fixed when the workflow is submitted)"
                        ),
                    ));
                }
                if dep == &step.ref_name {
                    return Err(err(
                        path,
                        format!("{reference}: a step can not use its own output"),
                    ));
                }
                if self.step(dep).is_none() {
                    return Err(err(
                        path,
                        format!("{reference} refers to step `{dep}`, which does not exist"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Applies a submission: checks and completes the inputs, then expands
    /// every step into tasks with their dependencies. Every count the
    /// `limits` bound is computed, and checked, before a task is built.
    pub fn expand(
        &self,
        kinds: &StepKinds,
        vars: &Map<String, Value>,
        check_mode: bool,
        limits: &Limits,
    ) -> Result<Expansion, TemplateError> {
        limits.check(
            "steps",
            Limit::TemplateSteps,
            u64::try_from(self.steps.len()).ok(),
        )?;
        let step_order = self.validate(kinds)?;
        // By name: `Template::step` is a linear search, and each step is
        // looked up here, which made a submission O(steps²).
        let by_name: HashMap<&str, &StepTemplate> = self
            .steps
            .iter()
            .map(|s| (s.ref_name.as_str(), s))
            .collect();
        let step_named = |name: &str| by_name.get(name).copied();
        let mut inputs = Map::new();
        for key in vars.keys() {
            if key != "steps" && !self.inputs.contains_key(key) {
                return Err(err(
                    format!("vars.{key}"),
                    format!("template `{}` has no input `{key}`", self.ref_name),
                ));
            }
        }
        for (key, spec) in &self.inputs {
            let value = match (vars.get(key), &spec.default) {
                (Some(value), _) => value.clone(),
                (None, Some(default)) => default.clone(),
                (None, None) => {
                    return Err(err(
                        format!("vars.{key}"),
                        format!("missing required input of template `{}`", self.ref_name),
                    ));
                }
            };
            let null_allowed = value.is_null() && spec.default.as_ref().is_some_and(Value::is_null);
            limits.check_list_input(&format!("vars.{key}"), &value)?;
            check_format(&format!("vars.{key}"), spec.format, &value)?;
            if !null_allowed && !spec.kind.accepts(&value) {
                return Err(err(
                    format!("vars.{key}"),
                    format!(
                        "expected {}, got {}",
                        type_name(spec.kind),
                        value_kind(&value)
                    ),
                ));
            }
            inputs.insert(key.clone(), value);
        }
        let per_step = match vars.get("steps") {
            None => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(other) => {
                return Err(err(
                    "vars.steps",
                    format!(
                        "expected an object of step inputs, got {}",
                        value_kind(other)
                    ),
                ));
            }
        };
        for (step, value) in &per_step {
            if step_named(step).is_none() {
                return Err(err(
                    format!("vars.steps.{step}"),
                    "no step has this ref_name",
                ));
            }
            if !value.is_object() {
                return Err(err(
                    format!("vars.steps.{step}"),
                    format!("expected an object, got {}", value_kind(value)),
                ));
            }
            if step_named(step).is_some_and(|s| s.http.is_some()) {
                return Err(err(
                    format!("vars.steps.{step}"),
                    "an http step takes no per-step input",
                ));
            }
            if step_named(step).is_some_and(|s| s.approval.is_some()) {
                return Err(err(
                    format!("vars.steps.{step}"),
                    "an approval step takes no per-step input",
                ));
            }
        }
        let vars_value = Value::Object(inputs);
        let step_locks = locks::resolve(self, &vars_value)?;
        let base_scope = Scope {
            workflow_input: Some(&vars_value),
            check_mode,
            ..Default::default()
        };

        // Counted first, from the lengths of the lists alone: a refusal
        // builds nothing (three lists of 300 would be 27 million tasks).
        // So are the dependency checks: each instance of a step is matched
        // against every instance of each step it depends on.
        let mut n_tasks = 0u64;
        let mut n_checks = 0u64;
        let mut instances_of: HashMap<&str, u64> = HashMap::new();
        let mut deps_of: HashMap<&str, Vec<&str>> = HashMap::new();
        for ref_name in &step_order {
            let step = step_named(ref_name).ok_or_else(|| err("steps", "internal: lost a step"))?;
            let at = format!("steps.{ref_name}");
            let lists = for_each_lists(step, &base_scope, &at)?;
            let lengths: Vec<(&str, usize)> = lists
                .iter()
                .map(|(key, items)| (key.as_str(), items.len()))
                .collect();
            let instances = limits.step_instances(&at, &lengths)?;
            n_tasks = limits.add_tasks(n_tasks, instances)?;
            let deps = step_dependencies(step, &step_named);
            for dep in &deps {
                let pairs = instances.checked_mul(instances_of.get(dep).copied().unwrap_or(0));
                n_checks =
                    limits::check_dependency_pairs(&format!("{at}.depends_on"), n_checks, pairs)?;
            }
            instances_of.insert(ref_name, instances);
            deps_of.insert(ref_name, deps);
        }

        let mut tasks: Vec<PlannedTask> = Vec::with_capacity(usize::try_from(n_tasks).unwrap_or(0));
        // Per step: (task index, each values) of its instances.
        let mut instances: HashMap<&str, Vec<Instance>> = HashMap::new();
        for ref_name in &step_order {
            let step = step_named(ref_name).ok_or_else(|| err("steps", "internal: lost a step"))?;
            let at = format!("steps.{ref_name}");
            let combos = for_each_combinations(step, &base_scope, &at)?;
            // An http step's block is its input: its references resolve
            // like a script's, at submission or at release.
            let mut input = step.input_value();
            if let (Some(Value::Object(extra)), Value::Object(input)) =
                (per_step.get(ref_name), &mut input)
            {
                // Per-step inputs are data, not template text: they can not
                // add references (or dependencies).
                input.extend(extra.iter().map(|(k, v)| (k.clone(), literal(v))));
            }
            let needs_outputs = references_in(&input, "")
                .map_err(|(p, m)| err(format!("{at}.input{p}"), m))?
                .iter()
                .any(|(_, r)| matches!(r.root, Root::StepOutput(_)));
            let deps_of_step = &deps_of[ref_name.as_str()];
            let timeout = step
                .timeout
                .as_ref()
                .map(parse_timeout)
                .transpose()
                .map_err(|m| err(format!("{at}.timeout"), m))?;
            let mut mine: Vec<Instance> = Vec::new();
            for each in combos {
                let each_value = each.clone().map(Value::Object);
                let scope = Scope {
                    each: each_value.as_ref(),
                    ..base_scope.clone()
                };
                let name = match &step.name {
                    Some(name) => match scope
                        .resolve(&Value::String(name.clone()), &format!("{at}.name"))
                        .map_err(|(p, m)| err(p, m))?
                    {
                        Value::String(s) => s,
                        other => other.to_string(),
                    },
                    None => match &each {
                        Some(values) => format!("{ref_name} [{}]", describe(values)),
                        None => ref_name.clone(),
                    },
                };
                let mut depends_on = Vec::new();
                for dep in deps_of_step {
                    for (index, dep_each) in
                        instances.get(dep).map(Vec::as_slice).unwrap_or_default()
                    {
                        if shares_values(each.as_ref(), dep_each.as_ref()) {
                            depends_on.push(*index);
                        }
                    }
                }
                if let (Some(seq), Some(values)) = (&step.sequential, &each) {
                    // The previous instance along the sequential key, among
                    // those that agree on every other key.
                    let previous = mine.iter().rev().find(|(_, other)| {
                        other.as_ref().is_some_and(|o| {
                            o.iter().all(|(k, v)| k == seq || values.get(k) == Some(v))
                        })
                    });
                    if let Some((index, _)) = previous {
                        depends_on.push(*index);
                    }
                }
                let (resolved, input_template) = if needs_outputs {
                    (Value::Null, Some(input.clone()))
                } else {
                    (
                        scope
                            .resolve(&input, &format!("{at}.input"))
                            .map_err(|(p, m)| err(p, m))?,
                        None,
                    )
                };
                tasks.push(PlannedTask {
                    name,
                    script: step.target(),
                    input: resolved,
                    depends_on,
                    step: StepSettings {
                        ref_name: Some(ref_name.clone()),
                        each: each_value,
                        input_template,
                        optional: step.optional,
                        always_run: step.always_run,
                        on_failure: step.on_failure,
                        rollback: step.rollback.clone(),
                        rollback_of: None,
                        kind: step.kind,
                        when: step.when.clone(),
                        locks: step_locks
                            .get(ref_name.as_str())
                            .cloned()
                            .unwrap_or_default(),
                    },
                    max_attempts: step.retries.map(|r| r + 1),
                    timeout,
                });
                mine.push((tasks.len() - 1, each));
            }
            instances.insert(ref_name, mine);
        }
        Ok(Expansion {
            vars: vars_value,
            tasks,
            step_order,
        })
    }
}

/// The steps `step` waits for: its `depends_on`, and those whose outputs
/// its input reads. (Per-step inputs of a submission are literal data and
/// add none.)
fn step_dependencies<'t>(
    step: &'t StepTemplate,
    step_named: &impl Fn(&str) -> Option<&'t StepTemplate>,
) -> Vec<&'t str> {
    let mut deps: Vec<&str> = step.depends_on.iter().map(String::as_str).collect();
    for (_, reference) in references_in(&step.input_value(), "").unwrap_or_default() {
        if let Root::StepOutput(dep) = reference.root
            && let Some(s) = step_named(&dep)
            && !deps.contains(&s.ref_name.as_str())
        {
            deps.push(&s.ref_name);
        }
    }
    deps
}

/// A planned instance of a step: its task index and `for_each` values.
type Instance = (usize, Option<Map<String, Value>>);

/// A step's `for_each` lists, resolved: `(key, items)` each.
fn for_each_lists(
    step: &StepTemplate,
    scope: &Scope<'_>,
    at: &str,
) -> Result<Vec<(String, Vec<Value>)>, TemplateError> {
    let mut lists = Vec::with_capacity(step.for_each.len());
    for (key, expression) in &step.for_each {
        let field = format!("{at}.for_each.{key}");
        match scope
            .resolve(expression, &field)
            .map_err(|(p, m)| err(p, m))?
        {
            Value::Array(items) => lists.push((key.clone(), items)),
            other => {
                return Err(err(
                    field,
                    format!("must be a list, got {}", value_kind(&other)),
                ));
            }
        }
    }
    Ok(lists)
}

/// Every combination of a step's `for_each` lists, or one empty instance.
/// Its count was checked against the limits before.
fn for_each_combinations(
    step: &StepTemplate,
    scope: &Scope<'_>,
    at: &str,
) -> Result<Vec<Option<Map<String, Value>>>, TemplateError> {
    if step.for_each.is_empty() {
        return Ok(vec![None]);
    }
    let mut combos = vec![Map::new()];
    for (key, items) in &for_each_lists(step, scope, at)? {
        combos = combos
            .into_iter()
            .flat_map(|combo| {
                items.iter().map(move |item| {
                    let mut next = combo.clone();
                    next.insert(key.clone(), item.clone());
                    next
                })
            })
            .collect();
    }
    Ok(combos.into_iter().map(Some).collect())
}

/// Instance `a` depends on instance `b` of a dependency step when they
/// agree on every `for_each` key they share (all of `b`, if none is shared).
fn shares_values(a: Option<&Map<String, Value>>, b: Option<&Map<String, Value>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.iter().all(|(k, v)| b.get(k).is_none_or(|w| w == v)),
        _ => true,
    }
}

fn describe(values: &Map<String, Value>) -> String {
    values
        .iter()
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn type_name(kind: InputType) -> &'static str {
    match kind {
        InputType::Any => "any value",
        InputType::String => "a string",
        InputType::Number => "a number",
        InputType::Integer => "an integer",
        InputType::Boolean => "a boolean",
        InputType::Array => "an array",
        InputType::Object => "an object",
    }
}

pub fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Kahn's algorithm in declaration order; on a cycle, names it.
/// The steps in dependency order: each time, the first step in template
/// order whose dependencies are all placed (Kahn's algorithm with the
/// ready steps in a min-heap of template positions). O((steps + edges)
/// log steps): a template of 10,000 steps must not cost seconds to
/// submit (issue 18).
fn topological_order(
    steps: &[StepTemplate],
    edges: &BTreeMap<&str, Vec<&str>>,
) -> Result<Vec<String>, TemplateError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    let position: HashMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.ref_name.as_str(), i))
        .collect();
    // Per step, how many of its (distinct) dependencies are not placed
    // yet, and which steps wait for it.
    let mut waiting_on = vec![0usize; steps.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, step) in steps.iter().enumerate() {
        let named = &edges[step.ref_name.as_str()];
        let mut deps: Vec<usize> = named
            .iter()
            .filter_map(|d| position.get(d).copied())
            .collect();
        deps.sort_unstable();
        deps.dedup();
        // A dependency that is no step can never be placed: the step stays
        // out, as part of the "cycle" reported below.
        let unknown = named.iter().any(|d| !position.contains_key(d));
        waiting_on[i] = deps.len() + usize::from(unknown);
        for d in deps {
            dependents[d].push(i);
        }
    }
    let mut ready: BinaryHeap<Reverse<usize>> = (0..steps.len())
        .filter(|&i| waiting_on[i] == 0)
        .map(Reverse)
        .collect();
    let mut order = Vec::with_capacity(steps.len());
    while let Some(Reverse(i)) = ready.pop() {
        order.push(steps[i].ref_name.clone());
        for &d in &dependents[i] {
            waiting_on[d] -= 1;
            if waiting_on[d] == 0 {
                ready.push(Reverse(d));
            }
        }
    }
    if order.len() < steps.len() {
        let remaining: Vec<&str> = steps
            .iter()
            .enumerate()
            .filter(|(i, _)| waiting_on[*i] > 0)
            .map(|(_, s)| s.ref_name.as_str())
            .collect();
        let cycle = find_cycle(&remaining, edges);
        return Err(err(
            format!("steps.{}.depends_on", cycle[0]),
            format!("dependency cycle: {}", cycle.join(" -> ")),
        ));
    }
    Ok(order)
}

fn find_cycle<'a>(remaining: &[&'a str], edges: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<&'a str> {
    // Every remaining step has a remaining dependency: walk them until a
    // step repeats, which closes the cycle.
    let mut path = vec![remaining[0]];
    loop {
        let current = path[path.len() - 1];
        let next = edges[current]
            .iter()
            .copied()
            .find(|d| remaining.contains(d))
            .unwrap_or(current);
        if let Some(start) = path.iter().position(|p| *p == next) {
            let mut cycle = path[start..].to_vec();
            cycle.push(next);
            return cycle;
        }
        path.push(next);
    }
}

#[cfg(test)]
mod tests;
