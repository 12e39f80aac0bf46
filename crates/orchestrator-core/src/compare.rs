//! Comparing two runs of one template (two workflows, or two revisions of
//! one): their inputs, template revision, and step by step the status,
//! duration, script hash, outputs and the first line where the logs part.
//!
//! Plain data in, plain data out: the engine reads the workflows, their
//! tasks, the scripts' hashes and the first piece of each step's log, and
//! hands them here. The API, the CLI's `workflow diff` and the dashboard's
//! compare page all show this one answer, so a difference is found once.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus};

/// Most bytes of each step's log that are compared.
pub const LOG_COMPARE_BYTES: usize = 64 * 1024;
/// Most lines of each step's log that are compared.
pub const LOG_COMPARE_LINES: usize = 2_000;
/// Most characters of a differing log line shown; a log line can be
/// as long as the log.
pub const LOG_LINE_SHOWN_CHARS: usize = 500;
/// Most steps (per run) whose logs are read: a 1,000-step workflow's
/// comparison reads at most this many logs a side.
pub const LOG_COMPARE_STEPS: usize = 200;

/// One run as the comparison reads it.
pub struct Run<'a> {
    pub workflow: &'a Workflow,
    pub tasks: &'a [Task],
    /// The template's revision as an approval's digest names it:
    /// `<name>@<version> sha256:<hash>`.
    pub template_revision: String,
    /// SHA-256 of each script by path (`missing` when unreadable).
    pub script_hashes: &'a BTreeMap<String, String>,
    /// The first piece of each task's log that was read, by task.
    pub logs: &'a HashMap<TaskId, LogExcerpt>,
}

/// The start of a log: up to [`LOG_COMPARE_BYTES`] of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogExcerpt {
    pub bytes: Vec<u8>,
    /// The log goes on past `bytes`.
    pub capped: bool,
}

impl LogExcerpt {
    /// From a read of up to `LOG_COMPARE_BYTES + 1` bytes: one more than is
    /// compared tells whether the log goes on.
    pub fn from_read(mut bytes: Vec<u8>) -> LogExcerpt {
        let capped = bytes.len() > LOG_COMPARE_BYTES;
        bytes.truncate(LOG_COMPARE_BYTES);
        LogExcerpt { bytes, capped }
    }
}

/// How a key (an input, an output) or a step compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Change {
    Same,
    Changed,
    /// Only in run `a`.
    OnlyA,
    /// Only in run `b`.
    OnlyB,
}

/// Two runs side by side: `GET /workflows/{a}/compare/{b}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Comparison {
    pub a: RunSummary,
    pub b: RunSummary,
    /// Both are revisions of one `meta.ref` (a re-run, or a resubmission).
    pub revisions: bool,
    /// Whether the template revisions differ (`template_revision` of `a` and `b`).
    pub template_changed: bool,
    /// Each key of the workflows' inputs (after defaults), in key order.
    pub inputs: Vec<KeyChange>,
    /// Each step (each `for_each` instance), in run `a`'s order, then
    /// those only in `b`.
    pub steps: Vec<StepComparison>,
    pub summary: ComparisonSummary,
    pub limits: CompareLimits,
}

/// What the comparison found, counted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ComparisonSummary {
    /// Input keys that changed or are in one run only.
    pub inputs_changed: usize,
    /// Steps that differ in anything but their duration.
    pub steps_differing: usize,
    pub steps: usize,
    /// Steps whose logs were compared only up to the limit.
    pub logs_capped: usize,
    /// Everything compared is the same (durations aside).
    pub same: bool,
}

/// The bounds of the comparison, so a reader knows what was not looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CompareLimits {
    pub log_bytes_per_step: usize,
    pub log_lines_per_step: usize,
    pub logged_steps: usize,
    pub line_chars_shown: usize,
}

impl Default for CompareLimits {
    fn default() -> Self {
        CompareLimits {
            log_bytes_per_step: LOG_COMPARE_BYTES,
            log_lines_per_step: LOG_COMPARE_LINES,
            logged_steps: LOG_COMPARE_STEPS,
            line_chars_shown: LOG_LINE_SHOWN_CHARS,
        }
    }
}

/// One run's identity and outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunSummary {
    pub id: WorkflowId,
    pub name: String,
    /// The template's `ref_name`.
    pub template: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_version: Option<u32>,
    /// `<name>@<version> sha256:<hash of the template>`, as an approval's
    /// digest names it.
    pub template_revision: String,
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    pub revision: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_revision: Option<WorkflowId>,
    pub status: WorkflowStatus,
    pub created_at: DateTime<Utc>,
    /// From its start to its end, once both happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// One key of two objects (inputs, a step's outputs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyChange {
    /// The key; empty for an output that is not an object (the whole value).
    pub key: String,
    pub change: Change,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<Value>,
}

/// One step (or `for_each` instance) in both runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepComparison {
    /// How steps are matched: the step's `ref_name`, and for a `for_each`
    /// instance its values, `name[{"host":"a"}]`.
    pub key: String,
    pub ref_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub each: Option<Value>,
    /// `same` when nothing but the duration differs; `only_a`/`only_b`
    /// when one run has no such step.
    pub change: Change,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a: Option<StepRun>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<StepRun>,
    pub status_changed: bool,
    pub script_changed: bool,
    /// Output keys that differ (the same ones are only counted).
    pub outputs: Vec<KeyChange>,
    pub outputs_same: usize,
    /// Present when the step is in both runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<LogComparison>,
}

/// A step's task in one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepRun {
    pub task_id: TaskId,
    pub status: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// What it runs: a script path (or an http step's target).
    pub script: String,
    /// SHA-256 of the script as it is on disk now (the service does not
    /// record it at submission); absent for a step that runs no script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script_hash: Option<String>,
    /// In a re-run: the earlier revision's task whose output it kept
    /// (its log is that task's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_from: Option<TaskId>,
}

/// Where two logs part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogComparison {
    pub outcome: LogOutcome,
    /// The first differing line, from 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// Run `a`'s line there (absent: its log ended before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub b: Option<String>,
    /// Lines compared (equal ones, plus the differing one).
    pub lines_compared: usize,
    /// A log went on past the limit: the rest was not compared.
    pub capped: bool,
}

/// The logs' verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum LogOutcome {
    /// Equal as far as compared (see `capped`).
    Same,
    Differs,
    /// Not read: past the [`LOG_COMPARE_STEPS`] steps whose logs are read.
    NotCompared,
}

/// Which tasks' logs a comparison needs, in step order and at most
/// [`LOG_COMPARE_STEPS`] a run: those of steps in both runs. The log of a
/// task kept from an earlier revision is that task's, so the engine reads
/// the log of `kept_from` for it (see [`StepRun::kept_from`]).
pub fn logs_to_read<'t>(a: &'t [Task], b: &'t [Task]) -> (Vec<&'t Task>, Vec<&'t Task>) {
    let b_keys: BTreeSet<String> = instances(b).into_iter().map(|(k, _)| k).collect();
    let a_keys: BTreeSet<String> = instances(a).into_iter().map(|(k, _)| k).collect();
    let pick = |tasks: &'t [Task], other: &BTreeSet<String>| {
        instances(tasks)
            .into_iter()
            .filter(|(k, _)| other.contains(k))
            .map(|(_, t)| t)
            .take(LOG_COMPARE_STEPS)
            .collect()
    };
    (pick(a, &b_keys), pick(b, &a_keys))
}

/// Compares two runs. The caller checked they run one template.
pub fn compare(a: &Run<'_>, b: &Run<'_>) -> Comparison {
    let inputs = key_changes(&as_map(&a.workflow.vars), &as_map(&b.workflow.vars), true);
    let a_steps = instances(a.tasks);
    let b_steps: HashMap<String, &Task> = instances(b.tasks).into_iter().collect();
    let mut steps = Vec::with_capacity(a_steps.len().max(b_steps.len()));
    let mut seen = BTreeSet::new();
    for (key, task) in &a_steps {
        seen.insert(key.clone());
        steps.push(compare_step(
            key,
            Some(task),
            b_steps.get(key).copied(),
            a,
            b,
        ));
    }
    for (key, task) in instances(b.tasks) {
        if !seen.contains(&key) {
            steps.push(compare_step(&key, None, Some(task), a, b));
        }
    }
    let template_changed = a.template_revision != b.template_revision;
    let inputs_changed = inputs.iter().filter(|k| k.change != Change::Same).count();
    let steps_differing = steps.iter().filter(|s| s.change != Change::Same).count();
    let logs_capped = steps
        .iter()
        .filter(|s| s.log.as_ref().is_some_and(|l| l.capped))
        .count();
    let revisions = a.workflow.reference.is_some()
        && a.workflow.reference == b.workflow.reference
        && a.workflow.kind == b.workflow.kind;
    Comparison {
        a: summary(a),
        b: summary(b),
        revisions,
        template_changed,
        summary: ComparisonSummary {
            inputs_changed,
            steps_differing,
            steps: steps.len(),
            logs_capped,
            same: inputs_changed == 0 && steps_differing == 0 && !template_changed,
        },
        inputs,
        steps,
        limits: CompareLimits::default(),
    }
}

fn summary(run: &Run<'_>) -> RunSummary {
    let w = run.workflow;
    RunSummary {
        id: w.id,
        name: w.name.clone(),
        template: w.kind.clone(),
        template_version: w.template_version,
        template_revision: run.template_revision.clone(),
        reference: w.reference.clone(),
        revision: w.revision,
        previous_revision: w.previous_revision,
        status: w.status,
        created_at: w.created_at,
        duration_ms: duration_ms(w.started_at, w.finished_at),
    }
}

fn duration_ms(start: Option<DateTime<Utc>>, end: Option<DateTime<Utc>>) -> Option<u64> {
    let ms = (end? - start?).num_milliseconds();
    u64::try_from(ms).ok()
}

/// Each step task by its instance key, in order; rollback tasks are no
/// step. A key seen twice (it should not be) gets `#2`, `#3`.
fn instances(tasks: &[Task]) -> Vec<(String, &Task)> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    tasks
        .iter()
        .filter(|t| t.step.rollback_of.is_none())
        .map(|t| {
            let name = t.step.ref_name.clone().unwrap_or_else(|| t.name.clone());
            let mut key = match &t.step.each {
                Some(each) => {
                    let mut text = String::new();
                    crate::submission::canonical(each, &mut text);
                    format!("{name}[{text}]")
                }
                None => name,
            };
            let n = counts.entry(key.clone()).or_default();
            *n += 1;
            if *n > 1 {
                key = format!("{key}#{n}");
            }
            (key, t)
        })
        .collect()
}

fn step_run(task: &Task, run: &Run<'_>) -> StepRun {
    StepRun {
        task_id: task.id,
        status: task.status,
        duration_ms: duration_ms(task.started_at, task.finished_at),
        script: task.script.clone(),
        script_hash: task
            .step
            .kind
            .is_script()
            .then(|| run.script_hashes.get(&task.script).cloned())
            .flatten(),
        kept_from: task.kept_from,
    }
}

fn compare_step(
    key: &str,
    a_task: Option<&Task>,
    b_task: Option<&Task>,
    a: &Run<'_>,
    b: &Run<'_>,
) -> StepComparison {
    let either = a_task.or(b_task).expect("a step of one run at least");
    let a_run = a_task.map(|t| step_run(t, a));
    let b_run = b_task.map(|t| step_run(t, b));
    let (status_changed, script_changed) = match (&a_run, &b_run) {
        (Some(x), Some(y)) => (
            x.status != y.status,
            x.script != y.script || x.script_hash != y.script_hash,
        ),
        _ => (false, false),
    };
    let output =
        |t: Option<&Task>| as_map(t.and_then(|t| t.output.as_ref()).unwrap_or(&Value::Null));
    let all_outputs = key_changes(&output(a_task), &output(b_task), false);
    let outputs_same = all_outputs
        .iter()
        .filter(|k| k.change == Change::Same)
        .count();
    let outputs: Vec<KeyChange> = all_outputs
        .into_iter()
        .filter(|k| k.change != Change::Same)
        .collect();
    let log = match (a_task, b_task) {
        (Some(x), Some(y)) => Some(compare_logs(a.logs.get(&x.id), b.logs.get(&y.id))),
        _ => None,
    };
    let change = match (a_task, b_task) {
        (Some(_), None) => Change::OnlyA,
        (None, Some(_)) => Change::OnlyB,
        _ if status_changed
            || script_changed
            || !outputs.is_empty()
            || log
                .as_ref()
                .is_some_and(|l| l.outcome == LogOutcome::Differs) =>
        {
            Change::Changed
        }
        _ => Change::Same,
    };
    StepComparison {
        key: key.to_owned(),
        ref_name: either
            .step
            .ref_name
            .clone()
            .unwrap_or_else(|| either.name.clone()),
        each: either.step.each.clone(),
        change,
        a: a_run,
        b: b_run,
        status_changed,
        script_changed,
        outputs,
        outputs_same,
        log,
    }
}

/// An object's keys; `null` has none; any other value is one key, `""`.
fn as_map(value: &Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map.clone(),
        Value::Null => Map::new(),
        other => Map::from_iter([(String::new(), other.clone())]),
    }
}

/// Every key of either object, in key order. `values_when_same`: whether
/// a key that is the same still shows its value (inputs do, so that the
/// page shows them side by side; outputs only count them).
fn key_changes(
    a: &Map<String, Value>,
    b: &Map<String, Value>,
    values_when_same: bool,
) -> Vec<KeyChange> {
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .map(|key| {
            let (x, y) = (a.get(key), b.get(key));
            let change = match (x, y) {
                (Some(x), Some(y)) if x == y => Change::Same,
                (Some(_), Some(_)) => Change::Changed,
                (Some(_), None) => Change::OnlyA,
                _ => Change::OnlyB,
            };
            let keep = values_when_same || change != Change::Same;
            KeyChange {
                key: key.clone(),
                change,
                a: x.filter(|_| keep).cloned(),
                b: y.filter(|_| keep).cloned(),
            }
        })
        .collect()
}

/// The first line where two logs part, within the limits. A log that was
/// not read (past [`LOG_COMPARE_STEPS`]) is not compared.
fn compare_logs(a: Option<&LogExcerpt>, b: Option<&LogExcerpt>) -> LogComparison {
    let (Some(a), Some(b)) = (a, b) else {
        return LogComparison {
            outcome: LogOutcome::NotCompared,
            line: None,
            a: None,
            b: None,
            lines_compared: 0,
            capped: false,
        };
    };
    let (a_lines, a_capped) = lines(a);
    let (b_lines, b_capped) = lines(b);
    let capped = a_capped || b_capped;
    let longest = a_lines.len().max(b_lines.len());
    for i in 0..longest {
        let (x, y) = (a_lines.get(i), b_lines.get(i));
        if x == y {
            continue;
        }
        // One log ended within the compared part while the other was cut
        // at the limit: what follows was not read, so this is no difference.
        if (x.is_none() && a_capped) || (y.is_none() && b_capped) {
            break;
        }
        return LogComparison {
            outcome: LogOutcome::Differs,
            line: Some(i + 1),
            a: x.map(|l| shown(l)),
            b: y.map(|l| shown(l)),
            lines_compared: i + 1,
            capped,
        };
    }
    LogComparison {
        outcome: LogOutcome::Same,
        line: None,
        a: None,
        b: None,
        lines_compared: a_lines.len().min(b_lines.len()),
        capped,
    }
}

/// A log's lines up to the line limit, and whether it goes on past what
/// is compared. A last line cut by the byte limit is dropped (its rest
/// was not read).
fn lines(log: &LogExcerpt) -> (Vec<String>, bool) {
    let text = String::from_utf8_lossy(&log.bytes);
    let mut all: Vec<&str> = text.split_inclusive('\n').collect();
    let mut capped = log.capped;
    if capped && all.last().is_some_and(|l| !l.ends_with('\n')) {
        all.pop();
    }
    if all.len() > LOG_COMPARE_LINES {
        all.truncate(LOG_COMPARE_LINES);
        capped = true;
    }
    let lines = all
        .into_iter()
        .map(|l| l.trim_end_matches('\n').trim_end_matches('\r').to_owned())
        .collect();
    (lines, capped)
}

fn shown(line: &str) -> String {
    match line.char_indices().nth(LOG_LINE_SHOWN_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_owned(),
    }
}

#[cfg(test)]
mod tests;
