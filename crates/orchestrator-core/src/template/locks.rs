//! A template's `locks:`: their validation (keys, modes, limits, the steps
//! named, the references in a name, environment variable names that
//! collide) and their resolution at submission into the [`LockClaim`]s
//! of each step's tasks.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::limits::{MAX_LOCK_LIMIT, MAX_LOCK_NAME_BYTES, MAX_LOCKS_PER_WORKFLOW};
use super::{Template, TemplateError, err};
use crate::lock::{self, LockClaim, LockMode};
use crate::refs::{Root, Scope, references_in};

/// Whether a resolved lock name is acceptable: 1 to
/// [`MAX_LOCK_NAME_BYTES`] bytes of letters, digits and `.`, `_`, `-`,
/// `:`, `/`, `@`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_LOCK_NAME_BYTES
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':' | b'/' | b'@')
        })
}

/// Checks every declared lock; errors name `locks.<key>` and the field.
pub(super) fn validate(template: &Template) -> Result<(), TemplateError> {
    if template.locks.len() > MAX_LOCKS_PER_WORKFLOW {
        return Err(err(
            "locks",
            format!(
                "{} locks exceed the limit of {MAX_LOCKS_PER_WORKFLOW} per template",
                template.locks.len()
            ),
        ));
    }
    let mut env_vars: HashMap<String, &str> = HashMap::new();
    for (key, spec) in &template.locks {
        let at = format!("locks.{key}");
        if !lock::valid_key(key) {
            return Err(err(
                &at,
                format!("`{key}` must be 1-63 letters, digits, `_` or `-`, starting with a letter"),
            ));
        }
        let var = lock::env_var(key);
        if let Some(other) = env_vars.insert(var.clone(), key) {
            return Err(err(
                &at,
                format!("`{key}` and `{other}` both give the environment variable {var}"),
            ));
        }
        if spec.name.trim().is_empty() {
            return Err(err(format!("{at}.name"), "must not be empty"));
        }
        for (path, reference) in
            references_in(&Value::String(spec.name.clone()), &format!("{at}.name"))
                .map_err(|(p, m)| err(p, m))?
        {
            let declared = matches!(
                (&reference.root, reference.path.first()),
                (Root::WorkflowInput, Some(crate::refs::Segment::Key(input)))
                    if template.inputs.contains_key(input)
            );
            if !declared {
                return Err(err(
                    path,
                    format!("{reference}: a lock name may only use declared workflow inputs"),
                ));
            }
        }
        match (spec.mode, spec.limit) {
            (LockMode::Exclusive, Some(_)) => {
                return Err(err(
                    format!("{at}.limit"),
                    "only a shared lock takes a limit (an exclusive one has one holder)",
                ));
            }
            (_, Some(n)) if !(1..=MAX_LOCK_LIMIT).contains(&n) => {
                return Err(err(
                    format!("{at}.limit"),
                    format!("{n} is out of range: must be from 1 to {MAX_LOCK_LIMIT}"),
                ));
            }
            _ => {}
        }
        for (i, step) in spec.steps.iter().enumerate() {
            if template.step(step).is_none() {
                return Err(err(
                    format!("{at}.steps[{i}]"),
                    format!("no step is named `{step}`"),
                ));
            }
        }
    }
    Ok(())
}

/// Whether the step `step` holds the lock declared under `key`.
pub(super) fn step_holds(template: &Template, key: &str, step: &str) -> bool {
    template
        .locks
        .get(key)
        .is_some_and(|spec| spec.steps.is_empty() || spec.steps.iter().any(|s| s == step))
}

/// Each step's locks, with their names resolved against the workflow's
/// inputs (after defaults). Two keys that resolve to one name are refused:
/// a workflow would wait for itself.
pub(super) fn resolve(
    template: &Template,
    inputs: &Value,
) -> Result<BTreeMap<String, Vec<LockClaim>>, TemplateError> {
    let scope = Scope {
        workflow_input: Some(inputs),
        check_mode: false,
        each: None,
        outputs: HashMap::new(),
    };
    let mut names: HashMap<String, &str> = HashMap::new();
    let mut claims = Vec::new();
    for (key, spec) in &template.locks {
        let at = format!("locks.{key}.name");
        let name = match scope
            .resolve(&Value::String(spec.name.clone()), &at)
            .map_err(|(p, m)| err(p, m))?
        {
            Value::String(name) => name,
            other => other.to_string(),
        };
        if !valid_name(&name) {
            return Err(err(
                &at,
                format!(
                    "`{name}` is not a lock name: 1-{} letters, digits, `.`, `_`, `-`, `:`, `/` or `@`",
                    super::limits::MAX_LOCK_NAME_BYTES
                ),
            ));
        }
        if let Some(other) = names.insert(name.clone(), key) {
            return Err(err(
                &at,
                format!("`{name}` is also the name of lock `{other}`"),
            ));
        }
        claims.push(LockClaim {
            key: key.clone(),
            name,
            mode: spec.mode,
            limit: spec.limit,
        });
    }
    let mut by_step = BTreeMap::new();
    for step in &template.steps {
        let mine: Vec<LockClaim> = claims
            .iter()
            .filter(|claim| step_holds(template, &claim.key, &step.ref_name))
            .cloned()
            .collect();
        if !mine.is_empty() {
            by_step.insert(step.ref_name.clone(), mine);
        }
    }
    Ok(by_step)
}
