//! The attempts this node runs right now, each with the token that stops
//! its step. Whoever must stop an attempt (a cancel, a lost lease, the end
//! of the shutdown grace) finds it here.

use std::collections::HashMap;
use std::sync::Mutex;

use orchestrator_core::TaskId;
use tokio_util::sync::CancellationToken;

use crate::lock;

#[derive(Default)]
pub(crate) struct Attempts {
    /// A std mutex: every use is a map operation that never awaits. An
    /// attempt is registered before its task is stored as running, so a
    /// cancel that reads "running" always finds its token.
    running: Mutex<HashMap<TaskId, CancellationToken>>,
}

impl Attempts {
    /// Registers an attempt about to be claimed; its stop token.
    pub(crate) fn begin(&self, id: TaskId) -> CancellationToken {
        let token = CancellationToken::new();
        lock(&self.running).insert(id, token.clone());
        token
    }

    pub(crate) fn end(&self, id: TaskId) {
        lock(&self.running).remove(&id);
    }

    /// Stops the attempt's step if it runs here; whether it did.
    pub(crate) fn stop(&self, id: TaskId) -> bool {
        match lock(&self.running).get(&id) {
            Some(token) => {
                token.cancel();
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
    pub(crate) fn snapshot(&self) -> Vec<(TaskId, CancellationToken)> {
        lock(&self.running)
            .iter()
            .map(|(id, token)| (*id, token.clone()))
            .collect()
    }
}
