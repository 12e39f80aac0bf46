//! The `orchestrator` binary: parse the command line and hand over.

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = orchestrator::cli::Cli::parse();
    orchestrator::run(cli)
}
