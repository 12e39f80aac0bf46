//! The filesystem backend's retention ([`crate::RetentionStore`]): pruned
//! records leave memory and the journal under the state lock, then the
//! disk with the compaction queued right after, then their logs.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::WorkflowId;

use super::FsBackend;
use super::journal::Pending;
use super::line::Line;
use super::state::State;
use super::tasks::blocking;
use crate::{Pruned, Result, RetentionStore};

/// Ids deleted per `pruned` journal line: bounds the line, not the prune.
const IDS_PER_PRUNED_LINE: usize = 1000;

impl FsBackend {
    /// Commits the deletion of `ids` as `pruned` lines of at most
    /// [`IDS_PER_PRUNED_LINE`], each made by `line`; what waits for the
    /// last one (lines are durable in order, so it covers the others).
    pub(super) fn commit_pruned(
        &self,
        state: &mut State,
        ids: &[String],
        line: impl Fn(Vec<String>) -> Line,
    ) -> Result<Option<Pending>> {
        let mut pending = None;
        for chunk in ids.chunks(IDS_PER_PRUNED_LINE) {
            pending = Some(self.commit(state, line(chunk.to_vec()))?);
        }
        Ok(pending)
    }
}

#[async_trait]
impl RetentionStore for FsBackend {
    async fn prune_workflows(&self, workflows: &[(WorkflowId, u64)]) -> Result<Pruned> {
        let mut pruned = Pruned::default();
        let mut task_ids = Vec::new();
        let pending = {
            let mut state = self.lock_state();
            let mut pending = None;
            for &(id, version) in workflows {
                // Checked under the lock that orders every write: a retry
                // that revived it, or any change, has bumped its version.
                let still_finished = state
                    .workflow_state(id)
                    .is_some_and(|(v, status)| v == version && status.is_terminal());
                if !still_finished {
                    continue;
                }
                let tasks = state.workflow_task_ids(id);
                let line = Line::Pruned {
                    workflows: vec![id],
                    tasks: tasks.clone(),
                    audit: Vec::new(),
                    tokens: Vec::new(),
                };
                pending = Some(self.commit(&mut state, line)?);
                pruned.workflows.push(id);
                pruned.tasks += tasks.len() as u64;
                task_ids.extend(tasks);
            }
            if pending.is_some() {
                // Compact now, so that the deleted records leave the disk
                // too, not only memory.
                self.queue_compaction(&mut state)?;
            }
            pending
        };
        if let Some(pending) = pending {
            // Lines are durable in order: the last one covers the others.
            pending.durable().await?;
        }
        // The records are gone for good; their logs go after them. A crash
        // in between leaves logs that no task names, which the next open
        // forgets.
        if !task_ids.is_empty() {
            let logs = self.logs.clone();
            blocking(move || logs.remove(&task_ids)).await?;
        }
        Ok(pruned)
    }

    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64> {
        let (pending, count) = {
            let mut state = self.lock_state();
            let old: Vec<String> = state
                .audit_times()
                .take_while(|(_, time)| *time < before)
                .map(|(id, _)| id.text().into_owned())
                .collect();
            let pending = self.commit_pruned(&mut state, &old, |audit| Line::Pruned {
                workflows: Vec::new(),
                tasks: Vec::new(),
                audit,
                tokens: Vec::new(),
            })?;
            if pending.is_some() {
                self.queue_compaction(&mut state)?;
            }
            (pending, old.len() as u64)
        };
        if let Some(pending) = pending {
            pending.durable().await?;
        }
        Ok(count)
    }
}
