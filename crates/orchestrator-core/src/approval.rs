//! Approval gates (`kind: approval`): the policy a template step writes
//! in its `approval` block, the digest of what an approval covers, who
//! may decide, and the gate's record on its task with the moves it makes.
//!
//! A gate is a task that never gets a worker: it stays `pending` while it
//! waits for decisions, and leaves that status only by a decision (or its
//! timeout): `completed` once approved, `cancelled` when rejected,
//! `failed` when it timed out under `on_timeout: fail`. What the digest
//! covers is read by the engine (scripts on disk, the template as the
//! service holds it); here it is plain data.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::access::Role;
use crate::task::Error as TaskError;
use crate::template::limits::{
    MAX_GATE_APPROVER_TOKENS, MAX_GATE_COMMENT_BYTES, MAX_GATE_COVERED_STEPS, MAX_GATE_REQUIRED,
};
use crate::{Task, TaskStatus};

/// How long a gate waits for its decisions when the step does not say.
pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Who may decide: holders of a role (or a higher one), or tokens by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Approvers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<String>,
}

/// What a gate's timeout means.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum OnTimeout {
    /// As a rejection: the gate is `cancelled`, the gated steps skipped.
    #[default]
    Reject,
    /// The gate `failed`: the workflow's failure policy applies.
    Fail,
}

crate::named_variants!(OnTimeout, "on_timeout", [
    Reject => "reject",
    Fail => "fail",
]);

/// A gate's `approval` block, as a template writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalPolicy {
    pub approvers: Approvers,
    /// Approvals needed, each by a different token.
    #[serde(default = "one")]
    pub required: u32,
    /// Whether the token that submitted the workflow may approve it.
    #[serde(default)]
    pub allow_submitter: bool,
    /// Seconds, or `90s`, `30m`, `24h`; 24h when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub timeout: Option<Value>,
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Steps (among the gate's `depends_on`) whose outputs the digest covers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covers: Vec<String>,
}

fn one() -> u32 {
    1
}

/// A refusal of a policy: the field under the block (`approvers.role`)
/// and what is wrong.
pub type PolicyError = (String, String);

impl ApprovalPolicy {
    /// Reads and checks a gate's block (the task's input).
    pub fn parse(block: &Value) -> Result<ApprovalPolicy, PolicyError> {
        let policy: ApprovalPolicy =
            serde_json::from_value(block.clone()).map_err(|e| (String::new(), e.to_string()))?;
        policy.check()?;
        Ok(policy)
    }

    fn check(&self) -> Result<(), PolicyError> {
        let refuse = |at: &str, message: String| Err((at.to_owned(), message));
        match (&self.approvers.role, self.approvers.tokens.is_empty()) {
            (None, true) => {
                return refuse(
                    "approvers",
                    "must name a role or tokens that may decide".into(),
                );
            }
            (Some(_), false) => {
                return refuse("approvers", "names a role or tokens, not both".into());
            }
            _ => {}
        }
        if self.approvers.role == Some(Role::Viewer) {
            return refuse(
                "approvers.role",
                "a viewer can not decide: use operator or admin".into(),
            );
        }
        if self.approvers.tokens.len() > MAX_GATE_APPROVER_TOKENS {
            return refuse(
                "approvers.tokens",
                format!(
                    "{} tokens is more than the maximum of {MAX_GATE_APPROVER_TOKENS}",
                    self.approvers.tokens.len()
                ),
            );
        }
        for (i, name) in self.approvers.tokens.iter().enumerate() {
            if name.trim().is_empty() || name.len() > 128 {
                return refuse(
                    &format!("approvers.tokens[{i}]"),
                    format!("`{name}` is not a token name"),
                );
            }
        }
        if !(1..=MAX_GATE_REQUIRED).contains(&self.required) {
            return refuse(
                "required",
                format!(
                    "{} is out of range: must be from 1 to {MAX_GATE_REQUIRED}",
                    self.required
                ),
            );
        }
        if !self.approvers.tokens.is_empty() && self.required as usize > self.approvers.tokens.len()
        {
            return refuse(
                "required",
                format!(
                    "{} approvals can not come from {} tokens",
                    self.required,
                    self.approvers.tokens.len()
                ),
            );
        }
        self.timeout_duration()
            .map_err(|m| ("timeout".to_owned(), m))?;
        if self.covers.len() > MAX_GATE_COVERED_STEPS {
            return refuse(
                "covers",
                format!(
                    "{} steps is more than the maximum of {MAX_GATE_COVERED_STEPS}",
                    self.covers.len()
                ),
            );
        }
        Ok(())
    }

    /// How long the gate waits once open.
    pub fn timeout_duration(&self) -> Result<Duration, String> {
        self.timeout
            .as_ref()
            .map_or(Ok(DEFAULT_GATE_TIMEOUT), crate::template::parse_timeout)
    }
}

/// Who asks to decide: a token's name and role.
#[derive(Debug, Clone, Copy)]
pub struct Decider<'a> {
    pub actor: &'a str,
    pub role: Option<Role>,
}

/// Approve or reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Choice {
    Approve,
    Reject,
}

crate::named_variants!(Choice, "choice", [
    Approve => "approve",
    Reject => "reject",
]);

/// Whether `decider` may make `choice` on a gate of `policy`, in a
/// workflow submitted by `submitter` (unknown when the service runs
/// without tokens); the reason if not. The submitter may always reject.
pub fn may_decide(
    policy: &ApprovalPolicy,
    decider: Decider<'_>,
    submitter: Option<&str>,
    choice: Choice,
) -> Result<(), String> {
    let actor = decider.actor;
    if let Some(role) = policy.approvers.role
        && !decider.role.is_some_and(|r| r.allows(role))
    {
        return Err(format!(
            "token `{actor}` may not decide this gate: it needs the {role} role"
        ));
    }
    if !policy.approvers.tokens.is_empty() && !policy.approvers.tokens.iter().any(|t| t == actor) {
        return Err(format!(
            "token `{actor}` may not decide this gate: only {} may",
            policy.approvers.tokens.join(", ")
        ));
    }
    if choice == Choice::Approve && !policy.allow_submitter && submitter == Some(actor) {
        return Err(format!(
            "token `{actor}` submitted this workflow and may not approve it (the gate does not set allow_submitter)"
        ));
    }
    Ok(())
}

/// What a digest covers, part by part, so that a changed digest can say
/// which part changed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Coverage {
    /// SHA-256 of the workflow's inputs (canonical JSON).
    pub inputs: String,
    /// The template's revision: its name, version and the SHA-256 of the
    /// template as the service holds it.
    pub template: String,
    /// Each script the gated steps run, by path: SHA-256 of its content
    /// (`missing` when there is no such file).
    pub scripts: BTreeMap<String, String>,
    /// Each covered step's outputs: SHA-256 of the canonical JSON.
    pub outputs: BTreeMap<String, String>,
}

/// Hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::access::hex(&Sha256::digest(bytes))
}

/// Hex SHA-256 of a JSON value's canonical text (keys sorted, no space).
pub fn value_hash(value: &Value) -> String {
    let mut text = String::new();
    crate::submission::canonical(value, &mut text);
    sha256_hex(text.as_bytes())
}

impl Coverage {
    /// The one digest an approver signs: SHA-256 of the parts, labelled.
    pub fn digest(&self) -> String {
        value_hash(&json!({
            "inputs": self.inputs,
            "template": self.template,
            "scripts": self.scripts,
            "outputs": self.outputs,
        }))
    }

    /// What changed from `before` to this, in words (empty if nothing).
    pub fn changes_since(&self, before: &Coverage) -> Vec<String> {
        let mut changes = Vec::new();
        if self.inputs != before.inputs {
            changes.push("the workflow's inputs changed".to_owned());
        }
        if self.template != before.template {
            changes.push(format!(
                "the template changed (was {}, now {})",
                before.template, self.template
            ));
        }
        changed_entries(&mut changes, "script", &before.scripts, &self.scripts);
        changed_entries(
            &mut changes,
            "output of step",
            &before.outputs,
            &self.outputs,
        );
        changes
    }
}

fn changed_entries(
    out: &mut Vec<String>,
    what: &str,
    before: &BTreeMap<String, String>,
    after: &BTreeMap<String, String>,
) {
    for (name, hash) in after {
        match before.get(name) {
            Some(was) if was == hash => {}
            Some(_) => out.push(format!("{what} {name} changed")),
            None => out.push(format!("{what} {name} is new")),
        }
    }
    for name in before.keys().filter(|n| !after.contains_key(*n)) {
        out.push(format!("{what} {name} is gone"));
    }
}

/// One decision on a gate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Verdict {
    pub choice: Choice,
    /// The deciding token's name.
    pub by: String,
    pub at: DateTime<Utc>,
    /// The digest the decider saw and signed.
    pub digest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

/// How a gate ended, if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum GateEnd {
    Approved,
    Rejected,
    TimedOut,
}

/// A gate's record on its task. Every change of it is a task write, so
/// it is as durable as the task and its events come from the task's diff.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Gate {
    /// The token that submitted the workflow (none when the service runs
    /// without tokens): it may not approve unless the policy allows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter: Option<String>,
    /// When the gate's dependencies completed and it began to wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_at: Option<DateTime<Utc>>,
    /// No decision by then: the policy's `on_timeout` applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// The approvals that count, all of one digest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<Verdict>,
    /// What those approvals covered, to name what changed later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_coverage: Option<Coverage>,
    /// How often approvals stopped counting because what they covered
    /// changed; `invalidated_because` says why, the last time.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub invalidations: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalidated_because: Option<String>,
    /// The rejection, if one ended the gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Verdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<GateEnd>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Gate {
    /// A gate of a workflow submitted by `submitter`, not open yet.
    pub fn new(submitter: Option<String>) -> Gate {
        Gate {
            submitter,
            ..Gate::default()
        }
    }

    /// Open and waiting for decisions.
    pub fn is_waiting(&self) -> bool {
        self.opened_at.is_some() && self.ended.is_none()
    }
}

/// What an approval did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// Counted; `have` of `need`.
    Counted { have: u32, need: u32 },
    /// The last one needed: the gate is `completed`.
    Passed,
}

/// A decision the gate refuses, and why (for the caller: a conflict).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateRefusal {
    #[error("the gate is not waiting for a decision (task {0} is {1})")]
    NotWaiting(crate::TaskId, TaskStatus),
    #[error(
        "stale digest: the decision was made on {seen}, but the gate now covers {current}; look again and decide on what is there now"
    )]
    Stale { seen: String, current: String },
    #[error("token `{0}` approved this gate already")]
    AlreadyApproved(String),
    #[error("comment is {0} bytes, more than the maximum of {MAX_GATE_COMMENT_BYTES}")]
    CommentTooLong(usize),
    #[error(transparent)]
    Task(#[from] TaskError),
}

impl Task {
    fn gate_mut(&mut self) -> Result<&mut Gate, GateRefusal> {
        let (id, status) = (self.id, self.status);
        match self.approval.as_mut() {
            Some(gate) if status == TaskStatus::Pending && gate.is_waiting() => Ok(gate),
            _ => Err(GateRefusal::NotWaiting(id, status)),
        }
    }

    /// The gate's dependencies completed: it waits for decisions until
    /// `now + timeout`. It stays `pending`: no worker is given to it.
    pub fn open_gate(&mut self, timeout: Duration, now: DateTime<Utc>) {
        if let Some(gate) = self.approval.as_mut()
            && gate.opened_at.is_none()
        {
            gate.opened_at = Some(now);
            gate.deadline = Some(now + chrono::Duration::from_std(timeout).unwrap_or_default());
            self.updated_at = now;
        }
    }

    /// Approvals counted so far no longer do: what they covered changed
    /// (`reason` says how). The gate waits again.
    pub fn invalidate_gate(
        &mut self,
        reason: String,
        now: DateTime<Utc>,
    ) -> Result<(), GateRefusal> {
        let gate = self.gate_mut()?;
        gate.approvals.clear();
        gate.approved_coverage = None;
        gate.invalidations += 1;
        gate.invalidated_because = Some(reason);
        self.updated_at = now;
        Ok(())
    }

    /// Records a decision made on `seen` while the gate covers `current`
    /// (computed just now). A rejection ends the gate `cancelled`; the
    /// last approval needed ends it `completed`, with the approvals as
    /// its output. Approvals on an older digest stop counting first
    /// (see [`Task::invalidate_gate`]); a decision on a digest that is
    /// not the current one is refused.
    pub fn decide_gate(
        &mut self,
        verdict: Verdict,
        current: &Coverage,
        required: u32,
        now: DateTime<Utc>,
    ) -> Result<Approval, GateRefusal> {
        if let Some(comment) = &verdict.comment
            && comment.len() > MAX_GATE_COMMENT_BYTES
        {
            return Err(GateRefusal::CommentTooLong(comment.len()));
        }
        let current_digest = current.digest();
        let gate = self.gate_mut()?;
        if verdict.digest != current_digest {
            return Err(GateRefusal::Stale {
                seen: verdict.digest,
                current: current_digest,
            });
        }
        if let Some(before) = gate.approved_coverage.clone()
            && before.digest() != current_digest
        {
            let reason = current.changes_since(&before).join("; ");
            self.invalidate_gate(reason, now)?;
        }
        let gate = self.gate_mut()?;
        match verdict.choice {
            Choice::Reject => {
                gate.rejection = Some(verdict.clone());
                gate.ended = Some(GateEnd::Rejected);
                let reason = match &verdict.comment {
                    Some(c) => format!("rejected by {}: {c}", verdict.by),
                    None => format!("rejected by {}", verdict.by),
                };
                self.move_to(TaskStatus::Cancelled, now)?;
                self.error = Some(reason);
                Ok(Approval::Counted {
                    have: 0,
                    need: required,
                })
            }
            Choice::Approve => {
                if gate.approvals.iter().any(|a| a.by == verdict.by) {
                    return Err(GateRefusal::AlreadyApproved(verdict.by));
                }
                gate.approvals.push(verdict);
                gate.approved_coverage = Some(current.clone());
                let have = u32::try_from(gate.approvals.len()).unwrap_or(u32::MAX);
                if have < required {
                    self.updated_at = now;
                    return Ok(Approval::Counted {
                        have,
                        need: required,
                    });
                }
                gate.ended = Some(GateEnd::Approved);
                let output = json!({
                    "digest": current_digest,
                    "approved_by": gate.approvals.iter().map(|a| a.by.clone()).collect::<Vec<_>>(),
                    "covers": current,
                });
                // The one way to `completed` without an attempt, so it is
                // not in the table of moves (where a pending task's
                // `complete` stays an error): only a waiting gate's last
                // approval, checked above, takes it.
                self.status = TaskStatus::Completed;
                self.updated_at = now;
                self.finished_at = Some(now);
                self.output = Some(output);
                self.error = None;
                Ok(Approval::Passed)
            }
        }
    }

    /// Whether the gate waited past its deadline at `now`.
    pub fn gate_overdue(&self, now: DateTime<Utc>) -> bool {
        self.status == TaskStatus::Pending
            && self
                .approval
                .as_ref()
                .is_some_and(|g| g.is_waiting() && g.deadline.is_some_and(|d| d <= now))
    }

    /// No decision came in time: `reject` cancels the gate, `fail` fails it.
    pub fn time_out_gate(
        &mut self,
        on_timeout: OnTimeout,
        now: DateTime<Utc>,
    ) -> Result<(), GateRefusal> {
        let gate = self.gate_mut()?;
        gate.ended = Some(GateEnd::TimedOut);
        let waited = gate
            .opened_at
            .map(|opened| (now - opened).num_seconds().max(0))
            .unwrap_or_default();
        let (status, error) = match on_timeout {
            OnTimeout::Reject => (
                TaskStatus::Cancelled,
                format!("rejected: no decision within {waited}s (on_timeout: reject)"),
            ),
            OnTimeout::Fail => (
                TaskStatus::Failed,
                format!("no decision within {waited}s (on_timeout: fail)"),
            ),
        };
        self.move_to(status, now)?;
        self.error = Some(error);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
