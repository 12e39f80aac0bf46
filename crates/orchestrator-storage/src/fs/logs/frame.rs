//! The one format of a log pack: a sequence of frames, each a piece of one
//! task's log, read and written only here.
//!
//! ```text
//! 0..4    CRC-32 of bytes 4..36 (the rest of the header)
//! 4..20   task id (the UUID's 16 bytes)
//! 20..28  where the piece starts in the task's log (u64, little-endian)
//! 28..32  the piece's length (u32, little-endian)
//! 32..36  CRC-32 of the piece
//! 36..    the piece
//! ```
//!
//! A frame of the nil task and length 0 is the *seal*: written last, after
//! which the pack is synced and never written again. A header is checked
//! in every pack; a piece's own checksum only in a pack without a seal,
//! where a crash may have torn the last frames. So opening a store reads
//! its sealed packs' headers, not every log byte.

use std::io::{BufReader, Read};

use orchestrator_core::TaskId;

/// Bytes before a frame's piece.
pub(super) const HEADER: usize = 36;

/// The longest piece in one frame; a longer append is split.
pub(super) const MAX_PIECE: usize = 1 << 20;

/// One frame's header, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame {
    pub task: TaskId,
    /// Where the piece starts in the task's log.
    pub log_offset: u64,
    pub len: u32,
    pub crc: u32,
}

impl Frame {
    fn is_seal(&self) -> bool {
        self.task.as_uuid().is_nil() && self.len == 0
    }
}

/// Appends the frame of `piece` (at most [`MAX_PIECE`] bytes) to `out`.
pub(super) fn encode(task: TaskId, log_offset: u64, piece: &[u8], out: &mut Vec<u8>) {
    encode_header(task, log_offset, piece, out);
    out.extend_from_slice(piece);
}

/// Appends the header of `piece`'s frame to `out`: the piece is to follow.
pub(super) fn encode_header(task: TaskId, log_offset: u64, piece: &[u8], out: &mut Vec<u8>) {
    debug_assert!(piece.len() <= MAX_PIECE);
    let mut header = [0u8; HEADER];
    header[4..20].copy_from_slice(task.as_uuid().as_bytes());
    header[20..28].copy_from_slice(&log_offset.to_le_bytes());
    header[28..32].copy_from_slice(&(piece.len() as u32).to_le_bytes());
    header[32..36].copy_from_slice(&crc32fast::hash(piece).to_le_bytes());
    let crc = crc32fast::hash(&header[4..]);
    header[..4].copy_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&header);
}

/// The seal frame: the pack ends here.
pub(super) fn seal() -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER);
    encode(TaskId::from_uuid(uuid::Uuid::nil()), 0, &[], &mut out);
    out
}

fn decode(header: &[u8; HEADER]) -> Option<Frame> {
    let crc = u32::from_le_bytes(header[..4].try_into().ok()?);
    if crc32fast::hash(&header[4..]) != crc {
        return None;
    }
    Some(Frame {
        task: TaskId::from_uuid(uuid::Uuid::from_bytes(header[4..20].try_into().ok()?)),
        log_offset: u64::from_le_bytes(header[20..28].try_into().ok()?),
        len: u32::from_le_bytes(header[28..32].try_into().ok()?),
        crc: u32::from_le_bytes(header[32..36].try_into().ok()?),
    })
}

/// How reading a pack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// At a seal, at this many bytes (the seal included).
    Sealed(u64),
    /// At the end of the file, after the last whole frame, with no seal:
    /// the pack being written.
    Open(u64),
    /// At a frame that is torn or damaged, starting at this byte: what is
    /// before it is good, what is from it on is not read.
    Damaged(u64),
}

/// Reads a pack's frames, calling `found` with each frame and where its
/// piece starts in the file, until the seal, the end, or damage. Pieces
/// are skipped, not read, except to check them where `check_pieces`; a
/// sealed pack's were checked before it was sealed.
pub(super) fn read_pack(
    file: impl Read,
    check_pieces: bool,
    mut found: impl FnMut(Frame, u64),
) -> std::io::Result<End> {
    let mut reader = BufReader::with_capacity(256 << 10, file);
    let mut at = 0u64;
    let mut piece = Vec::new();
    loop {
        let mut header = [0u8; HEADER];
        match read_full(&mut reader, &mut header)? {
            0 => return Ok(End::Open(at)),
            n if n < HEADER => return Ok(End::Damaged(at)),
            _ => {}
        }
        let Some(frame) = decode(&header) else {
            return Ok(End::Damaged(at));
        };
        if frame.is_seal() {
            return Ok(End::Sealed(at + HEADER as u64));
        }
        let len = frame.len as usize;
        if len > MAX_PIECE {
            return Ok(End::Damaged(at));
        }
        if check_pieces {
            piece.resize(len, 0);
            if read_full(&mut reader, &mut piece)? < len || crc32fast::hash(&piece) != frame.crc {
                return Ok(End::Damaged(at));
            }
        } else if skip(&mut reader, len)? < len {
            return Ok(End::Damaged(at));
        }
        found(frame, at + HEADER as u64);
        at += (HEADER + len) as u64;
    }
}

/// Reads until `buf` is full or the input ends; how many bytes it read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Skips `len` bytes; how many there were.
fn skip(reader: &mut impl Read, len: usize) -> std::io::Result<usize> {
    let skipped = std::io::copy(&mut reader.take(len as u64), &mut std::io::sink())?;
    Ok(skipped as usize)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn frames(bytes: &[u8], check: bool) -> (Vec<(Frame, u64)>, End) {
        let mut seen = Vec::new();
        let end = read_pack(bytes, check, |frame, at| seen.push((frame, at))).unwrap();
        (seen, end)
    }

    #[test]
    fn frames_read_back_as_written_up_to_the_seal() {
        let (a, b) = (TaskId::new(), TaskId::new());
        let mut pack = Vec::new();
        encode(a, 0, b"hello\n", &mut pack);
        encode(b, 0, b"", &mut pack);
        encode(a, 6, b"world\n", &mut pack);
        let open = pack.len() as u64;
        pack.extend(seal());
        let sealed = pack.len() as u64;
        pack.extend_from_slice(b"after the seal, never read");
        let (seen, end) = frames(&pack, true);
        assert_eq!(end, End::Sealed(sealed));
        let got: Vec<_> = seen
            .iter()
            .map(|(f, at)| (f.task, f.log_offset, f.len, *at))
            .collect();
        assert_eq!(got, [(a, 0, 6, 36), (b, 0, 0, 78), (a, 6, 6, 114)],);
        assert_eq!(&pack[114..120], b"world\n");
        let (_, end) = frames(&pack[..open as usize], false);
        assert_eq!(end, End::Open(open));
    }

    #[test]
    fn a_torn_or_damaged_frame_ends_the_pack_where_it_starts() {
        let task = TaskId::new();
        let mut pack = Vec::new();
        encode(task, 0, b"first\n", &mut pack);
        let second = pack.len();
        encode(task, 6, b"second\n", &mut pack);
        // Torn anywhere in the second frame: its header or its piece.
        for cut in second + 1..pack.len() {
            let (seen, end) = frames(&pack[..cut], true);
            assert_eq!(seen.len(), 1, "cut at {cut}");
            assert_eq!(end, End::Damaged(second as u64), "cut at {cut}");
        }
        // A flipped bit in a piece is found where pieces are checked.
        let mut flipped = pack.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(frames(&flipped, true).1, End::Damaged(second as u64));
        assert_eq!(frames(&flipped, false).1, End::Open(pack.len() as u64));
        // One in a header, always.
        let mut flipped = pack.clone();
        flipped[second + 25] ^= 1;
        assert_eq!(frames(&flipped, false).1, End::Damaged(second as u64));
    }
}
