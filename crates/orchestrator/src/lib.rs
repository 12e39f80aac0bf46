//! The `orchestrator` command: `serve` runs the daemon, the other
//! subcommands are clients of a running daemon's HTTP API.

mod approvals;
mod backup;
pub mod cli;
mod client;
mod db;
mod diff;
mod doctor;
mod recovery;
mod sandbox;
mod schedules;
pub mod service;
pub mod settings;
mod storage_move;
mod store_copy;
mod systemd;
mod testenv;
mod webhooks;
mod workflows;

use std::process::ExitCode;

use cli::{Cli, Command};

/// Runs a parsed command line to completion and turns the outcome into an
/// exit code; errors are printed with their whole context chain.
pub fn run(cli: Cli) -> ExitCode {
    // A node's init mounts and pivots its root: single-threaded, before
    // any runtime starts a thread.
    let cli = match cli.command {
        Command::TestenvNodeInit(args) => {
            return orchestrator_testenv::node_init::run(&args.into());
        }
        command => Cli { command, ..cli },
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(serve) if serve.print_config => settings::print_config(serve.settings),
            Command::Serve(serve) => service::serve_from_args(serve.settings).await,
            Command::Tasks(args) => client::tasks(&cli.client, args).await,
            Command::Task(args) => client::task(&cli.client, args).await,
            Command::Logs(args) => client::logs(&cli.client, args).await,
            Command::Cancel(args) => client::cancel(&cli.client, args).await,
            Command::Workflow(command) => workflows::run(&cli.client, command).await,
            Command::Approvals(args) => approvals::list(&cli.client, args).await,
            Command::Approve(args) => approvals::decide(&cli.client, args, true).await,
            Command::Reject(args) => approvals::decide(&cli.client, args, false).await,
            Command::Template(command) => workflows::template(&cli.client, command).await,
            Command::Schedule(command) => schedules::run(&cli.client, command).await,
            Command::Test(command) => testenv::run(&cli.client, command).await,
            Command::Db(command) => db::run(command).await,
            Command::Migrate(args) => store_copy::run(args).await,
            Command::Token(command) => client::token(&cli.client, command).await,
            Command::Secret(command) => client::secret(&cli.client, command).await,
            Command::Audit(args) => client::audit(&cli.client, args).await,
            Command::Webhook(command) => webhooks::run(&cli.client, command).await,
            Command::Checkpoint(command) => client::checkpoint(&cli.client, command).await,
            Command::Backup(args) => backup::backup(&cli.client, args).await,
            Command::Restore(args) => backup::restore(args).await,
            Command::Prune(args) => client::prune(&cli.client, args).await,
            Command::Storage(command) => storage_move::run(&cli.client, command).await,
            Command::Doctor(args) => doctor::run(args).await,
            Command::Locks(args) => client::locks(&cli.client, args).await,
            Command::TestenvNodeInit(_) => unreachable!("run before the runtime starts"),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
