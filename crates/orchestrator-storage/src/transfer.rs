//! Moving every record from one store to another, and checking that two
//! stores hold the same records: the engine of `orchestrator migrate`.
//!
//! Both work on any two stores through their [`BulkTransfer`] side, in
//! batches, so memory holds two batches (the one being written and the
//! next one, read meanwhile) and one log chunk at a time whatever the
//! store's size.
//!
//! A copy is a *sync*: each source batch is compared with what the target
//! holds under the same keys, and only records that are missing or differ
//! are written. So one routine is the first copy, the resumption of a copy
//! that was killed (what was written is found equal and skipped), and each
//! catch-up pass of a storage move (only what changed since moves).
//! Records are written as they are stored, versions included, and a task's
//! log is appended from the length the target already has: nothing is ever
//! written twice.

use std::collections::{HashMap, VecDeque};

use orchestrator_core::TaskId;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::{BulkTransfer, Error, LogChunk, LogPiece, Record, RecordKind, Scanned};

/// Bytes of a log moved per read and write.
const LOG_CHUNK: usize = 1 << 20;
/// Log bytes gathered before they are written in one import.
const LOG_BATCH_BYTES: usize = 4 << 20;
/// Mismatches listed by a verify; the rest are only counted.
const MISMATCHES_LISTED: usize = 20;

/// How to copy.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Records read and written per round trip.
    pub batch_size: usize,
    /// Read and count everything, report what is unreadable, write nothing.
    pub dry_run: bool,
    /// Go on past unreadable source records (listing them in the report)
    /// instead of stopping at the first.
    pub skip_unreadable: bool,
    /// Accept a target that already holds records: continue an earlier
    /// copy into it, or catch up with a source that changed since.
    pub resume: bool,
    /// Copy of each kind at most as many records as the source held when
    /// the kind began: a storage move notes what is written meanwhile
    /// and applies it later, so the copy ends even while new records keep
    /// arriving (in key order, after the old ones).
    pub snapshot: bool,
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            batch_size: 500,
            dry_run: false,
            skip_unreadable: false,
            resume: false,
            snapshot: false,
        }
    }
}

/// Told how a copy or a verify goes, to show progress.
pub trait Progress: Send + Sync {
    /// A kind of record starts; `total` is how many the source holds.
    fn phase(&self, kind: RecordKind, total: u64);
    /// `records` more records of the current kind were handled.
    fn advance(&self, records: u64);
    /// A write to the target is durable.
    fn wrote(&self) {}
}

/// Progress nobody watches.
pub struct Silent;

impl Progress for Silent {
    fn phase(&self, _: RecordKind, _: u64) {}
    fn advance(&self, _: u64) {}
}

/// A source record that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unreadable {
    pub kind: RecordKind,
    pub key: String,
    pub reason: String,
}

/// What a copy did with one kind of record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindCopied {
    pub kind: RecordKind,
    /// Records read from the source, readable or not.
    pub read: u64,
    /// Records written to the target (missing there, or different).
    pub written: u64,
    /// Records the target already held as they are.
    pub unchanged: u64,
}

/// What a copy (or a dry run) did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CopyReport {
    pub dry_run: bool,
    pub kinds: Vec<KindCopied>,
    /// Tasks with a log in the source, and its bytes in all.
    pub logs: u64,
    pub log_bytes: u64,
    /// Log bytes written to the target by this run.
    pub log_bytes_written: u64,
    /// Source records skipped because they could not be read (with
    /// `skip_unreadable`, or listed by a dry run).
    pub unreadable: Vec<Unreadable>,
}

/// Why a copy stopped. Which store failed is always said: the source is
/// only read, so a source error never means damage to it.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error(
        "source {kind} {key} is unreadable: {reason}. Nothing after it was copied; \
         run again with --skip-unreadable to copy everything else and list it"
    )]
    Unreadable {
        kind: RecordKind,
        key: String,
        reason: String,
    },
    #[error(
        "the target already holds {workflows} workflows and {tasks} tasks; migrate only into \
         an empty store, or pass --resume to continue an earlier migration into this one"
    )]
    TargetNotEmpty { workflows: u64, tasks: u64 },
    #[error(
        "task {task}: the target's log ({target_bytes} bytes) is longer than the source's \
         ({source_bytes} bytes), so it is not a copy of it"
    )]
    LogDiverged {
        task: TaskId,
        source_bytes: u64,
        target_bytes: u64,
    },
    #[error(
        "the target's {kind} {key} is newer than the source's (version {target_version} > \
         {source_version}): something wrote to the target after it was copied, so it is no \
         longer a copy of this source; nothing of this batch was written"
    )]
    TargetNewer {
        kind: RecordKind,
        key: String,
        source_version: u64,
        target_version: u64,
    },
    #[error("reading the source: {0}")]
    Source(#[source] Error),
    #[error("writing the target: {0}")]
    Target(#[source] Error),
}

/// Copies every record (and log) of `source` that `target` lacks or holds
/// differently. See the module docs.
pub async fn copy(
    source: &dyn BulkTransfer,
    target: &dyn BulkTransfer,
    options: &CopyOptions,
    progress: &dyn Progress,
) -> Result<CopyReport, TransferError> {
    let src = TransferError::Source;
    let tgt = TransferError::Target;
    let batch_size = options.batch_size.max(1);
    // A target known empty needs no comparison, only writes.
    let mut target_empty = true;
    if !options.dry_run {
        let workflows = target.count(RecordKind::Workflow).await.map_err(tgt)?;
        let tasks = target.count(RecordKind::Task).await.map_err(tgt)?;
        target_empty = workflows + tasks == 0;
        if !target_empty && !options.resume {
            return Err(TransferError::TargetNotEmpty { workflows, tasks });
        }
    }
    let mut report = CopyReport {
        dry_run: options.dry_run,
        kinds: Vec::new(),
        logs: 0,
        log_bytes: 0,
        log_bytes_written: 0,
        unreadable: Vec::new(),
    };
    for kind in RecordKind::ALL {
        let held = source.count(kind).await.map_err(src)?;
        progress.phase(kind, held);
        let limit = if options.snapshot { held } else { u64::MAX };
        let mut copied = KindCopied {
            kind,
            read: 0,
            written: 0,
            unchanged: 0,
        };
        let wanted =
            |read: u64| usize::try_from(limit - read).map_or(batch_size, |n| n.min(batch_size));
        let mut after: Option<String> = None;
        // The next batch, read while the current one was written: the
        // source's reads (a parse per record) overlap the target's syncs.
        let mut ahead: Option<Vec<Scanned>> = None;
        while copied.read < limit {
            let batch = match ahead.take() {
                Some(batch) => batch,
                None => source
                    .scan(kind, after.as_deref(), wanted(copied.read))
                    .await
                    .map_err(src)?,
            };
            let Some(last) = batch.last() else { break };
            after = Some(last.key.clone());
            copied.read += batch.len() as u64;
            let n = batch.len() as u64;
            let mut readable = Vec::with_capacity(batch.len());
            for scanned in batch {
                match scanned.record {
                    Ok(record) => readable.push(record),
                    Err(reason) if options.dry_run || options.skip_unreadable => {
                        report.unreadable.push(Unreadable {
                            kind,
                            key: scanned.key,
                            reason,
                        });
                    }
                    Err(reason) => {
                        return Err(TransferError::Unreadable {
                            kind,
                            key: scanned.key,
                            reason,
                        });
                    }
                }
            }
            let task_ids: Vec<TaskId> = readable
                .iter()
                .filter_map(|r| match r {
                    Record::Task(t) => Some(t.id),
                    _ => None,
                })
                .collect();
            if options.dry_run {
                let lengths = source.log_lengths(&task_ids).await.map_err(src)?;
                report.logs += lengths.iter().filter(|&&n| n > 0).count() as u64;
                report.log_bytes += lengths.iter().sum::<u64>();
                progress.advance(n);
                continue;
            }
            let readable_count = readable.len();
            let changed = if target_empty {
                readable
            } else {
                changed_records(target, kind, readable).await?
            };
            // Everything of the batch is checked before anything is written.
            // A target that held no records when the copy began holds no
            // log of these tasks either: records go before their logs.
            let logs = if target_empty {
                source_log_lengths(source, &task_ids).await?
            } else {
                log_lengths(source, target, &task_ids).await?
            };
            not_ahead(&logs)?;
            copied.unchanged += (readable_count - changed.len()) as u64;
            let write = async {
                if !changed.is_empty() {
                    target.import(&changed).await.map_err(tgt)?;
                    progress.wrote();
                }
                copy_logs(source, &logs, target, &mut report, progress).await
            };
            let read_ahead = async {
                if copied.read >= limit {
                    return Ok(None);
                }
                let next = source.scan(kind, after.as_deref(), wanted(copied.read));
                next.await.map(Some).map_err(src)
            };
            let (written, next) = tokio::join!(write, read_ahead);
            written?;
            ahead = next?;
            copied.written += changed.len() as u64;
            progress.advance(n);
        }
        report.kinds.push(copied);
    }
    Ok(report)
}

/// The records the target lacks or holds differently. A target record
/// newer than the source's means something wrote to the target since it
/// was copied: writing the older one over it would roll it back, so stop.
async fn changed_records(
    target: &dyn BulkTransfer,
    kind: RecordKind,
    readable: Vec<Record>,
) -> Result<Vec<Record>, TransferError> {
    let keys: Vec<String> = readable.iter().map(Record::key).collect();
    let stored: HashMap<String, Record> = target
        .fetch(kind, &keys)
        .await
        .map_err(TransferError::Target)?
        .into_iter()
        .filter_map(|s| Some((s.key, s.record.ok()?)))
        .collect();
    let mut changed = Vec::new();
    for record in readable {
        match stored.get(&record.key()) {
            Some(held) if held.to_json() == record.to_json() => {}
            Some(held) if held.version() > record.version() => {
                return Err(TransferError::TargetNewer {
                    kind,
                    key: record.key(),
                    source_version: record.version(),
                    target_version: held.version(),
                });
            }
            _ => changed.push(record),
        }
    }
    Ok(changed)
}

/// Appends to each task's target log what the source has beyond it
/// (`logs` as [`log_lengths`] gave them). The source is read many logs at
/// a time, and the pieces written in imports of up to [`LOG_BATCH_BYTES`]:
/// many small logs share one read and one write.
async fn copy_logs(
    source: &dyn BulkTransfer,
    logs: &[(TaskId, u64, u64)],
    target: &dyn BulkTransfer,
    report: &mut CopyReport,
    progress: &dyn Progress,
) -> Result<(), TransferError> {
    let mut missing = Vec::new();
    for &(task, wanted, present) in logs {
        if wanted > 0 {
            report.logs += 1;
            report.log_bytes += wanted;
        }
        if present < wanted {
            missing.push((task, present, wanted));
        }
    }
    let mut pending: Vec<LogPiece> = Vec::new();
    let mut pending_bytes = 0;
    for round in log_rounds(&missing) {
        let asks: Vec<(TaskId, u64, usize)> = round
            .iter()
            .map(|&(task, from, wanted)| (task, from, chunk_len(from, wanted)))
            .collect();
        let answers = source
            .read_logs(&asks)
            .await
            .map_err(TransferError::Source)?;
        for (&(task, mut offset, wanted), mut chunk) in round.iter().zip(answers) {
            loop {
                if chunk.data.is_empty() {
                    // The source log shrank under us: only a damaged store does that.
                    return Err(TransferError::Source(Error::Io {
                        context: format!("read the log of task {task}"),
                        source: std::io::Error::other(format!(
                            "it ended at {offset} bytes, not at the {wanted} it reported"
                        )),
                    }));
                }
                pending_bytes += chunk.data.len();
                let next = chunk.next_offset;
                pending.push(LogPiece {
                    task,
                    offset,
                    data: chunk.data,
                });
                offset = next;
                if pending_bytes >= LOG_BATCH_BYTES {
                    flush_logs(target, &mut pending, report, progress).await?;
                    pending_bytes = 0;
                }
                if offset >= wanted {
                    break;
                }
                chunk = read_log(source, task, offset, chunk_len(offset, wanted))
                    .await
                    .map_err(TransferError::Source)?;
            }
        }
    }
    flush_logs(target, &mut pending, report, progress).await
}

/// Refuses logs (as [`log_lengths`] gave them) of which the target holds
/// more than the source: it is not a copy of it.
fn not_ahead(logs: &[(TaskId, u64, u64)]) -> Result<(), TransferError> {
    match logs.iter().find(|(_, source, target)| target > source) {
        Some(&(task, source_bytes, target_bytes)) => Err(TransferError::LogDiverged {
            task,
            source_bytes,
            target_bytes,
        }),
        None => Ok(()),
    }
}

/// Brings the logs of `tasks` in the target level with the source's,
/// appending what the target lacks.
pub(crate) async fn sync_logs(
    source: &dyn BulkTransfer,
    target: &dyn BulkTransfer,
    tasks: &[TaskId],
) -> Result<(), TransferError> {
    let logs = log_lengths(source, target, tasks).await?;
    not_ahead(&logs)?;
    let mut report = CopyReport {
        dry_run: false,
        kinds: Vec::new(),
        logs: 0,
        log_bytes: 0,
        log_bytes_written: 0,
        unreadable: Vec::new(),
    };
    copy_logs(source, &logs, target, &mut report, &Silent).await
}

/// Reads on in one log, where an answer came back short.
async fn read_log(
    store: &dyn BulkTransfer,
    task: TaskId,
    offset: u64,
    max_bytes: usize,
) -> Result<LogChunk, Error> {
    let chunk = store.read_logs(&[(task, offset, max_bytes)]).await?;
    Ok(chunk.into_iter().next().unwrap_or(LogChunk {
        data: Vec::new(),
        next_offset: offset,
    }))
}

/// How much of a log to ask for at once, from `from` of `wanted` bytes.
fn chunk_len(from: u64, wanted: u64) -> usize {
    usize::try_from(wanted.saturating_sub(from))
        .unwrap_or(usize::MAX)
        .min(LOG_CHUNK)
}

/// `(task, from, wanted)` logs in rounds asking for at most
/// [`LOG_BATCH_BYTES`] (at least one log each), so one read of many logs
/// holds a bounded amount of memory.
fn log_rounds(logs: &[(TaskId, u64, u64)]) -> Vec<&[(TaskId, u64, u64)]> {
    let mut rounds = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, &(_, from, wanted)) in logs.iter().enumerate() {
        let asked = chunk_len(from, wanted);
        if i > start && bytes + asked > LOG_BATCH_BYTES {
            rounds.push(&logs[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += asked;
    }
    if start < logs.len() {
        rounds.push(&logs[start..]);
    }
    rounds
}

/// Each task with its log's length in the source, and 0 in the target.
async fn source_log_lengths(
    source: &dyn BulkTransfer,
    tasks: &[TaskId],
) -> Result<Vec<(TaskId, u64, u64)>, TransferError> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let lengths = source
        .log_lengths(tasks)
        .await
        .map_err(TransferError::Source)?;
    Ok(tasks
        .iter()
        .zip(lengths)
        .map(|(&task, source)| (task, source, 0))
        .collect())
}

/// Each task with its log's length in the source and in the target.
async fn log_lengths(
    source: &dyn BulkTransfer,
    target: &dyn BulkTransfer,
    tasks: &[TaskId],
) -> Result<Vec<(TaskId, u64, u64)>, TransferError> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let source_lengths = source
        .log_lengths(tasks)
        .await
        .map_err(TransferError::Source)?;
    let target_lengths = target
        .log_lengths(tasks)
        .await
        .map_err(TransferError::Target)?;
    Ok(tasks
        .iter()
        .zip(source_lengths.into_iter().zip(target_lengths))
        .map(|(&task, (source, target))| (task, source, target))
        .collect())
}

async fn flush_logs(
    target: &dyn BulkTransfer,
    pending: &mut Vec<LogPiece>,
    report: &mut CopyReport,
    progress: &dyn Progress,
) -> Result<(), TransferError> {
    if pending.is_empty() {
        return Ok(());
    }
    target
        .import_logs(pending)
        .await
        .map_err(TransferError::Target)?;
    report.log_bytes_written += pending.iter().map(|p| p.data.len() as u64).sum::<u64>();
    pending.clear();
    progress.wrote();
    Ok(())
}

/// One record, or log, that differs between the two stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// `workflow`, `task` or `log` (of the task `key`).
    pub kind: String,
    pub key: String,
    pub problem: String,
}

/// One kind of record on both sides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindCompared {
    pub kind: String,
    pub source: u64,
    pub target: u64,
    /// SHA-256 over every record's key and content, in key order.
    pub source_checksum: String,
    pub target_checksum: String,
}

/// What a verify found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// Workflows, tasks and logs.
    pub kinds: Vec<KindCompared>,
    /// How many records differ in all.
    pub mismatch_count: u64,
    /// The first of them, in key order.
    pub mismatches: Vec<Mismatch>,
    /// How many mismatches are listed in `mismatches`; the rest are only
    /// counted.
    #[serde(skip)]
    listed: usize,
}

impl VerifyReport {
    pub fn matches(&self) -> bool {
        self.mismatch_count == 0
    }

    fn record(&mut self, kind: &str, key: &str, problem: impl Into<String>) {
        self.mismatch_count += 1;
        if self.mismatches.len() < self.listed {
            self.mismatches.push(Mismatch {
                kind: kind.to_owned(),
                key: key.to_owned(),
                problem: problem.into(),
            });
        }
    }
}

/// Reads one kind of record in key order, a batch at a time.
struct Cursor<'a> {
    store: &'a dyn BulkTransfer,
    kind: RecordKind,
    batch_size: usize,
    buffer: VecDeque<Scanned>,
    after: Option<String>,
    done: bool,
}

impl<'a> Cursor<'a> {
    fn new(store: &'a dyn BulkTransfer, kind: RecordKind, batch_size: usize) -> Cursor<'a> {
        Cursor {
            store,
            kind,
            batch_size,
            buffer: VecDeque::new(),
            after: None,
            done: false,
        }
    }

    async fn peek(&mut self) -> Result<Option<&Scanned>, Error> {
        if self.buffer.is_empty() && !self.done {
            let batch = self
                .store
                .scan(self.kind, self.after.as_deref(), self.batch_size)
                .await?;
            self.done = batch.len() < self.batch_size;
            self.after = batch.last().map(|s| s.key.clone());
            self.buffer.extend(batch);
        }
        Ok(self.buffer.front())
    }

    fn next(&mut self) -> Option<Scanned> {
        self.buffer.pop_front()
    }
}

/// A running checksum over records or logs in key order.
#[derive(Default)]
struct Checksum {
    hasher: Sha256,
    count: u64,
}

impl Checksum {
    fn add(&mut self, key: &str, content: Result<&[u8], &str>) {
        self.count += 1;
        self.hasher.update(key.as_bytes());
        match content {
            Ok(bytes) => {
                self.hasher.update(b"=");
                self.hasher.update(Sha256::digest(bytes));
            }
            Err(reason) => {
                self.hasher.update(b"!");
                self.hasher.update(reason.as_bytes());
            }
        }
    }

    fn hex(self) -> String {
        orchestrator_core::access::hex(&self.hasher.finalize())
    }
}

/// Compares every record and every log of the two stores: counts per kind,
/// a checksum per kind, and each record by content. Reads only.
pub async fn verify(
    source: &dyn BulkTransfer,
    target: &dyn BulkTransfer,
    batch_size: usize,
    progress: &dyn Progress,
) -> Result<VerifyReport, TransferError> {
    verify_listing(source, target, batch_size, progress, MISMATCHES_LISTED).await
}

/// [`verify`], listing up to `listed` mismatches: a storage move wants
/// every one of them, to apply each again.
pub(crate) async fn verify_listing(
    source: &dyn BulkTransfer,
    target: &dyn BulkTransfer,
    batch_size: usize,
    progress: &dyn Progress,
    listed: usize,
) -> Result<VerifyReport, TransferError> {
    let batch_size = batch_size.max(1);
    let mut report = VerifyReport {
        kinds: Vec::new(),
        mismatch_count: 0,
        mismatches: Vec::new(),
        listed,
    };
    let mut source_logs = Checksum::default();
    let mut target_logs = Checksum::default();
    for kind in RecordKind::ALL {
        progress.phase(
            kind,
            source.count(kind).await.map_err(TransferError::Source)?,
        );
        let mut left = Cursor::new(source, kind, batch_size);
        let mut right = Cursor::new(target, kind, batch_size);
        let (mut left_sum, mut right_sum) = (Checksum::default(), Checksum::default());
        // Tasks on both sides, whose logs are compared a batch at a time.
        let mut in_both: Vec<TaskId> = Vec::new();
        loop {
            let left_key = left
                .peek()
                .await
                .map_err(TransferError::Source)?
                .map(|s| s.key.clone());
            let right_key = right
                .peek()
                .await
                .map_err(TransferError::Target)?
                .map(|s| s.key.clone());
            let (take_left, take_right) = match (&left_key, &right_key) {
                (None, None) => break,
                (Some(_), None) => (true, false),
                (None, Some(_)) => (false, true),
                (Some(l), Some(r)) => (l <= r, r <= l),
            };
            let a = if take_left { left.next() } else { None };
            let b = if take_right { right.next() } else { None };
            let json = |s: &Scanned| s.record.as_ref().map(Record::to_json).map_err(Clone::clone);
            let a_json = a.as_ref().map(json);
            let b_json = b.as_ref().map(json);
            if let (Some(a), Some(json)) = (&a, &a_json) {
                left_sum.add(&a.key, json.as_deref().map_err(String::as_str));
                progress.advance(1);
            }
            if let (Some(b), Some(json)) = (&b, &b_json) {
                right_sum.add(&b.key, json.as_deref().map_err(String::as_str));
            }
            let name = kind.as_str();
            match (a_json, b_json) {
                (Some(Err(reason)), _) => report.record(
                    name,
                    &key_of(a),
                    format!("unreadable in the source: {reason}"),
                ),
                (_, Some(Err(reason))) => report.record(
                    name,
                    &key_of(b),
                    format!("unreadable in the target: {reason}"),
                ),
                (Some(Ok(_)), None) => report.record(name, &key_of(a), "missing in the target"),
                (None, Some(Ok(_))) => {
                    report.record(name, &key_of(b), "only in the target, not in the source")
                }
                (Some(Ok(x)), Some(Ok(y))) => {
                    let key = key_of(a);
                    if x != y {
                        report.record(
                            name,
                            &key,
                            format!("content differs: {}", first_difference(&x, &y)),
                        );
                    }
                    if kind == RecordKind::Task
                        && let Ok(id) = key.parse()
                    {
                        in_both.push(id);
                        if in_both.len() >= batch_size {
                            compare_logs(
                                source,
                                target,
                                &std::mem::take(&mut in_both),
                                &mut source_logs,
                                &mut target_logs,
                                &mut report,
                            )
                            .await?;
                        }
                    }
                }
                (None, None) => {}
            }
        }
        compare_logs(
            source,
            target,
            &in_both,
            &mut source_logs,
            &mut target_logs,
            &mut report,
        )
        .await?;
        report.kinds.push(KindCompared {
            kind: kind.plural().to_owned(),
            source: left_sum.count,
            target: right_sum.count,
            source_checksum: left_sum.hex(),
            target_checksum: right_sum.hex(),
        });
    }
    report.kinds.push(KindCompared {
        kind: "logs".to_owned(),
        source: source_logs.count,
        target: target_logs.count,
        source_checksum: source_logs.hex(),
        target_checksum: target_logs.hex(),
    });
    Ok(report)
}

fn key_of(scanned: Option<Scanned>) -> String {
    scanned.map(|s| s.key).unwrap_or_default()
}

/// Where two JSON documents first differ, for the message: the first
/// differing top-level field, or the byte offset.
fn first_difference(left: &[u8], right: &[u8]) -> String {
    let parse =
        |b: &[u8]| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(b).ok();
    if let (Some(l), Some(r)) = (parse(left), parse(right))
        && let Some(field) = l
            .keys()
            .chain(r.keys())
            .find(|k| l.get(k.as_str()) != r.get(k.as_str()))
    {
        return format!("field `{field}`");
    }
    let at = left.iter().zip(right).take_while(|(a, b)| a == b).count();
    format!("from byte {at}")
}

/// Compares the logs of tasks present on both sides: lengths, then
/// content, both added to the running log checksums.
async fn compare_logs(
    source: &dyn BulkTransfer,
    target: &dyn BulkTransfer,
    tasks: &[TaskId],
    source_sum: &mut Checksum,
    target_sum: &mut Checksum,
    report: &mut VerifyReport,
) -> Result<(), TransferError> {
    let lengths: Vec<(TaskId, u64, u64)> = log_lengths(source, target, tasks)
        .await?
        .into_iter()
        .filter(|&(_, left, right)| left > 0 || right > 0)
        .collect();
    let left: Vec<(TaskId, u64, u64)> = lengths.iter().map(|&(t, l, _)| (t, 0, l)).collect();
    let right: Vec<(TaskId, u64, u64)> = lengths.iter().map(|&(t, _, r)| (t, 0, r)).collect();
    let left_digests = log_digests(source, &left)
        .await
        .map_err(TransferError::Source)?;
    let right_digests = log_digests(target, &right)
        .await
        .map_err(TransferError::Target)?;
    for ((task, left, right), (left_digest, right_digest)) in lengths
        .into_iter()
        .zip(left_digests.iter().zip(&right_digests))
    {
        let key = task.to_string();
        if left > 0 {
            source_sum.add(&key, Ok(left_digest.as_slice()));
        }
        if right > 0 {
            target_sum.add(&key, Ok(right_digest.as_slice()));
        }
        if left != right {
            report.record(
                "log",
                &key,
                format!("{left} bytes in the source, {right} in the target"),
            );
        } else if left_digest != right_digest {
            report.record("log", &key, "same length, different content");
        }
    }
    Ok(())
}

/// SHA-256 of the first `length` bytes of each task's log (`(task, 0,
/// length)` each), read many logs at a time.
async fn log_digests(
    store: &dyn BulkTransfer,
    logs: &[(TaskId, u64, u64)],
) -> Result<Vec<Vec<u8>>, Error> {
    let mut digests = Vec::with_capacity(logs.len());
    for round in log_rounds(logs) {
        let asks: Vec<(TaskId, u64, usize)> = round
            .iter()
            .map(|&(task, from, length)| (task, from, chunk_len(from, length)))
            .collect();
        // A log of length 0 needs no read.
        let answers = if asks.iter().all(|&(_, _, n)| n == 0) {
            Vec::new()
        } else {
            store.read_logs(&asks).await?
        };
        let mut answers = answers.into_iter();
        for &(task, _, length) in round {
            let mut hasher = Sha256::new();
            let mut chunk = answers.next().unwrap_or(crate::LogChunk {
                data: Vec::new(),
                next_offset: 0,
            });
            loop {
                if chunk.data.is_empty() {
                    break;
                }
                hasher.update(&chunk.data);
                let offset = chunk.next_offset;
                if offset >= length {
                    break;
                }
                chunk = read_log(store, task, offset, chunk_len(offset, length)).await?;
            }
            digests.push(hasher.finalize().to_vec());
        }
    }
    Ok(digests)
}
