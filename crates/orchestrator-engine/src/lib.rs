//! The runtime: turns submissions into persisted tasks, dispatches them to a
//! bounded pool of workers by priority, runs their scripts, retries with
//! backoff, enforces timeouts, cancels, and moves workflows along their DAG.
//!
//! The engine knows storage and processes but not HTTP. The invariant that
//! makes it crash-safe: every state change is persisted (and durable) before
//! the engine acts on it. "running" is stored before a script is spawned;
//! "cancel requested" is stored before a script is signalled; a released
//! task's resolved input is stored before it is queued.

pub mod access;
pub mod builtin;
mod cluster;
mod dispatch;
mod engine;
mod error;
mod lifecycle;
pub mod secrets;
mod submit;
pub mod templates;

pub use engine::{Engine, EngineConfig, StepView, WorkflowView};
pub use error::{Error, Result};
pub use submit::{Meta, SubmitRequest, TemplateSource};
