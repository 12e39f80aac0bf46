//! Reading the state's records: in memory, from [`Recent`] (finished
//! records read back lately, parsed), or read back from their lines; and
//! the listings, which answer what they can from the summaries finished
//! records keep in memory and read back only the page (or the candidates a
//! filter on a field not summarised needs).

use std::ops::Bound;
use std::sync::Arc;

use orchestrator_core::access::AuditRecord;
use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId};

use super::{
    HeldAudit, HeldTask, HeldWorkflow, State, audit_summary, task_status, workflow_summary,
};
use crate::fs::history::{Files, Held, Place};
use crate::{
    AuditQuery, Page, RECENT_TASK_BYTES, Record, RecordKind, Result, TaskQuery, WorkflowQuery,
};

/// How much [`Recent`] keeps of workflows, in bytes of their lines (a
/// parsed record takes a few times its line); of tasks, see
/// [`RECENT_TASK_BYTES`].
const RECENT_WORKFLOW_BYTES: u64 = 512 << 10;

/// Finished records read back (or finished) lately, parsed: a client
/// waiting on a workflow, a dashboard page, the engine's bookkeeping after
/// a workflow ends read the same few records again and again. Bounded by
/// the size of their lines (S3-FIFO, so one listing of old history does not
/// flush it).
pub(super) struct Recent {
    pub(super) tasks: RecentCache<TaskId, Task>,
    pub(super) workflows: RecentCache<WorkflowId, Workflow>,
}

/// A record a scan took under the state lock: the record, or where its
/// line is in the snapshot, to be read with the [`Files`] taken under the
/// same lock once it is let go. The snapshot is replaced whole, never
/// changed in place, so the place stays good for that file; a journal
/// line is read under the lock, since a compaction empties the journal.
// Taken a few dozen at a time and read at once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub(in crate::fs) enum Found {
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
    pub(in crate::fs) fn read(self, files: &Files) -> Result<Record> {
        match self {
            Found::Record(record) => Ok(record),
            Found::InSnapshot { kind, key, at } => files.read(kind, &key, at),
        }
    }
}

/// Whether a record read back from disk is kept in [`Recent`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// A request's read: it may well be read again soon.
    Recent,
    /// A scan's (a storage move's copy and verify): every record once, in
    /// key order. Kept, they would only push out what requests read, and
    /// cost a copy each (the cache's reference keeps the record shared).
    Not,
}

pub(super) type RecentCache<K, T> = quick_cache::unsync::Cache<K, Weighed<T>, ByLine>;

/// A record with the length of its line, its weight in [`Recent`].
#[derive(Clone)]
pub(super) struct Weighed<T> {
    record: Arc<T>,
    bytes: u32,
}

#[derive(Clone)]
pub(super) struct ByLine;

impl<K, T> quick_cache::Weighter<K, Weighed<T>> for ByLine {
    fn weight(&self, _: &K, value: &Weighed<T>) -> u64 {
        u64::from(value.bytes).max(1)
    }
}

impl Recent {
    pub(super) fn new() -> Recent {
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

impl State {
    pub(super) fn load_audit(&self, id: &str, held: &HeldAudit) -> Result<AuditRecord> {
        match held {
            Held::Memory { record, .. } => Ok(AuditRecord::clone(record)),
            Held::Disk { at, .. } => match self.files.read(RecordKind::Audit, id, *at)? {
                Record::Audit(record) => Ok(record),
                _ => unreachable!("Files::read returns a record of the kind asked for"),
            },
        }
    }

    pub(in crate::fs) fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
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
                    .map(|(id, held)| self.load_audit(&id.text(), held))
                    .collect::<Result<_>>()?,
                total: page.total,
            });
        }
        let mut failed = None;
        let loaded = candidates.filter_map(|(id, held)| match self.load_audit(&id.text(), held) {
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
    pub(in crate::fs) fn record(&self, kind: RecordKind, key: &str) -> Result<Option<Record>> {
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
    pub(in crate::fs) fn records_after(
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
                    .after(after)
                    .take(limit)
                    .map(|(id, held)| {
                        let id = id.text();
                        Found::of(RecordKind::Audit, &id, held, || {
                            Ok(Record::Audit(self.load_audit(&id, held)?))
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

    pub(super) fn load_task(&self, id: TaskId, held: &HeldTask, keep: Keep) -> Result<Arc<Task>> {
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

    pub(super) fn load_workflow(
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

    pub(in crate::fs) fn task(&self, id: TaskId) -> Result<Option<Arc<Task>>> {
        self.tasks
            .get(&id)
            .map(|held| self.load_task(id, held, Keep::Recent))
            .transpose()
    }

    pub(in crate::fs) fn workflow(&self, id: WorkflowId) -> Result<Option<Arc<Workflow>>> {
        self.workflows
            .get(&id)
            .map(|held| self.load_workflow(id, held, Keep::Recent))
            .transpose()
    }

    pub(in crate::fs) fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
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

    pub(in crate::fs) fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        self.workflow_range(id)
            .filter_map(|(_, id)| self.tasks.get(id).map(|held| (id, held)))
            .map(|(id, held)| self.load_task(*id, held, Keep::Recent))
            .collect()
    }

    pub(in crate::fs) fn unfinished_tasks(&self) -> Result<Vec<Task>> {
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

    pub(in crate::fs) fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
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

pub(super) fn weighed<T>(record: &Arc<T>, at: Place) -> Weighed<T> {
    Weighed {
        record: record.clone(),
        bytes: at.len,
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
