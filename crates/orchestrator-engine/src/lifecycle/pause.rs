//! Pausing and resuming a workflow. The queue holds the workflow's tasks
//! back (parks them as they are popped) from just before the pause is
//! written, so that nothing of it starts once the pause is answered, and
//! lets them go again if the write fails; running steps finish as they
//! would. A restart keeps a workflow paused, since the queue learns it
//! again from the stored record before anything is dispatched.

use chrono::Utc;
use orchestrator_core::{Workflow, WorkflowId};

use super::Lifecycle;
use crate::{Error, Result};

impl Lifecycle {
    /// Pauses workflow `id`: no new step of it starts until it is
    /// resumed. Pausing a paused workflow changes nothing; a finished one
    /// is a conflict that names its status.
    pub(crate) async fn pause_workflow(&self, id: WorkflowId) -> Result<Workflow> {
        loop {
            let mut workflow = self.load_workflow(id).await?;
            if !workflow.pause(Utc::now()).map_err(Error::Conflict)? {
                return Ok(workflow);
            }
            // Held back here before the write, so that no claim of this
            // node starts once the pause is answered; a record read before
            // the pause can not undo it (see `Queue::pause`).
            self.queue.pause(id, u64::MAX);
            match self.records.update_workflow_pause(&workflow, false).await {
                Ok(stored) => {
                    self.queue.pause(id, stored.version);
                    tracing::info!(workflow = %id, "workflow paused");
                    return Ok(stored);
                }
                Err(e) => {
                    self.queue.resume(id, workflow.version);
                    if !e.is_conflict() {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// Resumes workflow `id`: its queued steps may start again. Resuming
    /// a workflow that is not paused changes nothing.
    pub(crate) async fn resume_workflow(&self, id: WorkflowId) -> Result<Workflow> {
        loop {
            let mut workflow = self.load_workflow(id).await?;
            if !workflow.resume(Utc::now()) {
                return Ok(workflow);
            }
            match self.records.update_workflow_pause(&workflow, true).await {
                Ok(stored) => {
                    self.queue.resume(id, stored.version);
                    tracing::info!(workflow = %id, "workflow resumed");
                    return Ok(stored);
                }
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
