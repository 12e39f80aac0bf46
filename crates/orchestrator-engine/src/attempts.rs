//! The attempts this node runs right now, each with the tokens that stop
//! its step. Whoever must stop an attempt (a cancel, a lost lease, the end
//! of the shutdown grace) finds it here.

use std::collections::HashMap;
use std::sync::Mutex;

use orchestrator_core::TaskId;
use tokio_util::sync::CancellationToken;

use crate::lock;

/// How an attempt is stopped. A step that started work elsewhere (an
/// http job) must tell the two apart: a cancelled task's job is cancelled
/// too, while an attempt stopped for any other reason leaves its job
/// running for the next attempt to resume.
#[derive(Clone)]
pub(crate) struct StopTokens {
    /// Fires when the task is cancelled; `attempt` fires with it.
    pub(crate) task: CancellationToken,
    /// Fires whenever the attempt must stop: a cancel, the end of the
    /// shutdown grace, a lease another node took over.
    pub(crate) attempt: CancellationToken,
}

impl StopTokens {
    fn new() -> StopTokens {
        let task = CancellationToken::new();
        let attempt = task.child_token();
        StopTokens { task, attempt }
    }

    /// The task was cancelled: its step stops, and so does its work.
    pub(crate) fn cancel_task(&self) {
        self.task.cancel();
    }

    /// Only this attempt stops; the task goes on.
    pub(crate) fn stop_attempt(&self) {
        self.attempt.cancel();
    }
}

/// One attempt of this node's.
struct Running {
    tokens: StopTokens,
    /// The attempt number the claim stored; `None` while the claim is on
    /// its way to storage.
    claimed: Option<u32>,
}

#[derive(Default)]
pub(crate) struct Attempts {
    /// A std mutex: every use is a map operation that never awaits. An
    /// attempt is registered before its task is stored as running, so a
    /// cancel that reads "running" always finds its tokens.
    running: Mutex<HashMap<TaskId, Running>>,
}

impl Attempts {
    /// Registers an attempt about to be claimed; its stop tokens. `None`
    /// if this node has an attempt on the task already: a task can reach
    /// the queue twice (an offer from the feed between a worker's pop and
    /// this call), and the second must neither run nor take the first's
    /// place here, or the first would be left without its lease renewals
    /// and its cancel.
    pub(crate) fn begin(&self, id: TaskId) -> Option<StopTokens> {
        let mut running = lock(&self.running);
        if running.contains_key(&id) {
            return None;
        }
        let tokens = StopTokens::new();
        running.insert(
            id,
            Running {
                tokens: tokens.clone(),
                claimed: None,
            },
        );
        Some(tokens)
    }

    /// The claim of the attempt on `id` is stored, as attempt `attempt`.
    pub(crate) fn claimed(&self, id: TaskId, attempt: u32) {
        if let Some(running) = lock(&self.running).get_mut(&id) {
            running.claimed = Some(attempt);
        }
    }

    pub(crate) fn end(&self, id: TaskId) {
        lock(&self.running).remove(&id);
    }

    /// Stops the step of a cancelled task if it runs here; whether it did.
    pub(crate) fn cancel(&self, id: TaskId) -> bool {
        match lock(&self.running).get(&id) {
            Some(running) => {
                running.tokens.cancel_task();
                true
            }
            None => false,
        }
    }

    pub(crate) fn contains(&self, id: TaskId) -> bool {
        lock(&self.running).contains_key(&id)
    }

    pub(crate) fn len(&self) -> usize {
        lock(&self.running).len()
    }

    /// The attempts running now, with their tokens.
    pub(crate) fn snapshot(&self) -> Vec<(TaskId, StopTokens)> {
        lock(&self.running)
            .iter()
            .map(|(id, running)| (*id, running.tokens.clone()))
            .collect()
    }

    /// The attempts whose claim is stored, with their tokens and attempt
    /// numbers. Only these can be compared with what the store holds: an
    /// attempt whose claim is still on its way finds its task queued
    /// there, and is not for that reason lost.
    pub(crate) fn claimed_snapshot(&self) -> Vec<(TaskId, StopTokens, u32)> {
        lock(&self.running)
            .iter()
            .filter_map(|(id, running)| {
                running
                    .claimed
                    .map(|attempt| (*id, running.tokens.clone(), attempt))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_attempt_on_a_task_is_refused_and_leaves_the_first_in_place() {
        let attempts = Attempts::default();
        let id = TaskId::new();
        let first = attempts.begin(id).expect("the first attempt registers");
        assert!(
            attempts.begin(id).is_none(),
            "a second attempt on the same task"
        );
        attempts.claimed(id, 1);
        let snapshot = attempts.claimed_snapshot();
        assert_eq!(snapshot.len(), 1);
        // The registered tokens are the first attempt's: a cancel reaches it.
        assert!(attempts.cancel(id));
        assert!(first.task.is_cancelled() && first.attempt.is_cancelled());
        attempts.end(id);
        assert!(attempts.begin(id).is_some(), "free again once it ended");
    }
}
