//! The filesystem backend's in-memory records and indexes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::Arc;

use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId};

use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::webhook::{Delivery, Subscription};

use crate::{AuditQuery, Page, Record, RecordKind, TaskQuery, WorkflowQuery};

#[derive(Default)]
pub(super) struct State {
    /// Shared, so that handing out a workflow's tasks (on every finished
    /// step) copies pointers, not records.
    tasks: BTreeMap<TaskId, Arc<Task>>,
    by_status: HashMap<TaskStatus, BTreeSet<TaskId>>,
    by_workflow: HashMap<WorkflowId, BTreeSet<TaskId>>,
    workflows: BTreeMap<WorkflowId, Workflow>,
    by_idempotency_key: HashMap<String, WorkflowId>,
    by_reference: HashMap<String, BTreeMap<u32, WorkflowId>>,
    tokens: BTreeMap<String, ApiToken>,
    secrets: BTreeMap<String, SecretRecord>,
    /// By id: UUIDv7, so in time order.
    audit: BTreeMap<String, AuditRecord>,
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
}

impl State {
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

    pub(super) fn put_audit(&mut self, record: AuditRecord) {
        self.audit.insert(record.id.clone(), record);
    }

    pub(super) fn tokens(&self) -> impl Iterator<Item = &ApiToken> {
        self.tokens.values()
    }

    pub(super) fn secrets(&self) -> impl Iterator<Item = &SecretRecord> {
        self.secrets.values()
    }

    pub(super) fn audit(&self) -> impl DoubleEndedIterator<Item = &AuditRecord> {
        self.audit.values()
    }

    pub(super) fn list_audit(&self, query: &AuditQuery) -> Page<AuditRecord> {
        paged(
            self.audit.values().rev().filter(|r| query.matches(r)),
            |_| true,
            query.offset,
            query.limit,
            AuditRecord::clone,
        )
    }

    /// The record of `kind` stored under `key`, if any.
    pub(super) fn record(&self, kind: RecordKind, key: &str) -> Option<Record> {
        match kind {
            RecordKind::Token => return self.tokens.get(key).cloned().map(Record::Token),
            RecordKind::Secret => return self.secrets.get(key).cloned().map(Record::Secret),
            RecordKind::Audit => return self.audit.get(key).cloned().map(Record::Audit),
            RecordKind::Schedule => return self.schedules.get(key).cloned().map(Record::Schedule),
            RecordKind::ScheduleClaim => {
                return self.claims.get(key).cloned().map(Record::ScheduleClaim);
            }
            RecordKind::WebhookSubscription => {
                return self
                    .subscriptions
                    .get(key)
                    .cloned()
                    .map(Record::WebhookSubscription);
            }
            RecordKind::WebhookDelivery => {
                return self
                    .deliveries
                    .get(key)
                    .cloned()
                    .map(Record::WebhookDelivery);
            }
            RecordKind::Workflow | RecordKind::Task => {}
        }
        let id: uuid::Uuid = key.parse().ok()?;
        match kind {
            RecordKind::Workflow => self
                .workflows
                .get(&WorkflowId::from_uuid(id))
                .cloned()
                .map(Record::Workflow),
            RecordKind::Task => self
                .tasks
                .get(&TaskId::from_uuid(id))
                .map(|t| Record::Task(Task::clone(t))),
            _ => None,
        }
    }

    /// Records of `kind` whose keys sort after `after`, in key order. Ids
    /// print as lowercase hex, so text order is id order; a key that is not
    /// an id (a damaged line's place) sorts after every id.
    pub(super) fn records_after<'a>(
        &'a self,
        kind: RecordKind,
        after: Option<&str>,
    ) -> Box<dyn Iterator<Item = Record> + 'a> {
        use std::ops::Bound::{Excluded, Unbounded};
        // Keyed by text: the range is the text after `after`.
        let by_text = |after: Option<&str>| match after {
            None => (Unbounded, Unbounded),
            Some(key) => (Excluded(key.to_owned()), Unbounded),
        };
        match kind {
            RecordKind::Token => {
                return Box::new(
                    self.tokens
                        .range(by_text(after))
                        .map(|(_, t)| Record::Token(t.clone())),
                );
            }
            RecordKind::Secret => {
                return Box::new(
                    self.secrets
                        .range(by_text(after))
                        .map(|(_, s)| Record::Secret(s.clone())),
                );
            }
            RecordKind::Audit => {
                return Box::new(
                    self.audit
                        .range(by_text(after))
                        .map(|(_, a)| Record::Audit(a.clone())),
                );
            }
            RecordKind::Schedule => {
                return Box::new(
                    self.schedules
                        .range(by_text(after))
                        .map(|(_, s)| Record::Schedule(s.clone())),
                );
            }
            RecordKind::ScheduleClaim => {
                return Box::new(
                    self.claims
                        .range(by_text(after))
                        .map(|(_, c)| Record::ScheduleClaim(c.clone())),
                );
            }
            RecordKind::WebhookSubscription => {
                return Box::new(
                    self.subscriptions
                        .range(by_text(after))
                        .map(|(_, s)| Record::WebhookSubscription(s.clone())),
                );
            }
            RecordKind::WebhookDelivery => {
                return Box::new(
                    self.deliveries
                        .range(by_text(after))
                        .map(|(_, d)| Record::WebhookDelivery(d.clone())),
                );
            }
            RecordKind::Workflow | RecordKind::Task => {}
        }
        let from = match after {
            None => Unbounded,
            Some(key) => match key.parse::<uuid::Uuid>() {
                Ok(id) => Excluded(id),
                Err(_) => return Box::new(std::iter::empty()),
            },
        };
        match kind {
            RecordKind::Workflow => Box::new(
                self.workflows
                    .range((from.map(WorkflowId::from_uuid), Unbounded))
                    .map(|(_, w)| Record::Workflow(w.clone())),
            ),
            _ => Box::new(
                self.tasks
                    .range((from.map(TaskId::from_uuid), Unbounded))
                    .map(|(_, t)| Record::Task(Task::clone(t))),
            ),
        }
    }

    pub(super) fn task(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id).map(|t| &**t)
    }

    pub(super) fn workflow(&self, id: WorkflowId) -> Option<&Workflow> {
        self.workflows.get(&id)
    }

    /// The tasks as shared: a copy is a pointer copy.
    pub(super) fn shared_tasks(&self) -> impl Iterator<Item = &Arc<Task>> {
        self.tasks.values()
    }

    pub(super) fn tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks.values().map(|t| &**t)
    }

    pub(super) fn workflows(&self) -> impl Iterator<Item = &Workflow> {
        self.workflows.values()
    }

    /// Inserts or replaces a task, keeping every index in step. Replaying an
    /// older version over a newer one is ignored, so a journal replayed over
    /// a snapshot that already holds its records changes nothing.
    pub(super) fn put_task(&mut self, task: Task) {
        if let Some(old) = self.tasks.get(&task.id) {
            if old.version > task.version {
                return;
            }
            if old.status != task.status
                && let Some(set) = self.by_status.get_mut(&old.status)
            {
                set.remove(&task.id);
            }
        }
        self.by_status
            .entry(task.status)
            .or_default()
            .insert(task.id);
        self.by_workflow
            .entry(task.workflow_id)
            .or_default()
            .insert(task.id);
        self.tasks.insert(task.id, Arc::new(task));
    }

    pub(super) fn put_workflow(&mut self, workflow: Workflow) {
        if let Some(old) = self.workflows.get(&workflow.id)
            && old.version > workflow.version
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
        self.workflows.insert(workflow.id, workflow);
    }

    /// Removes a workflow with its tasks and every index entry naming them;
    /// returns the ids of the tasks removed.
    pub(super) fn remove_workflow(&mut self, id: WorkflowId) -> Vec<TaskId> {
        let Some(workflow) = self.workflows.remove(&id) else {
            return Vec::new();
        };
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
        let task_ids: Vec<TaskId> = self
            .by_workflow
            .remove(&id)
            .map(|ids| ids.into_iter().collect())
            .unwrap_or_default();
        for task_id in &task_ids {
            if let Some(task) = self.tasks.remove(task_id)
                && let Some(set) = self.by_status.get_mut(&task.status)
            {
                set.remove(task_id);
            }
        }
        task_ids
    }

    pub(super) fn remove_audit(&mut self, ids: &[String]) {
        for id in ids {
            self.audit.remove(id);
        }
    }

    pub(super) fn workflow_task_ids(&self, id: WorkflowId) -> Vec<TaskId> {
        self.by_workflow
            .get(&id)
            .map(|ids| ids.iter().copied().collect())
            .unwrap_or_default()
    }

    pub(super) fn workflow_by_idempotency_key(&self, key: &str) -> Option<&Workflow> {
        self.by_idempotency_key
            .get(key)
            .and_then(|id| self.workflows.get(id))
    }

    pub(super) fn workflow_revision(&self, reference: &str, revision: u32) -> Option<&Workflow> {
        self.by_reference
            .get(reference)
            .and_then(|revisions| revisions.get(&revision))
            .and_then(|id| self.workflows.get(id))
    }

    pub(super) fn list_tasks(&self, query: &TaskQuery) -> Page<Task> {
        // Ids sort by creation: what is older than the cursor is the
        // range below it, found by a seek, not a walk.
        let below = query.after.map_or(Bound::Unbounded, Bound::Excluded);
        let page = |ids: &mut dyn DoubleEndedIterator<Item = &TaskId>| -> Vec<Task> {
            ids.rev()
                .skip(query.offset)
                .take(query.limit)
                .filter_map(|id| self.tasks.get(id))
                .map(|t| Task::clone(t))
                .collect()
        };
        // One index answers the query: its size is the total, and only the
        // page's ids are looked up. Walking an id set backwards is newest
        // first.
        match (query.workflow, query.status) {
            (None, None) => {
                return Page {
                    items: page(
                        &mut self
                            .tasks
                            .range((Bound::Unbounded, below))
                            .map(|(id, _)| id),
                    ),
                    total: self.tasks.len(),
                };
            }
            (None, Some(status)) => {
                let Some(ids) = self.by_status.get(&status) else {
                    return Page {
                        items: Vec::new(),
                        total: 0,
                    };
                };
                return Page {
                    items: page(&mut ids.range((Bound::Unbounded, below))),
                    total: ids.len(),
                };
            }
            (Some(_), _) => {}
        }
        // A workflow, maybe with a status: walk the workflow's (small) index.
        let ids = query.workflow.and_then(|w| self.by_workflow.get(&w));
        paged(
            ids.into_iter()
                .flatten()
                .rev()
                .filter_map(|id| self.tasks.get(id))
                .filter(|t| query.status.is_none_or(|s| t.status == s)),
            |t| query.after.is_none_or(|after| t.id < after),
            query.offset,
            query.limit,
            |t| Task::clone(t),
        )
    }

    pub(super) fn workflow_tasks(&self, id: WorkflowId) -> Vec<Arc<Task>> {
        self.by_workflow
            .get(&id)
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| self.tasks.get(id))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn unfinished_tasks(&self) -> Vec<Task> {
        let mut ids: Vec<TaskId> = TaskStatus::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .filter_map(|s| self.by_status.get(s))
            .flatten()
            .copied()
            .collect();
        ids.sort();
        ids.iter()
            .filter_map(|id| self.tasks.get(id))
            .map(|t| Task::clone(t))
            .collect()
    }

    pub(super) fn list_workflows(&self, query: &WorkflowQuery) -> Page<Workflow> {
        // The text is built per workflow and per search: a scan of the
        // in-memory state, like the other unindexed filters.
        let needle = query.text.as_ref().map(|t| t.to_lowercase());
        let matches = |w: &&Workflow| {
            query.status.is_none_or(|s| w.status == s)
                && query.kind.as_ref().is_none_or(|k| &w.kind == k)
                && query
                    .reference
                    .as_ref()
                    .is_none_or(|r| w.reference.as_ref() == Some(r))
                && query
                    .trace_id
                    .as_ref()
                    .is_none_or(|t| w.trace_id.as_ref() == Some(t))
                && query
                    .idempotency_key
                    .as_ref()
                    .is_none_or(|k| w.idempotency_key.as_ref() == Some(k))
                && needle
                    .as_ref()
                    .is_none_or(|n| crate::workflow_search_text(w).contains(n.as_str()))
        };
        // A key or a reference names few workflows: read them through their
        // index instead of scanning every workflow.
        let keyed: Option<Vec<&Workflow>> = if let Some(key) = &query.idempotency_key {
            Some(self.workflow_by_idempotency_key(key).into_iter().collect())
        } else {
            query.reference.as_ref().map(|reference| {
                self.by_reference
                    .get(reference)
                    .into_iter()
                    .flat_map(|revisions| revisions.values())
                    .filter_map(|id| self.workflows.get(id))
                    .collect::<Vec<_>>()
            })
        };
        let candidates: Box<dyn Iterator<Item = &Workflow>> = match keyed {
            // Newest first, as ids sort by creation.
            Some(mut few) => {
                few.sort_by_key(|w| std::cmp::Reverse(w.id));
                Box::new(few.into_iter())
            }
            None => Box::new(self.workflows.values().rev()),
        };
        paged(
            candidates.filter(matches),
            |w| query.after.is_none_or(|after| w.id < after),
            query.offset,
            query.limit,
            |w| (*w).clone(),
        )
    }
}

/// A page of `matches` (newest first), with the total of all of them:
/// the items past the cursor (`past`), less the first `offset`, up to
/// `limit`. Every match is counted, so this walks them all: for the small
/// or unindexed sets only.
fn paged<'a, S: 'a, T>(
    matches: impl Iterator<Item = &'a S>,
    past: impl Fn(&S) -> bool,
    offset: usize,
    limit: usize,
    copy: impl Fn(&S) -> T,
) -> Page<T> {
    let mut total = 0;
    let mut skipped = 0;
    let mut items = Vec::new();
    for item in matches {
        total += 1;
        if !past(item) {
            continue;
        }
        if skipped < offset {
            skipped += 1;
        } else if items.len() < limit {
            items.push(copy(item));
        }
    }
    Page { items, total }
}
