//! The filesystem backend's records and indexes: every index in memory,
//! and the records themselves in memory too, except finished work, which
//! is read back from its line (see [`super::history`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;
use std::sync::Arc;

use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus};

use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::webhook::{Delivery, Subscription};

use super::history::{Files, Held, Place};
use super::line::Line;
use crate::{AuditQuery, Page, Record, RecordKind, Result, TaskQuery, WorkflowQuery};

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

/// How much [`Recent`] keeps, in bytes of the records' lines (a parsed
/// record takes a few times its line): tasks, then workflows.
const RECENT_TASK_BYTES: u64 = 2 << 20;
const RECENT_WORKFLOW_BYTES: u64 = 512 << 10;

/// Finished records read back (or finished) lately, parsed: a client
/// waiting on a workflow, a dashboard page, the engine's bookkeeping after
/// a workflow ends read the same few records again and again. Bounded by
/// the size of their lines (S3-FIFO, so one listing of old history does not
/// flush it).
struct Recent {
    tasks: RecentCache<TaskId, Task>,
    workflows: RecentCache<WorkflowId, Workflow>,
}

/// A record a scan took under the state lock: the record, or where its
/// line is in the snapshot, to be read with the [`Files`] taken under the
/// same lock once it is let go. The snapshot is replaced whole, never
/// changed in place, so the place stays good for that file; a journal
/// line is read under the lock, since a compaction empties the journal.
pub(super) enum Found {
    Record(Record),
    InSnapshot {
        kind: RecordKind,
        key: String,
        at: Place,
    },
}

impl Found {
    fn of<T, S>(
        kind: RecordKind,
        key: &impl ToString,
        held: &Held<T, S>,
        read_now: impl FnOnce() -> Result<Record>,
    ) -> Result<Found> {
        match held {
            Held::Disk { at, .. } if !at.in_journal_file() => Ok(Found::InSnapshot {
                kind,
                key: key.to_string(),
                at: *at,
            }),
            _ => read_now().map(Found::Record),
        }
    }

    /// The record, read from `files` if it was left on disk.
    pub(super) fn read(self, files: &Files) -> Result<Record> {
        match self {
            Found::Record(record) => Ok(record),
            Found::InSnapshot { kind, key, at } => files.read(kind, &key, at),
        }
    }
}

/// Whether a record read back from disk is kept in [`Recent`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// A request's read: it may well be read again soon.
    Recent,
    /// A scan's (a storage move's copy and verify): every record once, in
    /// key order. Kept, they would only push out what requests read, and
    /// cost a copy each (the cache's reference keeps the record shared).
    Not,
}

type RecentCache<K, T> = quick_cache::unsync::Cache<K, Weighed<T>, ByLine>;

/// A record with the length of its line, its weight in [`Recent`].
#[derive(Clone)]
struct Weighed<T> {
    record: Arc<T>,
    bytes: u32,
}

#[derive(Clone)]
struct ByLine;

impl<K, T> quick_cache::Weighter<K, Weighed<T>> for ByLine {
    fn weight(&self, _: &K, value: &Weighed<T>) -> u64 {
        u64::from(value.bytes).max(1)
    }
}

impl Recent {
    fn new() -> Recent {
        // Estimated counts: a task's line is about 1 KiB, a workflow's 2.
        Recent {
            tasks: quick_cache::unsync::Cache::with_weighter(2048, RECENT_TASK_BYTES, ByLine),
            workflows: quick_cache::unsync::Cache::with_weighter(
                256,
                RECENT_WORKFLOW_BYTES,
                ByLine,
            ),
        }
    }
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
    audit: BTreeMap<String, HeldAudit>,
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
                workflows, audit, ..
            } => {
                for id in workflows {
                    self.remove_workflow(id);
                }
                self.remove_audit(&audit);
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
            audit: (self.audit.values())
                .filter(|h| matches!(h, Held::Memory { .. }))
                .count(),
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

    fn load_audit(&self, id: &str, held: &HeldAudit) -> Result<AuditRecord> {
        match held {
            Held::Memory { record, .. } => Ok(AuditRecord::clone(record)),
            Held::Disk { at, .. } => match self.files.read(RecordKind::Audit, id, *at)? {
                Record::Audit(record) => Ok(record),
                _ => unreachable!("Files::read returns a record of the kind asked for"),
            },
        }
    }

    pub(super) fn tokens(&self) -> impl Iterator<Item = &ApiToken> {
        self.tokens.values()
    }

    pub(super) fn secrets(&self) -> impl Iterator<Item = &SecretRecord> {
        self.secrets.values()
    }

    /// Every audit record's id and time, oldest first.
    pub(super) fn audit_times(
        &self,
    ) -> impl DoubleEndedIterator<Item = (&String, chrono::DateTime<chrono::Utc>)> {
        self.audit
            .iter()
            .map(|(id, held)| (id, audit_summary(held).0))
    }

    pub(super) fn held_audit(&self) -> impl Iterator<Item = (&String, &HeldAudit)> {
        self.audit.iter()
    }

    pub(super) fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        // Time, actor and action are answered from memory; a target is read
        // back from disk, a scan of every candidate.
        let cheap = |held: &HeldAudit| {
            let (time, actor, action) = audit_summary(held);
            query.since.is_none_or(|t| time >= t)
                && query.until.is_none_or(|t| time < t)
                && query.actor.as_ref().is_none_or(|a| a.as_str() == actor)
                && query.action.as_ref().is_none_or(|a| a.as_str() == action)
        };
        let candidates = self.audit.iter().rev().filter(|(_, held)| cheap(held));
        if query.target.is_none() {
            let page = paged(candidates, |_| true, query.offset, query.limit, |c| *c);
            return Ok(Page {
                items: page
                    .items
                    .into_iter()
                    .map(|(id, held)| self.load_audit(id, held))
                    .collect::<Result<_>>()?,
                total: page.total,
            });
        }
        let mut failed = None;
        let loaded = candidates.filter_map(|(id, held)| match self.load_audit(id, held) {
            Ok(record) => query.matches(&record).then_some(record),
            Err(e) => {
                failed.get_or_insert(e);
                None
            }
        });
        let page = paged(
            loaded,
            |_| true,
            query.offset,
            query.limit,
            AuditRecord::clone,
        );
        match failed {
            Some(e) => Err(e),
            None => Ok(page),
        }
    }

    /// The record of `kind` stored under `key`, if any.
    pub(super) fn record(&self, kind: RecordKind, key: &str) -> Result<Option<Record>> {
        let other = match kind {
            RecordKind::Token => self.tokens.get(key).cloned().map(Record::Token),
            RecordKind::Secret => self.secrets.get(key).cloned().map(Record::Secret),
            RecordKind::Audit => match self.audit.get(key) {
                Some(held) => Some(Record::Audit(self.load_audit(key, held)?)),
                None => None,
            },
            RecordKind::Schedule => self.schedules.get(key).cloned().map(Record::Schedule),
            RecordKind::ScheduleClaim => self.claims.get(key).cloned().map(Record::ScheduleClaim),
            RecordKind::WebhookSubscription => self
                .subscriptions
                .get(key)
                .cloned()
                .map(Record::WebhookSubscription),
            RecordKind::WebhookDelivery => self
                .deliveries
                .get(key)
                .cloned()
                .map(Record::WebhookDelivery),
            RecordKind::Workflow | RecordKind::Task => {
                let Ok(id) = key.parse::<uuid::Uuid>() else {
                    return Ok(None);
                };
                return Ok(match kind {
                    RecordKind::Workflow => self
                        .workflow(WorkflowId::from_uuid(id))?
                        .map(|w| Record::Workflow(Arc::unwrap_or_clone(w))),
                    _ => self
                        .task(TaskId::from_uuid(id))?
                        .map(|t| Record::Task(Arc::unwrap_or_clone(t))),
                });
            }
        };
        Ok(other)
    }

    /// Up to `limit` records of `kind` whose keys sort after `after`, in
    /// key order. Ids print as lowercase hex, so text order is id order; a
    /// key that is not an id (a damaged line's place) sorts after every id.
    /// A finished record in the snapshot is taken as its place, to be read
    /// once the lock is let go (see [`Found`]).
    pub(super) fn records_after(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Found>> {
        use std::ops::Bound::{Excluded, Unbounded};
        // Keyed by text: the range is the text after `after`.
        let by_text = |after: Option<&str>| match after {
            None => (Unbounded, Unbounded),
            Some(key) => (Excluded(key.to_owned()), Unbounded),
        };
        fn first<'a, T: Clone + 'a>(
            range: impl Iterator<Item = (&'a String, &'a T)>,
            limit: usize,
            record: impl Fn(T) -> Record,
        ) -> Result<Vec<Found>> {
            Ok(range
                .take(limit)
                .map(|(_, r)| Found::Record(record(r.clone())))
                .collect())
        }
        match kind {
            RecordKind::Token => {
                return first(self.tokens.range(by_text(after)), limit, Record::Token);
            }
            RecordKind::Secret => {
                return first(self.secrets.range(by_text(after)), limit, Record::Secret);
            }
            RecordKind::Audit => {
                return self
                    .audit
                    .range(by_text(after))
                    .take(limit)
                    .map(|(id, held)| {
                        Found::of(RecordKind::Audit, id, held, || {
                            Ok(Record::Audit(self.load_audit(id, held)?))
                        })
                    })
                    .collect();
            }
            RecordKind::Schedule => {
                return first(
                    self.schedules.range(by_text(after)),
                    limit,
                    Record::Schedule,
                );
            }
            RecordKind::ScheduleClaim => {
                return first(
                    self.claims.range(by_text(after)),
                    limit,
                    Record::ScheduleClaim,
                );
            }
            RecordKind::WebhookSubscription => {
                return first(
                    self.subscriptions.range(by_text(after)),
                    limit,
                    Record::WebhookSubscription,
                );
            }
            RecordKind::WebhookDelivery => {
                return first(
                    self.deliveries.range(by_text(after)),
                    limit,
                    Record::WebhookDelivery,
                );
            }
            RecordKind::Workflow | RecordKind::Task => {}
        }
        let from = match after {
            None => Unbounded,
            Some(key) => match key.parse::<uuid::Uuid>() {
                Ok(id) => Excluded(id),
                Err(_) => return Ok(Vec::new()),
            },
        };
        match kind {
            RecordKind::Workflow => self
                .workflows
                .range((from.map(WorkflowId::from_uuid), Unbounded))
                .take(limit)
                .map(|(id, held)| {
                    Found::of(RecordKind::Workflow, id, held, || {
                        Ok(Record::Workflow(Arc::unwrap_or_clone(self.load_workflow(
                            *id,
                            held,
                            Keep::Not,
                        )?)))
                    })
                })
                .collect(),
            _ => self
                .tasks
                .range((from.map(TaskId::from_uuid), Unbounded))
                .take(limit)
                .map(|(id, held)| {
                    Found::of(RecordKind::Task, id, held, || {
                        Ok(Record::Task(Arc::unwrap_or_clone(self.load_task(
                            *id,
                            held,
                            Keep::Not,
                        )?)))
                    })
                })
                .collect(),
        }
    }

    fn load_task(&self, id: TaskId, held: &HeldTask, keep: Keep) -> Result<Arc<Task>> {
        self.load(
            id,
            held,
            keep,
            RecordKind::Task,
            |r| &mut r.tasks,
            |r| match r {
                Record::Task(task) => Some(task),
                _ => None,
            },
        )
    }

    fn load_workflow(
        &self,
        id: WorkflowId,
        held: &HeldWorkflow,
        keep: Keep,
    ) -> Result<Arc<Workflow>> {
        self.load(
            id,
            held,
            keep,
            RecordKind::Workflow,
            |r| &mut r.workflows,
            |r| match r {
                Record::Workflow(workflow) => Some(workflow),
                _ => None,
            },
        )
    }

    /// A record as held: in memory, else parsed in [`Recent`], else read
    /// back from its line (and kept in [`Recent`] if `keep` says so).
    fn load<K, T: Clone, S>(
        &self,
        id: K,
        held: &Held<T, S>,
        keep: Keep,
        kind: RecordKind,
        cache: fn(&mut Recent) -> &mut RecentCache<K, T>,
        of_kind: fn(Record) -> Option<T>,
    ) -> Result<Arc<T>>
    where
        K: Copy + Eq + std::hash::Hash + ToString,
    {
        let at = match held {
            Held::Memory { record, .. } => return Ok(record.clone()),
            Held::Disk { at, .. } => *at,
        };
        if let Some(hit) = cache(&mut self.recent.borrow_mut()).get(&id) {
            return Ok(hit.record.clone());
        }
        let read = self.files.read(kind, &id.to_string(), at)?;
        let read =
            Arc::new(of_kind(read).expect("Files::read returns a record of the kind asked for"));
        if keep == Keep::Recent {
            cache(&mut self.recent.borrow_mut()).insert(id, weighed(&read, at));
        }
        Ok(read)
    }

    fn unshared_workflow(&self, id: WorkflowId, held: &HeldWorkflow) -> Result<Workflow> {
        self.load_workflow(id, held, Keep::Recent)
            .map(Arc::unwrap_or_clone)
    }

    pub(super) fn task(&self, id: TaskId) -> Result<Option<Arc<Task>>> {
        self.tasks
            .get(&id)
            .map(|held| self.load_task(id, held, Keep::Recent))
            .transpose()
    }

    pub(super) fn workflow(&self, id: WorkflowId) -> Result<Option<Arc<Workflow>>> {
        self.workflows
            .get(&id)
            .map(|held| self.load_workflow(id, held, Keep::Recent))
            .transpose()
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

    pub(super) fn task_ids(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.tasks.keys().copied()
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
        let held = match applied.at {
            Some(at) if finished => Held::Disk {
                at,
                version: task.version,
                summary: task.status,
            },
            at => Held::Memory {
                record: Arc::new(task.clone()),
                at,
            },
        };
        self.tasks.insert(task.id, held);
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
        for id in ids {
            self.audit.remove(id);
        }
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

    pub(super) fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        // Ids sort by creation: what is older than the cursor is the
        // range below it, found by a seek, not a walk.
        let below = query.after.map_or(Bound::Unbounded, Bound::Excluded);
        let page = |ids: &mut dyn DoubleEndedIterator<Item = &TaskId>| -> Result<Vec<Task>> {
            ids.rev()
                .skip(query.offset)
                .take(query.limit)
                .filter_map(|id| self.tasks.get(id).map(|held| (id, held)))
                .map(|(id, held)| {
                    self.load_task(*id, held, Keep::Recent)
                        .map(Arc::unwrap_or_clone)
                })
                .collect()
        };
        // One index answers the query: its size is the total, and only the
        // page's ids are read. Walking an id set backwards is newest first.
        match (query.workflow, query.status) {
            (None, None) => {
                return Ok(Page {
                    items: page(
                        &mut self
                            .tasks
                            .range((Bound::Unbounded, below))
                            .map(|(id, _)| id),
                    )?,
                    total: self.tasks.len(),
                });
            }
            (None, Some(status)) => {
                let Some(ids) = self.by_status.get(&status) else {
                    return Ok(Page {
                        items: Vec::new(),
                        total: 0,
                    });
                };
                return Ok(Page {
                    items: page(&mut ids.range((Bound::Unbounded, below)))?,
                    total: ids.len(),
                });
            }
            (Some(_), _) => {}
        }
        // A workflow, maybe with a status: walk the workflow's (small) index.
        let workflow = query.workflow.expect("matched above");
        let matches = self
            .workflow_range(workflow)
            .rev()
            .filter_map(|(_, id)| self.tasks.get(id).map(|held| (*id, held)))
            .filter(|(_, held)| query.status.is_none_or(|s| task_status(held) == s));
        let page = paged(
            matches,
            |(id, _)| query.after.is_none_or(|after| *id < after),
            query.offset,
            query.limit,
            |(id, held)| (*id, *held),
        );
        Ok(Page {
            items: page
                .items
                .into_iter()
                .map(|(id, held)| {
                    self.load_task(id, held, Keep::Recent)
                        .map(Arc::unwrap_or_clone)
                })
                .collect::<Result<_>>()?,
            total: page.total,
        })
    }

    pub(super) fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        self.workflow_range(id)
            .filter_map(|(_, id)| self.tasks.get(id).map(|held| (id, held)))
            .map(|(id, held)| self.load_task(*id, held, Keep::Recent))
            .collect()
    }

    pub(super) fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        let mut ids: Vec<TaskId> = TaskStatus::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .filter_map(|s| self.by_status.get(s))
            .flatten()
            .copied()
            .collect();
        ids.sort();
        ids.iter()
            .filter_map(|id| self.tasks.get(id).map(|held| (id, held)))
            .map(|(id, held)| {
                self.load_task(*id, held, Keep::Recent)
                    .map(Arc::unwrap_or_clone)
            })
            .collect()
    }

    pub(super) fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        let needle = query.text.as_ref().map(|t| t.to_lowercase());
        // What the summary of a workflow on disk answers.
        let cheap = |held: &HeldWorkflow| {
            let (status, kind) = workflow_summary(held);
            query.status.is_none_or(|s| status == s)
                && query.kind.as_ref().is_none_or(|k| k.as_str() == kind)
        };
        // The rest needs the record. The text is built per workflow and
        // per search: a scan, like the other unindexed filters, which reads
        // finished workflows back from disk.
        let matches = |w: &Workflow| {
            query
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
        let needs_record = query.reference.is_some()
            || query.trace_id.is_some()
            || query.idempotency_key.is_some()
            || needle.is_some();
        // A key or a reference names few workflows: read them through their
        // index instead of scanning every workflow.
        let keyed: Option<Vec<WorkflowId>> = if let Some(key) = &query.idempotency_key {
            Some(
                self.by_idempotency_key
                    .get(key)
                    .copied()
                    .into_iter()
                    .collect(),
            )
        } else {
            query.reference.as_ref().map(|reference| {
                self.by_reference
                    .get(reference)
                    .into_iter()
                    .flat_map(|revisions| revisions.values().copied())
                    .collect()
            })
        };
        let candidates: Box<dyn Iterator<Item = (WorkflowId, &HeldWorkflow)>> = match keyed {
            // Newest first, as ids sort by creation.
            Some(mut few) => {
                few.sort_by_key(|id| std::cmp::Reverse(*id));
                Box::new(
                    few.into_iter()
                        .filter_map(|id| self.workflows.get(&id).map(|held| (id, held))),
                )
            }
            None => Box::new(self.workflows.iter().rev().map(|(id, held)| (*id, held))),
        };
        let past = |id: &WorkflowId| query.after.is_none_or(|after| *id < after);
        if !needs_record {
            let page = paged(
                candidates.filter(|(_, held)| cheap(held)),
                |(id, _)| past(id),
                query.offset,
                query.limit,
                |(id, held)| (*id, *held),
            );
            return Ok(Page {
                items: page
                    .items
                    .into_iter()
                    .map(|(id, held)| self.unshared_workflow(id, held))
                    .collect::<Result<_>>()?,
                total: page.total,
            });
        }
        // Read back one at a time: only the page is kept.
        let mut failed = None;
        let loaded = candidates
            .filter(|(_, held)| cheap(held))
            .filter_map(
                |(id, held)| match self.load_workflow(id, held, Keep::Recent) {
                    Ok(workflow) => matches(&workflow).then_some(workflow),
                    Err(e) => {
                        failed.get_or_insert(e);
                        None
                    }
                },
            );
        let page = paged(
            loaded,
            |w| past(&w.id),
            query.offset,
            query.limit,
            |w| Workflow::clone(w),
        );
        match failed {
            Some(e) => Err(e),
            None => Ok(page),
        }
    }
}

fn weighed<T>(record: &Arc<T>, at: Place) -> Weighed<T> {
    Weighed {
        record: record.clone(),
        bytes: at.len,
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
/// A page of `matches` (newest first), with the total of all of them:
/// the items past the cursor (`past`), less the first `offset`, up to
/// `limit`. Every match is counted, so this walks them all: for the small
/// or unindexed sets only.
fn paged<S, T>(
    matches: impl Iterator<Item = S>,
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
        if !past(&item) {
            continue;
        }
        if skipped < offset {
            skipped += 1;
        } else if items.len() < limit {
            items.push(copy(&item));
        }
    }
    Page { items, total }
}
