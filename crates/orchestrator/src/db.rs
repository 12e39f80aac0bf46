//! `orchestrator db status`: the store's schema against this build, read
//! without changing anything, for every backend.

use anyhow::{Context, bail};
use orchestrator_storage::schema::{EntryState, SchemaStatus};

use crate::cli::{DbCommand, ServeArgs};
use crate::settings::ServeSettings;

pub async fn run(command: DbCommand) -> anyhow::Result<()> {
    match command {
        DbCommand::Status(args) => status(args).await,
    }
}

async fn status(args: ServeArgs) -> anyhow::Result<()> {
    let settings = ServeSettings::resolve(args)?;
    let (config, _) = settings.store()?;
    let status = orchestrator_storage::schema_status(&config)
        .await
        .context("cannot read the schema status")?;
    print!("{}", render(&status));
    let refused: Vec<String> = status
        .entries
        .iter()
        .filter(|e| {
            matches!(
                e.state,
                EntryState::Changed | EntryState::Dirty | EntryState::Unknown
            )
        })
        .map(|e| format!("{} is {}", e.name, e.state))
        .collect();
    if !refused.is_empty() {
        bail!(
            "`orchestrator serve` will refuse this store ({}); starting it prints what to do",
            refused.join(", ")
        );
    }
    Ok(())
}

/// The table `db status` prints.
fn render(status: &SchemaStatus) -> String {
    let mut out = format!("storage: {} at {}\n", status.backend, status.location);
    let name_width = status
        .entries
        .iter()
        .map(|e| e.name.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    out.push_str(&format!(
        "{:<7}  {:<name_width$}  {:<21}  {}\n",
        "VERSION", "NAME", "STATE", "APPLIED AT"
    ));
    for entry in &status.entries {
        out.push_str(&format!(
            "{:<7}  {:<name_width$}  {:<21}  {}\n",
            entry.version,
            entry.name,
            entry.state.as_str(),
            entry.applied_at.as_deref().unwrap_or("-")
        ));
    }
    let count = |state| status.entries.iter().filter(|e| e.state == state).count();
    let pending = count(EntryState::Pending);
    out.push_str(&format!(
        "{} applied, {pending} pending{}\n",
        count(EntryState::Applied),
        if pending > 0 {
            ": the next `orchestrator serve` applies them"
        } else {
            ""
        }
    ));
    out
}

#[cfg(test)]
mod tests {
    use orchestrator_storage::schema::SchemaEntry;

    use super::*;

    #[test]
    fn the_table_lists_each_version_with_its_state() {
        let entry = |version, state, applied_at: Option<&str>| SchemaEntry {
            version,
            name: format!("m{version}"),
            state,
            checksum: None,
            applied_at: applied_at.map(str::to_owned),
        };
        let status = SchemaStatus {
            backend: "surrealdb-server",
            location: "ws://db:8000 (namespace a, database b)".into(),
            entries: vec![
                entry(1, EntryState::Applied, Some("2025-01-01T00:00:00Z")),
                entry(2, EntryState::Pending, None),
            ],
        };
        let expected = "storage: surrealdb-server at ws://db:8000 (namespace a, database b)
VERSION  NAME  STATE                  APPLIED AT
1        m1    applied                2025-01-01T00:00:00Z
2        m2    pending                -
1 applied, 1 pending: the next `orchestrator serve` applies them
";
        assert_eq!(render(&status), expected);
    }
}
