//! Errors raised by the task state machine: the core's error type, kept
//! with the states it speaks of (a module of its own beside `task` would
//! need `task`'s statuses while `task` needs it: a cycle).

use super::TaskStatus;
use crate::TaskId;

/// A state transition that the task state machine forbids.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("task {id} cannot go from {from} to {to}")]
    InvalidTransition {
        id: TaskId,
        from: TaskStatus,
        to: TaskStatus,
    },
    #[error("task {id} already finished as {status}")]
    AlreadyFinished { id: TaskId, status: TaskStatus },
    #[error("task {id} is {status}; only a running task can save a checkpoint")]
    NotRunning { id: TaskId, status: TaskStatus },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
