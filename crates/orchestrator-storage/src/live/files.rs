//! What a storage move keeps in the service's data dir: which store the
//! service works on (`storage.json`, the commit point of a switch), and the
//! migrations it ran (`live-migrations.json`). Both are small, and written
//! whole and atomically (temp file, fsync, rename, fsync of the dir).

use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use orchestrator_core::storage_move::MoveStatus;
use serde::{Deserialize, Serialize};

use crate::fs::atomic::write_atomically;
use crate::{Error, Result, StorageConfig};

const CHOICE_FILE: &str = "storage.json";
const HISTORY_FILE: &str = "live-migrations.json";
/// Migrations remembered; older ones are forgotten.
pub(crate) const HISTORY_KEPT: usize = 20;

/// `storage.json`: the store this data dir's service works on since a
/// storage move switched to it. Its presence overrides the configured
/// backend, since the configured one is the store it left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendChoice {
    /// The store to open, as a spec (no credentials: those are the
    /// service's own SurrealDB settings).
    pub store: String,
    /// The store it left, kept intact for a rollback.
    pub previous: String,
    /// The migration (or rollback) that switched.
    pub migration: String,
    pub switched_at: DateTime<Utc>,
    /// Whether `previous` still holds exactly what `store` holds: true at
    /// the switch, false (durably) before the first write after it.
    pub level: bool,
}

impl BackendChoice {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(CHOICE_FILE)
    }

    /// The data dir's choice, if a storage move ever switched it.
    pub fn load(data_dir: &Path) -> Result<Option<BackendChoice>> {
        let path = BackendChoice::path(data_dir);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::Config(format!(
                "{} is not a backend choice this build reads: {e}",
                path.display()
            ))
        })
    }

    pub fn save(&self, data_dir: &Path) -> Result<()> {
        let path = BackendChoice::path(data_dir);
        let bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        write_atomically(&path, &bytes)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    }
}

/// The store to open: the configured one, or the one a storage move
/// switched this data dir to. A configured store that is neither the
/// choice nor the store it left is refused, since opening it would
/// silently drop everything done since the switch.
pub fn effective_config(
    configured: &StorageConfig,
    data_dir: &Path,
) -> Result<(StorageConfig, Option<BackendChoice>)> {
    let Some(choice) = BackendChoice::load(data_dir)? else {
        return Ok((configured.clone(), None));
    };
    let parse = |spec: &str| {
        let mut config =
            StorageConfig::from_spec(spec, configured.surrealdb.clone()).map_err(|e| {
                Error::Config(format!("{}: {e}", BackendChoice::path(data_dir).display()))
            })?;
        if config.storage_type == crate::StorageType::SurrealdbServer {
            config.data_dir = configured.data_dir.clone();
        }
        Ok::<_, Error>(config)
    };
    let chosen = parse(&choice.store)?;
    let previous = parse(&choice.previous)?;
    if configured.same_store(&chosen) || configured.same_store(&previous) {
        return Ok((chosen, Some(choice)));
    }
    Err(Error::Config(format!(
        "{} says this service works on {} since storage move {} switched it there from {} \
         on {}, but the configuration names {}; start it without changing the storage \
         settings, or, if you moved the store since by other means, delete that file",
        BackendChoice::path(data_dir).display(),
        choice.store,
        choice.migration,
        choice.previous,
        choice.switched_at.to_rfc3339(),
        configured.spec(),
    )))
}

/// `live-migrations.json`: the newest migrations, oldest first.
pub(crate) fn load_history(data_dir: &Path) -> Result<Vec<MoveStatus>> {
    let path = data_dir.join(HISTORY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| Error::Config(format!("{} is unreadable: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

pub(crate) fn save_history(data_dir: &Path, history: &[MoveStatus]) -> Result<()> {
    let path = data_dir.join(HISTORY_FILE);
    let kept = &history[history.len().saturating_sub(HISTORY_KEPT)..];
    let bytes = serde_json::to_vec_pretty(kept).unwrap_or_default();
    write_atomically(&path, &bytes).map_err(|e| Error::io(format!("write {}", path.display()), e))
}
