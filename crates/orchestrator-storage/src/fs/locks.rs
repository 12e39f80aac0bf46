//! The filesystem backend's named locks ([`crate::LockStore`]): every lock
//! record in one file, `locks.json`, replaced atomically (written aside,
//! synced, renamed) by each change. One process has the data dir, so a
//! compare-and-set is a check and a write under one mutex.
//!
//! The file is not part of the journal: a storage move or a backup does
//! not carry it (locks are held by running work, which a move's target or
//! a restore starts afresh).

use std::collections::BTreeMap;
use std::path::Path;

use async_trait::async_trait;
use orchestrator_core::lock::LockRecord;

use super::FsBackend;
use super::atomic::write_atomically;
use crate::{Error, LockStore, Result};

/// The file of every lock record, in the data dir.
pub(super) const LOCKS_FILE: &str = "locks.json";

/// Reads the lock records at open; none if the file is absent.
pub(super) fn read(dir: &Path) -> Result<BTreeMap<String, LockRecord>> {
    let path = dir.join(LOCKS_FILE);
    match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path,
            line: 1,
            reason: e.to_string(),
        }),
    }
}

#[async_trait]
impl LockStore for FsBackend {
    async fn get_lock(&self, name: &str) -> Result<Option<LockRecord>> {
        Ok(self.locks.lock().await.get(name).cloned())
    }

    async fn put_lock(&self, lock: &LockRecord) -> Result<LockRecord> {
        self.writer()?;
        let mut locks = self.locks.lock().await;
        let found = locks.get(&lock.name).map_or(0, |l| l.version);
        if found != lock.version {
            return Err(Error::Conflict {
                what: "lock",
                id: lock.name.clone(),
                expected: lock.version,
                found,
            });
        }
        let mut stored = lock.clone();
        stored.version += 1;
        let mut next = locks.clone();
        next.insert(stored.name.clone(), stored.clone());
        let bytes = serde_json::to_vec(&next)
            .map_err(|e| Error::io("encode locks", std::io::Error::other(e)))?;
        let path = self.dir.join(LOCKS_FILE);
        // Blocking file I/O, off the async workers; the mutex is held
        // across it so that no other change is checked against a record
        // that is about to be replaced.
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .map_err(|e| Error::io("write locks", std::io::Error::other(e)))?
            .map_err(|e| Error::io("write locks", e))?;
        *locks = next;
        Ok(stored)
    }

    async fn locks(&self) -> Result<Vec<LockRecord>> {
        Ok(self.locks.lock().await.values().cloned().collect())
    }
}
