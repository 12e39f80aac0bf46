//! The filesystem backend as either end of a migration
//! ([`crate::BulkTransfer`]): records scanned from memory, imports appended
//! without compacting meanwhile.

use async_trait::async_trait;
use orchestrator_core::TaskId;

use super::FsBackend;
use super::line::Line;
use super::tasks::blocking;
use crate::{Backend, BulkTransfer, LogChunk, LogPiece, Record, RecordKind, Result, Scanned};

/// Records read under one taking of the state lock by a scan.
const SCAN_CHUNK: usize = 64;

#[async_trait]
impl BulkTransfer for FsBackend {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        // Opened with the lock, a store has no damaged record: damage
        // refuses the open (a migration reads through `IndexedStore`).
        // Finished records are read back from disk, a parse each, after
        // the lock is let go; the lock is taken for a few records at a
        // time, so requests are served in between (a storage move scans
        // the whole store while the service runs).
        let mut scanned: Vec<Scanned> = Vec::new();
        let mut cursor = after.map(str::to_owned);
        while scanned.len() < limit {
            let want = (limit - scanned.len()).min(SCAN_CHUNK);
            let (chunk, files) = {
                let state = self.lock_state();
                let chunk = state.records_after(kind, cursor.as_deref(), want)?;
                (chunk, state.files().clone())
            };
            let last = chunk.len() < want;
            for found in chunk {
                let record = found.read(&files)?;
                scanned.push(Scanned {
                    key: record.key(),
                    record: Ok(record),
                });
            }
            if last {
                break;
            }
            cursor = scanned.last().map(|s| s.key.clone());
            tokio::task::yield_now().await;
        }
        Ok(scanned)
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        let state = self.lock_state();
        let mut found = Vec::new();
        for key in keys {
            if let Some(record) = state.record(kind, key)? {
                found.push(Scanned {
                    key: key.clone(),
                    record: Ok(record),
                });
            }
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        Ok(self.lock_state().count(kind) as u64)
    }

    /// Compacts a journal that imports left longer than the threshold, and
    /// waits for it: a storage move does it after its copy, while the
    /// service still works on the other store, rather than at the first
    /// write after its switch.
    async fn settle(&self) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            if state.journal_bytes <= self.options.compact_after_bytes {
                return Ok(());
            }
            self.compaction(&mut state)?
        };
        pending.durable().await
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        self.writer()?.check_usable()?;
        let pending = {
            let mut state = self.lock_state();
            records
                .iter()
                .map(|record| self.append(&mut state, Line::of(record.clone())))
                .collect::<Result<Vec<_>>>()?
        };
        // Queued together, so the writer makes them durable with one sync.
        for write in pending {
            write.durable().await?;
        }
        Ok(())
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        Ok(self.logs.lengths(ids))
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.writer()?.check_usable()?;
        if pieces.is_empty() {
            return Ok(());
        }
        let (logs, pieces) = (self.logs.clone(), pieces.to_vec());
        blocking(move || logs.import(&pieces)).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        let (logs, asks) = (self.logs.clone(), asks.to_vec());
        blocking(move || logs.read_many(&asks)).await
    }

    async fn close(&self) -> Result<()> {
        Backend::close(self).await
    }
}
