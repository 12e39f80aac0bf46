//! The engine's public face: it wires the components together at start,
//! answers queries, hands out event subscriptions, and shuts down.
//!
//! ```text
//!   Engine ──▶ submit ─┐
//!     │                ▼
//!     ├──▶ dispatch ──▶ lifecycle ──▶ records ──▶ storage
//!     │        │            │            └──────▶ events ──▶ subscribers
//!     ├──▶ cluster ─────────┤
//!     │        └─ change feed (shared store) ───▶ events
//!     ├──▶ scheduler ───────┘ (due runs submitted back through the engine)
//!     └── queue, attempts, steps, access, secrets (leaves)
//! ```

use std::sync::Arc;
use std::time::Duration;

use orchestrator_core::{
    Node, Priority, RetryPolicy, Task, TaskId, Workflow, WorkflowId, WorkflowStatus,
};
use orchestrator_executor::ScriptExecutor;
use orchestrator_storage::live::LiveMigrations;
use orchestrator_storage::{Page, Storage, TaskQuery, WorkflowQuery};
use tokio_util::sync::CancellationToken;

use crate::access::{Access, AccessConfig};
use crate::approvals::{DecisionOutcome, DecisionRequest, Gates, PendingApproval};
use crate::attempts::Attempts;
use crate::cluster::{Cluster, Timing};
use crate::dispatch::{Dispatcher, DispatcherParts};
use crate::events::{DEFAULT_CAPACITY, EventBus, Subscription};
use crate::lifecycle::Lifecycle;
use crate::locks::{self, Locks};
use crate::queue::Queue;
use crate::records::Records;
use crate::retention::{self, PruneReport, PruneRequest, RetentionConfig};
use crate::scheduler::Scheduler;
use crate::secrets::Secrets;
use crate::steps::Steps;
use crate::templates::Templates;
use crate::{Error, Result, WorkflowView};

/// Runtime settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Steps that may run at once.
    pub workers: usize,
    /// Attempts per task when neither the template nor the submission says.
    pub default_max_attempts: u32,
    /// Per-attempt timeout when neither the template nor the submission says.
    pub default_timeout: Duration,
    pub retry: RetryPolicy,
    /// This instance's stable id, recorded on every attempt it runs.
    pub node_id: String,
    /// Where this instance's API listens, for `GET /cluster/nodes`.
    pub address: String,
    /// How long a claim on a running task holds without renewal; heartbeats
    /// renew it three times per period. Past it, another node takes over.
    pub lease: Duration,
    /// How often a node on a shared store looks through it for work other
    /// nodes accepted and for leases that ran out. New work also arrives at
    /// once through the change feed; the poll is what the feed may miss.
    pub poll: Duration,
    /// Tokens, roles and rate limits.
    pub access: AccessConfig,
    /// How far an event subscriber may fall behind before it must resync,
    /// and how many events are kept for resumption.
    pub event_capacity: usize,
    /// How long finished workflows and audit records are kept.
    pub retention: RetentionConfig,
    /// How much work one submission may ask for (instances, tasks, steps,
    /// list items, bytes); checked before anything is built.
    pub limits: orchestrator_core::template::Limits,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            default_max_attempts: 3,
            default_timeout: Duration::from_secs(3600),
            retry: RetryPolicy::default(),
            node_id: "local".to_owned(),
            address: String::new(),
            lease: Duration::from_secs(15),
            poll: Duration::from_secs(1),
            access: AccessConfig::default(),
            event_capacity: DEFAULT_CAPACITY,
            retention: RetentionConfig::default(),
            limits: orchestrator_core::template::Limits::default(),
        }
    }
}

/// The running engine. Clones share one runtime.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

/// The components, each with its own state; see the module docs for who
/// uses whom.
pub(crate) struct Inner {
    pub(crate) store: Storage,
    pub(crate) config: EngineConfig,
    pub(crate) templates: Templates,
    pub(crate) steps: Steps,
    access: Arc<Access>,
    secrets: Arc<Secrets>,
    pub(crate) events: Arc<EventBus>,
    pub(crate) records: Arc<Records>,
    pub(crate) queue: Arc<Queue>,
    attempts: Arc<Attempts>,
    pub(crate) lifecycle: Arc<Lifecycle>,
    dispatcher: Arc<Dispatcher>,
    cluster: Arc<Cluster>,
    pub(crate) scheduler: Arc<Scheduler>,
    /// Approval gates: their digests, decisions and deadlines.
    gates: Arc<Gates>,
    /// Set when shutdown begins: nothing new is dispatched or accepted.
    pub(crate) stopping: CancellationToken,
    /// Set when shutdown is over: heartbeats and lease renewal stop.
    closed: CancellationToken,
    /// The service's live storage migrations, once attached.
    live: std::sync::OnceLock<LiveMigrations>,
    /// Webhook notifications, once attached.
    webhooks: std::sync::OnceLock<Arc<crate::webhooks::Webhooks>>,
    pub(crate) locks: Arc<Locks>,
}

impl Engine {
    /// Recovers unfinished work from storage and starts dispatching, with
    /// the `script` kind only.
    pub async fn start(
        store: Storage,
        executor: ScriptExecutor,
        templates: Templates,
        config: EngineConfig,
    ) -> Result<Engine> {
        Engine::start_with_steps(store, Steps::new(executor), templates, config).await
    }

    /// As [`Engine::start`], with the runners of every step kind this
    /// service runs (`Steps::with` adds `http`, for example).
    pub async fn start_with_steps(
        store: Storage,
        steps: Steps,
        templates: Templates,
        config: EngineConfig,
    ) -> Result<Engine> {
        let config = EngineConfig {
            workers: config.workers.max(1),
            ..config
        };
        let access = Arc::new(Access::load(store.clone(), config.access.clone()).await?);
        let secret_key = config.access.secret_key.unwrap_or_else(|| {
            let mut key = [0u8; 32];
            rand::RngCore::fill_bytes(&mut rand::rng(), &mut key);
            key
        });
        let secrets = Arc::new(Secrets::load(store.clone(), secret_key).await?);
        let events = Arc::new(EventBus::new(config.node_id.clone(), config.event_capacity));
        let records = Arc::new(Records::new(store.clone(), events.clone()));
        let queue = Arc::new(Queue::default());
        let attempts = Arc::new(Attempts::default());
        let lifecycle = Arc::new(Lifecycle::new(
            records.clone(),
            queue.clone(),
            attempts.clone(),
            steps.clone(),
            config.retry,
            config.node_id.clone(),
        ));
        // This life of the node: its heartbeats name it, and lock holds
        // last while it does.
        let started_at = chrono::Utc::now();
        let locks = Arc::new(Locks::new(
            records.clone(),
            orchestrator_core::lock::NodeLife {
                node: config.node_id.clone(),
                life: started_at,
            },
            config.lease,
        ));
        let dispatcher = Arc::new(Dispatcher::new(DispatcherParts {
            records: records.clone(),
            queue: queue.clone(),
            attempts: attempts.clone(),
            lifecycle: lifecycle.clone(),
            steps: steps.clone(),
            secrets: secrets.clone(),
            access: access.clone(),
            node_id: config.node_id.clone(),
            lease: config.lease,
            workers: config.workers,
            locks: locks.clone(),
        }));
        let cluster = Arc::new(Cluster::new(
            records.clone(),
            queue.clone(),
            attempts.clone(),
            lifecycle.clone(),
            config.node_id.clone(),
            config.address.clone(),
            Timing {
                lease: config.lease,
                poll: config.poll,
                started_at,
            },
        ));
        let scheduler = Arc::new(Scheduler::new(
            store.clone(),
            lifecycle.clone(),
            config.node_id.clone(),
            events.clone(),
        ));
        let gates = Arc::new(Gates {
            store: store.clone(),
            templates: templates.clone(),
            scripts_dir: steps.scripts().config().scripts_dir.clone(),
            records: records.clone(),
            lifecycle: lifecycle.clone(),
        });
        let inner = Arc::new(Inner {
            store,
            config,
            templates,
            steps,
            access,
            secrets,
            events: events.clone(),
            records,
            queue,
            attempts,
            lifecycle: lifecycle.clone(),
            dispatcher: dispatcher.clone(),
            cluster: cluster.clone(),
            scheduler: scheduler.clone(),
            gates: gates.clone(),
            stopping: CancellationToken::new(),
            closed: CancellationToken::new(),
            live: std::sync::OnceLock::new(),
            webhooks: std::sync::OnceLock::new(),
            locks: locks.clone(),
        });
        cluster.heartbeat().await?;
        // Listening before recovering, and before the start returns: what
        // recovery, a client or another node changes from now on is heard.
        if let Some(feed) = cluster.listen().await {
            tokio::spawn(
                cluster
                    .clone()
                    .follow_changes(feed, events, inner.closed.clone()),
            );
        }
        lifecycle.recover().await?;
        tokio::spawn(dispatcher.run(inner.stopping.clone()));
        tokio::spawn(cluster.run(inner.stopping.clone(), inner.closed.clone()));
        tokio::spawn(locks::sweep_every(
            locks.clone(),
            (inner.config.lease / 3).max(std::time::Duration::from_millis(100)),
            inner.stopping.clone(),
        ));
        let stopping = inner.stopping.clone();
        let engine = Engine { inner };
        // Due runs are submitted like `POST /workflows`, through the engine.
        tokio::spawn(scheduler.run(Arc::new(engine.clone()), stopping.clone()));
        tokio::spawn(crate::approvals::run(gates, stopping.clone()));
        tokio::spawn(retention::run(
            engine.inner.store.clone(),
            engine.inner.config.retention,
            stopping,
        ));
        Ok(engine)
    }

    pub fn store(&self) -> &Storage {
        &self.inner.store
    }

    /// Attaches the storage moves of the store this engine runs on
    /// (`orchestrator_storage::live::wrap` made both): their status
    /// changes become `storage_migration` events.
    pub fn attach_live_migrations(&self, live: LiveMigrations) {
        live.observe(Arc::new(MoveEvents(self.inner.events.clone())));
        let _ = self.inner.live.set(live);
    }

    /// The storage moves, where the service attached them.
    pub fn live_migrations(&self) -> Option<&LiveMigrations> {
        self.inner.live.get()
    }

    /// Starts webhook notifications, sent through `sender` (which knows
    /// HTTP and the allowlist). Once; a second call changes nothing.
    pub fn attach_webhooks(
        &self,
        sender: Arc<dyn crate::webhooks::WebhookSender>,
        config: crate::webhooks::WebhookConfig,
    ) {
        let inner = &self.inner;
        let webhooks = Arc::new(crate::webhooks::Webhooks::new(
            inner.store.clone(),
            inner.secrets.clone(),
            sender,
            config,
            inner.config.node_id.clone(),
        ));
        if inner.webhooks.set(webhooks.clone()).is_ok() {
            webhooks.start(&inner.events, inner.stopping.clone());
        }
    }

    /// Webhook notifications, where the service attached them.
    pub fn webhooks(&self) -> Option<&crate::webhooks::Webhooks> {
        self.inner.webhooks.get().map(|w| &**w)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Tokens and the audit log.
    pub fn access(&self) -> &Access {
        &self.inner.access
    }

    /// Encrypted secrets, and the redaction of their values.
    pub fn secrets(&self) -> &Secrets {
        &self.inner.secrets
    }

    pub fn templates(&self) -> &Templates {
        &self.inner.templates
    }

    /// The step kinds this engine runs.
    pub fn steps(&self) -> &Steps {
        &self.inner.steps
    }

    pub fn executor(&self) -> &ScriptExecutor {
        self.inner.steps.scripts()
    }

    /// Events from now on: every durable change of a task or workflow,
    /// on a shared store every node's.
    /// Every lock that has a holder or a waiter, by name (`GET /locks`).
    pub async fn locks(&self) -> Result<Vec<orchestrator_core::lock::LockRecord>> {
        Ok(self
            .inner
            .locks
            .list()
            .await?
            .into_iter()
            .filter(|l| !l.idle())
            .collect())
    }

    pub fn subscribe(&self) -> Subscription {
        self.inner.events.subscribe()
    }

    /// Events after `seq` (of this node's numbering), then live ones; a
    /// `resync` first if some can no longer be replayed.
    pub fn subscribe_after(&self, seq: u64) -> Subscription {
        self.inner.events.subscribe_after(seq)
    }

    /// Announces a change made beside the engine (a test environment's),
    /// on this node only: call it once the change is stored.
    pub fn announce(&self, change: orchestrator_core::event::Change) {
        self.inner.events.publish([change]);
    }

    /// Tells this life of the node from earlier ones, whose event numbers
    /// mean nothing now.
    pub fn event_life(&self) -> Arc<str> {
        self.inner.events.life()
    }

    /// The `seq` of this node's newest event.
    pub fn last_event_seq(&self) -> u64 {
        self.inner.events.last_seq()
    }

    /// Every node that shares the store, and whether it is alive.
    pub async fn nodes(&self) -> Result<Vec<(Node, bool)>> {
        self.inner.cluster.nodes().await
    }

    /// Entries in the queue (cancelled ones until they are popped) and
    /// attempts running now.
    pub fn load(&self) -> (usize, usize) {
        (self.inner.queue.len(), self.inner.attempts.len())
    }

    /// Tasks in the ready queue that may run now, by priority (lowest
    /// first), and those waiting for a due time (retries, scheduled
    /// starts): what `GET /metrics` reports as the queue depth.
    pub fn queue_depth(&self) -> ([(Priority, usize); 4], usize) {
        self.inner.queue.depth()
    }

    /// One task as shown: its checkpoint redacted with the secrets known
    /// now, for a checkpoint saved before checkpoints were redacted on
    /// saving (`GET /tasks/{id}` shows it to every role).
    pub async fn task(&self, id: TaskId) -> Result<Task> {
        let mut task = self.inner.lifecycle.load_task(id).await?;
        if !task.checkpoint.is_empty() {
            let checkpoint = std::mem::take(&mut task.checkpoint);
            task.checkpoint =
                crate::secrets::redacted_entries(&self.inner.secrets.redactor(), checkpoint);
        }
        Ok(task)
    }

    pub async fn workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        let workflow = self.inner.lifecycle.load_workflow(id).await?;
        let tasks = self.inner.store.tasks().workflow_tasks(id).await?;
        let tasks = tasks.into_iter().map(Arc::unwrap_or_clone).collect();
        Ok(WorkflowView::new(workflow, tasks))
    }

    pub async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        Ok(self.inner.store.tasks().list_tasks(query).await?)
    }

    pub async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        Ok(self.inner.store.tasks().list_workflows(query).await?)
    }

    /// How many workflows match `base` (its status, limit and offset
    /// ignored), by status: one count per status, each answered by storage
    /// as the total of an empty page, so nothing is loaded.
    pub async fn count_workflows_by_status(
        &self,
        base: &WorkflowQuery,
    ) -> Result<Vec<(WorkflowStatus, usize)>> {
        let mut counts = Vec::with_capacity(WorkflowStatus::ALL.len());
        for &status in WorkflowStatus::ALL {
            let query = WorkflowQuery {
                status: Some(status),
                limit: 0,
                offset: 0,
                ..base.clone()
            };
            counts.push((status, self.list_workflows(&query).await?.total));
        }
        Ok(counts)
    }

    /// Cancels a task: at once if it is not running; a running one gets
    /// "cancel requested" persisted first, then its step stopped.
    pub async fn cancel_task(&self, id: TaskId) -> Result<Task> {
        self.inner.lifecycle.cancel_task(id).await
    }

    /// Cancels a workflow: pending steps never start, running ones are stopped.
    pub async fn cancel_workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        self.inner.lifecycle.cancel_workflow(id).await?;
        self.workflow(id).await
    }

    /// Pauses a workflow: no new step of it starts (queued ones stay
    /// queued), running ones finish. Idempotent; a finished workflow is a
    /// conflict.
    pub async fn pause_workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        self.inner.lifecycle.pause_workflow(id).await?;
        self.workflow(id).await
    }

    /// Resumes a paused workflow. Idempotent.
    pub async fn resume_workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        self.inner.lifecycle.resume_workflow(id).await?;
        self.workflow(id).await
    }

    /// Runs a finished workflow again: failed, cancelled, skipped and
    /// not-started steps, and `always_run` steps. Completed steps keep their
    /// outputs and do not run again.
    pub async fn retry_workflow(&self, id: WorkflowId) -> Result<WorkflowView> {
        self.inner.lifecycle.retry_workflow(id).await?;
        self.workflow(id).await
    }

    /// Deletes (or, dry, counts) the finished workflows and audit records
    /// older than the request keeps; see [`crate::retention`].
    pub async fn prune(&self, request: PruneRequest) -> Result<PruneReport> {
        let report = retention::prune(&self.inner.store, request, chrono::Utc::now()).await?;
        retention::record(&report);
        Ok(report)
    }

    /// Saves checkpoint entries of a running task, durably, with every
    /// secret value redacted (a checkpoint is shown to viewers with its
    /// task).
    pub async fn save_checkpoint(
        &self,
        id: TaskId,
        entries: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Task> {
        let entries = crate::secrets::redacted_entries(&self.inner.secrets.redactor(), entries);
        self.inner.lifecycle.save_checkpoint(id, entries).await
    }

    /// Waits until the workflow has finished or `limit` passes. Returns
    /// whether it finished.
    pub async fn wait_for_workflow(&self, id: WorkflowId, limit: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut finished = self.inner.lifecycle.finishes();
        loop {
            finished.borrow_and_update();
            if self
                .inner
                .lifecycle
                .load_workflow(id)
                .await?
                .status
                .is_terminal()
            {
                return Ok(true);
            }
            // Another node may finish it: look again now and then too.
            tokio::select! {
                changed = finished.changed() => if changed.is_err() { return Ok(false) },
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = tokio::time::sleep_until(deadline) => return Ok(false),
            }
        }
    }

    /// Stops dispatching, lets running steps finish within `grace`, then
    /// stops the rest (they return to the queue, their attempt not counted)
    /// and closes storage.
    pub async fn shutdown(&self, grace: Duration) {
        let inner = &self.inner;
        inner.stopping.cancel();
        inner.dispatcher.drain(grace).await;
        inner.closed.cancel();
        if let Err(e) = inner.store.close().await {
            tracing::error!(error = %e, "closing storage failed");
        }
    }

    /// Refuses new work once shutdown has begun.
    /// The approval gates waiting for a decision, oldest first, at most
    /// [`crate::approvals::MAX_LISTED_GATES`].
    pub async fn pending_approvals(&self) -> Result<Vec<PendingApproval>> {
        self.inner.gates.pending_approvals().await
    }

    /// The gate of `workflow` that waits for a decision (`step` picks one
    /// if several do).
    pub async fn workflow_approval(
        &self,
        workflow: WorkflowId,
        step: Option<&str>,
    ) -> Result<PendingApproval> {
        self.inner.gates.workflow_approval(workflow, step).await
    }

    /// Approves or rejects the waiting gate of `workflow` as `decider`, on
    /// the digest the decider saw: `Forbidden` for a decider the gate does
    /// not allow, `Conflict` for a stale digest or a gate decided meanwhile.
    pub async fn decide_approval(
        &self,
        workflow: WorkflowId,
        decider: orchestrator_core::approval::Decider<'_>,
        request: DecisionRequest,
    ) -> Result<DecisionOutcome> {
        self.accepting()?;
        self.inner
            .gates
            .decide_approval(workflow, decider, request)
            .await
    }

    pub(crate) fn accepting(&self) -> Result<()> {
        if self.inner.stopping.is_cancelled() {
            Err(Error::ShuttingDown)
        } else {
            Ok(())
        }
    }
}

/// Publishes a storage move's status changes, after the runner saved
/// each phase.
struct MoveEvents(Arc<EventBus>);

impl orchestrator_storage::live::Observer for MoveEvents {
    fn changed(&self, status: &orchestrator_core::storage_move::MoveStatus) {
        self.0
            .publish([orchestrator_core::event::Change::storage_migration(
                status.clone(),
            )]);
    }
}
