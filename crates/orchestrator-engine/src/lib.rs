//! The runtime: turns submissions into persisted tasks, dispatches them to a
//! bounded pool of workers by priority, runs their scripts, retries with
//! backoff, enforces timeouts, cancels, and releases dependent tasks.
//!
//! The engine knows storage and processes but not HTTP. The invariant that
//! makes it crash-safe: every state change is persisted (and durable) before
//! the engine acts on it. "running" is stored before a script is spawned;
//! "cancel requested" is stored before a script is signalled.

pub mod builtin;
mod engine;
mod error;

pub use engine::{Engine, EngineConfig, Submission, WorkflowView};
pub use error::{Error, Result};
