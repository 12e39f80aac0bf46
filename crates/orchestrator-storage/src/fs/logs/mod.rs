//! Task logs, many to a file: `logs/<n>.pack`, each a sequence of frames
//! (`frame`), and in memory where each log's pieces are (`index`). For the
//! service's store and the migration's indexed one alike.
//!
//! A file per log made every step create an inode and every prune delete
//! one, which ext4 makes slow after mass deletions; a pack takes the
//! pieces of every log, appended, up to [`ROLL_BYTES`], then is sealed
//! and synced, and the next one starts.
//!
//! **Durability.** As before, appends are not synced: a power loss may
//! lose the last lines of a log (the frames torn or lost at the end of the
//! pack being written are dropped at the next open). An import (a
//! migration, a backup, a storage move) is synced before it returns.
//!
//! **Space.** A prune forgets its logs; a pack at least half of whose
//! bytes are forgotten is rewritten: its remaining pieces are copied to
//! the pack being written (a new one if that is the pack rewritten), which
//! is synced, and then the old one is deleted. A crash in between leaves
//! both, and a piece found twice counts once.
//!
//! **Legacy files.** Before packs (layout 3 and older) a log was the file
//! `logs/<task>.log`. A store opened to be read reads them as they are;
//! a store opened to be written packs them first ([`pack_legacy_logs`]).

mod frame;
mod index;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use orchestrator_core::TaskId;

use self::frame::{End, HEADER, MAX_PIECE};
use self::index::{Index, LEGACY_FILE, Piece, Spot};
use crate::{Error, LogChunk, LogPiece, Result};

/// A pack is sealed and the next begun once it holds this much.
const ROLL_BYTES: u64 = 32 * 1024 * 1024;

/// A piece this long or longer is written from where it is, after its
/// header, rather than copied into the write's buffer with smaller ones:
/// a flood of output arrives in batches of up to 16 MiB, which a copy
/// would double.
const WRITTEN_IN_PLACE: usize = 64 * 1024;

/// Whether a store's logs are written, or only read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// The dir's lock is held: torn frames at the end of a pack are cut
    /// off, and appends go on.
    Write,
    /// Read as found, while a service may go on appending: nothing is
    /// changed, and frames appended after the open are not seen.
    Read,
}

pub(super) struct Logs {
    dir: PathBuf,
    mode: Mode,
    /// [`ROLL_BYTES`], but for tests.
    roll_bytes: u64,
    /// A std mutex, never held across an `.await`: every call runs on the
    /// blocking pool. It orders the appends to the active pack and the
    /// index's changes; reads copy out where the pieces are and read
    /// them after letting go. A rewrite (after a prune) holds it while it
    /// copies one pack's live pieces, at most half a pack, so an append
    /// waits for at most that.
    packs: Mutex<Packs>,
}

struct Pack {
    /// Shared with reads in flight: a pack deleted meanwhile stays
    /// readable through it.
    file: Arc<File>,
    /// Its length: where the next frame goes.
    bytes: u64,
    /// The bytes of the frames the index still points to.
    live: u64,
    sealed: bool,
}

#[derive(Default)]
struct Packs {
    index: Index,
    packs: BTreeMap<u32, Pack>,
    /// Whether a pack was created since the dir was last synced: an
    /// import syncs the dir then, so that the new packs are found after a
    /// power loss.
    created_unsynced: bool,
}

/// What a write's pieces are to the index.
#[derive(Debug, Clone, Copy)]
enum Placement {
    /// New bytes at the end of their logs.
    Append,
    /// Copies of pieces the index has, which now point to them.
    Move,
    /// The copy of the last [`index::MERGED`] pieces of a log, which it
    /// replaces; the level of the merged piece.
    Merge(u8),
}

/// The frames found at open: the pieces that start a log, and the others
/// (see [`Index::build`]).
#[derive(Default)]
struct Found {
    firsts: Vec<(TaskId, Spot)>,
    rest: Vec<(TaskId, Piece)>,
}

impl Found {
    fn add(&mut self, task: TaskId, log_offset: u64, spot: Spot) {
        if log_offset == 0 {
            self.firsts.push((task, spot));
        } else {
            self.rest.push((task, Piece::new(log_offset, spot)));
        }
    }
}

/// Reads pack `number`'s frames from its start, handing each to `found`
/// with where its piece starts in the log and in the pack.
fn scan(
    mut file: &File,
    number: u32,
    check_pieces: bool,
    mut found: impl FnMut(TaskId, u64, Spot),
) -> std::io::Result<End> {
    use std::io::Seek;
    file.rewind()?;
    let mut beyond = false;
    frame::read_pack(file, check_pieces, |frame, at| {
        // A pack ends within a frame of ROLL_BYTES: a place past 32 bits
        // is not one this build wrote, and nothing after it is read.
        match u32::try_from(at) {
            Ok(at) if !beyond => {
                let spot = Spot {
                    at,
                    pack: number,
                    len: frame.len,
                };
                found(frame.task, frame.log_offset, spot);
            }
            _ => beyond = true,
        }
    })
}

fn pack_name(number: u32) -> String {
    format!("{number:08}.pack")
}

fn io_error(what: impl std::fmt::Display, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let context = format!("{what} {}", path.display());
    move |e| Error::io(context, e)
}

/// What is in a logs dir.
#[derive(Default)]
struct Listing {
    /// Its packs' numbers, in order.
    packs: Vec<u32>,
    /// Its legacy log files, by task, with their lengths.
    legacy: Vec<(TaskId, u64)>,
}

fn list(dir: &Path) -> Result<Listing> {
    let Listing {
        mut packs,
        mut legacy,
    } = Listing::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // A store that never had a log (a backup of one holds no `logs/`).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Listing::default()),
        Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_error("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(number) = name.strip_suffix(".pack").and_then(|n| n.parse().ok()) {
            packs.push(number);
        } else if let Some(id) = name.strip_suffix(".log").and_then(|n| n.parse().ok()) {
            let bytes = entry
                .metadata()
                .map_err(io_error("stat", &entry.path()))?
                .len();
            legacy.push((TaskId::from_uuid(id), bytes));
        }
    }
    packs.sort_unstable();
    Ok(Listing { packs, legacy })
}

impl Logs {
    /// Opens the logs in `dir`, keeping those of the tasks `keep` names
    /// (the rest, left by a crash in the middle of a prune, are forgotten
    /// and their room given back).
    pub(super) fn open(dir: &Path, mode: Mode, keep: impl Fn(TaskId) -> bool) -> Result<Logs> {
        // A reader races a service that may delete a pack it rewrote
        // (after copying its pieces into a newer one, possibly not listed
        // yet): a pack gone between the listing and its opening means
        // starting over.
        let mut attempts = 0;
        loop {
            match Self::open_listed(dir, mode, &keep) {
                Err(Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound
                        && mode == Mode::Read
                        && attempts < 10 =>
                {
                    attempts += 1;
                }
                result => return result,
            }
        }
    }

    fn open_listed(dir: &Path, mode: Mode, keep: &impl Fn(TaskId) -> bool) -> Result<Logs> {
        let Listing {
            packs: numbers,
            legacy,
        } = list(dir)?;
        // Two passes: the first counts the frames (and finds where each
        // pack ends), so that the lists they go to are made once at their
        // size. Grown by doubling, the lists each log's place is kept in
        // leave the allocator holding as much again.
        let mut counts = (0, 0);
        /// Counts a pack's pieces that start a log, and the others.
        fn counting(counts: &mut (usize, usize)) -> impl FnMut(TaskId, u64, Spot) + '_ {
            |_, log_offset, _| match log_offset {
                0 => counts.0 += 1,
                _ => counts.1 += 1,
            }
        }
        let mut opened = Vec::new();
        let last = numbers.last().copied();
        for number in numbers {
            let path = dir.join(pack_name(number));
            let file = OpenOptions::new()
                .read(true)
                .write(mode == Mode::Write)
                .open(&path)
                .map_err(io_error("open", &path))?;
            let mut in_pack = (0, 0);
            let mut end = scan(&file, number, false, counting(&mut in_pack))
                .map_err(io_error("read", &path))?;
            if !matches!(end, End::Sealed(_)) {
                // Not sealed: the last frames may be torn; check every piece.
                in_pack = (0, 0);
                end = scan(&file, number, true, counting(&mut in_pack))
                    .map_err(io_error("read", &path))?;
            }
            counts = (counts.0 + in_pack.0, counts.1 + in_pack.1);
            let (bytes, sealed) = match end {
                End::Sealed(bytes) => (bytes, true),
                End::Open(bytes) => (bytes, false),
                End::Damaged(bytes) => {
                    if mode == Mode::Write {
                        tracing::warn!(
                            pack = %path.display(),
                            kept_bytes = bytes,
                            "a log pack ends in a torn or damaged frame (a crash while it was \
                             written); cutting it off there"
                        );
                        file.set_len(bytes).map_err(io_error("truncate", &path))?;
                    }
                    (bytes, false)
                }
            };
            opened.push((number, path, file, bytes, sealed));
        }
        let legacy_pieces = |bytes: u64| bytes.div_ceil(u64::from(u32::MAX)) as usize;
        let mut found = Found::default();
        found.firsts.reserve_exact(counts.0 + legacy.len());
        found
            .rest
            .reserve_exact(counts.1 + legacy.iter().map(|(_, b)| legacy_pieces(*b)).sum::<usize>());
        let mut packs = BTreeMap::new();
        for (number, path, file, bytes, sealed) in opened {
            // Up to where the first pass found the pack's end: a reader's
            // service may have appended since.
            scan(&file, number, !sealed, |task, log_offset, spot| {
                if u64::from(spot.at) + u64::from(spot.len) <= bytes {
                    found.add(task, log_offset, spot);
                }
            })
            .map_err(io_error("read", &path))?;
            packs.insert(
                number,
                Pack {
                    file: Arc::new(file),
                    bytes,
                    live: 0,
                    sealed,
                },
            );
        }
        for (task, bytes) in legacy {
            let mut log_offset = 0;
            while log_offset < bytes {
                let len = (bytes - log_offset).min(u64::from(u32::MAX)) as u32;
                let spot = Spot {
                    at: 0,
                    pack: LEGACY_FILE,
                    len,
                };
                found.add(task, log_offset, spot);
                log_offset += u64::from(len);
            }
        }
        let index = Index::build(found.firsts, found.rest, keep);
        let mut state = Packs {
            index,
            packs,
            created_unsynced: false,
        };
        state.count_live();
        let logs = Logs {
            dir: dir.to_owned(),
            mode,
            roll_bytes: ROLL_BYTES,
            packs: Mutex::new(state),
        };
        if mode == Mode::Write {
            let mut packs = logs.lock();
            // Only the last pack is appended to; one before it that was
            // never sealed (a crash) is sealed now.
            let unsealed: Vec<u32> = packs
                .packs
                .iter()
                .filter(|(n, p)| !p.sealed && Some(**n) != last)
                .map(|(n, _)| *n)
                .collect();
            for number in unsealed {
                logs.seal(&mut packs, number)?;
            }
            drop(packs);
            logs.reclaim()?;
        }
        Ok(logs)
    }

    fn lock(&self) -> MutexGuard<'_, Packs> {
        // Every change to the index is made after its write succeeded, in
        // one step: a panic elsewhere leaves it whole.
        self.packs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn path(&self, number: u32) -> PathBuf {
        self.dir.join(pack_name(number))
    }

    fn writable(&self) -> Result<()> {
        match self.mode {
            Mode::Write => Ok(()),
            Mode::Read => Err(Error::ReadOnly(self.dir.display().to_string())),
        }
    }

    /// The log's length in bytes; 0 for none.
    pub(super) fn length(&self, task: TaskId) -> u64 {
        self.lock().index.length(task)
    }

    /// Each log's length, in the order asked.
    pub(super) fn lengths(&self, tasks: &[TaskId]) -> Vec<u64> {
        let packs = self.lock();
        tasks.iter().map(|t| packs.index.length(*t)).collect()
    }

    /// Appends `data` to the task's log; returns the log's length after it.
    pub(super) fn append(&self, task: TaskId, data: &[u8]) -> Result<u64> {
        self.writable()?;
        let mut packs = self.lock();
        let offset = packs.index.length(task);
        self.write(&mut packs, &[(task, offset, data)], Placement::Append)?;
        Ok(packs.index.length(task))
    }

    /// Writes imported pieces, each at its log's end (else
    /// [`Error::Conflict`], and nothing is written), and syncs them.
    pub(super) fn import(&self, pieces: &[LogPiece]) -> Result<()> {
        self.writable()?;
        let mut packs = self.lock();
        let mut ends = std::collections::HashMap::new();
        for piece in pieces {
            let end = ends
                .entry(piece.task)
                .or_insert_with(|| packs.index.length(piece.task));
            if *end != piece.offset {
                return Err(Error::Conflict {
                    what: "task log",
                    id: piece.task.to_string(),
                    expected: piece.offset,
                    found: *end,
                });
            }
            *end += piece.data.len() as u64;
        }
        let writes: Vec<_> = pieces
            .iter()
            .map(|p| (p.task, p.offset, p.data.as_slice()))
            .collect();
        self.write(&mut packs, &writes, Placement::Append)?;
        self.sync(&mut packs)
    }

    /// Appends the frames of `writes` to the active pack, rolling to a new
    /// one when it is full, and points the index at them.
    fn write(
        &self,
        packs: &mut Packs,
        writes: &[(TaskId, u64, &[u8])],
        placement: Placement,
    ) -> Result<()> {
        let mut buf = Vec::new();
        let mut placed = Vec::new();
        let mut number = self.active(packs)?;
        for &(task, mut log_offset, data) in writes {
            for piece in data.chunks(MAX_PIECE) {
                if packs.packs[&number].bytes + buf.len() as u64 >= self.roll_bytes {
                    self.flush(packs, number, &mut buf, &[], &mut placed, placement)?;
                    number = self.active(packs)?;
                }
                let at = packs.packs[&number].bytes + (buf.len() + HEADER) as u64;
                let at = u32::try_from(at).map_err(|_| {
                    Error::io(
                        format!("append to {}", self.path(number).display()),
                        std::io::Error::other("the pack is past 4 GiB"),
                    )
                })?;
                let spot = Spot {
                    at,
                    pack: number,
                    len: piece.len() as u32,
                };
                placed.push((task, Piece::new(log_offset, spot)));
                log_offset += piece.len() as u64;
                if piece.len() >= WRITTEN_IN_PLACE {
                    frame::encode_header(task, log_offset - piece.len() as u64, piece, &mut buf);
                    self.flush(packs, number, &mut buf, piece, &mut placed, placement)?;
                } else {
                    frame::encode(task, log_offset - piece.len() as u64, piece, &mut buf);
                }
            }
        }
        self.flush(packs, number, &mut buf, &[], &mut placed, placement)?;
        if matches!(placement, Placement::Append) {
            let mut tasks: Vec<TaskId> = writes.iter().map(|(task, _, _)| *task).collect();
            tasks.sort_unstable();
            tasks.dedup();
            self.merge_tails(packs, &tasks)?;
        }
        Ok(())
    }

    /// Copies the pieces that appends left at the end of each of these
    /// logs into one, [`index::MERGED`] of one level at a time, for as
    /// long as there are: a step that prints a line at a time costs
    /// memory by its log's size, not by its appends. The copies go where
    /// appends go; the pieces they replace are dead bytes, given back as
    /// a prune's are.
    fn merge_tails(&self, packs: &mut Packs, tasks: &[TaskId]) -> Result<()> {
        for &task in tasks {
            while let Some(tail) = packs.index.tail_to_merge(task) {
                let mut bytes = Vec::new();
                for piece in &tail {
                    let pack = packs.packs.get(&piece.spot.pack).ok_or_else(|| {
                        Error::io(
                            format!("merge the log of task {task}"),
                            std::io::Error::other(format!("pack {} is gone", piece.spot.pack)),
                        )
                    })?;
                    let start = bytes.len();
                    bytes.resize(start + piece.spot.len as usize, 0);
                    pack.file
                        .read_exact_at(&mut bytes[start..], u64::from(piece.spot.at))
                        .map_err(io_error("read", &self.path(piece.spot.pack)))?;
                }
                let (log_offset, level) = (tail[0].log_offset, tail[0].level + 1);
                self.write(
                    packs,
                    &[(task, log_offset, &bytes)],
                    Placement::Merge(level),
                )?;
                for piece in &tail {
                    packs.forget(piece.spot);
                }
            }
        }
        Ok(())
    }

    /// Writes `buf`, then `piece` (the piece whose header ends `buf`, or
    /// nothing), at the end of pack `number`; then, and only then, points
    /// the index at what it placed there. A failed write changes nothing:
    /// the next one goes over what it left.
    fn flush(
        &self,
        packs: &mut Packs,
        number: u32,
        buf: &mut Vec<u8>,
        piece: &[u8],
        placed: &mut Vec<(TaskId, Piece)>,
        placement: Placement,
    ) -> Result<()> {
        let path = self.path(number);
        let pack = packs.packs.get_mut(&number).ok_or_else(|| {
            Error::io(
                format!("append to {}", path.display()),
                std::io::ErrorKind::NotFound.into(),
            )
        })?;
        let end = pack.bytes + buf.len() as u64;
        pack.file
            .write_all_at(buf, pack.bytes)
            .and_then(|()| pack.file.write_all_at(piece, end))
            .map_err(io_error("append to", &path))?;
        let written = (buf.len() + piece.len()) as u64;
        pack.bytes += written;
        pack.live += written;
        buf.clear();
        for (task, piece) in placed.drain(..) {
            match placement {
                Placement::Append => packs.index.push(task, piece),
                Placement::Move => packs.index.repoint(task, piece.log_offset, piece.spot),
                Placement::Merge(level) => packs.index.merge(task, Piece { level, ..piece }),
            }
        }
        packs.index.settle();
        Ok(())
    }

    /// The pack to append to: the last one, unless it is sealed or full
    /// (then it is sealed, and a new one made).
    fn active(&self, packs: &mut Packs) -> Result<u32> {
        match packs
            .packs
            .last_key_value()
            .map(|(n, p)| (*n, p.sealed, p.bytes))
        {
            Some((number, false, bytes)) if bytes < self.roll_bytes => Ok(number),
            Some((number, sealed, _)) => {
                if !sealed {
                    self.seal(packs, number)?;
                }
                self.create(packs, number + 1)
            }
            None => self.create(packs, 1),
        }
    }

    fn create(&self, packs: &mut Packs, number: u32) -> Result<u32> {
        let path = self.path(number);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_error("create", &path))?;
        packs.packs.insert(
            number,
            Pack {
                file: Arc::new(file),
                bytes: 0,
                live: 0,
                sealed: false,
            },
        );
        packs.created_unsynced = true;
        Ok(number)
    }

    /// Ends pack `number` with the seal and syncs it: it is never written
    /// again, and its pieces need no check when it is next opened.
    fn seal(&self, packs: &mut Packs, number: u32) -> Result<()> {
        let path = self.path(number);
        let Some(pack) = packs.packs.get_mut(&number) else {
            return Ok(());
        };
        let seal = frame::seal();
        pack.file
            .write_all_at(&seal, pack.bytes)
            .and_then(|()| pack.file.sync_data())
            .map_err(io_error("seal", &path))?;
        pack.bytes += seal.len() as u64;
        pack.sealed = true;
        Ok(())
    }

    /// Makes everything written durable: the last pack's bytes (sealed
    /// ones were synced as they were sealed), and new packs' names.
    fn sync(&self, packs: &mut Packs) -> Result<()> {
        if let Some((number, pack)) = packs.packs.last_key_value() {
            pack.file
                .sync_data()
                .map_err(io_error("sync", &self.path(*number)))?;
        }
        if std::mem::take(&mut packs.created_unsynced) {
            File::open(&self.dir)
                .and_then(|dir| dir.sync_all())
                .map_err(io_error("sync", &self.dir))?;
        }
        Ok(())
    }

    /// Up to `max_bytes` of the task's log from `offset`.
    pub(super) fn read(&self, task: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        let reads: Vec<(Piece, Option<Arc<File>>)> = {
            let packs = self.lock();
            packs
                .index
                .pieces(task, offset, max_bytes)
                .into_iter()
                .map(|p| {
                    (
                        p,
                        packs.packs.get(&p.spot.pack).map(|pack| pack.file.clone()),
                    )
                })
                .collect()
        };
        let end = offset.saturating_add(max_bytes as u64);
        let mut data = Vec::new();
        for (piece, file) in reads {
            let from = offset.max(piece.log_offset);
            let to = end.min(piece.log_offset + u64::from(piece.spot.len));
            let at = piece.spot.file_offset(piece.log_offset, from);
            let start = data.len();
            data.resize(start + (to - from) as usize, 0);
            let read = match (piece.spot.pack, file) {
                (LEGACY_FILE, _) => File::open(self.dir.join(format!("{task}.log")))
                    .and_then(|f| f.read_exact_at(&mut data[start..], at)),
                (_, Some(file)) => file.read_exact_at(&mut data[start..], at),
                (number, None) => Err(std::io::Error::other(format!("pack {number} is gone"))),
            };
            read.map_err(|e| Error::io(format!("read the log of task {task}"), e))?;
        }
        Ok(LogChunk {
            next_offset: offset + data.len() as u64,
            data,
        })
    }

    /// Each ask's piece: `(task, offset, max_bytes)`.
    pub(super) fn read_many(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        asks.iter()
            .map(|&(task, offset, max)| self.read(task, offset, max))
            .collect()
    }

    /// Forgets the logs of pruned tasks, and gives back the room of packs
    /// at least half forgotten ([`Logs::reclaim`]).
    pub(super) fn remove(&self, tasks: &[TaskId]) -> Result<()> {
        self.writable()?;
        let mut packs = self.lock();
        for task in tasks {
            for spot in packs.index.remove(*task) {
                if spot.pack == LEGACY_FILE {
                    remove_if_there(&self.dir.join(format!("{task}.log")))?;
                } else {
                    packs.forget(spot);
                }
            }
        }
        drop(packs);
        self.reclaim()
    }

    /// Gives back the room of the packs at least half of whose bytes no
    /// log points to, one pack a hold of the lock, so that appends go on
    /// in between.
    fn reclaim(&self) -> Result<()> {
        while self.rewrite_one(&mut self.lock())? {}
        Ok(())
    }

    /// Rewrites one pack at least half of whose bytes no log points to:
    /// its live pieces are copied to the pack being written (a new one if
    /// it is that pack), which is synced before the old one is deleted; a
    /// pack with nothing live is just deleted. Whether there was one.
    fn rewrite_one(&self, packs: &mut Packs) -> Result<bool> {
        let wasted = packs
            .packs
            .iter()
            .find(|(_, p)| p.bytes > 0 && p.live * 2 <= p.bytes)
            .map(|(n, _)| *n);
        let Some(wasted) = wasted else {
            return Ok(false);
        };
        let mut moving: Vec<(TaskId, Piece)> = Vec::new();
        packs.index.each_piece(|task, piece| {
            if piece.spot.pack == wasted {
                moving.push((task, *piece));
            }
        });
        moving.sort_unstable_by_key(|(_, p)| p.spot.at);
        let path = self.path(wasted);
        let mut copies = Vec::with_capacity(moving.len());
        if let Some(pack) = packs.packs.get(&wasted) {
            for (task, piece) in &moving {
                let mut bytes = vec![0; piece.spot.len as usize];
                pack.file
                    .read_exact_at(&mut bytes, u64::from(piece.spot.at))
                    .map_err(io_error("read", &path))?;
                copies.push((*task, piece.log_offset, bytes));
            }
        }
        if !copies.is_empty() {
            if let Some((number, pack)) = packs.packs.last_key_value()
                && *number == wasted
                && !pack.sealed
            {
                let next = number + 1;
                self.create(packs, next)?;
            }
            let writes: Vec<_> = copies
                .iter()
                .map(|(t, o, d)| (*t, *o, d.as_slice()))
                .collect();
            self.write(packs, &writes, Placement::Move)?;
            self.sync(packs)?;
        }
        packs.packs.remove(&wasted);
        remove_if_there(&path)?;
        tracing::info!(
            pack = %path.display(),
            pieces_copied = copies.len(),
            "log pack rewritten to give back the room of pruned logs"
        );
        Ok(true)
    }
}

/// Removes a file; one already gone is fine.
fn remove_if_there(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

impl Packs {
    /// Takes a piece the index no longer points to off its pack's live
    /// bytes.
    fn forget(&mut self, spot: Spot) {
        if let Some(pack) = self.packs.get_mut(&spot.pack) {
            pack.live -= (HEADER as u64 + u64::from(spot.len)).min(pack.live);
        }
    }

    /// Counts each pack's live bytes from the index.
    fn count_live(&mut self) {
        let Packs { index, packs, .. } = self;
        index.each_piece(|_, piece| {
            if let Some(pack) = packs.get_mut(&piece.spot.pack) {
                pack.live += HEADER as u64 + u64::from(piece.spot.len);
            }
        });
    }
}

/// The layout upgrade to packs: the legacy files of `dir` (a data dir)
/// are written into a pack, which is synced, and then deleted. Safe to
/// repeat after a crash: a log packed twice counts once.
pub(super) fn pack_legacy_logs(data_dir: &Path) -> std::io::Result<()> {
    let dir = data_dir.join(super::LOGS_DIR);
    if !dir.exists() {
        return Ok(());
    }
    let to_io = |e: Error| std::io::Error::other(e.to_string());
    let legacy = list(&dir).map_err(to_io)?.legacy;
    if legacy.is_empty() {
        return Ok(());
    }
    let logs = Logs::open(&dir, Mode::Write, |_| true).map_err(to_io)?;
    let mut packed = 0u64;
    for (task, _) in &legacy {
        let path = dir.join(format!("{task}.log"));
        let data = std::fs::read(&path)?;
        // Not a legacy piece in the index any more once it is in a pack.
        let mut packs = logs.lock();
        packs.index.remove(*task);
        logs.write(&mut packs, &[(*task, 0, &data)], Placement::Append)
            .map_err(to_io)?;
        packed += data.len() as u64;
    }
    logs.sync(&mut logs.lock()).map_err(to_io)?;
    for (task, _) in &legacy {
        std::fs::remove_file(dir.join(format!("{task}.log")))?;
    }
    File::open(&dir)?.sync_all()?;
    tracing::info!(logs = legacy.len(), bytes = packed, "task log files packed");
    Ok(())
}

/// Each task's whole log from the data dir `data_dir`, in the order asked
/// (empty for none), read as a migration reads them. For tools that make
/// data sets from a store, such as the benchmark.
pub fn read_task_logs(data_dir: &Path, tasks: &[TaskId]) -> Result<Vec<Vec<u8>>> {
    let logs = Logs::open(&data_dir.join(super::LOGS_DIR), Mode::Read, |_| true)?;
    tasks
        .iter()
        .map(|task| {
            let length = logs.length(*task);
            Ok(logs.read(*task, 0, length as usize)?.data)
        })
        .collect()
}

/// Writes task logs into the data dir `data_dir`, which no service may
/// have open, as an import would, synced. For tools that make data sets.
pub fn write_task_logs(data_dir: &Path, logs: &[(TaskId, Vec<u8>)]) -> Result<()> {
    let dir = data_dir.join(super::LOGS_DIR);
    std::fs::create_dir_all(&dir).map_err(io_error("create", &dir))?;
    let store = Logs::open(&dir, Mode::Write, |_| true)?;
    let pieces: Vec<LogPiece> = logs
        .iter()
        .filter(|(_, data)| !data.is_empty())
        .map(|(task, data)| LogPiece {
            task: *task,
            offset: store.length(*task),
            data: data.clone(),
        })
        .collect();
    store.import(&pieces)
}

#[cfg(test)]
mod tests;
