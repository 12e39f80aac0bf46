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

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::access::Role;
pub use crate::task::gate::{
    Approval, Choice, Coverage, Gate, GateEnd, GateRefusal, OnTimeout, Verdict, sha256_hex,
    value_hash,
};
use crate::template::limits::{
    MAX_GATE_APPROVER_TOKENS, MAX_GATE_COMMENT_BYTES, MAX_GATE_COVERED_STEPS, MAX_GATE_REQUIRED,
};

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

/// A decision's comment, within its bound.
pub fn check_comment(comment: &str) -> Result<(), String> {
    if comment.len() > MAX_GATE_COMMENT_BYTES {
        return Err(format!(
            "{} bytes is more than the maximum of {MAX_GATE_COMMENT_BYTES}",
            comment.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
