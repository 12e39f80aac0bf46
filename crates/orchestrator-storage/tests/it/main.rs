//! Storage integration tests: one conformance suite that every backend must
//! pass, plus tests of the filesystem backend's crash handling.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod conformance;
mod filesystem;
