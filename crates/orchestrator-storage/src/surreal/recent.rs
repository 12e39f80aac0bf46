//! Tasks and workflows read lately, kept parsed: a point read of one of
//! them costs no query (a query is about 0.3 ms of CPU, most of
//! `GET /tasks/{id}` on the embedded store) and no parse (a workflow's
//! document holds its submission, about a megabyte for a workflow of
//! 10,000 steps, read again each time one of its steps ends). Only for the
//! embedded engines: every write to their data goes through this process
//! (the engine's lock keeps any other out), so forgetting a record on each
//! write to it keeps the cache exact. A server has other writers, and gets
//! no cache.
//!
//! A read and a write may cross: the read fetches the old record, the
//! write commits and forgets the task, then the read would fill the cache
//! with the old record, for good. `writes` orders them. A write commits,
//! then counts itself in `writes`, then forgets. A read notes `writes`
//! before it fetches and fills only if no write was counted since,
//! checking again after the fill: a write counted after that second check
//! forgets after the fill, and one counted before it is seen, and the fill
//! taken back. (A read that notes `writes` after a write was counted began
//! after that write committed, so it fetched the new record.)
//!
//! The totals of task listings are kept the same way, by their count's
//! `WHERE` (each listing's own count statement, this module's text): a
//! page read while nothing changed its total needs no count, which walks
//! the COUNT index's deltas as a key range (a quarter of the CPU of
//! `GET /tasks?limit=50`). Any write to tasks,
//! and any insert of one, forgets every total.
//!
//! Whole pages are kept alike, by their statement and window: a page asked
//! for again while no task was written or inserted (a dashboard polling
//! its list, a client paging back) is answered from its stored documents
//! without a query, which would plan the statement and fetch each record
//! (about two fifths of the listing's CPU). Any write of a task, or
//! insert of one, forgets every page; a workflow's alone does not.
//!
//! A write whose outcome is unknown (no answer within the deadline: the
//! engine may still commit it later, after it was forgotten) stops the
//! cache for the life of the backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use orchestrator_core::{Task, TaskId, Workflow, WorkflowId};

use crate::{Error, RECENT_TASK_BYTES, Result};

pub(super) struct Recent {
    /// Writes that may have changed a task or workflow, counted once
    /// committed.
    writes: AtomicU64,
    /// Set for good after a write of unknown outcome.
    stopped: AtomicBool,
    tasks: quick_cache::sync::Cache<TaskId, Weighed<Task>, ByDoc>,
    workflows: quick_cache::sync::Cache<WorkflowId, Weighed<Workflow>, ByDoc>,
    /// Listing totals by their count statement. A std lock: held only for
    /// a map operation, never across an await.
    totals: Mutex<HashMap<String, u64>>,
    pages: quick_cache::sync::Cache<String, KeptPage, ByDoc>,
}

/// Bytes of kept workflows' documents at most (their parsed form takes a
/// few times that). Unlike the filesystem's store, which holds running
/// workflows in memory and keeps only finished ones read back, this one
/// reads running workflows too: a workflow of 10,000 steps is about a
/// megabyte of document (its submission and its tasks' ids), read again
/// each time one of its steps ends.
const RECENT_WORKFLOW_BYTES: u64 = 4 << 20;

/// Bytes of kept pages' documents at most: a page of 50 tasks is about
/// 50 KiB, so a few dozen pages.
const RECENT_PAGE_BYTES: u64 = 2 << 20;

/// A page as the query answered it: its documents, not yet parsed, and the
/// total of its listing.
#[derive(Clone)]
pub(super) struct KeptPage {
    pub(super) docs: Arc<[String]>,
    pub(super) total: u64,
}

/// How many listing totals are kept at most (one per status and workflow
/// filter asked for lately); past it, all are forgotten.
const MAX_TOTALS: usize = 256;

/// What a read noted before fetching: see [`Recent::fill`].
#[derive(Clone, Copy)]
pub(super) struct Ticket(u64);

/// A kind of record the cache keeps, by its id.
pub(super) trait Kept: Clone {
    type Id: Copy + Eq + std::hash::Hash;
    /// The table it is stored in.
    const TABLE: &'static str;
    fn id(&self) -> Self::Id;
    fn cache(recent: &Recent) -> &quick_cache::sync::Cache<Self::Id, Weighed<Self>, ByDoc>;
}

impl Kept for Task {
    type Id = TaskId;
    const TABLE: &'static str = "task";
    fn id(&self) -> TaskId {
        self.id
    }
    fn cache(recent: &Recent) -> &quick_cache::sync::Cache<TaskId, Weighed<Task>, ByDoc> {
        &recent.tasks
    }
}

impl Kept for Workflow {
    type Id = WorkflowId;
    const TABLE: &'static str = "workflow";
    fn id(&self) -> WorkflowId {
        self.id
    }
    fn cache(recent: &Recent) -> &quick_cache::sync::Cache<WorkflowId, Weighed<Workflow>, ByDoc> {
        &recent.workflows
    }
}

/// A record written by a write that returned: forgotten once it returns.
#[derive(Clone, Copy)]
pub(super) enum Written {
    Task(TaskId),
    Workflow(WorkflowId),
}

/// A record kept, with the size of the document it was parsed from.
#[derive(Clone)]
pub(super) struct Weighed<T> {
    record: Arc<T>,
    bytes: u32,
}

impl<T> Weighed<T> {
    fn new(record: &T, bytes: usize) -> Weighed<T>
    where
        T: Clone,
    {
        Weighed {
            record: Arc::new(record.clone()),
            bytes: u32::try_from(bytes).unwrap_or(u32::MAX),
        }
    }
}

#[derive(Clone)]
pub(super) struct ByDoc;

impl<K, T> quick_cache::Weighter<K, Weighed<T>> for ByDoc {
    fn weight(&self, _: &K, value: &Weighed<T>) -> u64 {
        u64::from(value.bytes).max(1)
    }
}

impl quick_cache::Weighter<String, KeptPage> for ByDoc {
    fn weight(&self, key: &String, value: &KeptPage) -> u64 {
        let docs: usize = value.docs.iter().map(String::len).sum();
        u64::try_from(key.len() + docs).unwrap_or(u64::MAX).max(1)
    }
}

impl Recent {
    pub(super) fn new() -> Recent {
        // One shard: a cache keeps no record heavier than its shard's share
        // of the budget, and the workflows worth keeping are the big ones.
        // A workflow is read about once per step ended, so the shard's
        // lock is not contended the way the tasks' would be.
        let workflows = quick_cache::OptionsBuilder::new()
            .estimated_items_capacity(64)
            .weight_capacity(RECENT_WORKFLOW_BYTES)
            .shards(1)
            .build()
            .expect("constant cache options are valid");
        // Estimated count: a task's JSON is about 1 KiB.
        Recent {
            writes: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            tasks: quick_cache::sync::Cache::with_weighter(2048, RECENT_TASK_BYTES, ByDoc),
            workflows: quick_cache::sync::Cache::with_options(
                workflows,
                ByDoc,
                Default::default(),
                Default::default(),
            ),
            totals: Mutex::new(HashMap::new()),
            // Estimated count: a page of 50 tasks.
            pages: quick_cache::sync::Cache::with_weighter(64, RECENT_PAGE_BYTES, ByDoc),
        }
    }

    /// The record keyed `id`, if kept.
    pub(super) fn kept<T: Kept>(&self, id: T::Id) -> Option<T> {
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        T::cache(self).get(&id).map(|found| T::clone(&found.record))
    }

    /// Noted before fetching from the database.
    pub(super) fn ticket(&self) -> Ticket {
        Ticket(self.writes.load(Ordering::SeqCst))
    }

    /// Keeps a record fetched after `ticket` was taken, from a document of
    /// `bytes`, unless a write may have crossed the fetch.
    pub(super) fn fill<T: Kept>(&self, ticket: Ticket, record: &T, bytes: usize) {
        let cache = T::cache(self);
        self.keep_unless_crossed(
            ticket,
            || cache.insert(record.id(), Weighed::new(record, bytes)),
            || drop(cache.remove(&record.id())),
        );
    }

    /// The total of the listing counted by `count`, if kept.
    pub(super) fn total(&self, count: &str) -> Option<u64> {
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        self.lock_totals().get(count).copied()
    }

    /// Keeps the total `count` answered after `ticket` was taken, unless
    /// a write may have crossed it (as [`Recent::fill`]).
    pub(super) fn fill_total(&self, ticket: Ticket, count: &str, total: u64) {
        self.keep_unless_crossed(
            ticket,
            || {
                let mut totals = self.lock_totals();
                if totals.len() >= MAX_TOTALS {
                    totals.clear();
                }
                totals.insert(count.to_owned(), total);
            },
            || {
                self.lock_totals().remove(count);
            },
        );
    }

    /// The page `key` names (its statement and window), if kept.
    pub(super) fn page(&self, key: &str) -> Option<KeptPage> {
        if self.stopped.load(Ordering::SeqCst) {
            return None;
        }
        self.pages.get(key)
    }

    /// Keeps a page answered after `ticket` was taken, unless a write may
    /// have crossed it (as [`Recent::fill`]).
    pub(super) fn fill_page(&self, ticket: Ticket, key: String, page: KeptPage) {
        self.keep_unless_crossed(
            ticket,
            || self.pages.insert(key.clone(), page),
            || drop(self.pages.remove(&key)),
        );
    }

    /// Every fill, as the module's comment describes it: `keep` only if no
    /// write was counted since `ticket`, and `undo` it if one was counted
    /// meanwhile.
    fn keep_unless_crossed(&self, ticket: Ticket, keep: impl FnOnce(), undo: impl FnOnce()) {
        if self.writes.load(Ordering::SeqCst) != ticket.0 || self.stopped.load(Ordering::SeqCst) {
            return;
        }
        keep();
        if self.writes.load(Ordering::SeqCst) != ticket.0 {
            undo();
        }
    }

    /// After a write to `records` returned `outcome`: counts it, then
    /// forgets them, and every task listing if a task was among them. A
    /// listing holds tasks only, so a write of a workflow alone (two per
    /// step that ends) leaves the pages kept.
    pub(super) fn wrote<T>(&self, records: impl IntoIterator<Item = Written>, outcome: &Result<T>) {
        self.counted(outcome);
        let mut tasks_written = false;
        for record in records {
            match record {
                Written::Task(id) => {
                    tasks_written = true;
                    drop(self.tasks.remove(&id));
                }
                Written::Workflow(id) => drop(self.workflows.remove(&id)),
            }
        }
        if tasks_written {
            self.forget_listings();
        }
    }

    /// After a write that may have changed any record (a prune).
    pub(super) fn wrote_any<T>(&self, outcome: &Result<T>) {
        self.counted(outcome);
        self.tasks.clear();
        self.workflows.clear();
        self.forget_listings();
    }

    fn forget_listings(&self) {
        self.lock_totals().clear();
        self.pages.clear();
    }

    /// After a write that may have added tasks: no task kept changed, but
    /// the totals did.
    pub(super) fn inserted<T>(&self, outcome: &Result<T>) {
        self.counted(outcome);
        self.forget_listings();
    }

    fn lock_totals(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn counted<T>(&self, outcome: &Result<T>) {
        if matches!(outcome, Err(Error::Unavailable(_))) {
            self.stopped.store(true, Ordering::SeqCst);
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use orchestrator_core::{Task, Workflow, WorkflowId};

    use super::{KeptPage, Recent, Written};
    use crate::{Error, Result};

    fn task() -> Task {
        crate::surreal::test_task(WorkflowId::new(), "t".into())
    }

    const OK: Result<()> = Ok(());

    #[test]
    fn a_read_that_a_write_crossed_fills_nothing() {
        let recent = Recent::new();
        let old = task();
        let ticket = recent.ticket();
        // The write commits and forgets while the read is fetching.
        recent.wrote([Written::Task(old.id)], &OK);
        recent.fill(ticket, &old, 100);
        assert!(
            recent.kept::<Task>(old.id).is_none(),
            "a stale task was kept"
        );
        // A read begun after the write fills.
        let ticket = recent.ticket();
        recent.fill(ticket, &old, 100);
        assert_eq!(recent.kept::<Task>(old.id).map(|t| t.id), Some(old.id));
    }

    #[test]
    fn a_write_forgets_what_was_kept() {
        let recent = Recent::new();
        let (a, b) = (task(), task());
        let ticket = recent.ticket();
        recent.fill(ticket, &a, 100);
        recent.fill(ticket, &b, 100);
        recent.wrote([Written::Task(a.id)], &OK);
        assert!(recent.kept::<Task>(a.id).is_none());
        assert!(
            recent.kept::<Task>(b.id).is_some(),
            "a write to one task forgot another"
        );
        recent.wrote_any(&OK);
        assert!(recent.kept::<Task>(b.id).is_none());
    }

    #[test]
    fn totals_are_kept_until_any_task_write_or_insert() {
        let recent = Recent::new();
        let t = task();
        let ticket = recent.ticket();
        recent.fill_total(ticket, "SELECT count() FROM task", 7);
        assert_eq!(recent.total("SELECT count() FROM task"), Some(7));
        recent.inserted(&OK);
        assert_eq!(recent.total("SELECT count() FROM task"), None);
        // A count that an insert crossed is not kept.
        let ticket = recent.ticket();
        recent.inserted(&OK);
        recent.fill_total(ticket, "SELECT count() FROM task", 7);
        assert_eq!(recent.total("SELECT count() FROM task"), None);
        let ticket = recent.ticket();
        recent.fill_total(ticket, "SELECT count() FROM task", 8);
        recent.wrote([Written::Task(t.id)], &OK);
        assert_eq!(recent.total("SELECT count() FROM task"), None);
    }

    #[test]
    fn pages_are_kept_until_any_task_write_or_insert() {
        let recent = Recent::new();
        let page = || KeptPage {
            docs: vec!["{}".to_owned()].into(),
            total: 1,
        };
        let key = "SELECT VALUE doc FROM task\nlimit 50 offset 0 after None";
        let ticket = recent.ticket();
        recent.fill_page(ticket, key.to_owned(), page());
        assert_eq!(recent.page(key).map(|p| p.total), Some(1));
        recent.inserted(&OK);
        assert!(recent.page(key).is_none(), "an insert left a page kept");
        // A page that a write crossed is not kept.
        let ticket = recent.ticket();
        recent.wrote([Written::Task(task().id)], &OK);
        recent.fill_page(ticket, key.to_owned(), page());
        assert!(recent.page(key).is_none(), "a stale page was kept");
        let ticket = recent.ticket();
        recent.fill_page(ticket, key.to_owned(), page());
        // A listing holds tasks only: a workflow's write leaves it kept,
        // a write of the workflow with a task does not.
        let workflow = Workflow::new("k", "w", chrono::Utc::now()).id;
        recent.wrote([Written::Workflow(workflow)], &OK);
        assert!(
            recent.page(key).is_some(),
            "a workflow's write forgot a page"
        );
        recent.wrote([Written::Task(task().id), Written::Workflow(workflow)], &OK);
        assert!(
            recent.page(key).is_none(),
            "a task's write left a page kept"
        );
        let ticket = recent.ticket();
        recent.fill_page(ticket, key.to_owned(), page());
        recent.wrote_any(&OK);
        assert!(recent.page(key).is_none(), "a prune left a page kept");
    }

    #[test]
    fn a_workflow_is_kept_until_a_write_to_it() {
        let recent = Recent::new();
        let workflow = Workflow::new("k", "w", chrono::Utc::now());
        let ticket = recent.ticket();
        recent.fill(ticket, &workflow, 3 << 20);
        assert!(
            recent.kept::<Workflow>(workflow.id).is_some(),
            "a workflow of 3 MiB of document was not kept"
        );
        recent.wrote([Written::Task(task().id)], &OK);
        assert!(recent.kept::<Workflow>(workflow.id).is_some());
        recent.wrote([Written::Workflow(workflow.id)], &OK);
        assert!(recent.kept::<Workflow>(workflow.id).is_none());
        let ticket = recent.ticket();
        recent.inserted(&OK);
        recent.fill(ticket, &workflow, 100);
        assert!(
            recent.kept::<Workflow>(workflow.id).is_none(),
            "a stale workflow was kept"
        );
        let ticket = recent.ticket();
        recent.fill(ticket, &workflow, 100);
        recent.wrote_any(&OK);
        assert!(recent.kept::<Workflow>(workflow.id).is_none());
    }

    #[test]
    fn a_write_of_unknown_outcome_stops_the_cache() {
        let recent = Recent::new();
        let t = task();
        recent.wrote(
            [Written::Task(t.id)],
            &Err::<(), _>(Error::Unavailable("no answer within 5s".into())),
        );
        let ticket = recent.ticket();
        recent.fill(ticket, &t, 100);
        assert!(recent.kept::<Task>(t.id).is_none());
        // A write that was refused (its transaction rolled back) does not.
        let recent = Recent::new();
        recent.wrote(
            [Written::Task(t.id)],
            &Err::<(), _>(Error::TaskNotFound(t.id)),
        );
        let ticket = recent.ticket();
        recent.fill(ticket, &t, 100);
        assert!(recent.kept::<Task>(t.id).is_some());
    }
}
