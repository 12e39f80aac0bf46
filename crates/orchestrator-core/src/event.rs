//! Events: what a durable change of a task or workflow announces.
//!
//! The engine never invents an event: it compares a record as it was with
//! the record as storage now holds it ([`task_changes`], [`workflow_change`])
//! and announces the difference, after the write is durable. The same pure
//! functions turn another node's changes, as a shared store reports them,
//! into the same events, so every node tells one story.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::storage_move::MoveStatus;
use crate::{ScheduleId, Task, TaskId, TaskStatus, Workflow, WorkflowId, WorkflowStatus};

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A workflow, or one of its tasks, was stored for the first time.
    Submitted,
    /// A task became ready to run (released, or back from an interrupted attempt).
    Queued,
    /// A node stored the task as running: an attempt is claimed.
    Claimed,
    /// The claimed attempt's step began (its script was started). Not a
    /// stored change: only the node that runs the attempt announces it.
    Started,
    /// An attempt ended; `outcome` says how.
    AttemptEnded,
    /// A failed attempt will be followed by another at `retry_at`.
    RetryScheduled,
    Completed,
    Failed,
    Cancelled,
    /// A cancel was stored for a running task; its step is being stopped.
    CancelRequested,
    Skipped,
    NotStarted,
    /// A finished task was reset to run again (a workflow retry).
    Reset,
    /// A running attempt saved checkpoint entries.
    CheckpointSaved,
    WorkflowStatusChanged,
    /// A task's log grew; `log_length` is its new length in bytes.
    LogAppended,
    /// The subscriber missed `missed` events (it fell behind, or the feed
    /// from other nodes broke): re-read state instead of trusting deltas.
    Resync,
    /// A live storage migration moved on; `migration` holds its status.
    StorageMigration,
    /// An operator paused the workflow: no new step of it starts.
    WorkflowPaused,
    /// A paused workflow was resumed.
    WorkflowResumed,
    /// An approval gate opened: it waits for decisions.
    ApprovalRequested,
    /// An approval was counted; `digest` is what it signed.
    Approved,
    /// A gate was rejected; `reason` names who and why.
    Rejected,
    /// Approvals stopped counting because what they covered changed;
    /// `reason` says what. The gate waits again.
    ApprovalInvalidated,
    /// No decision came before the gate's deadline.
    ApprovalTimedOut,
    /// A workflow's task was granted a named lock; `lock` says which, with
    /// its fencing token.
    LockGranted,
    /// A workflow let go of a named lock (its last step that needed it
    /// ended, or its node life did), or left its line.
    LockReleased,
    /// A workflow's task waits for a named lock; `lock` says its place.
    LockWaiting,
    /// A test environment changed (its status, a node's, a check's):
    /// `environment_id` says which, `status` is its status now. Published
    /// by the test-environment service once the change is stored.
    EnvironmentChanged,
    /// A schedule was created, changed or deleted, or one of its due runs
    /// moved on (claimed, started, skipped, missed); `schedule_id` says
    /// which. Announced by the node that wrote it, after the write.
    ScheduleChanged,
}

crate::named_variants!(EventKind, "kind", [
    Submitted => "submitted",
    Queued => "queued",
    Claimed => "claimed",
    Started => "started",
    AttemptEnded => "attempt_ended",
    RetryScheduled => "retry_scheduled",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
    CancelRequested => "cancel_requested",
    Skipped => "skipped",
    NotStarted => "not_started",
    Reset => "reset",
    CheckpointSaved => "checkpoint_saved",
    WorkflowStatusChanged => "workflow_status_changed",
    LogAppended => "log_appended",
    Resync => "resync",
    StorageMigration => "storage_migration",
    WorkflowPaused => "workflow_paused",
    WorkflowResumed => "workflow_resumed",
    ApprovalRequested => "approval_requested",
    Approved => "approved",
    Rejected => "rejected",
    ApprovalInvalidated => "approval_invalidated",
    ApprovalTimedOut => "approval_timed_out",
    LockGranted => "lock_granted",
    LockReleased => "lock_released",
    LockWaiting => "lock_waiting",
    EnvironmentChanged => "environment_changed",
    ScheduleChanged => "schedule_changed",
]);

/// How an attempt ended, as [`EventKind::AttemptEnded`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    /// The service stopped during the attempt; it is not counted.
    Interrupted,
}

/// One announced change. `seq` orders the events of one node: it grows by
/// one per event that node publishes, from 1 at its start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    /// The node that published the event.
    pub node: String,
    pub time: DateTime<Utc>,
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<WorkflowId>,
    /// Absent for workflow-level events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<TaskId>,
    /// The task's new status, or the workflow's for workflow-level events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The attempt the event is about (claims, attempt ends, retries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AttemptOutcome>,
    /// When the next attempt is due (`retry_scheduled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<DateTime<Utc>>,
    /// The node that runs (or ran) the attempt, where it differs in meaning
    /// from the publisher: on a shared store any node announces any change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_length: Option<u64>,
    /// How many events a `resync` stands for, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missed: Option<u64>,
    /// A `storage_migration` event's migration, as it is now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<Box<MoveStatus>>,
    /// Approval events: why (a rejection's comment, what changed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Approval events: the digest decided on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// A `lock_*` event's lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<Box<LockChange>>,
    /// An `environment_changed` event's test environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    /// A `schedule_changed` event's schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_id: Option<ScheduleId>,
}

/// What a `lock_granted`, `lock_released` or `lock_waiting` event says of
/// its lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockChange {
    /// The resource's name.
    pub name: String,
    /// The fencing token granted or released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// A waiter's place in line (0: next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<usize>,
    /// Why it was released: `ended` (no step needs it any more),
    /// `finished` (the workflow ended), `expired` (its node life ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// An event before a node numbers and publishes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub kind: EventKind,
    pub workflow_id: Option<WorkflowId>,
    pub task_id: Option<TaskId>,
    pub status: Option<String>,
    pub attempt: Option<u32>,
    pub outcome: Option<AttemptOutcome>,
    pub retry_at: Option<DateTime<Utc>>,
    pub runner: Option<String>,
    pub log_length: Option<u64>,
    pub missed: Option<u64>,
    pub migration: Option<Box<MoveStatus>>,
    pub reason: Option<String>,
    pub digest: Option<String>,
    pub lock: Option<Box<LockChange>>,
    pub environment_id: Option<String>,
    pub schedule_id: Option<ScheduleId>,
}

impl Change {
    fn bare(kind: EventKind) -> Change {
        Change {
            kind,
            workflow_id: None,
            task_id: None,
            status: None,
            attempt: None,
            outcome: None,
            retry_at: None,
            runner: None,
            log_length: None,
            missed: None,
            migration: None,
            reason: None,
            digest: None,
            lock: None,
            environment_id: None,
            schedule_id: None,
        }
    }

    fn of_task(kind: EventKind, task: &Task) -> Change {
        Change {
            workflow_id: Some(task.workflow_id),
            task_id: Some(task.id),
            status: Some(task.status.as_str().to_owned()),
            ..Change::bare(kind)
        }
    }

    fn of_workflow(kind: EventKind, workflow: &Workflow) -> Change {
        Change {
            workflow_id: Some(workflow.id),
            status: Some(workflow.status.as_str().to_owned()),
            ..Change::bare(kind)
        }
    }

    /// The attempt has started on a node (a local, unstored event).
    pub fn started(task: &Task) -> Change {
        Change {
            attempt: Some(task.attempts),
            runner: task.node.clone(),
            ..Change::of_task(EventKind::Started, task)
        }
    }

    /// A task's log is now `length` bytes long.
    pub fn log_appended(
        workflow_id: Option<WorkflowId>,
        task_id: TaskId,
        status: Option<TaskStatus>,
        length: u64,
    ) -> Change {
        Change {
            workflow_id,
            task_id: Some(task_id),
            status: status.map(|s| s.as_str().to_owned()),
            log_length: Some(length),
            ..Change::bare(EventKind::LogAppended)
        }
    }

    /// Events were lost; `missed` of them, where known.
    pub fn resync(missed: Option<u64>) -> Change {
        Change {
            missed,
            ..Change::bare(EventKind::Resync)
        }
    }

    /// A live storage migration's status changed.
    pub fn storage_migration(status: MoveStatus) -> Change {
        Change {
            status: Some(status.phase.as_str().to_owned()),
            migration: Some(Box::new(status)),
            ..Change::bare(EventKind::StorageMigration)
        }
    }

    /// A schedule, or one of its due runs, changed.
    pub fn schedule_changed(schedule: ScheduleId) -> Change {
        Change {
            schedule_id: Some(schedule),
            ..Change::bare(EventKind::ScheduleChanged)
        }
    }

    /// A lock event of `workflow` (and the task that asked, where known).
    pub fn lock(
        kind: EventKind,
        workflow: WorkflowId,
        task: Option<TaskId>,
        lock: LockChange,
    ) -> Change {
        Change {
            workflow_id: Some(workflow),
            task_id: task,
            lock: Some(Box::new(lock)),
            ..Change::bare(kind)
        }
    }

    /// A test environment's change, once stored: `status` is its status now.
    pub fn environment_changed(environment_id: String, status: String) -> Change {
        Change {
            environment_id: Some(environment_id),
            status: Some(status),
            ..Change::bare(EventKind::EnvironmentChanged)
        }
    }

    /// Numbers the change as the node's event `seq`.
    pub fn into_event(self, seq: u64, node: &str, time: DateTime<Utc>) -> Event {
        Event {
            seq,
            node: node.to_owned(),
            time,
            kind: self.kind,
            workflow_id: self.workflow_id,
            task_id: self.task_id,
            status: self.status,
            attempt: self.attempt,
            outcome: self.outcome,
            retry_at: self.retry_at,
            runner: self.runner,
            log_length: self.log_length,
            missed: self.missed,
            migration: self.migration,
            reason: self.reason,
            digest: self.digest,
            lock: self.lock,
            environment_id: self.environment_id,
            schedule_id: self.schedule_id,
        }
    }
}

/// What an event diff needs to remember of a task: small, so that a node
/// can keep it for every unfinished task it hears about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskMark {
    pub status: TaskStatus,
    pub attempts: u32,
    pub cancel_requested: bool,
    pub reruns: u32,
    /// How many checkpoint entries were saved.
    pub checkpoint_entries: usize,
    /// An approval gate's progress: open, approvals counted, invalidations.
    pub gate: Option<(bool, usize, u32)>,
}

impl TaskMark {
    pub fn of(task: &Task) -> TaskMark {
        TaskMark {
            status: task.status,
            attempts: task.attempts,
            cancel_requested: task.cancel_requested,
            reruns: task.reruns,
            checkpoint_entries: task.checkpoint.len(),
            gate: task
                .approval
                .as_ref()
                .map(|g| (g.opened_at.is_some(), g.approvals.len(), g.invalidations)),
        }
    }
}

/// What we knew of a task (a [`TaskMark`]) or a workflow (its status)
/// before a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before<Mark = TaskMark> {
    /// The change created it.
    Created,
    /// It existed as this.
    Known(Mark),
    /// It existed, but this node never saw it (a change another node made
    /// before this node listened): announce where it is now.
    Unknown,
}

/// The events of one stored change of a task, in the order they happened.
/// A change that moves nothing a subscriber cares about (a lease renewal)
/// gives none.
pub fn task_changes(before: Before, after: &Task) -> Vec<Change> {
    use TaskStatus::*;
    let status_event = |kind| Change::of_task(kind, after);
    let before = match before {
        Before::Created => return vec![status_event(EventKind::Submitted)],
        Before::Unknown => {
            return vec![match after.status {
                Running => claimed(after),
                // An approval gate waiting: where it is now is a request.
                Pending if after.approval.as_ref().is_some_and(|g| g.is_waiting()) => {
                    status_event(EventKind::ApprovalRequested)
                }
                // Pending again without a create: a workflow retry.
                Pending => status_event(EventKind::Reset),
                RetryWaiting => retry_scheduled(after),
                status => status_event(kind_of_status(status)),
            }];
        }
        Before::Known(mark) => mark,
    };
    let mut changes = gate_changes(before.gate, before.status != after.status, after);
    if before.status != after.status {
        // An attempt ended: the task left `running`, or was reset after
        // an attempt that ran under another claim.
        if before.status == Running {
            changes.push(attempt_ended(after));
        }
        match after.status {
            Running => changes.push(claimed(after)),
            RetryWaiting => changes.push(retry_scheduled(after)),
            Pending if before.status.is_terminal() || after.reruns > before.reruns => {
                changes.push(status_event(EventKind::Reset))
            }
            status => changes.push(status_event(kind_of_status(status))),
        }
        return changes;
    }
    if after.cancel_requested && !before.cancel_requested {
        changes.push(status_event(EventKind::CancelRequested));
    }
    if after.checkpoint.len() != before.checkpoint_entries
        || (after.status == Running && after.attempts != before.attempts)
    {
        if after.attempts != before.attempts {
            // Ended and claimed again between two looks (a shared store
            // can fold both into one notification).
            changes.push(attempt_ended(after));
            changes.push(claimed(after));
        } else {
            changes.push(status_event(EventKind::CheckpointSaved));
        }
    }
    changes
}

/// The event of one stored change of a workflow, if it was created or its
/// status moved (or may have: nobody here knew it before).
pub fn workflow_change(before: Before<WorkflowStatus>, after: &Workflow) -> Option<Change> {
    match before {
        Before::Created => Some(Change::of_workflow(EventKind::Submitted, after)),
        Before::Known(status) if status == after.status => None,
        Before::Known(_) | Before::Unknown => {
            Some(Change::of_workflow(EventKind::WorkflowStatusChanged, after))
        }
    }
}

/// The event of a stored pause or resume of a workflow that was
/// `was_paused` when read, if it changed.
pub fn pause_change(was_paused: bool, after: &Workflow) -> Option<Change> {
    match (was_paused, after.paused) {
        (false, true) => Some(Change::of_workflow(EventKind::WorkflowPaused, after)),
        (true, false) => Some(Change::of_workflow(EventKind::WorkflowResumed, after)),
        _ => None,
    }
}

/// The approval events of a gate's change, before its status event.
fn gate_changes(before: Option<(bool, usize, u32)>, ended_now: bool, after: &Task) -> Vec<Change> {
    use crate::task::gate::GateEnd;
    let Some(gate) = &after.approval else {
        return Vec::new();
    };
    let (was_open, approvals_before, invalidations_before) = before.unwrap_or_default();
    let event = |kind, reason: Option<String>, digest: Option<String>| Change {
        reason,
        digest,
        ..Change::of_task(kind, after)
    };
    let mut changes = Vec::new();
    if gate.opened_at.is_some() && !was_open {
        changes.push(event(EventKind::ApprovalRequested, None, None));
    }
    if gate.invalidations > invalidations_before {
        changes.push(event(
            EventKind::ApprovalInvalidated,
            gate.invalidated_because.clone(),
            None,
        ));
    }
    let counted_before = if gate.invalidations > invalidations_before {
        0
    } else {
        approvals_before
    };
    for approval in gate.approvals.iter().skip(counted_before) {
        changes.push(event(
            EventKind::Approved,
            Some(format!("approved by {}", approval.by)),
            Some(approval.digest.clone()),
        ));
    }
    match gate.ended {
        Some(GateEnd::Rejected) if ended_now => {
            changes.push(event(
                EventKind::Rejected,
                after.error.clone(),
                gate.rejection.as_ref().map(|r| r.digest.clone()),
            ));
        }
        Some(GateEnd::TimedOut) if ended_now => {
            changes.push(event(
                EventKind::ApprovalTimedOut,
                after.error.clone(),
                None,
            ));
        }
        _ => {}
    }
    changes
}

fn kind_of_status(status: TaskStatus) -> EventKind {
    match status {
        TaskStatus::Pending => EventKind::Submitted,
        TaskStatus::Queued => EventKind::Queued,
        TaskStatus::Running => EventKind::Claimed,
        TaskStatus::RetryWaiting => EventKind::RetryScheduled,
        TaskStatus::Completed => EventKind::Completed,
        TaskStatus::Failed => EventKind::Failed,
        TaskStatus::Cancelled => EventKind::Cancelled,
        TaskStatus::Skipped => EventKind::Skipped,
        TaskStatus::NotStarted => EventKind::NotStarted,
    }
}

fn claimed(task: &Task) -> Change {
    Change {
        attempt: Some(task.attempts),
        runner: task.node.clone(),
        ..Change::of_task(EventKind::Claimed, task)
    }
}

fn retry_scheduled(task: &Task) -> Change {
    Change {
        attempt: Some(task.attempts + 1),
        retry_at: task.retry_at,
        ..Change::of_task(EventKind::RetryScheduled, task)
    }
}

/// How the last attempt ended, from the record the ending transition
/// appended to the task's history.
fn attempt_ended(task: &Task) -> Change {
    let last = task.history.last();
    let outcome = match last.map(|r| (r.outcome, r.error.as_deref())) {
        Some((TaskStatus::Completed, _)) => AttemptOutcome::Succeeded,
        Some((TaskStatus::Cancelled, _)) => AttemptOutcome::Cancelled,
        // Back in the queue without counting: the service stopped.
        Some((TaskStatus::Queued, _)) | None => AttemptOutcome::Interrupted,
        // The executor's words for a timeout (`orchestrator-executor`).
        Some((_, Some(error))) if error.starts_with("timed out") => AttemptOutcome::TimedOut,
        Some(_) => AttemptOutcome::Failed,
    };
    Change {
        attempt: Some(last.map_or(task.attempts, |r| r.attempt)),
        outcome: Some(outcome),
        runner: last
            .and_then(|r| r.node.clone())
            .or_else(|| task.node.clone()),
        ..Change::of_task(EventKind::AttemptEnded, task)
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use serde_json::json;

    use super::*;
    use crate::RetryPolicy;
    use crate::task::test_support::task_of;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()
    }

    #[test]
    fn a_pause_and_a_resume_are_events_and_a_repeat_is_none() {
        let mut workflow = Workflow::new("t", "t", now());
        assert_eq!(pause_change(false, &workflow), None);
        workflow.pause(now()).unwrap();
        let paused = pause_change(false, &workflow).unwrap();
        assert_eq!(paused.kind, EventKind::WorkflowPaused);
        assert_eq!(paused.workflow_id, Some(workflow.id));
        assert_eq!(pause_change(true, &workflow), None);
        workflow.resume(now());
        assert_eq!(
            pause_change(true, &workflow).map(|c| c.kind),
            Some(EventKind::WorkflowResumed)
        );
    }

    fn task(max_attempts: u32) -> Task {
        let mut task = task_of(WorkflowId::new(), None, vec![]);
        task.max_attempts = max_attempts;
        task
    }

    fn kinds(changes: &[Change]) -> Vec<EventKind> {
        changes.iter().map(|c| c.kind).collect()
    }

    #[test]
    fn a_gate_announces_its_request_approvals_invalidation_and_end() {
        use std::collections::BTreeMap;
        use std::time::Duration;

        use crate::task::gate::{Choice, Coverage, Gate, OnTimeout, Verdict};
        let mut gate = task(1);
        gate.status = TaskStatus::Pending;
        gate.approval = Some(Box::new(Gate::new(None)));
        let approve = |by: &str, coverage: &Coverage| Verdict {
            choice: Choice::Approve,
            by: by.into(),
            at: now(),
            digest: coverage.digest(),
            comment: None,
        };
        let first = Coverage::default();
        let second = Coverage {
            scripts: BTreeMap::from([("apply.sh".into(), "x".into())]),
            ..Coverage::default()
        };
        assert_eq!(
            step(&mut gate, |t| t.open_gate(Duration::from_secs(5), now())),
            [EventKind::ApprovalRequested]
        );
        assert_eq!(
            step(&mut gate, |t| {
                t.decide_gate(approve("a", &first), &first, 2, now())
                    .unwrap();
            }),
            [EventKind::Approved]
        );
        let before = TaskMark::of(&gate);
        gate.decide_gate(approve("b", &second), &second, 2, now())
            .unwrap();
        let changes = task_changes(Before::Known(before), &gate);
        assert_eq!(
            kinds(&changes),
            [EventKind::ApprovalInvalidated, EventKind::Approved]
        );
        assert_eq!(changes[0].reason.as_deref(), Some("script apply.sh is new"));
        assert_eq!(
            step(&mut gate, |t| t
                .time_out_gate(OnTimeout::Reject, now())
                .unwrap()),
            [EventKind::ApprovalTimedOut, EventKind::Cancelled]
        );
    }

    /// Applies a transition and returns the events it announces.
    fn step(task: &mut Task, change: impl FnOnce(&mut Task)) -> Vec<EventKind> {
        let before = TaskMark::of(task);
        change(task);
        kinds(&task_changes(Before::Known(before), task))
    }

    #[test]
    fn a_task_that_fails_once_then_succeeds_tells_each_move() {
        let mut task = task(2);
        assert_eq!(
            kinds(&task_changes(Before::Created, &task)),
            [EventKind::Submitted]
        );
        let policy = RetryPolicy::default();
        assert_eq!(
            step(&mut task, |t| t.start(now()).unwrap()),
            [EventKind::Claimed]
        );
        assert_eq!(
            step(&mut task, |t| {
                t.fail("exit 1".into(), Some(1), &policy, 0.5, now())
                    .unwrap();
            }),
            [EventKind::AttemptEnded, EventKind::RetryScheduled]
        );
        let ended = task_changes(
            Before::Known(TaskMark {
                status: TaskStatus::Running,
                ..TaskMark::of(&task)
            }),
            &task,
        );
        assert_eq!(ended[0].outcome, Some(AttemptOutcome::Failed));
        assert_eq!(ended[1].attempt, Some(2));
        assert_eq!(
            step(&mut task, |t| t.start(now()).unwrap()),
            [EventKind::Claimed]
        );
        assert_eq!(
            step(&mut task, |t| t
                .complete(json!({"ok": true}), now())
                .unwrap()),
            [EventKind::AttemptEnded, EventKind::Completed]
        );
    }

    #[test]
    fn cancels_checkpoints_and_renewals() {
        let mut task = task(1);
        step(&mut task, |t| t.start(now()).unwrap());
        let mut entries = serde_json::Map::new();
        entries.insert("job".into(), json!(7));
        assert_eq!(
            step(&mut task, |t| t.save_checkpoint(entries, now()).unwrap()),
            [EventKind::CheckpointSaved]
        );
        assert_eq!(
            step(&mut task, |t| t.lease_until = Some(now())),
            [] as [EventKind; 0],
            "a lease renewal is no event"
        );
        assert_eq!(
            step(&mut task, |t| {
                t.request_cancel(now()).unwrap();
            }),
            [EventKind::CancelRequested]
        );
        let before = TaskMark::of(&task);
        task.finish_cancel(now()).unwrap();
        let changes = task_changes(Before::Known(before), &task);
        assert_eq!(
            kinds(&changes),
            [EventKind::AttemptEnded, EventKind::Cancelled]
        );
        assert_eq!(changes[0].outcome, Some(AttemptOutcome::Cancelled));
    }

    #[test]
    fn an_interrupted_attempt_goes_back_to_the_queue() {
        let mut task = task(3);
        step(&mut task, |t| t.start(now()).unwrap());
        let before = TaskMark::of(&task);
        task.interrupt("shutting down".into(), now()).unwrap();
        let changes = task_changes(Before::Known(before), &task);
        assert_eq!(
            kinds(&changes),
            [EventKind::AttemptEnded, EventKind::Queued]
        );
        assert_eq!(changes[0].outcome, Some(AttemptOutcome::Interrupted));
    }

    #[test]
    fn skips_and_unknown_pasts() {
        let mut task = task(1);
        task.status = TaskStatus::Pending;
        assert_eq!(
            step(&mut task, |t| t.skip("dep failed".into(), now()).unwrap()),
            [EventKind::Skipped]
        );
        let mut running = self::task(1);
        running.start(now()).unwrap();
        running.node = Some("n2".into());
        let changes = task_changes(Before::Unknown, &running);
        assert_eq!(kinds(&changes), [EventKind::Claimed]);
        assert_eq!(changes[0].runner.as_deref(), Some("n2"));
    }

    #[test]
    fn workflow_status_moves_are_events_and_nothing_else_is() {
        let mut workflow = Workflow::new("tpl", "wf", now());
        assert_eq!(
            workflow_change(Before::Created, &workflow).map(|c| c.kind),
            Some(EventKind::Submitted)
        );
        let before = workflow.status;
        workflow.updated_at = now();
        assert_eq!(workflow_change(Before::Known(before), &workflow), None);
        workflow.status = WorkflowStatus::Running;
        let change = workflow_change(Before::Known(before), &workflow).unwrap();
        assert_eq!(change.kind, EventKind::WorkflowStatusChanged);
        assert_eq!(change.status.as_deref(), Some("running"));
        assert_eq!(change.task_id, None);
    }

    #[test]
    fn events_serialize_flat_with_snake_case_kinds() {
        let event = Change::resync(Some(3)).into_event(9, "n1", now());
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "resync");
        assert_eq!(json["seq"], 9);
        assert_eq!(json["missed"], 3);
        assert!(json.get("task_id").is_none());
        assert_eq!(
            "attempt_ended".parse::<EventKind>(),
            Ok(EventKind::AttemptEnded)
        );
    }

    #[test]
    fn an_environment_change_names_the_environment_and_its_status() {
        let event = Change::environment_changed("0190-env".into(), "ready".into()).into_event(
            4,
            "n1",
            now(),
        );
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "environment_changed");
        assert_eq!(json["environment_id"], "0190-env");
        assert_eq!(json["status"], "ready");
        assert!(json.get("workflow_id").is_none());
        assert_eq!(
            "environment_changed".parse::<EventKind>(),
            Ok(EventKind::EnvironmentChanged)
        );
    }
}
