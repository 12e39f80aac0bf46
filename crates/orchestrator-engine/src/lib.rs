//! The runtime: turns submissions into persisted tasks, dispatches them to a
//! bounded pool of workers by priority, runs their steps, retries with
//! backoff, enforces timeouts, cancels, moves workflows along their DAG,
//! and announces every durable change as an event.
//!
//! The engine knows storage and processes but not HTTP. The invariant that
//! makes it crash-safe: every state change is persisted (and durable) before
//! the engine acts on it or announces it. "running" is stored before a step
//! starts; "cancel requested" is stored before a step is stopped; a
//! released task's resolved input is stored before it is queued.
//!
//! Components, each with its own state, depend one way (a test checks
//! that the module graph has no cycle): `engine` and `submit` wire and
//! use `dispatch` and `cluster`, which use `lifecycle`, which uses
//! `records`, `queue`, `attempts` and `steps`; `records` uses `events`.
//! `scheduler` starts the due runs of schedules through a `RunStarter`,
//! which `schedules` (the engine's schedule calls) implements with
//! `submit`; `rerun` builds a new revision through `submit`.
//! `retention` sweeps the store on its own. `access`, `secrets` and
//! `templates` stand alone. `webhooks` (notifications) listens to `events`
//! and seals with `secrets`.

pub mod access;
pub mod approval_step;
pub mod approvals;
mod attempts;
pub mod builtin;
mod cluster;
mod compare;
mod dispatch;
mod engine;
mod error;
pub mod events;
mod lifecycle;
mod locks;
mod queue;
mod records;
mod rerun;
mod retention;
mod scheduler;
mod schedules;
pub mod secrets;
pub mod steps;
mod submit;
pub mod templates;
pub mod webhooks;

pub use engine::{Engine, EngineConfig};
pub use error::{Error, Result};
pub use orchestrator_core::{StepView, WorkflowView};
pub use rerun::RerunRequest;
pub use retention::{PruneReport, PruneRequest, RetentionConfig};
pub use schedules::{DEFAULT_CATCH_UP_WINDOW_SECS, SchedulePatch, ScheduleRequest, ScheduleView};
pub use submit::{MAX_ATTEMPTS, Meta, SubmitRequest, TemplateSource};

/// Locks a std mutex of the engine's. Every critical section in this crate
/// is a few map or queue operations that never leave the data half-changed
/// and never await, so a poisoned lock is still consistent.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
