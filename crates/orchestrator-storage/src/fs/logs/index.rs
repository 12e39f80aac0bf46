//! Where each task's log is: its pieces, each at a spot of a pack.
//!
//! Most of a store's logs belong to finished tasks, one piece each (a
//! step's output comes in one batch or a few), and are never written
//! again. Those found at open are kept in a sorted vector at 28 bytes a
//! log ([`Index::settled`]), built in place from the frames found; a log
//! appended to since, or of several pieces, in a map ([`Index::recent`]).

use std::collections::HashMap;

use orchestrator_core::TaskId;

use super::frame::MAX_PIECE;

/// The pack number of a log's legacy file, `<task>.log`, from before
/// packs: read, never written (an upgrade packs them).
pub(super) const LEGACY_FILE: u32 = u32::MAX;

/// Marks a settled log since appended to (it moved to `recent`) or removed.
const MOVED: u32 = u32::MAX - 1;

/// How many logs `recent` holds before those of one piece are settled: a
/// service that runs for months without a restart keeps each finished
/// step's log at the settled size, not a map entry's.
const SETTLE_AFTER: usize = 1024;

/// Where a piece's bytes are: in pack `pack`, from byte `at`. (A pack
/// ends within a frame of [`super::ROLL_BYTES`], so 32 bits hold any
/// place in it; a legacy file's piece is at its log offset, and `at` is
/// unused.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Spot {
    pub at: u32,
    pub pack: u32,
    pub len: u32,
}

impl Spot {
    /// Where the byte at `log_offset` of the piece `piece` is in its file.
    pub(super) fn file_offset(&self, piece_offset: u64, log_offset: u64) -> u64 {
        let into = log_offset - piece_offset;
        if self.pack == LEGACY_FILE {
            log_offset
        } else {
            u64::from(self.at) + into
        }
    }
}

/// A piece of a log: where it starts in the log, and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Piece {
    pub log_offset: u64,
    pub spot: Spot,
    /// 0 for a piece as appended (or found at open); `l + 1` for one that
    /// [`MERGED`] pieces of level `l` were copied into; [`FULL`] once too
    /// big to merge. (In the padding of the struct: free.)
    pub level: u8,
}

impl Piece {
    pub(super) fn new(log_offset: u64, spot: Spot) -> Piece {
        Piece {
            log_offset,
            spot,
            level: 0,
        }
    }

    fn end(&self) -> u64 {
        self.log_offset + u64::from(self.spot.len)
    }
}

/// How many pieces of one level, at the end of a log, are copied into one.
/// A step that prints a line at a time leaves a piece per append; merged
/// this way, a log keeps at most `MERGED - 1` pieces a level (a few
/// levels up to [`MAX_PIECE`]) plus pieces of about that size, and each
/// byte is copied once a level.
pub(super) const MERGED: usize = 16;

/// The level of a piece never merged again: merging it with the pieces
/// before it would pass [`MAX_PIECE`].
const FULL: u8 = u8::MAX;

/// A log's pieces, in order, without gaps, from offset 0.
#[derive(Debug, Default)]
struct Chain {
    pieces: Vec<Piece>,
}

impl Chain {
    /// The log's length: where its last piece ends.
    fn length(&self) -> u64 {
        self.pieces.last().map_or(0, Piece::end)
    }

    /// Adds a piece found at open, in the order of log offsets: its bytes
    /// past the chain's end, if it reaches there without a gap.
    fn add(&mut self, piece: Piece) {
        let length = self.length();
        if piece.spot.len == 0 || piece.end() <= length || piece.log_offset > length {
            return;
        }
        // A copy that overlaps the end: only its new bytes count.
        let skip = length - piece.log_offset;
        self.pieces.push(Piece::new(
            length,
            Spot {
                at: piece.spot.at + skip as u32,
                pack: piece.spot.pack,
                len: piece.spot.len - skip as u32,
            },
        ));
    }
}

#[derive(Debug, Default)]
pub(super) struct Index {
    /// Logs of one piece, sorted by task: those found at open, and those
    /// settled since ([`Index::settle`]).
    settled: Vec<(TaskId, Spot)>,
    recent: HashMap<TaskId, Chain>,
    /// How many entries of `settled` are [`MOVED`].
    moved: usize,
}

impl Index {
    /// The index of the frames found in a store's packs: `firsts`, the
    /// pieces that start a log (at offset 0), and `rest`, the others. Each
    /// log is the run of its pieces from offset 0 on: a piece found twice
    /// (a pack rewritten, and a crash before the old one went) counts
    /// once; a piece after a gap (its predecessor torn away by a crash) is
    /// not part of the log. Logs that `keep` refuses are left out.
    ///
    /// `firsts` becomes [`Index::settled`] in place: at a store's open it
    /// holds nearly every log, and a second list as long would cost the
    /// service its size again in memory that the allocator keeps.
    pub(super) fn build(
        mut firsts: Vec<(TaskId, Spot)>,
        mut rest: Vec<(TaskId, Piece)>,
        keep: impl Fn(TaskId) -> bool,
    ) -> Index {
        firsts.sort_unstable_by_key(|(task, spot)| (*task, std::cmp::Reverse(spot.len)));
        // At one offset the longest piece first (a merged copy): the
        // pieces it holds are then skipped as repeats.
        rest.sort_unstable_by_key(|(task, piece)| {
            (*task, piece.log_offset, std::cmp::Reverse(piece.spot.len))
        });
        let mut recent = HashMap::new();
        let mut rest_at = 0;
        let mut previous = None;
        firsts.retain(|&(task, spot)| {
            // The longest first piece of each task comes first: the rest
            // are copies of it, or shorter.
            if previous == Some(task) || spot.len == 0 || !keep(task) {
                return false;
            }
            previous = Some(task);
            while rest_at < rest.len() && rest[rest_at].0 < task {
                rest_at += 1;
            }
            let more = rest[rest_at..].iter().take_while(|(t, _)| *t == task);
            let mut chain = Chain {
                pieces: vec![Piece::new(0, spot)],
            };
            for &(_, piece) in more {
                chain.add(piece);
            }
            if chain.pieces.len() == 1 {
                return true;
            }
            recent.insert(task, chain);
            false
        });
        firsts.shrink_to_fit();
        Index {
            settled: firsts,
            recent,
            moved: 0,
        }
    }

    fn settled_at(&self, task: TaskId) -> Option<usize> {
        let at = self
            .settled
            .binary_search_by_key(&task, |(id, _)| *id)
            .ok()?;
        (self.settled[at].1.pack != MOVED).then_some(at)
    }

    /// The log's length in bytes; 0 for none.
    pub(super) fn length(&self, task: TaskId) -> u64 {
        if let Some(chain) = self.recent.get(&task) {
            return chain.length();
        }
        self.settled_at(task)
            .map_or(0, |at| u64::from(self.settled[at].1.len))
    }

    /// The pieces that hold the log's bytes from `offset`, up to `max`.
    pub(super) fn pieces(&self, task: TaskId, offset: u64, max: usize) -> Vec<Piece> {
        let end = offset.saturating_add(max as u64);
        let overlaps = |piece: &Piece| piece.log_offset < end && piece.end() > offset;
        if let Some(chain) = self.recent.get(&task) {
            let first = chain.pieces.partition_point(|p| p.end() <= offset);
            return chain.pieces[first..]
                .iter()
                .take_while(|p| overlaps(p))
                .copied()
                .collect();
        }
        self.settled_at(task)
            .map(|at| Piece::new(0, self.settled[at].1))
            .filter(overlaps)
            .into_iter()
            .collect()
    }

    /// Appends a piece to the log, which must be `piece.log_offset` long.
    pub(super) fn push(&mut self, task: TaskId, piece: Piece) {
        let chain = match self.recent.entry(task) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut chain = Chain::default();
                let at = self
                    .settled
                    .binary_search_by_key(&task, |(id, _)| *id)
                    .ok()
                    .filter(|at| self.settled[*at].1.pack != MOVED);
                if let Some(at) = at {
                    self.moved += 1;
                    let spot = std::mem::replace(&mut self.settled[at].1.pack, MOVED);
                    let spot = Spot {
                        pack: spot,
                        ..self.settled[at].1
                    };
                    chain.pieces.push(Piece::new(0, spot));
                }
                entry.insert(chain)
            }
        };
        debug_assert_eq!(chain.length(), piece.log_offset);
        chain.pieces.push(piece);
    }

    /// Moves the logs of one piece from `recent` into `settled`, once
    /// `recent` holds [`SETTLE_AFTER`] logs. A log settled while its step
    /// still runs moves back at its next append, leaving a mark in
    /// `settled` that a later settling reuses or sweeps.
    pub(super) fn settle(&mut self) {
        if self.recent.len() < SETTLE_AFTER {
            return;
        }
        let mut moving = Vec::new();
        self.recent
            .retain(|task, chain| match chain.pieces.as_slice() {
                [one] => {
                    moving.push((*task, one.spot));
                    false
                }
                _ => true,
            });
        moving.sort_unstable_by_key(|(task, _)| *task);
        // Ids are UUIDv7: most sort after every settled one. Those that do
        // not (a step created before others that ran first) are merged in.
        let mut late = Vec::new();
        for (task, spot) in moving {
            match self.settled.binary_search_by_key(&task, |(id, _)| *id) {
                Ok(at) => {
                    // Its own mark, from when it moved back to `recent`.
                    self.settled[at].1 = spot;
                    self.moved -= 1;
                }
                Err(at) if at == self.settled.len() => self.settled.push((task, spot)),
                Err(_) => late.push((task, spot)),
            }
        }
        merge_sorted(&mut self.settled, &late);
        if self.moved * 4 > self.settled.len() {
            self.settled.retain(|(_, spot)| spot.pack != MOVED);
            self.settled.shrink_to_fit();
            self.moved = 0;
        }
    }

    /// The last [`MERGED`] pieces of the log, if they are of one level
    /// and fit one frame together: to be copied into one piece
    /// ([`Index::merge`]). Pieces that would not fit are marked [`FULL`].
    pub(super) fn tail_to_merge(&mut self, task: TaskId) -> Option<Vec<Piece>> {
        let chain = self.recent.get_mut(&task)?;
        let first = chain.pieces.len().checked_sub(MERGED)?;
        let tail = &mut chain.pieces[first..];
        let level = tail[0].level;
        let one_level = tail
            .iter()
            .all(|p| p.level == level && p.spot.pack != LEGACY_FILE);
        if level == FULL || !one_level {
            return None;
        }
        let bytes: u64 = tail.iter().map(|p| u64::from(p.spot.len)).sum();
        if bytes > MAX_PIECE as u64 {
            for piece in tail {
                piece.level = FULL;
            }
            return None;
        }
        Some(tail.to_vec())
    }

    /// Replaces the last [`MERGED`] pieces of the log with `merged`, the
    /// copy of their bytes.
    pub(super) fn merge(&mut self, task: TaskId, merged: Piece) {
        if let Some(chain) = self.recent.get_mut(&task)
            && let Some(first) = chain.pieces.len().checked_sub(MERGED)
        {
            chain.pieces.truncate(first);
            chain.pieces.push(merged);
        }
    }

    /// How many pieces the log has.
    #[cfg(test)]
    pub(super) fn piece_count(&self, task: TaskId) -> usize {
        self.pieces(task, 0, usize::MAX).len()
    }

    /// Forgets the log; returns where its pieces were.
    pub(super) fn remove(&mut self, task: TaskId) -> Vec<Spot> {
        if let Some(chain) = self.recent.remove(&task) {
            return chain.pieces.iter().map(|p| p.spot).collect();
        }
        match self.settled_at(task) {
            Some(at) => {
                let spot = self.settled[at].1;
                self.settled[at].1.pack = MOVED;
                self.moved += 1;
                vec![spot]
            }
            None => Vec::new(),
        }
    }

    /// Every piece of every log, with its task.
    pub(super) fn each_piece(&self, mut f: impl FnMut(TaskId, &Piece)) {
        for (task, spot) in &self.settled {
            if spot.pack != MOVED {
                f(*task, &Piece::new(0, *spot));
            }
        }
        for (task, chain) in &self.recent {
            for piece in &chain.pieces {
                f(*task, piece);
            }
        }
    }

    /// Points the piece of `task`'s log that starts at `log_offset` to
    /// `spot` (its bytes copied there).
    pub(super) fn repoint(&mut self, task: TaskId, log_offset: u64, spot: Spot) {
        if let Some(chain) = self.recent.get_mut(&task) {
            if let Ok(i) = chain
                .pieces
                .binary_search_by_key(&log_offset, |p| p.log_offset)
            {
                chain.pieces[i].spot = spot;
            }
        } else if let Some(at) = self.settled_at(task)
            && log_offset == 0
        {
            self.settled[at].1 = spot;
        }
    }

    /// How many logs it knows.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.recent.len() + self.settled.iter().filter(|(_, s)| s.pack != MOVED).count()
    }
}

/// Merges `late`, sorted, into `sorted`: in place, from the back, so that
/// nothing but the added room is allocated.
fn merge_sorted(sorted: &mut Vec<(TaskId, Spot)>, late: &[(TaskId, Spot)]) {
    let (mut i, mut j) = (sorted.len(), late.len());
    sorted.extend_from_slice(late);
    let mut k = sorted.len();
    while j > 0 {
        k -= 1;
        if i > 0 && sorted[i - 1].0 > late[j - 1].0 {
            sorted[k] = sorted[i - 1];
            i -= 1;
        } else {
            sorted[k] = late[j - 1];
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn piece(log_offset: u64, pack: u32, at: u32, len: u32) -> Piece {
        Piece::new(log_offset, Spot { at, pack, len })
    }

    /// [`Index::build`] of frames as a pack scan finds them.
    fn build(frames: Vec<(TaskId, Piece)>, keep: impl Fn(TaskId) -> bool) -> Index {
        let (firsts, rest): (Vec<_>, Vec<_>) =
            frames.into_iter().partition(|(_, p)| p.log_offset == 0);
        let firsts = firsts.into_iter().map(|(t, p)| (t, p.spot)).collect();
        Index::build(firsts, rest, keep)
    }

    #[test]
    fn a_log_is_its_pieces_from_zero_without_gaps_or_repeats() {
        let (whole, copied, torn, pruned) =
            (TaskId::new(), TaskId::new(), TaskId::new(), TaskId::new());
        let frames = vec![
            (whole, piece(0, 1, 36, 10)),
            // A rewritten pack's copy, found in a later pack, out of order.
            (copied, piece(5, 1, 100, 5)),
            (copied, piece(0, 2, 36, 5)),
            (copied, piece(0, 1, 200, 5)),
            // Its predecessor was torn away: 4..8 is not part of the log.
            (torn, piece(0, 1, 300, 4)),
            (torn, piece(8, 1, 400, 4)),
            (pruned, piece(0, 1, 500, 4)),
        ];
        let index = build(frames, |task| task != pruned);
        assert_eq!(index.len(), 3);
        assert_eq!(index.length(whole), 10);
        assert_eq!(index.length(copied), 10);
        assert_eq!(index.length(torn), 4);
        assert_eq!(index.length(pruned), 0);
        assert_eq!(index.pieces(copied, 0, 100).len(), 2);
        assert_eq!(index.pieces(copied, 5, 100), [piece(5, 1, 100, 5)]);
        assert!(index.pieces(copied, 10, 100).is_empty());
        assert_eq!(index.pieces(whole, 3, 2), [piece(0, 1, 36, 10)]);
        // A copy that overlaps the end adds only its new bytes.
        let overlapping = TaskId::new();
        let index = build(
            vec![
                (overlapping, piece(0, 1, 36, 4)),
                (overlapping, piece(2, 2, 50, 6)),
            ],
            |_| true,
        );
        assert_eq!(
            index.pieces(overlapping, 0, 100),
            [piece(0, 1, 36, 4), piece(4, 2, 52, 4)]
        );
    }

    #[test]
    fn logs_of_one_piece_settle_as_they_pile_up_and_move_back_when_appended_to() {
        // Ids made first, logged last: they merge into the settled ones.
        let early: Vec<TaskId> = (0..10).map(|_| TaskId::new()).collect();
        let tasks: Vec<TaskId> = (0..SETTLE_AFTER as u32 + 10)
            .map(|_| TaskId::new())
            .collect();
        let mut index = Index::default();
        let still_running = tasks[3];
        for (n, task) in tasks.iter().chain(&early).enumerate() {
            index.push(*task, piece(0, 1, n as u32 * 100, 5));
            index.settle();
        }
        assert!(index.recent.len() < SETTLE_AFTER, "{}", index.recent.len());
        assert!(
            index.settled.windows(2).all(|w| w[0].0 < w[1].0),
            "sorted, no repeats"
        );
        assert_eq!(index.len(), tasks.len() + early.len());
        for (n, task) in tasks.iter().chain(&early).enumerate() {
            assert_eq!(index.pieces(*task, 0, 10), [piece(0, 1, n as u32 * 100, 5)]);
        }
        // A settled step that goes on printing moves back, then settles
        // again into its own place.
        index.push(still_running, piece(5, 2, 0, 3));
        assert_eq!(index.length(still_running), 8);
        assert_eq!(index.moved, 1);
        index.remove(still_running);
        index.push(still_running, piece(0, 2, 50, 4));
        for _ in 0..SETTLE_AFTER {
            index.push(TaskId::new(), piece(0, 3, 0, 1));
        }
        index.settle();
        assert_eq!(index.moved, 0);
        assert_eq!(index.pieces(still_running, 0, 10), [piece(0, 2, 50, 4)]);
        assert!(index.settled.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn a_settled_log_moves_when_appended_to_and_goes_when_removed() {
        let (a, b) = (TaskId::new(), TaskId::new());
        let mut index = build(
            vec![(a, piece(0, 1, 36, 3)), (b, piece(0, 1, 75, 3))],
            |_| true,
        );
        index.push(a, piece(3, 2, 36, 4));
        assert_eq!(index.length(a), 7);
        assert_eq!(
            index.pieces(a, 0, 100),
            [piece(0, 1, 36, 3), piece(3, 2, 36, 4)]
        );
        index.repoint(
            a,
            0,
            Spot {
                at: 80,
                pack: 3,
                len: 3,
            },
        );
        index.repoint(
            b,
            0,
            Spot {
                at: 116,
                pack: 3,
                len: 3,
            },
        );
        assert_eq!(index.pieces(a, 0, 1), [piece(0, 3, 80, 3)]);
        assert_eq!(index.pieces(b, 0, 1), [piece(0, 3, 116, 3)]);
        assert_eq!(
            index.remove(b),
            [Spot {
                at: 116,
                pack: 3,
                len: 3
            }]
        );
        assert_eq!(index.length(b), 0);
        assert!(index.remove(b).is_empty());
        let mut all = 0;
        index.each_piece(|_, _| all += 1);
        assert_eq!(all, 2);
        // A new log after a removed one of the same id starts afresh.
        index.push(b, piece(0, 3, 200, 2));
        assert_eq!(index.length(b), 2);
    }
}
