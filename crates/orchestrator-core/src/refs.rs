//! `${...}` references inside template values, and their resolution.
//!
//! A string that is exactly one reference becomes the referenced JSON value
//! with its type (number, list, object). References inside a longer string
//! are interpolated as text. `$${` writes a literal `${`.
//!
//! Resolution is one pass over the template: a resolved value is never
//! scanned again, so a value that happens to contain `${...}` (an output, a
//! user input) stays plain text and can not inject a reference.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};

/// Where a reference points.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Root {
    /// `workflow.input.<key>`
    WorkflowInput,
    /// `workflow.check_mode`
    CheckMode,
    /// `each.<key>`: the current `for_each` values.
    Each,
    /// `<step>.output`
    StepOutput(String),
    /// `secrets.<name>`: left as this text in stored inputs, and put in
    /// only when a script's input is built (see the engine's secrets).
    Secret(String),
    /// `job.id`: the id of the job an `http` step launched. Known only
    /// while the step runs, so it stays this text in stored inputs and its
    /// runner puts the id in (poll and cancel requests only).
    Job,
    /// `locks.<key>.token`: the fencing token of the lock the template
    /// declares under `<key>`. Granted only when the step starts, so it
    /// stays this text in stored inputs and the engine puts it in.
    Lock(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A parsed `${...}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    pub root: Root,
    pub path: Vec<Segment>,
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            Root::WorkflowInput => f.write_str("${workflow.input")?,
            Root::CheckMode => f.write_str("${workflow.check_mode")?,
            Root::Each => f.write_str("${each")?,
            Root::StepOutput(step) => write!(f, "${{{step}.output")?,
            Root::Secret(name) => write!(f, "${{secrets.{name}")?,
            Root::Job => f.write_str("${job.id")?,
            Root::Lock(key) => write!(f, "${{locks.{key}.token")?,
        }
        for segment in &self.path {
            match segment {
                Segment::Key(key) => write!(f, ".{key}")?,
                Segment::Index(i) => write!(f, ".{i}")?,
            }
        }
        f.write_str("}")
    }
}

fn parse_reference(inner: &str) -> Result<Reference, String> {
    let mut parts = inner.split('.');
    let head = parts.next().unwrap_or_default().trim();
    let rest: Vec<&str> = parts.collect();
    let bad_segment = rest.iter().find(|s| {
        s.is_empty()
            || !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    });
    if let Some(segment) = bad_segment {
        return Err(format!("`${{{inner}}}` has an invalid part `{segment}`"));
    }
    let to_path = |parts: &[&str]| -> Vec<Segment> {
        parts
            .iter()
            .map(|p| match p.parse::<usize>() {
                Ok(i) => Segment::Index(i),
                Err(_) => Segment::Key((*p).to_owned()),
            })
            .collect()
    };
    match (head, rest.as_slice()) {
        ("workflow", ["input", key, more @ ..]) => {
            let mut path = vec![Segment::Key((*key).to_owned())];
            path.extend(to_path(more));
            Ok(Reference {
                root: Root::WorkflowInput,
                path,
            })
        }
        ("secrets", [name]) => Ok(Reference {
            root: Root::Secret((*name).to_owned()),
            path: vec![],
        }),
        ("locks", [key, "token"]) => Ok(Reference {
            root: Root::Lock((*key).to_owned()),
            path: vec![],
        }),
        ("job", ["id"]) => Ok(Reference {
            root: Root::Job,
            path: vec![],
        }),
        ("workflow", ["check_mode"]) => Ok(Reference {
            root: Root::CheckMode,
            path: vec![],
        }),
        ("each", [key, more @ ..]) => {
            let mut path = vec![Segment::Key((*key).to_owned())];
            path.extend(to_path(more));
            Ok(Reference {
                root: Root::Each,
                path,
            })
        }
        (step, ["output", more @ ..])
            if !step.is_empty()
                && step != "workflow"
                && step != "each"
                && step != "secrets"
                && step != "locks" =>
        {
            Ok(Reference {
                root: Root::StepOutput(step.to_owned()),
                path: to_path(more),
            })
        }
        _ => Err(format!(
            "`${{{inner}}}` is not a reference this engine knows \
             (expected workflow.input.<key>, workflow.check_mode, each.<key>, secrets.<name>, \
             <step>.output[.<key>], locks.<key>.token, or job.id in an http step)"
        )),
    }
}

/// A piece of a scanned string.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Ref(Reference),
}

/// Splits a string into text and references.
pub fn scan(text: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        literal.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(escaped) = after.strip_prefix("$${") {
            literal.push_str("${");
            rest = escaped;
        } else if let Some(open) = after.strip_prefix("${") {
            let end = open
                .find('}')
                .ok_or_else(|| format!("`{text}` has an unclosed `${{`"))?;
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(Piece::Ref(parse_reference(&open[..end])?));
            rest = &open[end + 1..];
        } else {
            literal.push('$');
            rest = &after[1..];
        }
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        pieces.push(Piece::Text(literal));
    }
    Ok(pieces)
}

/// Every reference in a value, with the JSON path where it stands.
pub fn references_in(
    value: &Value,
    at: &str,
) -> Result<Vec<(String, Reference)>, (String, String)> {
    let mut found = Vec::new();
    collect(value, at, &mut found)?;
    Ok(found)
}

fn collect(
    value: &Value,
    at: &str,
    found: &mut Vec<(String, Reference)>,
) -> Result<(), (String, String)> {
    match value {
        Value::String(s) => {
            for piece in scan(s).map_err(|e| (at.to_owned(), e))? {
                if let Piece::Ref(r) = piece {
                    found.push((at.to_owned(), r));
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect(item, &format!("{at}[{i}]"), found)?;
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                collect(item, &format!("{at}.{key}"), found)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The outputs a task can see of one step it depends on.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutputs {
    /// Exactly one matching instance: `${step.output.x}` is its `x`.
    One(Value),
    /// A `for_each` step seen as a whole: `${step.output.x}` is the list of
    /// every instance's `x`, in instance order.
    Many(Vec<Value>),
}

/// What references resolve against.
#[derive(Debug, Clone, Default)]
pub struct Scope<'a> {
    pub workflow_input: Option<&'a Value>,
    pub check_mode: bool,
    pub each: Option<&'a Value>,
    pub outputs: HashMap<String, StepOutputs>,
}

fn walk<'v>(mut value: &'v Value, path: &[Segment]) -> Option<&'v Value> {
    for segment in path {
        value = match (segment, value) {
            (Segment::Key(key), Value::Object(map)) => map.get(key)?,
            (Segment::Index(i), Value::Array(items)) => items.get(*i)?,
            (Segment::Key(key), Value::Array(items)) => {
                // `list.0` arrives as Index; a key on a list never matches.
                let _ = (key, items);
                return None;
            }
            _ => return None,
        };
    }
    Some(value)
}

impl Scope<'_> {
    pub fn lookup(&self, reference: &Reference) -> Result<Value, String> {
        let missing = || format!("{reference} does not exist");
        match &reference.root {
            Root::WorkflowInput => {
                let input = self.workflow_input.ok_or_else(missing)?;
                walk(input, &reference.path).cloned().ok_or_else(missing)
            }
            Root::CheckMode => Ok(Value::Bool(self.check_mode)),
            // Stays a reference: the value never enters a stored record
            // (a secret), or exists only while the step runs (a job id).
            Root::Secret(_) | Root::Job | Root::Lock(_) => Ok(Value::String(reference.to_string())),
            Root::Each => {
                let each = self
                    .each
                    .ok_or_else(|| format!("{reference}: this step has no for_each"))?;
                walk(each, &reference.path).cloned().ok_or_else(missing)
            }
            Root::StepOutput(step) => match self.outputs.get(step) {
                None => Err(format!(
                    "{reference}: step `{step}` is not a dependency of this step"
                )),
                Some(StepOutputs::One(output)) => {
                    walk(output, &reference.path).cloned().ok_or_else(|| {
                        format!("{reference}: the output of step `{step}` has no such key")
                    })
                }
                Some(StepOutputs::Many(outputs)) => outputs
                    .iter()
                    .map(|output| walk(output, &reference.path).cloned())
                    .collect::<Option<Vec<_>>>()
                    .map(Value::Array)
                    .ok_or_else(|| {
                        format!("{reference}: an output of step `{step}` has no such key")
                    }),
            },
        }
    }

    /// Resolves every reference in `value`; errors name the JSON path.
    pub fn resolve(&self, value: &Value, at: &str) -> Result<Value, (String, String)> {
        match value {
            Value::String(s) => self.resolve_string(s).map_err(|e| (at.to_owned(), e)),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| self.resolve(item, &format!("{at}[{i}]")))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
            Value::Object(map) => {
                let mut out = Map::with_capacity(map.len());
                for (key, item) in map {
                    out.insert(key.clone(), self.resolve(item, &format!("{at}.{key}"))?);
                }
                Ok(Value::Object(out))
            }
            other => Ok(other.clone()),
        }
    }

    fn resolve_string(&self, text: &str) -> Result<Value, String> {
        let pieces = scan(text)?;
        if let [Piece::Ref(reference)] = pieces.as_slice() {
            return self.lookup(reference);
        }
        let mut out = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => out.push_str(&t),
                Piece::Ref(r) => match self.lookup(&r)? {
                    Value::String(s) => out.push_str(&s),
                    other => out.push_str(&other.to_string()),
                },
            }
        }
        Ok(Value::String(out))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn scope<'a>(input: &'a Value, each: Option<&'a Value>) -> Scope<'a> {
        let mut outputs = HashMap::new();
        outputs.insert(
            "net".to_owned(),
            StepOutputs::One(json!({"cidr": "10.0.0.0/24", "ids": [7, 8]})),
        );
        outputs.insert(
            "vm".to_owned(),
            StepOutputs::Many(vec![json!({"ip": "10.0.0.2"}), json!({"ip": "10.0.0.3"})]),
        );
        Scope {
            workflow_input: Some(input),
            check_mode: true,
            each,
            outputs,
        }
    }

    #[test]
    fn a_whole_reference_keeps_its_json_type() {
        let input = json!({"count": 3, "servers": ["a", "b"], "net": {"zone": "eu"}});
        let s = scope(&input, None);
        assert_eq!(
            s.resolve(&json!("${workflow.input.count}"), "x").unwrap(),
            json!(3)
        );
        assert_eq!(
            s.resolve(&json!("${workflow.input.servers}"), "x").unwrap(),
            json!(["a", "b"])
        );
        assert_eq!(
            s.resolve(&json!("${workflow.input.net.zone}"), "x")
                .unwrap(),
            json!("eu")
        );
        assert_eq!(
            s.resolve(&json!("${workflow.input.servers.1}"), "x")
                .unwrap(),
            json!("b")
        );
        assert_eq!(
            s.resolve(&json!("${net.output.ids}"), "x").unwrap(),
            json!([7, 8])
        );
        assert_eq!(
            s.resolve(&json!("${vm.output.ip}"), "x").unwrap(),
            json!(["10.0.0.2", "10.0.0.3"])
        );
        assert_eq!(
            s.resolve(&json!("${workflow.check_mode}"), "x").unwrap(),
            json!(true)
        );
    }

    #[test]
    fn references_inside_text_are_interpolated() {
        let input = json!({"count": 3, "name": "web"});
        let each = json!({"server": "web-01"});
        let s = scope(&input, Some(&each));
        assert_eq!(
            s.resolve(&json!("${workflow.input.name}-${workflow.input.count} on ${each.server} in ${net.output.cidr}"), "x")
                .unwrap(),
            json!("web-3 on web-01 in 10.0.0.0/24")
        );
        assert_eq!(
            s.resolve(&json!("cost: $$5 and $${literal}"), "x").unwrap(),
            json!("cost: $$5 and ${literal}")
        );
    }

    #[test]
    fn resolved_values_are_never_scanned_again() {
        let input = json!({"evil": "${net.output.cidr}"});
        let s = scope(&input, None);
        assert_eq!(
            s.resolve(&json!("${workflow.input.evil}"), "x").unwrap(),
            json!("${net.output.cidr}")
        );
        assert_eq!(
            s.resolve(&json!("v=${workflow.input.evil}"), "x").unwrap(),
            json!("v=${net.output.cidr}")
        );
    }

    #[test]
    fn errors_name_the_path_and_the_reference() {
        let input = json!({});
        let s = scope(&input, None);
        let (at, message) = s
            .resolve(&json!({"a": [1, "${workflow.input.nope}"]}), "input")
            .unwrap_err();
        assert_eq!(at, "input.a[1]");
        assert!(message.contains("${workflow.input.nope}"), "{message}");
        let (_, message) = s.resolve(&json!("${net.output.missing}"), "x").unwrap_err();
        assert!(message.contains("no such key"), "{message}");
        let (_, message) = s.resolve(&json!("${other.output}"), "x").unwrap_err();
        assert!(message.contains("not a dependency"), "{message}");
    }

    #[test]
    fn bad_syntax_is_refused() {
        assert!(scan("${unclosed").is_err());
        assert!(scan("${workflow.inputs.x}").is_err());
        assert!(scan("${step.outputs}").is_err());
        assert!(scan("${a..b}").is_err());
        assert!(scan("${each}").is_err());
        assert_eq!(
            scan("no refs $ here").unwrap(),
            vec![Piece::Text("no refs $ here".into())]
        );
    }

    #[test]
    fn finds_every_reference_with_its_path() {
        let found = references_in(
            &json!({"a": "${x.output.ip}", "b": ["${workflow.input.k}"]}),
            "input",
        )
        .unwrap();
        let paths: Vec<_> = found
            .iter()
            .map(|(p, r)| (p.as_str(), r.root.clone()))
            .collect();
        assert_eq!(
            paths,
            vec![
                ("input.a", Root::StepOutput("x".into())),
                ("input.b[0]", Root::WorkflowInput)
            ]
        );
    }
}
