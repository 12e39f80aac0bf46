//! Every write the engine makes to tasks, workflows and logs, each
//! announced on the event bus once it is durable and never before.
//!
//! On a store of one node this is where events come from: the caller says
//! what the record was, storage says what it is now, and the core's diff
//! says what changed. On a shared store the engine announces nothing
//! itself: every node hears every node's changes, its own included, from
//! the store's change feed (see `cluster`), so that all nodes tell the
//! same story in the store's order.

use std::sync::Arc;

use orchestrator_core::event::{
    Before, Change, TaskMark, pause_change, task_changes, workflow_change,
};
use orchestrator_core::{Task, TaskId, Workflow, WorkflowId, WorkflowStatus};
use orchestrator_storage::Storage;

use crate::Result;
use crate::events::EventBus;

/// The engine's writes.
pub(crate) struct Records {
    store: Storage,
    bus: Arc<EventBus>,
    /// False on a shared store, whose change feed announces instead.
    announce: bool,
}

impl Records {
    pub(crate) fn new(store: Storage, bus: Arc<EventBus>) -> Records {
        let announce = !store.nodes().shared();
        Records {
            store,
            bus,
            announce,
        }
    }

    /// Stores a new workflow with all its tasks, atomically.
    pub(crate) async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        self.store.tasks().insert_workflow(workflow, tasks).await?;
        if self.announce {
            self.bus.publish(
                workflow_change(Before::Created, workflow)
                    .into_iter()
                    .chain(tasks.iter().flat_map(|t| task_changes(Before::Created, t))),
            );
        }
        Ok(())
    }

    /// Stores a workflow by compare-and-set, with tasks it gains; `before`
    /// is the status it had when it was read.
    pub(crate) async fn update_workflow(
        &self,
        workflow: &Workflow,
        before: WorkflowStatus,
        new_tasks: &[Task],
    ) -> Result<Workflow> {
        let stored = self
            .store
            .tasks()
            .update_workflow(workflow, new_tasks)
            .await?;
        if self.announce {
            self.bus.publish(
                new_tasks
                    .iter()
                    .flat_map(|t| task_changes(Before::Created, t))
                    .chain(workflow_change(Before::Known(before), &stored)),
            );
        }
        Ok(stored)
    }

    /// Stores a workflow paused or resumed, by compare-and-set;
    /// `was_paused` is what it was when read.
    pub(crate) async fn update_workflow_pause(
        &self,
        workflow: &Workflow,
        was_paused: bool,
    ) -> Result<Workflow> {
        let stored = self.store.tasks().update_workflow(workflow, &[]).await?;
        if self.announce {
            self.bus.publish(pause_change(was_paused, &stored));
        }
        Ok(stored)
    }

    /// Stores a workflow and some of its tasks in one write, by
    /// compare-and-set on each; `before` is the workflow's status, and each
    /// task's mark, when read.
    pub(crate) async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        before: WorkflowStatus,
        tasks: &[(Task, TaskMark)],
    ) -> Result<(Workflow, Vec<Task>)> {
        let changed: Vec<Task> = tasks.iter().map(|(task, _)| task.clone()).collect();
        let (stored, stored_tasks) = self
            .store
            .tasks()
            .update_workflow_and_tasks(workflow, &changed)
            .await?;
        if self.announce {
            self.bus.publish(
                stored_tasks
                    .iter()
                    .zip(tasks)
                    .flat_map(|(task, (_, mark))| task_changes(Before::Known(*mark), task))
                    .chain(workflow_change(Before::Known(before), &stored)),
            );
        }
        Ok((stored, stored_tasks))
    }

    /// Stores a task by compare-and-set; `before` is what it was when read.
    pub(crate) async fn update_task(&self, task: &Task, before: TaskMark) -> Result<Task> {
        let stored = self.store.tasks().update_task(task).await?;
        if self.announce {
            self.bus
                .publish(task_changes(Before::Known(before), &stored));
        }
        Ok(stored)
    }

    /// Appends to a task's log; returns its new length.
    pub(crate) async fn append_log(
        &self,
        task: TaskId,
        workflow: WorkflowId,
        chunk: &[u8],
    ) -> Result<u64> {
        let length = self.store.tasks().append_log(task, chunk).await?;
        if self.announce {
            self.bus.publish([Change::log_appended(
                Some(workflow),
                task,
                Some(orchestrator_core::TaskStatus::Running),
                length,
            )]);
        }
        Ok(length)
    }

    /// Announces what happened without a write of its own (a step that
    /// started), where this node announces at all.
    pub(crate) fn announce(&self, change: Change) {
        if self.announce {
            self.bus.publish([change]);
        }
    }

    /// Announces a change that no change feed carries (a lock's, whose
    /// records are not followed): on any store, by the node that made it.
    pub(crate) fn announce_here(&self, change: Change) {
        self.bus.publish([change]);
    }

    pub(crate) fn store(&self) -> &Storage {
        &self.store
    }
}
