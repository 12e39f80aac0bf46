//! The snapshot, `snapshot.jsonl`: every record as of the last compaction,
//! one line each (see [`super::line`]), read back by the journal's reader.
//!
//! A compaction takes copies of the records under the state lock
//! ([`SnapshotRecords::take`]); the journal writer thread encodes them,
//! outside the lock, writes them with [`write_atomically`], and empties
//! the journal. So the snapshot is only ever replaced whole, never torn.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;

use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::webhook::{Delivery, Subscription};
use orchestrator_core::{Task, Workflow};

use super::line::Line;
use super::state::State;

/// Every record of a store, taken to be written as its snapshot.
pub(super) struct SnapshotRecords {
    workflows: Vec<Workflow>,
    /// Shared with the state: taking them copies pointers, not tasks.
    tasks: Vec<Arc<Task>>,
    tokens: Vec<ApiToken>,
    secrets: Vec<SecretRecord>,
    audit: Vec<AuditRecord>,
    schedules: Vec<Schedule>,
    claims: Vec<ScheduleClaim>,
    subscriptions: Vec<Subscription>,
    deliveries: Vec<Delivery>,
}

impl SnapshotRecords {
    /// Copies every record of `state`. Called under the state lock, so it
    /// only copies; [`SnapshotRecords::encode`] does the work, after.
    pub(super) fn take(state: &State) -> SnapshotRecords {
        SnapshotRecords {
            workflows: state.workflows().cloned().collect(),
            tasks: state.shared_tasks().cloned().collect(),
            tokens: state.tokens().cloned().collect(),
            secrets: state.secrets().cloned().collect(),
            audit: state.audit().cloned().collect(),
            schedules: state.schedules().cloned().collect(),
            claims: state.all_claims().cloned().collect(),
            subscriptions: state.subscriptions().cloned().collect(),
            deliveries: state.deliveries().cloned().collect(),
        }
    }

    /// The snapshot's bytes: one line a record, workflows first.
    pub(super) fn encode(self) -> io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        let lines = (self.workflows.into_iter().map(Line::Workflow))
            .chain(
                self.tasks
                    .into_iter()
                    .map(|t| Line::Task(Arc::unwrap_or_clone(t))),
            )
            .chain(self.tokens.into_iter().map(Line::Token))
            .chain(self.secrets.into_iter().map(Line::Secret))
            .chain(self.audit.into_iter().map(Line::Audit))
            .chain(self.schedules.into_iter().map(Line::Schedule))
            .chain(self.claims.into_iter().map(Line::ScheduleClaim))
            .chain(
                self.subscriptions
                    .into_iter()
                    .map(Line::WebhookSubscription),
            )
            .chain(self.deliveries.into_iter().map(Line::WebhookDelivery));
        for line in lines {
            line.encode_into(&mut bytes)?;
        }
        Ok(bytes)
    }
}

/// Writes `bytes` to `path` atomically: temp file, fsync, rename, fsync dir.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = path.with_extension("tmp");
    {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}
