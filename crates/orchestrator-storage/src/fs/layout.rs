//! `layout.json`: which on-disk layout a data dir has, checked (and
//! written for a new dir) at every open, and reported by `db status`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::journal::write_atomically;
use super::{JOURNAL_FILE, SNAPSHOT_FILE};
use crate::schema::{EntryState, SchemaEntry, SchemaStatus};
use crate::{Error, Result};

/// The on-disk layout this build reads and writes.
pub const LAYOUT_VERSION: u32 = 1;

pub(super) const LAYOUT_FILE: &str = "layout.json";

#[derive(Serialize, Deserialize)]
struct Layout {
    layout_version: u32,
}

pub(super) fn check_layout(dir: &Path) -> Result<()> {
    let path = dir.join(LAYOUT_FILE);
    match read_layout(&path) {
        Ok(layout) => {
            if layout.layout_version > LAYOUT_VERSION {
                return Err(Error::Layout(format!(
                    "data dir {} has layout version {}, newer than this build supports ({LAYOUT_VERSION}); \
                     run a newer orchestrator or restore a backup",
                    dir.display(),
                    layout.layout_version
                )));
            }
            // Older layouts would be upgraded forward here, one version at a time.
            Ok(())
        }
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            if dir.join(JOURNAL_FILE).exists() || dir.join(SNAPSHOT_FILE).exists() {
                return Err(Error::Layout(format!(
                    "data dir {} holds records but no {LAYOUT_FILE}; refusing to guess its layout",
                    dir.display()
                )));
            }
            let json = serde_json::to_vec_pretty(&Layout {
                layout_version: LAYOUT_VERSION,
            })
            .map_err(|e| Error::io("serialize layout", std::io::Error::other(e)))?;
            write_atomically(&path, &json)
                .map_err(|e| Error::io(format!("write {}", path.display()), e))
        }
        Err(e) => Err(e),
    }
}

/// Reads and parses `layout.json`; a missing file is an `Io` error of kind
/// `NotFound`.
fn read_layout(path: &Path) -> Result<Layout> {
    let bytes =
        std::fs::read(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        Error::Layout(format!(
            "{} is not a valid layout file: {e}",
            path.display()
        ))
    })
}

/// The data dir's layout against this build, read without the lock and
/// without changing anything: `orchestrator db status`.
pub(crate) fn layout_status(dir: &Path) -> Result<SchemaStatus> {
    let path = dir.join(LAYOUT_FILE);
    let on_disk = match read_layout(&path) {
        Ok(layout) => layout.layout_version,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            if dir.join(JOURNAL_FILE).exists() || dir.join(SNAPSHOT_FILE).exists() {
                return Err(Error::Layout(format!(
                    "data dir {} holds records but no {LAYOUT_FILE}; refusing to guess its layout",
                    dir.display()
                )));
            }
            0
        }
        Err(e) => return Err(e),
    };
    let entries = (1..=on_disk.max(LAYOUT_VERSION))
        .map(|version| SchemaEntry {
            version,
            name: format!("layout version {version}"),
            state: if version > LAYOUT_VERSION {
                EntryState::Unknown
            } else if version <= on_disk {
                EntryState::Applied
            } else {
                EntryState::Pending
            },
            checksum: None,
            applied_at: None,
        })
        .collect();
    Ok(SchemaStatus {
        backend: "filesystem",
        location: dir.display().to_string(),
        entries,
    })
}
