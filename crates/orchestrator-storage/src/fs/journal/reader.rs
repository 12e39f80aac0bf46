//! The one reader of the journal and the snapshot, and the one rule for a
//! torn last line. Every place that reads those files reads them here: the
//! service's replay at open, and both ways [`crate::fs::IndexedStore`]
//! opens a store.
//!
//! The rule: a crash in the middle of an append can only damage the
//! journal's **last** line, which is then incomplete (no newline) or fails
//! its checksum. That line is the *torn tail*: it was never acknowledged,
//! so it is left out, and a store opened to be written cuts it off the
//! file. Anything else is damage:
//!
//! - a bad line before the journal's last one;
//! - any bad line in the snapshot, which is only ever replaced atomically,
//!   so never torn (an incomplete last line included);
//! - a line whose checksum holds but whose record cannot be read, even the
//!   last: a torn write cannot make a checksum hold, so that line is a
//!   record this build does not understand, and dropping it would lose it.
//!
//! A store opened to be written refuses damage ([`read_strictly`]); one
//! opened to be read by a migration reports the damaged records instead,
//! from the [`LineReader`]'s lines.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use crate::fs::line::{Line, decode_line};
use crate::{Error, Result};

/// Which file is read: only the journal may end in a torn write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::fs) enum LineFile {
    Journal,
    Snapshot,
}

/// Why a line holds no record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::fs) enum Damage {
    /// The file ends without the line's newline.
    Incomplete,
    /// The line's checksum does not match its JSON.
    Checksum,
    /// The checksum holds, but the JSON is no record this build knows.
    Unreadable(String),
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::Incomplete => f.write_str("incomplete line"),
            Damage::Checksum => f.write_str("checksum mismatch"),
            Damage::Unreadable(why) => write!(f, "unreadable record: {why}"),
        }
    }
}

/// One line as read, damaged or not (a torn tail is never one).
pub(in crate::fs) struct ReadLine<'a> {
    /// Counted from 1, as errors name it.
    pub number: usize,
    /// Where the line starts in its file.
    pub offset: u64,
    /// The line without its newline.
    pub bytes: &'a [u8],
    /// Nothing follows it.
    pub last: bool,
    pub record: std::result::Result<Line, Damage>,
}

/// Where the torn tail of a journal starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::fs) struct TornTail {
    pub number: usize,
    pub offset: u64,
}

/// Reads the lines of one file in order, one held at a time, and stops at
/// the journal's torn tail.
pub(in crate::fs) struct LineReader<R> {
    input: R,
    file: LineFile,
    /// The line read last, newline included.
    buffer: Vec<u8>,
    /// Where the next line starts: after a torn tail, where the tail starts.
    offset: u64,
    number: usize,
    torn: Option<TornTail>,
}

impl<R: BufRead> LineReader<R> {
    pub(in crate::fs) fn new(input: R, file: LineFile) -> LineReader<R> {
        LineReader {
            input,
            file,
            buffer: Vec::new(),
            offset: 0,
            number: 0,
            torn: None,
        }
    }

    /// The next line, or `None` at the end of the file or at a torn tail.
    pub(in crate::fs) fn next_line(&mut self) -> io::Result<Option<ReadLine<'_>>> {
        if self.torn.is_some() {
            return Ok(None);
        }
        self.buffer.clear();
        let read = self.input.read_until(b'\n', &mut self.buffer)?;
        if read == 0 {
            return Ok(None);
        }
        let (bytes, record) = match self.buffer.strip_suffix(b"\n") {
            None => (&self.buffer[..], Err(Damage::Incomplete)),
            Some(bytes) => (bytes, parse_line(bytes)),
        };
        // Nothing can follow a line without its newline. Looking ahead
        // costs nothing more: the next read would fill the buffer anyway.
        let last = matches!(record, Err(Damage::Incomplete)) || self.input.fill_buf()?.is_empty();
        let torn = self.file == LineFile::Journal
            && last
            && matches!(record, Err(Damage::Incomplete | Damage::Checksum));
        let number = self.number + 1;
        let offset = self.offset;
        if torn {
            self.torn = Some(TornTail { number, offset });
            return Ok(None);
        }
        self.number = number;
        self.offset += read as u64;
        Ok(Some(ReadLine {
            number,
            offset,
            bytes,
            last,
            record,
        }))
    }

    /// The torn tail the reader stopped at, if it did.
    pub(in crate::fs) fn torn_tail(&self) -> Option<TornTail> {
        self.torn
    }

    /// The bytes of the lines read so far: the whole file once read, but
    /// for a torn tail.
    pub(in crate::fs) fn kept(&self) -> u64 {
        self.offset
    }
}

/// The record a line (without its newline) holds, or why it holds none.
pub(in crate::fs) fn parse_line(bytes: &[u8]) -> std::result::Result<Line, Damage> {
    let json = decode_line(bytes).ok_or(Damage::Checksum)?;
    serde_json::from_slice(json).map_err(|e| Damage::Unreadable(e.to_string()))
}

/// Where a good line is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::fs) struct LinePlace {
    pub offset: u64,
    /// Without the newline.
    pub len: usize,
}

/// Reads every record of `path` (none if it is absent) for a store opened
/// to be written, handing each to `each` in order: damage is refused,
/// naming the file and line; a journal's torn tail is cut off the file
/// (truncated and synced), so that the next append follows the last good
/// line. Returns the bytes kept.
pub(in crate::fs) fn read_strictly(
    path: &Path,
    file: LineFile,
    mut each: impl FnMut(Line, LinePlace),
) -> Result<u64> {
    let read_error = |e| Error::io(format!("read {}", path.display()), e);
    let input = match File::open(path) {
        Ok(input) => input,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(read_error(e)),
    };
    let mut reader = LineReader::new(BufReader::with_capacity(1 << 20, input), file);
    while let Some(line) = reader.next_line().map_err(read_error)? {
        let place = LinePlace {
            offset: line.offset,
            len: line.bytes.len(),
        };
        match line.record {
            Ok(record) => each(record, place),
            Err(damage) => return Err(corrupt(path, line.number, &damage, line.last)),
        }
    }
    let kept = reader.kept();
    if let Some(torn) = reader.torn_tail() {
        tracing::warn!(
            path = %path.display(), line = torn.number,
            "dropping a torn write at the end of the journal"
        );
        OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|file| file.set_len(kept).and_then(|()| file.sync_all()))
            .map_err(|e| Error::io(format!("truncate {}", path.display()), e))?;
    }
    Ok(kept)
}

fn corrupt(path: &Path, line: usize, damage: &Damage, last: bool) -> Error {
    let reason = if last {
        format!(
            "{damage} in the last line, which a torn write cannot cause; \
             restore the data dir from a backup"
        )
    } else {
        "checksum mismatch or unreadable record in the middle of the file; \
         restore the data dir from a backup"
            .to_owned()
    };
    Error::Corrupt {
        path: path.to_path_buf(),
        line,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three lines, each naming its record, and where the last one starts.
    fn three_lines() -> (Vec<u8>, usize) {
        let mut bytes = Vec::new();
        for name in ["first", "second"] {
            let line = Line::SecretDeleted { name: name.into() };
            line.encode_into(&mut bytes).unwrap();
        }
        let last = bytes.len();
        let line = Line::ScheduleDeleted { id: "third".into() };
        line.encode_into(&mut bytes).unwrap();
        (bytes, last)
    }

    /// Each line's number and the name of its record, or its damage.
    type Lines = Vec<(usize, std::result::Result<String, Damage>)>;

    /// What a reader makes of `bytes`: its lines, then the torn tail and
    /// the bytes kept.
    fn read(bytes: &[u8], file: LineFile) -> (Lines, Option<TornTail>, u64) {
        let mut reader = LineReader::new(bytes, file);
        let mut lines = Vec::new();
        while let Some(line) = reader.next_line().unwrap() {
            let named = line.record.map(|record| match record {
                Line::SecretDeleted { name } => name,
                Line::ScheduleDeleted { id } => id,
                _ => unreachable!("only those are written here"),
            });
            lines.push((line.number, named));
        }
        (lines, reader.torn_tail(), reader.kept())
    }

    fn good(names: &[&str]) -> Lines {
        (names.iter().enumerate())
            .map(|(i, name)| (i + 1, Ok(name.to_string())))
            .collect()
    }

    #[test]
    fn a_journal_cut_anywhere_in_its_last_line_keeps_exactly_the_lines_before() {
        let (bytes, last) = three_lines();
        // Every cut from the line's first byte to just before its newline.
        for cut in last + 1..bytes.len() {
            let (lines, torn, kept) = read(&bytes[..cut], LineFile::Journal);
            assert_eq!(lines, good(&["first", "second"]), "cut at {cut}");
            let tail = TornTail {
                number: 3,
                offset: last as u64,
            };
            assert_eq!(torn, Some(tail), "cut at {cut}");
            assert_eq!(kept, last as u64, "cut at {cut}");
        }
        // Cut between lines, nothing is torn.
        let (lines, torn, kept) = read(&bytes[..last], LineFile::Journal);
        assert_eq!(
            (lines, torn, kept),
            (good(&["first", "second"]), None, last as u64)
        );
        let (lines, torn, kept) = read(&bytes, LineFile::Journal);
        let all = good(&["first", "second", "third"]);
        assert_eq!((lines, torn, kept), (all, None, bytes.len() as u64));
    }

    #[test]
    fn a_journals_last_line_failing_its_checksum_is_torn() {
        let (mut bytes, last) = three_lines();
        bytes[last + 12] ^= 0x01;
        let (lines, torn, kept) = read(&bytes, LineFile::Journal);
        assert_eq!(lines, good(&["first", "second"]));
        assert_eq!(torn.map(|t| t.number), Some(3));
        assert_eq!(kept, last as u64);
    }

    #[test]
    fn damage_before_the_journals_last_line_is_not_torn() {
        let (mut bytes, last) = three_lines();
        bytes[12] ^= 0x01;
        let (lines, torn, _) = read(&bytes, LineFile::Journal);
        let mut expected = good(&["first", "second", "third"]);
        expected[0].1 = Err(Damage::Checksum);
        assert_eq!((lines, torn), (expected, None));

        // A bad line followed by an incomplete one: only the last is torn.
        let (mut bytes, _) = three_lines();
        bytes[last - 3] ^= 0x01;
        let cut = &bytes[..last + 5];
        let (lines, torn, kept) = read(cut, LineFile::Journal);
        let mut expected = good(&["first", "second"]);
        expected[1].1 = Err(Damage::Checksum);
        assert_eq!(lines, expected);
        assert_eq!(torn.map(|t| t.number), Some(3));
        assert_eq!(kept, last as u64);
    }

    #[test]
    fn a_last_line_with_a_good_checksum_but_no_known_record_is_damage() {
        let (mut bytes, _) = three_lines();
        crate::fs::line::encode_line(br#"{"type":"from_a_newer_build"}"#, &mut bytes);
        let (lines, torn, kept) = read(&bytes, LineFile::Journal);
        assert!(
            matches!(lines[3], (4, Err(Damage::Unreadable(_)))),
            "{lines:?}"
        );
        assert_eq!((torn, kept), (None, bytes.len() as u64));
    }

    #[test]
    fn the_snapshot_has_no_torn_tail() {
        let (bytes, last) = three_lines();
        for cut in last + 1..bytes.len() {
            let (lines, torn, kept) = read(&bytes[..cut], LineFile::Snapshot);
            let mut expected = good(&["first", "second", "third"]);
            expected[2].1 = Err(Damage::Incomplete);
            assert_eq!((lines, torn), (expected, None), "cut at {cut}");
            assert_eq!(kept, cut as u64);
        }
        let (mut bytes, last) = three_lines();
        bytes[last + 12] ^= 0x01;
        let (lines, torn, _) = read(&bytes, LineFile::Snapshot);
        assert_eq!(lines[2], (3, Err(Damage::Checksum)));
        assert_eq!(torn, None);
    }

    #[test]
    fn reading_strictly_cuts_a_torn_tail_off_the_file_and_refuses_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.jsonl");
        let count = |file| {
            let mut n = 0;
            read_strictly(&path, file, |_, _| n += 1).map(|kept| (n, kept))
        };
        assert_eq!(count(LineFile::Journal).unwrap(), (0, 0), "absent");

        let (bytes, last) = three_lines();
        std::fs::write(&path, &bytes[..last + 7]).unwrap();
        assert_eq!(count(LineFile::Journal).unwrap(), (2, last as u64));
        assert_eq!(std::fs::read(&path).unwrap(), &bytes[..last]);

        std::fs::write(&path, &bytes[..last + 7]).unwrap();
        let refused = count(LineFile::Snapshot).unwrap_err().to_string();
        assert!(
            refused.contains(":3: corrupt record: incomplete line in the last line"),
            "{refused}"
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            &bytes[..last + 7],
            "untouched"
        );

        let mut damaged = bytes.clone();
        damaged[12] ^= 0x01;
        std::fs::write(&path, &damaged).unwrap();
        let refused = count(LineFile::Journal).unwrap_err().to_string();
        let expected = format!(
            "{}:1: corrupt record: checksum mismatch or unreadable record in the middle of the file",
            path.display()
        );
        assert!(refused.starts_with(&expected), "{refused}");
        assert_eq!(std::fs::read(&path).unwrap(), damaged, "untouched");
    }
}
