//! [`RetentionStore`] on SurrealDB: a finished workflow goes with its
//! tasks and their log chunks in one transaction; audit records go by time.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use orchestrator_core::WorkflowId;
use surrealdb::types::Variables;

use super::SurrealBackend;
use super::errors::db_error;
use super::rows::version_param;
use crate::{Pruned, Result, RetentionStore};

/// The statuses a workflow may be pruned in, as stored in `status`.
const FINISHED: [&str; 3] = ["completed", "failed", "cancelled"];

#[async_trait]
impl RetentionStore for SurrealBackend {
    async fn prune_workflows(&self, workflows: &[(WorkflowId, u64)]) -> Result<Pruned> {
        let mut pruned = Pruned::default();
        for &(id, version) in workflows {
            let mut vars = Variables::new();
            vars.insert("id", id.to_string());
            vars.insert("expected", version_param(version));
            vars.insert("finished", FINISHED.map(str::to_owned).to_vec());
            // The version and status are checked by the DELETE itself, in
            // the transaction that removes the tasks: a workflow revived by
            // a retry since the decision has another version and stays.
            // One statement, so one transaction: the workflow, its tasks
            // and their logs go together or not at all.
            let response = self
                .query(
                    "prune a workflow",
                    "{
                         LET $gone = (DELETE type::record('workflow', $id)
                             WHERE version = $expected AND status IN $finished RETURN BEFORE);
                         IF array::len($gone) == 0 { RETURN [0, 0]; };
                         LET $tasks = (SELECT VALUE record::id(id) FROM task WHERE workflow = $id);
                         FOR $task IN $tasks {
                             DELETE type::record('task', $task);
                             DELETE type::record('log_length', $task);
                             DELETE log_chunk WHERE task = $task;
                         };
                         RETURN [1, array::len($tasks)];
                     };",
                    &vars,
                )
                .await;
            // Which tasks went is not returned (only how many): forget all.
            if let Some(recent) = &self.recent {
                recent.wrote_any(&response);
            }
            let mut response = response?;
            // `[workflows deleted, tasks deleted]`.
            let counts: Vec<u64> = response
                .take(0)
                .map_err(|e| db_error("prune a workflow", &e))?;
            if let [1, tasks] = counts[..] {
                pruned.workflows.push(id);
                pruned.tasks += tasks;
            }
        }
        Ok(pruned)
    }

    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut vars = Variables::new();
        vars.insert("before", before.timestamp_millis());
        // Counted, then deleted without returning them: a year of audit
        // records need not come back over the wire to be counted.
        let mut response = self
            .query(
                "prune audit records",
                "{
                     LET $count = (SELECT count() AS n FROM audit
                         WHERE time_ms < $before GROUP ALL)[0].n ?? 0;
                     DELETE audit WHERE time_ms < $before RETURN NONE;
                     RETURN $count;
                 };",
                &vars,
            )
            .await?;
        let count: Option<u64> = response
            .take(0)
            .map_err(|e| db_error("prune audit records", &e))?;
        Ok(count.unwrap_or(0))
    }
}
