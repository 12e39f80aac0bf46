//! Storage integration tests: one conformance suite that every backend must
//! pass, plus tests of the filesystem backend's crash handling and of the
//! SurrealDB backends against a real server (with the `surrealdb` feature).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod backup;
#[cfg(feature = "surrealdb")]
mod changes;
mod conformance;
#[cfg(feature = "surrealdb")]
mod dev_server;
mod filesystem;
#[cfg(feature = "surrealdb")]
mod surreal;
mod transfer;
