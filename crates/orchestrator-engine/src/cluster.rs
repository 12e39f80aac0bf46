//! Life among other nodes: heartbeats, lease renewal, taking over the
//! running tasks of nodes that stopped, picking up work that other nodes
//! accepted (on a shared store), and hearing every node's changes through
//! the store's change feed, to announce them as events here.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::event::{
    Before, Change, TaskMark, pause_change, task_changes, workflow_change,
};
use orchestrator_core::{Node, Task, TaskId, TaskStatus, WorkflowId, WorkflowStatus};
use orchestrator_storage::{Change as StoredChange, ChangeFeed};
use tokio_util::sync::CancellationToken;

use crate::Result;
use crate::attempts::Attempts;
use crate::events::EventBus;
use crate::lifecycle::Lifecycle;
use crate::queue::Queue;
use crate::records::Records;

/// How long a start waits for the change feed to follow the store.
const FEED_START_WAIT: Duration = Duration::from_secs(10);
/// Every this many polls, unfinished workflows are advanced too, in case
/// the node that should have done it stopped half-way.
const ADVANCE_EVERY: u32 = 10;
/// How long, at least, a node leaves a task that another node accepted to
/// that node (up to twice this, drawn per task): about what a claim takes
/// to be stored and heard back on a loaded SurrealDB server, so that an
/// idle node does not race the task's own node for it. Only a start is
/// delayed, and only on a node that did not accept the task.
const FOREIGN_GRACE: Duration = Duration::from_millis(40);

/// How long a claim holds, and how often a shared store is looked through.
pub(crate) struct Timing {
    pub(crate) lease: Duration,
    pub(crate) poll: Duration,
    /// When this life of the node started: its heartbeats say so, and
    /// its lock holds last while it does.
    pub(crate) started_at: DateTime<Utc>,
}

/// One node's part in a cluster (also of a cluster of one).
pub(crate) struct Cluster {
    records: Arc<Records>,
    queue: Arc<Queue>,
    attempts: Arc<Attempts>,
    lifecycle: Arc<Lifecycle>,
    node_id: String,
    address: String,
    started_at: DateTime<Utc>,
    lease: Duration,
    /// How often, on a shared store, the store is looked through for work
    /// the change feed did not bring and for leases that ran out.
    poll: Duration,
    /// Set when the change feed reports lost changes: the next look reads
    /// the whole store.
    feed_lost: AtomicBool,
}

impl Cluster {
    pub(crate) fn new(
        records: Arc<Records>,
        queue: Arc<Queue>,
        attempts: Arc<Attempts>,
        lifecycle: Arc<Lifecycle>,
        node_id: String,
        address: String,
        Timing {
            lease,
            poll,
            started_at,
        }: Timing,
    ) -> Cluster {
        Cluster {
            records,
            queue,
            attempts,
            lifecycle,
            node_id,
            address,
            started_at,
            lease,
            poll,
            feed_lost: AtomicBool::new(false),
        }
    }

    fn lease_from(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + chrono::Duration::from_std(self.lease).unwrap_or_default()
    }

    pub(crate) async fn heartbeat(&self) -> Result<()> {
        let node = Node {
            id: self.node_id.clone(),
            address: self.address.clone(),
            started_at: self.started_at,
            last_seen: Utc::now(),
        };
        Ok(self.records.store().nodes().heartbeat(&node).await?)
    }

    /// Every node that shares the store, and whether it is alive.
    pub(crate) async fn nodes(&self) -> Result<Vec<(Node, bool)>> {
        let lease = chrono::Duration::from_std(self.lease).unwrap_or_default();
        let now = Utc::now();
        Ok(self
            .records
            .store()
            .nodes()
            .nodes()
            .await?
            .into_iter()
            .map(|n| {
                let alive = n.alive(lease, now);
                (n, alive)
            })
            .collect())
    }

    /// Runs until `closed` (the engine has shut down completely, not just
    /// stopped dispatching): leases of steps finishing in the shutdown
    /// grace must keep being renewed, or another node would take them
    /// over. After `stopping`, it only renews.
    pub(crate) async fn run(
        self: Arc<Self>,
        stopping: CancellationToken,
        closed: CancellationToken,
    ) {
        let renew_every = (self.lease / 3).max(Duration::from_millis(100));
        let shared = self.records.store().nodes().shared();
        let tick = if shared {
            self.poll.min(renew_every)
        } else {
            renew_every
        };
        let mut last_renewal = tokio::time::Instant::now();
        let mut last_poll = tokio::time::Instant::now();
        let mut polls = 0u32;
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = closed.cancelled() => return,
            }
            if last_renewal.elapsed() >= renew_every {
                last_renewal = tokio::time::Instant::now();
                if let Err(e) = self.heartbeat().await {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
                self.renew_leases().await;
            } else if shared {
                self.watch_running().await;
            }
            if stopping.is_cancelled() || last_poll.elapsed() < self.poll {
                continue;
            }
            last_poll = tokio::time::Instant::now();
            // The first look, every tenth, and the first after the feed
            // lost changes look the whole store over.
            let whole = shared
                && (polls.is_multiple_of(ADVANCE_EVERY)
                    | self.feed_lost.swap(false, Ordering::SeqCst));
            polls += 1;
            if let Err(e) = self.look_for_work(shared, whole).await {
                tracing::warn!(error = %e, "looking for work failed");
            }
        }
    }

    /// Stops the steps of attempts this node no longer owns (their lease
    /// ran out and another node took them over) or whose cancel was
    /// requested through another node. Returns the tasks still owned.
    async fn watch_running(&self) -> Vec<Task> {
        let mut owned = Vec::new();
        for (id, tokens, attempt) in self.attempts.claimed_snapshot() {
            let Ok(Some(task)) = self.records.store().tasks().get_task(id).await else {
                continue;
            };
            if task.status != TaskStatus::Running
                || task.node.as_deref() != Some(&self.node_id)
                || task.attempts != attempt
            {
                tracing::warn!(task = %id, "another node took the task over; stopping its script here");
                tokens.stop_attempt();
            } else {
                if task.cancel_requested {
                    tokens.cancel_task();
                }
                owned.push(task);
            }
        }
        owned
    }

    /// Pushes the lease of every attempt this node still owns forward
    /// (and stops those it lost).
    async fn renew_leases(&self) {
        for mut task in self.watch_running().await {
            let id = task.id;
            for _ in 0..3 {
                let before = TaskMark::of(&task);
                task.lease_until = Some(self.lease_from(Utc::now()));
                match self.records.update_task(&task, before).await {
                    Ok(_) => break,
                    Err(e) if e.is_conflict() => {
                        match self.records.store().tasks().get_task(id).await {
                            Ok(Some(fresh))
                                if fresh.status == TaskStatus::Running
                                    && fresh.node == task.node =>
                            {
                                task = fresh
                            }
                            _ => break,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(task = %id, error = %e, "lease renewal failed");
                        break;
                    }
                }
            }
        }
    }

    /// Advances again the workflows whose follow-up failed here, and takes
    /// over running tasks whose lease ran out (their node stopped, or this
    /// node could not record their outcome). With `whole` (on a shared
    /// store now and then), it reads every unfinished task instead of the
    /// running ones: it also queues what other nodes accepted and the feed
    /// did not bring, and advances the workflows nothing moves. Reading
    /// only the running tasks keeps the frequent look cheap however long
    /// the queue: a store with 100,000 queued tasks is not read whole
    /// every second by every node.
    async fn look_for_work(&self, shared: bool, whole: bool) -> Result<()> {
        self.lifecycle.retry_stalled().await;
        let now = Utc::now();
        let store = self.records.store().tasks();
        let tasks = if whole {
            store.unfinished_tasks().await?
        } else {
            store
                .list_tasks(&orchestrator_storage::TaskQuery {
                    status: Some(TaskStatus::Running),
                    limit: usize::MAX,
                    ..Default::default()
                })
                .await?
                .items
        };
        // Workflows whose next decision comes from a task's end.
        let mut moving = HashSet::new();
        for task in tasks {
            if task.status != TaskStatus::Pending {
                moving.insert(task.workflow_id);
            }
            match task.status {
                TaskStatus::Running => {
                    let expired = task.lease_until.is_some_and(|until| until < now);
                    if expired && !self.attempts.contains(task.id) {
                        let error = format!(
                            "interrupted: node {} stopped renewing its lease during attempt {}",
                            task.node.as_deref().unwrap_or("?"),
                            task.attempts
                        );
                        self.lifecycle.take_over(task, error).await?;
                    }
                }
                TaskStatus::Queued | TaskStatus::RetryWaiting if shared => self.offer(&task),
                _ => {}
            }
        }
        if whole {
            self.lifecycle.advance_unfinished_workflows(&moving).await?;
        }
        Ok(())
    }

    /// On a shared store, the store's change feed, once it follows the
    /// store (or after `FEED_START_WAIT`): what is committed after this
    /// returns is heard. `None` on a store of one node, whose writes
    /// announce themselves.
    pub(crate) async fn listen(&self) -> Option<ChangeFeed> {
        let mut feed = self.records.store().nodes().changes()?;
        if tokio::time::timeout(FEED_START_WAIT, feed.following())
            .await
            .is_err()
        {
            tracing::warn!(
                "the change feed does not follow the store yet; events of other nodes may be missed until it does"
            );
        }
        Some(feed)
    }

    /// Announces every node's changes, as the feed reports them, as this
    /// node's events, and queues here the work another node accepted,
    /// until `closed`.
    pub(crate) async fn follow_changes(
        self: Arc<Self>,
        mut feed: ChangeFeed,
        bus: Arc<EventBus>,
        closed: CancellationToken,
    ) {
        let mut known = Known::default();
        loop {
            let change = tokio::select! {
                change = feed.recv() => change,
                () = closed.cancelled() => return,
            };
            let Some(change) = change else { return };
            match &change {
                // Claimed (or ended): nothing for a worker here. Should
                // this be an old change, heard after the task was queued
                // again, the next whole-store look (10 looks at the latest)
                // offers it again: a delay, never a loss.
                StoredChange::Task { task, .. }
                    if !matches!(task.status, TaskStatus::Queued | TaskStatus::RetryWaiting) =>
                {
                    self.queue.withdraw(task.id);
                }
                StoredChange::Task { task, .. } => self.offer(task),
                // Finished: what this node kept to follow it goes.
                StoredChange::Workflow { workflow, .. } if workflow.status.is_terminal() => {
                    self.lifecycle.forget_workflow(workflow.id);
                }
                // Its limit (or that it has none) is noted, so that a
                // worker here that pops one of its tasks need not read it.
                StoredChange::Workflow { workflow, .. } => self.queue.register_limit(workflow),
                // What the feed missed is found by reading the whole store
                // at the next look.
                StoredChange::Lost { .. } => self.feed_lost.store(true, Ordering::SeqCst),
                StoredChange::Log { .. } => {}
            }
            bus.publish(known.events_of(change));
        }
    }

    /// Queues a task that is ready on the shared store, wherever it was
    /// accepted: heard from the change feed, work that reaches one node
    /// spreads at once; found by a look, what the feed missed. Whichever
    /// node claims it first runs it; the claim is a compare-and-set, so the
    /// others' attempts only read and give up (or never pop it: the feed
    /// tells them of the claim, and they withdraw it). Its workflow's
    /// `parallel_limit` is looked up when it is popped, if the feed did not
    /// tell it first.
    fn offer(&self, task: &Task) {
        if matches!(task.status, TaskStatus::Queued | TaskStatus::RetryWaiting)
            && !self.queue.contains(task.id)
            && !self.attempts.contains(task.id)
        {
            // Each node waits a grace of its own, so that those that
            // reach for the task after its node did rarely do so together.
            let grace = FOREIGN_GRACE + FOREIGN_GRACE.mul_f64(rand::random::<f64>());
            self.queue.push_foreign(task, grace);
        }
    }
}

/// What this node last heard of each task and workflow, so that a change
/// can be told from what it was.
#[derive(Default)]
struct Known {
    tasks: Heard<TaskId, TaskMark>,
    /// Per workflow, its status and whether it was paused.
    workflows: Heard<WorkflowId, (WorkflowStatus, bool)>,
}

impl Known {
    fn events_of(&mut self, change: StoredChange) -> Vec<Change> {
        match change {
            StoredChange::Task { created, task } => {
                let heard = self.tasks.hear(
                    task.id,
                    created,
                    (TaskMark::of(&task), task.version),
                    task.status.is_terminal(),
                );
                heard.map_or_else(Vec::new, |before| task_changes(before, &task))
            }
            StoredChange::Workflow { created, workflow } => {
                let heard = self.workflows.hear(
                    workflow.id,
                    created,
                    ((workflow.status, workflow.paused), workflow.version),
                    workflow.status.is_terminal(),
                );
                let Some(before) = heard else {
                    return Vec::new();
                };
                let (status_before, paused_before) = match before {
                    Before::Created => (Before::Created, None),
                    Before::Known((status, paused)) => (Before::Known(status), Some(paused)),
                    Before::Unknown => (Before::Unknown, None),
                };
                workflow_change(status_before, &workflow)
                    .into_iter()
                    .chain(paused_before.and_then(|paused| pause_change(paused, &workflow)))
                    .collect()
            }
            StoredChange::Log { task, length } => {
                let status = self.tasks.open.get(&task).map(|(m, _)| m.status);
                vec![Change::log_appended(None, task, status, length)]
            }
            StoredChange::Lost { reason } => {
                tracing::warn!(%reason, "the change feed lost changes; subscribers must resync");
                self.tasks = Heard::default();
                self.workflows = Heard::default();
                vec![Change::resync(None)]
            }
        }
    }
}

/// How many finished records a node remembers, to tell a late notification
/// of one from news.
const FINISHED_KEPT: usize = 10_000;

/// What was heard of the records of one kind: each unfinished one's mark
/// and version, and the newest finished ones'. Live queries deliver in no
/// guaranteed order, so a notification of a version already heard (or
/// older) is stale and announces nothing. Bounded by the unfinished work
/// plus [`FINISHED_KEPT`].
struct Heard<K, M> {
    open: HashMap<K, (M, u64)>,
    finished: HashMap<K, (M, u64)>,
    /// Finished keys, oldest first, to forget the oldest beyond the bound.
    finished_order: VecDeque<K>,
}

impl<K, M> Default for Heard<K, M> {
    fn default() -> Self {
        Heard {
            open: HashMap::new(),
            finished: HashMap::new(),
            finished_order: VecDeque::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Copy, M: Copy> Heard<K, M> {
    /// What was known before this version of the record, remembering it;
    /// `None` if the notification is stale.
    fn hear(&mut self, key: K, created: bool, now: (M, u64), finished: bool) -> Option<Before<M>> {
        let last = self
            .open
            .get(&key)
            .or_else(|| self.finished.get(&key))
            .copied();
        if last.is_some_and(|(_, version)| now.1 <= version) {
            return None;
        }
        let before = match last {
            _ if created => Before::Created,
            Some((mark, _)) => Before::Known(mark),
            None => Before::Unknown,
        };
        if finished {
            self.open.remove(&key);
            if self.finished.insert(key, now).is_none() {
                self.finished_order.push_back(key);
            }
            while self.finished_order.len() > FINISHED_KEPT {
                if let Some(oldest) = self.finished_order.pop_front() {
                    self.finished.remove(&oldest);
                }
            }
        } else {
            self.finished.remove(&key);
            self.open.insert(key, now);
        }
        Some(before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_and_repeated_notifications_announce_nothing() {
        let mut heard: Heard<u32, &str> = Heard::default();
        assert_eq!(
            heard.hear(1, true, ("queued", 1), false),
            Some(Before::Created)
        );
        assert_eq!(
            heard.hear(1, false, ("running", 3), false),
            Some(Before::Known("queued"))
        );
        // Version 2 arrives after 3: stale.
        assert_eq!(heard.hear(1, false, ("claimed?", 2), false), None);
        assert_eq!(
            heard.hear(1, false, ("done", 4), true),
            Some(Before::Known("running"))
        );
        // The same finished version again, or an older one: nothing.
        assert_eq!(heard.hear(1, false, ("done", 4), true), None);
        assert_eq!(heard.hear(1, false, ("running", 3), false), None);
        // A newer version after the end (a retry) is news again.
        assert_eq!(
            heard.hear(1, false, ("pending", 5), false),
            Some(Before::Known("done"))
        );
        // Never heard of: unknown.
        assert_eq!(
            heard.hear(2, false, ("running", 7), false),
            Some(Before::Unknown)
        );
    }

    #[test]
    fn finished_records_are_remembered_within_a_bound() {
        let mut heard: Heard<usize, ()> = Heard::default();
        for key in 0..FINISHED_KEPT + 10 {
            heard.hear(key, true, ((), 1), true);
        }
        assert_eq!(heard.finished.len(), FINISHED_KEPT);
        assert_eq!(heard.finished_order.len(), FINISHED_KEPT);
        assert!(heard.open.is_empty());
    }
}
