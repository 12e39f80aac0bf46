//! The `surreal` binary, built from the official `surrealdb-server` crate.
//! Dev-only: `make surreal` and the storage tests start it, e.g.
//! `surreal-dev-server start --bind 127.0.0.1:8000 --user root --pass root memory`.

#![recursion_limit = "512"]

fn main() -> std::process::ExitCode {
    surrealdb_server::init(surrealdb_server::core::CommunityComposer())
}
