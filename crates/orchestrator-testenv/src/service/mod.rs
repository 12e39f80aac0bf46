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
//!
//! Here: `TestEnvs`, its operations and the announcing loop; `views`:
//! what callers see, built from the stored workflows; `templates`: the
//! environment's workflow templates.

mod templates;
mod views;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::event::{Change, Event, EventKind};
use orchestrator_core::retention::Keep;
use orchestrator_core::template::Template;
use orchestrator_core::{Priority, WorkflowId, WorkflowStatus};
use orchestrator_engine::Engine;
use orchestrator_engine::events::Subscription;
use orchestrator_engine::{Meta, SubmitRequest, TemplateSource};
use serde_json::{Map, json};
use tokio_util::sync::CancellationToken;

use crate::catalog::Catalog;
use crate::model::{CreateRequest, EnvNames, EnvPlan};
use crate::runner::NodeRunner;
use crate::{Error, Result};

use templates::{create_template, delete_template, run_template};
use views::Record;
pub use views::{
    CheckResult, EnvNodeView, EnvStatus, EnvView, LimitsEnforcement, LogEntry, NodeStatus, RunView,
    TaskservView,
};

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
/// How long a delete waits for a cancelled create or run to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(60);
/// How long an environment's changes are gathered into one
/// `environment_changed` event: a create's burst of task events becomes
/// a few events, each after one re-read of the store.
const ANNOUNCE_AFTER: Duration = Duration::from_millis(250);

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
}
