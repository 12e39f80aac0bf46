//! [`TaskStore`] on SurrealDB: workflows and tasks (compare-and-set on
//! `version`, atomic inserts) and task logs as chunks.

use std::sync::Arc;

use async_trait::async_trait;
use orchestrator_core::{Task, TaskId, TaskStatus, Workflow, WorkflowId};
use surrealdb::types::{Bytes, RecordId, Variables};

use super::errors::db_error;
use super::group::{Write, answer, updated_any};
use super::recent::Written;
use super::rows::{LOG_CHUNKS_PER_READ, gather_log, task_row, to_i64, version_param, workflow_row};
use super::{Listing, Order, SurrealBackend, Window};
use crate::{Error, LogChunk, Page, Result, TaskQuery, TaskStore, WorkflowQuery};

#[async_trait]
impl TaskStore for SurrealBackend {
    async fn insert_workflow(&self, workflow: &Workflow, tasks: &[Task]) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("workflow", workflow_row(workflow, true)?);
        vars.insert(
            "tasks",
            serde_json::Value::Array(
                tasks
                    .iter()
                    .map(|t| task_row(t, true))
                    .collect::<Result<_>>()?,
            ),
        );
        // One transaction: all of it or none. The record ids and the unique
        // indexes refuse duplicates, and `classify` says which.
        let result = self
            .write(Write {
                context: "insert a workflow",
                block: "INSERT INTO workflow $p.workflow RETURN NONE;
                        INSERT INTO task $p.tasks RETURN NONE;",
                params: vars,
                records: 1 + tasks.len(),
            })
            .await;
        if let Some(recent) = &self.recent {
            recent.inserted(&result);
        }
        result?;
        Ok(())
    }

    async fn update_workflow(&self, workflow: &Workflow, new_tasks: &[Task]) -> Result<Workflow> {
        let mut stored = workflow.clone();
        stored.version += 1;
        let mut vars = Variables::new();
        vars.insert("id", workflow.id.to_string());
        vars.insert("expected", version_param(workflow.version));
        vars.insert("row", workflow_row(&stored, false)?);
        vars.insert(
            "tasks",
            serde_json::Value::Array(
                new_tasks
                    .iter()
                    .map(|t| task_row(t, true))
                    .collect::<Result<_>>()?,
            ),
        );
        // The compare-and-set and the new tasks commit together: a stale
        // version adds no task, and answers 0.
        let result = self
            .write(Write {
                context: "update a workflow",
                block: "LET $updated = (UPDATE type::record('workflow', $p.id) CONTENT $p.row
                            WHERE version = $p.expected RETURN VALUE version);
                        IF array::len($updated) > 0 { INSERT INTO task $p.tasks RETURN NONE; };
                        array::len($updated)",
                params: vars,
                records: 1 + new_tasks.len(),
            })
            .await;
        if let Some(recent) = &self.recent {
            // New tasks change the task listings; the workflow alone does not.
            let added = new_tasks.iter().map(|t| Written::Task(t.id));
            recent.wrote(added.chain([Written::Workflow(workflow.id)]), &result);
        }
        if updated_any("update a workflow", result?)? {
            return Ok(stored);
        }
        let id = workflow.id.to_string();
        let gone = Error::WorkflowNotFound(workflow.id);
        Err(self
            .why_stale("workflow", "workflow", id, workflow.version, gone)
            .await?)
    }

    async fn update_workflow_and_tasks(
        &self,
        workflow: &Workflow,
        tasks: &[Task],
    ) -> Result<(Workflow, Vec<Task>)> {
        let (stored, stored_tasks) = crate::next_versions(workflow, tasks);
        let mut vars = Variables::new();
        vars.insert("id", workflow.id.to_string());
        vars.insert("expected", version_param(workflow.version));
        vars.insert("row", workflow_row(&stored, false)?);
        let changes = tasks
            .iter()
            .zip(&stored_tasks)
            .map(|(old, new)| {
                Ok(serde_json::json!({
                    "id": old.id.to_string(),
                    "row": task_row(new, false)?,
                }))
            })
            .collect::<Result<Vec<_>>>()?;
        vars.insert("tasks", serde_json::Value::Array(changes));
        // Every record this compare-and-set covers, and the version each
        // must have: the workflow first, then the tasks.
        let records: Vec<RecordId> =
            std::iter::once(RecordId::new("workflow", workflow.id.to_string()))
                .chain(
                    tasks
                        .iter()
                        .map(|t| RecordId::new("task", t.id.to_string())),
                )
                .collect();
        let versions: Vec<i64> = std::iter::once(workflow.version)
            .chain(tasks.iter().map(|t| t.version))
            .map(version_param)
            .collect();
        vars.insert("records", records);
        vars.insert("versions", versions);
        // One compare-and-set over all of them: the versions are checked
        // first, and one that is stale (or a record gone) writes nothing
        // and answers 0.
        let result = self
            .write(Write {
                context: "update a workflow and its tasks",
                block: "LET $found = (SELECT VALUE version FROM $p.records);
                        IF $found != $p.versions { 0 } ELSE {
                            UPDATE type::record('workflow', $p.id) CONTENT $p.row RETURN NONE;
                            FOR $task IN $p.tasks {
                                UPDATE type::record('task', $task.id) CONTENT $task.row RETURN NONE;
                            };
                            1
                        }",
                params: vars,
                records: 1 + tasks.len(),
            })
            .await;
        if let Some(recent) = &self.recent {
            let written = tasks.iter().map(|t| Written::Task(t.id));
            recent.wrote(written.chain([Written::Workflow(workflow.id)]), &result);
        }
        if updated_any("update a workflow and its tasks", result?)? {
            return Ok((stored, stored_tasks));
        }
        // Name what was stale, as the single updates do: the first record
        // found changed, or else the workflow.
        let changed =
            |e: &Error| !matches!(e, Error::Conflict { expected, found, .. } if expected == found);
        let id = workflow.id.to_string();
        let gone = Error::WorkflowNotFound(workflow.id);
        let stale = self
            .why_stale("workflow", "workflow", id, workflow.version, gone)
            .await?;
        if changed(&stale) {
            return Err(stale);
        }
        for task in tasks {
            let id = task.id.to_string();
            let gone = Error::TaskNotFound(task.id);
            let task_stale = self
                .why_stale("task", "task", id, task.version, gone)
                .await?;
            if changed(&task_stale) {
                return Err(task_stale);
            }
        }
        Err(stale)
    }

    async fn update_task(&self, task: &Task) -> Result<Task> {
        let mut stored = task.clone();
        stored.version += 1;
        let mut vars = Variables::new();
        vars.insert("id", task.id.to_string());
        vars.insert("expected", version_param(task.version));
        vars.insert("row", task_row(&stored, false)?);
        let result = self
            .write(Write {
                context: "update a task",
                block: "LET $updated = (UPDATE type::record('task', $p.id) CONTENT $p.row
                            WHERE version = $p.expected RETURN VALUE version);
                        array::len($updated)",
                params: vars,
                records: 1,
            })
            .await;
        if let Some(recent) = &self.recent {
            recent.wrote([Written::Task(task.id)], &result);
        }
        if updated_any("update a task", result?)? {
            return Ok(stored);
        }
        let id = task.id.to_string();
        let gone = Error::TaskNotFound(task.id);
        Err(self
            .why_stale("task", "task", id, task.version, gone)
            .await?)
    }

    async fn get_task(&self, id: TaskId) -> Result<Option<Task>> {
        self.read_one("read a task", id).await
    }

    async fn list_tasks(&self, query: &TaskQuery) -> Result<Page<Task>> {
        self.page(
            "list tasks",
            &task_listing(query),
            Variables::new(),
            Window {
                after: query.after.map(|id| id.to_string()),
                limit: query.limit,
                offset: query.offset,
            },
        )
        .await
    }

    async fn workflow_tasks(&self, id: WorkflowId) -> Result<Vec<Arc<Task>>> {
        let mut vars = Variables::new();
        vars.insert("workflow", id.to_string());
        let tasks: Vec<Task> = self
            .docs("read a workflow's tasks", WORKFLOW_TASKS, &vars)
            .await?;
        // Read newest first (forwards: see `WORKFLOW_TASKS`), answered
        // oldest first.
        Ok(tasks.into_iter().rev().map(Arc::new).collect())
    }

    async fn unfinished_tasks(&self) -> Result<Vec<Task>> {
        let unfinished: Vec<String> = TaskStatus::ALL
            .iter()
            .filter(|s| !s.is_terminal())
            .map(|s| s.as_str().to_owned())
            .collect();
        let mut vars = Variables::new();
        vars.insert("statuses", unfinished);
        self.docs(
            "read unfinished tasks",
            "SELECT VALUE doc FROM task WHERE status IN $statuses ORDER BY id ASC;",
            &vars,
        )
        .await
    }

    async fn get_workflow(&self, id: WorkflowId) -> Result<Option<Workflow>> {
        self.read_one("read a workflow", id).await
    }

    async fn list_workflows(&self, query: &WorkflowQuery) -> Result<Page<Workflow>> {
        let (listing, vars) = workflow_listing(query);
        self.page(
            "list workflows",
            &listing,
            vars,
            Window {
                after: query.after.map(|id| id.to_string()),
                limit: query.limit,
                offset: query.offset,
            },
        )
        .await
    }

    async fn append_log(&self, id: TaskId, chunk: &[u8]) -> Result<u64> {
        let mut vars = Variables::new();
        vars.insert("task", id.to_string());
        vars.insert("len", to_i64(chunk.len()));
        vars.insert("data", Bytes::from(chunk.to_vec()));
        // Raising the length and writing the chunk commit together, so
        // chunks never overlap and the length never runs ahead of them.
        // The raised length is the answer: no read of its own. An empty
        // chunk writes nothing and reads the length.
        let length: Option<i64> = if chunk.is_empty() {
            let mut response = self
                .query(
                    "read a task log's length",
                    "SELECT VALUE bytes FROM ONLY type::record('log_length', $task);",
                    &vars,
                )
                .await?;
            response
                .take(0)
                .map_err(|e| db_error("read a task log's length", &e))?
        } else {
            let end = self
                .write(Write {
                    context: "append to a task log",
                    block: "LET $end = (UPSERT ONLY type::record('log_length', $p.task)
                                SET bytes += $p.len RETURN VALUE bytes);
                            CREATE log_chunk SET task = $p.task, start_offset = $end - $p.len,
                                end_offset = $end, data = $p.data RETURN NONE;
                            $end",
                    params: vars,
                    records: 2,
                })
                .await?;
            Some(answer("append to a task log", end)?)
        };
        Ok(length.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }

    async fn read_log(&self, id: TaskId, offset: u64, max_bytes: usize) -> Result<LogChunk> {
        let mut data = Vec::new();
        let mut from = offset;
        while data.len() < max_bytes {
            let mut vars = Variables::new();
            vars.insert("task", id.to_string());
            vars.insert("from", i64::try_from(from).unwrap_or(i64::MAX));
            vars.insert("limit", LOG_CHUNKS_PER_READ);
            let mut response = self
                .query(
                    "read a task log",
                    "SELECT VALUE [start_offset, end_offset, data] FROM log_chunk
                     WHERE task = $task AND end_offset > $from ORDER BY end_offset ASC LIMIT $limit;",
                    &vars,
                )
                .await?;
            let chunks: Vec<(i64, i64, Bytes)> = response
                .take(0)
                .map_err(|e| db_error("read a task log", &e))?;
            let n_chunks = chunks.len();
            from = gather_log(chunks, from, max_bytes, &mut data);
            if n_chunks < LOG_CHUNKS_PER_READ as usize {
                break;
            }
        }
        Ok(LogChunk {
            next_offset: offset + data.len() as u64,
            data,
        })
    }
}

/// A workflow's tasks, newest first: read forwards from the (`workflow`,
/// `newest_first`) index, without a sort (the plans test checks it), and
/// never backwards (migration 0011 says why).
pub(super) const WORKFLOW_TASKS: &str =
    "SELECT VALUE doc FROM task WHERE workflow = $workflow ORDER BY newest_first ASC;";

/// A task listing: its `WHERE`, the index to read, the order. The values
/// are literals so that the total comes from the COUNT indexes and index
/// keys (see [`super::Listing`]); both are of closed sets: a status's
/// name, and a UUID's hyphenated hex.
pub(super) fn task_listing(query: &TaskQuery) -> Listing<'static> {
    let (workflow, status) = (query.workflow, query.status);
    let mut conditions = Vec::new();
    if let Some(workflow) = workflow {
        conditions.push(format!("workflow = '{}'", workflow.as_uuid().hyphenated()));
    }
    if let Some(status) = status {
        conditions.push(format!("status = '{}'", status.as_str()));
    }
    if workflow.is_none() && status.is_none() && query.after.is_none() && query.offset > 0 {
        // A deep page by offset without a filter reads the table
        // backwards: SurrealDB skips a table's entries without reading
        // their records, but reads the record of each index entry it skips
        // (at 100k tasks, 1.2 µs against 7 µs per task skipped). The
        // backward seek's cost (migration 0011) is paid once a page.
        return Listing {
            table: "task",
            conditions,
            page_only: None,
            index: None,
            order: Order::Id,
        };
    }
    // Every other shape reads an index that ends with `newest_first`
    // (migrations 0011 and 0012), after equalities on the fields before
    // it: the page comes newest first from the index read forwards, and a
    // cursor is a seek.
    let index = match (workflow, status) {
        (None, None) => "task_listed_newest",
        (None, Some(_)) => "task_status_newest",
        (Some(_), None) => "task_workflow_newest",
        (Some(_), Some(_)) => "task_workflow_status_newest",
    };
    Listing {
        table: "task",
        conditions,
        // Without a filter the index's leading field must be pinned for
        // the seek; the total still comes from the table's COUNT index,
        // which answers only a WHERE-less count.
        page_only: (workflow.is_none() && status.is_none()).then_some("listed = true"),
        index: Some(index),
        order: Order::NewestFirst,
    }
}

/// The workflow list: its `WHERE` with the variables it binds, the index
/// to read, the order.
pub(super) fn workflow_listing(query: &WorkflowQuery) -> (Listing<'static>, Variables) {
    let mut conditions = Vec::new();
    let mut vars = Variables::new();
    if let Some(status) = query.status {
        conditions.push("status = $status");
        vars.insert("status", status.as_str());
    }
    let text_filters = [
        ("kind = $kind", "kind", &query.kind),
        ("reference = $reference", "reference", &query.reference),
        ("trace_id = $trace_id", "trace_id", &query.trace_id),
        (
            "idempotency_key = $idempotency_key",
            "idempotency_key",
            &query.idempotency_key,
        ),
    ];
    for (condition, name, value) in text_filters {
        if let Some(value) = value {
            conditions.push(condition);
            vars.insert(name, value.clone());
        }
    }
    if let Some(text) = &query.text {
        // `search` holds `workflow_search_text`, lowercased when written.
        conditions.push("string::contains(search, $text)");
        vars.insert("text", text.to_lowercase());
    }
    // Without a filter, or by status alone (the dashboard's two), the page
    // is read forwards from an index that ends with `newest_first`
    // (migrations 0013 and 0014), and a cursor seeks; as for tasks, a
    // deep page by offset without a filter reads the table instead (see
    // `task_listing`). Other filters read the table backwards.
    let unfiltered = conditions.is_empty();
    let by_status_alone = query.status.is_some() && conditions.len() == 1;
    let by_index = if unfiltered {
        (query.after.is_some() || query.offset == 0).then_some("workflow_listed_newest")
    } else {
        by_status_alone.then_some("workflow_status_newest")
    };
    let listing = Listing {
        table: "workflow",
        conditions: conditions.into_iter().map(str::to_owned).collect(),
        page_only: (unfiltered && by_index.is_some()).then_some("listed = true"),
        index: by_index,
        order: if by_index.is_some() {
            Order::NewestFirst
        } else {
            Order::Id
        },
    };
    (listing, vars)
}
