//! `orchestrator-sandbox-exec`: the helper that waits in each script
//! sandbox the service prepares ahead, and becomes the script of the
//! attempt that takes it (`orchestrator_executor`'s `prepared` module).
//! A binary of its own, not a subcommand: it starts for every script, and
//! the service's binary is a hundred times its size to map.

fn main() -> std::process::ExitCode {
    orchestrator_executor::serve_prepared_sandbox()
}
