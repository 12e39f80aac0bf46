//! The store a service works on, which a storage move can swap for
//! another while the service runs.
//!
//! Every call goes to the current store. Every write also passes a gate
//! and, while a migration follows the store, notes which records it
//! touched. A switch closes the gate, so that no write is half-way on the
//! old store when the new one takes over; writes that arrive meanwhile
//! wait for it to open again rather than fail.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::{Node, ScheduleId, Task, TaskId, Workflow, WorkflowId};

use super::files::BackendChoice;
use crate::{
    AccessStore, AuditQuery, Backend, BulkTransfer, ChangeFeed, LogChunk, LogPiece, NodeStore,
    Page, Pruned, Record, RecordKind, Result, RetentionStore, Scanned, ScheduleStore, Storage,
    TaskQuery, TaskStore, WorkflowQuery,
};

/// Records noted after a switch, at most: beyond, a rollback is refused.
pub(crate) const NOTED_FOR_ROLLBACK: usize = 100_000;

/// What was written while a migration followed the store: the records
/// and logs to apply to the target again, read afresh from the source.
#[derive(Debug, Default)]
pub(crate) struct Changed {
    pub(crate) records: HashSet<(RecordKind, String)>,
    pub(crate) logs: HashSet<TaskId>,
    /// The latest `before` of an audit prune: the target prunes the same.
    pub(crate) audit_pruned_before: Option<DateTime<Utc>>,
}

impl Changed {
    pub(crate) fn len(&self) -> usize {
        self.records.len() + self.logs.len() + usize::from(self.audit_pruned_before.is_some())
    }

    pub(crate) fn merge(&mut self, other: Changed) {
        self.records.extend(other.records);
        self.logs.extend(other.logs);
        self.audit_pruned_before = self.audit_pruned_before.max(other.audit_pruned_before);
    }

    fn record(&mut self, kind: RecordKind, key: String) {
        self.records.insert((kind, key));
    }
}

/// After a switch, the store left behind stays a copy of the current one
/// until the first write: that write waits until `storage.json` says it
/// is not level any more, so a rollback never returns to a store that
/// misses an acknowledged write.
pub(crate) struct LevelWatch {
    data_dir: PathBuf,
    broken: tokio::sync::OnceCell<()>,
}

impl LevelWatch {
    pub(crate) fn new(data_dir: PathBuf) -> LevelWatch {
        LevelWatch {
            data_dir,
            broken: tokio::sync::OnceCell::new(),
        }
    }

    pub(crate) fn is_level(&self) -> bool {
        !self.broken.initialized()
    }

    /// Called before each write; only the first does any work, and the
    /// writes racing with it wait for it.
    async fn before_write(&self) -> Result<()> {
        self.broken
            .get_or_try_init(|| async {
                let data_dir = self.data_dir.clone();
                tokio::task::spawn_blocking(move || {
                    if let Some(mut choice) = BackendChoice::load(&data_dir)?
                        && choice.level
                    {
                        choice.level = false;
                        choice.save(&data_dir)?;
                    }
                    Ok(())
                })
                .await
                .unwrap_or_else(|e| Err(crate::Error::Unavailable(e.to_string())))
            })
            .await
            .map(|_| ())
    }
}

pub(crate) struct Switchable {
    /// The store calls go to. Replaced only by [`Switchable::swap`], with
    /// the gate closed. A std lock: it is held only to clone the `Arc`.
    current: RwLock<Arc<Storage>>,
    /// Writes hold it shared; a switch holds it exclusively. tokio's lock is
    /// fair, so writes that arrive during a switch queue behind it instead
    /// of starving it.
    gate: tokio::sync::RwLock<()>,
    /// `Some` while writes are noted: during a migration (for its
    /// target), and after a switch (for a rollback to the store left).
    changed: Mutex<Option<Changed>>,
    /// Most records noted before noting stops (`usize::MAX` during a
    /// migration, which needs every one): after a switch, noting is only
    /// for a rollback, and must not grow without bound.
    cap: std::sync::atomic::AtomicUsize,
    /// `Some` after a switch, until the service restarts.
    level: Mutex<Option<Arc<LevelWatch>>>,
    /// Fixed at start: the engine chose how to coordinate (alone, or with
    /// other nodes) when it started, and keeps to it until it restarts.
    shared: bool,
}

impl Switchable {
    /// `level`: the store left at the last switch is level with this one
    /// (nothing was written since): writes are noted from the start, so
    /// that a rollback can bring it along.
    pub(crate) fn new(storage: Storage, level: Option<LevelWatch>) -> Switchable {
        Switchable {
            shared: storage.nodes().shared(),
            current: RwLock::new(Arc::new(storage)),
            gate: tokio::sync::RwLock::new(()),
            changed: Mutex::new(level.is_some().then(Changed::default)),
            cap: std::sync::atomic::AtomicUsize::new(NOTED_FOR_ROLLBACK),
            level: Mutex::new(level.map(Arc::new)),
        }
    }

    pub(crate) fn current(&self) -> Arc<Storage> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn changed(&self) -> std::sync::MutexGuard<'_, Option<Changed>> {
        self.changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// From now on, every write is noted, for a migration. The gate is
    /// closed while it starts, so no write is under way that would go
    /// unnoted.
    pub(crate) async fn follow(&self) {
        let _closed = self.gate.write().await;
        self.cap
            .store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
        *self.changed() = Some(Changed::default());
    }

    /// Notes writes afresh, up to [`NOTED_FOR_ROLLBACK`]: called at a
    /// switch, with the gate closed.
    pub(crate) fn follow_for_rollback(&self, _paused: &tokio::sync::RwLockWriteGuard<'_, ()>) {
        self.cap
            .store(NOTED_FOR_ROLLBACK, std::sync::atomic::Ordering::SeqCst);
        *self.changed() = Some(Changed::default());
    }

    /// Whether every write since noting began is noted.
    pub(crate) fn noting(&self) -> bool {
        self.changed().is_some()
    }

    /// What was written since the last call; keeps following.
    pub(crate) fn take_changed(&self) -> Changed {
        self.changed()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Puts back what [`Switchable::take_changed`] took, when it could not
    /// be applied after all (while writes are still noted).
    pub(crate) fn give_back(&self, changed: Changed) {
        if let Some(noted) = self.changed().as_mut() {
            noted.merge(changed);
        }
    }

    /// Stops noting writes (a migration ended without a switch: what it
    /// noted was for its target, and a rollback needs notes since the
    /// last switch, which are gone).
    pub(crate) fn unfollow(&self) {
        *self.changed() = None;
    }

    /// Closes the gate: writes under way finish, new ones wait until the
    /// guard is dropped.
    pub(crate) async fn pause(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.gate.write().await
    }

    /// Makes `next` the current store, with the gate closed (`_paused`),
    /// and returns the one it replaces.
    pub(crate) fn swap(
        &self,
        next: Storage,
        level: LevelWatch,
        _paused: &tokio::sync::RwLockWriteGuard<'_, ()>,
    ) -> Arc<Storage> {
        *self
            .level
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(level));
        std::mem::replace(
            &mut *self
                .current
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            Arc::new(next),
        )
    }

    /// Whether the store left at the last switch is still level; `None`
    /// when there was no switch since the start.
    pub(crate) fn level(&self) -> Option<bool> {
        self.level
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(|watch| watch.is_level())
    }

    /// A write: through the gate, to the current store, noted.
    async fn write<R, F, Fut>(&self, call: F, note: impl FnOnce(&mut Changed)) -> Result<R>
    where
        F: FnOnce(Arc<Storage>) -> Fut,
        Fut: Future<Output = Result<R>>,
    {
        let _open = self.gate.read().await;
        let level = self
            .level
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(level) = level {
            level.before_write().await?;
        }
        let result = call(self.current()).await;
        // Noted even when it failed: a write that timed out may have
        // happened, and applying an unchanged record again costs nothing.
        let mut changed = self.changed();
        if let Some(noted) = changed.as_mut() {
            note(noted);
            if noted.len() > self.cap.load(std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    noted = noted.len(),
                    "too many writes since the switch to note them all; a rollback is no longer possible"
                );
                *changed = None;
            }
        }
        result
    }
}

fn workflow_keys(changed: &mut Changed, workflow: &Workflow, tasks: &[Task]) {
    changed.record(RecordKind::Workflow, workflow.id.to_string());
    for task in tasks {
        changed.record(RecordKind::Task, task.id.to_string());
    }
}

/// The handle the rest of the service holds: one per concern, as
/// [`Storage`] wants, all on one [`Switchable`].
pub(crate) struct Live(pub(crate) Arc<Switchable>);

#[async_trait]
impl Backend for Live {
    fn name(&self) -> &'static str {
        self.0.current().name()
    }

    async fn health(&self) -> Result<()> {
        self.0.current().health().await
    }

    async fn close(&self) -> Result<()> {
        self.0.current().close().await
    }
}

#[async_trait]
impl TaskStore for Live {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        self.0
            .write(
                |s| async move { s.tasks().insert_workflow(workflow, tasks).await },
                |c| workflow_keys(c, workflow, tasks),
            )
            .await
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        self.0
            .write(
                |s| async move { s.tasks().update_workflow(workflow, new_tasks).await },
                |c| workflow_keys(c, workflow, new_tasks),
            )
            .await
    }

    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)> {
        self.0
            .write(
                |s| async move { s.tasks().update_workflow_and_tasks(workflow, tasks).await },
                |c| workflow_keys(c, workflow, tasks),
            )
            .await
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        self.0
            .write(
                |s| async move { s.tasks().update_task(task).await },
                |c| c.record(RecordKind::Task, task.id.to_string()),
            )
            .await
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>> {
        self.0.current().tasks().get_task(id).await
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        self.0.current().tasks().list_tasks(query).await
    }

    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        self.0.current().tasks().workflow_tasks(id).await
    }

    async fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        self.0.current().tasks().unfinished_tasks().await
    }

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>> {
        self.0.current().tasks().get_workflow(id).await
    }

    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        self.0.current().tasks().list_workflows(query).await
    }

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64> {
        self.0
            .write(
                |s| async move { s.tasks().append_log(id, chunk).await },
                |c| {
                    c.logs.insert(id);
                },
            )
            .await
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        self.0
            .current()
            .tasks()
            .read_log(id, offset, max_bytes)
            .await
    }
}

#[async_trait]
impl NodeStore for Live {
    fn shared(&self) -> bool {
        self.0.shared
    }

    /// Not gated: heartbeats describe live processes and do not move.
    async fn heartbeat(&self, node: &Node) -> Result<()> {
        self.0.current().nodes().heartbeat(node).await
    }

    async fn nodes(&self) -> Result<Vec<Node>> {
        self.0.current().nodes().nodes().await
    }

    fn changes(&self) -> Option<ChangeFeed> {
        self.0.current().nodes().changes()
    }
}

#[async_trait]
impl AccessStore for Live {
    async fn put_token(&self, token: &ApiToken) -> Result<()> {
        self.0
            .write(
                |s| async move { s.access().put_token(token).await },
                |c| c.record(RecordKind::Token, token.id.clone()),
            )
            .await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>> {
        self.0.current().access().tokens().await
    }

    async fn delete_tokens(&self, ids: &[String]) -> Result<u64> {
        self.0
            .write(
                |s| async move { s.access().delete_tokens(ids).await },
                |c| {
                    for id in ids {
                        c.record(RecordKind::Token, id.clone());
                    }
                },
            )
            .await
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.0
            .write(
                |s| async move { s.access().put_secret(secret).await },
                |c| c.record(RecordKind::Secret, secret.name.clone()),
            )
            .await
    }

    async fn delete_secret(&self, name: &str) -> Result<bool> {
        self.0
            .write(
                |s| async move { s.access().delete_secret(name).await },
                |c| c.record(RecordKind::Secret, name.to_owned()),
            )
            .await
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        self.0.current().access().secrets().await
    }

    async fn append_audit(&self, record: &AuditRecord) -> Result<()> {
        self.0
            .write(
                |s| async move { s.access().append_audit(record).await },
                |c| c.record(RecordKind::Audit, record.id.clone()),
            )
            .await
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        self.0.current().access().list_audit(query).await
    }
}

#[async_trait]
impl ScheduleStore for Live {
    async fn insert_schedule(&self, schedule: &Schedule) -> Result<()> {
        self.0
            .write(
                |s| async move { s.schedules().insert_schedule(schedule).await },
                |c| c.record(RecordKind::Schedule, schedule.id.to_string()),
            )
            .await
    }

    async fn update_schedule(&self, schedule: &Schedule) -> Result<Schedule> {
        self.0
            .write(
                |s| async move { s.schedules().update_schedule(schedule).await },
                |c| c.record(RecordKind::Schedule, schedule.id.to_string()),
            )
            .await
    }

    async fn delete_schedule(&self, id: ScheduleId) -> Result<bool> {
        self.0
            .write(
                |s| async move { s.schedules().delete_schedule(id).await },
                |c| c.record(RecordKind::Schedule, id.to_string()),
            )
            .await
    }

    async fn get_schedule(&self, id: ScheduleId) -> Result<Option<Schedule>> {
        self.0.current().schedules().get_schedule(id).await
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        self.0.current().schedules().schedules().await
    }

    async fn claim(&self, claim: &ScheduleClaim) -> Result<bool> {
        self.0
            .write(
                |s| async move { s.schedules().claim(claim).await },
                |c| c.record(RecordKind::ScheduleClaim, claim.key()),
            )
            .await
    }

    async fn update_claim(&self, claim: &ScheduleClaim) -> Result<ScheduleClaim> {
        self.0
            .write(
                |s| async move { s.schedules().update_claim(claim).await },
                |c| c.record(RecordKind::ScheduleClaim, claim.key()),
            )
            .await
    }

    async fn claims(&self, schedule: ScheduleId, limit: usize) -> Result<Vec<ScheduleClaim>> {
        self.0.current().schedules().claims(schedule, limit).await
    }
}

/// Locks are not copied by a move (see `fs::locks`): they are read from
/// and written to the store the service works on now, past the gate.
#[async_trait]
impl crate::LockStore for Live {
    async fn get_lock(&self, name: &str) -> Result<Option<orchestrator_core::lock::LockRecord>> {
        self.0.current().locks().get_lock(name).await
    }

    async fn put_lock(
        &self,
        lock: &orchestrator_core::lock::LockRecord,
    ) -> Result<orchestrator_core::lock::LockRecord> {
        self.0
            .write(|s| async move { s.locks().put_lock(lock).await }, |_| {})
            .await
    }

    async fn locks(&self) -> Result<Vec<orchestrator_core::lock::LockRecord>> {
        self.0.current().locks().locks().await
    }
}

#[async_trait]
impl RetentionStore for Live {
    async fn prune_workflows(&self, workflows: &[(WorkflowId, u64)]) -> Result<Pruned> {
        self.0
            .write(
                |s| async move { s.retention().prune_workflows(workflows).await },
                |c| {
                    for (id, _) in workflows {
                        c.record(RecordKind::Workflow, id.to_string());
                    }
                },
            )
            .await
    }

    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64> {
        self.0
            .write(
                |s| async move { s.retention().prune_audit(before).await },
                |c| c.audit_pruned_before = c.audit_pruned_before.max(Some(before)),
            )
            .await
    }
}

#[async_trait]
impl BulkTransfer for Live {
    fn name(&self) -> &'static str {
        self.0.current().name()
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        self.0.current().transfer().scan(kind, after, limit).await
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        self.0.current().transfer().fetch(kind, keys).await
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        self.0.current().transfer().count(kind).await
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        self.0
            .write(
                |s| async move { s.transfer().import(records).await },
                |c| {
                    for record in records {
                        c.record(record.kind(), record.key());
                    }
                },
            )
            .await
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        self.0.current().transfer().log_lengths(ids).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        self.0.current().transfer().read_logs(asks).await
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.0
            .write(
                |s| async move { s.transfer().import_logs(pieces).await },
                |c| c.logs.extend(pieces.iter().map(|p| p.task)),
            )
            .await
    }

    async fn settle(&self) -> Result<()> {
        self.0.current().transfer().settle().await
    }

    async fn close(&self) -> Result<()> {
        self.0.current().transfer().close().await
    }
}

/// Webhook records move like the others: each write passes the gate and
/// notes what it changed for the move's catch-up passes.
#[async_trait]
impl crate::WebhookStore for Live {
    async fn insert_subscription(
        &self,
        subscription: &orchestrator_core::webhook::Subscription,
    ) -> Result<()> {
        self.0
            .write(
                |s| async move { s.webhooks().insert_subscription(subscription).await },
                |c| c.record(RecordKind::WebhookSubscription, subscription.id.clone()),
            )
            .await
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool> {
        self.0
            .write(
                |s| async move { s.webhooks().delete_subscription(id).await },
                |c| c.record(RecordKind::WebhookSubscription, id.to_owned()),
            )
            .await
    }

    async fn get_subscription(
        &self,
        id: &str,
    ) -> Result<Option<orchestrator_core::webhook::Subscription>> {
        self.0.current().webhooks().get_subscription(id).await
    }

    async fn subscriptions(&self) -> Result<Vec<orchestrator_core::webhook::Subscription>> {
        self.0.current().webhooks().subscriptions().await
    }

    async fn insert_delivery(
        &self,
        delivery: &orchestrator_core::webhook::Delivery,
    ) -> Result<bool> {
        self.0
            .write(
                |s| async move { s.webhooks().insert_delivery(delivery).await },
                |c| c.record(RecordKind::WebhookDelivery, delivery.id.clone()),
            )
            .await
    }

    async fn update_delivery(
        &self,
        delivery: &orchestrator_core::webhook::Delivery,
    ) -> Result<orchestrator_core::webhook::Delivery> {
        self.0
            .write(
                |s| async move { s.webhooks().update_delivery(delivery).await },
                |c| c.record(RecordKind::WebhookDelivery, delivery.id.clone()),
            )
            .await
    }

    async fn get_delivery(&self, id: &str) -> Result<Option<orchestrator_core::webhook::Delivery>> {
        self.0.current().webhooks().get_delivery(id).await
    }

    async fn deliveries(
        &self,
        query: &crate::DeliveryQuery,
    ) -> Result<Page<orchestrator_core::webhook::Delivery>> {
        self.0.current().webhooks().deliveries(query).await
    }

    async fn prune_deliveries(&self, ids: &[String]) -> Result<u64> {
        self.0
            .write(
                |s| async move { s.webhooks().prune_deliveries(ids).await },
                |c| {
                    for id in ids {
                        c.record(RecordKind::WebhookDelivery, id.clone());
                    }
                },
            )
            .await
    }
}
