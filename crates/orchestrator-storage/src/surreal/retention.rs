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
            let mut response = self
                .query(
                    "prune a workflow",
                    "BEGIN;
                     LET $gone = (DELETE type::record('workflow', $id)
                         WHERE version = $expected AND status IN $finished RETURN BEFORE);
                     LET $tasks = IF array::len($gone) > 0 {
                         (SELECT VALUE record::id(id) FROM task WHERE workflow = $id)
                     } ELSE { [] };
                     FOR $task IN $tasks {
                         DELETE type::record('task', $task);
                         DELETE type::record('log_length', $task);
                         DELETE log_chunk WHERE task = $task;
                     };
                     [array::len($gone), array::len($tasks)];
                     COMMIT;",
                    &vars,
                )
                .await?;
            let last = response.num_statements().saturating_sub(1);
            let counts: Option<(u64, u64)> = response
                .take(last)
                .map_err(|e| db_error("prune a workflow", &e))?;
            if let Some((workflows, tasks)) = counts
                && workflows > 0
            {
                pruned.workflows.push(id);
                pruned.tasks += tasks;
            }
        }
        Ok(pruned)
    }

    async fn prune_audit(&self, before: DateTime<Utc>) -> Result<u64> {
        let mut vars = Variables::new();
        vars.insert("before", before.timestamp_millis());
        let mut response = self
            .query(
                "prune audit records",
                "DELETE audit WHERE time_ms < $before RETURN BEFORE;",
                &vars,
            )
            .await?;
        let gone: Vec<serde_json::Value> = response
            .take(0)
            .map_err(|e| db_error("prune audit records", &e))?;
        Ok(gone.len() as u64)
    }
}
