//! `orchestrator storage`: storage move of a running service, through
//! its API (needs an admin token).

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{Context, bail};
use orchestrator_api::client::Client;
use orchestrator_core::storage_move::{MovePhase, MoveStatus};
use serde_json::json;

use crate::cli::{ClientArgs, StorageCommand};
use crate::client::{connect, print_json};

/// How often a followed migration is asked for its status.
const POLL: Duration = Duration::from_millis(250);

pub async fn run(client: &ClientArgs, command: StorageCommand) -> anyhow::Result<()> {
    let api = connect(client)?;
    match command {
        StorageCommand::Migrate {
            to,
            batch_size,
            no_wait,
            json,
        } => {
            let to = absolute_spec(&to)?;
            let status = api.start_migration(&to, batch_size).await?;
            if no_wait {
                return print(&status, json);
            }
            let end = follow(&api, &status.id, !json).await?;
            print(&end, json)?;
            if end.phase != MovePhase::Completed {
                bail!(
                    "migration {} {}{}",
                    end.id,
                    end.phase.as_str(),
                    end.error.map(|e| format!(": {e}")).unwrap_or_default()
                );
            }
            Ok(())
        }
        StorageCommand::Status { id, json } => match id {
            Some(id) => print(&api.migration(&id).await?, json),
            None => {
                let store = api.store().await?;
                let list = api.list_migrations().await?;
                if json {
                    return print_json(&json!({"store": store, "migrations": list.migrations}));
                }
                println!("store: {}", store.store);
                if let Some(previous) = &store.previous {
                    let level = if store.level {
                        "level: a rollback may return to it"
                    } else {
                        "behind: written to since the switch"
                    };
                    println!("previous: {previous} ({level})");
                    match &store.rollback_refused {
                        Some(why) => println!("rollback: refused: {why}"),
                        None => println!("rollback: possible (`storage rollback`)"),
                    }
                }
                for m in &list.migrations {
                    println!("{}", line(m));
                }
                Ok(())
            }
        },
        StorageCommand::Cancel { id } => {
            api.cancel_migration(&id).await?;
            let end = follow(&api, &id, false).await?;
            println!("{}", line(&end));
            Ok(())
        }
        StorageCommand::Rollback { json } => {
            let store = api.rollback_store().await?;
            if json {
                print_json(&store)?;
            } else {
                println!(
                    "rolled back: the service works on {} again ({} is kept, level with it)",
                    store.store,
                    store.previous.as_deref().unwrap_or("?")
                );
            }
            Ok(())
        }
    }
}

/// A directory in a spec, made absolute here: the service resolves paths
/// against its own working directory, not the caller's.
fn absolute_spec(spec: &str) -> anyhow::Result<String> {
    match spec.split_once(':') {
        Some((backend, location)) if backend != "surrealdb-server" && !location.is_empty() => {
            let path = std::path::absolute(location)
                .with_context(|| format!("--to {spec}: cannot make {location} absolute"))?;
            Ok(format!("{backend}:{}", path.display()))
        }
        _ => Ok(spec.to_owned()),
    }
}

/// Polls the migration until it ends, with a progress bar (on a
/// terminal) or a line per phase.
async fn follow(api: &Client, id: &str, show: bool) -> anyhow::Result<MoveStatus> {
    let bar = (show && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{prefix:>10} [{bar:30}] {pos}/{len} records {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar
    });
    let mut shown_phase = None;
    loop {
        let status = api.migration(id).await?;
        if let Some(bar) = &bar {
            bar.set_prefix(status.phase.as_str());
            bar.set_length(status.records_total);
            bar.set_position(status.records_copied);
            bar.set_message(match status.eta_secs {
                Some(eta) => format!("{:.0}/s, eta {eta}s", status.rate),
                None => String::new(),
            });
        } else if show && shown_phase != Some(status.phase) {
            eprintln!("storage migrate: {}", line(&status));
        }
        shown_phase = Some(status.phase);
        if status.phase.is_final() {
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            return Ok(status);
        }
        tokio::time::sleep(POLL).await;
    }
}

fn line(m: &MoveStatus) -> String {
    let mut text = format!(
        "{} {} -> {}: {}, {}/{} records copied, {} mirrored",
        m.id,
        m.source,
        m.target,
        m.phase.as_str(),
        m.records_copied,
        m.records_total,
        m.records_mirrored
    );
    if let Some(stall) = m.switch_stall_ms {
        text.push_str(&format!(", writes paused {stall:.1} ms at the switch"));
    }
    if let Some(error) = &m.error {
        text.push_str(&format!(" ({error})"));
    }
    text
}

fn print(status: &MoveStatus, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(status)?);
    } else {
        println!("{}", line(status));
    }
    Ok(())
}
