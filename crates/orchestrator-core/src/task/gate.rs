//! An approval gate's record on its task, and the moves a decision, a
//! timeout or a change of what the approvals covered make of it (see
//! docs/approvals.md for the policy and the rules of who decides).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Error as TaskError, Task, TaskStatus};

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
