//! Storage integration tests: one conformance suite that every backend must
//! pass, plus tests of the filesystem backend's crash handling.

mod conformance;
mod filesystem;
