//! Approval gates (`kind: approval`): the step kind (registered in
//! `steps`, never run), the digest of what a gate covers as read now
//! (the workflow's inputs, the template as this service holds it, the
//! scripts the gated steps run, the covered steps' outputs), decisions,
//! and the sweep that times gates out and notices what changed under
//! approvals already given.
//!
//! A gate is a `pending` task with a [`Gate`] record: the dispatcher never
//! sees it, so it holds no worker, and a restart or a takeover finds it
//! as stored. Each decision is a compare-and-set of the gate's task, so of
//! two concurrent decisions one is stored and the other is told to look
//! again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::access::Role;
use orchestrator_core::approval::{
    ApprovalPolicy, Approvers, Choice, Coverage, Decider, OnTimeout, Verdict, check_comment,
    may_decide, sha256_hex, value_hash,
};
use orchestrator_core::event::TaskMark;
use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId};
use orchestrator_storage::TaskQuery;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use orchestrator_storage::Storage;

use crate::lifecycle::Lifecycle;
use crate::records::Records;
use crate::templates::Templates;
use crate::{Error, Result};

/// How often gates are looked at for their deadline and for changes
/// under the approvals they have.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Most gates `GET /approvals` lists, and most pending tasks one look
/// reads to find them.
pub const MAX_LISTED_GATES: usize = 200;
const MAX_PENDING_SCANNED: usize = 10_000;

/// A gate waiting for decisions, as an approver sees it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingApproval {
    pub workflow_id: WorkflowId,
    pub workflow_name: String,
    pub task_id: TaskId,
    /// The gate's step (`ref_name`).
    pub step: String,
    pub opened_at: Option<DateTime<Utc>>,
    pub deadline: Option<DateTime<Utc>>,
    pub on_timeout: OnTimeout,
    pub approvers: Approvers,
    pub required: u32,
    pub allow_submitter: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitter: Option<String>,
    /// Approvals that count so far.
    pub approvals: Vec<Verdict>,
    /// What a decision signs now: send it back with the decision.
    pub digest: String,
    /// What the digest covers, part by part.
    pub covers: Coverage,
}

/// A decision as asked for.
#[derive(Debug, Clone)]
pub struct DecisionRequest {
    pub choice: Choice,
    /// The gate's step, when the workflow has more than one waiting.
    pub step: Option<String>,
    /// The digest the decider saw.
    pub digest: String,
    pub comment: Option<String>,
}

/// What a decision did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DecisionOutcome {
    pub workflow_id: WorkflowId,
    pub task_id: TaskId,
    pub step: String,
    pub choice: Choice,
    /// The digest decided on.
    pub digest: String,
    /// The gate's status now: `pending` while more approvals are needed,
    /// `completed` once approved, `cancelled` when rejected.
    pub status: TaskStatus,
    pub approvals: u32,
    pub required: u32,
}

/// What gates need of the engine: the store, the templates as loaded,
/// the scripts dir, the writer of records and the lifecycle that moves a
/// workflow on once a gate ended.
pub(crate) struct Gates {
    pub(crate) store: Storage,
    pub(crate) templates: Templates,
    pub(crate) scripts_dir: std::path::PathBuf,
    pub(crate) records: Arc<Records>,
    pub(crate) lifecycle: Arc<Lifecycle>,
}

impl Gates {
    fn store(&self) -> &Storage {
        &self.store
    }

    /// What `gate` of `workflow` covers now, read from the store, the
    /// template catalogue and the scripts on disk.
    async fn coverage(
        &self,
        workflow: &Workflow,
        tasks: &[Arc<Task>],
        gate: &Task,
        policy: &ApprovalPolicy,
    ) -> Coverage {
        let template = template_revision(&self.templates, workflow);
        // Every task after the gate: its dependents, transitively.
        let mut dependents: HashMap<TaskId, Vec<&Task>> = HashMap::new();
        for task in tasks {
            for dep in &task.depends_on {
                dependents.entry(*dep).or_default().push(task);
            }
        }
        let mut seen = HashSet::new();
        let mut next = vec![gate.id];
        let mut paths = Vec::new();
        while let Some(id) = next.pop() {
            for task in dependents.get(&id).into_iter().flatten() {
                if !seen.insert(task.id) {
                    continue;
                }
                next.push(task.id);
                if task.step.kind.is_script() {
                    paths.push(task.script.clone());
                }
                paths.extend(task.step.rollback.clone());
            }
        }
        let dir = self.scripts_dir.clone();
        let scripts = tokio::task::spawn_blocking(move || {
            paths
                .into_iter()
                .map(|path| {
                    let hash = script_hash(&dir, &path);
                    (path, hash)
                })
                .collect::<BTreeMap<_, _>>()
        })
        .await
        .unwrap_or_default();
        let outputs = policy
            .covers
            .iter()
            .map(|step| {
                let of_step: Vec<Value> = tasks
                    .iter()
                    .filter(|t| t.step.ref_name.as_deref() == Some(step.as_str()))
                    .map(|t| t.output.clone().unwrap_or(Value::Null))
                    .collect();
                (step.clone(), value_hash(&Value::Array(of_step)))
            })
            .collect();
        Coverage {
            inputs: value_hash(&workflow.vars),
            template,
            scripts,
            outputs,
        }
    }

    async fn pending_view(
        &self,
        workflow: &Workflow,
        tasks: &[Arc<Task>],
        gate: &Task,
    ) -> Result<PendingApproval> {
        let policy = policy_of(gate)?;
        let covers = self.coverage(workflow, tasks, gate, &policy).await;
        let record = gate.approval.as_deref().cloned().unwrap_or_default();
        Ok(PendingApproval {
            workflow_id: workflow.id,
            workflow_name: workflow.name.clone(),
            task_id: gate.id,
            step: gate
                .step
                .ref_name
                .clone()
                .unwrap_or_else(|| gate.name.clone()),
            opened_at: record.opened_at,
            deadline: record.deadline,
            on_timeout: policy.on_timeout,
            approvers: policy.approvers.clone(),
            required: policy.required,
            allow_submitter: policy.allow_submitter,
            submitter: record.submitter,
            approvals: record.approvals,
            digest: covers.digest(),
            covers,
        })
    }

    /// The gates waiting for a decision, oldest first, at most
    /// [`MAX_LISTED_GATES`].
    pub(crate) async fn pending_approvals(&self) -> Result<Vec<PendingApproval>> {
        let mut listed = Vec::new();
        for gate in self.waiting_gates().await? {
            if listed.len() >= MAX_LISTED_GATES {
                break;
            }
            let Some(workflow) = self.store().tasks().get_workflow(gate.workflow_id).await? else {
                continue;
            };
            let tasks = self.store().tasks().workflow_tasks(workflow.id).await?;
            listed.push(self.pending_view(&workflow, &tasks, &gate).await?);
        }
        listed.sort_by_key(|p| p.opened_at);
        Ok(listed)
    }

    /// The gate of `workflow` that waits for a decision (`step` picks one
    /// if several do), as `GET /approvals` shows it.
    pub(crate) async fn workflow_approval(
        &self,
        workflow: WorkflowId,
        step: Option<&str>,
    ) -> Result<PendingApproval> {
        let (workflow, tasks, gate) = self.waiting_gate_of(workflow, step).await?;
        self.pending_view(&workflow, &tasks, &gate).await
    }

    async fn waiting_gate_of(
        &self,
        id: WorkflowId,
        step: Option<&str>,
    ) -> Result<(Workflow, Vec<Arc<Task>>, Task)> {
        let workflow = self
            .store()
            .tasks()
            .get_workflow(id)
            .await?
            .ok_or_else(|| Error::NotFound {
                what: "workflow",
                id: id.to_string(),
            })?;
        let tasks = self.store().tasks().workflow_tasks(id).await?;
        let waiting: Vec<&Task> = tasks
            .iter()
            .map(|t| &**t)
            .filter(|t| is_waiting(t))
            .filter(|t| step.is_none_or(|s| t.step.ref_name.as_deref() == Some(s)))
            .collect();
        let gate = match waiting[..] {
            [gate] => gate.clone(),
            [] => {
                return Err(Error::Conflict(match step {
                    Some(step) => format!(
                        "workflow {id} has no approval gate `{step}` waiting for a decision"
                    ),
                    None => format!("workflow {id} has no approval gate waiting for a decision"),
                }));
            }
            _ => {
                let names: Vec<&str> = waiting
                    .iter()
                    .filter_map(|t| t.step.ref_name.as_deref())
                    .collect();
                return Err(Error::Conflict(format!(
                    "workflow {id} has {} gates waiting ({}): name one with `step`",
                    waiting.len(),
                    names.join(", ")
                )));
            }
        };
        Ok((workflow, tasks, gate))
    }

    /// Approves or rejects the waiting gate of `workflow` as `decider`, on
    /// the digest the decider saw. Refused: a decider the gate does not
    /// allow ([`Error::Forbidden`]), a digest that is no longer what the
    /// gate covers, a gate decided meanwhile ([`Error::Conflict`]).
    pub(crate) async fn decide_approval(
        &self,
        workflow: WorkflowId,
        decider: Decider<'_>,
        request: DecisionRequest,
    ) -> Result<DecisionOutcome> {
        let (workflow, tasks, gate) = self
            .waiting_gate_of(workflow, request.step.as_deref())
            .await?;
        if let Some(comment) = &request.comment {
            check_comment(comment).map_err(|m| Error::validation("comment", m))?;
        }
        let policy = policy_of(&gate)?;
        let submitter = gate.approval.as_ref().and_then(|g| g.submitter.as_deref());
        may_decide(&policy, decider, submitter, request.choice).map_err(Error::Forbidden)?;
        // Read again right before it counts: this is what the gated
        // steps would run with if this decision lets them start.
        let current = self.coverage(&workflow, &tasks, &gate, &policy).await;
        let mut task = gate.clone();
        let before = TaskMark::of(&task);
        let now = Utc::now();
        let verdict = Verdict {
            choice: request.choice,
            by: decider.actor.to_owned(),
            at: now,
            digest: request.digest,
            comment: request.comment,
        };
        task.decide_gate(verdict, &current, policy.required, now)
            .map_err(|refusal| Error::Conflict(refusal.to_string()))?;
        let stored = match self.records.update_task(&task, before).await {
            Ok(stored) => stored,
            Err(e) if e.is_conflict() => {
                return Err(Error::Conflict(format!(
                    "the gate of workflow {} was changed by another decision meanwhile; look again",
                    workflow.id
                )));
            }
            Err(e) => return Err(e),
        };
        let approvals = stored
            .approval
            .as_ref()
            .map_or(0, |g| g.approvals.len() as u32);
        tracing::info!(workflow = %workflow.id, task = %stored.id, choice = %request.choice, actor = decider.actor, status = %stored.status, "approval decision");
        if stored.status.is_terminal() {
            self.lifecycle.advance_soon(stored.clone()).await?;
        }
        Ok(DecisionOutcome {
            workflow_id: workflow.id,
            task_id: stored.id,
            step: stored.step.ref_name.clone().unwrap_or_default(),
            choice: request.choice,
            digest: current.digest(),
            status: stored.status,
            approvals,
            required: policy.required,
        })
    }

    /// Pending tasks that are open gates.
    async fn waiting_gates(&self) -> Result<Vec<Task>> {
        let mut gates = Vec::new();
        let mut scanned = 0;
        // Keyset pages: tasks leaving `pending` meanwhile shift no later
        // page (an offset would skip as many gates).
        let mut after = None;
        while scanned < MAX_PENDING_SCANNED {
            let page = self
                .store()
                .tasks()
                .list_tasks(&TaskQuery {
                    status: Some(TaskStatus::Pending),
                    after,
                    limit: 500,
                    ..TaskQuery::default()
                })
                .await?;
            let n = page.items.len();
            after = page.items.last().map(|t| t.id);
            gates.extend(page.items.into_iter().filter(is_waiting));
            if n < 500 {
                break;
            }
            scanned += n;
        }
        Ok(gates)
    }

    /// One look at every waiting gate: past its deadline, it times out;
    /// with approvals whose digest no longer matches what it covers, they
    /// stop counting (an `approval_invalidated` event says why).
    pub(crate) async fn sweep_gates(&self, now: DateTime<Utc>) -> Result<()> {
        for gate in self.waiting_gates().await? {
            let Ok(policy) = policy_of(&gate) else {
                continue;
            };
            let mut task = gate.clone();
            let before = TaskMark::of(&task);
            if task.gate_overdue(now) {
                if task.time_out_gate(policy.on_timeout, now).is_err() {
                    continue;
                }
            } else {
                let Some(approved) = gate
                    .approval
                    .as_ref()
                    .and_then(|g| g.approved_coverage.clone())
                else {
                    continue;
                };
                let Some(workflow) = self.store().tasks().get_workflow(gate.workflow_id).await?
                else {
                    continue;
                };
                let tasks = self.store().tasks().workflow_tasks(workflow.id).await?;
                let current = self.coverage(&workflow, &tasks, &gate, &policy).await;
                let changes = current.changes_since(&approved);
                if changes.is_empty() || task.invalidate_gate(changes.join("; "), now).is_err() {
                    continue;
                }
            }
            match self.records.update_task(&task, before).await {
                Ok(stored) if stored.status.is_terminal() => {
                    tracing::warn!(workflow = %stored.workflow_id, task = %stored.id, "approval gate timed out");
                    self.lifecycle.advance_soon(stored).await?;
                }
                Ok(_) => {}
                // A decision came first: the next look sees it.
                Err(e) if e.is_conflict() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Looks at the gates every [`SWEEP_EVERY`] until `stopping`.
pub(crate) async fn run(gates: Arc<Gates>, stopping: CancellationToken) {
    loop {
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
        if let Err(e) = gates.sweep_gates(Utc::now()).await {
            tracing::warn!(error = %e, "looking at approval gates failed; trying again");
        }
    }
}

fn is_waiting(task: &Task) -> bool {
    task.status == TaskStatus::Pending && task.approval.as_ref().is_some_and(|g| g.is_waiting())
}

fn policy_of(gate: &Task) -> Result<ApprovalPolicy> {
    ApprovalPolicy::parse(&gate.input).map_err(|(at, message)| {
        Error::Internal(format!("gate {}: approval.{at}: {message}", gate.id))
    })
}

/// The revision of the template a workflow ran, as an approval's digest
/// and a comparison of two runs name it: `<name>@<version> sha256:<hash>`
/// of the registered template as the service holds it (`missing` when it
/// is gone), or of the inline template the workflow was submitted with.
pub(crate) fn template_revision(templates: &Templates, workflow: &Workflow) -> String {
    let hash = match workflow.input.get("template") {
        Some(Value::String(_)) => templates
            .get(&workflow.kind, workflow.template_version)
            .and_then(|t| serde_json::to_value(&*t).ok())
            .map_or_else(|| "missing".to_owned(), |t| value_hash(&t)),
        Some(inline) => value_hash(inline),
        None => "none".to_owned(),
    };
    format!(
        "{}@{} sha256:{hash}",
        workflow.kind,
        workflow.template_version.unwrap_or_default()
    )
}

/// SHA-256 of a script under `dir`, `missing` if it cannot be read.
pub(crate) fn script_hash(dir: &std::path::Path, path: &str) -> String {
    std::fs::read(dir.join(path)).map_or_else(|_| "missing".to_owned(), |bytes| sha256_hex(&bytes))
}

/// A role or named-token decider, as the API hands it over.
pub fn decider<'a>(actor: &'a str, role: Option<Role>) -> Decider<'a> {
    Decider { actor, role }
}
