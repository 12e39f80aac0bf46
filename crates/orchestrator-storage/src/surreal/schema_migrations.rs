//! Schema migrations: the numbered SurrealQL files in the top-level
//! `migrations/`, compiled into the binary, applied in order when a
//! SurrealDB backend opens, and recorded in `schema_migration` with a
//! SHA-256 checksum of the file.
//!
//! The rules follow sqlx's: an applied migration whose file has changed, a
//! dirty one (started, never finished) and one this build does not know are
//! all refused with a message that says what to do, and a lock record keeps
//! two starting services from migrating at once.

use std::time::{Duration, Instant};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use surrealdb::Surreal;
use surrealdb::engine::any::Any;
use surrealdb::types::Variables;

use super::{db_error, first_error, timed};
use crate::schema::{EntryState, SchemaEntry};
use crate::{Error, Result};

/// One migration file.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: u32,
    pub name: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// Its file name in `migrations/`.
    pub fn file_name(&self) -> String {
        format!("{:04}_{}.surql", self.version, self.name)
    }

    /// SHA-256 of the file, lowercase hex.
    pub fn checksum(&self) -> String {
        Sha256::digest(self.sql.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Every migration this build knows, in order. A new file in `migrations/`
/// must be added here too (a unit test checks that the two agree).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "workflows_and_tasks",
        sql: include_str!("../../../../migrations/0001_workflows_and_tasks.surql"),
    },
    Migration {
        version: 2,
        name: "task_logs",
        sql: include_str!("../../../../migrations/0002_task_logs.surql"),
    },
    Migration {
        version: 3,
        name: "nodes",
        sql: include_str!("../../../../migrations/0003_nodes.surql"),
    },
    Migration {
        version: 4,
        name: "access",
        sql: include_str!("../../../../migrations/0004_access.surql"),
    },
    Migration {
        version: 5,
        name: "schedules",
        sql: include_str!("../../../../migrations/0005_schedules.surql"),
    },
    Migration {
        version: 6,
        name: "task_listing",
        sql: include_str!("../../../../migrations/0006_task_listing.surql"),
    },
    Migration {
        version: 7,
        name: "webhooks",
        sql: include_str!("../../../../migrations/0007_webhooks.surql"),
    },
    Migration {
        version: 8,
        name: "locks",
        sql: include_str!("../../../../migrations/0008_locks.surql"),
    },
    Migration {
        version: 9,
        name: "workflow_search",
        sql: include_str!("../../../../migrations/0009_workflow_search.surql"),
    },
    Migration {
        version: 10,
        name: "task_keyset",
        sql: include_str!("../../../../migrations/0010_task_keyset.surql"),
    },
    Migration {
        version: 11,
        name: "task_newest_first",
        sql: include_str!("../../../../migrations/0011_task_newest_first.surql"),
    },
    Migration {
        version: 12,
        name: "task_listing_indexes",
        sql: include_str!("../../../../migrations/0012_task_listing_indexes.surql"),
    },
    Migration {
        version: 13,
        name: "workflow_newest_first",
        sql: include_str!("../../../../migrations/0013_workflow_newest_first.surql"),
    },
    Migration {
        version: 14,
        name: "workflow_listing_indexes",
        sql: include_str!("../../../../migrations/0014_workflow_listing_indexes.surql"),
    },
    Migration {
        version: 15,
        name: "transient_status_counts",
        sql: include_str!("../../../../migrations/0015_transient_status_counts.surql"),
    },
    Migration {
        version: 16,
        name: "newest_first_sent",
        sql: include_str!("../../../../migrations/0016_newest_first_sent.surql"),
    },
];

/// How long one migration's transaction may take: index builds grow with
/// the store.
const MIGRATION_DEADLINE: Duration = Duration::from_secs(30 * 60);

/// How long a start waits for another process's migration lock.
const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The bookkeeping tables. Schemaless: they must exist before the first
/// migration, and their shape is this module's business only.
const BOOTSTRAP: &str = "DEFINE TABLE IF NOT EXISTS schema_migration SCHEMALESS;
DEFINE TABLE IF NOT EXISTS schema_lock SCHEMALESS;";

/// A row of `schema_migration`.
#[derive(Debug, Deserialize)]
struct Applied {
    version: u32,
    name: String,
    checksum: String,
    state: String,
    #[serde(default)]
    applied_at: Option<String>,
}

/// Brings the schema up to date with `migrations`, or refuses.
pub(crate) async fn migrate(
    db: &Surreal<Any>,
    migrations: &[Migration],
    timeout: Duration,
) -> Result<()> {
    run(
        db,
        timeout,
        "create the migration tables",
        BOOTSTRAP,
        Variables::new(),
    )
    .await?;
    let holder = format!("pid {} ({})", std::process::id(), uuid::Uuid::now_v7());
    acquire_lock(db, &holder, timeout).await?;
    let result = apply_pending(db, migrations, timeout).await;
    let mut vars = Variables::new();
    vars.insert("holder", holder);
    // Released even after a failure, so the next start can try again. Only
    // our own lock: a lock someone removed by hand and took is theirs.
    if let Err(e) = run(
        db,
        timeout,
        "release the migration lock",
        "DELETE schema_lock:migrate WHERE holder = $holder;",
        vars,
    )
    .await
    {
        tracing::warn!(error = %e, "could not release the migration lock; delete schema_lock:migrate by hand");
    }
    result
}

async fn acquire_lock(db: &Surreal<Any>, holder: &str, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let mut vars = Variables::new();
    vars.insert("holder", holder.to_owned());
    loop {
        let sql = "CREATE schema_lock:migrate SET holder = $holder, since = <string> time::now();";
        let mut response = timed(timeout, db.query(sql).bind(vars.clone())).await?;
        let Some(error) = first_error(&mut response) else {
            return Ok(());
        };
        if !error.is_already_exists() {
            return Err(db_error("take the migration lock", &error));
        }
        if started.elapsed() > LOCK_WAIT {
            let mut response = timed(
                timeout,
                db.query("SELECT VALUE [holder, since] FROM ONLY schema_lock:migrate;"),
            )
            .await?;
            let owner: Option<(String, String)> = response.take(0).unwrap_or(None);
            let (owner, since) = owner.unwrap_or_default();
            return Err(Error::Schema(format!(
                "the schema migration lock is held by {owner} since {since}, and was not released within {}s; \
                 if no other orchestrator is starting on this database, a start was killed while migrating: \
                 check `orchestrator db status`, then remove the lock with the SurrealQL statement \
                 `DELETE schema_lock:migrate` and start again",
                LOCK_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn apply_pending(
    db: &Surreal<Any>,
    migrations: &[Migration],
    timeout: Duration,
) -> Result<()> {
    let applied = read_applied(db, timeout).await?;
    check_applied(&applied, migrations)?;
    for migration in migrations {
        if applied.iter().any(|a| a.version == migration.version) {
            continue;
        }
        apply(db, migration, timeout).await?;
    }
    Ok(())
}

/// Refuses a schema this build cannot safely continue from.
fn check_applied(applied: &[Applied], migrations: &[Migration]) -> Result<()> {
    for row in applied {
        let file = format!("{:04}_{}.surql", row.version, row.name);
        if row.state != "applied" {
            return Err(Error::Schema(format!(
                "migration {file} is dirty: a start began applying it and did not finish; \
                 compare the database schema (`INFO FOR DB`) with migrations/{file}, complete or undo \
                 the migration by hand, then delete its record with \
                 `DELETE schema_migration:{}` and start again",
                row.version
            )));
        }
        let Some(known) = migrations.iter().find(|m| m.version == row.version) else {
            return Err(Error::Schema(format!(
                "the database has migration {file} applied, which this build does not know: \
                 a newer orchestrator migrated it; run that version, or restore a backup taken before"
            )));
        };
        let checksum = known.checksum();
        if row.checksum != checksum {
            return Err(Error::Schema(format!(
                "migration {file} was applied with checksum {} but this build's file has checksum {checksum}; \
                 an applied migration must never change: restore the file as it was applied and put the \
                 change in a new, higher-numbered migration",
                row.checksum
            )));
        }
    }
    Ok(())
}

async fn apply(db: &Surreal<Any>, migration: &Migration, timeout: Duration) -> Result<()> {
    let file = migration.file_name();
    let mut vars = Variables::new();
    vars.insert("version", i64::from(migration.version));
    vars.insert("name", migration.name.to_owned());
    vars.insert("checksum", migration.checksum());
    // Recorded as dirty first, in its own write: if this process dies
    // before the transaction below commits, the next start sees the mark
    // and refuses instead of guessing what happened.
    run(
        db,
        timeout,
        "record the migration as started",
        "CREATE type::record('schema_migration', $version) SET version = $version, name = $name, \
         checksum = $checksum, state = 'dirty', started_at = <string> time::now();",
        vars.clone(),
    )
    .await?;
    let sql = format!(
        "BEGIN;\n{}\n;\nUPDATE type::record('schema_migration', $version) SET state = 'applied', \
         applied_at = <string> time::now();\nCOMMIT;",
        migration.sql
    );
    // The migration itself may build indexes over whole tables (0006 builds
    // eleven over the tasks), which takes longer than a request on a large
    // store. A deadline that passed while the server went on would clear
    // the record below of a migration that then commits.
    let deadline = timeout.max(MIGRATION_DEADLINE);
    match run(db, deadline, "apply the migration", &sql, vars.clone()).await {
        Ok(()) => {
            tracing::info!(migration = %file, "schema migration applied");
            Ok(())
        }
        Err(e) => {
            // The transaction rolled back, so the schema is as before: the
            // dirty mark would only block the next start for nothing.
            let cleared = run(
                db,
                timeout,
                "clear the migration's record",
                "DELETE type::record('schema_migration', $version);",
                vars,
            )
            .await;
            let note = match cleared {
                Ok(()) => "nothing of it was applied (it runs in one transaction)".to_owned(),
                Err(clear) => format!(
                    "its record could not be cleared ({clear}), so the next start will report it as dirty"
                ),
            };
            Err(Error::Schema(format!(
                "migration {file} failed: {e}; {note}; fix the cause and start again"
            )))
        }
    }
}

async fn read_applied(db: &Surreal<Any>, timeout: Duration) -> Result<Vec<Applied>> {
    let mut response = timed(
        timeout,
        db.query("SELECT version, name, checksum, state, applied_at FROM schema_migration ORDER BY version;"),
    )
    .await?;
    if let Some(error) = first_error(&mut response) {
        return Err(db_error("read the applied migrations", &error));
    }
    let rows: Vec<serde_json::Value> = response
        .take(0)
        .map_err(|e| db_error("read the applied migrations", &e))?;
    rows.into_iter()
        .map(|row| {
            serde_json::from_value(row.clone()).map_err(|e| Error::Database {
                context: "read the applied migrations".into(),
                message: format!("unreadable schema_migration record {row}: {e}"),
            })
        })
        .collect()
}

/// Applied and pending migrations, without changing anything. A database
/// that does not exist yet has everything pending.
pub(crate) async fn status(
    db: &Surreal<Any>,
    migrations: &[Migration],
    timeout: Duration,
) -> Result<Vec<SchemaEntry>> {
    let applied = match read_applied(db, timeout).await {
        Ok(applied) => applied,
        Err(Error::Database { message, .. }) if message.contains("does not exist") => Vec::new(),
        Err(e) => return Err(e),
    };
    Ok(entries(&applied, migrations))
}

/// Everything pending: a database that was never opened.
pub(crate) fn status_of_nothing(migrations: &[Migration]) -> Vec<SchemaEntry> {
    entries(&[], migrations)
}

fn entries(applied: &[Applied], migrations: &[Migration]) -> Vec<SchemaEntry> {
    let mut entries: Vec<SchemaEntry> = applied
        .iter()
        .map(|row| {
            let known = migrations.iter().find(|m| m.version == row.version);
            let state = match known {
                _ if row.state != "applied" => EntryState::Dirty,
                None => EntryState::Unknown,
                Some(m) if m.checksum() != row.checksum => EntryState::Changed,
                Some(_) => EntryState::Applied,
            };
            SchemaEntry {
                version: row.version,
                name: row.name.clone(),
                state,
                checksum: Some(row.checksum.clone()),
                applied_at: row.applied_at.clone(),
            }
        })
        .collect();
    for migration in migrations {
        if !applied.iter().any(|a| a.version == migration.version) {
            entries.push(SchemaEntry {
                version: migration.version,
                name: migration.name.to_owned(),
                state: EntryState::Pending,
                checksum: Some(migration.checksum()),
                applied_at: None,
            });
        }
    }
    entries.sort_by_key(|e| e.version);
    entries
}

/// Runs statements that return nothing the caller needs.
async fn run(
    db: &Surreal<Any>,
    timeout: Duration,
    context: &str,
    sql: &str,
    vars: Variables,
) -> Result<()> {
    let mut response = timed(timeout, db.query(sql).bind(vars)).await?;
    match first_error(&mut response) {
        Some(error) => Err(db_error(context, &error)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_in_migrations_is_compiled_in_and_numbered_in_order() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("migrations dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".surql"))
            .collect();
        files.sort();
        let known: Vec<String> = MIGRATIONS.iter().map(Migration::file_name).collect();
        assert_eq!(files, known);
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                migration.version as usize,
                i + 1,
                "versions are 1, 2, 3, ..."
            );
            let statements = migration
                .sql
                .lines()
                .filter(|line| !line.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
                .to_uppercase();
            assert!(
                !statements.contains("BEGIN") && !statements.contains("COMMIT"),
                "{} must not manage its own transaction",
                migration.file_name()
            );
        }
    }

    #[test]
    fn checksums_are_sha256_hex() {
        let m = Migration {
            version: 1,
            name: "x",
            sql: "abc",
        };
        assert_eq!(
            m.checksum(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    fn row(version: u32, checksum: &str, state: &str) -> Applied {
        Applied {
            version,
            name: "m".into(),
            checksum: checksum.into(),
            state: state.into(),
            applied_at: None,
        }
    }

    #[test]
    fn changed_dirty_and_unknown_migrations_are_refused_with_what_to_do() {
        let migrations = [Migration {
            version: 1,
            name: "m",
            sql: "DEFINE TABLE t;",
        }];
        let good = migrations[0].checksum();
        assert!(check_applied(&[row(1, &good, "applied")], &migrations).is_ok());
        let cases = [
            (row(1, "0000", "applied"), "must never change"),
            (row(1, &good, "dirty"), "DELETE schema_migration:1"),
            (row(2, &good, "applied"), "newer orchestrator"),
        ];
        for (applied, expected) in cases {
            let message = check_applied(&[applied], &migrations)
                .expect_err("refused")
                .to_string();
            assert!(message.contains(expected), "{message}");
        }
        let states: Vec<EntryState> = entries(&[row(1, "0000", "applied")], &migrations)
            .into_iter()
            .map(|e| e.state)
            .collect();
        assert_eq!(states, vec![EntryState::Changed]);
    }

    /// A workflow written before migration 9 (no `search` field) is found
    /// by `q` once the store is upgraded: the migration fills the field in.
    #[tokio::test]
    async fn workflows_written_before_the_search_field_are_found_after_the_upgrade() {
        use crate::surreal::SurrealBackend;
        use crate::{
            Backend, StorageConfig, StorageType, SurrealdbConfig, TaskStore, WorkflowQuery,
        };

        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig {
            storage_type: StorageType::SurrealdbEmbedded,
            data_dir: dir.path().to_path_buf(),
            surrealdb: SurrealdbConfig::default(),
        };
        let before_search = MIGRATIONS
            .iter()
            .position(|m| m.name == "workflow_search")
            .unwrap();
        let old = SurrealBackend::open_with_migrations(&config, &MIGRATIONS[..before_search])
            .await
            .unwrap();
        let workflow =
            orchestrator_core::Workflow::new("old-kind", "Old Deploy", chrono::Utc::now());
        // The row as an older build wrote it.
        let mut row = super::super::rows::workflow_row(&workflow, true).unwrap();
        for field in ["search", "newest_first"] {
            row.as_object_mut().unwrap().remove(field);
        }
        let mut vars = Variables::new();
        vars.insert("row", row);
        old.query("seed", "INSERT INTO workflow $row;", &vars)
            .await
            .unwrap();
        old.close().await.unwrap();
        drop(old);

        let upgraded = SurrealBackend::open(&config).await.unwrap();
        let page = upgraded
            .list_workflows(&WorkflowQuery {
                text: Some("OLD deploy".into()),
                limit: 10,
                ..WorkflowQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(
            page.items.iter().map(|w| w.id).collect::<Vec<_>>(),
            vec![workflow.id]
        );
        upgraded.close().await.unwrap();
    }

    /// Tasks written before migration 10 (no `key`) or 11 (no `listed` nor
    /// `newest_first`) are listed, first page and by cursor, in every
    /// shape once the store is upgraded: the migrations fill the fields
    /// in, and the indexes hold every task once.
    #[tokio::test]
    async fn tasks_written_before_the_listing_keys_are_paged_after_the_upgrade() {
        for migration in ["task_keyset", "task_newest_first"] {
            tasks_written_before_are_paged_after_the_upgrade(migration).await;
        }
    }

    async fn tasks_written_before_are_paged_after_the_upgrade(migration: &str) {
        use orchestrator_core::{Task, TaskStatus, Workflow};

        use crate::surreal::SurrealBackend;
        use crate::{
            Backend, StorageConfig, StorageType, SurrealdbConfig, TaskQuery, TaskStore,
            WorkflowQuery,
        };

        let dir = tempfile::tempdir().unwrap();
        let config = StorageConfig {
            storage_type: StorageType::SurrealdbEmbedded,
            data_dir: dir.path().to_path_buf(),
            surrealdb: SurrealdbConfig::default(),
        };
        let before = MIGRATIONS.iter().position(|m| m.name == migration).unwrap();
        let old = SurrealBackend::open_with_migrations(&config, &MIGRATIONS[..before])
            .await
            .unwrap();
        let now = chrono::Utc::now();
        let mut workflow = Workflow::new("old-kind", "old", now);
        let tasks: Vec<Task> = (0..5)
            .map(|i| crate::surreal::test_task(workflow.id, format!("t{i}")))
            .collect();
        workflow.task_ids = tasks.iter().map(|t| t.id).collect();
        // The rows as an older build wrote them: without `newest_first`,
        // which this build sends (migration 0016).
        let older = |mut row: serde_json::Value| {
            row.as_object_mut().unwrap().remove("newest_first");
            row
        };
        let mut vars = Variables::new();
        vars.insert(
            "workflow",
            older(super::super::rows::workflow_row(&workflow, true).unwrap()),
        );
        let task_rows = tasks
            .iter()
            .map(|t| older(super::super::rows::task_row(t, true).unwrap()))
            .collect();
        vars.insert("tasks", serde_json::Value::Array(task_rows));
        old.query(
            "seed",
            "INSERT INTO workflow $workflow; INSERT INTO task $tasks;",
            &vars,
        )
        .await
        .unwrap();
        old.close().await.unwrap();
        drop(old);

        let upgraded = SurrealBackend::open(&config).await.unwrap();
        // Keys sort by creation; listings are newest first. Past the
        // newest: the four older ones.
        let mut oldest_first: Vec<_> = tasks.iter().map(|t| t.id).collect();
        oldest_first.sort_by_key(|id| id.to_string());
        let mut expected: Vec<_> = oldest_first.iter().rev().copied().collect();
        let newest = expected.remove(0);
        for (workflow, status) in [
            (None, None),
            (Some(workflow.id), None),
            (None, Some(TaskStatus::Queued)),
            (Some(workflow.id), Some(TaskStatus::Queued)),
        ] {
            let page = upgraded
                .list_tasks(&TaskQuery {
                    workflow,
                    status,
                    after: Some(newest),
                    limit: 10,
                    ..TaskQuery::default()
                })
                .await
                .unwrap();
            assert_eq!(
                page.items.iter().map(|t| t.id).collect::<Vec<_>>(),
                expected,
                "written before {migration}; workflow {workflow:?}, status {status:?}"
            );
            assert_eq!(
                page.total, 5,
                "written before {migration}; workflow {workflow:?}, status {status:?}"
            );
            // The first page holds each task once: no index entry was left
            // behind by the rewrite.
            let first = upgraded
                .list_tasks(&TaskQuery {
                    workflow,
                    status,
                    limit: 10,
                    ..TaskQuery::default()
                })
                .await
                .unwrap();
            assert_eq!(
                first.items.iter().map(|t| t.id).collect::<Vec<_>>(),
                [&[newest][..], &expected].concat(),
                "written before {migration}; workflow {workflow:?}, status {status:?}"
            );
        }
        let read: Vec<_> = upgraded
            .workflow_tasks(workflow.id)
            .await
            .unwrap()
            .iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(read, oldest_first);

        // The workflow, written before 0013, is listed once, first page and
        // by cursor, without a filter and by its status.
        for status in [None, Some(workflow.status)] {
            let first = upgraded
                .list_workflows(&WorkflowQuery {
                    status,
                    limit: 10,
                    ..WorkflowQuery::default()
                })
                .await
                .unwrap();
            assert_eq!(
                (
                    first.items.iter().map(|w| w.id).collect::<Vec<_>>(),
                    first.total
                ),
                (vec![workflow.id], 1),
                "written before {migration}; status {status:?}"
            );
            let past = upgraded
                .list_workflows(&WorkflowQuery {
                    status,
                    after: Some(orchestrator_core::WorkflowId::new()),
                    limit: 10,
                    ..WorkflowQuery::default()
                })
                .await
                .unwrap();
            assert_eq!(
                past.items.iter().map(|w| w.id).collect::<Vec<_>>(),
                vec![workflow.id],
                "written before {migration}; status {status:?}, by cursor"
            );
        }
        upgraded.close().await.unwrap();
    }
}
