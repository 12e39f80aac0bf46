//! The orchestrator's core: the task model, its state machine, the ready queue,
//! the retry policy and the dependency decisions between tasks of a workflow.
//!
//! This crate does no I/O. It never reads a clock, a disk, a socket or a
//! process: time comes in as `now` arguments and randomness as samples, so
//! every decision here is a plain function that unit tests can pin down.

pub mod access;
pub mod approval;
pub mod backoff;
pub mod compare;
pub mod event;
mod ids;
pub mod lock;
mod names;
mod node;
mod period;
pub mod progress;
mod queue;
pub mod refs;
pub mod release;
pub mod retention;
mod retry;
pub mod schedule;
pub mod storage_move;
pub mod submission;
mod task;
pub mod template;
pub mod view;
pub mod webhook;
pub mod whole_number;
mod workflow;

pub use ids::{ScheduleId, TaskId, WorkflowId};
pub use node::Node;
pub use queue::ReadyQueue;
pub use retry::RetryPolicy;
pub use task::{
    AttemptRecord, ConditionOutcome, Error, FailureOutcome, FailurePolicy, MAX_INTERRUPTIONS,
    Priority, Result, StepKind, StepSettings, Task, TaskSpec, TaskStatus,
};
/// The `http` step kind's block of a template, also used on its own by the
/// http runner.
pub use template::http;
pub use view::{StepView, WorkflowView};
pub use workflow::{Decision, Halt, Workflow, WorkflowStatus, decide, decide_task};
