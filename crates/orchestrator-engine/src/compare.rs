//! Comparing two runs: reads what the core's comparison needs (the two
//! workflows and their tasks, the template revisions and script hashes as
//! an approval's digest reads them, and the first piece of each step's
//! log, bounded) and hands it to [`orchestrator_core::compare`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use orchestrator_core::compare::{
    Comparison, LOG_COMPARE_BYTES, LogExcerpt, Run, compare, logs_to_read,
};
use orchestrator_core::{Task, TaskId, WorkflowId};

use crate::approvals::{script_hash, template_revision};
use crate::engine::Engine;
use crate::{Error, Result};

/// Most hops followed from a kept task to the task that ran (a re-run of
/// a re-run keeps from a task that may itself be kept).
const MAX_KEPT_HOPS: usize = 32;

impl Engine {
    /// Compares workflow `a` with workflow `b`: two runs of one template,
    /// or two revisions of one workflow. Runs of different templates are
    /// refused (there is no step to match).
    pub async fn compare_workflows(&self, a: WorkflowId, b: WorkflowId) -> Result<Comparison> {
        let lifecycle = &self.inner.lifecycle;
        let wa = lifecycle.load_workflow(a).await?;
        let wb = lifecycle.load_workflow(b).await?;
        if wa.kind != wb.kind {
            return Err(Error::validation(
                "b",
                format!(
                    "workflow {b} runs template `{}` and workflow {a} runs `{}`: only runs of one template can be compared",
                    wb.kind, wa.kind
                ),
            ));
        }
        let ta = self.plain_tasks(a).await?;
        let tb = self.plain_tasks(b).await?;
        let scripts = {
            let dir = self.inner.steps.scripts().config().scripts_dir.clone();
            let mut paths: Vec<String> = ta
                .iter()
                .chain(&tb)
                .filter(|t| t.step.kind.is_script())
                .map(|t| t.script.clone())
                .collect();
            paths.sort();
            paths.dedup();
            tokio::task::spawn_blocking(move || {
                paths
                    .into_iter()
                    .map(|p| {
                        let hash = script_hash(&dir, &p);
                        (p, hash)
                    })
                    .collect::<BTreeMap<_, _>>()
            })
            .await
            .map_err(|e| Error::Internal(format!("hashing scripts: {e}")))?
        };
        let (read_a, read_b) = logs_to_read(&ta, &tb);
        let logs_a = self.log_excerpts(&read_a).await?;
        let logs_b = self.log_excerpts(&read_b).await?;
        let templates = self.templates();
        Ok(compare(
            &Run {
                workflow: &wa,
                tasks: &ta,
                template_revision: template_revision(templates, &wa),
                script_hashes: &scripts,
                logs: &logs_a,
            },
            &Run {
                workflow: &wb,
                tasks: &tb,
                template_revision: template_revision(templates, &wb),
                script_hashes: &scripts,
                logs: &logs_b,
            },
        ))
    }

    async fn plain_tasks(&self, id: WorkflowId) -> Result<Vec<Task>> {
        let tasks = self.inner.store.tasks().workflow_tasks(id).await?;
        Ok(tasks.into_iter().map(Arc::unwrap_or_clone).collect())
    }

    /// The start of each task's log (of the task that ran, for one kept
    /// from an earlier revision), one byte past the limit to tell whether
    /// it goes on.
    async fn log_excerpts(&self, tasks: &[&Task]) -> Result<HashMap<TaskId, LogExcerpt>> {
        let store = self.inner.store.tasks();
        let mut logs = HashMap::with_capacity(tasks.len());
        for task in tasks {
            let mut ran = task.id;
            let mut kept = task.kept_from;
            let mut hops = 0;
            while let Some(from) = kept
                && hops < MAX_KEPT_HOPS
            {
                ran = from;
                hops += 1;
                // The earlier revision may have been pruned: its log is
                // then gone too, and reads as empty.
                kept = store
                    .get_task(from)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|t| t.kept_from);
            }
            let bytes = match store.read_log(ran, 0, LOG_COMPARE_BYTES + 1).await {
                Ok(chunk) => chunk.data,
                // A pruned earlier revision's log: nothing to compare.
                Err(_) if ran != task.id => Vec::new(),
                Err(e) => return Err(e.into()),
            };
            logs.insert(task.id, LogExcerpt::from_read(bytes));
        }
        Ok(logs)
    }
}
