//! A filesystem store opened to be read in bulk, by `orchestrator migrate`
//! (see [`crate::open_read_only`]): it keeps where each record's latest
//! line is, not the records, so its memory does not grow with the
//! snapshot. Records are read back from their lines as they are scanned.
//!
//! No lock is taken and nothing is created or written, so a running
//! service may go on appending (and compacting) meanwhile; this reads the
//! records as of the moment it opens. The snapshot is read through the
//! file handle opened then, which a compaction's rename does not change.
//! The journal, which a compaction empties in place, is kept in memory: it
//! holds what changed since the last compaction, a size the service bounds
//! (`compact_after_bytes`), not the whole store.
//!
//! The same index serves a migration's filesystem *target* (see
//! [`crate::open_for_import`]): opened with the lock, as the service opens
//! it, records are appended to the journal, one sync per batch, and only
//! their places are kept. Nothing compacts meanwhile; the service does once
//! it opens the store.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use orchestrator_core::TaskId;

use super::journal::reader::{Damage, LineFile, LinePlace, LineReader, parse_line, read_strictly};
use super::layout::{Access, LAYOUT_FILE, check_layout};
use super::line::Line;
use super::logs::{Logs, Mode};
use super::tasks::blocking;
use super::{JOURNAL_FILE, LOGS_DIR, SNAPSHOT_FILE, open_data_dir, release_data_dir};
use crate::{BulkTransfer, Error, LogChunk, LogPiece, Record, RecordKind, Result, Scanned};

/// Where a record's latest line is, and the record's version there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Loc {
    /// In the journal (kept in memory), else in the snapshot file.
    in_journal: bool,
    offset: u64,
    /// The line's length, without its newline.
    len: usize,
    version: u64,
}

/// A line's place (`in_journal`, offset) and the records it holds.
type LastLine = ((bool, u64), Vec<Record>);

/// Damaged records, by kind and key, with why.
type Damaged = BTreeMap<(RecordKind, String), String>;

/// Where each record's latest line is, by kind and key.
type Index = BTreeMap<(RecordKind, String), Loc>;

pub struct IndexedStore {
    dir: PathBuf,
    /// The task logs, read (and, for an import, written) on the blocking pool.
    logs: Arc<Logs>,
    /// The snapshot as it was when indexed; `None` if there was none.
    snapshot: Option<File>,
    /// Read-only: the journal as it was when indexed.
    journal: Vec<u8>,
    /// Opened for import: the journal, appended to, and the lock.
    writer: Option<Writer>,
    index: Mutex<Index>,
    /// Records whose latest line is damaged: a migration reports them
    /// instead of silently taking an older version.
    damaged: Damaged,
    /// The records of the line read last: the tasks of one submission
    /// line are read one after another.
    last: Mutex<Option<LastLine>>,
}

struct Writer {
    /// The journal, opened to read and append; its length.
    journal: Mutex<(File, u64)>,
    /// Holds the `LOCK` file's lock until closed or dropped.
    lock: Mutex<Option<File>>,
}

impl IndexedStore {
    pub async fn open(dir: &Path) -> Result<IndexedStore> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(dir))
            .await
            .map_err(|e| Error::io("open storage", std::io::Error::other(e)))?
    }

    fn open_blocking(dir: PathBuf) -> Result<IndexedStore> {
        if !dir.join(LAYOUT_FILE).exists() && !dir.join(JOURNAL_FILE).exists() {
            return Err(Error::Layout(format!(
                "{} holds no filesystem store (no {LAYOUT_FILE} or {JOURNAL_FILE})",
                dir.display()
            )));
        }
        check_layout(&dir, Access::ReadOnly)?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        // A running service may compact meanwhile: it renames a new
        // snapshot into place and then empties the journal. Reading the old
        // snapshot and the emptied journal would miss records, so read both
        // again whenever the snapshot was replaced while they were read.
        let mut attempts = 0;
        loop {
            let before = file_identity(&snapshot_path);
            let mut index = BTreeMap::new();
            let mut damaged = Damaged::new();
            let snapshot = match File::open(&snapshot_path) {
                Ok(file) => Some(file),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(Error::io(format!("open {}", snapshot_path.display()), e)),
            };
            let opened = snapshot.as_ref().and_then(|file| {
                use std::os::unix::fs::MetadataExt;
                file.metadata().ok().map(|m| (m.dev(), m.ino()))
            });
            if let Some(file) = &snapshot {
                let read_error = |e| Error::io(format!("read {}", snapshot_path.display()), e);
                let mut handle = file;
                handle.seek(SeekFrom::Start(0)).map_err(read_error)?;
                // Read a line at a time, never holding more than one.
                let lines = BufReader::with_capacity(1 << 20, handle);
                index_leniently(lines, LineFile::Snapshot, &mut index, &mut damaged)
                    .map_err(read_error)?;
            }
            let journal = match std::fs::read(&journal_path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(Error::io(format!("read {}", journal_path.display()), e)),
            };
            index_leniently(&journal[..], LineFile::Journal, &mut index, &mut damaged)
                .map_err(|e| Error::io(format!("read {}", journal_path.display()), e))?;
            let settled = file_identity(&snapshot_path) == before && opened == before;
            if settled || attempts >= 10 {
                let logs = Logs::open(&dir.join(LOGS_DIR), Mode::Read, |_| true)?;
                return Ok(IndexedStore {
                    logs: Arc::new(logs),
                    dir,
                    snapshot,
                    journal,
                    writer: None,
                    index: Mutex::new(index),
                    damaged,
                    last: Mutex::new(None),
                });
            }
            attempts += 1;
        }
    }

    /// Opens (or creates) `dir` to import records into, as the service
    /// would open it: with its lock, a torn last journal line dropped, and
    /// damage anywhere else refused.
    pub async fn open_for_import(dir: &Path) -> Result<IndexedStore> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_for_import_blocking(dir))
            .await
            .map_err(|e| Error::io("open storage", std::io::Error::other(e)))?
    }

    fn open_for_import_blocking(dir: PathBuf) -> Result<IndexedStore> {
        let lock = open_data_dir(&dir)?;
        let logs = Logs::open(&dir.join(LOGS_DIR), Mode::Write, |_| true)?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        let mut index = Index::new();
        // The lock is held: nothing changes the files between their reading
        // and their opening here.
        read_strictly(&snapshot_path, LineFile::Snapshot, |line, place| {
            index_record(line, place, false, &mut index)
        })?;
        let snapshot = match File::open(&snapshot_path) {
            Ok(file) => Some(file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(format!("open {}", snapshot_path.display()), e)),
        };
        let kept = read_strictly(&journal_path, LineFile::Journal, |line, place| {
            index_record(line, place, true, &mut index)
        })?;
        let journal = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(&journal_path)
            .map_err(|e| Error::io(format!("open {}", journal_path.display()), e))?;
        Ok(IndexedStore {
            dir,
            logs: Arc::new(logs),
            snapshot,
            journal: Vec::new(),
            writer: Some(Writer {
                journal: Mutex::new((journal, kept)),
                lock: Mutex::new(Some(lock)),
            }),
            index: Mutex::new(index),
            damaged: Damaged::new(),
            last: Mutex::new(None),
        })
    }

    fn writer(&self) -> Result<&Writer> {
        self.writer.as_ref().ok_or_else(|| self.read_only())
    }

    fn lock_index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_only(&self) -> Error {
        Error::ReadOnly(self.dir.display().to_string())
    }

    /// The record of `kind` under `key` from its line, or why it cannot be
    /// read.
    fn load(
        &self,
        kind: RecordKind,
        key: &str,
        loc: Loc,
    ) -> Result<std::result::Result<Record, String>> {
        let place = (loc.in_journal, loc.offset);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref().is_none_or(|(at, _)| *at != place) {
            let mut owned = Vec::new();
            let line: &[u8] = if loc.in_journal && self.writer.is_none() {
                let start = usize::try_from(loc.offset).unwrap_or(usize::MAX);
                self.journal
                    .get(start..start.saturating_add(loc.len))
                    .unwrap_or_default()
            } else {
                owned.resize(loc.len, 0);
                let (name, read) = if loc.in_journal {
                    let journal = self.writer()?.journal.lock();
                    let journal = journal.unwrap_or_else(|e| e.into_inner());
                    (
                        JOURNAL_FILE,
                        journal.0.read_exact_at(&mut owned, loc.offset),
                    )
                } else {
                    let file = self.snapshot.as_ref().ok_or_else(|| {
                        Error::io("read the snapshot", std::io::Error::other("it is gone"))
                    })?;
                    (SNAPSHOT_FILE, file.read_exact_at(&mut owned, loc.offset))
                };
                read.map_err(|e| Error::io(format!("read {}", self.dir.join(name).display()), e))?;
                &owned
            };
            let records = match parse_line(line) {
                Ok(line) => line.into_records(),
                Err(Damage::Checksum) => {
                    return Ok(Err("checksum mismatch on a second read".to_owned()));
                }
                Err(damage) => return Ok(Err(damage.to_string())),
            };
            *last = Some((place, records));
        }
        let records = last
            .as_ref()
            .map(|(_, records)| records.as_slice())
            .unwrap_or_default();
        Ok(records
            .iter()
            .rev()
            .find(|r| r.kind() == kind && r.key() == key)
            .cloned()
            .ok_or_else(|| format!("its line no longer holds {kind} {key}")))
    }
}

/// Which file a snapshot's or a compaction's rename put under `path`
/// (device and inode), to notice one while reading.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Indexes a file of a store opened to be read by a migration: a damaged
/// line marks the records it names as damaged (or, naming none, its own
/// place) instead of refusing the store, so that every good record can
/// be rescued. The journal's torn tail is left out, as the service leaves
/// it out.
fn index_leniently(
    input: impl BufRead,
    file: LineFile,
    index: &mut Index,
    damaged: &mut Damaged,
) -> std::io::Result<()> {
    let (name, in_journal) = match file {
        LineFile::Journal => (JOURNAL_FILE, true),
        LineFile::Snapshot => (SNAPSHOT_FILE, false),
    };
    let mut lines = LineReader::new(input, file);
    while let Some(line) = lines.next_line()? {
        match line.record {
            Ok(record) => {
                // A good line supersedes an older damaged one of its records.
                for key in record.keys() {
                    damaged.remove(&key);
                }
                let place = LinePlace {
                    offset: line.offset,
                    len: line.bytes.len(),
                };
                index_record(record, place, in_journal, index);
            }
            Err(damage) => {
                let place = format!("{name} line {}", line.number);
                let named = Line::keys_in_damaged(line.bytes.get(9..).unwrap_or_default());
                if named.is_empty() {
                    // Listed with the tasks, the bulk of any store, under its place.
                    let reason = format!("{damage}; the line names no record");
                    damaged.insert((RecordKind::Task, place), reason);
                } else {
                    for key in named {
                        damaged.insert(key, format!("{place}: {damage}"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Indexes one good line at `place`, as replaying it would apply it: a
/// record's older version never replaces a newer one, and a deletion
/// removes its records.
fn index_record(line: Line, place: LinePlace, in_journal: bool, index: &mut Index) {
    if let Line::SecretDeleted { name } = &line {
        index.remove(&(RecordKind::Secret, name.clone()));
        return;
    }
    if let Line::ScheduleDeleted { id } = &line {
        index.remove(&(RecordKind::Schedule, id.clone()));
        return;
    }
    if let Line::Pruned { .. } = &line {
        for key in line.keys() {
            index.remove(&key);
        }
        return;
    }
    for record in line.into_records() {
        let loc = Loc {
            in_journal,
            offset: place.offset,
            len: place.len,
            version: record.version(),
        };
        let key = (record.kind(), record.key());
        if index.get(&key).is_none_or(|old| old.version <= loc.version) {
            index.insert(key, loc);
        }
    }
}

#[async_trait]
impl BulkTransfer for IndexedStore {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    async fn close(&self) -> Result<()> {
        if let Some(writer) = &self.writer {
            release_data_dir(writer.lock.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
        Ok(())
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let from = match after {
            Some(key) => Excluded((kind, key.to_owned())),
            None => Included((kind, String::new())),
        };
        let places: Vec<(String, Loc)> = self
            .lock_index()
            .range((from.clone(), Unbounded))
            .take_while(|((k, _), _)| *k == kind)
            .filter(|(at, _)| !self.damaged.contains_key(at))
            .take(limit)
            .map(|((_, key), loc)| (key.clone(), *loc))
            .collect();
        let mut found = Vec::with_capacity(places.len());
        for (key, loc) in places {
            let record = self.load(kind, &key, loc)?;
            found.push(Scanned { key, record });
        }
        found.extend(
            self.damaged
                .range((from, Unbounded))
                .take_while(|((k, _), _)| *k == kind)
                .take(limit)
                .map(|((_, key), reason)| Scanned {
                    key: key.clone(),
                    record: Err(reason.clone()),
                }),
        );
        found.sort_by(|a, b| a.key.cmp(&b.key));
        found.truncate(limit);
        Ok(found)
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        let mut found = Vec::new();
        for key in keys {
            let at = (kind, key.clone());
            if let Some(reason) = self.damaged.get(&at) {
                found.push(Scanned {
                    key: key.clone(),
                    record: Err(reason.clone()),
                });
            } else if let Some(loc) = self.lock_index().get(&at).copied() {
                found.push(Scanned {
                    key: key.clone(),
                    record: self.load(kind, key, loc)?,
                });
            }
        }
        found.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        let index = self.lock_index();
        let stored = index
            .range((kind, String::new())..)
            .take_while(|((k, _), _)| *k == kind)
            .count();
        let damaged_only = self
            .damaged
            .keys()
            .filter(|at| at.0 == kind && !index.contains_key(at))
            .count();
        Ok((stored + damaged_only) as u64)
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        let writer = self.writer()?;
        if records.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::new();
        let mut lines = Vec::with_capacity(records.len());
        for record in records {
            let start = bytes.len();
            Line::of(record.clone())
                .encode_into(&mut bytes)
                .map_err(|e| Error::io("serialize record", std::io::Error::other(e)))?;
            lines.push((record, start, bytes.len() - start - 1));
        }
        let (file, base) = {
            let guard = writer.journal.lock().unwrap_or_else(|e| e.into_inner());
            let file = guard.0.try_clone().map_err(|e| {
                Error::io(format!("open {}", self.dir.join(JOURNAL_FILE).display()), e)
            })?;
            (file, guard.1)
        };
        let path = self.dir.join(JOURNAL_FILE);
        let written = bytes.len() as u64;
        // One write and one sync for the batch.
        tokio::task::spawn_blocking(move || {
            let mut file = file;
            file.write_all(&bytes).and_then(|()| file.sync_data())
        })
        .await
        .map_err(|e| Error::io("write records", std::io::Error::other(e)))?
        .map_err(|e| Error::io(format!("append to {}", path.display()), e))?;
        writer.journal.lock().unwrap_or_else(|e| e.into_inner()).1 = base + written;
        let mut index = self.lock_index();
        for (record, start, len) in lines {
            let loc = Loc {
                in_journal: true,
                offset: base + start as u64,
                len,
                version: record.version(),
            };
            index.insert((record.kind(), record.key()), loc);
        }
        drop(index);
        // A line read before may have been the place of a record now moved.
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
        Ok(())
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        Ok(self.logs.lengths(ids))
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        let (logs, asks) = (self.logs.clone(), asks.to_vec());
        blocking(move || logs.read_many(&asks)).await
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.writer()?;
        if pieces.is_empty() {
            return Ok(());
        }
        let (logs, pieces) = (self.logs.clone(), pieces.to_vec());
        blocking(move || logs.import(&pieces)).await
    }
}
