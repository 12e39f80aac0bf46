//! The log packs through `Logs`: what is written reads back, across
//! reopens, rolls, torn tails, prunes, rewrites and upgrades.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use super::*;

fn open(dir: &Path) -> Logs {
    Logs::open(dir, Mode::Write, |_| true).unwrap()
}

fn whole(logs: &Logs, task: TaskId) -> Vec<u8> {
    logs.read(task, 0, usize::MAX).unwrap().data
}

fn packs_in(dir: &Path) -> Vec<u32> {
    list(dir).unwrap().packs
}

fn pack_bytes(dir: &Path) -> u64 {
    packs_in(dir)
        .iter()
        .map(|n| std::fs::metadata(dir.join(pack_name(*n))).unwrap().len())
        .sum()
}

#[test]
fn logs_read_back_from_any_offset_and_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (TaskId::new(), TaskId::new());
    let logs = open(dir.path());
    assert_eq!(logs.append(a, b"one\n").unwrap(), 4);
    assert_eq!(logs.append(b, b"other\n").unwrap(), 6);
    assert_eq!(logs.append(a, b"two\n").unwrap(), 8);
    assert_eq!(whole(&logs, a), b"one\ntwo\n");
    let middle = logs.read(a, 2, 4).unwrap();
    assert_eq!(
        (middle.data.as_slice(), middle.next_offset),
        (&b"e\ntw"[..], 6)
    );
    assert_eq!(logs.read(a, 8, 10).unwrap().data, b"");
    assert_eq!(logs.read(TaskId::new(), 0, 10).unwrap().data, b"");
    drop(logs);
    let logs = open(dir.path());
    assert_eq!(whole(&logs, a), b"one\ntwo\n");
    assert_eq!(logs.lengths(&[b, a]), [6, 8]);
    assert_eq!(logs.append(a, b"three\n").unwrap(), 14);
    assert_eq!(packs_in(dir.path()), [1], "the open pack goes on");
    // A reader sees the same, and cannot write.
    let reader = Logs::open(dir.path(), Mode::Read, |_| true).unwrap();
    assert_eq!(whole(&reader, a), b"one\ntwo\nthree\n");
    assert!(matches!(reader.append(a, b"x"), Err(Error::ReadOnly(_))));
}

#[test]
fn a_log_of_many_small_appends_keeps_few_pieces_and_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (chatty, quiet) = (TaskId::new(), TaskId::new());
    let mut expected = Vec::new();
    let mut logs = open(dir.path());
    logs.roll_bytes = 64 * 1024;
    for n in 0..5_000 {
        let line = format!("line {n}\n");
        logs.append(chatty, line.as_bytes()).unwrap();
        expected.extend_from_slice(line.as_bytes());
        if n % 7 == 0 {
            // Another log's frames in between.
            logs.append(quiet, b"q").unwrap();
        }
    }
    let pieces = logs.lock().index.piece_count(chatty);
    // At most MERGED - 1 pieces a level: 5,000 appends, 3 levels and a
    // few more.
    assert!(pieces < 4 * index::MERGED, "{pieces} pieces");
    assert_eq!(whole(&logs, chatty), expected);
    // Any window reads as the bytes there.
    for (from, len) in [
        (0, 10),
        (1_000, 5_000),
        (40_000, 100),
        (expected.len() - 3, 10),
    ] {
        let chunk = logs.read(chatty, from as u64, len).unwrap();
        let end = (from + len).min(expected.len());
        assert_eq!(chunk.data, &expected[from..end], "{from}+{len}");
    }
    assert_eq!(logs.length(quiet), 715);
    drop(logs);
    // After a reopen: the merged copies and what they replaced are
    // both in the packs; the log reads the same, from few pieces.
    let logs = open(dir.path());
    assert_eq!(whole(&logs, chatty), expected);
    assert!(logs.lock().index.piece_count(chatty) <= pieces + 1);
    assert_eq!(logs.length(quiet), 715);
    // The replaced pieces are dead bytes, given back by rewrites.
    let live: u64 = logs.lock().packs.values().map(|p| p.live).sum();
    assert!(live < pack_bytes(dir.path()), "{live}");
}

#[test]
fn a_store_without_a_logs_dir_reads_as_one_without_logs() {
    let dir = tempfile::tempdir().unwrap();
    let reader = Logs::open(&dir.path().join("logs"), Mode::Read, |_| true).unwrap();
    assert_eq!(reader.length(TaskId::new()), 0);
    assert_eq!(read_task_logs(dir.path(), &[TaskId::new()]).unwrap(), [b""]);
}

#[test]
fn a_full_pack_is_sealed_and_a_long_append_split_across_packs() {
    let dir = tempfile::tempdir().unwrap();
    let task = TaskId::new();
    let mut logs = open(dir.path());
    logs.roll_bytes = 100;
    let long: Vec<u8> = (0..3 * MAX_PIECE as u32).map(|i| i as u8).collect();
    logs.append(task, b"start\n").unwrap();
    logs.append(task, &long).unwrap();
    // A frame starts in a pack with room left, and may end past it.
    assert_eq!(packs_in(dir.path()), [1, 2, 3]);
    drop(logs);
    let logs = open(dir.path());
    assert_eq!(whole(&logs, task), [&b"start\n"[..], &long].concat());
    let sealed: Vec<bool> = logs.lock().packs.values().map(|p| p.sealed).collect();
    assert_eq!(sealed, [true, true, false]);
}

#[test]
fn a_torn_frame_at_the_end_is_cut_off_and_appends_go_on_from_the_log_s_end() {
    let dir = tempfile::tempdir().unwrap();
    let task = TaskId::new();
    let logs = open(dir.path());
    logs.append(task, b"kept\n").unwrap();
    logs.append(task, b"torn\n").unwrap();
    drop(logs);
    let pack = dir.path().join(pack_name(1));
    let full = std::fs::metadata(&pack).unwrap().len();
    // A crash in the middle of the second frame's write.
    File::options()
        .write(true)
        .open(&pack)
        .unwrap()
        .set_len(full - 2)
        .unwrap();
    let reader = Logs::open(dir.path(), Mode::Read, |_| true).unwrap();
    assert_eq!(whole(&reader, task), b"kept\n");
    assert_eq!(
        std::fs::metadata(&pack).unwrap().len(),
        full - 2,
        "a reader cuts nothing"
    );
    let logs = open(dir.path());
    let first_frame = (HEADER + b"kept\n".len()) as u64;
    assert_eq!(
        std::fs::metadata(&pack).unwrap().len(),
        first_frame,
        "the torn frame was cut"
    );
    assert_eq!(logs.append(task, b"next\n").unwrap(), 10);
    drop(logs);
    assert_eq!(whole(&open(dir.path()), task), b"kept\nnext\n");
    // A flipped bit in an open pack's piece is found too.
    let mut bytes = std::fs::read(&pack).unwrap();
    *bytes.last_mut().unwrap() ^= 0x20;
    std::fs::write(&pack, &bytes).unwrap();
    assert_eq!(whole(&open(dir.path()), task), b"kept\n");
}

#[test]
fn pruned_logs_give_their_room_back_once_half_a_pack_is_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let tasks: Vec<TaskId> = (0..4).map(|_| TaskId::new()).collect();
    let mut logs = open(dir.path());
    logs.roll_bytes = 100;
    for (n, task) in tasks.iter().enumerate() {
        logs.append(*task, format!("log {n}\n").as_bytes()).unwrap();
    }
    // Four frames of 42 bytes: three in pack 1 (sealed), one in pack 2.
    assert_eq!(packs_in(dir.path()), [1, 2]);
    logs.remove(&tasks[..1]).unwrap();
    assert_eq!(
        packs_in(dir.path()),
        [1, 2],
        "a third forgotten: kept as it is"
    );
    let before = pack_bytes(dir.path());
    logs.remove(&tasks[1..2]).unwrap();
    assert_eq!(
        packs_in(dir.path()),
        [2],
        "pack 1's last log was copied to pack 2"
    );
    assert!(pack_bytes(dir.path()) < before);
    assert_eq!(whole(&logs, tasks[2]), b"log 2\n");
    assert_eq!(whole(&logs, tasks[1]), b"");
    logs.remove(&tasks[2..]).unwrap();
    assert!(packs_in(dir.path()).is_empty(), "nothing live: deleted");
    let task = TaskId::new();
    logs.append(task, b"after\n").unwrap();
    drop(logs);
    let logs = open(dir.path());
    assert_eq!(whole(&logs, task), b"after\n");
    assert_eq!(whole(&logs, tasks[3]), b"");
}

#[test]
fn a_prune_that_wastes_several_packs_rewrites_each_and_keeps_every_other_log() {
    let dir = tempfile::tempdir().unwrap();
    let tasks: Vec<TaskId> = (0..9).map(|_| TaskId::new()).collect();
    let mut logs = open(dir.path());
    logs.roll_bytes = 100;
    for (n, task) in tasks.iter().enumerate() {
        logs.append(*task, format!("log {n}\n").as_bytes()).unwrap();
    }
    // Three frames a pack: 1 and 2 sealed, 3 being written.
    assert_eq!(packs_in(dir.path()), [1, 2, 3]);
    // Two of three gone in packs 1 and 2, one in pack 3.
    let pruned = [tasks[0], tasks[1], tasks[3], tasks[4], tasks[6]];
    logs.remove(&pruned).unwrap();
    assert_eq!(packs_in(dir.path()), [3, 4], "1 and 2 rewritten");
    for n in [2, 5, 7, 8] {
        assert_eq!(
            whole(&logs, tasks[n]),
            format!("log {n}\n").as_bytes(),
            "{n}"
        );
    }
    drop(logs);
    // Pack 3 still holds the pruned log of task 6: the store, which no
    // longer has that task, leaves it out at open.
    let logs = Logs::open(dir.path(), Mode::Write, |task| !pruned.contains(&task)).unwrap();
    for n in [2, 5, 7, 8] {
        assert_eq!(
            whole(&logs, tasks[n]),
            format!("log {n}\n").as_bytes(),
            "{n}"
        );
    }
    assert_eq!(logs.lock().index.len(), 4);
}

#[test]
fn the_logs_of_tasks_the_store_no_longer_has_are_forgotten_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (kept, orphan) = (TaskId::new(), TaskId::new());
    let logs = open(dir.path());
    logs.append(orphan, b"left by a crash mid-prune, and long\n")
        .unwrap();
    logs.append(kept, b"kept\n").unwrap();
    drop(logs);
    let logs = Logs::open(dir.path(), Mode::Write, |task| task == kept).unwrap();
    assert_eq!(whole(&logs, orphan), b"");
    assert_eq!(whole(&logs, kept), b"kept\n");
    assert_eq!(logs.lock().index.len(), 1);
    // More than half of the pack was the orphan's: rewritten.
    assert_eq!(packs_in(dir.path()), [2]);
}

#[test]
fn an_import_is_refused_off_the_log_s_end_and_counts_once_after_a_crash_mid_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let task = TaskId::new();
    let logs = open(dir.path());
    let piece = |offset, data: &[u8]| LogPiece {
        task,
        offset,
        data: data.to_vec(),
    };
    logs.import(&[piece(0, b"ab"), piece(2, b"cd")]).unwrap();
    let refused = logs.import(&[piece(2, b"xx")]).unwrap_err();
    assert!(
        matches!(
            refused,
            Error::Conflict {
                expected: 2,
                found: 4,
                ..
            }
        ),
        "{refused}"
    );
    drop(logs);
    // A pack rewritten, and the crash before the old one was deleted:
    // both hold the same pieces.
    std::fs::copy(dir.path().join(pack_name(1)), dir.path().join(pack_name(2))).unwrap();
    let logs = open(dir.path());
    assert_eq!(whole(&logs, task), b"abcd");
}

#[test]
fn legacy_log_files_are_read_as_they_are_and_packed_by_an_upgrade() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().join(super::super::LOGS_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (TaskId::new(), TaskId::new());
    std::fs::write(dir.join(format!("{a}.log")), b"old a\n").unwrap();
    std::fs::write(dir.join(format!("{b}.log")), b"old b\n").unwrap();
    let reader = Logs::open(&dir, Mode::Read, |_| true).unwrap();
    assert_eq!(whole(&reader, a), b"old a\n");
    assert_eq!(
        read_task_logs(data.path(), &[b, a]).unwrap(),
        [b"old b\n", b"old a\n"]
    );
    pack_legacy_logs(data.path()).unwrap();
    assert!(!dir.join(format!("{a}.log")).exists());
    assert_eq!(packs_in(&dir), [1]);
    // Again, as after a crash before the layout was written: no change.
    pack_legacy_logs(data.path()).unwrap();
    let logs = open(&dir);
    assert_eq!(whole(&logs, a), b"old a\n");
    assert_eq!(logs.append(b, b"new b\n").unwrap(), 12);
    assert_eq!(whole(&logs, b), b"old b\nnew b\n");
}
