//! Task logs: one file each, `logs/<task-id>.log`, for the service's store
//! and the migration's indexed one alike.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use orchestrator_core::TaskId;

use crate::{Error, LogChunk, LogPiece, Result};

/// Appends each piece to its log (`paths`, in the same order), which must
/// be exactly its offset long (else [`Error::Conflict`]), then makes them
/// all durable with one sync of the filesystem, new names included,
/// instead of two syncs per file.
fn write_log_pieces(pieces: &[LogPiece], logs_dir: &Path) -> Result<()> {
    for piece in pieces {
        let path = &log_path(logs_dir, piece.task);
        let io = |e| Error::io(format!("write {}", path.display()), e);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        let found = file.metadata().map_err(io)?.len();
        if found != piece.offset {
            return Err(Error::Conflict {
                what: "task log",
                id: piece.task.to_string(),
                expected: piece.offset,
                found,
            });
        }
        file.write_all(&piece.data).map_err(io)?;
    }
    let dir =
        File::open(logs_dir).map_err(|e| Error::io(format!("open {}", logs_dir.display()), e))?;
    nix::unistd::syncfs(&dir).map_err(|e| {
        Error::io(
            format!("sync {}", logs_dir.display()),
            std::io::Error::from(e),
        )
    })
}

pub(super) fn log_path(logs_dir: &Path, id: TaskId) -> PathBuf {
    logs_dir.join(format!("{id}.log"))
}

/// Each task's log length in bytes, 0 for none, in the order asked.
pub(super) fn log_file_lengths(logs_dir: &Path, ids: &[TaskId]) -> Result<Vec<u64>> {
    ids.iter()
        .map(|id| log_file_length(&log_path(logs_dir, *id)))
        .collect()
}

/// [`log_file_lengths`] off the async runtime: a migration asks for
/// hundreds at a time, and a service keeps answering requests meanwhile.
pub(super) async fn log_file_lengths_off(logs_dir: &Path, ids: &[TaskId]) -> Result<Vec<u64>> {
    let (logs_dir, ids) = (logs_dir.to_owned(), ids.to_vec());
    tokio::task::spawn_blocking(move || log_file_lengths(&logs_dir, &ids))
        .await
        .map_err(|e| Error::io("read log lengths", std::io::Error::other(e)))?
}

/// [`read_log_files`] off the async runtime, for the same reason.
pub(super) async fn read_log_files_off(
    logs_dir: &Path,
    asks: &[(TaskId, u64, usize)],
) -> Result<Vec<LogChunk>> {
    let (logs_dir, asks) = (logs_dir.to_owned(), asks.to_vec());
    tokio::task::spawn_blocking(move || read_log_files(&logs_dir, &asks))
        .await
        .map_err(|e| Error::io("read task logs", std::io::Error::other(e)))?
}

/// A log file's length in bytes, 0 for none.
pub(super) fn log_file_length(path: &Path) -> Result<u64> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(Error::io(format!("stat {}", path.display()), e)),
    }
}

/// [`write_log_pieces`] off the async runtime.
pub(super) async fn import_log_files(logs_dir: &Path, pieces: &[LogPiece]) -> Result<()> {
    let pieces = pieces.to_vec();
    let logs_dir = logs_dir.to_owned();
    tokio::task::spawn_blocking(move || write_log_pieces(&pieces, &logs_dir))
        .await
        .map_err(|e| Error::io("write task logs", std::io::Error::other(e)))?
}

/// [`read_log_file`] of each ask: `(task, offset, max_bytes)`.
pub(super) fn read_log_files(
    logs_dir: &Path,
    asks: &[(TaskId, u64, usize)],
) -> Result<Vec<LogChunk>> {
    asks.iter()
        .map(|&(id, offset, max_bytes)| read_log_file(&log_path(logs_dir, id), offset, max_bytes))
        .collect()
}

/// Up to `max_bytes` of a task's log file from `offset`; a missing file is
/// an empty log.
pub(super) fn read_log_file(path: &Path, offset: u64, max_bytes: usize) -> Result<LogChunk> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(LogChunk {
                data: Vec::new(),
                next_offset: offset,
            });
        }
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    let mut data = Vec::new();
    file.seek(SeekFrom::Start(offset))
        .and_then(|_| file.take(max_bytes as u64).read_to_end(&mut data))
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    Ok(LogChunk {
        next_offset: offset + data.len() as u64,
        data,
    })
}

/// Appends `chunk` to the log at `path`; returns the log's length after it.
/// An append-mode write leaves this handle's position at the end of what
/// it wrote, even with other appends racing it.
pub(super) fn append_log_file(path: &Path, chunk: &[u8]) -> Result<u64> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| {
            file.write_all(chunk)?;
            file.stream_position()
        })
        .map_err(|e| Error::io(format!("append to {}", path.display()), e))
}

/// Removes the logs of pruned tasks; after a prune that deleted something,
/// also any log that no stored task names (left by a crash mid-prune).
pub(super) fn remove_logs(
    logs_dir: &Path,
    pruned: &[TaskId],
    sweep: bool,
    live: &std::collections::HashSet<TaskId>,
) -> Result<()> {
    let remove = |path: &Path| match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    };
    for id in pruned {
        remove(&log_path(logs_dir, *id))?;
    }
    if !sweep {
        return Ok(());
    }
    let entries = std::fs::read_dir(logs_dir)
        .map_err(|e| Error::io(format!("read {}", logs_dir.display()), e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let orphan = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|id| id.parse::<uuid::Uuid>().ok())
            .is_some_and(|id| !live.contains(&TaskId::from_uuid(id)));
        if orphan {
            remove(&entry.path())?;
        }
    }
    Ok(())
}
