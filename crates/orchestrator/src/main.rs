//! The `orchestrator` binary: parse the command line and hand over.

use clap::Parser;

fn main() -> std::process::ExitCode {
    // Inside a prepared script sandbox, the binary only becomes the
    // script: before any parsing, as cheap as it can be.
    if std::env::args_os().nth(1).as_deref() == Some(orchestrator_executor::HELPER_ARG.as_ref()) {
        return orchestrator_executor::serve_prepared_sandbox();
    }
    let cli = orchestrator::cli::Cli::parse();
    orchestrator::run(cli)
}
