//! Backups through the storage API: an archive of a store that is open for
//! writing restores record for record, into any backend; a damaged,
//! altered, foreign or newer archive is refused by name before anything is
//! written; a store that never settles is refused after the passes allowed.

use std::io::Read;
use std::path::Path;

use orchestrator_core::TaskId;
use orchestrator_storage::backup::{self, BackupError, BackupOptions, Manifest};
use orchestrator_storage::transfer::Silent;
use orchestrator_storage::{BulkTransfer, LogChunk, LogPiece, Record, RecordKind, Scanned};

use crate::transfer::{dump, fill, fs_config, open_fs, read_only};

/// Backs `source` up into `archive`.
async fn back_up(
    source: &dyn BulkTransfer,
    work_dir: &Path,
    archive: &Path,
    max_passes: u32,
) -> Result<Manifest, BackupError> {
    let mut options = BackupOptions::new("a test store", work_dir);
    options.max_passes = max_passes;
    let file = std::fs::File::create(archive).unwrap();
    backup::create(source, &options, &Silent, file).await
}

/// Restores `archive` into a new filesystem store at `dir`.
async fn restore_into_fs(archive: &Path, dir: &Path) -> Result<(), BackupError> {
    let unpacked =
        backup::open_archive(std::fs::File::open(archive).unwrap(), &std::env::temp_dir()).await?;
    let target = orchestrator_storage::open_for_import(&fs_config(dir))
        .await
        .unwrap();
    let report = unpacked.restore(&*target, 7, &Silent).await;
    target.close().await.unwrap();
    report.map(|_| ())
}

#[tokio::test]
async fn an_archive_of_a_store_in_use_restores_record_for_record() {
    let root = tempfile::tempdir().unwrap();
    let live = open_fs(&root.path().join("live")).await;
    fill(&live).await;
    // Read beside the open store, as `orchestrator backup` reads it.
    let source = read_only(&fs_config(&root.path().join("live"))).await;
    let archive = root.path().join("backup.tar.zst");
    let manifest = back_up(&*source, root.path(), &archive, 10).await.unwrap();
    assert_eq!(manifest.passes, 2, "a filesystem source is quiet at once");
    assert_eq!(manifest.records["workflow"], 4);
    assert_eq!(manifest.records["task"], 13);
    assert_eq!(manifest.records["secret"], 1);
    assert!(manifest.log_bytes > 1_300_000, "{manifest:?}");
    // Only the archive is left: the staging store went with the backup.
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    let restored = root.path().join("restored");
    restore_into_fs(&archive, &restored).await.unwrap();
    let restored = read_only(&fs_config(&restored)).await;
    assert_eq!(dump(&restored).await, dump(&live).await);
    let again = restore_into_fs(&archive, &root.path().join("restored"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        again.contains("restore only into an empty store: the target already holds 4 workflows"),
        "{again}"
    );
}

#[cfg(feature = "surrealdb")]
#[tokio::test]
async fn an_archive_restores_into_another_backend() {
    use orchestrator_storage::{StorageConfig, StorageType};

    let root = tempfile::tempdir().unwrap();
    let live = open_fs(&root.path().join("live")).await;
    fill(&live).await;
    let archive = root.path().join("backup.tar.zst");
    back_up(live.transfer(), root.path(), &archive, 10)
        .await
        .unwrap();
    let embedded = StorageConfig {
        storage_type: StorageType::SurrealdbEmbedded,
        data_dir: root.path().join("embedded"),
        surrealdb: Default::default(),
    };
    let unpacked = backup::open_archive(std::fs::File::open(&archive).unwrap(), root.path())
        .await
        .unwrap();
    let target = orchestrator_storage::open_for_import(&embedded)
        .await
        .unwrap();
    let report = unpacked.restore(&*target, 5, &Silent).await.unwrap();
    assert!(report.verify.matches());
    assert_eq!(dump(&target).await, dump(&live).await);
    target.close().await.unwrap();
}

/// An archive's entries: name and content, in order.
type Entries = Vec<(String, Vec<u8>)>;

/// A change made to a good archive, to see it refused.
type Alteration = Box<dyn Fn(&mut Entries)>;

/// Every entry of an archive, in order.
fn entries(archive: &Path) -> Entries {
    let decoder = zstd::Decoder::new(std::fs::File::open(archive).unwrap()).unwrap();
    let mut tar = tar::Archive::new(decoder);
    tar.entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().display().to_string();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            (name, data)
        })
        .collect()
}

/// Writes entries as an archive; names go into the header as they are, so
/// that even ones the `tar` crate would refuse to write can be tried.
fn pack(entries: &Entries, archive: &Path) {
    let encoder = zstd::Encoder::new(std::fs::File::create(archive).unwrap(), 3).unwrap();
    let mut tar = tar::Builder::new(encoder);
    for (name, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_size(data.len() as u64);
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        tar.append(&header, data.as_slice()).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap();
}

#[tokio::test]
async fn a_damaged_altered_foreign_or_newer_archive_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let live = open_fs(&root.path().join("live")).await;
    fill(&live).await;
    let archive = root.path().join("good.tar.zst");
    back_up(live.transfer(), root.path(), &archive, 10)
        .await
        .unwrap();
    let good = entries(&archive);
    assert_eq!(good[0].0, "manifest.json", "the manifest comes first");

    let index = |entries: &[(String, Vec<u8>)], name: &str| {
        entries.iter().position(|(n, _)| n == name).unwrap()
    };
    let journal = index(&good, "store/journal.jsonl");
    let log = good
        .iter()
        .position(|(n, _)| n.starts_with("store/logs/"))
        .unwrap();
    let mut newer: serde_json::Value = serde_json::from_slice(&good[0].1).unwrap();
    newer["format_version"] = 99.into();
    let cases: [(&str, Alteration, &str); 6] = [
        (
            "flipped",
            Box::new(move |e| e[journal].1[40] ^= 1),
            "store/journal.jsonl in the archive is damaged",
        ),
        (
            "extra",
            Box::new(|e| e.push(("store/logs/extra.log".into(), b"x".to_vec()))),
            "holds store/logs/extra.log, which its manifest does not list",
        ),
        (
            "missing",
            Box::new(move |e| {
                e.remove(log);
            }),
            "which its manifest lists; it is incomplete",
        ),
        (
            "no-manifest",
            Box::new(|e| {
                e.remove(0);
            }),
            "has no manifest.json",
        ),
        (
            "newer",
            Box::new(move |e| e[0].1 = serde_json::to_vec(&newer).unwrap()),
            "has format version 99 (written by orchestrator 0.1.0), newer than this build",
        ),
        (
            "escape",
            Box::new(|e| e.push(("../escape".into(), b"x".to_vec()))),
            "entry `../escape` is not part of an orchestrator backup",
        ),
    ];
    for (name, change, expected) in cases {
        let mut altered = good.clone();
        change(&mut altered);
        let path = root.path().join(format!("{name}.tar.zst"));
        pack(&altered, &path);
        let target = root.path().join(name);
        let message = restore_into_fs(&path, &target)
            .await
            .expect_err(name)
            .to_string();
        assert!(message.contains(expected), "{name}: {message}");
        assert!(!target.exists(), "{name}: the target was touched");
    }
}

/// A store written to as a busy service writes: every count of its tasks,
/// which each backup pass starts with, comes after a change to a task.
struct Busy {
    live: orchestrator_storage::Storage,
}

impl Busy {
    async fn change_a_task(&self) {
        let query = orchestrator_storage::TaskQuery {
            limit: 1,
            ..Default::default()
        };
        let mut task = self.live.tasks().list_tasks(&query).await.unwrap().items[0].clone();
        task.updated_at = chrono::Utc::now();
        self.live.tasks().update_task(&task).await.unwrap();
    }
}

#[async_trait::async_trait]
impl BulkTransfer for Busy {
    fn name(&self) -> &'static str {
        self.live.transfer().name()
    }
    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> orchestrator_storage::Result<Vec<Scanned>> {
        self.live.transfer().scan(kind, after, limit).await
    }
    async fn fetch(
        &self,
        kind: RecordKind,
        keys: &[String],
    ) -> orchestrator_storage::Result<Vec<Scanned>> {
        self.live.transfer().fetch(kind, keys).await
    }
    async fn count(&self, kind: RecordKind) -> orchestrator_storage::Result<u64> {
        if kind == RecordKind::Task {
            self.change_a_task().await;
        }
        self.live.transfer().count(kind).await
    }
    async fn import(&self, records: &[Record]) -> orchestrator_storage::Result<()> {
        self.live.transfer().import(records).await
    }
    async fn log_lengths(&self, ids: &[TaskId]) -> orchestrator_storage::Result<Vec<u64>> {
        self.live.transfer().log_lengths(ids).await
    }
    async fn read_logs(
        &self,
        asks: &[(TaskId, u64, usize)],
    ) -> orchestrator_storage::Result<Vec<LogChunk>> {
        self.live.transfer().read_logs(asks).await
    }
    async fn import_logs(&self, pieces: &[LogPiece]) -> orchestrator_storage::Result<()> {
        self.live.transfer().import_logs(pieces).await
    }
    async fn close(&self) -> orchestrator_storage::Result<()> {
        self.live.transfer().close().await
    }
}

#[tokio::test]
async fn a_store_that_never_settles_is_refused_after_the_passes_allowed() {
    let root = tempfile::tempdir().unwrap();
    let live = open_fs(&root.path().join("live")).await;
    fill(&live).await;
    let busy = Busy { live };
    let work = root.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let archive = root.path().join("never.tar.zst");
    let err = back_up(&busy, &work, &archive, 3).await.unwrap_err();
    assert!(
        matches!(err, BackupError::KeptChanging { passes: 3 }),
        "{err}"
    );
    assert!(err.to_string().contains("the store kept changing"), "{err}");
    assert_eq!(
        std::fs::read_dir(&work).unwrap().count(),
        0,
        "staging left behind"
    );
}
