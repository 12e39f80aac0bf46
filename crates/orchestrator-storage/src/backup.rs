//! Backups: a consistent copy of a store, taken while its service runs,
//! in one compressed archive with a manifest and checksums; and the way
//! back from one into an empty store of any backend.
//!
//! An archive is a tar file compressed with zstd. It holds a filesystem
//! store, the one format every backend can be copied into and out of with
//! [`crate::transfer`], so a backup of one backend restores into another:
//!
//! ```text
//! manifest.json           what the archive holds: record counts, and each file's size and SHA-256
//! store/layout.json
//! store/journal.jsonl     every record, one checksummed line each
//! store/logs/<n>.pack     the task logs (`<task>.log` files in archives of older builds)
//! ```
//!
//! **Consistency.** The records are copied into a staging filesystem store
//! next to the archive, then copied again, and again, until a pass finds
//! every record as the previous pass left it (at most
//! [`BackupOptions::max_passes`]). Versions only grow and no workflow or
//! task is ever deleted, so a record read equal in two passes did not
//! change in between: a pass that writes nothing proves that the staging
//! store equals the source as it was at the moment between the two passes,
//! whatever the backend, even one that other nodes write to meanwhile. A
//! filesystem source is read as of the moment it is opened, so its second
//! pass is always quiet. Logs only grow and records never point into them,
//! so they are copied up to where they are when read, and do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::transfer::{self, CopyOptions, CopyReport, Progress, TransferError, VerifyReport};
use crate::{BulkTransfer, Error, RecordKind};

/// What an archive says it is, in its manifest.
pub const FORMAT: &str = "orchestrator-backup";
/// The archive format this build writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

const MANIFEST: &str = "manifest.json";
/// The directory of the archive that holds the store.
const STORE_DIR: &str = "store";
/// zstd's default level: most of the size gain at a fraction of the time
/// of the higher ones.
const ZSTD_LEVEL: i32 = 3;

/// How to take a backup.
#[derive(Debug, Clone)]
pub struct BackupOptions {
    /// Where the backup came from, for the manifest: the backend and its
    /// location, never a password.
    pub source: String,
    /// Where the staging store is made (in a directory of its own, removed
    /// afterwards): somewhere with room for a copy of the store.
    pub work_dir: PathBuf,
    /// Records per read and write.
    pub batch_size: usize,
    /// Copy passes before giving up on a store that never stops changing.
    pub max_passes: u32,
}

impl BackupOptions {
    pub fn new(source: impl Into<String>, work_dir: impl Into<PathBuf>) -> BackupOptions {
        BackupOptions {
            source: source.into(),
            work_dir: work_dir.into(),
            batch_size: 500,
            max_passes: 10,
        }
    }
}

/// The archive's table of contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    pub format_version: u32,
    /// The orchestrator that wrote the archive.
    pub orchestrator_version: String,
    pub created_at: DateTime<Utc>,
    /// The backend and location the records came from.
    pub source: String,
    /// The layout version of the filesystem store inside.
    pub layout_version: u32,
    /// Copy passes it took until one found nothing changed.
    pub passes: u32,
    /// Records of each kind (`workflow`, `task`, ...).
    pub records: BTreeMap<String, u64>,
    /// Tasks with a log, and the bytes of all logs.
    pub logs: u64,
    pub log_bytes: u64,
    /// Every other file of the archive, with its size and SHA-256.
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
}

/// What a restore did.
#[derive(Debug, Clone, Serialize)]
pub struct RestoreReport {
    pub manifest: Manifest,
    pub copy: CopyReport,
    pub verify: VerifyReport,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// Not an archive this build can read, or a damaged one; the message
    /// names the entry at fault.
    #[error("{0}")]
    Archive(String),
    #[error(
        "the store kept changing: each of {passes} copy passes found records changed since the \
         one before, so no moment's state could be pinned down; try again when the service is \
         less busy (or with more passes: `orchestrator backup --max-passes`)"
    )]
    KeptChanging { passes: u32 },
    #[error("{0}")]
    Store(#[from] Error),
    #[error("{0}")]
    Transfer(#[from] TransferError),
    #[error(
        "restore only into an empty store: the target already holds {0}; choose a new data \
         directory (or a new namespace and database), or move the old store aside"
    )]
    TargetNotEmpty(String),
    #[error(
        "the restored store differs from the archive in {count} records; first: {first}. The \
         target is not usable as a restore"
    )]
    Verify { count: u64, first: String },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackupError {
    let context = context.into();
    move |source| BackupError::Io { context, source }
}

/// Backs `source` up into `out`: a staging copy until a pass finds nothing
/// changed (see the module docs), then the archive. Returns its manifest.
pub async fn create(
    source: &dyn BulkTransfer,
    options: &BackupOptions,
    progress: &dyn Progress,
    out: File,
) -> Result<Manifest, BackupError> {
    let staging = tempfile::Builder::new()
        .prefix(".orchestrator-backup-")
        .tempdir_in(&options.work_dir)
        .map_err(io(format!(
            "create a staging directory in {}",
            options.work_dir.display()
        )))?;
    let store_dir = staging.path().join(STORE_DIR);
    let (passes, report, records) = snapshot(source, &store_dir, options, progress).await?;
    let manifest = Manifest {
        format: FORMAT.to_owned(),
        format_version: FORMAT_VERSION,
        orchestrator_version: env!("CARGO_PKG_VERSION").to_owned(),
        created_at: Utc::now(),
        source: options.source.clone(),
        layout_version: crate::fs::LAYOUT_VERSION,
        passes,
        records,
        logs: report.logs,
        log_bytes: report.log_bytes,
        files: Vec::new(),
    };
    let written = tokio::task::spawn_blocking(move || write_archive(&store_dir, manifest, out))
        .await
        .map_err(|e| BackupError::Io {
            context: "write the archive".into(),
            source: std::io::Error::other(e),
        })??;
    staging
        .close()
        .map_err(io("remove the staging directory"))?;
    Ok(written)
}

/// Copies `source` into a new filesystem store at `dir` until a pass
/// writes no record; returns the passes, the last pass's report and the
/// records per kind.
async fn snapshot(
    source: &dyn BulkTransfer,
    dir: &Path,
    options: &BackupOptions,
    progress: &dyn Progress,
) -> Result<(u32, CopyReport, BTreeMap<String, u64>), BackupError> {
    let staging = crate::fs::IndexedStore::open_for_import(dir).await?;
    let mut copy = CopyOptions {
        batch_size: options.batch_size,
        ..CopyOptions::default()
    };
    let mut passes = 0;
    let result = loop {
        passes += 1;
        let report = match transfer::copy(source, &staging, &copy, progress).await {
            Ok(report) => report,
            Err(e) => break Err(e.into()),
        };
        copy.resume = true;
        let written: u64 = report.kinds.iter().map(|k| k.written).sum();
        if passes > 1 && written == 0 {
            break Ok(report);
        }
        if passes >= options.max_passes.max(2) {
            break Err(BackupError::KeptChanging { passes });
        }
    };
    let mut records = BTreeMap::new();
    if result.is_ok() {
        for kind in RecordKind::ALL {
            records.insert(kind.as_str().to_owned(), staging.count(kind).await?);
        }
    }
    staging.close().await?;
    Ok((passes, result?, records))
}

/// Packs the store in `dir` with its manifest (its `files` filled in here)
/// into `out`, and syncs it.
fn write_archive(dir: &Path, mut manifest: Manifest, out: File) -> Result<Manifest, BackupError> {
    let files = store_files(dir)?;
    for relative in &files {
        let path = dir.join(relative);
        let (bytes, sha256) = hash_file(&path)?;
        manifest.files.push(ManifestFile {
            path: format!("{STORE_DIR}/{relative}"),
            bytes,
            sha256,
        });
    }
    let encoder = zstd::Encoder::new(out, ZSTD_LEVEL).map_err(io("start the zstd compression"))?;
    let mut tar = tar::Builder::new(encoder);
    let mtime = u64::try_from(manifest.created_at.timestamp()).unwrap_or(0);
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| io("serialize the manifest")(std::io::Error::other(e)))?;
    append(
        &mut tar,
        MANIFEST,
        json.len() as u64,
        mtime,
        json.as_slice(),
    )?;
    for (relative, entry) in files.iter().zip(&manifest.files) {
        let path = dir.join(relative);
        let file = File::open(&path).map_err(io(format!("open {}", path.display())))?;
        // The size hashed is the size packed: a file that changed since
        // would make a header that lies, so it is read only up to it.
        append(
            &mut tar,
            &entry.path,
            entry.bytes,
            mtime,
            file.take(entry.bytes),
        )?;
    }
    let encoder = tar.into_inner().map_err(io("finish the archive"))?;
    let out = encoder
        .finish()
        .map_err(io("finish the zstd compression"))?;
    out.sync_all().map_err(io("sync the archive"))?;
    Ok(manifest)
}

fn append(
    tar: &mut tar::Builder<zstd::Encoder<'static, File>>,
    path: &str,
    bytes: u64,
    mtime: u64,
    data: impl Read,
) -> Result<(), BackupError> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes);
    // The archive holds tokens' hashes and sealed secrets: owner only.
    header.set_mode(0o600);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, path, data)
        .map_err(io(format!("add {path} to the archive")))
}

/// The files of a filesystem store, relative to it, sorted: what a backup
/// holds of it (not its lock, nor a half-written temporary file).
fn store_files(dir: &Path) -> Result<Vec<String>, BackupError> {
    let mut files = Vec::new();
    for name in ["layout.json", "snapshot.jsonl", "journal.jsonl"] {
        if dir.join(name).is_file() {
            files.push(name.to_owned());
        }
    }
    let logs = dir.join("logs");
    let entries = std::fs::read_dir(&logs).map_err(io(format!("list {}", logs.display())))?;
    let mut names = BTreeSet::new();
    for entry in entries {
        let entry = entry.map_err(io(format!("list {}", logs.display())))?;
        if let Some(name) = entry.file_name().to_str()
            && (name.ends_with(".pack") || name.ends_with(".log"))
        {
            names.insert(format!("logs/{name}"));
        }
    }
    files.extend(names);
    Ok(files)
}

fn hash_file(path: &Path) -> Result<(u64, String), BackupError> {
    let mut file = File::open(path).map_err(io(format!("open {}", path.display())))?;
    let mut hashing = HashingWriter::new(std::io::sink());
    let bytes =
        std::io::copy(&mut file, &mut hashing).map_err(io(format!("read {}", path.display())))?;
    Ok((bytes, hashing.hex()))
}

/// A writer that hashes what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
        }
    }

    fn hex(self) -> String {
        orchestrator_core::access::hex(&self.hasher.finalize())
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Unpacks an archive into `dest` (which must be empty) and checks it
/// against its manifest: every file listed, none more, each of its size
/// and SHA-256. Returns the manifest; the store is `dest/store`.
pub fn unpack(input: impl Read, dest: &Path) -> Result<Manifest, BackupError> {
    let damaged = |e: std::io::Error| {
        BackupError::Archive(format!(
            "the archive is damaged or not a zstd-compressed tar file: {e}"
        ))
    };
    let decoder = zstd::Decoder::new(input).map_err(damaged)?;
    let mut archive = tar::Archive::new(decoder);
    let mut found: BTreeMap<String, (u64, String)> = BTreeMap::new();
    let mut manifest_bytes = None;
    for entry in archive.entries().map_err(damaged)? {
        let mut entry = entry.map_err(damaged)?;
        let name = entry_name(&entry)?;
        match entry.header().entry_type() {
            tar::EntryType::Regular => {}
            tar::EntryType::Directory => continue,
            other => {
                return Err(BackupError::Archive(format!(
                    "the archive's entry {name} is a {other:?}, not a file; this is not an \
                     orchestrator backup"
                )));
            }
        }
        if found.contains_key(&name) || (name == MANIFEST && manifest_bytes.is_some()) {
            return Err(BackupError::Archive(format!(
                "the archive holds {name} twice"
            )));
        }
        if name == MANIFEST {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(damaged)?;
            manifest_bytes = Some(bytes);
            continue;
        }
        let path = dest.join(&name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(format!("create {}", parent.display())))?;
        }
        let file = File::create(&path).map_err(io(format!("create {}", path.display())))?;
        let mut hashing = HashingWriter::new(file);
        // Not synced: the unpacked store is a scratch copy, read at once.
        let bytes = std::io::copy(&mut entry, &mut hashing).map_err(damaged)?;
        found.insert(name, (bytes, hashing.hex()));
    }
    let manifest_bytes = manifest_bytes.ok_or_else(|| {
        BackupError::Archive(format!(
            "the archive has no {MANIFEST}; this is not an orchestrator backup"
        ))
    })?;
    let manifest = read_manifest(&manifest_bytes)?;
    for file in &manifest.files {
        match found.remove(&file.path) {
            None => {
                return Err(BackupError::Archive(format!(
                    "the archive lacks {}, which its manifest lists; it is incomplete",
                    file.path
                )));
            }
            Some((bytes, sha256)) if bytes != file.bytes || sha256 != file.sha256 => {
                return Err(BackupError::Archive(format!(
                    "{} in the archive is damaged: {bytes} bytes with SHA-256 {sha256}, the \
                     manifest says {} bytes with SHA-256 {}",
                    file.path, file.bytes, file.sha256
                )));
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = found.keys().next() {
        return Err(BackupError::Archive(format!(
            "the archive holds {extra}, which its manifest does not list; it was changed \
             after it was written"
        )));
    }
    Ok(manifest)
}

/// An entry's path, checked to stay inside the archive's own layout: no
/// absolute path, no `..`, nothing outside `store/` but the manifest.
fn entry_name<R: Read>(entry: &tar::Entry<'_, R>) -> Result<String, BackupError> {
    let path = entry.path().map_err(|e| {
        BackupError::Archive(format!(
            "an entry of the archive has an unreadable name: {e}"
        ))
    })?;
    let shown = path.display().to_string();
    let normal = path.components().all(|c| matches!(c, Component::Normal(_)));
    let ours = shown == MANIFEST || shown.starts_with(&format!("{STORE_DIR}/"));
    if !normal || !ours {
        return Err(BackupError::Archive(format!(
            "the archive's entry `{shown}` is not part of an orchestrator backup"
        )));
    }
    Ok(shown.trim_end_matches('/').to_owned())
}

fn read_manifest(bytes: &[u8]) -> Result<Manifest, BackupError> {
    // The format fields first, so that a newer manifest that this build
    // cannot fully read is refused for what it is.
    #[derive(Deserialize)]
    struct Head {
        format: String,
        format_version: u32,
        #[serde(default)]
        orchestrator_version: String,
    }
    let head: Head = serde_json::from_slice(bytes).map_err(|e| {
        BackupError::Archive(format!("the archive's {MANIFEST} is unreadable: {e}"))
    })?;
    if head.format != FORMAT {
        return Err(BackupError::Archive(format!(
            "the archive's {MANIFEST} says format `{}`, not `{FORMAT}`; this is not an \
             orchestrator backup",
            head.format
        )));
    }
    if head.format_version > FORMAT_VERSION {
        return Err(BackupError::Archive(format!(
            "the archive has format version {} (written by orchestrator {}), newer than this \
             build (orchestrator {}) reads ({FORMAT_VERSION}); restore it with that version or a \
             newer one",
            head.format_version,
            head.orchestrator_version,
            env!("CARGO_PKG_VERSION")
        )));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| BackupError::Archive(format!("the archive's {MANIFEST} is unreadable: {e}")))
}

/// An archive unpacked into a staging directory and checked against its
/// manifest, ready to be restored; the directory goes when it is dropped.
pub struct Unpacked {
    staging: tempfile::TempDir,
    pub manifest: Manifest,
}

impl std::fmt::Debug for Unpacked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unpacked")
            .field("staging", &self.staging.path())
            .finish_non_exhaustive()
    }
}

/// Unpacks an archive into a staging directory in `work_dir` and checks
/// it (see [`unpack`]), before any target is touched.
pub async fn open_archive(
    input: impl Read + Send + 'static,
    work_dir: &Path,
) -> Result<Unpacked, BackupError> {
    let staging = tempfile::Builder::new()
        .prefix(".orchestrator-restore-")
        .tempdir_in(work_dir)
        .map_err(io(format!(
            "create a staging directory in {}",
            work_dir.display()
        )))?;
    let dest = staging.path().to_path_buf();
    let manifest = tokio::task::spawn_blocking(move || unpack(input, &dest))
        .await
        .map_err(|e| BackupError::Io {
            context: "unpack the archive".into(),
            source: std::io::Error::other(e),
        })??;
    Ok(Unpacked { staging, manifest })
}

impl Unpacked {
    /// Restores the archive into `target`, which must hold no record of
    /// any kind: copies every record and log, then compares the target
    /// with the archive record by record.
    pub async fn restore(
        self,
        target: &dyn BulkTransfer,
        batch_size: usize,
        progress: &dyn Progress,
    ) -> Result<RestoreReport, BackupError> {
        // Opened as the service opens a store: an archive of an older
        // layout is upgraded in the staging copy, never in the archive.
        let source =
            crate::fs::IndexedStore::open_for_import(&self.staging.path().join(STORE_DIR)).await?;
        let result = restore_from(&source, &self.manifest, target, batch_size, progress).await;
        source.close().await?;
        self.staging
            .close()
            .map_err(io("remove the staging directory"))?;
        let (copy, verify) = result?;
        Ok(RestoreReport {
            manifest: self.manifest,
            copy,
            verify,
        })
    }
}

async fn restore_from(
    source: &dyn BulkTransfer,
    manifest: &Manifest,
    target: &dyn BulkTransfer,
    batch_size: usize,
    progress: &dyn Progress,
) -> Result<(CopyReport, VerifyReport), BackupError> {
    let mut held = Vec::new();
    for kind in RecordKind::ALL {
        let in_archive = source.count(kind).await?;
        // A backup made before a kind was moved does not list it; its
        // records (if any) are restored all the same.
        let listed = manifest.records.get(kind.as_str()).copied();
        if let Some(listed) = listed.filter(|&listed| listed != in_archive) {
            return Err(BackupError::Archive(format!(
                "the archive's store holds {in_archive} {}, its manifest says {listed}",
                kind.plural()
            )));
        }
        let n = target.count(kind).await.map_err(TransferError::Target)?;
        if n > 0 {
            held.push(format!("{n} {}", kind.plural()));
        }
    }
    if !held.is_empty() {
        return Err(BackupError::TargetNotEmpty(held.join(", ")));
    }
    let options = CopyOptions {
        batch_size,
        ..CopyOptions::default()
    };
    let copy = transfer::copy(source, target, &options, progress).await?;
    let verify = transfer::verify(source, target, batch_size, progress).await?;
    if !verify.matches() {
        let first = verify
            .mismatches
            .iter()
            .take(3)
            .map(|m| format!("{} {}: {}", m.kind, m.key, m.problem))
            .collect::<Vec<_>>()
            .join("; ");
        return Err(BackupError::Verify {
            count: verify.mismatch_count,
            first,
        });
    }
    Ok((copy, verify))
}
