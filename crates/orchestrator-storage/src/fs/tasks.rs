//! The filesystem backend's tasks, workflows and task logs
//! ([`crate::TaskStore`]): every check and change under the state lock,
//! durability awaited after it.

use std::sync::Arc;

use async_trait::async_trait;
use orchestrator_core::{Task, TaskId, Workflow, WorkflowId};

use super::line::Line;
use super::{FsBackend, same_version};
use crate::{Error, LogChunk, Page, Result, TaskQuery, TaskStore, WorkflowQuery, next_versions};

#[async_trait]
impl TaskStore for FsBackend {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            if state.workflow_state(workflow.id).is_some() {
                return Err(Error::AlreadyExists {
                    what: "workflow",
                    id: workflow.id.to_string(),
                });
            }
            if let Some(task) = tasks.iter().find(|t| state.task_version(t.id).is_some()) {
                return Err(Error::AlreadyExists {
                    what: "task",
                    id: task.id.to_string(),
                });
            }
            if let Some(key) = &workflow.idempotency_key
                && state.has_idempotency_key(key)
            {
                return Err(Error::AlreadyExists {
                    what: "idempotency key",
                    id: key.clone(),
                });
            }
            if let Some(reference) = &workflow.reference
                && state.has_revision(reference, workflow.revision)
            {
                return Err(Error::AlreadyExists {
                    what: "workflow revision",
                    id: format!("{reference}#{}", workflow.revision),
                });
            }
            let record = Line::Submission {
                workflow: workflow.clone(),
                tasks: tasks.to_vec(),
            };
            (self.commit(&mut state, record)?, state.last_seq)
        };
        let (pending, seq) = pending;
        pending.durable().await?;
        // Imports and replays may insert work that has already finished.
        self.evict_finished(workflow.id, seq);
        Ok(())
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        let (pending, seq, stored) = {
            let mut state = self.lock_state();
            let current = state
                .task_version(task.id)
                .ok_or(Error::TaskNotFound(task.id))?;
            same_version("task", task.id, task.version, current)?;
            let mut stored = task.clone();
            stored.version += 1;
            let pending = self.commit(&mut state, Line::Task(stored.clone()))?;
            (pending, state.last_seq, stored)
        };
        pending.durable().await?;
        self.evict_finished(stored.workflow_id, seq);
        Ok(stored)
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        let (pending, seq, stored) = {
            let mut state = self.lock_state();
            let (current, _) = state
                .workflow_state(workflow.id)
                .ok_or(Error::WorkflowNotFound(workflow.id))?;
            same_version("workflow", workflow.id, workflow.version, current)?;
            if let Some(task) = new_tasks
                .iter()
                .find(|t| state.task_version(t.id).is_some())
            {
                return Err(Error::AlreadyExists {
                    what: "task",
                    id: task.id.to_string(),
                });
            }
            let mut stored = workflow.clone();
            stored.version += 1;
            let record = Line::Submission {
                workflow: stored.clone(),
                tasks: new_tasks.to_vec(),
            };
            (self.commit(&mut state, record)?, state.last_seq, stored)
        };
        pending.durable().await?;
        self.evict_finished(stored.id, seq);
        Ok(stored)
    }

    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)> {
        let (pending, seq, stored) = {
            let mut state = self.lock_state();
            let (current, _) = state
                .workflow_state(workflow.id)
                .ok_or(Error::WorkflowNotFound(workflow.id))?;
            same_version("workflow", workflow.id, workflow.version, current)?;
            for task in tasks {
                let current = state
                    .task_version(task.id)
                    .ok_or(Error::TaskNotFound(task.id))?;
                same_version("task", task.id, task.version, current)?;
            }
            let (stored, stored_tasks) = next_versions(workflow, tasks);
            // One checksummed line: a crash keeps all of it or none.
            let record = Line::Submission {
                workflow: stored.clone(),
                tasks: stored_tasks.clone(),
            };
            (
                self.commit(&mut state, record)?,
                state.last_seq,
                (stored, stored_tasks),
            )
        };
        pending.durable().await?;
        self.evict_finished(workflow.id, seq);
        Ok(stored)
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>> {
        Ok(self.lock_state().task(id)?.map(Arc::unwrap_or_clone))
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        self.lock_state().list_tasks(query)
    }

    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        self.lock_state().workflow_tasks(id)
    }

    async fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        self.lock_state().unfinished_tasks()
    }

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>> {
        Ok(self.lock_state().workflow(id)?.map(Arc::unwrap_or_clone))
    }

    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        self.lock_state().list_workflows(query)
    }

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64> {
        self.writer()?.check_usable()?;
        if chunk.is_empty() {
            return Ok(self.logs.length(id));
        }
        // Off the async workers: a write can stall on a slow or full disk.
        // The pump batches a task's output, so this is one hop per batch.
        let (logs, chunk) = (self.logs.clone(), chunk.to_vec());
        blocking(move || logs.append(id, &chunk)).await
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        let logs = self.logs.clone();
        blocking(move || logs.read(id, offset, max_bytes)).await
    }
}

/// Runs file I/O on the blocking pool, not on an async worker.
pub(super) async fn blocking<T: Send + 'static>(
    io: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(io)
        .await
        .map_err(|e| Error::io("file I/O", std::io::Error::other(e)))?
}
