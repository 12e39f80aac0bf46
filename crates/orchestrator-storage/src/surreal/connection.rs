//! Reaching the database: where a config points (an embedded engine or a
//! server), and connecting and signing in within the connect timeout.

use std::future::IntoFuture;
use std::path::PathBuf;
use std::time::Duration;

use surrealdb::engine::any::{self, Any};
use surrealdb::opt::auth::Root;
use surrealdb::{IndexedResults, Surreal};

use super::errors::{db_error, first_error};
use crate::{EmbeddedEngine, Error, Result, StorageConfig, StorageType};

/// Where a config points, before connecting.
pub(super) struct Target {
    pub(super) name: &'static str,
    pub(super) endpoint: String,
    /// For messages and logs: never includes the password.
    pub(super) location: String,
    pub(super) remote: bool,
    /// The embedded engine's directory, created before connecting.
    pub(super) dir: Option<PathBuf>,
}

impl Target {
    pub(super) fn of(config: &StorageConfig) -> Result<Target> {
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
    pub(super) async fn connect(
        &self,
        config: &StorageConfig,
        create: bool,
    ) -> Result<Surreal<Any>> {
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
pub(super) fn is_held(path: &std::path::Path) -> bool {
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

pub(super) fn is_locked(e: &surrealdb::Error) -> bool {
    let message = e.message().to_lowercase();
    message.contains("lock") && !message.contains("deadlock")
}

/// Namespace and database names go into `DEFINE` statements, which take no
/// parameters: only plain identifiers are accepted.
pub(super) fn check_name(setting: &str, value: &str) -> Result<()> {
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
