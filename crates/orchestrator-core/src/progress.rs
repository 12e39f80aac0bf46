//! What a workflow's next round needs to look at, so that the cost of a
//! finished step does not grow with the size of its workflow (issue 18).
//!
//! `decide` looks at every task, which made a workflow of n steps cost
//! O(n²). After a step ends, only two things can have changed: its
//! dependents may be released or skipped, and the workflow may have
//! finished. [`Progress`] answers both without the whole workflow: a
//! dependents index (which tasks depend on which, fixed at submission);
//! per task, how many of its leading dependencies are known to be done, so
//! that a step joining many others does not read them all again each time
//! one of them ends; and a cursor over the tasks in stored order before
//! which every task is known to have ended.
//!
//! Nothing here is trusted beyond what the store says. The index is
//! derived from the stored tasks and belongs to one version of the
//! workflow record: every change that adds tasks or can bring an ended
//! task back (a rollback, a retry) or that changes the decisions
//! themselves (a halt, a cancel) bumps that version, and a `Progress` of
//! another version is rebuilt. The cursor only moves past tasks that were
//! read from the store as ended, so on a store shared by several nodes it
//! may lag, never run ahead: a task this node did not see end is simply
//! read again.

use std::borrow::Borrow;
use std::collections::HashMap;

use crate::workflow::{halts, is_rollback};
use crate::{Task, TaskId, TaskStatus, Workflow, WorkflowStatus};

/// The dependents index and the ended-prefix cursor of one version of a
/// workflow.
#[derive(Debug, Clone)]
pub struct Progress {
    /// The workflow record's version this was derived from.
    version: u64,
    /// The tasks in stored (topological) order.
    order: Vec<TaskId>,
    /// Each task's position in `order`.
    position: HashMap<TaskId, u32>,
    /// Per position, the positions of the tasks that depend on it, in
    /// stored order.
    dependents: Vec<Vec<u32>>,
    /// Per position, how many of the task's leading dependencies were
    /// read as done (see [`done_for`]).
    deps_done: Vec<u32>,
    /// Every task before this position was read as ended.
    ended_before: usize,
}

impl Progress {
    /// The index of `workflow` as stored with `tasks` (all of its tasks).
    pub fn new<T: Borrow<Task>>(workflow: &Workflow, tasks: &[T]) -> Progress {
        let order: Vec<TaskId> = tasks.iter().map(|t| t.borrow().id).collect();
        let position: HashMap<TaskId, u32> = order
            .iter()
            .enumerate()
            .map(|(i, id)| (*id, i as u32))
            .collect();
        let mut dependents = vec![Vec::new(); order.len()];
        for (i, task) in tasks.iter().enumerate() {
            for dep in &task.borrow().depends_on {
                if let Some(&d) = position.get(dep) {
                    dependents[d as usize].push(i as u32);
                }
            }
        }
        Progress {
            version: workflow.version,
            deps_done: vec![0; order.len()],
            order,
            position,
            dependents,
            ended_before: 0,
        }
    }

    /// Whether this index describes `workflow` as it is stored now.
    pub fn is_of(&self, workflow: &Workflow) -> bool {
        self.version == workflow.version && self.order.len() == workflow.task_ids.len()
    }

    /// The tasks that depend on any of `ended`, each once, in stored order:
    /// the only tasks whose decision can have changed. Each says whether
    /// one of the ended tasks it depends on is unsatisfied, which decides
    /// about it at once (a skip) without waiting for its other
    /// dependencies.
    pub fn dependents_of<T: Borrow<Task>>(&self, ended: &[T]) -> Vec<Candidate> {
        let mut positions: Vec<(u32, bool)> = ended
            .iter()
            .map(Borrow::borrow)
            .filter_map(|t| Some((self.position.get(&t.id)?, !satisfies(t))))
            .flat_map(|(&p, unsatisfied)| {
                self.dependents[p as usize]
                    .iter()
                    .map(move |&d| (d, unsatisfied))
            })
            .collect();
        // Per task, "unsatisfied" sorts after "satisfied": keep the last.
        positions.sort_unstable();
        let mut out: Vec<Candidate> = Vec::with_capacity(positions.len());
        for (p, unsatisfied) in positions {
            let id = self.order[p as usize];
            match out.last_mut() {
                Some(last) if last.id == id => last.after_unsatisfied |= unsatisfied,
                _ => out.push(Candidate {
                    id,
                    after_unsatisfied: unsatisfied,
                }),
            }
        }
        out
    }

    /// The next step towards a decision about `candidate` (read as it is
    /// stored now, pending), given the dependencies read so far (`known`).
    /// Moves the task's count of leading done dependencies on as far as
    /// `known` allows.
    ///
    /// Waiting on the first dependency that is not done is enough: a task
    /// is released only once every dependency is done, and it is skipped
    /// when a dependency ends unsatisfied, which is decided when that
    /// dependency ends (`after_unsatisfied`).
    pub fn scan<'a>(
        &mut self,
        candidate: &Task,
        after_unsatisfied: bool,
        known: impl Fn(TaskId) -> Option<&'a Task>,
    ) -> Scan {
        let regardless = runs_regardless(candidate);
        if after_unsatisfied && !regardless {
            return Scan::Decide;
        }
        let Some(&p) = self.position.get(&candidate.id) else {
            return Scan::Decide;
        };
        let done = &mut self.deps_done[p as usize];
        while let Some(dep_id) = candidate.depends_on.get(*done as usize) {
            let Some(dep) = known(*dep_id) else {
                return Scan::Read(*dep_id);
            };
            if done_for(candidate, dep) {
                *done += 1;
            } else if dep.status.is_terminal() {
                return Scan::Decide;
            } else {
                return Scan::Wait;
            }
        }
        Scan::Decide
    }

    /// The first task not yet known to have ended, if any: while it has
    /// not ended, the workflow has not finished. `None` means every task
    /// was read as ended.
    pub fn first_unended(&self) -> Option<TaskId> {
        self.order.get(self.ended_before).copied()
    }

    /// `first_unended()` was read from the store and has ended: move past
    /// it. Anything else is ignored, so that the cursor only covers tasks
    /// actually read.
    pub fn read_as_ended(&mut self, task: &Task) {
        if self.first_unended() == Some(task.id) && task.status.is_terminal() {
            self.ended_before += 1;
        }
    }
}

/// A task to look at after some of its dependencies ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub id: TaskId,
    /// One of the dependencies that ended did not succeed (and is not
    /// optional).
    pub after_unsatisfied: bool,
}

/// What [`Progress::scan`] needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// Read this dependency from the store, then scan again.
    Read(TaskId),
    /// Nothing to decide yet: a dependency has not ended.
    Wait,
    /// Read every dependency and ask `decide_task`.
    Decide,
}

/// Whether an ended dependency lets its dependents run (it succeeded, or
/// it was optional).
fn satisfies(dep: &Task) -> bool {
    dep.status == TaskStatus::Completed || (dep.status == TaskStatus::Failed && dep.step.optional)
}

/// Rollback and always_run steps wait for their dependencies to end,
/// however they end; the others need them to succeed.
fn runs_regardless(task: &Task) -> bool {
    task.step.always_run || is_rollback(task)
}

/// Whether `dep` is done as far as `task` is concerned.
fn done_for(task: &Task, dep: &Task) -> bool {
    if runs_regardless(task) {
        dep.status.is_terminal()
    } else {
        satisfies(dep)
    }
}

/// Whether the tasks that just ended can be followed up by looking at
/// their dependents only. Otherwise a full `decide` over every task is
/// needed: the workflow stopped or rolls back (every waiting task is
/// abandoned, undo steps are planned), or one of them halts it.
pub fn follows_incrementally<T: Borrow<Task>>(workflow: &Workflow, ended: &[T]) -> bool {
    matches!(
        workflow.status,
        WorkflowStatus::Scheduled | WorkflowStatus::Queued | WorkflowStatus::Running
    ) && workflow.halt.is_none()
        && !workflow.cancel_requested
        && !ended.iter().any(|t| halts(workflow, t.borrow()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use chrono::Utc;
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;
    use crate::task::test_support::task_of;
    use crate::{Decision, FailurePolicy, RetryPolicy, WorkflowId, decide, decide_task};

    /// How a simulated step ends when it runs.
    #[derive(Debug, Clone, Copy)]
    enum End {
        Complete,
        Fail,
        FailOptional,
    }

    fn end_strategy() -> impl Strategy<Value = End> {
        prop_oneof![
            6 => Just(End::Complete),
            1 => Just(End::Fail),
            1 => Just(End::FailOptional),
        ]
    }

    /// A random DAG: task `i` depends on up to 3 earlier tasks.
    fn dag() -> impl Strategy<Value = Vec<(Vec<usize>, End)>> {
        (1usize..40).prop_flat_map(|n| {
            (0..n)
                .map(|i| {
                    (
                        proptest::collection::vec(0..i.max(1), 0..=3.min(i)),
                        end_strategy(),
                    )
                })
                .collect::<Vec<_>>()
        })
    }

    fn policy() -> impl Strategy<Value = FailurePolicy> {
        prop_oneof![
            2 => Just(FailurePolicy::Continue),
            1 => Just(FailurePolicy::Fail),
            1 => Just(FailurePolicy::Rollback),
        ]
    }

    /// A simulated workflow: tasks in stored order, by id.
    struct Sim {
        workflow: Workflow,
        tasks: Vec<Task>,
        ends: HashMap<TaskId, End>,
    }

    impl Sim {
        fn new(shape: &[(Vec<usize>, End)], policy: FailurePolicy) -> Sim {
            let mut workflow = Workflow::new("t", "t", Utc::now());
            workflow.on_failure = policy;
            let mut tasks: Vec<Task> = Vec::new();
            let mut ends = HashMap::new();
            for (i, (deps, end)) in shape.iter().enumerate() {
                let mut deps: Vec<TaskId> = deps
                    .iter()
                    .filter(|&&d| d < i)
                    .map(|&d| tasks[d].id)
                    .collect();
                deps.dedup();
                let mut task = task_of(workflow.id, Some(&format!("s{i}")), deps);
                task.step.optional = matches!(end, End::FailOptional);
                task.step.always_run = i % 7 == 3;
                ends.insert(task.id, *end);
                tasks.push(task);
            }
            workflow.task_ids = tasks.iter().map(|t| t.id).collect();
            Sim {
                workflow,
                tasks,
                ends,
            }
        }

        fn get(&self, id: TaskId) -> Option<&Task> {
            self.tasks.iter().find(|t| t.id == id)
        }

        fn get_mut(&mut self, id: TaskId) -> &mut Task {
            self.tasks.iter_mut().find(|t| t.id == id).unwrap()
        }

        /// Applies a decision as the engine does; returns the task it ended,
        /// if it ended one. A workflow change bumps its version.
        fn apply(&mut self, decision: Decision) -> Option<TaskId> {
            let now = Utc::now();
            match decision {
                Decision::Release(id) => {
                    self.get_mut(id).release(now).unwrap();
                    None
                }
                Decision::Skip(id, reason) => {
                    self.get_mut(id).skip(reason, now).unwrap();
                    Some(id)
                }
                Decision::Abandon(id, reason) => {
                    self.get_mut(id).abandon(reason, now).unwrap();
                    Some(id)
                }
                Decision::Halt(halt) => {
                    self.workflow.halt = Some(halt);
                    self.workflow.version += 1;
                    None
                }
                Decision::Rollback(_) => {
                    // Undo steps are out of scope here: mark it started.
                    if let Some(h) = self.workflow.halt.as_mut() {
                        h.rollback_started = true;
                    }
                    self.workflow.version += 1;
                    None
                }
                Decision::Finish(status) => {
                    self.workflow.status = status;
                    self.workflow.version += 1;
                    None
                }
            }
        }

        /// The full recompute: `decide` until it has nothing more to say.
        fn settle_fully(&mut self) {
            loop {
                let decisions = decide(&self.workflow, &self.tasks);
                if decisions.is_empty() {
                    return;
                }
                for d in decisions {
                    self.apply(d);
                }
            }
        }

        /// The engine's incremental round after `ended` ended, with the
        /// full recompute where `follows_incrementally` says so.
        fn settle_incrementally(&mut self, progress: &mut Option<Progress>, ended: TaskId) {
            if progress.as_ref().is_none_or(|p| !p.is_of(&self.workflow)) {
                *progress = Some(Progress::new(&self.workflow, &self.tasks));
                self.settle_fully();
                return;
            }
            let mut ended = vec![ended];
            while !ended.is_empty() {
                let ended_tasks: Vec<&Task> = ended.iter().filter_map(|id| self.get(*id)).collect();
                if !follows_incrementally(&self.workflow, &ended_tasks) {
                    self.settle_fully();
                    return;
                }
                let p = progress.as_mut().unwrap();
                let mut decisions = Vec::new();
                for candidate in p.dependents_of(&ended_tasks) {
                    let task = self.get(candidate.id).unwrap();
                    if task.status != TaskStatus::Pending {
                        continue;
                    }
                    // The store holds everything here: a read always
                    // finds the task, so scanning again moves on.
                    let mut reads = 0;
                    loop {
                        match p.scan(task, candidate.after_unsatisfied, |id| {
                            (reads > 0).then(|| self.get(id)).flatten()
                        }) {
                            Scan::Read(_) => reads += 1,
                            Scan::Wait => break,
                            Scan::Decide => {
                                decisions
                                    .extend(decide_task(&self.workflow, task, |id| self.get(id)));
                                break;
                            }
                        }
                    }
                }
                ended = decisions
                    .into_iter()
                    .filter_map(|d| self.apply(d))
                    .collect();
            }
            let p = progress.as_mut().unwrap();
            while let Some(id) = p.first_unended() {
                let task = self.tasks.iter().find(|t| t.id == id).unwrap();
                if !task.status.is_terminal() {
                    return;
                }
                p.read_as_ended(task);
            }
            self.settle_fully();
        }

        /// Runs the queued task at `pick` (mod the number queued) to its end.
        fn run_one(&mut self, pick: usize) -> Option<TaskId> {
            let queued: Vec<TaskId> = self
                .tasks
                .iter()
                .filter(|t| t.status == TaskStatus::Queued)
                .map(|t| t.id)
                .collect();
            let id = *queued.get(pick % queued.len().max(1))?;
            let end = self.ends[&id];
            let now = Utc::now();
            let task = self.get_mut(id);
            task.start(now).unwrap();
            match end {
                End::Complete => task.complete(Value::Null, now).unwrap(),
                End::Fail | End::FailOptional => {
                    task.fail("x".into(), Some(1), &RetryPolicy::default(), 0.0, now)
                        .unwrap();
                }
            }
            Some(id)
        }

        fn statuses(&self) -> Vec<TaskStatus> {
            self.tasks.iter().map(|t| t.status).collect()
        }
    }

    proptest! {
        /// Run the same workflow twice, ending the same tasks in the same
        /// order: once deciding over every task after each step, once
        /// incrementally. After every step both must agree on every task
        /// and on the workflow.
        #[test]
        fn incremental_rounds_decide_as_the_full_recompute(
            shape in dag(),
            policy in policy(),
            picks in proptest::collection::vec(0usize..1000, 80),
        ) {
            let mut full = Sim::new(&shape, policy);
            let mut incremental = Sim::new(&shape, policy);
            // Same ids in both, so that orders and reasons compare equal.
            incremental.workflow = full.workflow.clone();
            incremental.tasks = full.tasks.clone();
            incremental.ends = full.ends.clone();
            full.settle_fully();
            incremental.settle_fully();
            let mut progress = None;
            for pick in picks {
                let (Some(a), Some(b)) = (full.run_one(pick), incremental.run_one(pick)) else {
                    break;
                };
                prop_assert_eq!(a, b);
                full.settle_fully();
                incremental.settle_incrementally(&mut progress, b);
                prop_assert_eq!(full.statuses(), incremental.statuses());
                prop_assert_eq!(&full.workflow, &incremental.workflow);
            }
            // Nothing queued is left only when the workflow has finished.
            if !full.tasks.iter().any(|t| t.status == TaskStatus::Queued) {
                prop_assert!(incremental.workflow.status.is_terminal());
            }
        }
    }

    #[test]
    fn dependents_come_once_each_in_stored_order() {
        let w = WorkflowId::new();
        let a = task_of(w, Some("a"), vec![]);
        let b = task_of(w, Some("b"), vec![]);
        let c = task_of(w, Some("c"), vec![b.id, a.id]);
        let d = task_of(w, Some("d"), vec![a.id]);
        let mut workflow = Workflow::new("t", "t", Utc::now());
        let tasks = vec![a.clone(), b.clone(), c.clone(), d.clone()];
        workflow.task_ids = tasks.iter().map(|t| t.id).collect();
        let progress = Progress::new(&workflow, &tasks);
        let mut failed_a = a.clone();
        failed_a.status = TaskStatus::Failed;
        let ids = |c: Vec<Candidate>| -> Vec<(TaskId, bool)> {
            c.into_iter().map(|c| (c.id, c.after_unsatisfied)).collect()
        };
        assert_eq!(
            ids(progress.dependents_of(&[&b, &failed_a])),
            vec![(c.id, true), (d.id, true)]
        );
        let mut completed_b = b.clone();
        completed_b.status = TaskStatus::Completed;
        assert_eq!(
            ids(progress.dependents_of(&[&completed_b])),
            vec![(c.id, false)]
        );
        assert_eq!(ids(progress.dependents_of(&[&d])), vec![]);
    }

    #[test]
    fn the_cursor_moves_only_past_tasks_read_as_ended() {
        let w = WorkflowId::new();
        let mut a = task_of(w, Some("a"), vec![]);
        let mut b = task_of(w, Some("b"), vec![]);
        a.status = TaskStatus::Running;
        let mut workflow = Workflow::new("t", "t", Utc::now());
        let tasks = vec![a.clone(), b.clone()];
        workflow.task_ids = tasks.iter().map(|t| t.id).collect();
        let mut progress = Progress::new(&workflow, &tasks);
        assert_eq!(progress.first_unended(), Some(a.id));
        // b ended, but the cursor is at a: nothing moves.
        b.status = TaskStatus::Skipped;
        progress.read_as_ended(&b);
        assert_eq!(progress.first_unended(), Some(a.id));
        // a read as still running: nothing moves.
        progress.read_as_ended(&a);
        assert_eq!(progress.first_unended(), Some(a.id));
        a.status = TaskStatus::Completed;
        progress.read_as_ended(&a);
        progress.read_as_ended(&b);
        assert_eq!(progress.first_unended(), None);
    }

    #[test]
    fn another_version_of_the_workflow_needs_a_new_index() {
        let w = WorkflowId::new();
        let a = task_of(w, Some("a"), vec![]);
        let mut workflow = Workflow::new("t", "t", Utc::now());
        workflow.task_ids = vec![a.id];
        let progress = Progress::new(&workflow, std::slice::from_ref(&a));
        assert!(progress.is_of(&workflow));
        workflow.version += 1;
        assert!(!progress.is_of(&workflow));
    }
}
