//! The filesystem backend's records and indexes: every index in memory,
//! and the records themselves in memory too, except finished work, which
//! is read back from its line (see [`super::history`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus};

use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::webhook::{Delivery, Subscription};

mod audit;
mod reads;

use super::history::{Files, Held, Place};
use super::line::Line;
use crate::RecordKind;
use audit::{AuditId, AuditLog};
use reads::{Keep, Recent, weighed};

/// A task in memory is shared, so that handing out a workflow's tasks (on
/// every finished step) copies pointers, not records. On disk, its status
/// is kept for the indexes.
pub(super) type HeldTask = Held<Task, TaskStatus>;

pub(super) type HeldWorkflow = Held<Workflow, WorkflowSummary>;

/// An audit record in memory until its line is durable (it never changes),
/// then on disk with what listing filters need.
pub(super) type HeldAudit = Held<AuditRecord, AuditSummary>;

/// What listing filters need of an audit record kept on disk: all but the
/// target, which a filter on it reads back.
#[derive(Debug, Clone)]
pub(super) struct AuditSummary {
    pub time: chrono::DateTime<chrono::Utc>,
    /// Interned, as are the actions: a few callers and verbs make most.
    pub actor: Arc<str>,
    pub action: Arc<str>,
}

/// What listing filters need of a workflow kept on disk.
#[derive(Debug, Clone)]
pub(super) struct WorkflowSummary {
    pub status: WorkflowStatus,
    /// Interned: a handful of kinds name every workflow.
    pub kind: Arc<str>,
}

/// Whether a line being applied is already durable (read back at open)
/// or only queued (a commit): only a durable line's records may be evicted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Applied {
    pub at: Option<Place>,
    pub durable: bool,
}

/// Counts of [`State::in_memory`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InMemory {
    pub workflows: usize,
    pub tasks: usize,
    pub audit: usize,
}

pub(super) struct State {
    files: Files,
    /// Filled and emptied under the state lock, as the records change, so
    /// an entry is always the version the state holds. A `RefCell`, as
    /// reads (`&self`) fill it.
    recent: RefCell<Recent>,
    /// `FsOptions::evict_unfinished`.
    evict_unfinished: bool,
    tasks: BTreeMap<TaskId, HeldTask>,
    by_status: HashMap<TaskStatus, BTreeSet<TaskId>>,
    /// A workflow's tasks are one range of this set: one entry a task,
    /// rather than a set per workflow, which a one-step workflow would
    /// pay a whole tree node for.
    by_workflow: BTreeSet<(WorkflowId, TaskId)>,
    workflows: BTreeMap<WorkflowId, HeldWorkflow>,
    /// The interned strings of summaries: kinds, actors, actions.
    interned: HashSet<Arc<str>>,
    by_idempotency_key: HashMap<String, WorkflowId>,
    by_reference: HashMap<String, BTreeMap<u32, WorkflowId>>,
    tokens: BTreeMap<String, ApiToken>,
    secrets: BTreeMap<String, SecretRecord>,
    /// By id: UUIDv7, so in time order.
    audit: AuditLog,
    /// By id as text (UUIDv7, so in creation order).
    schedules: BTreeMap<String, Schedule>,
    /// By claim key: a schedule's claims are together, in due order.
    claims: BTreeMap<String, ScheduleClaim>,
    /// By id (UUIDv7, so in creation order).
    subscriptions: BTreeMap<String, Subscription>,
    /// By id; few enough (bounded by retention) to sort when listed.
    deliveries: BTreeMap<String, Delivery>,
    /// Bytes appended to the journal since the last compaction.
    pub(super) journal_bytes: u64,
    /// The number of the last journal line appended since the store
    /// opened (a [`Place`]'s `seq`).
    pub(super) last_seq: u64,
    /// Compactions taken and not yet in place (see `Compaction::take`).
    pub(super) compactions_in_flight: u32,
}

impl State {
    pub(super) fn new(files: Files, evict_unfinished: bool) -> State {
        State {
            files,
            recent: RefCell::new(Recent::new()),
            evict_unfinished,
            tasks: Default::default(),
            by_status: Default::default(),
            by_workflow: Default::default(),
            workflows: Default::default(),
            interned: Default::default(),
            by_idempotency_key: Default::default(),
            by_reference: Default::default(),
            tokens: Default::default(),
            secrets: Default::default(),
            audit: Default::default(),
            schedules: Default::default(),
            claims: Default::default(),
            subscriptions: Default::default(),
            deliveries: Default::default(),
            journal_bytes: 0,
            last_seq: 0,
            compactions_in_flight: 0,
        }
    }

    /// Applies `line` to the records, as replaying it does; `applied`
    /// says where the line is and whether it is durable yet.
    pub(super) fn apply(&mut self, line: Line, applied: Applied) {
        match line {
            Line::Workflow(w) => self.put_workflow(w, applied),
            Line::Task(t) => self.put_task(t, applied),
            Line::Submission { workflow, tasks } => {
                // The tasks first: a finished workflow's tasks are evicted
                // with it.
                tasks.into_iter().for_each(|t| self.put_task(t, applied));
                self.put_workflow(workflow, applied);
            }
            Line::Token(t) => self.put_token(t),
            Line::Secret(s) => self.put_secret(s),
            Line::SecretDeleted { name } => {
                self.delete_secret(&name);
            }
            Line::Audit(a) => self.put_audit(a, applied),
            Line::Schedule(s) => self.put_schedule(s),
            Line::ScheduleDeleted { id } => {
                self.delete_schedule(&id);
            }
            Line::ScheduleClaim(c) => self.put_claim(c),
            Line::Pruned {
                workflows,
                audit,
                tokens,
                ..
            } => {
                for id in workflows {
                    self.remove_workflow(id);
                }
                self.remove_audit(&audit);
                for id in &tokens {
                    self.tokens.remove(id);
                }
            }
            Line::WebhookSubscription(s) => self.put_subscription(s),
            Line::WebhookSubscriptionDeleted { id } => {
                self.delete_subscription(&id);
            }
            Line::WebhookDelivery(d) => self.put_delivery(d),
            Line::WebhookDeliveriesPruned { ids } => self.remove_deliveries(&ids),
        }
    }

    pub(super) fn in_memory(&self) -> InMemory {
        InMemory {
            workflows: (self.workflows.values())
                .filter(|h| matches!(h, Held::Memory { .. }))
                .count(),
            tasks: (self.tasks.values())
                .filter(|h| matches!(h, Held::Memory { .. }))
                .count(),
            audit: self.audit.in_memory(),
        }
    }

    pub(super) fn files(&self) -> &Files {
        &self.files
    }

    pub(super) fn set_journal(&mut self, journal: Option<Arc<std::fs::File>>) {
        self.files.journal = journal;
    }

    pub(super) fn task_count(&self) -> usize {
        self.tasks.len()
    }

    pub(super) fn workflow_count(&self) -> usize {
        self.workflows.len()
    }

    pub(super) fn count(&self, kind: RecordKind) -> usize {
        match kind {
            RecordKind::Workflow => self.workflows.len(),
            RecordKind::Task => self.tasks.len(),
            RecordKind::Token => self.tokens.len(),
            RecordKind::Secret => self.secrets.len(),
            RecordKind::Audit => self.audit.len(),
            RecordKind::Schedule => self.schedules.len(),
            RecordKind::ScheduleClaim => self.claims.len(),
            RecordKind::WebhookSubscription => self.subscriptions.len(),
            RecordKind::WebhookDelivery => self.deliveries.len(),
        }
    }

    /// Replaying an older version over a newer one changes nothing, as for
    /// tasks.
    pub(super) fn put_schedule(&mut self, schedule: Schedule) {
        let key = schedule.id.to_string();
        if self
            .schedules
            .get(&key)
            .is_none_or(|old| old.version <= schedule.version)
        {
            self.schedules.insert(key, schedule);
        }
    }

    pub(super) fn put_subscription(&mut self, subscription: Subscription) {
        self.subscriptions
            .insert(subscription.id.clone(), subscription);
    }

    pub(super) fn delete_subscription(&mut self, id: &str) -> bool {
        self.subscriptions.remove(id).is_some()
    }

    pub(super) fn subscription(&self, id: &str) -> Option<&Subscription> {
        self.subscriptions.get(id)
    }

    pub(super) fn subscriptions(&self) -> impl Iterator<Item = &Subscription> {
        self.subscriptions.values()
    }

    /// Replaying an older version over a newer one changes nothing.
    pub(super) fn put_delivery(&mut self, delivery: Delivery) {
        if self
            .deliveries
            .get(&delivery.id)
            .is_none_or(|old| old.version <= delivery.version)
        {
            self.deliveries.insert(delivery.id.clone(), delivery);
        }
    }

    pub(super) fn delivery(&self, id: &str) -> Option<&Delivery> {
        self.deliveries.get(id)
    }

    pub(super) fn deliveries(&self) -> impl Iterator<Item = &Delivery> {
        self.deliveries.values()
    }

    pub(super) fn remove_deliveries(&mut self, ids: &[String]) {
        for id in ids {
            self.deliveries.remove(id);
        }
    }

    pub(super) fn delete_schedule(&mut self, id: &str) -> bool {
        self.schedules.remove(id).is_some()
    }

    pub(super) fn schedule(&self, id: &str) -> Option<&Schedule> {
        self.schedules.get(id)
    }

    pub(super) fn schedules(&self) -> impl Iterator<Item = &Schedule> {
        self.schedules.values()
    }

    pub(super) fn put_claim(&mut self, claim: ScheduleClaim) {
        let key = claim.key();
        if self
            .claims
            .get(&key)
            .is_none_or(|old| old.version <= claim.version)
        {
            self.claims.insert(key, claim);
        }
    }

    pub(super) fn claim(&self, key: &str) -> Option<&ScheduleClaim> {
        self.claims.get(key)
    }

    pub(super) fn all_claims(&self) -> impl Iterator<Item = &ScheduleClaim> {
        self.claims.values()
    }

    /// A schedule's claims, newest due first: its keys share the prefix
    /// `<schedule>_` and sort by due time after it; `` ` `` is the
    /// character after `_`, so the range ends where the prefix does.
    pub(super) fn claims_of(&self, schedule: &str, limit: usize) -> Vec<ScheduleClaim> {
        self.claims
            .range(format!("{schedule}_")..format!("{schedule}`"))
            .map(|(_, claim)| claim)
            .rev()
            .take(limit)
            .cloned()
            .collect()
    }

    /// Replaying an older version over a newer one changes nothing, as for
    /// tasks.
    pub(super) fn put_token(&mut self, token: ApiToken) {
        if self
            .tokens
            .get(&token.id)
            .is_none_or(|old| old.version <= token.version)
        {
            self.tokens.insert(token.id.clone(), token);
        }
    }

    pub(super) fn put_secret(&mut self, secret: SecretRecord) {
        if self
            .secrets
            .get(&secret.name)
            .is_none_or(|old| old.version <= secret.version)
        {
            self.secrets.insert(secret.name.clone(), secret);
        }
    }

    pub(super) fn delete_secret(&mut self, name: &str) -> bool {
        self.secrets.remove(name).is_some()
    }

    pub(super) fn put_audit(&mut self, record: AuditRecord, applied: Applied) {
        let id = record.id.clone();
        let held = Held::Memory {
            record: Arc::new(record),
            at: applied.at,
        };
        self.audit.insert(id.clone(), held);
        if applied.durable {
            self.evict_audit(&id, u64::MAX);
        }
    }

    /// Drops an audit record from memory once its line is known to be
    /// durable (see [`State::evict_finished`]).
    pub(super) fn evict_audit(&mut self, id: &str, durable: u64) {
        let Some(Held::Memory {
            record,
            at: Some(at),
        }) = self.audit.get(id)
        else {
            return;
        };
        if !at.durable_with(durable) {
            return;
        }
        let (at, record) = (*at, record.clone());
        let summary = AuditSummary {
            time: record.time,
            actor: self.intern(&record.actor),
            action: self.intern(&record.action),
        };
        let disk = Held::Disk {
            at,
            version: 0,
            summary,
        };
        self.audit.insert(record.id.clone(), disk);
    }

    /// [`State::repoint_task`] for an audit record, which never changes.
    pub(super) fn repoint_audit(&mut self, id: &str, at: Option<Place>) {
        if let Some(held) = self.audit.get_mut(id) {
            repoint(held, at);
        }
    }

    pub(super) fn tokens(&self) -> impl Iterator<Item = &ApiToken> {
        self.tokens.values()
    }

    pub(super) fn has_token(&self, id: &str) -> bool {
        self.tokens.contains_key(id)
    }

    pub(super) fn secrets(&self) -> impl Iterator<Item = &SecretRecord> {
        self.secrets.values()
    }

    /// Every audit record's id and time, oldest first.
    pub(super) fn audit_times(
        &self,
    ) -> impl DoubleEndedIterator<Item = (AuditId<'_>, chrono::DateTime<chrono::Utc>)> {
        self.audit
            .iter()
            .map(|(id, held)| (id, audit_summary(held).0))
    }

    pub(super) fn held_audit(&self) -> impl Iterator<Item = (AuditId<'_>, &HeldAudit)> {
        self.audit.iter()
    }

    pub(super) fn task_version(&self, id: TaskId) -> Option<u64> {
        self.tasks.get(&id).map(task_version)
    }

    /// A workflow's version and status, without reading it back.
    pub(super) fn workflow_state(&self, id: WorkflowId) -> Option<(u64, WorkflowStatus)> {
        self.workflows
            .get(&id)
            .map(|held| (workflow_version(held), workflow_summary(held).0))
    }

    /// Inserts or replaces a task, keeping every index in step. Replaying an
    /// older version over a newer one is ignored, so a journal replayed over
    /// a snapshot that already holds its records changes nothing.
    pub(super) fn put_task(&mut self, task: Task, applied: Applied) {
        if let Some(old) = self.tasks.get(&task.id) {
            if task_version(old) > task.version {
                return;
            }
            let old_status = task_status(old);
            if old_status != task.status
                && let Some(set) = self.by_status.get_mut(&old_status)
            {
                set.remove(&task.id);
            }
        }
        self.by_status
            .entry(task.status)
            .or_default()
            .insert(task.id);
        self.by_workflow.insert((task.workflow_id, task.id));
        self.recent.get_mut().tasks.remove(&task.id);
        let finished = applied.durable
            && (self.evict_unfinished
                || self
                    .workflows
                    .get(&task.workflow_id)
                    .is_some_and(|w| workflow_summary(w).0.is_terminal()));
        let id = task.id;
        let held = match applied.at {
            Some(at) if finished => Held::Disk {
                at,
                version: task.version,
                summary: task.status,
            },
            at => Held::Memory {
                record: Arc::new(task),
                at,
            },
        };
        self.tasks.insert(id, held);
    }

    pub(super) fn put_workflow(&mut self, workflow: Workflow, applied: Applied) {
        if let Some(old) = self.workflows.get(&workflow.id)
            && workflow_version(old) > workflow.version
        {
            return;
        }
        // Keys and references never change after insertion.
        if let Some(key) = &workflow.idempotency_key {
            self.by_idempotency_key.insert(key.clone(), workflow.id);
        }
        if let Some(reference) = &workflow.reference {
            self.by_reference
                .entry(reference.clone())
                .or_default()
                .insert(workflow.revision, workflow.id);
        }
        let id = workflow.id;
        self.recent.get_mut().workflows.remove(&id);
        self.workflows.insert(
            id,
            Held::Memory {
                record: Arc::new(workflow),
                at: applied.at,
            },
        );
        if applied.durable {
            self.evict_finished(id, u64::MAX, false);
        }
    }

    /// Drops a finished workflow and its tasks from memory, each whose
    /// latest line is known to be durable once line `durable` is (see
    /// [`Place::durable_with`]); the rest wait for the next compaction.
    ///
    /// `warm`: keep them parsed in [`Recent`] too, for the reads that
    /// follow the end of a workflow; not for what is merely read back at
    /// open or moved by a compaction.
    pub(super) fn evict_finished(&mut self, id: WorkflowId, durable: u64, warm: bool) {
        let Some(held) = self.workflows.get(&id) else {
            return;
        };
        let (status, _) = workflow_summary(held);
        if !status.is_terminal() && !self.evict_unfinished {
            return;
        }
        if let Held::Memory {
            record,
            at: Some(at),
        } = held
            && at.durable_with(durable)
        {
            let (at, version, record) = (*at, record.version, record.clone());
            let kind = self.intern(&record.kind);
            if warm {
                // Read again right after it ends: by whoever waits on it.
                let record = weighed(&record, at);
                self.recent.get_mut().workflows.insert(id, record);
            }
            let disk = Held::Disk {
                at,
                version,
                summary: WorkflowSummary { status, kind },
            };
            self.workflows.insert(id, disk);
        }
        let task_ids: Vec<TaskId> = self.workflow_task_ids(id);
        for task_id in task_ids {
            if let Some(held) = self.tasks.get_mut(&task_id)
                && let Held::Memory {
                    record,
                    at: Some(at),
                } = held
                && at.durable_with(durable)
            {
                if warm {
                    self.recent
                        .get_mut()
                        .tasks
                        .insert(task_id, weighed(record, *at));
                }
                *held = Held::Disk {
                    at: *at,
                    version: record.version,
                    summary: record.status,
                };
            }
        }
    }

    fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(text) = self.interned.get(text) {
            return text.clone();
        }
        let text: Arc<str> = Arc::from(text);
        self.interned.insert(text.clone());
        text
    }

    /// After a compaction wrote the task at `version` to `at` in the new
    /// snapshot (`None`: a line too long to name), points it there, unless
    /// it changed since.
    pub(super) fn repoint_task(&mut self, id: TaskId, version: u64, at: Option<Place>) {
        if let Some(held) = self.tasks.get_mut(&id)
            && task_version(held) == version
        {
            repoint(held, at);
        }
    }

    /// [`State::repoint_task`] for a workflow.
    pub(super) fn repoint_workflow(&mut self, id: WorkflowId, version: u64, at: Option<Place>) {
        if let Some(held) = self.workflows.get_mut(&id)
            && workflow_version(held) == version
        {
            repoint(held, at);
        }
    }

    /// Takes the snapshot a compaction has just put in place as the file
    /// records are read back from; call it with every record repointed.
    pub(super) fn install_snapshot(&mut self, snapshot: std::fs::File) {
        self.files.snapshot = Some(Arc::new(snapshot));
    }

    /// Every workflow and task as a compaction copies them: shared or
    /// where their lines are, with their versions.
    pub(super) fn held_workflows(&self) -> impl Iterator<Item = (&WorkflowId, &HeldWorkflow)> {
        self.workflows.iter()
    }

    pub(super) fn held_tasks(&self) -> impl Iterator<Item = (&TaskId, &HeldTask)> {
        self.tasks.iter()
    }

    /// Removes a workflow with its tasks and every index entry naming them;
    /// returns the ids of the tasks removed.
    pub(super) fn remove_workflow(&mut self, id: WorkflowId) -> Vec<TaskId> {
        let Some(held) = self.workflows.remove(&id) else {
            return Vec::new();
        };
        self.recent.get_mut().workflows.remove(&id);
        // A workflow on disk is read back for its key and reference; if it
        // cannot be, the indexes are searched for its id instead.
        let named = match &held {
            Held::Memory { record, .. } => Ok(record.clone()),
            Held::Disk { .. } => self.load_workflow(id, &held, Keep::Not),
        };
        match named {
            Ok(workflow) => {
                if let Some(key) = &workflow.idempotency_key
                    && self.by_idempotency_key.get(key) == Some(&id)
                {
                    self.by_idempotency_key.remove(key);
                }
                if let Some(reference) = &workflow.reference
                    && let Some(revisions) = self.by_reference.get_mut(reference)
                {
                    revisions.remove(&workflow.revision);
                    if revisions.is_empty() {
                        self.by_reference.remove(reference);
                    }
                }
            }
            Err(error) => {
                tracing::warn!(workflow = %id, %error, "removing a workflow that cannot be read back");
                self.by_idempotency_key.retain(|_, w| *w != id);
                self.by_reference.retain(|_, revisions| {
                    revisions.retain(|_, w| *w != id);
                    !revisions.is_empty()
                });
            }
        }
        let task_ids = self.workflow_task_ids(id);
        for task_id in &task_ids {
            self.recent.get_mut().tasks.remove(task_id);
            self.by_workflow.remove(&(id, *task_id));
            if let Some(task) = self.tasks.remove(task_id)
                && let Some(set) = self.by_status.get_mut(&task_status(&task))
            {
                set.remove(task_id);
            }
        }
        task_ids
    }

    pub(super) fn remove_audit(&mut self, ids: &[String]) {
        self.audit.remove(ids);
    }

    pub(super) fn workflow_task_ids(&self, id: WorkflowId) -> Vec<TaskId> {
        self.workflow_range(id).map(|(_, task)| *task).collect()
    }

    fn workflow_range(
        &self,
        id: WorkflowId,
    ) -> std::collections::btree_set::Range<'_, (WorkflowId, TaskId)> {
        let first = TaskId::from_uuid(uuid::Uuid::nil());
        let last = TaskId::from_uuid(uuid::Uuid::max());
        self.by_workflow.range((id, first)..=(id, last))
    }

    pub(super) fn has_idempotency_key(&self, key: &str) -> bool {
        self.by_idempotency_key
            .get(key)
            .is_some_and(|id| self.workflows.contains_key(id))
    }

    pub(super) fn has_revision(&self, reference: &str, revision: u32) -> bool {
        self.by_reference
            .get(reference)
            .and_then(|revisions| revisions.get(&revision))
            .is_some_and(|id| self.workflows.contains_key(id))
    }
}

fn task_version(held: &HeldTask) -> u64 {
    match held {
        Held::Memory { record, .. } => record.version,
        Held::Disk { version, .. } => *version,
    }
}

fn task_status(held: &HeldTask) -> TaskStatus {
    match held {
        Held::Memory { record, .. } => record.status,
        Held::Disk { summary, .. } => *summary,
    }
}

fn workflow_version(held: &HeldWorkflow) -> u64 {
    match held {
        Held::Memory { record, .. } => record.version,
        Held::Disk { version, .. } => *version,
    }
}

fn audit_summary(held: &HeldAudit) -> (chrono::DateTime<chrono::Utc>, &str, &str) {
    match held {
        Held::Memory { record, .. } => (record.time, &record.actor, &record.action),
        Held::Disk { summary, .. } => (summary.time, &summary.actor, &summary.action),
    }
}

fn workflow_summary(held: &HeldWorkflow) -> (WorkflowStatus, &str) {
    match held {
        Held::Memory { record, .. } => (record.status, &record.kind),
        Held::Disk { summary, .. } => (summary.status, &summary.kind),
    }
}

/// Points a record at its line in a new snapshot. A record on disk always
/// has one: its line was short enough to read back.
fn repoint<T, S>(held: &mut Held<T, S>, new: Option<Place>) {
    match (held, new) {
        (Held::Memory { at, .. }, new) => *at = new,
        (Held::Disk { at, .. }, Some(new)) => *at = new,
        (Held::Disk { .. }, None) => {
            debug_assert!(false, "a record read back from disk fits a place");
        }
    }
}
