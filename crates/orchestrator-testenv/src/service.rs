//! `TestEnvs`: environments as workflows of the engine. An environment's
//! durable record is its `testenv-create` workflow (the plan is its input,
//! stored before any step runs); each `run` is a `testenv-run` workflow and
//! the teardown a `testenv-delete` workflow, both naming the environment.
//! Retries, logs, events, audit and crash recovery are the engine's. This
//! module adds the bounds, the ttl and auto-cleanup loop, the sweep at
//! start that removes what this service made for environments it no
//! longer keeps, and the `environment_changed` events (an environment's
//! changes are its workflows' events, which a page watching environments
//! would otherwise have to map back to them).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::event::{Change, Event, EventKind};
use orchestrator_core::retention::Keep;
use orchestrator_core::template::Template;
use orchestrator_core::{Priority, Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus};
use orchestrator_engine::Engine;
use orchestrator_engine::events::Subscription;
use orchestrator_engine::{Meta, SubmitRequest, TemplateSource};
use orchestrator_storage::WorkflowQuery;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::catalog::Catalog;
use crate::model::{CheckPlan, CreateRequest, EnvNames, EnvPlan, EnvType, NodePlan};
use crate::runner::NodeRunner;
use crate::{Error, Result};

/// Most environments that may exist at once (not yet deleted).
pub const MAX_ENVIRONMENTS: usize = 8;
/// The template names of an environment's workflows.
pub const CREATE: &str = "testenv-create";
pub const RUN: &str = "testenv-run";
pub const DELETE: &str = "testenv-delete";
/// How often expired and auto-cleaned environments are looked for.
const REAP_EVERY: Duration = Duration::from_secs(1);
/// The most of one step's log that `logs` returns.
const MAX_LOG_BYTES: usize = 256 * 1024;
/// The most workflows of one kind that are read to find environments.
const MAX_LISTED: usize = 2000;
/// The most lines of a check's log in its result.
const LOG_TAIL_LINES: usize = 12;
/// How much of a check's log is read for its tail, at most.
const LOG_TAIL_BYTES: usize = 16 * 1024;
/// How long a delete waits for a cancelled create or run to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(60);
/// How long an environment's changes are gathered into one
/// `environment_changed` event: a create's burst of task events becomes
/// a few events, each after one re-read of the store.
const ANNOUNCE_AFTER: Duration = Duration::from_millis(250);

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
    fn is_live(self) -> bool {
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
struct Record {
    plan: EnvPlan,
    create: Workflow,
    /// Newest first.
    runs: Vec<Workflow>,
    /// The newest teardown.
    delete: Option<Workflow>,
    /// How many teardowns were submitted (each retry of a failed one is
    /// a new workflow, with its own idempotency key).
    deletes: usize,
}

impl Record {
    fn status(&self) -> EnvStatus {
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

/// The test environment service. Cheap to clone.
#[derive(Clone)]
pub struct TestEnvs {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    runner: NodeRunner,
    catalog: Arc<Catalog>,
    /// This service's tag, in every name it gives.
    tag: String,
    /// Held while an environment is counted and its workflow submitted, so
    /// that two creates at once cannot both take the last place (a tokio
    /// mutex: the submission is awaited while it is held).
    admitting: tokio::sync::Mutex<()>,
    /// Stops the ttl loop.
    stop: CancellationToken,
    /// Creates so far (counted after each submission), and the count at
    /// the last time the ttl loop found no environment left to watch
    /// (`u64::MAX`: it did find some). The loop lists workflows only when
    /// the two differ, so an idle service does not scan its store every
    /// second; atomics, because the loop and the creates only compare
    /// and store counts.
    creates: AtomicU64,
    idle_at: AtomicU64,
    /// Which environment each of its workflows belongs to, as this life
    /// of the service has seen them (listed or submitted): how an engine
    /// event is known to be an environment's. A few entries per
    /// environment; std mutexes, never held across an await.
    env_of: Mutex<HashMap<WorkflowId, String>>,
    /// Environments changed since the last `environment_changed` events,
    /// and whether every live one should be announced (events were lost).
    changed: Mutex<Changed>,
    /// Wakes the announcer when a submission changed an environment.
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Changed {
    ids: BTreeSet<String>,
    every_live: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // What the mutexes guard stays whole under a panic (inserts only).
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl TestEnvs {
    /// The service over a started engine whose steps include `runner` (as
    /// kind `testenv`). Sweeps what earlier lives left for environments it
    /// no longer keeps, then watches ttls and auto-cleanup until
    /// [`TestEnvs::stop`].
    pub fn start(
        engine: Engine,
        runner: NodeRunner,
        catalog: Arc<Catalog>,
        tag: String,
    ) -> TestEnvs {
        let envs = TestEnvs {
            inner: Arc::new(Inner {
                engine,
                runner,
                catalog,
                tag,
                admitting: tokio::sync::Mutex::new(()),
                stop: CancellationToken::new(),
                creates: AtomicU64::new(0),
                idle_at: AtomicU64::new(u64::MAX),
                env_of: Mutex::new(HashMap::new()),
                changed: Mutex::new(Changed::default()),
                wake: tokio::sync::Notify::new(),
            }),
        };
        // Subscribed before anything is submitted, so no change is missed.
        let announcer = envs.clone();
        let events = envs.inner.engine.subscribe();
        tokio::spawn(async move { announcer.announce_changes(events).await });
        let background = envs.clone();
        tokio::spawn(async move {
            if let Err(e) = background.sweep().await {
                tracing::warn!(error = %e, "test environments: the sweep at start failed");
            }
            let mut tick = tokio::time::interval(REAP_EVERY);
            loop {
                tokio::select! {
                    () = background.inner.stop.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let inner = &background.inner;
                let creates = inner.creates.load(Ordering::SeqCst);
                if inner.idle_at.load(Ordering::SeqCst) == creates {
                    continue;
                }
                match background.reap(Utc::now()).await {
                    Ok(0) => inner.idle_at.store(creates, Ordering::SeqCst),
                    Ok(_) => inner.idle_at.store(u64::MAX, Ordering::SeqCst),
                    Err(e) => tracing::debug!(error = %e, "test environments: reaping failed"),
                }
            }
        });
        envs
    }

    /// Announces `environment_changed` for each environment whose
    /// workflows changed (their engine events) or that a submission
    /// changed, gathered for [`ANNOUNCE_AFTER`]; each event carries the
    /// environment's status as the store holds it after the change.
    async fn announce_changes(self, mut events: Subscription) {
        let inner = &self.inner;
        let mut due: Option<tokio::time::Instant> = None;
        loop {
            let flush = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = inner.stop.cancelled() => break,
                () = inner.wake.notified() => {}
                event = events.recv() => match event {
                    Some(event) => self.note(&event),
                    None => break,
                },
                () = flush => {
                    due = None;
                    self.announce().await;
                    continue;
                }
            }
            let pending = {
                let changed = lock(&inner.changed);
                changed.every_live || !changed.ids.is_empty()
            };
            if due.is_none() && pending {
                due = Some(tokio::time::Instant::now() + ANNOUNCE_AFTER);
            }
        }
    }

    /// Notes the environment an engine event is about, if any.
    fn note(&self, event: &Event) {
        match event.kind {
            // Lost events may have changed any environment.
            EventKind::Resync => lock(&self.inner.changed).every_live = true,
            // A log growing changes no status; our own events are ours.
            EventKind::LogAppended | EventKind::EnvironmentChanged => {}
            _ => {
                let Some(workflow) = event.workflow_id else {
                    return;
                };
                let env = lock(&self.inner.env_of).get(&workflow).cloned();
                if let Some(env) = env {
                    lock(&self.inner.changed).ids.insert(env);
                }
            }
        }
    }

    /// One `environment_changed` per noted environment, with its status
    /// read back from the store.
    async fn announce(&self) {
        let changed = std::mem::take(&mut *lock(&self.inner.changed));
        let records = match self.records().await {
            Ok(records) => records,
            Err(e) => {
                // The page re-reads when its stream resumes; nothing to keep.
                tracing::debug!(error = %e, "test environments: cannot read them to announce a change");
                return;
            }
        };
        for (id, record) in &records {
            let status = record.status();
            if changed.ids.contains(id) || (changed.every_live && status.is_live()) {
                self.inner.engine.announce(Change::environment_changed(
                    id.clone(),
                    status.as_str().to_owned(),
                ));
            }
        }
    }

    /// Remembers whose a workflow is, and that the environment changed.
    fn changed(&self, workflow: WorkflowId, env: &str) {
        lock(&self.inner.env_of).insert(workflow, env.to_owned());
        lock(&self.inner.changed).ids.insert(env.to_owned());
        self.inner.wake.notify_one();
    }

    /// Stops the ttl loop (at shutdown).
    pub fn stop(&self) {
        self.inner.stop.cancel();
    }

    pub fn catalog(&self) -> &Catalog {
        &self.inner.catalog
    }

    pub fn provider_name(&self) -> &'static str {
        self.inner.runner.provider().name()
    }

    /// How this host enforces the nodes' limits, or why it cannot.
    pub fn limits_enforcement(&self) -> LimitsEnforcement {
        match self.inner.runner.provider().limits_enforcement() {
            Ok(by) => LimitsEnforcement {
                enforced_by: Some(by),
                unavailable: None,
            },
            Err(reason) => LimitsEnforcement {
                enforced_by: None,
                unavailable: Some(reason),
            },
        }
    }

    /// Plans the environment, checks privileges and bounds, and stores its
    /// create workflow (the durable record) before anything is made.
    pub async fn create(&self, request: CreateRequest, wait: Option<Duration>) -> Result<EnvView> {
        let id = uuid::Uuid::now_v7();
        let plan = EnvPlan::new(
            &request,
            &self.inner.catalog,
            id,
            &self.inner.tag,
            Utc::now(),
        )?;
        let missing = self.inner.runner.provider().missing_privileges();
        if !missing.is_empty() {
            return Err(Error::Privileges(format!(
                "test environments need CAP_SYS_ADMIN and CAP_NET_ADMIN (root, or the unit's \
                 test-environments drop-in); this service lacks {}; nothing was made",
                missing.join(", ")
            )));
        }
        self.inner.runner.provider().health().await?;
        if let Err(reason) = self.inner.runner.provider().limits_enforcement() {
            return Err(Error::Unsupported(reason));
        }
        let workflow = {
            let _admitting = self.inner.admitting.lock().await;
            let live = self
                .records()
                .await?
                .values()
                .filter(|r| r.status().is_live())
                .count();
            if live >= MAX_ENVIRONMENTS {
                return Err(Error::Limit(format!(
                    "{live} test environments exist, the most this service keeps at once is \
                     {MAX_ENVIRONMENTS}; delete one first"
                )));
            }
            let submitted = self
                .submit(
                    create_template(&plan)?,
                    &plan,
                    format!("testenv-create-{}", plan.id),
                )
                .await;
            // Counted once the record is stored (or refused): a loop that
            // reads this count lists a store holding every create counted,
            // so it cannot note "idle" over an environment it missed.
            self.inner.creates.fetch_add(1, Ordering::SeqCst);
            submitted?
        };
        tracing::info!(env = %plan.id, workflow = %workflow, nodes = plan.nodes.len(), "test environment accepted");
        if let Some(limit) = wait {
            self.inner.engine.wait_for_workflow(workflow, limit).await?;
        }
        self.show(&plan.id).await
    }

    /// Every environment this service keeps, newest first (deleted ones too).
    pub async fn list(&self) -> Result<Vec<EnvView>> {
        let records = self.records().await?;
        let mut views = Vec::with_capacity(records.len());
        for record in records.into_values() {
            let nodes = self.node_views(&record).await?;
            views.push(self.view(&record, nodes, None));
        }
        views.sort_by_key(|v| std::cmp::Reverse(v.created_at));
        Ok(views)
    }

    /// One environment, with its newest run's checks.
    pub async fn show(&self, id: &str) -> Result<EnvView> {
        let record = self.record(id).await?;
        let last_run = match record.runs.first() {
            Some(run) => Some(self.run_view(&record.plan, run.id).await?),
            None => None,
        };
        let nodes = self.node_views(&record).await?;
        Ok(self.view(&record, nodes, last_run))
    }

    /// Starts a run: each taskserv's check on its node, then the topology's
    /// checks across nodes (all of them, whatever fails).
    pub async fn run(&self, id: &str, wait: Option<Duration>) -> Result<EnvView> {
        let record = self.record(id).await?;
        let status = record.status();
        if status != EnvStatus::Ready {
            return Err(Error::Conflict(format!(
                "environment {id} is {}; only a ready environment runs its checks",
                json!(status).as_str().unwrap_or_default()
            )));
        }
        if record.runs.iter().any(|r| !r.status.is_terminal()) {
            return Err(Error::Conflict(format!(
                "environment {id} is running its checks already"
            )));
        }
        let plan = &record.plan;
        let workflow = self
            .submit(
                run_template(plan)?,
                plan,
                format!("testenv-run-{}-{}", plan.id, record.runs.len() + 1),
            )
            .await?;
        if let Some(limit) = wait {
            self.inner.engine.wait_for_workflow(workflow, limit).await?;
        }
        self.show(id).await
    }

    /// Tears the environment down: a create or run still going is
    /// cancelled first, then the teardown workflow runs. Deleting twice
    /// returns the first teardown (or retries a failed one).
    pub async fn delete(&self, id: &str, wait: Option<Duration>) -> Result<EnvView> {
        let record = self.record(id).await?;
        let workflow = self.teardown(&record, "deleted on request").await?;
        if let Some(limit) = wait {
            self.inner.engine.wait_for_workflow(workflow, limit).await?;
        }
        self.show(id).await
    }

    /// Every step's and check's output, in order: create, runs, teardown.
    pub async fn logs(&self, id: &str) -> Result<Vec<LogEntry>> {
        let record = self.record(id).await?;
        let mut workflows: Vec<(&str, WorkflowId)> = vec![("create", record.create.id)];
        workflows.extend(record.runs.iter().rev().map(|r| ("run", r.id)));
        workflows.extend(record.delete.iter().map(|d| ("delete", d.id)));
        let mut entries = Vec::new();
        for (kind, workflow_id) in workflows {
            let view = self.inner.engine.workflow(workflow_id).await?;
            for task in &view.tasks {
                let chunk = self
                    .inner
                    .engine
                    .store()
                    .tasks()
                    .read_log(task.id, 0, MAX_LOG_BYTES + 1)
                    .await
                    .map_err(orchestrator_engine::Error::from)?;
                let truncated = chunk.data.len() > MAX_LOG_BYTES;
                let data = &chunk.data[..chunk.data.len().min(MAX_LOG_BYTES)];
                entries.push(LogEntry {
                    workflow_id,
                    workflow: kind.to_owned(),
                    step: task.name.clone(),
                    status: task.status.to_string(),
                    error: task.error.clone(),
                    log: String::from_utf8_lossy(data).into_owned(),
                    truncated,
                });
            }
        }
        Ok(entries)
    }

    /// Deletes what has expired, and what asked for cleanup after a run
    /// that has finished; how many environments are not deleted yet.
    async fn reap(&self, now: DateTime<Utc>) -> Result<usize> {
        let records = self.records().await?;
        let live = records.values().filter(|r| r.status().is_live()).count();
        for record in records.values() {
            if record.delete.is_some() {
                continue;
            }
            let reason = if now >= record.plan.expires_at {
                "its ttl expired"
            } else if record.plan.auto_cleanup
                && record.runs.first().is_some_and(|r| r.status.is_terminal())
            {
                "auto_cleanup after its run"
            } else {
                continue;
            };
            if let Err(e) = self.teardown(record, reason).await {
                tracing::warn!(env = %record.plan.id, error = %e, "cannot tear down a test environment");
            }
        }
        Ok(live)
    }

    /// Removes what this service's earlier lives made for environments it
    /// no longer keeps (deleted, or never recorded): names carry the
    /// service's tag, so nothing of another service is touched. An
    /// environment still kept is left to its workflows.
    pub async fn sweep(&self) -> Result<usize> {
        let kept: Vec<EnvNames> = self
            .records()
            .await?
            .values()
            .filter(|r| r.status().is_live())
            .map(|r| r.plan.names())
            .collect();
        let provider = self.inner.runner.provider();
        if !provider.missing_privileges().is_empty() || provider.health().await.is_err() {
            return Ok(0);
        }
        let root = self.inner.runner.root();
        let mut removed = 0;
        for names in provider.existing(&self.inner.tag, root).await? {
            if kept.contains(&names) {
                continue;
            }
            tracing::info!(key = %names.key, "removing what a test environment left");
            removed += provider.destroy(&names, root).await?;
        }
        Ok(removed)
    }

    async fn teardown(&self, record: &Record, reason: &str) -> Result<WorkflowId> {
        let engine = &self.inner.engine;
        // Whatever still makes or uses the nodes stops first, so that
        // nothing is made after the teardown removed it.
        let mut going: Vec<WorkflowId> = record
            .runs
            .iter()
            .filter(|r| !r.status.is_terminal())
            .map(|r| r.id)
            .collect();
        if !record.create.status.is_terminal() {
            going.push(record.create.id);
        }
        for id in going {
            match engine.cancel_workflow(id).await {
                Ok(_) | Err(orchestrator_engine::Error::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            }
            engine.wait_for_workflow(id, CANCEL_WAIT).await?;
        }
        if let Some(delete) = &record.delete
            && !matches!(
                delete.status,
                WorkflowStatus::Failed | WorkflowStatus::Cancelled
            )
        {
            return Ok(delete.id);
        }
        let attempt = record.deletes + 1;
        let plan = &record.plan;
        tracing::info!(env = %plan.id, reason, attempt, "tearing down a test environment");
        self.submit(
            delete_template(plan)?,
            plan,
            format!("testenv-delete-{}-{attempt}", plan.id),
        )
        .await
    }

    async fn submit(&self, template: Template, plan: &EnvPlan, key: String) -> Result<WorkflowId> {
        let mut vars = Map::new();
        vars.insert("env_id".to_owned(), json!(plan.id));
        if template.ref_name == CREATE {
            vars.insert(
                "env".to_owned(),
                serde_json::to_value(plan).unwrap_or_default(),
            );
        }
        let body = json!({"template": template.ref_name, "vars": vars});
        let (view, _) = self
            .inner
            .engine
            .submit(SubmitRequest {
                // The rest as for any submission (`..`: fields added to
                // `Meta` later take their defaults here).
                meta: Meta {
                    name: Some(format!("{} {}", template.name, plan.name)),
                    description: Some(format!("test environment {}", plan.id)),
                    // Retention must not take an environment's record while
                    // it may still live: keep it a day past its ttl, whatever
                    // `--retain-finished` says.
                    retain: Some(Keep::For(Duration::from_secs(plan.ttl_secs + 24 * 3600))),
                    ..Meta::default()
                },
                template: TemplateSource::Inline(Box::new(template)),
                vars,
                start_at: None,
                check_mode: false,
                priority: Priority::default(),
                max_attempts: None,
                timeout: None,
                parallel_limit: None,
                idempotency_key: Some(key),
                body,
            })
            .await?;
        // Stored: the environment is creating, running or deleting now.
        self.changed(view.workflow.id, &plan.id);
        Ok(view.workflow.id)
    }

    /// Every environment, by id, from its workflows.
    async fn records(&self) -> Result<BTreeMap<String, Record>> {
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

    async fn record(&self, id: &str) -> Result<Record> {
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
    async fn node_views(&self, record: &Record) -> Result<Vec<EnvNodeView>> {
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

    fn view(&self, record: &Record, nodes: Vec<EnvNodeView>, last_run: Option<RunView>) -> EnvView {
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

    async fn run_view(&self, plan: &EnvPlan, id: WorkflowId) -> Result<RunView> {
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

fn check_step(index: usize) -> String {
    format!("check_{index}")
}

/// A step of an environment's workflow: `testenv/<action>` with the plan.
fn step(
    ref_name: String,
    name: String,
    action: &str,
    plan: &EnvPlan,
    extra: Value,
    depends_on: Vec<String>,
    retries: u32,
) -> Value {
    let mut input = json!({"env": plan});
    if let (Some(input), Value::Object(extra)) = (input.as_object_mut(), extra) {
        input.extend(extra);
    }
    json!({
        "ref_name": ref_name,
        "name": name,
        "kind": "testenv",
        "script": format!("testenv/{action}"),
        "input": input,
        "depends_on": depends_on,
        "retries": retries,
        "timeout": "300s",
    })
}

fn template(
    ref_name: &str,
    name: &str,
    on_failure: &str,
    steps: Vec<Value>,
    create: bool,
) -> Result<Template> {
    let mut inputs = json!({"env_id": {"type": "string"}});
    if create {
        inputs["env"] = json!({"type": "object"});
    }
    serde_json::from_value(json!({
        "name": name,
        "ref_name": ref_name,
        "schema_version": 1,
        "on_failure": on_failure,
        "inputs": inputs,
        "steps": steps,
    }))
    .map_err(|e| Error::Provider(format!("cannot build the {ref_name} workflow: {e}")))
}

fn start_steps(plan: &EnvPlan, after: impl Fn(&NodePlan) -> Vec<String>) -> Vec<Value> {
    plan.nodes
        .iter()
        .map(|node| {
            step(
                format!("start_{}", node.index),
                format!("start the taskservs of {}", node.name),
                "start",
                plan,
                json!({"node": node.name}),
                after(node),
                2,
            )
        })
        .collect()
}

/// Make the nodes; install each node's taskservs with the production
/// scripts; start them (with `auto_start`).
fn create_template(plan: &EnvPlan) -> Result<Template> {
    let mut steps = vec![step(
        "nodes".to_owned(),
        format!("make the nodes of {}", plan.name),
        "nodes",
        plan,
        json!({}),
        vec![],
        2,
    )];
    for node in &plan.nodes {
        steps.push(step(
            format!("install_{}", node.index),
            format!("install {} on {}", node.taskservs.join(", "), node.name),
            "install",
            plan,
            json!({"node": node.name}),
            vec!["nodes".to_owned()],
            2,
        ));
    }
    if plan.auto_start {
        steps.extend(start_steps(plan, |node| {
            vec![format!("install_{}", node.index)]
        }));
    }
    template(CREATE, "test environment", "fail", steps, true)
}

/// The checks, each on its own (a failed check stops none of the others);
/// the services first if the create did not start them.
fn run_template(plan: &EnvPlan) -> Result<Template> {
    let mut steps = Vec::new();
    let mut after = Vec::new();
    if !plan.auto_start {
        steps.extend(start_steps(plan, |_| vec![]));
        after = plan
            .nodes
            .iter()
            .map(|n| format!("start_{}", n.index))
            .collect();
    }
    for (i, check) in plan.checks.iter().enumerate() {
        steps.push(check_step_value(plan, i, check, after.clone()));
    }
    template(RUN, "test run", "continue", steps, false)
}

fn check_step_value(plan: &EnvPlan, index: usize, check: &CheckPlan, after: Vec<String>) -> Value {
    step(
        check_step(index),
        format!("check {}", check.name),
        "check",
        plan,
        json!({"check": check}),
        after,
        0,
    )
}

fn delete_template(plan: &EnvPlan) -> Result<Template> {
    let steps = vec![step(
        "teardown".to_owned(),
        format!("tear down {}", plan.name),
        "teardown",
        plan,
        json!({}),
        vec![],
        3,
    )];
    template(DELETE, "test environment teardown", "fail", steps, false)
}
