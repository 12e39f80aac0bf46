//! The task model and its state machine.
//!
//! ```text
//!   pending ──release──▶ queued ──start──▶ running ──complete──▶ completed
//!      │                   ▲  │               │ │
//!      │ skip              │  │ cancel        │ └─fail──▶ retry_waiting ──start──▶ running
//!      ▼                   │  ▼               │                │
//!   skipped      interrupt─┘ cancelled ◀──────┴─cancel─────────┘
//!                                              fail (attempts used up) ──▶ failed
//! ```
//!
//! Every method that changes a task takes `now` and validates the move
//! first, so an illegal transition is an error value, never a silent change.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use self::error::{Error, Result};
use crate::{RetryPolicy, TaskId, WorkflowId};

mod error;
pub(crate) mod gate;

/// Dispatch priority. Higher runs first; equal priorities run in FIFO order.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Priority {
    Low,
    #[default]
    Normal,
    High,
    Critical,
}

crate::named_variants!(Priority, "priority", [
    Low => "low",
    Normal => "normal",
    High => "high",
    Critical => "critical",
]);

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum TaskStatus {
    /// Waiting for the tasks it depends on.
    Pending,
    /// Ready to run; waiting for a worker.
    Queued,
    /// A worker has claimed it and its script runs (or is about to).
    Running,
    /// An attempt failed; another one starts at `retry_at`.
    RetryWaiting,
    Completed,
    Failed,
    Cancelled,
    /// Never ran because a task it depends on did not complete, or its
    /// `when:` condition was false.
    Skipped,
    /// Never ran because its workflow stopped first (a failure under the
    /// `fail` policy, or a workflow cancel).
    NotStarted,
}

crate::named_variants!(TaskStatus, "status", [
    Pending => "pending",
    Queued => "queued",
    Running => "running",
    RetryWaiting => "retry_waiting",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
    Skipped => "skipped",
    NotStarted => "not_started",
]);

impl TaskStatus {
    /// A terminal status never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed
                | TaskStatus::Failed
                | TaskStatus::Cancelled
                | TaskStatus::Skipped
                | TaskStatus::NotStarted
        )
    }

    /// The single table of legal moves. Every transition method checks it.
    pub fn can_become(self, next: TaskStatus) -> bool {
        use TaskStatus::*;
        matches!(
            (self, next),
            (Pending, Queued | Skipped | Cancelled | NotStarted | Failed)
                | (Queued, Running | Cancelled | NotStarted)
                | (RetryWaiting, Running | Cancelled | NotStarted)
                | (
                    Running,
                    Completed | Failed | RetryWaiting | Cancelled | Queued
                )
        )
    }
}

/// What a caller asks for when it creates a task.
#[derive(Debug, Clone)]
pub struct TaskSpec {
    pub name: String,
    /// Script path relative to the scripts dir, e.g. `servers/create.nu`.
    pub script: String,
    pub input: Value,
    pub priority: Priority,
    pub max_attempts: u32,
    pub timeout: Duration,
    pub check_mode: bool,
    pub depends_on: Vec<TaskId>,
    pub step: StepSettings,
}

/// The kind of step a task runs, by the name templates write (`kind:
/// script`). The core names no kind but the default, `script`: each kind
/// is a runner that the engine registers under the name the runner
/// declares, and templates are checked against the registered kinds (see
/// [`crate::template::StepKinds`]).
///
/// Held inline rather than as a `String` so that it stays `Copy`: tasks
/// hand their kind around by value (to find its runner) and a kind is a
/// short name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepKind(arrayvec::ArrayString<{ StepKind::MAX_LEN }>);

impl StepKind {
    /// The longest kind name.
    pub const MAX_LEN: usize = 32;

    /// The kind of a step that names none: a script under the scripts dir,
    /// run as a child process. Rollbacks are scripts too, whatever the
    /// kind of the step they undo.
    pub const SCRIPT: &'static str = "script";

    /// A kind by its name: a lowercase ASCII letter, then lowercase
    /// letters, digits, `_` or `-`, at most [`StepKind::MAX_LEN`] bytes.
    /// Whether a service runs it is the service's business.
    pub fn new(name: &str) -> std::result::Result<StepKind, String> {
        let well_formed = name.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'));
        let invalid = || {
            format!(
                "`{name}` is not a step kind name (a lowercase letter, then lowercase letters, digits, `_` or `-`, at most {} bytes)",
                StepKind::MAX_LEN
            )
        };
        if !well_formed {
            return Err(invalid());
        }
        arrayvec::ArrayString::from(name)
            .map(StepKind)
            .map_err(|_| invalid())
    }

    /// The default kind, `script`.
    pub fn script() -> StepKind {
        StepKind::default()
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn is_script(&self) -> bool {
        self.as_str() == StepKind::SCRIPT
    }
}

impl Default for StepKind {
    fn default() -> StepKind {
        let mut name = arrayvec::ArrayString::new();
        // `script` is 6 bytes, well within the capacity.
        name.push_str(StepKind::SCRIPT);
        StepKind(name)
    }
}

impl std::fmt::Display for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for StepKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StepKind({:?})", self.as_str())
    }
}

impl std::str::FromStr for StepKind {
    type Err = String;

    fn from_str(name: &str) -> std::result::Result<StepKind, String> {
        StepKind::new(name)
    }
}

/// Written as its name, so stored tasks and templates read as they did
/// when the kinds were an enum.
impl Serialize for StepKind {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StepKind {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<StepKind, D::Error> {
        let name = String::deserialize(deserializer)?;
        StepKind::new(&name).map_err(serde::de::Error::custom)
    }
}

/// A string in the OpenAPI document: which kinds a service runs is not
/// known to the core.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for StepKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "The kind of step: `script` unless the template step says otherwise.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for StepKind {}

/// What a task knows about the workflow step it runs, if it came from a
/// template. Plain tasks use the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepSettings {
    /// What runs the task's `script` (its target); `script` unless the
    /// template step says otherwise.
    #[serde(default, skip_serializing_if = "StepKind::is_script")]
    pub kind: StepKind,
    /// The step's `ref_name` in its template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ref_name: Option<String>,
    /// The `for_each` values this instance runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub each: Option<Value>,
    /// The input with `${...}` references still in it; resolved into
    /// `input` when the task is released, once its dependencies' outputs exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_template: Option<Value>,
    /// A failure does not fail the workflow, and dependents still run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// Runs once its dependencies ended, however they ended, and again on
    /// every workflow retry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub always_run: bool,
    /// This step's own failure policy, overriding the workflow's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<FailurePolicy>,
    /// Script that undoes this step, run under the `rollback` policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<String>,
    /// Set on a rollback task: the completed task it undoes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<TaskId>,
    /// The step's `when:` condition, evaluated when its dependencies are
    /// done (so a task with one starts `pending`, even without them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// The named locks the task's attempts hold while they run (resolved
    /// at submission from the template's `locks:`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<crate::lock::LockClaim>,
}

impl StepSettings {
    pub fn is_plain(&self) -> bool {
        *self == StepSettings::default()
    }
}

/// What a workflow does when a step fails for good.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum FailurePolicy {
    /// Start nothing new, let running steps finish, fail the workflow.
    #[default]
    Fail,
    /// Keep running everything that does not depend on the failed step.
    Continue,
    /// Like `fail`, then undo completed steps in reverse order.
    Rollback,
}

/// One unit of work: a script run with an input, retried up to `max_attempts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Task {
    pub id: TaskId,
    pub workflow_id: WorkflowId,
    pub name: String,
    pub script: String,
    pub input: Value,
    pub priority: Priority,
    pub status: TaskStatus,
    /// Tasks of the same workflow that must complete before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<TaskId>,
    /// Dry run: the script is told to change nothing.
    pub check_mode: bool,
    /// Attempts started so far (the running one included).
    pub attempts: u32,
    /// Attempts that ended because the service running them died (a crash,
    /// a node whose lease ran out), not because the step failed. They do
    /// not count against `max_attempts`, up to [`MAX_INTERRUPTIONS`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub interruptions: u32,
    pub max_attempts: u32,
    /// Wall-clock limit of one attempt, in seconds.
    pub timeout_secs: u64,
    /// When the next attempt may start (only in `retry_waiting`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
    /// Not dispatched before this time (a scheduled workflow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// The template step this task runs; empty for plain tasks.
    #[serde(default, skip_serializing_if = "StepSettings::is_plain")]
    pub step: StepSettings,
    /// How many times the workflow was retried over this task.
    #[serde(default)]
    pub reruns: u32,
    /// In a workflow re-run from a later step (a new revision): the task of
    /// the previous revision whose input and output this one keeps. It
    /// did not run in this revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_from: Option<TaskId>,
    /// Set, and persisted, before a running script is signalled, so that a
    /// crash between the request and the kill still ends in `cancelled`.
    #[serde(default)]
    pub cancel_requested: bool,
    pub created_at: DateTime<Utc>,
    #[serde(default)]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    #[serde(default)]
    pub output: Option<Value>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The node running the current attempt (or that ran the last one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// While running: the claim holds until this time, renewed by the
    /// node's heartbeat. Past it, another node may take the task over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<DateTime<Utc>>,
    /// One record per ended attempt: who ran it, when, and how it ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<AttemptRecord>,
    /// Key/value state the script saved while it ran (e.g. the id of an
    /// external job it launched). Kept across attempts and handed to the
    /// next one, so a re-run can resume instead of repeating a side effect.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub checkpoint: Map<String, Value>,
    /// On an approval gate (`kind: approval`): its decisions so far. A
    /// gate is never queued; see docs/approvals.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: most tasks have none, and a task is handed around by value.
    pub approval: Option<Box<gate::Gate>>,
    /// Optimistic-concurrency version: storage accepts an update only if the
    /// stored version equals this one, then bumps it.
    pub version: u64,
    /// What its step's `when:` condition gave when it was evaluated.
    /// Boxed: few tasks have one, and every task record carries the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<Box<ConditionOutcome>>,
}

/// A `when:` condition as evaluated: the reason a task ran, or was
/// skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConditionOutcome {
    /// The expression, as the template wrote it.
    pub expression: String,
    /// What it evaluated to.
    pub value: bool,
}

/// How one attempt of a task went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptRecord {
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    pub ended_at: DateTime<Utc>,
    /// The status the attempt led to (`completed`, `retry_waiting`, ...).
    pub outcome: TaskStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How many attempts the service's own deaths may cost a task before they
/// count against its `max_attempts`.
pub const MAX_INTERRUPTIONS: u32 = 10;

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a failed attempt led to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    /// Another attempt is due after the delay.
    RetryAfter(Duration),
    /// No attempts left (or the task was being cancelled): the task failed.
    Failed,
}

impl Task {
    /// A new task. It is `queued` when it has no dependencies, else `pending`.
    pub fn new(workflow_id: WorkflowId, spec: TaskSpec, now: DateTime<Utc>) -> Task {
        let status = if spec.depends_on.is_empty() && spec.step.when.is_none() {
            TaskStatus::Queued
        } else {
            TaskStatus::Pending
        };
        Task {
            id: TaskId::new(),
            workflow_id,
            name: spec.name,
            script: spec.script,
            input: spec.input,
            priority: spec.priority,
            status,
            depends_on: spec.depends_on,
            check_mode: spec.check_mode,
            attempts: 0,
            max_attempts: spec.max_attempts.max(1),
            timeout_secs: spec.timeout.as_secs().max(1),
            retry_at: None,
            not_before: None,
            step: spec.step,
            reruns: 0,
            interruptions: 0,
            kept_from: None,
            cancel_requested: false,
            created_at: now,
            started_at: None,
            finished_at: None,
            updated_at: now,
            output: None,
            error: None,
            exit_code: None,
            node: None,
            lease_until: None,
            history: Vec::new(),
            checkpoint: Map::new(),
            approval: None,
            version: 0,
            condition: None,
        }
    }

    /// Merges entries into the checkpoint. Only the running attempt may
    /// checkpoint: a finished or waiting task refuses, so a stray writer
    /// can not plant state for a later attempt.
    pub fn save_checkpoint(
        &mut self,
        entries: Map<String, Value>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        if self.status != TaskStatus::Running {
            return Err(Error::NotRunning {
                id: self.id,
                status: self.status,
            });
        }
        self.checkpoint.extend(entries);
        self.updated_at = now;
        Ok(())
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    pub(crate) fn move_to(&mut self, next: TaskStatus, now: DateTime<Utc>) -> Result<()> {
        if self.status.is_terminal() {
            return Err(Error::AlreadyFinished {
                id: self.id,
                status: self.status,
            });
        }
        if !self.status.can_become(next) {
            return Err(Error::InvalidTransition {
                id: self.id,
                from: self.status,
                to: next,
            });
        }
        if self.status == TaskStatus::Running {
            // The attempt ends here, whatever comes next: record it. The
            // error is filled in by the caller right after.
            self.history.push(AttemptRecord {
                attempt: self.attempts,
                node: self.node.clone(),
                started_at: self.started_at,
                ended_at: now,
                outcome: next,
                error: None,
            });
            self.lease_until = None;
        }
        self.status = next;
        self.updated_at = now;
        if next.is_terminal() {
            self.finished_at = Some(now);
            self.retry_at = None;
        }
        Ok(())
    }

    /// All dependencies completed: the task may be dispatched.
    pub fn release(&mut self, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::Queued, now)
    }

    /// A dependency did not complete, so this task will never run.
    pub fn skip(&mut self, reason: String, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::Skipped, now)?;
        self.error = Some(reason);
        Ok(())
    }

    /// Its `when:` condition was false: it will never run. Recorded with
    /// the expression, and named in `error`.
    pub fn skip_by_condition(&mut self, expression: String, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::Skipped, now)?;
        self.error = Some(format!("skipped: when `{expression}` is false"));
        self.condition = Some(Box::new(ConditionOutcome {
            expression,
            value: false,
        }));
        Ok(())
    }

    /// Whether it was skipped by a condition, its own (not because a
    /// dependency failed).
    pub fn skipped_by_condition(&self) -> bool {
        self.status == TaskStatus::Skipped && self.condition.as_ref().is_some_and(|c| !c.value)
    }

    /// A worker claims the task: a new attempt begins.
    pub fn start(&mut self, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::Running, now)?;
        self.attempts += 1;
        self.started_at = Some(now);
        self.retry_at = None;
        self.exit_code = None;
        Ok(())
    }

    pub fn complete(&mut self, output: Value, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::Completed, now)?;
        self.output = Some(output);
        self.error = None;
        self.exit_code = Some(0);
        Ok(())
    }

    /// The running attempt failed. Retries with backoff while attempts remain
    /// and nobody asked to cancel. `jitter` is a sample in `[0, 1)`.
    pub fn fail(
        &mut self,
        error: String,
        exit_code: Option<i32>,
        policy: &RetryPolicy,
        jitter: f64,
        now: DateTime<Utc>,
    ) -> Result<FailureOutcome> {
        self.must_be_running_to(TaskStatus::Failed)?;
        self.error = Some(error);
        self.exit_code = exit_code;
        let counted = self.attempts.saturating_sub(self.interruptions);
        if counted < self.max_attempts && !self.cancel_requested {
            let delay = policy.delay_before_retry(self.attempts, jitter);
            self.move_to(TaskStatus::RetryWaiting, now)?;
            self.retry_at = Some(now + chrono::Duration::from_std(delay).unwrap_or_default());
            self.stamp_attempt();
            Ok(FailureOutcome::RetryAfter(delay))
        } else {
            self.move_to(TaskStatus::Failed, now)?;
            self.stamp_attempt();
            Ok(FailureOutcome::Failed)
        }
    }

    fn must_be_running_to(&self, to: TaskStatus) -> Result<()> {
        if self.status == TaskStatus::Running {
            Ok(())
        } else {
            Err(Error::InvalidTransition {
                id: self.id,
                from: self.status,
                to,
            })
        }
    }

    /// The running attempt ended because the service running it died (its
    /// previous life crashed, or its node stopped renewing the lease): not
    /// the step's failure, so it is retried without using up
    /// `max_attempts`, up to [`MAX_INTERRUPTIONS`] times; past that it
    /// counts as a failed attempt, so that a step that takes the machine
    /// down still ends.
    pub fn fail_interrupted(
        &mut self,
        error: String,
        policy: &RetryPolicy,
        jitter: f64,
        now: DateTime<Utc>,
    ) -> Result<FailureOutcome> {
        self.must_be_running_to(TaskStatus::Failed)?;
        let error = if self.interruptions < MAX_INTERRUPTIONS {
            self.interruptions += 1;
            error
        } else {
            format!("{error} (interrupted {MAX_INTERRUPTIONS} times already: this attempt counts)")
        };
        self.fail(error, None, policy, jitter, now)
    }

    /// Ask for cancellation. A task that is not running is cancelled at once
    /// (returns `true`); a running one is only marked, and the caller must stop
    /// its script and then call [`Task::finish_cancel`] (returns `false`).
    pub fn request_cancel(&mut self, now: DateTime<Utc>) -> Result<bool> {
        if self.status.is_terminal() {
            return Err(Error::AlreadyFinished {
                id: self.id,
                status: self.status,
            });
        }
        if self.status == TaskStatus::Running {
            self.cancel_requested = true;
            self.updated_at = now;
            Ok(false)
        } else {
            self.cancel_requested = true;
            let waited_for_retry = self.status == TaskStatus::RetryWaiting;
            self.move_to(TaskStatus::Cancelled, now)?;
            self.error = Some(if waited_for_retry {
                format!(
                    "cancelled while waiting to retry (after {} attempts)",
                    self.attempts
                )
            } else {
                "cancelled before it ran".to_owned()
            });
            Ok(true)
        }
    }

    /// The running script was stopped because of a cancel request.
    pub fn finish_cancel(&mut self, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::Cancelled, now)?;
        self.error = Some(format!(
            "cancelled while running (attempt {})",
            self.attempts
        ));
        self.stamp_attempt();
        Ok(())
    }

    /// Copies the error of the attempt that just ended into its history record.
    fn stamp_attempt(&mut self) {
        if let Some(last) = self.history.last_mut()
            && last.outcome == self.status
            && last.ended_at == self.updated_at
        {
            last.error = self.error.clone();
        }
    }

    /// The task can never run (its input could not be resolved from its
    /// dependencies' outputs): it fails without an attempt.
    pub fn fail_unrunnable(&mut self, error: String, now: DateTime<Utc>) -> Result<()> {
        if self.status != TaskStatus::Pending {
            return Err(Error::InvalidTransition {
                id: self.id,
                from: self.status,
                to: TaskStatus::Failed,
            });
        }
        self.move_to(TaskStatus::Failed, now)?;
        self.error = Some(error);
        Ok(())
    }

    /// The workflow stopped before this task ran.
    pub fn abandon(&mut self, reason: String, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::NotStarted, now)?;
        self.error = Some(reason);
        Ok(())
    }

    /// Whether a workflow retry runs this task again: everything that did
    /// not complete, and `always_run` steps even if they did.
    pub fn reruns_on_retry(&self) -> bool {
        match self.status {
            TaskStatus::Completed => self.step.always_run,
            status => status.is_terminal(),
        }
    }

    /// A workflow retry: the one way out of a terminal status. The task
    /// starts over as `pending` with fresh attempts; `reruns` counts how
    /// often this happened.
    pub fn rerun(&mut self, now: DateTime<Utc>) -> Result<()> {
        if !self.reruns_on_retry() {
            return Err(Error::InvalidTransition {
                id: self.id,
                from: self.status,
                to: TaskStatus::Pending,
            });
        }
        self.rerun_even_if_completed(now)
    }

    /// [`Task::rerun`] for a completed step too: one whose effect a
    /// rollback undid. Still only from a terminal status.
    pub fn rerun_even_if_completed(&mut self, now: DateTime<Utc>) -> Result<()> {
        if !self.status.is_terminal() {
            return Err(Error::InvalidTransition {
                id: self.id,
                from: self.status,
                to: TaskStatus::Pending,
            });
        }
        self.status = TaskStatus::Pending;
        self.attempts = 0;
        self.interruptions = 0;
        self.reruns += 1;
        self.cancel_requested = false;
        self.retry_at = None;
        self.started_at = None;
        self.finished_at = None;
        self.output = None;
        self.error = None;
        self.exit_code = None;
        self.condition = None;
        self.updated_at = now;
        if self.step.input_template.is_some() {
            self.input = Value::Null;
        }
        // A workflow retry is a fresh start: the next run must not resume
        // an external job that the failed run may have left half done.
        self.checkpoint.clear();
        // A gate decides again: what it covers may differ this time.
        if let Some(gate) = self.approval.as_mut() {
            **gate = self::gate::Gate::new(gate.submitter.take());
        }
        Ok(())
    }

    /// The service stopped the running attempt for reasons of its own (a
    /// shutdown, a lost worker). The attempt does not count against the
    /// task, which goes back to the queue.
    pub fn interrupt(&mut self, reason: String, now: DateTime<Utc>) -> Result<()> {
        self.move_to(TaskStatus::Queued, now)?;
        self.attempts = self.attempts.saturating_sub(1);
        self.error = Some(reason);
        self.stamp_attempt();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(depends_on: Vec<TaskId>) -> TaskSpec {
        TaskSpec {
            name: "t".into(),
            script: "x.sh".into(),
            input: Value::Null,
            priority: Priority::Normal,
            max_attempts: 3,
            timeout: Duration::from_secs(10),
            check_mode: false,
            depends_on,
            step: StepSettings::default(),
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn new_task_is_queued_or_pending_by_dependencies() {
        assert_eq!(
            Task::new(WorkflowId::new(), spec(vec![]), now()).status,
            TaskStatus::Queued
        );
        let dep = TaskId::new();
        assert_eq!(
            Task::new(WorkflowId::new(), spec(vec![dep]), now()).status,
            TaskStatus::Pending
        );
    }

    #[test]
    fn retries_until_attempts_are_used_up() {
        let policy = RetryPolicy::default();
        let mut task = Task::new(WorkflowId::new(), spec(vec![]), now());
        for attempt in 1..=3 {
            task.start(now()).unwrap();
            assert_eq!(task.attempts, attempt);
            let outcome = task
                .fail("boom".into(), Some(1), &policy, 0.5, now())
                .unwrap();
            if attempt < 3 {
                assert!(matches!(outcome, FailureOutcome::RetryAfter(_)));
                assert_eq!(task.status, TaskStatus::RetryWaiting);
                assert!(task.retry_at.unwrap() > now());
            } else {
                assert_eq!(outcome, FailureOutcome::Failed);
                assert_eq!(task.status, TaskStatus::Failed);
                assert_eq!(task.finished_at, Some(now()));
            }
        }
        assert_eq!(task.error.as_deref(), Some("boom"));
        assert_eq!(task.exit_code, Some(1));
    }

    #[test]
    fn completion_records_output_and_clears_the_last_error() {
        let mut task = Task::new(WorkflowId::new(), spec(vec![]), now());
        task.start(now()).unwrap();
        task.fail("first".into(), Some(3), &RetryPolicy::default(), 0.0, now())
            .unwrap();
        task.start(now()).unwrap();
        task.complete(serde_json::json!({"ip": "10.0.0.1"}), now())
            .unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        assert_eq!(task.error, None);
        assert_eq!(task.exit_code, Some(0));
        assert_eq!(task.output.as_ref().unwrap()["ip"], "10.0.0.1");
    }

    #[test]
    fn cancel_of_a_waiting_task_is_immediate_and_of_a_running_one_is_deferred() {
        let mut queued = Task::new(WorkflowId::new(), spec(vec![]), now());
        assert!(queued.request_cancel(now()).unwrap());
        assert_eq!(queued.status, TaskStatus::Cancelled);

        let mut running = Task::new(WorkflowId::new(), spec(vec![]), now());
        running.start(now()).unwrap();
        assert!(!running.request_cancel(now()).unwrap());
        assert_eq!(running.status, TaskStatus::Running);
        assert!(running.cancel_requested);
        // A failure while a cancel is pending never schedules a retry.
        let outcome = running
            .fail("killed".into(), None, &RetryPolicy::default(), 0.0, now())
            .unwrap();
        assert_eq!(outcome, FailureOutcome::Failed);
    }

    #[test]
    fn terminal_tasks_refuse_every_transition() {
        let mut task = Task::new(WorkflowId::new(), spec(vec![]), now());
        task.start(now()).unwrap();
        task.complete(Value::Null, now()).unwrap();
        assert!(matches!(
            task.start(now()),
            Err(Error::AlreadyFinished { .. })
        ));
        assert!(matches!(
            task.request_cancel(now()),
            Err(Error::AlreadyFinished { .. })
        ));
        assert!(task.release(now()).is_err());
    }

    #[test]
    fn illegal_moves_are_errors_not_changes() {
        let mut task = Task::new(WorkflowId::new(), spec(vec![TaskId::new()]), now());
        let before = task.clone();
        assert!(matches!(
            task.start(now()),
            Err(Error::InvalidTransition { .. })
        ));
        assert!(task.complete(Value::Null, now()).is_err());
        assert_eq!(task, before);
    }

    #[test]
    fn a_workflow_retry_reruns_what_did_not_complete() {
        let mut failed = Task::new(WorkflowId::new(), spec(vec![]), now());
        failed.start(now()).unwrap();
        failed
            .fail(
                "x".into(),
                Some(1),
                &RetryPolicy {
                    max_delay: Duration::ZERO,
                    ..Default::default()
                },
                0.0,
                now(),
            )
            .unwrap();
        failed.start(now()).unwrap();
        failed
            .fail("x".into(), Some(1), &RetryPolicy::default(), 0.0, now())
            .unwrap();
        failed.start(now()).unwrap();
        failed
            .fail("x".into(), Some(1), &RetryPolicy::default(), 0.0, now())
            .unwrap();
        assert_eq!(failed.status, TaskStatus::Failed);
        failed.rerun(now()).unwrap();
        assert_eq!(
            (failed.status, failed.attempts, failed.reruns),
            (TaskStatus::Pending, 0, 1)
        );
        assert_eq!(failed.error, None);

        let mut done = Task::new(WorkflowId::new(), spec(vec![]), now());
        done.start(now()).unwrap();
        done.complete(serde_json::json!({"kept": true}), now())
            .unwrap();
        assert!(
            done.rerun(now()).is_err(),
            "completed steps keep their outputs"
        );
        done.step.always_run = true;
        done.rerun(now()).unwrap();
        assert_eq!(done.status, TaskStatus::Pending);

        let mut queued = Task::new(WorkflowId::new(), spec(vec![]), now());
        assert!(queued.rerun(now()).is_err(), "only finished tasks rerun");
    }

    #[test]
    fn every_ended_attempt_is_recorded_with_its_node_and_error() {
        let mut task = Task::new(WorkflowId::new(), spec(vec![]), now());
        task.node = Some("node-a".into());
        task.start(now()).unwrap();
        task.fail("boom".into(), Some(2), &RetryPolicy::default(), 0.0, now())
            .unwrap();
        task.node = Some("node-b".into());
        task.start(now()).unwrap();
        task.complete(Value::Null, now()).unwrap();
        let summary: Vec<_> = task
            .history
            .iter()
            .map(|r| (r.attempt, r.node.as_deref(), r.outcome, r.error.as_deref()))
            .collect();
        assert_eq!(
            summary,
            [
                (1, Some("node-a"), TaskStatus::RetryWaiting, Some("boom")),
                (2, Some("node-b"), TaskStatus::Completed, None)
            ]
        );
    }

    #[test]
    fn interrupt_returns_the_attempt() {
        let mut task = Task::new(WorkflowId::new(), spec(vec![]), now());
        task.start(now()).unwrap();
        task.interrupt("shutdown".into(), now()).unwrap();
        assert_eq!(task.status, TaskStatus::Queued);
        assert_eq!(task.attempts, 0);
    }

    #[test]
    fn transition_table_has_no_exit_from_terminal_states() {
        for &from in TaskStatus::ALL.iter().filter(|s| s.is_terminal()) {
            for &to in TaskStatus::ALL {
                assert!(!from.can_become(to), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn statuses_and_priorities_parse_from_their_names() {
        for &status in TaskStatus::ALL {
            assert_eq!(status.as_str().parse::<TaskStatus>().unwrap(), status);
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        for &priority in Priority::ALL {
            assert_eq!(priority.as_str().parse::<Priority>().unwrap(), priority);
        }
        let err = "urgent".parse::<Priority>().unwrap_err();
        assert!(err.contains("urgent"));
        assert!(Priority::Critical > Priority::High && Priority::High > Priority::Normal);
    }

    #[test]
    fn the_service_dying_does_not_use_up_attempts_until_the_cap() {
        let now = Utc::now();
        let policy = RetryPolicy::default();
        let mut task = Task::new(WorkflowId::new(), spec(vec![]), now);
        task.max_attempts = 1;
        for crash in 1..=MAX_INTERRUPTIONS {
            task.start(now).unwrap();
            let outcome = task
                .fail_interrupted("interrupted".into(), &policy, 0.5, now)
                .unwrap();
            assert!(
                matches!(outcome, FailureOutcome::RetryAfter(_)),
                "crash {crash}"
            );
            assert_eq!(task.status, TaskStatus::RetryWaiting);
            assert_eq!(task.interruptions, crash);
        }
        // Past the cap, a crash counts: the one attempt allowed is used up.
        task.start(now).unwrap();
        let outcome = task
            .fail_interrupted("interrupted".into(), &policy, 0.5, now)
            .unwrap();
        assert_eq!(outcome, FailureOutcome::Failed);
        assert!(
            task.error
                .as_deref()
                .unwrap()
                .contains("this attempt counts")
        );
        assert_eq!(task.attempts, MAX_INTERRUPTIONS + 1);
    }

    #[test]
    fn a_real_failure_after_crashes_still_counts() {
        let now = Utc::now();
        let policy = RetryPolicy::default();
        let mut task = Task::new(WorkflowId::new(), spec(vec![]), now);
        task.max_attempts = 2;
        task.start(now).unwrap();
        task.fail_interrupted("crash".into(), &policy, 0.5, now)
            .unwrap();
        task.start(now).unwrap();
        let first = task
            .fail("exit 1".into(), Some(1), &policy, 0.5, now)
            .unwrap();
        assert!(matches!(first, FailureOutcome::RetryAfter(_)));
        task.start(now).unwrap();
        let second = task
            .fail("exit 1".into(), Some(1), &policy, 0.5, now)
            .unwrap();
        assert_eq!(second, FailureOutcome::Failed, "two real failures of two");
        // A retry of the workflow starts the count over.
        task.rerun(now).unwrap();
        assert_eq!((task.attempts, task.interruptions), (0, 0));
    }
}

/// Tasks for the core's unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::time::Duration;

    use chrono::Utc;
    use serde_json::json;

    use super::*;

    /// A one-attempt task of step `step` (if any) that depends on `deps`.
    pub(crate) fn task_of(workflow: WorkflowId, step: Option<&str>, deps: Vec<TaskId>) -> Task {
        Task::new(
            workflow,
            TaskSpec {
                name: step.unwrap_or("t").into(),
                script: "s.sh".into(),
                input: json!({}),
                priority: Priority::Normal,
                max_attempts: 1,
                timeout: Duration::from_secs(5),
                check_mode: false,
                depends_on: deps,
                step: StepSettings {
                    ref_name: step.map(str::to_owned),
                    ..Default::default()
                },
            },
            Utc::now(),
        )
    }
}
