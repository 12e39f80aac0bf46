//! `layout.json`: which on-disk layout a data dir has, checked at every
//! open, upgraded forward by a service or an import, written for a new
//! dir, and reported by `db status`.
//!
//! The rule is *upgrade forward or refuse clearly*: an older layout is
//! brought to this build's one step at a time, a newer one is refused with
//! the version (and the orchestrator) that wrote it, since reading records
//! whose format this build does not know could misread them silently.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::atomic::write_atomically;
use super::{JOURNAL_FILE, SNAPSHOT_FILE};
use crate::schema::{EntryState, SchemaEntry, SchemaStatus};
use crate::{Error, Result};

/// The on-disk layout this build reads and writes.
pub const LAYOUT_VERSION: u32 = 4;

pub(super) const LAYOUT_FILE: &str = "layout.json";

/// One step forward: turns a data dir of layout `from` into one of
/// `from + 1`. Each step is followed by an atomic rewrite of
/// `layout.json`, so a crash between the two runs the step again at the
/// next open: a step must be safe to repeat.
pub(super) struct Upgrade {
    pub from: u32,
    /// What the new layout is, for the log and for errors.
    pub name: &'static str,
    /// What the step does to the files already there; `None` when it
    /// converts nothing: the new layout only lets this build write what an
    /// older one would misread. A store of the older layout then reads as
    /// it is, so a store opened to be read only need not be upgraded.
    pub convert: Option<fn(&Path) -> std::io::Result<()>>,
    /// Whether this build reads a store that `convert` has not converted
    /// as it is (so a backup or a migration need not upgrade it first).
    pub read_unconverted: bool,
}

/// Every upgrade this build applies, oldest first (`UPGRADES[i].from ==
/// i + 1`). A change to the files that an older build would misread bumps
/// [`LAYOUT_VERSION`], adds its step here, and keeps a store of the old
/// layout in `crates/orchestrator/tests/fixtures/stores/`, whose test
/// proves that the new build still opens it.
pub(super) const UPGRADES: &[Upgrade] = &[
    Upgrade {
        from: 1,
        // A build of layout 1 would take these lines for damage in the middle
        // of the journal ("restore the data dir from a backup"); with the
        // version raised, it refuses the store for what it is: newer.
        name: "journal lines for schedules (schedule, schedule_deleted, schedule_claim)",
        convert: None,
        read_unconverted: true,
    },
    Upgrade {
        from: 2,
        // As for schedules: a build of layout 2 refuses the webhook lines as
        // newer instead of taking them for damage.
        name: "journal lines for webhooks (webhook_subscription, webhook_subscription_deleted, \
           webhook_delivery, webhook_deliveries_pruned)",
        convert: None,
        read_unconverted: true,
    },
    Upgrade {
        from: 3,
        // A build of layout 3 would find no log in the packs. This build
        // reads the old files as they are, and packs them when it writes.
        name: "task logs packed many to a file (logs/<n>.pack)",
        convert: Some(super::logs::pack_legacy_logs),
        read_unconverted: true,
    },
];

/// How an open treats an older layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// A service or an import target: upgrade an older layout, and create
    /// `layout.json` in a new dir.
    Upgrade,
    /// A store opened to be read only: never written, so an older layout
    /// is refused rather than upgraded.
    ReadOnly,
}

#[derive(Serialize, Deserialize)]
struct Layout {
    layout_version: u32,
    /// The orchestrator version that created or last upgraded the dir, so
    /// that an older build refusing it can say which version to run. Older
    /// builds ignore the field: adding it changed no layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    written_by: Option<String>,
}

/// Checks the dir's layout at open, upgrading it (with [`Access::Upgrade`])
/// to this build's.
pub(super) fn check_layout(dir: &Path, access: Access) -> Result<()> {
    open_layout(dir, access, LAYOUT_VERSION, UPGRADES)
}

fn open_layout(dir: &Path, access: Access, current: u32, upgrades: &[Upgrade]) -> Result<()> {
    let path = dir.join(LAYOUT_FILE);
    let Some(layout) = layout_in(dir)? else {
        if access == Access::ReadOnly {
            return Err(Error::Layout(format!(
                "{} holds no filesystem store (no {LAYOUT_FILE})",
                dir.display()
            )));
        }
        return write_layout(&path, current);
    };
    let found = layout.layout_version;
    if found > current {
        let writer = layout
            .written_by
            .map(|v| format!(" (written by orchestrator {v})"))
            .unwrap_or_default();
        return Err(Error::Layout(format!(
            "data dir {} has layout version {found}{writer}, newer than this build \
             (orchestrator {}) supports ({current}); run that version or a newer one, or \
             restore a backup taken with this one",
            dir.display(),
            env!("CARGO_PKG_VERSION"),
        )));
    }
    if found == current {
        return Ok(());
    }
    let mut steps = Vec::new();
    for version in found..current {
        steps.push(upgrades.iter().find(|u| u.from == version).ok_or_else(|| {
            Error::Layout(format!(
                "data dir {} has layout version {version}, which this build cannot upgrade \
                 (it knows no step from it); upgrade through an intermediate release",
                dir.display()
            ))
        })?);
    }
    if access == Access::ReadOnly {
        // Never written: readable as it is, or refused.
        if steps
            .iter()
            .all(|step| step.convert.is_none() || step.read_unconverted)
        {
            return Ok(());
        }
        return Err(Error::Layout(format!(
            "data dir {} has layout version {found}, older than this build's ({current}); a \
             store opened to be read is never upgraded: start this build's `orchestrator \
             serve` on it once to upgrade it",
            dir.display()
        )));
    }
    for step in steps {
        let version = step.from;
        let convert = step.convert.unwrap_or(|_| Ok(()));
        convert(dir).map_err(|e| {
            Error::Layout(format!(
                "cannot upgrade data dir {} from layout version {version} to {} ({}): {e}; \
                 the dir is left at version {version}, and the next start tries again",
                dir.display(),
                version + 1,
                step.name
            ))
        })?;
        write_layout(&path, version + 1)?;
        tracing::info!(
            dir = %dir.display(),
            from = version,
            to = version + 1,
            step = step.name,
            "upgraded the data dir's layout"
        );
    }
    Ok(())
}

fn write_layout(path: &Path, version: u32) -> Result<()> {
    let json = serde_json::to_vec_pretty(&Layout {
        layout_version: version,
        written_by: Some(env!("CARGO_PKG_VERSION").to_owned()),
    })
    .map_err(|e| Error::io("serialize layout", std::io::Error::other(e)))?;
    write_atomically(path, &json).map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// The dir's `layout.json`, `None` for a new dir (no layout and no
/// records); records without a layout are refused.
fn layout_in(dir: &Path) -> Result<Option<Layout>> {
    let path = dir.join(LAYOUT_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if dir.join(JOURNAL_FILE).exists() || dir.join(SNAPSHOT_FILE).exists() {
                return Err(Error::Layout(format!(
                    "data dir {} holds records but no {LAYOUT_FILE}; refusing to guess its layout",
                    dir.display()
                )));
            }
            return Ok(None);
        }
        Err(e) => return Err(Error::io(format!("read {}", path.display()), e)),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        Error::Layout(format!(
            "{} is not a valid layout file: {e}",
            path.display()
        ))
    })
}

/// The layout version of a data dir's store, `None` for a dir without one;
/// read without the lock and without changing anything.
pub fn layout_version(dir: &Path) -> Result<Option<u32>> {
    Ok(layout_in(dir)?.map(|layout| layout.layout_version))
}

/// The data dir's layout against this build, read without the lock and
/// without changing anything: `orchestrator db status`.
pub(crate) fn layout_status(dir: &Path) -> Result<SchemaStatus> {
    let on_disk = layout_version(dir)?.unwrap_or(0);
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Two made-up steps, 1 -> 2 -> 3, each leaving a file behind, so the
    /// machinery is tested before a real upgrade exists.
    const STEPS: &[Upgrade] = &[
        Upgrade {
            from: 1,
            name: "add two",
            convert: Some(|dir| std::fs::write(dir.join("two"), "2")),
            read_unconverted: false,
        },
        Upgrade {
            from: 2,
            name: "add three",
            convert: Some(|dir| std::fs::write(dir.join("three"), "3")),
            read_unconverted: false,
        },
    ];

    fn version_on_disk(dir: &Path) -> u32 {
        layout_version(dir).unwrap().unwrap()
    }

    #[test]
    fn an_older_layout_is_upgraded_one_step_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        open_layout(dir.path(), Access::Upgrade, 1, STEPS).unwrap();
        assert_eq!(version_on_disk(dir.path()), 1);
        open_layout(dir.path(), Access::Upgrade, 3, STEPS).unwrap();
        assert_eq!(version_on_disk(dir.path()), 3);
        assert!(dir.path().join("two").exists() && dir.path().join("three").exists());
        // Up to date: nothing to do, and a second open changes nothing.
        open_layout(dir.path(), Access::Upgrade, 3, STEPS).unwrap();
    }

    #[test]
    fn a_failed_step_leaves_the_version_it_started_from() {
        let dir = tempfile::tempdir().unwrap();
        open_layout(dir.path(), Access::Upgrade, 1, STEPS).unwrap();
        let failing = [
            Upgrade { ..STEPS[0] },
            Upgrade {
                from: 2,
                name: "break",
                convert: Some(|_| Err(std::io::Error::other("disk on fire"))),
                read_unconverted: false,
            },
        ];
        let message = open_layout(dir.path(), Access::Upgrade, 3, &failing)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("from layout version 2 to 3 (break)"),
            "{message}"
        );
        assert!(message.contains("disk on fire"), "{message}");
        assert_eq!(version_on_disk(dir.path()), 2);
    }

    #[test]
    fn a_reader_never_upgrades_and_a_newer_layout_names_its_writer() {
        let dir = tempfile::tempdir().unwrap();
        open_layout(dir.path(), Access::Upgrade, 1, STEPS).unwrap();
        let message = open_layout(dir.path(), Access::ReadOnly, 3, STEPS)
            .unwrap_err()
            .to_string();
        assert!(message.contains("older than this build's (3)"), "{message}");
        assert_eq!(version_on_disk(dir.path()), 1);

        std::fs::write(
            dir.path().join(LAYOUT_FILE),
            r#"{"layout_version": 7, "written_by": "9.9.9"}"#,
        )
        .unwrap();
        let message = open_layout(dir.path(), Access::Upgrade, 3, STEPS)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("layout version 7 (written by orchestrator 9.9.9), newer than"),
            "{message}"
        );
    }

    #[test]
    fn a_reader_reads_an_older_layout_that_nothing_converts() {
        let dir = tempfile::tempdir().unwrap();
        open_layout(dir.path(), Access::Upgrade, 1, STEPS).unwrap();
        let additive = [Upgrade {
            from: 1,
            name: "new lines only",
            convert: None,
            read_unconverted: false,
        }];
        open_layout(dir.path(), Access::ReadOnly, 2, &additive).unwrap();
        assert_eq!(version_on_disk(dir.path()), 1, "a reader never writes");
        open_layout(dir.path(), Access::Upgrade, 2, &additive).unwrap();
        assert_eq!(version_on_disk(dir.path()), 2);
    }

    #[test]
    fn a_gap_in_the_steps_is_refused_by_version() {
        let dir = tempfile::tempdir().unwrap();
        open_layout(dir.path(), Access::Upgrade, 1, STEPS).unwrap();
        let message = open_layout(dir.path(), Access::Upgrade, 3, &STEPS[..1])
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("layout version 2, which this build cannot upgrade"),
            "{message}"
        );
    }
}
