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
use std::sync::Mutex;

use async_trait::async_trait;
use orchestrator_core::TaskId;

use super::journal::{decode_line, encode_line};
use super::layout::{Access, LAYOUT_FILE, check_layout};
use super::logs::{import_log_files, log_file_lengths_off, read_log_files_off};
use super::{JOURNAL_FILE, LOGS_DIR, Line, SNAPSHOT_FILE, file_identity};
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

pub struct IndexedStore {
    dir: PathBuf,
    logs_dir: PathBuf,
    /// The snapshot as it was when indexed; `None` if there was none.
    snapshot: Option<File>,
    /// Read-only: the journal as it was when indexed.
    journal: Vec<u8>,
    /// Opened for import: the journal, appended to, and the lock.
    writer: Option<Writer>,
    index: Mutex<BTreeMap<(RecordKind, String), Loc>>,
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
                index_snapshot(file, &snapshot_path, &mut index, &mut damaged)?;
            }
            let journal = match std::fs::read(&journal_path) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(Error::io(format!("read {}", journal_path.display()), e)),
            };
            index_journal(&journal, &mut index, &mut damaged);
            let settled = file_identity(&snapshot_path) == before && opened == before;
            if settled || attempts >= 10 {
                return Ok(IndexedStore {
                    logs_dir: dir.join(LOGS_DIR),
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
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("create data dir {}", dir.display()), e))?;
        let lock_path = dir.join("LOCK");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(format!("open {}", lock_path.display()), e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(Error::Locked { dir }),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::io(format!("lock {}", lock_path.display()), e));
            }
        }
        check_layout(&dir, Access::Upgrade)?;
        let logs_dir = dir.join(LOGS_DIR);
        std::fs::create_dir_all(&logs_dir)
            .map_err(|e| Error::io(format!("create {}", logs_dir.display()), e))?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let journal_path = dir.join(JOURNAL_FILE);
        let mut index = BTreeMap::new();
        let snapshot = match File::open(&snapshot_path) {
            Ok(file) => {
                index_strictly(&file, &snapshot_path, false, &mut index)?;
                Some(file)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(format!("open {}", snapshot_path.display()), e)),
        };
        let io = |e| Error::io(format!("open {}", journal_path.display()), e);
        let journal = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(&journal_path)
            .map_err(io)?;
        let kept = index_strictly(&journal, &journal_path, true, &mut index)?;
        if journal.metadata().map_err(io)?.len() > kept {
            tracing::warn!(
                path = %journal_path.display(),
                "dropping a torn write at the end of the journal"
            );
            journal
                .set_len(kept)
                .and_then(|()| journal.sync_all())
                .map_err(|e| Error::io(format!("truncate {}", journal_path.display()), e))?;
        }
        Ok(IndexedStore {
            dir,
            logs_dir,
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

    fn lock_index(&self) -> std::sync::MutexGuard<'_, BTreeMap<(RecordKind, String), Loc>> {
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
            let parsed = decode_line(line)
                .ok_or_else(|| "checksum mismatch on a second read".to_owned())
                .and_then(|json| {
                    serde_json::from_slice::<Line>(json)
                        .map_err(|e| format!("unreadable record: {e}"))
                });
            let records = match parsed {
                Ok(line) => line.into_records(),
                Err(reason) => return Ok(Err(reason)),
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

impl Line {
    /// The records this line stores.
    fn into_records(self) -> Vec<Record> {
        match self {
            Line::Workflow(w) => vec![Record::Workflow(w)],
            Line::Task(t) => vec![Record::Task(t)],
            Line::Submission { workflow, tasks } => std::iter::once(Record::Workflow(workflow))
                .chain(tasks.into_iter().map(Record::Task))
                .collect(),
            Line::Token(t) => vec![Record::Token(t)],
            Line::Secret(s) => vec![Record::Secret(s)],
            Line::SecretDeleted { .. } => Vec::new(),
            Line::Audit(a) => vec![Record::Audit(a)],
            Line::Schedule(s) => vec![Record::Schedule(s)],
            Line::ScheduleDeleted { .. } | Line::Pruned { .. } => Vec::new(),
            Line::ScheduleClaim(c) => vec![Record::ScheduleClaim(c)],
        }
    }
}

/// Indexes one complete line (without its newline) found at `loc`, as
/// replaying it would apply it: a record's older version never replaces a
/// newer one, a good line clears its records' damage marks, and a damaged
/// line marks the records it names (or, naming none, its own `place`).
fn index_line(
    line: &[u8],
    mut loc: Loc,
    place: impl FnOnce() -> String,
    skip_damage: bool,
    index: &mut BTreeMap<(RecordKind, String), Loc>,
    damaged: &mut Damaged,
) {
    let problem = match decode_line(line) {
        Some(json) => match serde_json::from_slice::<Line>(json) {
            Ok(parsed) => {
                for key in parsed.keys() {
                    damaged.remove(&key);
                }
                if let Line::SecretDeleted { name } = &parsed {
                    index.remove(&(RecordKind::Secret, name.clone()));
                    return;
                }
                if let Line::ScheduleDeleted { id } = &parsed {
                    index.remove(&(RecordKind::Schedule, id.clone()));
                    return;
                }
                if let Line::Pruned { .. } = &parsed {
                    for key in parsed.keys() {
                        index.remove(&key);
                    }
                    return;
                }
                for record in parsed.into_records() {
                    loc.version = record.version();
                    let key = (record.kind(), record.key());
                    if index.get(&key).is_none_or(|old| old.version <= loc.version) {
                        index.insert(key, loc);
                    }
                }
                return;
            }
            Err(e) => format!("unreadable record: {e}"),
        },
        None if skip_damage => return,
        None => "checksum mismatch".to_owned(),
    };
    let place = place();
    let named = Line::keys_in_damaged(line.get(9..).unwrap_or_default());
    if named.is_empty() {
        // Listed with the tasks, the bulk of any store, under its place.
        let reason = format!("{problem}; the line names no record");
        damaged.insert((RecordKind::Task, place), reason);
    } else {
        for key in named {
            damaged.insert(key, format!("{place}: {problem}"));
        }
    }
}

/// Indexes the snapshot a line at a time, never holding more than one.
fn index_snapshot(
    file: &File,
    path: &Path,
    index: &mut BTreeMap<(RecordKind, String), Loc>,
    damaged: &mut Damaged,
) -> Result<()> {
    let mut handle = file;
    handle
        .seek(SeekFrom::Start(0))
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let mut reader = BufReader::with_capacity(1 << 20, handle);
    let mut line = Vec::new();
    let mut offset = 0u64;
    let mut line_no = 0usize;
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        // The end, or a last line without its newline: a write in progress.
        let Some(body) = line.strip_suffix(b"\n") else {
            break;
        };
        line_no += 1;
        let loc = Loc {
            in_journal: false,
            offset,
            len: body.len(),
            version: 0,
        };
        index_line(
            body,
            loc,
            || format!("{SNAPSHOT_FILE} line {line_no}"),
            false,
            index,
            damaged,
        );
        offset += n as u64;
    }
    Ok(())
}

/// Indexes a file of a store opened for import, as the service replays
/// it: damage is refused with its line, except, in the journal, a last
/// line torn by a crash, which is left out. Returns the bytes kept.
fn index_strictly(
    file: &File,
    path: &Path,
    is_journal: bool,
    index: &mut BTreeMap<(RecordKind, String), Loc>,
) -> Result<u64> {
    let io = |e| Error::io(format!("read {}", path.display()), e);
    let mut handle = file;
    handle.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut reader = BufReader::with_capacity(1 << 20, handle);
    let mut line = Vec::new();
    let mut next = Vec::new();
    let mut offset = 0u64;
    let mut line_no = 0usize;
    reader.read_until(b'\n', &mut line).map_err(io)?;
    while !line.is_empty() {
        line_no += 1;
        next.clear();
        reader.read_until(b'\n', &mut next).map_err(io)?;
        let is_last = next.is_empty();
        let good = line.strip_suffix(b"\n").is_some_and(|body| {
            let loc = Loc {
                in_journal: is_journal,
                offset,
                len: body.len(),
                version: 0,
            };
            let mut damaged = Damaged::new();
            index_line(body, loc, String::new, false, index, &mut damaged);
            damaged.is_empty()
        });
        if !good {
            if is_journal && is_last {
                return Ok(offset);
            }
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                line: line_no,
                reason: "checksum mismatch or unreadable record in the middle of the file; \
                         restore the data dir from a backup"
                    .into(),
            });
        }
        offset += line.len() as u64;
        std::mem::swap(&mut line, &mut next);
    }
    Ok(offset)
}

/// Indexes the journal, held in memory. A damaged last line is a write
/// torn by a crash or still in progress: the service drops it too.
fn index_journal(
    bytes: &[u8],
    index: &mut BTreeMap<(RecordKind, String), Loc>,
    damaged: &mut Damaged,
) {
    let mut lines = bytes
        .split_inclusive(|&b| b == b'\n')
        .enumerate()
        .peekable();
    let mut offset = 0u64;
    while let Some((i, line)) = lines.next() {
        let Some(body) = line.strip_suffix(b"\n") else {
            break;
        };
        let is_last = lines.peek().is_none_or(|(_, next)| !next.ends_with(b"\n"));
        let loc = Loc {
            in_journal: true,
            offset,
            len: body.len(),
            version: 0,
        };
        index_line(
            body,
            loc,
            || format!("{JOURNAL_FILE} line {}", i + 1),
            is_last,
            index,
            damaged,
        );
        offset += line.len() as u64;
    }
}

#[async_trait]
impl BulkTransfer for IndexedStore {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    async fn close(&self) -> Result<()> {
        if let Some(writer) = &self.writer {
            writer.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
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
            let json = serde_json::to_vec(&Line::of(record.clone()))
                .map_err(|e| Error::io("serialize record", std::io::Error::other(e)))?;
            let start = bytes.len();
            encode_line(&json, &mut bytes);
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
        log_file_lengths_off(&self.logs_dir, ids).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        read_log_files_off(&self.logs_dir, asks).await
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        self.writer()?;
        if pieces.is_empty() {
            return Ok(());
        }
        import_log_files(&self.logs_dir, pieces).await
    }
}
