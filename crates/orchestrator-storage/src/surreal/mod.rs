//! The SurrealDB backends: embedded (SurrealKV, or RocksDB with the
//! `surrealdb-rocksdb` feature, in `<data-dir>/surrealdb`) and a SurrealDB
//! server over WebSocket. One type serves both through the SDK's `any`
//! engine; only the endpoint and the sign-in differ.
//!
//! Each workflow and task is one record holding the whole object as JSON
//! (`doc`) plus the fields queries need (see `migrations/`). Every query
//! takes its values as bound parameters; the only text put together here is
//! the choice among fixed `WHERE` fragments, and in task listings the
//! literal of a status name or a workflow's UUID (closed sets: see
//! [`page_sql`] for why).
//!
//! A server can go away while the service runs. The SDK re-dials it every
//! second and restores the session (sign-in, namespace, database). Every
//! call here has a deadline, so a worker never hangs on a dead server: it
//! gets [`Error::Unavailable`]. After such a failure, calls fail at once,
//! without queueing work for a server that is not there, while a probe
//! checks the server with exponential backoff (0.25 s, doubling, at most
//! 5 s) and lets calls through again as soon as it answers.
//!
//! This module holds [`SurrealBackend`], its opening and the [`Backend`]
//! impl. The rest is by concern: `client` (the request path: deadline,
//! conflict retries, error mapping, the probe), `group` (the group commit
//! of the hot writes), `connection` (targets, connecting), `errors`
//! (classification), `rows` (records as rows), `tasks`
//! ([`crate::TaskStore`]), `nodes` ([`crate::NodeStore`] and the change
//! feed), `access` ([`crate::AccessStore`]), `schedules`
//! ([`crate::ScheduleStore`]), `webhooks` ([`crate::WebhookStore`]), `transfer`
//! ([`crate::BulkTransfer`] and the read-only [`SurrealSource`]),
//! `schema_migrations` (the schema) and `recent` (the embedded store's
//! tasks read lately).

mod access;
mod client;
mod connection;
mod errors;
mod group;
mod locks;
mod nodes;
#[cfg(test)]
mod plans;
mod recent;
mod retention;
mod rows;
mod schedules;
pub mod schema_migrations;
mod tasks;
mod transfer;
mod webhooks;

pub use self::transfer::SurrealSource;

use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use surrealdb::IndexedResults;
use surrealdb::types::{Value, Variables};

use self::client::{Client, PROBE_TIMEOUT, Retries};
pub(crate) use self::connection::timed;
use self::connection::{Target, is_held};
pub(crate) use self::errors::{db_error, first_error};
use self::group::{GroupCommit, Write};
use self::recent::{Kept, KeptPage, Recent};
use self::rows::{from_doc, newest_first, row_of, table_of, to_i64};
use crate::schema::{EntryState, SchemaStatus};
use crate::{
    Backend, EmbeddedEngine, Error, Page, Record, RecordKind, Result, Scanned, StorageConfig,
};

pub struct SurrealBackend {
    /// The request path, shared with the group commit's task.
    client: Arc<Client>,
    /// The hot writes' group commit (see `group`); `None` for a store
    /// opened to read only.
    group: Option<GroupCommit>,
    /// The embedded SurrealKV engine's lock file, which `close` waits on.
    engine_lock: Option<PathBuf>,
    /// Set by `close` (and gone with the backend): change feeds end.
    closing: tokio::sync::watch::Sender<bool>,
    /// How to reach the server again: each change feed opens a connection
    /// of its own (see `nodes`). Set for a server only (not for embedded
    /// or read-only stores), so it also says whether there is a feed.
    feed_config: Option<StorageConfig>,
    /// Tasks, workflows and task listings read lately: for an embedded
    /// store only, the one kind whose every writer is this backend (see
    /// `recent`).
    recent: Option<Recent>,
}

impl SurrealBackend {
    /// Connects (within `connect_timeout`), brings the schema up to date
    /// and returns the open backend.
    pub async fn open(config: &StorageConfig) -> Result<SurrealBackend> {
        SurrealBackend::open_with_migrations(config, schema_migrations::MIGRATIONS).await
    }

    /// As [`SurrealBackend::open`], with another set of migrations: for
    /// tests of the migration rules.
    pub async fn open_with_migrations(
        config: &StorageConfig,
        migrations: &[schema_migrations::Migration],
    ) -> Result<SurrealBackend> {
        let target = Target::of(config)?;
        let db = target.connect(config, true).await?;
        schema_migrations::migrate(&db, migrations, config.surrealdb.request_timeout).await?;
        tracing::info!(
            backend = target.name,
            location = %target.location,
            namespace = %config.surrealdb.namespace,
            database = %config.surrealdb.database,
            "surrealdb storage opened"
        );
        let client = Arc::new(Client::new(
            target.name,
            target.location,
            db,
            config.surrealdb.request_timeout,
        ));
        Ok(SurrealBackend {
            group: Some(GroupCommit::start(Arc::clone(&client))),
            client,
            engine_lock: match (&target.dir, config.surrealdb.engine) {
                (Some(dir), EmbeddedEngine::SurrealKv) => Some(dir.join("LOCK")),
                _ => None,
            },
            closing: tokio::sync::watch::Sender::new(false),
            feed_config: target.remote.then(|| config.clone()),
            recent: (!target.remote).then(Recent::new),
        })
    }

    /// Opens an existing store to read only: nothing is created and no
    /// schema migration runs, so the schema must already be this build's.
    pub async fn open_read_only(config: &StorageConfig) -> Result<SurrealSource> {
        let target = Target::of(config)?;
        if let Some(dir) = &target.dir
            && !dir.exists()
        {
            return Err(Error::Config(format!(
                "there is no embedded SurrealDB store at {}",
                dir.display()
            )));
        }
        let db = target.connect(config, false).await?;
        let timeout = config.surrealdb.request_timeout;
        let entries =
            schema_migrations::status(&db, schema_migrations::MIGRATIONS, timeout).await?;
        if entries.iter().all(|e| e.state == EntryState::Pending) {
            return Err(Error::Config(format!(
                "there is no orchestrator store at {} (namespace {}, database {}): nothing \
                 was ever written there; check the URL, namespace and database",
                target.location, config.surrealdb.namespace, config.surrealdb.database
            )));
        }
        if let Some(entry) = entries.iter().find(|e| e.state != EntryState::Applied) {
            return Err(Error::Schema(format!(
                "{} (namespace {}, database {}): schema migration `{}` is {}; a store is read \
                 only as this build's schema (start `orchestrator serve` on it once to apply \
                 pending migrations)",
                target.location,
                config.surrealdb.namespace,
                config.surrealdb.database,
                entry.name,
                entry.state
            )));
        }
        Ok(SurrealSource(SurrealBackend {
            client: Arc::new(Client::new(target.name, target.location, db, timeout)),
            group: None,
            engine_lock: match (&target.dir, config.surrealdb.engine) {
                (Some(dir), EmbeddedEngine::SurrealKv) => Some(dir.join("LOCK")),
                _ => None,
            },
            closing: tokio::sync::watch::Sender::new(false),
            feed_config: None,
            recent: None,
        }))
    }

    /// Replaces one record whole.
    async fn upsert(&self, record: &Record, context: &str) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("table", table_of(record.kind()));
        vars.insert("id", record.key());
        vars.insert("row", row_of(record)?);
        self.query(
            context,
            "UPSERT type::record($table, $id) CONTENT $row;",
            &vars,
        )
        .await?;
        Ok(())
    }

    /// Rows of `[key, doc]` read as records of `kind`, in key order.
    fn scanned(kind: RecordKind, mut rows: Vec<(String, String)>) -> Vec<Scanned> {
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows.into_iter()
            .map(|(key, doc)| Scanned {
                record: Record::from_json(kind, doc.as_bytes()),
                key,
            })
            .collect()
    }

    /// Runs one request: bound parameters, a deadline, conflict retries,
    /// and the first statement error turned into a storage error.
    async fn query(&self, context: &str, sql: &str, vars: &Variables) -> Result<IndexedResults> {
        self.client
            .query(context, sql, vars, Retries::OnConflict)
            .await
    }

    /// Commits one of the hot writes: with others queued meanwhile, in one
    /// transaction (see `group`); alone in a store opened to read only,
    /// which refuses it anyway.
    async fn write(&self, write: Write) -> Result<Value> {
        match &self.group {
            Some(group) => group.write(write).await,
            None => Err(Error::ReadOnly(self.client.location.clone())),
        }
    }

    /// Deletes the rows of `table` that `condition` selects; how many.
    async fn delete_where(
        &self,
        context: &str,
        table: &str,
        condition: &str,
        vars: &Variables,
    ) -> Result<u64> {
        let sql = format!(
            "{{ LET $gone = (DELETE {table} WHERE {condition} RETURN BEFORE); \
             RETURN array::len($gone); }};"
        );
        let mut response = self.query(context, &sql, vars).await?;
        let count: Option<u64> = response.take(0).map_err(|e| db_error(context, &e))?;
        Ok(count.unwrap_or(0))
    }

    async fn docs<T: DeserializeOwned>(
        &self,
        context: &str,
        sql: &str,
        vars: &Variables,
    ) -> Result<Vec<T>> {
        let docs = self.doc_texts(context, sql, vars).await?;
        docs.iter().map(|doc| from_doc(context, doc)).collect()
    }

    /// The record of kind `T` keyed `id`: kept by the embedded store (see
    /// `recent`) once read, until a write to it.
    async fn read_one<T>(&self, context: &str, id: T::Id) -> Result<Option<T>>
    where
        T: Kept + DeserializeOwned,
        T::Id: std::fmt::Display,
    {
        if let Some(record) = self.recent.as_ref().and_then(|recent| recent.kept::<T>(id)) {
            return Ok(Some(record));
        }
        let ticket = self.recent.as_ref().map(Recent::ticket);
        let mut vars = Variables::new();
        vars.insert("table", T::TABLE);
        vars.insert("id", id.to_string());
        let docs = self
            .doc_texts(
                context,
                "SELECT VALUE doc FROM type::record($table, $id);",
                &vars,
            )
            .await?;
        let Some(doc) = docs.first() else {
            return Ok(None);
        };
        let record: T = from_doc(context, doc)?;
        if let (Some(recent), Some(ticket)) = (&self.recent, ticket) {
            recent.fill(ticket, &record, doc.len());
        }
        Ok(Some(record))
    }

    /// The `doc` texts a `SELECT VALUE doc` returns, not yet parsed.
    async fn doc_texts(&self, context: &str, sql: &str, vars: &Variables) -> Result<Vec<String>> {
        let mut response = self.query(context, sql, vars).await?;
        response.take(0).map_err(|e| db_error(context, &e))
    }

    /// One page of a listing, newest first, and the total of every match.
    async fn page<T: DeserializeOwned>(
        &self,
        context: &str,
        listing: &Listing<'_>,
        mut vars: Variables,
        window: Window,
    ) -> Result<Page<T>> {
        let sql = page_sql(listing, window.after.is_some());
        // A task listing's page, or its total, may be kept (see `recent`):
        // then no query, or only the page's, is sent.
        let recent = self.recent.as_ref().filter(|_| listing.table == "task");
        let key = recent.map(|_| {
            format!(
                "{}\nlimit {} offset {} after {:?}",
                sql.page, window.limit, window.offset, window.after
            )
        });
        if let Some(kept) = recent.zip(key.as_deref()).and_then(|(r, key)| r.page(key)) {
            return parsed_page(context, &kept.docs, kept.total);
        }
        vars.insert("limit", to_i64(window.limit));
        vars.insert("offset", to_i64(window.offset));
        if let Some(after) = window.after {
            vars.insert("after", listing.order.cursor_value(&after));
        }
        let kept = recent.and_then(|recent| recent.total(&sql.count));
        let ticket = recent.map(Recent::ticket);
        let statements = match kept {
            Some(_) => sql.page.clone(),
            None => format!("{}\n{}", sql.page, sql.count),
        };
        let mut response = self.query(context, &statements, &vars).await?;
        let docs: Vec<String> = response.take(0).map_err(|e| db_error(context, &e))?;
        let total = match kept {
            Some(total) => total,
            None => {
                // `SELECT VALUE count()` without a WHERE answers an object,
                // not a number (SurrealDB 3.3): name the field and take it.
                let counts: Vec<i64> =
                    response.take((1, "n")).map_err(|e| db_error(context, &e))?;
                let total = counts.first().copied().unwrap_or(0).try_into().unwrap_or(0);
                if let (Some(recent), Some(ticket)) = (recent, ticket) {
                    recent.fill_total(ticket, &sql.count, total);
                }
                total
            }
        };
        let page = parsed_page(context, &docs, total)?;
        if let (Some(recent), Some(ticket), Some(key)) = (recent, ticket, key) {
            let docs = Arc::from(docs);
            recent.fill_page(ticket, key, KeptPage { docs, total });
        }
        Ok(page)
    }

    /// The stored version of a record, to tell `Conflict` from not found
    /// after a compare-and-set matched nothing.
    async fn stored_version(&self, table: &'static str, id: String) -> Result<Option<u64>> {
        let mut vars = Variables::new();
        vars.insert("table", table);
        vars.insert("id", id);
        let mut response = self
            .query(
                "read a version",
                "SELECT VALUE version FROM ONLY type::record($table, $id);",
                &vars,
            )
            .await?;
        let version: Option<i64> = response
            .take(0)
            .map_err(|e| db_error("read a version", &e))?;
        Ok(version.map(|v| v.try_into().unwrap_or(0)))
    }

    /// Why a compare-and-set on `table:id` that expected version
    /// `expected` matched nothing: `gone` if the record is not there,
    /// else `Conflict` naming `what` and the version found (the expected
    /// one if it changed and changed back meanwhile).
    async fn why_stale(
        &self,
        table: &'static str,
        what: &'static str,
        id: String,
        expected: u64,
        gone: Error,
    ) -> Result<Error> {
        Ok(match self.stored_version(table, id.clone()).await? {
            None => gone,
            Some(found) => Error::Conflict {
                what,
                id,
                expected,
                found,
            },
        })
    }
}

/// Applied and pending migrations without changing anything.
pub(crate) async fn schema_status(config: &StorageConfig) -> Result<SchemaStatus> {
    let target = Target::of(config)?;
    let location = format!(
        "{} (namespace {}, database {})",
        target.location, config.surrealdb.namespace, config.surrealdb.database
    );
    if let Some(dir) = &target.dir
        && !dir.exists()
    {
        // Opening would create the database: report a fresh one instead.
        return Ok(SchemaStatus {
            backend: target.name,
            location,
            entries: schema_migrations::status_of_nothing(schema_migrations::MIGRATIONS),
        });
    }
    let db = target.connect(config, false).await?;
    let entries = schema_migrations::status(
        &db,
        schema_migrations::MIGRATIONS,
        config.surrealdb.request_timeout,
    )
    .await;
    Ok(SchemaStatus {
        backend: target.name,
        location,
        entries: entries?,
    })
}

/// What a listing reads: a table, the conditions every match meets, the
/// index to read when SurrealDB would pick a worse one, and the field the
/// page is sorted by (newest first) and a keyset cursor bounds.
///
/// `table`, `conditions`, `page_only`, `index` and `order` are this
/// module's own text.
/// SurrealDB answers `count()` from an index (a COUNT index, or the index
/// keys without reading records) only when the WHERE is known as the query
/// is planned, so a condition that a count must match carries its value as
/// a literal: a task status's name, or a workflow's UUID, never user text.
/// Other conditions bind their values (`$name`).
pub(crate) struct Listing<'a> {
    pub(crate) table: &'a str,
    pub(crate) conditions: Vec<String>,
    /// A condition every record meets, on the page's statement only: it
    /// pins an index's leading field so that SurrealDB seeks the rest,
    /// and is left out of the total, which a WHERE-less count answers.
    pub(crate) page_only: Option<&'static str>,
    pub(crate) index: Option<&'static str>,
    pub(crate) order: Order,
}

/// The field a listing is sorted by, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// The record key, read backwards: record keys are UUIDv7s, which
    /// sort by creation. A cursor on it is a filter over the scan
    /// (SurrealDB 3 does not seek the record key), so its cost grows with
    /// how deep it is.
    Id,
    /// `newest_first` (migrations 0011 and 0013: the record key mirrored so
    /// that it sorts newest first), the last field of the index a task
    /// or workflow listing reads forwards, which a cursor seeks.
    NewestFirst,
}

impl Order {
    /// `ORDER BY` and the cursor's condition, on `$after`.
    fn sort_and_cursor(self, table: &str) -> (&'static str, String) {
        match self {
            Order::Id => ("id DESC", format!("id < type::record('{table}', $after)")),
            Order::NewestFirst => ("newest_first ASC", "newest_first > $after".to_owned()),
        }
    }

    /// The value `$after` takes for the cursor past the record keyed `key`.
    fn cursor_value(self, key: &str) -> String {
        match self {
            Order::Id => key.to_owned(),
            Order::NewestFirst => newest_first(key),
        }
    }
}

/// The two statements of a listing: the page, newest first, and the total
/// of the matches. With `after` (keyset paging), the page holds only
/// records older than the one whose key is `$after`; the total still
/// counts every match, so its WHERE stays the one a COUNT index answers.
pub(crate) fn page_sql(listing: &Listing<'_>, after: bool) -> ListingSql {
    let filter = |conditions: &[&str]| {
        if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        }
    };
    let table = listing.table;
    let mut matching: Vec<&str> = listing.conditions.iter().map(String::as_str).collect();
    let count_filter = filter(&matching);
    let (sort, cursor) = listing.order.sort_and_cursor(table);
    matching.extend(listing.page_only);
    if after {
        matching.push(&cursor);
    }
    let page_filter = filter(&matching);
    let with = listing
        .index
        .map(|i| format!("WITH INDEX {i} "))
        .unwrap_or_default();
    ListingSql {
        page: format!(
            "SELECT VALUE doc FROM {table} {with}{page_filter} ORDER BY {sort} LIMIT $limit START $offset;"
        ),
        count: format!("SELECT count() AS n FROM {table} {count_filter} GROUP ALL;"),
    }
}

/// A page of parsed documents, with the total of its listing.
fn parsed_page<T: DeserializeOwned>(context: &str, docs: &[String], total: u64) -> Result<Page<T>> {
    Ok(Page {
        items: docs
            .iter()
            .map(|doc| from_doc(context, doc))
            .collect::<Result<_>>()?,
        total: usize::try_from(total).unwrap_or(usize::MAX),
    })
}

/// A listing's two statements: its page, and its total.
pub(crate) struct ListingSql {
    pub(crate) page: String,
    pub(crate) count: String,
}

/// Which page of a listing: past the record keyed `after` (keyset
/// paging), less `offset` more, up to `limit`.
pub(crate) struct Window {
    pub(crate) after: Option<String>,
    pub(crate) limit: usize,
    pub(crate) offset: usize,
}

#[async_trait]
impl Backend for SurrealBackend {
    fn name(&self) -> &'static str {
        self.client.name
    }

    async fn health(&self) -> Result<()> {
        let db = self.client.handle()?;
        if self.client.link.down.load(Ordering::Acquire) {
            return Err(self.client.unavailable());
        }
        match tokio::time::timeout(PROBE_TIMEOUT, db.query("RETURN true;").into_future()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.client.mark_down(&db, e.message().to_owned())),
            Err(_) => Err(self.client.mark_down(
                &db,
                format!("no answer within {}s", PROBE_TIMEOUT.as_secs()),
            )),
        }
    }

    async fn close(&self) -> Result<()> {
        self.closing.send_replace(true);
        // Dropping the last handle shuts the embedded datastore down (in the
        // background) or closes the server connection.
        let db = self
            .client
            .db
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(db);
        // The embedded datastore shuts down in the background once the last
        // handle is gone; wait until it lets go of its files, so a caller
        // that reopens (a restart, `db status`) finds them free.
        if let Some(lock) = &self.engine_lock {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while is_held(lock) {
                if tokio::time::Instant::now() > deadline {
                    tracing::warn!(lock = %lock.display(), "the embedded database is still shutting down");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        tracing::info!(location = %self.client.location, "surrealdb storage closed");
        Ok(())
    }
}

/// An embedded store in `dir`, for this module's tests.
#[cfg(test)]
async fn open_embedded(dir: &std::path::Path) -> SurrealBackend {
    SurrealBackend::open(&StorageConfig {
        storage_type: crate::StorageType::SurrealdbEmbedded,
        data_dir: dir.to_path_buf(),
        surrealdb: crate::SurrealdbConfig::default(),
    })
    .await
    .unwrap()
}

/// A queued task of `workflow` that runs `noop.sh` once, for this
/// module's tests.
#[cfg(test)]
fn test_task(workflow: orchestrator_core::WorkflowId, name: String) -> orchestrator_core::Task {
    let spec = orchestrator_core::TaskSpec {
        name,
        script: "noop.sh".into(),
        input: serde_json::Value::Null,
        priority: orchestrator_core::Priority::Normal,
        max_attempts: 1,
        timeout: Duration::from_secs(10),
        check_mode: false,
        depends_on: vec![],
        step: Default::default(),
    };
    orchestrator_core::Task::new(workflow, spec, chrono::Utc::now())
}
