//! What runs next on this node: the ready queue (priority, then FIFO;
//! retries and scheduled starts wait until due) and the per-workflow
//! `parallel_limit` slots. Memory only: after a crash it is rebuilt from
//! storage, so nothing here is needed to decide anything.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::{Priority, ReadyQueue, Task, TaskId, TaskStatus, Workflow, WorkflowId};
use tokio::sync::Notify;

use crate::lock;

/// The queue and the slots.
#[derive(Default)]
pub(crate) struct Queue {
    /// A std mutex: pushes and pops are short and never await.
    ready: Mutex<ReadyQueue>,
    /// Wakes the dispatcher when the queue gains a task.
    changed: Notify,
    /// What this node knows of workflows' `parallel_limit`s. A std mutex
    /// for the same reason as `ready`; never held together with it.
    limits: Mutex<Limits>,
    /// Paused workflows, with the tasks popped while paused, and the
    /// version of the record that last resumed each one. A std mutex for
    /// the same reason as `ready`; never held together with it.
    paused: Mutex<PauseState>,
    /// The record of a queued task as it was stored when it was queued
    /// here, so that the worker that pops it claims from it instead of
    /// reading it first (a round trip on a SurrealDB server). Only a
    /// guess: the claim is a compare-and-set on its version, and one that
    /// the store refuses sends the task back to be read (see
    /// `Dispatcher::still_ready`). At most `KNOWN_RECORDS`; past that,
    /// tasks are queued without one. A std mutex for the same reason as
    /// `ready`; never held together with another lock.
    known: Mutex<HashMap<TaskId, Task>>,
}

/// Queued tasks whose record is kept for their claim, at most.
const KNOWN_RECORDS: usize = 4096;

/// What this node knows of paused workflows.
#[derive(Default)]
struct PauseState {
    held: HashMap<WorkflowId, Paused>,
    /// The version of the record that last resumed each workflow here: a
    /// record read before it (still paused) must not pause it again.
    resumed: HashMap<WorkflowId, u64>,
}

/// A workflow paused here: its tasks wait aside until it is resumed.
#[derive(Debug, Default)]
struct Paused {
    /// The workflow record's version that paused it (`u64::MAX` while the
    /// pause is being stored): only a later record can resume it, so a
    /// record read before the pause never undoes it.
    version: u64,
    parked: Vec<(TaskId, Priority)>,
}

/// The workflows whose `parallel_limit` this node knows, until they
/// finish: a task of one may be claimed without reading its workflow.
#[derive(Default)]
struct Limits {
    /// Workflows with a `parallel_limit`, and how many of their tasks run
    /// here.
    slots: HashMap<WorkflowId, Slots>,
    /// Workflows known to have none.
    unlimited: HashSet<WorkflowId>,
    /// Workflows of one task, after whose attempt no step of theirs
    /// follows: a hint to a step kind that keeps what an attempt ran in
    /// for the workflow's next (a kept script sandbox).
    one_step: HashSet<WorkflowId>,
    /// The token that submitted each workflow that has one: attempts of
    /// one submitter's workflows may follow one another in a kept script
    /// sandbox.
    submitters: HashMap<WorkflowId, Arc<str>>,
}

/// Per-workflow concurrency for `parallel_limit`.
#[derive(Debug, Default)]
struct Slots {
    limit: usize,
    running: usize,
    /// Tasks popped while the workflow was at its limit, waiting for a slot.
    deferred: VecDeque<(TaskId, Priority)>,
}

impl Queue {
    /// Puts a queued or retry-waiting task in the queue, due at its retry
    /// time or scheduled start.
    pub(crate) fn push(&self, task: &Task) {
        self.keep_record(task);
        let due = due_time(task);
        {
            let mut ready = lock(&self.ready);
            match due {
                Some(due) if due > Utc::now() => ready.push_at(task.id, task.priority, due),
                _ => ready.push(task.id, task.priority),
            }
        }
        self.changed.notify_one();
    }

    /// Puts in the queue a task that another node accepted (or moved on),
    /// `grace` after it is due. Its own node takes it first when it can,
    /// and the change feed then withdraws it here; a task that waits
    /// longer joins this queue behind the work queued here by then, as
    /// the other node's copy is, so the nodes do not all reach for the
    /// same task at once (a claim that loses is a read and a refused
    /// write on the shared store).
    pub(crate) fn push_foreign(&self, task: &Task, grace: Duration) {
        self.keep_record(task);
        let now = Utc::now();
        let due = due_time(task).filter(|due| *due > now).unwrap_or(now)
            + chrono::Duration::from_std(grace).unwrap_or_default();
        lock(&self.ready).push_at(task.id, task.priority, due);
        self.changed.notify_one();
    }

    /// The next task that may run now, or how long until one may (an hour
    /// when nothing is waiting).
    pub(crate) fn pop(&self, now: DateTime<Utc>) -> Result<TaskId, Duration> {
        let mut ready = lock(&self.ready);
        if let Some(id) = ready.pop(now) {
            return Ok(id);
        }
        Err(ready
            .next_due()
            .map(|due| (due - now).to_std().unwrap_or_default())
            .unwrap_or(Duration::from_secs(3600)))
    }

    /// Resolves when a task was pushed since the last pop found none.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Takes out a task another node claimed, so that no worker here
    /// reads it only to find it running.
    pub(crate) fn withdraw(&self, id: TaskId) {
        lock(&self.ready).withdraw(id);
        lock(&self.known).remove(&id);
    }

    /// Keeps `task` as the record its claim starts from, if there is room.
    fn keep_record(&self, task: &Task) {
        let mut known = lock(&self.known);
        if known.len() < KNOWN_RECORDS || known.contains_key(&task.id) {
            known.insert(task.id, task.clone());
        }
    }

    /// The record kept for a popped task, if any (it is kept no longer).
    pub(crate) fn take_record(&self, id: TaskId) -> Option<Task> {
        lock(&self.known).remove(&id)
    }

    pub(crate) fn contains(&self, id: TaskId) -> bool {
        lock(&self.ready).contains(id)
    }

    /// Tasks queued here, cancelled ones included until they are popped.
    pub(crate) fn len(&self) -> usize {
        lock(&self.ready).len()
    }

    /// Tasks that may run now, by priority (lowest first), and those
    /// waiting for a due time.
    pub(crate) fn depth(&self) -> ([(Priority, usize); 4], usize) {
        let ready = lock(&self.ready);
        let now = ready.ready_by_priority();
        let n_now: usize = now.iter().map(|(_, n)| n).sum();
        (now, ready.len() - n_now)
    }

    /// Applies the workflow's `parallel_limit`, or notes that it has none;
    /// and whether it is paused.
    pub(crate) fn register_limit(&self, workflow: &Workflow) {
        if workflow.paused {
            let stale = lock(&self.paused)
                .resumed
                .get(&workflow.id)
                .is_some_and(|resumed| workflow.version <= *resumed);
            if !stale {
                self.pause(workflow.id, workflow.version);
            }
        } else {
            let resumed = lock(&self.paused)
                .held
                .get(&workflow.id)
                .is_some_and(|p| workflow.version > p.version);
            if resumed {
                self.resume(workflow.id, workflow.version);
            }
        }
        let mut limits = lock(&self.limits);
        match workflow.parallel_limit {
            Some(limit) => limits.slots.entry(workflow.id).or_default().limit = limit,
            None => {
                limits.unlimited.insert(workflow.id);
            }
        }
        if workflow.task_ids.len() > 1 {
            limits.one_step.remove(&workflow.id);
        } else {
            limits.one_step.insert(workflow.id);
        }
        if let Some(token) = &workflow.submitted_by
            && !limits.submitters.contains_key(&workflow.id)
        {
            limits
                .submitters
                .insert(workflow.id, Arc::from(token.as_str()));
        }
    }

    /// Whether the workflow is known here to have one task (a rollback or
    /// a re-run may still add some: a hint, not a rule).
    pub(crate) fn has_one_step(&self, workflow: WorkflowId) -> bool {
        lock(&self.limits).one_step.contains(&workflow)
    }

    /// The token that submitted the workflow, if one did.
    pub(crate) fn submitted_by(&self, workflow: WorkflowId) -> Option<Arc<str>> {
        lock(&self.limits).submitters.get(&workflow).cloned()
    }

    /// Whether the workflow's `parallel_limit`, or that it has none, is
    /// registered here.
    pub(crate) fn knows_limit(&self, workflow: WorkflowId) -> bool {
        let limits = lock(&self.limits);
        limits.slots.contains_key(&workflow) || limits.unlimited.contains(&workflow)
    }

    /// The workflow's `parallel_limit`, when it has one.
    pub(crate) fn limit_of(&self, workflow: WorkflowId) -> Option<usize> {
        lock(&self.limits)
            .slots
            .get(&workflow)
            .map(|slots| slots.limit)
    }

    /// Puts a queued task back, due after `delay`: a task that may not
    /// start yet for a reason another node will lift (its workflow is at
    /// its limit across nodes), and that no event here will wake.
    pub(crate) fn push_after(&self, task: &Task, delay: Duration) {
        self.retry_later(task.id, task.priority, delay);
    }

    /// Puts a task back by id, due after `delay`: one whose claim could not
    /// be stored (or whose record could not be read) and that would
    /// otherwise wait for a restart. Whoever pops it reads it again.
    pub(crate) fn retry_later(&self, id: TaskId, priority: Priority, delay: Duration) {
        // Whoever pops it reads it: a record kept from before may be old.
        lock(&self.known).remove(&id);
        let due = Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default();
        lock(&self.ready).push_at(id, priority, due);
        self.changed.notify_one();
    }

    /// Holds back the workflow's tasks from now on; `version` is that of
    /// the record that paused it (see [`Paused::version`]).
    pub(crate) fn pause(&self, workflow: WorkflowId, version: u64) {
        lock(&self.paused).held.entry(workflow).or_default().version = version;
    }

    /// Lets the workflow's tasks run again: those held back go back in
    /// the queue. `version` is that of the record that resumed it (or of
    /// the record as it was, when a pause could not be stored).
    pub(crate) fn resume(&self, workflow: WorkflowId, version: u64) {
        let held = {
            let mut paused = lock(&self.paused);
            paused.resumed.insert(workflow, version);
            paused.held.remove(&workflow)
        };
        let Some(paused) = held else {
            return;
        };
        {
            let mut ready = lock(&self.ready);
            for (id, priority) in paused.parked {
                ready.push(id, priority);
            }
        }
        self.changed.notify_one();
    }

    /// Whether the task's workflow is paused; if so the task is held
    /// back until it is resumed.
    pub(crate) fn park_if_paused(&self, task: &Task) -> bool {
        match lock(&self.paused).held.get_mut(&task.workflow_id) {
            Some(paused) => {
                paused.parked.push((task.id, task.priority));
                true
            }
            None => false,
        }
    }

    /// The workflow finished: its slots go.
    pub(crate) fn forget(&self, workflow: WorkflowId) {
        {
            let mut paused = lock(&self.paused);
            paused.held.remove(&workflow);
            paused.resumed.remove(&workflow);
        }
        let mut limits = lock(&self.limits);
        limits.slots.remove(&workflow);
        limits.unlimited.remove(&workflow);
        limits.one_step.remove(&workflow);
        limits.submitters.remove(&workflow);
    }

    /// Takes a slot of the task's workflow if it has a `parallel_limit`;
    /// otherwise parks the task until a slot frees up.
    pub(crate) fn take_slot(&self, task: &Task) -> bool {
        let mut limits = lock(&self.limits);
        let Some(slots) = limits.slots.get_mut(&task.workflow_id) else {
            return true;
        };
        if slots.running < slots.limit {
            slots.running += 1;
            true
        } else {
            slots.deferred.push_back((task.id, task.priority));
            false
        }
    }

    /// Gives a slot back; the first task parked for it is queued again.
    pub(crate) fn release_slot(&self, workflow: WorkflowId) {
        let next = {
            let mut limits = lock(&self.limits);
            let Some(slots) = limits.slots.get_mut(&workflow) else {
                return;
            };
            slots.running = slots.running.saturating_sub(1);
            slots.deferred.pop_front()
        };
        if let Some((id, priority)) = next {
            lock(&self.ready).push(id, priority);
            self.changed.notify_one();
        }
    }
}

/// When a queued or retry-waiting task may run: its retry time or its
/// scheduled start, if it has one.
fn due_time(task: &Task) -> Option<DateTime<Utc>> {
    match task.status {
        TaskStatus::RetryWaiting => task.retry_at,
        _ => task.not_before,
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use orchestrator_core::{TaskSpec, Workflow};

    use super::*;

    fn task_of(workflow: &Workflow) -> Task {
        let spec = TaskSpec {
            name: "t".into(),
            script: "s.sh".into(),
            input: serde_json::Value::Null,
            priority: Priority::Normal,
            max_attempts: 1,
            timeout: Duration::from_secs(5),
            check_mode: false,
            depends_on: Vec::new(),
            step: Default::default(),
        };
        Task::new(workflow.id, spec, Utc::now())
    }

    /// The record a task was queued with is there for the worker that
    /// pops it, once; a withdrawal, or a push back by id (whoever pops it
    /// then must read it), drops it, and past the bound none is kept.
    #[test]
    fn a_queued_task_s_record_is_kept_for_its_claim_until_it_may_be_old() {
        let queue = Queue::default();
        let workflow = Workflow::new("t", "t", Utc::now());
        let (kept, withdrawn, pushed_back) =
            (task_of(&workflow), task_of(&workflow), task_of(&workflow));
        for task in [&kept, &withdrawn, &pushed_back] {
            queue.push(task);
        }
        queue.withdraw(withdrawn.id);
        queue.push_after(&pushed_back, Duration::ZERO);
        assert_eq!(queue.take_record(kept.id).map(|t| t.id), Some(kept.id));
        assert!(queue.take_record(kept.id).is_none(), "taken once");
        assert!(queue.take_record(withdrawn.id).is_none());
        assert!(queue.take_record(pushed_back.id).is_none());

        let many: Vec<Task> = (0..=KNOWN_RECORDS).map(|_| task_of(&workflow)).collect();
        many.iter().for_each(|t| queue.push(t));
        assert!(queue.take_record(many[KNOWN_RECORDS - 1].id).is_some());
        assert!(
            queue.take_record(many[KNOWN_RECORDS].id).is_none(),
            "past the bound"
        );
    }

    /// Another node's task waits out the grace, then joins behind what was
    /// queued here meanwhile; its node's claim, heard in between,
    /// withdraws it before any worker here reads it.
    #[test]
    fn another_node_s_task_waits_out_the_grace_behind_this_node_s_own() {
        let queue = Queue::default();
        let workflow = Workflow::new("t", "t", Utc::now());
        let (foreign, own, claimed) = (task_of(&workflow), task_of(&workflow), task_of(&workflow));
        let grace = Duration::from_millis(50);
        queue.push_foreign(&foreign, grace);
        queue.push_foreign(&claimed, grace);
        let now = Utc::now();
        let wait = queue.pop(now).unwrap_err();
        assert!(wait > Duration::ZERO && wait <= grace, "{wait:?}");
        queue.push(&own);
        queue.withdraw(claimed.id);
        let later = now + chrono::Duration::milliseconds(100);
        assert_eq!(queue.pop(later), Ok(own.id));
        assert_eq!(queue.pop(later), Ok(foreign.id));
        assert!(queue.pop(later).is_err(), "the claimed one was withdrawn");

        // One due later (a retry) waits the grace after its own due time.
        let mut retry = task_of(&workflow);
        retry.status = TaskStatus::RetryWaiting;
        retry.retry_at = Some(later + chrono::Duration::seconds(10));
        queue.push_foreign(&retry, grace);
        let wait = queue.pop(later).unwrap_err();
        assert!(wait >= Duration::from_millis(10_050), "{wait:?}");
    }

    #[test]
    fn a_paused_workflow_s_tasks_wait_aside_and_only_newer_records_move_the_pause() {
        let queue = Queue::default();
        let mut workflow = Workflow::new("t", "t", Utc::now());
        workflow.version = 3;
        let task = task_of(&workflow);
        assert!(!queue.park_if_paused(&task));

        queue.pause(workflow.id, 4);
        assert!(queue.park_if_paused(&task));
        // A record read before the pause does not resume it.
        queue.register_limit(&workflow);
        assert_eq!(queue.pop(Utc::now()), Err(Duration::from_secs(3600)));

        // The resumed record lets the held task go.
        workflow.version = 5;
        queue.register_limit(&workflow);
        assert_eq!(queue.pop(Utc::now()), Ok(task.id));
        assert!(!queue.park_if_paused(&task));

        // A paused record older than the resume does not pause it again;
        // a newer one does.
        workflow.paused = true;
        workflow.version = 4;
        queue.register_limit(&workflow);
        assert!(!queue.park_if_paused(&task));
        workflow.version = 6;
        queue.register_limit(&workflow);
        assert!(queue.park_if_paused(&task));
        queue.forget(workflow.id);
        assert!(!queue.park_if_paused(&task));
    }
}
