//! The SurrealDB backends: embedded (SurrealKV, or RocksDB with the
//! `surrealdb-rocksdb` feature, in `<data-dir>/surrealdb`) and a SurrealDB
//! server over WebSocket. One type serves both through the SDK's `any`
//! engine; only the endpoint and the sign-in differ.
//!
//! Each workflow and task is one record holding the whole object as JSON
//! (`doc`) plus the fields queries need (see `migrations/`). Every query
//! takes its values as bound parameters; the only text put together here is
//! the choice among fixed `WHERE` fragments.
//!
//! A server can go away while the service runs. The SDK re-dials it every
//! second and restores the session (sign-in, namespace, database). Every
//! call here has a deadline, so a worker never hangs on a dead server: it
//! gets [`Error::Unavailable`]. After such a failure, calls fail at once,
//! without queueing work for a server that is not there, while a probe
//! checks the server with exponential backoff (0.25 s, doubling, at most
//! 5 s) and lets calls through again as soon as it answers.

pub mod migrate;

use std::future::IntoFuture;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use orchestrator_core::{Node, Priority, Task, TaskId, TaskStatus, Workflow, WorkflowId};
use serde::Serialize;
use serde::de::DeserializeOwned;
use surrealdb::engine::any::{self, Any};
use surrealdb::opt::auth::Root;
use surrealdb::types::{AlreadyExistsError, Bytes, RecordId, SurrealValue, Variables};
use surrealdb::{IndexedResults, Surreal};

use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};

use crate::schema::{EntryState, SchemaStatus};
use crate::{
    AccessStore, AuditQuery, Backend, BulkTransfer, ChangeFeed, EmbeddedEngine, Error, LogChunk,
    LogPiece, NodeStore, Page, Record, RecordKind, Result, Scanned, StorageConfig, StorageType,
    TaskQuery, TaskStore, WorkflowQuery,
};

/// Transaction conflicts (two writers on one record) are retried this many
/// times; a compare-and-set then sees the winner's version and reports
/// `Conflict`.
const CONFLICT_RETRIES: u32 = 8;
/// Log chunks fetched per round trip when reading a log.
const LOG_CHUNKS_PER_READ: i64 = 256;
/// Logs read per request by `read_logs`.
const LOGS_PER_REQUEST: usize = 25;
/// The health probe's own deadline: `/health` should answer quickly.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const PROBE_BACKOFF_MIN: Duration = Duration::from_millis(250);
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(5);

pub struct SurrealBackend {
    name: &'static str,
    /// Where the data is, for messages: a directory, or the server URL.
    location: String,
    /// `None` once closed. A std lock: it is held only to clone the `Arc`.
    db: RwLock<Option<Arc<Surreal<Any>>>>,
    request_timeout: Duration,
    /// The embedded SurrealKV engine's lock file, which `close` waits on.
    engine_lock: Option<PathBuf>,
    /// Shared with the probe task, which outlives no one: it holds the
    /// client weakly and stops when the backend is dropped.
    link: Arc<Link>,
}

/// A store opened by [`SurrealBackend::open_read_only`], to be copied
/// from: its bulk reads, and nothing that writes.
pub struct SurrealSource(SurrealBackend);

#[async_trait]
impl BulkTransfer for SurrealSource {
    fn name(&self) -> &'static str {
        self.0.name
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        self.0.scan(kind, after, limit).await
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        self.0.fetch(kind, keys).await
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        self.0.count(kind).await
    }

    async fn import(&self, _: &[Record]) -> Result<()> {
        Err(Error::ReadOnly(self.0.location.clone()))
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        self.0.log_lengths(ids).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        self.0.read_logs(asks).await
    }

    async fn import_logs(&self, _: &[LogPiece]) -> Result<()> {
        Err(Error::ReadOnly(self.0.location.clone()))
    }

    async fn close(&self) -> Result<()> {
        Backend::close(&self.0).await
    }
}

/// Whether the server answered last time, and why not if it did not.
#[derive(Default)]
struct Link {
    down: AtomicBool,
    /// Set while a probe task runs, so there is only ever one.
    probing: AtomicBool,
    reason: Mutex<String>,
}

impl SurrealBackend {
    /// Connects (within `connect_timeout`), brings the schema up to date
    /// and returns the open backend.
    pub async fn open(config: &StorageConfig) -> Result<SurrealBackend> {
        SurrealBackend::open_with_migrations(config, migrate::MIGRATIONS).await
    }

    /// As [`SurrealBackend::open`], with another set of migrations: for
    /// tests of the migration rules.
    pub async fn open_with_migrations(
        config: &StorageConfig,
        migrations: &[migrate::Migration],
    ) -> Result<SurrealBackend> {
        let target = Target::of(config)?;
        let db = target.connect(config, true).await?;
        migrate::migrate(&db, migrations, config.surrealdb.request_timeout).await?;
        tracing::info!(
            backend = target.name,
            location = %target.location,
            namespace = %config.surrealdb.namespace,
            database = %config.surrealdb.database,
            "surrealdb storage opened"
        );
        Ok(SurrealBackend {
            name: target.name,
            location: target.location,
            db: RwLock::new(Some(Arc::new(db))),
            request_timeout: config.surrealdb.request_timeout,
            engine_lock: match (&target.dir, config.surrealdb.engine) {
                (Some(dir), EmbeddedEngine::SurrealKv) => Some(dir.join("LOCK")),
                _ => None,
            },
            link: Arc::new(Link::default()),
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
        let entries = migrate::status(&db, migrate::MIGRATIONS, timeout).await?;
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
            name: target.name,
            location: target.location,
            db: RwLock::new(Some(Arc::new(db))),
            request_timeout: timeout,
            engine_lock: match (&target.dir, config.surrealdb.engine) {
                (Some(dir), EmbeddedEngine::SurrealKv) => Some(dir.join("LOCK")),
                _ => None,
            },
            link: Arc::new(Link::default()),
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

    fn handle(&self) -> Result<Arc<Surreal<Any>>> {
        self.db
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::Closed)
    }

    fn unavailable(&self) -> Error {
        let reason = self.link.reason.lock().unwrap_or_else(|e| e.into_inner());
        Error::Unavailable(format!(
            "the SurrealDB {} at {} does not answer ({reason}); reconnecting",
            if self.name == "surrealdb-server" {
                "server"
            } else {
                "database"
            },
            self.location
        ))
    }

    /// Records that the database did not answer, and starts the probe that
    /// lets calls through again once it does.
    fn mark_down(&self, db: &Arc<Surreal<Any>>, reason: String) -> Error {
        *self.link.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason;
        if !self.link.down.swap(true, Ordering::AcqRel) {
            tracing::warn!(location = %self.location, "{}", self.unavailable());
        }
        if !self.link.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(probe(
                Arc::downgrade(db),
                Arc::clone(&self.link),
                self.location.clone(),
            ));
        }
        self.unavailable()
    }

    /// Runs one request: bound parameters, a deadline, conflict retries,
    /// and the first statement error turned into a storage error.
    async fn query(&self, context: &str, sql: &str, vars: &Variables) -> Result<IndexedResults> {
        let db = self.handle()?;
        if self.link.down.load(Ordering::Acquire) {
            return Err(self.unavailable());
        }
        let mut attempt = 0;
        loop {
            let request = db.query(sql).bind(vars.clone());
            let mut response =
                match tokio::time::timeout(self.request_timeout, request.into_future()).await {
                    Err(_) => {
                        return Err(self.mark_down(
                            &db,
                            format!("no answer within {}s", self.request_timeout.as_secs_f32()),
                        ));
                    }
                    Ok(Err(e)) if e.is_connection() => {
                        return Err(self.mark_down(&db, e.to_string()));
                    }
                    Ok(Err(e)) => return Err(db_error(context, &e)),
                    Ok(Ok(response)) => response,
                };
            match first_error(&mut response) {
                None => return Ok(response),
                Some(e) if is_retryable(&e) && attempt < CONFLICT_RETRIES => {
                    attempt += 1;
                    // Spread the retries of racing writers apart.
                    let jitter = rand_millis(5 << attempt.min(5));
                    tokio::time::sleep(Duration::from_millis(jitter)).await;
                }
                Some(e) => return Err(classify(context, e)),
            }
        }
    }

    async fn docs<T: DeserializeOwned>(
        &self,
        context: &str,
        sql: &str,
        vars: &Variables,
    ) -> Result<Vec<T>> {
        let mut response = self.query(context, sql, vars).await?;
        let docs: Vec<String> = response.take(0).map_err(|e| db_error(context, &e))?;
        docs.iter().map(|doc| from_doc(context, doc)).collect()
    }

    async fn page<T: DeserializeOwned>(
        &self,
        context: &str,
        table: &str,
        conditions: &[&str],
        mut vars: Variables,
        limit: usize,
        offset: usize,
    ) -> Result<Page<T>> {
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        // `table` and `conditions` are constants of this module; every
        // value is a bound parameter.
        let sql = format!(
            "SELECT VALUE doc FROM {table} {filter} ORDER BY id DESC LIMIT $limit START $offset;
             SELECT count() AS n FROM {table} {filter} GROUP ALL;"
        );
        vars.insert("limit", to_i64(limit));
        vars.insert("offset", to_i64(offset));
        let mut response = self.query(context, &sql, &vars).await?;
        let docs: Vec<String> = response.take(0).map_err(|e| db_error(context, &e))?;
        // `SELECT VALUE count()` without a WHERE answers an object, not a
        // number (SurrealDB 3.3): name the field and take it.
        let counts: Vec<i64> = response.take((1, "n")).map_err(|e| db_error(context, &e))?;
        Ok(Page {
            items: docs
                .iter()
                .map(|doc| from_doc(context, doc))
                .collect::<Result<_>>()?,
            total: counts.first().copied().unwrap_or(0).try_into().unwrap_or(0),
        })
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
}

/// Checks the server until it answers, waiting longer after each failure.
async fn probe(db: Weak<Surreal<Any>>, link: Arc<Link>, location: String) {
    let mut delay = PROBE_BACKOFF_MIN;
    loop {
        tokio::time::sleep(delay).await;
        let Some(db) = db.upgrade() else {
            break;
        };
        let answered = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, db.query("RETURN true;").into_future()).await,
            Ok(Ok(_))
        );
        if answered {
            link.down.store(false, Ordering::Release);
            tracing::info!(%location, "surrealdb answers again");
            break;
        }
        delay = (delay * 2).min(PROBE_BACKOFF_MAX);
    }
    link.probing.store(false, Ordering::Release);
}

/// Where a config points, before connecting.
struct Target {
    name: &'static str,
    endpoint: String,
    /// For messages and logs: never includes the password.
    location: String,
    remote: bool,
    /// The embedded engine's directory, created before connecting.
    dir: Option<PathBuf>,
}

impl Target {
    fn of(config: &StorageConfig) -> Result<Target> {
        let surreal = &config.surrealdb;
        check_name("--surrealdb-namespace", &surreal.namespace)?;
        check_name("--surrealdb-database", &surreal.database)?;
        match config.storage_type {
            StorageType::SurrealdbEmbedded => {
                let base = std::path::absolute(&config.data_dir).map_err(|e| {
                    Error::io(format!("--data-dir {}", config.data_dir.display()), e)
                })?;
                let dir = base.join(surreal.engine.dir_name());
                let scheme = match surreal.engine {
                    EmbeddedEngine::SurrealKv => "surrealkv",
                    EmbeddedEngine::RocksDb if cfg!(feature = "surrealdb-rocksdb") => "rocksdb",
                    EmbeddedEngine::RocksDb => {
                        return Err(Error::BackendNotCompiled {
                            backend: "surrealdb-embedded with the rocksdb engine",
                            feature: "surrealdb-rocksdb",
                        });
                    }
                };
                Ok(Target {
                    name: "surrealdb-embedded",
                    endpoint: format!("{scheme}://{}", dir.display()),
                    location: dir.display().to_string(),
                    remote: false,
                    dir: Some(dir),
                })
            }
            StorageType::SurrealdbServer => {
                let url = surreal.url.trim();
                if !(url.starts_with("ws://") || url.starts_with("wss://"))
                    || url.len() <= "wss://".len()
                {
                    return Err(Error::Config(format!(
                        "--surrealdb-url `{url}`: expected ws://host:port or wss://host:port"
                    )));
                }
                Ok(Target {
                    name: "surrealdb-server",
                    endpoint: url.to_owned(),
                    location: url.to_owned(),
                    remote: true,
                    dir: None,
                })
            }
            StorageType::Filesystem => Err(Error::Config(
                "the filesystem backend is not a SurrealDB backend".into(),
            )),
        }
    }

    /// Connects, signs in (server only) and selects the namespace and
    /// database, creating them if `create` is set, all within the connect
    /// timeout.
    async fn connect(&self, config: &StorageConfig, create: bool) -> Result<Surreal<Any>> {
        let surreal = &config.surrealdb;
        if let Some(dir) = &self.dir
            && let Some(parent) = dir.parent()
        {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("create data dir {}", parent.display()), e))?;
        }
        let timeout = surreal.connect_timeout;
        let work = async {
            let db = self.open_engine().await?;
            if self.remote {
                db.signin(Root {
                    username: surreal.username.clone(),
                    password: surreal.password.expose().to_owned(),
                })
                .await
                .map_err(|e| Error::SignIn {
                    location: self.location.clone(),
                    username: surreal.username.clone(),
                    reason: e.message().to_owned(),
                })?;
            }
            if create {
                // Names were checked to be plain identifiers, so they can
                // stand in the statement.
                let sql = format!(
                    "DEFINE NAMESPACE IF NOT EXISTS `{ns}`; USE NS `{ns}`; DEFINE DATABASE IF NOT EXISTS `{db}`;",
                    ns = surreal.namespace,
                    db = surreal.database
                );
                let mut response = db
                    .query(sql)
                    .await
                    .map_err(|e| db_error("create the namespace and database", &e))?;
                if let Some(e) = first_error(&mut response) {
                    return Err(db_error("create the namespace and database", &e));
                }
            }
            db.use_ns(surreal.namespace.clone())
                .use_db(surreal.database.clone())
                .await
                .map_err(|e| db_error("select the namespace and database", &e))?;
            Ok(db)
        };
        match tokio::time::timeout(timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(Error::Unavailable(format!(
                "cannot connect to the SurrealDB {} at {}: no answer within {}s",
                if self.remote { "server" } else { "database" },
                self.location,
                timeout.as_secs_f32()
            ))),
        }
    }

    async fn open_engine(&self) -> Result<Surreal<Any>> {
        // The embedded engine's lock outlives a closed handle by a moment
        // (the datastore shuts down in the background), so a reopen in the
        // same process retries briefly before calling the directory taken.
        let mut attempts = 0;
        loop {
            match any::connect(self.endpoint.as_str()).await {
                Ok(db) => return Ok(db),
                Err(e) if !self.remote && is_locked(&e) && attempts < 40 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) if !self.remote && is_locked(&e) => {
                    return Err(Error::Unavailable(format!(
                        "{} is in use by another process ({}); stop the orchestrator \
                         that has it open first",
                        self.location,
                        e.message()
                    )));
                }
                Err(e) => {
                    return Err(Error::Unavailable(format!(
                        "cannot connect to the SurrealDB {} at {}: {}",
                        if self.remote { "server" } else { "database" },
                        self.location,
                        e.message()
                    )));
                }
            }
        }
    }
}

/// Whether someone holds SurrealKV's advisory lock (`flock`) on `path`.
fn is_held(path: &std::path::Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    match file.try_lock() {
        // Ours only for this instant: released when `file` is dropped.
        Ok(()) => false,
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

fn is_locked(e: &surrealdb::Error) -> bool {
    let message = e.message().to_lowercase();
    message.contains("lock") && !message.contains("deadlock")
}

/// Namespace and database names go into `DEFINE` statements, which take no
/// parameters: only plain identifiers are accepted.
fn check_name(setting: &str, value: &str) -> Result<()> {
    let plain = !value.is_empty()
        && value.len() <= 64
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "{setting} `{value}`: expected 1 to 64 letters, digits, `_` or `-`"
        )))
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
            entries: migrate::status_of_nothing(migrate::MIGRATIONS),
        });
    }
    let db = target.connect(config, false).await?;
    let entries = migrate::status(&db, migrate::MIGRATIONS, config.surrealdb.request_timeout).await;
    Ok(SchemaStatus {
        backend: target.name,
        location,
        entries: entries?,
    })
}

/// Awaits a request within `timeout`, mapping transport failures.
pub(crate) async fn timed(
    timeout: Duration,
    request: impl IntoFuture<Output = surrealdb::Result<IndexedResults>>,
) -> Result<IndexedResults> {
    match tokio::time::timeout(timeout, request.into_future()).await {
        Err(_) => Err(Error::Unavailable(format!(
            "the database did not answer within {}s",
            timeout.as_secs_f32()
        ))),
        Ok(Err(e)) if e.is_connection() => Err(Error::Unavailable(e.message().to_owned())),
        Ok(Err(e)) => Err(db_error("run a query", &e)),
        Ok(Ok(response)) => Ok(response),
    }
}

/// The error that made a request fail. In a transaction every statement
/// reports an error, but only one is the cause; the others say they were
/// not executed because of it.
pub(crate) fn first_error(response: &mut IndexedResults) -> Option<surrealdb::Error> {
    let mut errors: Vec<(usize, surrealdb::Error)> = response.take_errors().into_iter().collect();
    errors.sort_by_key(|(index, _)| *index);
    // Statements after a failed one are "not executed", and a COMMIT after
    // it "aborted": consequences. A COMMIT that failed by itself (a write
    // conflict found at commit, as between two writers of one workflow) is
    // the cause, and must not hide behind the "not executed" rows before it.
    let is_consequence = |e: &surrealdb::Error| {
        let message = e.message();
        message.contains("not executed")
            || (message.contains("Cannot COMMIT") && message.contains("aborted"))
    };
    match errors.iter().position(|(_, e)| !is_consequence(e)) {
        Some(cause) => Some(errors.swap_remove(cause).1),
        None => errors.into_iter().next().map(|(_, e)| e),
    }
}

pub(crate) fn db_error(context: &str, e: &surrealdb::Error) -> Error {
    Error::Database {
        context: context.to_owned(),
        message: e.message().to_owned(),
    }
}

fn is_retryable(e: &surrealdb::Error) -> bool {
    let message = e.message();
    // A conflict inside a statement says "can be retried"; one found when
    // the transaction commits comes as "Cannot COMMIT: Transaction
    // conflict: ...". Retrying re-runs every check (a compare-and-set then
    // sees the winner's version), so it is always safe.
    message.contains("can be retried") || message.contains("Transaction conflict")
}

/// A statement error as the storage error the trait promises.
fn classify(context: &str, e: surrealdb::Error) -> Error {
    let message = e.message();
    if let Some(AlreadyExistsError::Record { id }) = e.already_exists_details() {
        // `task:⟨0190…⟩` or task:`0190…`: the table, then the key as printed.
        let (table, key) = id.split_once(':').unwrap_or((id.as_str(), ""));
        let key = key
            .trim_matches(|c| matches!(c, '`' | '⟨' | '⟩'))
            .to_owned();
        match table {
            "task" => {
                return Error::AlreadyExists {
                    what: "task",
                    id: key,
                };
            }
            "workflow" => {
                return Error::AlreadyExists {
                    what: "workflow",
                    id: key,
                };
            }
            _ => {}
        }
    }
    // "Database index `workflow_idempotency_key` already contains 'k', with record ..."
    if message.contains("already contains") {
        let value = message
            .split("already contains ")
            .nth(1)
            .and_then(|rest| rest.split(", with record").next())
            .unwrap_or("")
            .trim_matches('\'')
            .to_owned();
        if message.contains("`workflow_idempotency_key`") {
            return Error::AlreadyExists {
                what: "idempotency key",
                id: value,
            };
        }
        if message.contains("`workflow_revision`") {
            return Error::AlreadyExists {
                what: "workflow revision",
                id: value,
            };
        }
    }
    if is_retryable(&e) {
        return Error::Unavailable(format!(
            "{context}: too many concurrent writers on one record ({message})"
        ));
    }
    db_error(context, &e)
}

fn from_doc<T: DeserializeOwned>(context: &str, doc: &str) -> Result<T> {
    serde_json::from_str(doc).map_err(|e| Error::Database {
        context: context.to_owned(),
        message: format!("unreadable stored record: {e}"),
    })
}

fn to_doc(value: &impl Serialize) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| Error::io("serialize record", std::io::Error::other(e)))
}

/// The table that holds records of `kind`.
fn table_of(kind: RecordKind) -> &'static str {
    match kind {
        RecordKind::Workflow => "workflow",
        RecordKind::Task => "task",
        RecordKind::Token => "api_token",
        RecordKind::Secret => "secret",
        RecordKind::Audit => "audit",
    }
}

/// Whether a record key is made of plain characters only (ids, names),
/// so that it can stand inside `⟨…⟩` in a statement.
fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The stored row of any record: `doc` and the fields queries need.
fn row_of(record: &Record) -> Result<serde_json::Value> {
    match record {
        Record::Workflow(w) => workflow_row(w, false),
        Record::Task(t) => task_row(t, false),
        Record::Token(t) => Ok(serde_json::json!({"doc": to_doc(t)?})),
        Record::Secret(s) => Ok(serde_json::json!({"doc": to_doc(s)?})),
        Record::Audit(a) => {
            let mut row = serde_json::json!({
                "doc": to_doc(a)?,
                "time_ms": a.time.timestamp_millis(),
                "actor": a.actor,
                "action": a.action,
            });
            if let Some(target) = &a.target {
                row["target"] = target.clone().into();
            }
            Ok(row)
        }
    }
}

/// Appends to `data` the bytes of `chunks` (`[start, end, bytes]`, in
/// order) from offset `from`, up to `max_bytes` in all; returns the offset
/// reached.
fn gather_log(
    chunks: Vec<(i64, i64, Bytes)>,
    mut from: u64,
    max_bytes: usize,
    data: &mut Vec<u8>,
) -> u64 {
    for (start, end, bytes) in chunks {
        let start = u64::try_from(start).unwrap_or(0);
        let skip = usize::try_from(from.saturating_sub(start)).unwrap_or(usize::MAX);
        let rest = bytes.get(skip.min(bytes.len())..).unwrap_or_default();
        let take = rest.len().min(max_bytes - data.len());
        data.extend_from_slice(&rest[..take]);
        from = u64::try_from(end).unwrap_or(from);
        if data.len() >= max_bytes {
            break;
        }
    }
    from
}

/// A `log_chunk` row of a bulk log import.
#[derive(SurrealValue)]
#[surreal(crate = "surrealdb::types")]
struct LogChunkRow {
    task: String,
    start_offset: i64,
    end_offset: i64,
    data: Bytes,
}

/// A `log_length` row of a bulk log import.
#[derive(SurrealValue)]
#[surreal(crate = "surrealdb::types")]
struct LogLengthRow {
    id: RecordId,
    bytes: i64,
}

fn version_param(version: u64) -> i64 {
    i64::try_from(version).unwrap_or(i64::MAX)
}

fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn priority_rank(priority: Priority) -> i64 {
    Priority::ALL
        .iter()
        .position(|p| *p == priority)
        .map_or(0, to_i64)
}

/// A few milliseconds of jitter; exactness does not matter, so no RNG
/// dependency: the clock's nanoseconds will do.
fn rand_millis(max: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()));
    1 + nanos % max.max(1)
}

/// The record for a task: the query fields and the whole task as `doc`.
fn task_row(task: &Task, with_id: bool) -> Result<serde_json::Value> {
    let mut row = serde_json::json!({
        "doc": to_doc(task)?,
        "version": task.version,
        "workflow": task.workflow_id.to_string(),
        "status": task.status.as_str(),
        "priority": priority_rank(task.priority),
    });
    if with_id {
        row["id"] = task.id.to_string().into();
    }
    Ok(row)
}

fn workflow_row(workflow: &Workflow, with_id: bool) -> Result<serde_json::Value> {
    let mut row = serde_json::json!({
        "doc": to_doc(workflow)?,
        "version": workflow.version,
        "status": workflow.status.as_str(),
        "kind": workflow.kind,
        "priority": priority_rank(workflow.priority),
        "revision": workflow.revision,
    });
    // Absent, not null: an `option<string>` field holds NONE, which the
    // unique indexes ignore.
    for (field, value) in [
        ("reference", &workflow.reference),
        ("trace_id", &workflow.trace_id),
        ("idempotency_key", &workflow.idempotency_key),
    ] {
        if let Some(value) = value {
            row[field] = value.clone().into();
        }
    }
    if with_id {
        row["id"] = workflow.id.to_string().into();
    }
    Ok(row)
}

#[async_trait]
impl Backend for SurrealBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn health(&self) -> Result<()> {
        let db = self.handle()?;
        if self.link.down.load(Ordering::Acquire) {
            return Err(self.unavailable());
        }
        match tokio::time::timeout(PROBE_TIMEOUT, db.query("RETURN true;").into_future()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(self.mark_down(&db, e.message().to_owned())),
            Err(_) => Err(self.mark_down(
                &db,
                format!("no answer within {}s", PROBE_TIMEOUT.as_secs()),
            )),
        }
    }

    async fn close(&self) -> Result<()> {
        // Dropping the last handle shuts the embedded datastore down (in the
        // background) or closes the server connection.
        let db = self.db.write().unwrap_or_else(|e| e.into_inner()).take();
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
        tracing::info!(location = %self.location, "surrealdb storage closed");
        Ok(())
    }
}

#[async_trait]
impl TaskStore for SurrealBackend {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("workflow", workflow_row(workflow, true)?);
        vars.insert(
            "tasks",
            serde_json::Value::Array(
                tasks
                    .iter()
                    .map(|t| task_row(t, true))
                    .collect::<Result<_>>()?,
            ),
        );
        // One transaction: all of it or none. The record ids and the unique
        // indexes refuse duplicates, and `classify` says which.
        self.query(
            "insert a workflow",
            "BEGIN;
             INSERT INTO workflow $workflow;
             INSERT INTO task $tasks;
             COMMIT;",
            &vars,
        )
        .await?;
        Ok(())
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        let mut stored = workflow.clone();
        stored.version += 1;
        let mut vars = Variables::new();
        vars.insert("id", workflow.id.to_string());
        vars.insert("expected", version_param(workflow.version));
        vars.insert("row", workflow_row(&stored, false)?);
        vars.insert(
            "tasks",
            serde_json::Value::Array(
                new_tasks
                    .iter()
                    .map(|t| task_row(t, true))
                    .collect::<Result<_>>()?,
            ),
        );
        // The compare-and-set and the new tasks commit together; a stale
        // version aborts the transaction, so no task is added.
        let result = self
            .query(
                "update a workflow",
                "BEGIN;
                 LET $updated = (UPDATE type::record('workflow', $id) CONTENT $row
                     WHERE version = $expected RETURN VALUE version);
                 IF array::len($updated) == 0 { THROW 'orchestrator: version mismatch' };
                 INSERT INTO task $tasks;
                 COMMIT;",
                &vars,
            )
            .await;
        match result {
            Ok(_) => Ok(stored),
            Err(Error::Database { message, .. }) if message.contains("version mismatch") => {
                match self
                    .stored_version("workflow", workflow.id.to_string())
                    .await?
                {
                    None => Err(Error::WorkflowNotFound(workflow.id)),
                    Some(found) => Err(Error::Conflict {
                        what: "workflow",
                        id: workflow.id.to_string(),
                        expected: workflow.version,
                        found,
                    }),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        let mut stored = task.clone();
        stored.version += 1;
        let mut vars = Variables::new();
        vars.insert("id", task.id.to_string());
        vars.insert("expected", version_param(task.version));
        vars.insert("row", task_row(&stored, false)?);
        let mut response = self
            .query(
                "update a task",
                "UPDATE type::record('task', $id) CONTENT $row WHERE version = $expected RETURN VALUE version;",
                &vars,
            )
            .await?;
        let updated: Vec<i64> = response
            .take(0)
            .map_err(|e| db_error("update a task", &e))?;
        if !updated.is_empty() {
            return Ok(stored);
        }
        match self.stored_version("task", task.id.to_string()).await? {
            None => Err(Error::TaskNotFound(task.id)),
            Some(found) => Err(Error::Conflict {
                what: "task",
                id: task.id.to_string(),
                expected: task.version,
                found,
            }),
        }
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>> {
        let mut vars = Variables::new();
        vars.insert("id", id.to_string());
        let tasks = self
            .docs(
                "read a task",
                "SELECT VALUE doc FROM type::record('task', $id);",
                &vars,
            )
            .await?;
        Ok(tasks.into_iter().next())
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        let mut conditions = Vec::new();
        let mut vars = Variables::new();
        if let Some(workflow) = query.workflow {
            conditions.push("workflow = $workflow");
            vars.insert("workflow", workflow.to_string());
        }
        if let Some(status) = query.status {
            conditions.push("status = $status");
            vars.insert("status", status.as_str());
        }
        self.page(
            "list tasks",
            "task",
            &conditions,
            vars,
            query.limit,
            query.offset,
        )
        .await
    }

    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        let mut vars = Variables::new();
        vars.insert("workflow", id.to_string());
        let tasks: Vec<Task> = self
            .docs(
                "read a workflow's tasks",
                "SELECT VALUE doc FROM task WHERE workflow = $workflow ORDER BY id ASC;",
                &vars,
            )
            .await?;
        Ok(tasks.into_iter().map(Arc::new).collect())
    }

    async fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        let unfinished: Vec<String> = TaskStatus::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| s.as_str().to_owned())
            .collect();
        let mut vars = Variables::new();
        vars.insert("statuses", unfinished);
        self.docs(
            "read unfinished tasks",
            "SELECT VALUE doc FROM task WHERE status IN $statuses ORDER BY id ASC;",
            &vars,
        )
        .await
    }

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>> {
        let mut vars = Variables::new();
        vars.insert("id", id.to_string());
        let workflows = self
            .docs(
                "read a workflow",
                "SELECT VALUE doc FROM type::record('workflow', $id);",
                &vars,
            )
            .await?;
        Ok(workflows.into_iter().next())
    }

    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        let mut conditions = Vec::new();
        let mut vars = Variables::new();
        if let Some(status) = query.status {
            conditions.push("status = $status");
            vars.insert("status", status.as_str());
        }
        let text_filters = [
            ("kind = $kind", "kind", &query.kind),
            ("reference = $reference", "reference", &query.reference),
            ("trace_id = $trace_id", "trace_id", &query.trace_id),
            (
                "idempotency_key = $idempotency_key",
                "idempotency_key",
                &query.idempotency_key,
            ),
        ];
        for (condition, name, value) in text_filters {
            if let Some(value) = value {
                conditions.push(condition);
                vars.insert(name, value.clone());
            }
        }
        self.page(
            "list workflows",
            "workflow",
            &conditions,
            vars,
            query.limit,
            query.offset,
        )
        .await
    }

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64> {
        let mut vars = Variables::new();
        vars.insert("task", id.to_string());
        vars.insert("len", to_i64(chunk.len()));
        vars.insert("data", Bytes::from(chunk.to_vec()));
        // Raising the length and writing the chunk commit together, so
        // chunks never overlap and the length never runs ahead of them.
        // The raised length is the answer: no read of its own. An empty
        // chunk writes nothing and reads the length.
        let sql = if chunk.is_empty() {
            "SELECT VALUE bytes FROM ONLY type::record('log_length', $task);"
        } else {
            "BEGIN;
             LET $end = (UPSERT ONLY type::record('log_length', $task) SET bytes += $len RETURN VALUE bytes);
             CREATE log_chunk SET task = $task, start_offset = $end - $len, end_offset = $end, data = $data RETURN NONE;
             RETURN $end;
             COMMIT;"
        };
        let mut response = self.query("append to a task log", sql, &vars).await?;
        // The answer of `RETURN $end`: `BEGIN` counts as statement 0.
        let at = if chunk.is_empty() { 0 } else { 3 };
        let length: Option<i64> = response
            .take(at)
            .map_err(|e| db_error("append to a task log", &e))?;
        Ok(length.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        let mut data = Vec::new();
        let mut from = offset;
        while data.len() < max_bytes {
            let mut vars = Variables::new();
            vars.insert("task", id.to_string());
            vars.insert("from", i64::try_from(from).unwrap_or(i64::MAX));
            vars.insert("limit", LOG_CHUNKS_PER_READ);
            let mut response = self
                .query(
                    "read a task log",
                    "SELECT VALUE [start_offset, end_offset, data] FROM log_chunk
                     WHERE task = $task AND end_offset > $from ORDER BY end_offset ASC LIMIT $limit;",
                    &vars,
                )
                .await?;
            let chunks: Vec<(i64, i64, Bytes)> = response
                .take(0)
                .map_err(|e| db_error("read a task log", &e))?;
            let n_chunks = chunks.len();
            from = gather_log(chunks, from, max_bytes, &mut data);
            if n_chunks < LOG_CHUNKS_PER_READ as usize {
                break;
            }
        }
        Ok(LogChunk {
            next_offset: offset + data.len() as u64,
            data,
        })
    }
}

#[async_trait]
impl NodeStore for SurrealBackend {
    fn shared(&self) -> bool {
        self.name == "surrealdb-server"
    }

    async fn heartbeat(&self, node: &Node) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("id", node.id.clone());
        vars.insert(
            "doc",
            serde_json::to_string(node)
                .map_err(|e| Error::io("serialize a node", std::io::Error::other(e)))?,
        );
        self.query(
            "record a heartbeat",
            "UPSERT type::record('node', $id) CONTENT { doc: $doc };",
            &vars,
        )
        .await?;
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<Node>> {
        self.docs(
            "list nodes",
            "SELECT VALUE doc FROM node ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    /// Phase 1: no feed yet; every node polls the shared store.
    fn changes(&self) -> Option<ChangeFeed> {
        None
    }
}

#[async_trait]
impl AccessStore for SurrealBackend {
    async fn put_token(&self, token: &ApiToken) -> Result<()> {
        self.upsert(&Record::Token(token.clone()), "store a token")
            .await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>> {
        self.docs(
            "list tokens",
            "SELECT VALUE doc FROM api_token ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.upsert(&Record::Secret(secret.clone()), "store a secret")
            .await
    }

    async fn delete_secret(&self, name: &str) -> Result<bool> {
        let mut vars = Variables::new();
        vars.insert("name", name.to_owned());
        let mut response = self
            .query(
                "delete a secret",
                "DELETE type::record('secret', $name) RETURN BEFORE;",
                &vars,
            )
            .await?;
        let deleted: Vec<serde_json::Value> = response
            .take(0)
            .map_err(|e| db_error("delete a secret", &e))?;
        Ok(!deleted.is_empty())
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        self.docs(
            "list secrets",
            "SELECT VALUE doc FROM secret ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    async fn append_audit(&self, record: &AuditRecord) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("id", record.id.clone());
        vars.insert("row", row_of(&Record::Audit(record.clone()))?);
        self.query(
            "append an audit record",
            "CREATE type::record('audit', $id) CONTENT $row;",
            &vars,
        )
        .await?;
        Ok(())
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        let mut conditions = Vec::new();
        let mut vars = Variables::new();
        if let Some(since) = query.since {
            conditions.push("time_ms >= $since");
            vars.insert("since", since.timestamp_millis());
        }
        if let Some(until) = query.until {
            conditions.push("time_ms < $until");
            vars.insert("until", until.timestamp_millis());
        }
        let text_filters = [
            ("actor = $actor", "actor", &query.actor),
            ("action = $action", "action", &query.action),
            ("target = $target", "target", &query.target),
        ];
        for (condition, name, value) in text_filters {
            if let Some(value) = value {
                conditions.push(condition);
                vars.insert(name, value.clone());
            }
        }
        self.page(
            "list audit records",
            "audit",
            &conditions,
            vars,
            query.limit,
            query.offset,
        )
        .await
    }
}

#[async_trait]
impl BulkTransfer for SurrealBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        let table = table_of(kind);
        // The range is put together from a table constant and a key of
        // plain characters only, so nothing else reaches the statement. A
        // range over record ids is a key scan, not a table scan.
        let from = match after {
            None => table.to_owned(),
            Some(key) if is_plain_key(key) => format!("{table}:⟨{key}⟩>.."),
            // Every key stored here is plain; anything else sorts after them.
            Some(_) => return Ok(Vec::new()),
        };
        let mut vars = Variables::new();
        vars.insert("limit", to_i64(limit));
        let sql =
            format!("SELECT VALUE [record::id(id), doc] FROM {from} ORDER BY id LIMIT $limit;");
        let mut response = self.query("scan records", &sql, &vars).await?;
        let rows: Vec<(String, String)> =
            response.take(0).map_err(|e| db_error("scan records", &e))?;
        Ok(Self::scanned(kind, rows))
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        let table = table_of(kind);
        let ids: Vec<RecordId> = keys
            .iter()
            .filter(|k| is_plain_key(k))
            .map(|k| RecordId::new(table, k.clone()))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut vars = Variables::new();
        vars.insert("ids", ids);
        let mut response = self
            .query(
                "fetch records",
                "SELECT VALUE [record::id(id), doc] FROM $ids WHERE id != NONE;",
                &vars,
            )
            .await?;
        let rows: Vec<(String, String)> = response
            .take(0)
            .map_err(|e| db_error("fetch records", &e))?;
        Ok(Self::scanned(kind, rows))
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        let sql = format!("SELECT count() AS n FROM {} GROUP ALL;", table_of(kind));
        let mut response = self.query("count records", &sql, &Variables::new()).await?;
        let counts: Vec<i64> = response
            .take((0, "n"))
            .map_err(|e| db_error("count records", &e))?;
        Ok(counts.first().copied().unwrap_or(0).try_into().unwrap_or(0))
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        // One bulk `INSERT` per table: statements evaluated per record (a
        // `FOR` over the rows, `UPSERT` each) cost SurrealDB far more than
        // the writes themselves. `INSERT` refuses a key that exists, so
        // whatever the target holds under these keys is deleted first, in
        // the same transaction: the records are replaced whole, as stored.
        let mut by_table: std::collections::BTreeMap<
            &'static str,
            (Vec<RecordId>, Vec<serde_json::Value>),
        > = Default::default();
        for record in records {
            let table = table_of(record.kind());
            let key = record.key();
            let mut row = row_of(record)?;
            row["id"] = key.clone().into();
            let (ids, rows) = by_table.entry(table).or_default();
            ids.push(RecordId::new(table, key));
            rows.push(row);
        }
        let mut vars = Variables::new();
        // Table names are constants of this module; the rows are bound.
        let mut sql = String::from("BEGIN;\n");
        for (table, (ids, rows)) in by_table {
            sql.push_str(&format!(
                "DELETE ${table}_ids RETURN NONE;\nINSERT INTO {table} ${table}_rows RETURN NONE;\n"
            ));
            vars.insert(format!("{table}_ids"), ids);
            vars.insert(format!("{table}_rows"), serde_json::Value::Array(rows));
        }
        sql.push_str("COMMIT;");
        self.query("import records", &sql, &vars).await?;
        Ok(())
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut vars = Variables::new();
        vars.insert(
            "ids",
            ids.iter()
                .map(|id| RecordId::new("log_length", id.to_string()))
                .collect::<Vec<_>>(),
        );
        let mut response = self
            .query(
                "read log lengths",
                "SELECT VALUE [record::id(id), bytes] FROM $ids WHERE id != NONE;",
                &vars,
            )
            .await?;
        let rows: Vec<(String, i64)> = response
            .take(0)
            .map_err(|e| db_error("read log lengths", &e))?;
        let lengths: std::collections::HashMap<String, i64> = rows.into_iter().collect();
        Ok(ids
            .iter()
            .map(|id| {
                lengths
                    .get(&id.to_string())
                    .map_or(0, |n| u64::try_from(*n).unwrap_or(0))
            })
            .collect())
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        // A few logs per request, one statement each: each reads by the
        // index on (task, end_offset), and none pays a round trip of its
        // own. Not all in one request: every statement of a request sees
        // all of its bound parameters, so a request's cost grows with the
        // square of its statements. An answer cut short by the chunk limit
        // is read on by the caller.
        let mut answers = Vec::with_capacity(asks.len());
        for group in asks.chunks(LOGS_PER_REQUEST) {
            let mut vars = Variables::new();
            vars.insert("limit", LOG_CHUNKS_PER_READ);
            let mut sql = String::new();
            for (i, &(id, offset, _)) in group.iter().enumerate() {
                sql.push_str(&format!(
                    "SELECT VALUE [start_offset, end_offset, data] FROM log_chunk \
                     WHERE task = $t{i} AND end_offset > $f{i} ORDER BY end_offset ASC LIMIT $limit;\n"
                ));
                vars.insert(format!("t{i}"), id.to_string());
                vars.insert(format!("f{i}"), i64::try_from(offset).unwrap_or(i64::MAX));
            }
            let mut response = self.query("read task logs", &sql, &vars).await?;
            for (i, &(_, offset, max_bytes)) in group.iter().enumerate() {
                let chunks: Vec<(i64, i64, Bytes)> = response
                    .take(i)
                    .map_err(|e| db_error("read task logs", &e))?;
                let mut data = Vec::new();
                gather_log(chunks, offset, max_bytes, &mut data);
                answers.push(LogChunk {
                    next_offset: offset + data.len() as u64,
                    data,
                });
            }
        }
        Ok(answers)
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        let pieces: Vec<&LogPiece> = pieces.iter().filter(|p| !p.data.is_empty()).collect();
        if pieces.is_empty() {
            return Ok(());
        }
        // Per task: the length its log must have now (its first piece's
        // offset) and the length it will have. Pieces of a task that do
        // not follow each other would leave a gap or an overlap.
        let mut tasks: Vec<(TaskId, u64, u64)> = Vec::new();
        let mut index: std::collections::HashMap<TaskId, usize> = Default::default();
        let mut chunks = Vec::with_capacity(pieces.len());
        for piece in &pieces {
            let end = piece.offset + piece.data.len() as u64;
            match index.get(&piece.task) {
                Some(&i) if tasks[i].2 != piece.offset => {
                    return Err(Error::Conflict {
                        what: "task log",
                        id: piece.task.to_string(),
                        expected: piece.offset,
                        found: tasks[i].2,
                    });
                }
                Some(&i) => tasks[i].2 = end,
                None => {
                    index.insert(piece.task, tasks.len());
                    tasks.push((piece.task, piece.offset, end));
                }
            }
            chunks.push(LogChunkRow {
                task: piece.task.to_string(),
                start_offset: i64::try_from(piece.offset).unwrap_or(i64::MAX),
                end_offset: i64::try_from(end).unwrap_or(i64::MAX),
                data: Bytes::from(piece.data.clone()),
            });
        }
        let ids: Vec<RecordId> = tasks
            .iter()
            .map(|(task, _, _)| RecordId::new("log_length", task.to_string()))
            .collect();
        // What the lengths must read now, in the order of `ids`: a log of
        // length 0 has no record.
        let expected: Vec<(String, i64)> = tasks
            .iter()
            .filter(|(_, offset, _)| *offset > 0)
            .map(|(task, offset, _)| (task.to_string(), version_param(*offset)))
            .collect();
        let lengths: Vec<LogLengthRow> = tasks
            .iter()
            .map(|(task, _, end)| LogLengthRow {
                id: RecordId::new("log_length", task.to_string()),
                bytes: version_param(*end),
            })
            .collect();
        let mut vars = Variables::new();
        vars.insert("ids", ids);
        vars.insert("expected", expected);
        vars.insert("lengths", lengths);
        vars.insert("chunks", chunks);
        // As `append_log`, but each log only from exactly its length, all
        // in one transaction of bulk statements: a repeated import can
        // never write a chunk twice, and an interrupted one wrote nothing.
        let result = self
            .query(
                "import task logs",
                "BEGIN;
                 LET $found = (SELECT VALUE [record::id(id), bytes] FROM $ids WHERE bytes > 0);
                 IF $found != $expected { THROW 'orchestrator: log length mismatch' };
                 DELETE $ids RETURN NONE;
                 INSERT INTO log_length $lengths RETURN NONE;
                 INSERT INTO log_chunk $chunks RETURN NONE;
                 COMMIT;",
                &vars,
            )
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(Error::Database { message, .. }) if message.contains("log length mismatch") => {
                let asked: Vec<TaskId> = tasks.iter().map(|(task, _, _)| *task).collect();
                let found = self.log_lengths(&asked).await?;
                let (task, expected, found) = tasks
                    .iter()
                    .zip(found)
                    .map(|(&(task, offset, _), found)| (task, offset, found))
                    .find(|(_, offset, found)| offset != found)
                    .unwrap_or((tasks[0].0, tasks[0].1, tasks[0].1));
                Err(Error::Conflict {
                    what: "task log",
                    id: task.to_string(),
                    expected,
                    found,
                })
            }
            Err(e) => Err(e),
        }
    }

    async fn close(&self) -> Result<()> {
        Backend::close(self).await
    }
}
