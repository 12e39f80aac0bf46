//! The views of environments (`EnvView`, `RunView`, `LogEntry`, ...) and
//! how they are built from the workflows and tasks the store holds.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus};
use orchestrator_storage::WorkflowQuery;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::templates::check_step;
use super::{CREATE, DELETE, RUN, TestEnvs, lock};
use crate::model::{EnvPlan, EnvType, NodePlan};
use crate::{Error, Result};

/// The most workflows of one kind that are read to find environments.
const MAX_LISTED: usize = 2000;
/// The most lines of a check's log in its result.
const LOG_TAIL_LINES: usize = 12;
/// How much of a check's log is read for its tail, at most.
const LOG_TAIL_BYTES: usize = 16 * 1024;

/// Where an environment is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvStatus {
    /// Its create workflow runs.
    Creating,
    /// Made; runs may start.
    Ready,
    /// Its create workflow failed; `delete` (or the ttl) cleans up.
    Failed,
    /// Its create workflow was cancelled.
    Cancelled,
    /// Its teardown runs.
    Deleting,
    /// Torn down: nothing of it is left.
    Deleted,
    /// The teardown failed; `delete` tries again.
    DeleteFailed,
}

impl EnvStatus {
    /// Whether it still holds (or may still hold) namespaces.
    pub(super) fn is_live(self) -> bool {
        !matches!(self, EnvStatus::Deleted)
    }

    /// Its name in the API (`delete_failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            EnvStatus::Creating => "creating",
            EnvStatus::Ready => "ready",
            EnvStatus::Failed => "failed",
            EnvStatus::Cancelled => "cancelled",
            EnvStatus::Deleting => "deleting",
            EnvStatus::Deleted => "deleted",
            EnvStatus::DeleteFailed => "delete_failed",
        }
    }
}

/// One check of a run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CheckResult {
    pub name: String,
    pub node: String,
    pub taskserv: String,
    pub targets: Vec<String>,
    /// `passed`, `failed`, or `pending` while it has not run.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the check script printed as its result (what it reached: the
    /// members, the server's version, the keys it wrote), once it passed.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// The last lines of the check's log: its `ok:` lines, or why it
    /// failed (the client's own error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
}

/// Where a node is, as its steps say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Its namespaces are being made, or its install waits.
    Creating,
    Installing,
    /// Installed, not started (`auto_start: false`, before a run).
    Installed,
    Starting,
    /// Its taskservs started and answered (as of their start step).
    Running,
    /// Its install or start failed; `error` says why.
    Failed,
    /// Torn down.
    Deleted,
}

/// A taskserv of a node, as its start step left it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskservView {
    pub name: String,
    pub port: u16,
    /// A stand-in answers on its port: nothing real runs.
    pub simulated: bool,
    /// The version its start script read from the binary it started
    /// (`etcd --version`, ...), `simulated` for a stand-in; absent until
    /// it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The start script's whole result (pid, URLs, ...).
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started: Option<Value>,
}

/// A node of an environment: its plan (name, address, namespace, ...),
/// its status, and its taskservs with their versions.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EnvNodeView {
    #[serde(flatten)]
    pub plan: NodePlan,
    pub status: NodeStatus,
    /// Why its install or start failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub services: Vec<TaskservView>,
}

/// A run: its workflow and each check's result.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    #[schema(value_type = String)]
    pub workflow_id: WorkflowId,
    /// `running`, `passed` (every check passed) or `failed`.
    pub status: String,
    pub passed: usize,
    pub failed: usize,
    pub checks: Vec<CheckResult>,
}

/// An environment as `GET /test/environments/{id}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EnvView {
    pub id: String,
    pub name: String,
    #[serde(rename = "type")]
    pub env_type: EnvType,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    pub status: EnvStatus,
    pub provider: String,
    pub nodes: Vec<EnvNodeView>,
    pub auto_start: bool,
    pub auto_cleanup: bool,
    pub ttl_secs: u64,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Why the create or the teardown failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The environment's workflows (they show in the dashboard too).
    #[schema(value_type = String)]
    pub create_workflow: WorkflowId,
    #[schema(value_type = Vec<String>)]
    pub run_workflows: Vec<WorkflowId>,
    #[schema(value_type = Option<String>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delete_workflow: Option<WorkflowId>,
    /// The newest run (in `GET /test/environments/{id}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunView>,
}

/// How the nodes' limits are enforced on this host, as
/// `GET /test/environments` says it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LimitsEnforcement {
    /// `cgroup v1` or `cgroup v2`; absent when the limits cannot be
    /// enforced (then no environment is made).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforced_by: Option<String>,
    /// Why they cannot be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// One step's or check's output, for `logs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LogEntry {
    #[schema(value_type = String)]
    pub workflow_id: WorkflowId,
    /// `create`, `run` or `delete`.
    pub workflow: String,
    pub step: String,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub log: String,
    /// The log was longer; this is its start.
    pub truncated: bool,
}

/// An environment's workflows as storage holds them.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub(super) plan: EnvPlan,
    pub(super) create: Workflow,
    /// Newest first.
    pub(super) runs: Vec<Workflow>,
    /// The newest teardown.
    pub(super) delete: Option<Workflow>,
    /// How many teardowns were submitted (each retry of a failed one is
    /// a new workflow, with its own idempotency key).
    pub(super) deletes: usize,
}

impl Record {
    pub(super) fn status(&self) -> EnvStatus {
        if let Some(delete) = &self.delete {
            return match delete.status {
                WorkflowStatus::Completed => EnvStatus::Deleted,
                WorkflowStatus::Failed | WorkflowStatus::Cancelled => EnvStatus::DeleteFailed,
                _ => EnvStatus::Deleting,
            };
        }
        match self.create.status {
            WorkflowStatus::Completed => EnvStatus::Ready,
            WorkflowStatus::Failed => EnvStatus::Failed,
            WorkflowStatus::Cancelled => EnvStatus::Cancelled,
            _ => EnvStatus::Creating,
        }
    }
}

impl TestEnvs {
    /// Every environment, by id, from its workflows.
    pub(super) async fn records(&self) -> Result<BTreeMap<String, Record>> {
        let list = |kind: &str| WorkflowQuery {
            kind: Some(kind.to_owned()),
            limit: MAX_LISTED,
            ..WorkflowQuery::default()
        };
        let engine = &self.inner.engine;
        let mut records = BTreeMap::new();
        for create in engine.list_workflows(&list(CREATE)).await?.items {
            let Some(plan) = create
                .vars
                .get("env")
                .and_then(|v| serde_json::from_value::<EnvPlan>(v.clone()).ok())
            else {
                continue;
            };
            records.insert(
                plan.id.clone(),
                Record {
                    plan,
                    create,
                    runs: Vec::new(),
                    delete: None,
                    deletes: 0,
                },
            );
        }
        let env_of = |w: &Workflow| {
            w.vars
                .get("env_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        // Listings are newest first: the first delete seen is the newest.
        for run in engine.list_workflows(&list(RUN)).await?.items {
            if let Some(record) = env_of(&run).and_then(|id| records.get_mut(&id)) {
                record.runs.push(run);
            }
        }
        for delete in engine.list_workflows(&list(DELETE)).await?.items {
            if let Some(record) = env_of(&delete).and_then(|id| records.get_mut(&id)) {
                record.deletes += 1;
                if record.delete.is_none() {
                    record.delete = Some(delete);
                }
            }
        }
        let mut env_of = lock(&self.inner.env_of);
        for (id, record) in &records {
            let workflows = [record.create.id]
                .into_iter()
                .chain(record.runs.iter().map(|r| r.id))
                .chain(record.delete.iter().map(|d| d.id));
            for workflow in workflows {
                env_of.entry(workflow).or_insert_with(|| id.clone());
            }
        }
        drop(env_of);
        Ok(records)
    }

    pub(super) async fn record(&self, id: &str) -> Result<Record> {
        if uuid::Uuid::parse_str(id).is_err() {
            return Err(crate::invalid(
                "id",
                format!("`{id}` is not an environment id (a UUID)"),
            ));
        }
        self.records()
            .await?
            .remove(id)
            .ok_or_else(|| Error::NotFound(id.to_owned()))
    }

    /// Each node with its status and its taskservs' versions, from its
    /// install and start steps: the create's, or the newest run's start
    /// when the create did not start the taskservs.
    pub(super) async fn node_views(&self, record: &Record) -> Result<Vec<EnvNodeView>> {
        let plan = &record.plan;
        let deleted = record.status() == EnvStatus::Deleted;
        let mut tasks: Vec<Task> = Vec::new();
        if !deleted {
            tasks = self.inner.engine.workflow(record.create.id).await?.tasks;
            if !plan.auto_start
                && let Some(run) = record.runs.first()
            {
                // The run's start steps come first: they are the newer.
                let mut run_tasks = self.inner.engine.workflow(run.id).await?.tasks;
                run_tasks.append(&mut tasks);
                tasks = run_tasks;
            }
        }
        let step = |name: String| {
            tasks
                .iter()
                .find(|t| t.step.ref_name.as_deref() == Some(name.as_str()))
        };
        Ok(plan
            .nodes
            .iter()
            .map(|node| {
                let install = step(format!("install_{}", node.index));
                let start = step(format!("start_{}", node.index));
                let (status, error) = if deleted {
                    (NodeStatus::Deleted, None)
                } else {
                    node_status(install, start)
                };
                let started: Vec<Value> = start
                    .filter(|t| t.status == TaskStatus::Completed)
                    .and_then(|t| t.output.as_ref())
                    .and_then(|o| o.get("started"))
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let services = node
                    .taskservs
                    .iter()
                    .map(|name| {
                        let info = self.inner.catalog.taskserv(name);
                        let result = started
                            .iter()
                            .find(|r| r.get("taskserv").and_then(Value::as_str) == Some(name))
                            .cloned();
                        TaskservView {
                            name: name.clone(),
                            port: info.map_or(0, |t| t.port),
                            simulated: info.is_some_and(|t| t.simulated),
                            version: result
                                .as_ref()
                                .and_then(|r| r.get("version"))
                                .and_then(Value::as_str)
                                .map(str::to_owned),
                            started: result,
                        }
                    })
                    .collect();
                EnvNodeView {
                    plan: node.clone(),
                    status,
                    error,
                    services,
                }
            })
            .collect())
    }

    pub(super) fn view(
        &self,
        record: &Record,
        nodes: Vec<EnvNodeView>,
        last_run: Option<RunView>,
    ) -> EnvView {
        let plan = &record.plan;
        let error = match &record.delete {
            Some(d) if d.status == WorkflowStatus::Failed => {
                Some("the teardown failed; see the logs, and delete again".to_owned())
            }
            _ if record.create.status == WorkflowStatus::Failed => {
                Some("a step of the create workflow failed; see the logs".to_owned())
            }
            _ => None,
        };
        EnvView {
            id: plan.id.clone(),
            name: plan.name.clone(),
            env_type: plan.env_type,
            topology: plan.topology.clone(),
            status: record.status(),
            provider: self.provider_name().to_owned(),
            nodes,
            auto_start: plan.auto_start,
            auto_cleanup: plan.auto_cleanup,
            ttl_secs: plan.ttl_secs,
            created_at: plan.created_at,
            expires_at: plan.expires_at,
            error,
            create_workflow: record.create.id,
            run_workflows: record.runs.iter().map(|r| r.id).collect(),
            delete_workflow: record.delete.as_ref().map(|d| d.id),
            last_run,
        }
    }

    /// The last lines of a task's log (read in pieces up to its end).
    async fn log_tail(&self, task: TaskId) -> Result<String> {
        let logs = self.inner.engine.store().tasks();
        let mut offset = 0;
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let chunk = logs
                .read_log(task, offset, LOG_TAIL_BYTES)
                .await
                .map_err(orchestrator_engine::Error::from)?;
            if chunk.data.is_empty() {
                break;
            }
            tail.extend_from_slice(&chunk.data);
            if tail.len() > LOG_TAIL_BYTES {
                tail.drain(..tail.len() - LOG_TAIL_BYTES);
            }
            if chunk.next_offset <= offset {
                break;
            }
            offset = chunk.next_offset;
        }
        let text = String::from_utf8_lossy(&tail);
        let lines: Vec<&str> = text.lines().collect();
        Ok(lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n"))
    }

    pub(super) async fn run_view(&self, plan: &EnvPlan, id: WorkflowId) -> Result<RunView> {
        let view = self.inner.engine.workflow(id).await?;
        let mut checks = Vec::with_capacity(plan.checks.len());
        for (i, check) in plan.checks.iter().enumerate() {
            let step = check_step(i);
            let task = view
                .tasks
                .iter()
                .find(|t| t.step.ref_name.as_deref() == Some(step.as_str()));
            let log_tail = match task {
                Some(task) if task.status.is_terminal() => Some(self.log_tail(task.id).await?),
                _ => None,
            };
            checks.push({
                let status = match task.map(|t| t.status) {
                    Some(TaskStatus::Completed) => "passed",
                    Some(
                        TaskStatus::Failed
                        | TaskStatus::Cancelled
                        | TaskStatus::Skipped
                        | TaskStatus::NotStarted,
                    ) => "failed",
                    _ => "pending",
                };
                CheckResult {
                    name: check.name.clone(),
                    node: check.node.clone(),
                    taskserv: check.taskserv.clone(),
                    targets: check.targets.clone(),
                    status: status.to_owned(),
                    error: task.and_then(|t| t.error.clone()),
                    output: task
                        .filter(|t| t.status == TaskStatus::Completed)
                        .and_then(|t| t.output.clone()),
                    log_tail,
                }
            });
        }
        let passed = checks.iter().filter(|c| c.status == "passed").count();
        let failed = checks.iter().filter(|c| c.status == "failed").count();
        let status = if !view.workflow.status.is_terminal() {
            "running"
        } else if failed == 0 && passed == checks.len() {
            "passed"
        } else {
            "failed"
        };
        Ok(RunView {
            workflow_id: id,
            status: status.to_owned(),
            passed,
            failed,
            checks,
        })
    }
}

/// Where a node is from its install and start steps, and why it failed.
/// A step that never ran (its workflow stopped first) is no failure of
/// the node's.
fn node_status(install: Option<&Task>, start: Option<&Task>) -> (NodeStatus, Option<String>) {
    let done = |t: &Task| t.status == TaskStatus::Completed;
    let failed = |t: &Task| matches!(t.status, TaskStatus::Failed | TaskStatus::Cancelled);
    let never = |t: &Task| matches!(t.status, TaskStatus::Skipped | TaskStatus::NotStarted);
    let error = |t: &Task| {
        t.error
            .clone()
            .or_else(|| Some(format!("its step {} ended {}", t.name, t.status)))
    };
    match (install, start) {
        (Some(t), _) | (_, Some(t)) if failed(t) => (NodeStatus::Failed, error(t)),
        (_, Some(t)) if done(t) => (NodeStatus::Running, None),
        (Some(i), Some(s)) if done(i) && !never(s) => (NodeStatus::Starting, None),
        (Some(i), _) if done(i) => (NodeStatus::Installed, None),
        (Some(t), _) if matches!(t.status, TaskStatus::Running | TaskStatus::RetryWaiting) => {
            (NodeStatus::Installing, None)
        }
        _ => (NodeStatus::Creating, None),
    }
}
