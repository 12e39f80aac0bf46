//! Tasks: listing, one task, its log, cancel and checkpoints.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use orchestrator_core::{Task, TaskId, TaskStatus};
use orchestrator_storage::TaskQuery;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::{
    DEFAULT_LOG_BYTES, MAX_LOG_BYTES, next_after, page_bounds, parse_task_id, parse_workflow_id,
    with_lookahead,
};
use crate::error::{ErrorBody, StorageUnavailable};
use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_tasks))
        .routes(routes!(get_task))
        .routes(routes!(task_logs))
        .routes(routes!(cancel_task))
        .routes(routes!(get_checkpoint, save_checkpoint))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListParams {
    /// Only tasks in this status.
    #[param(value_type = Option<TaskStatus>)]
    status: Option<String>,
    /// Only tasks of this workflow.
    #[param(value_type = Option<uuid::Uuid>)]
    workflow: Option<String>,
    /// Page size, default 50.
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
    /// Records to skip.
    #[param(minimum = 0, maximum = 4294967295u32)]
    offset: Option<u32>,
    /// Keyset paging: only tasks after this one in the listing (older
    /// than it), usually the previous page's `next_after`. Exact while
    /// tasks are added, where `offset` shifts, and as fast deep in a
    /// listing as at its start. The task need not exist any more.
    #[param(value_type = Option<uuid::Uuid>)]
    after: Option<String>,
}

/// A page of tasks, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TaskList {
    pub tasks: Vec<Task>,
    /// How many tasks match, in all pages (`after` aside).
    pub total: usize,
    pub limit: usize,
    pub offset: usize,
    /// The `after` of the next page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<TaskId>,
}

#[utoipa::path(get, path = "/tasks", tag = "tasks",
    extensions(("x-role" = json!("viewer"))),
    params(ListParams),
    responses(
        (status = 200, description = "A page of tasks", body = TaskList),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn list_tasks(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Json<TaskList>, ApiError> {
    let status = params
        .status
        .as_deref()
        .map(|s| {
            s.parse::<TaskStatus>()
                .map_err(|e| ApiError::bad_request(format!("status: {e}")))
        })
        .transpose()?;
    let workflow = params
        .workflow
        .as_deref()
        .map(|w| {
            parse_workflow_id(w)
                .map_err(|e| ApiError::bad_request(format!("workflow: {}", e.message)))
        })
        .transpose()?;
    let after = params
        .after
        .as_deref()
        .map(|a| {
            parse_task_id(a).map_err(|e| ApiError::bad_request(format!("after: {}", e.message)))
        })
        .transpose()?;
    let (limit, offset) = page_bounds(params.limit, params.offset)?;
    let mut page = state
        .engine
        .list_tasks(&TaskQuery {
            status,
            workflow,
            after,
            limit: with_lookahead(limit),
            offset,
        })
        .await?;
    let next_after = next_after(&mut page.items, limit, |t| t.id);
    Ok(Json(TaskList {
        tasks: page.items,
        total: page.total,
        limit,
        offset,
        next_after,
    }))
}

/// One task.
#[utoipa::path(get, path = "/tasks/{id}", tag = "tasks",
    extensions(("x-role" = json!("viewer"))),
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task", body = Task),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn get_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Task>, ApiError> {
    Ok(Json(state.engine.task(parse_task_id(&id)?).await?))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct LogParams {
    /// Byte offset to read from.
    #[param(minimum = 0, maximum = 4294967295u32)]
    offset: Option<u32>,
    /// Most bytes to return (default 1 MiB; more than 16 MiB reads 16 MiB).
    #[param(minimum = 0, maximum = 4294967295u32)]
    limit_bytes: Option<u32>,
    /// Stream the log as it is written, until the task ends (the headers
    /// below are then absent).
    #[serde(default)]
    follow: bool,
}

/// A task's captured stdout and stderr, as plain text.
///
/// `X-Next-Offset` tells where to continue for a `tail -f` style follow;
/// `X-Task-Status` whether more can come.
#[utoipa::path(get, path = "/tasks/{id}/logs", tag = "tasks",
    extensions(("x-role" = json!("viewer"))),
    params(("id" = uuid::Uuid, Path, description = "Task id"), LogParams),
    responses(
        (status = 200, description = "The log from `offset`", content_type = "text/plain; charset=utf-8", body = String,
            headers(
                ("x-next-offset" = u64, description = "Where to continue reading"),
                ("x-task-status" = TaskStatus, description = "The task's status when read"),
            )),
        (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn task_logs(
    State(state): State<AppState>,
    principal: Option<axum::Extension<orchestrator_engine::access::Principal>>,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<LogParams>,
) -> Result<Response, ApiError> {
    let id = parse_task_id(&id)?;
    if params.follow {
        let slot = state.streams.take(principal.as_ref().map(|p| &p.0))?;
        return crate::live::follow_log(
            state.engine.clone(),
            id,
            params.offset.map_or(0, u64::from),
            slot,
        )
        .await;
    }
    let task = state.engine.task(id).await?;
    let limit = params
        .limit_bytes
        .unwrap_or(DEFAULT_LOG_BYTES)
        .min(MAX_LOG_BYTES) as usize;
    let chunk = state
        .engine
        .store()
        .tasks()
        .read_log(id, params.offset.map_or(0, u64::from), limit)
        .await
        .map_err(orchestrator_engine::Error::from)?;
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert("x-next-offset", HeaderValue::from(chunk.next_offset));
    headers.insert(
        "x-task-status",
        HeaderValue::from_static(task.status.as_str()),
    );
    Ok((headers, chunk.data).into_response())
}

/// Cancels a task: at once if it is not running, else its script is stopped.
#[utoipa::path(post, path = "/tasks/{id}/cancel", tag = "tasks",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("task.cancel"))),
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task after the request", body = Task),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task already finished", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn cancel_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Task>, ApiError> {
    Ok(Json(state.engine.cancel_task(parse_task_id(&id)?).await?))
}

/// A task's checkpoint (`{}` while nothing was saved): free keys and JSON
/// values.
#[utoipa::path(get, path = "/tasks/{id}/checkpoint", tag = "tasks",
    extensions(("x-role" = json!("own-task-or-operator"))),
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The checkpoint", body = BTreeMap<String, Value>),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn get_checkpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Map<String, Value>>, ApiError> {
    Ok(Json(
        state.engine.task(parse_task_id(&id)?).await?.checkpoint,
    ))
}

/// Merges the body's keys into a running task's checkpoint; answers once
/// durable, so a script may act on it right away.
#[utoipa::path(put, path = "/tasks/{id}/checkpoint", tag = "tasks",
    extensions(("x-role" = json!("own-task-or-operator")), ("x-audit" = json!("task.checkpoint"))),
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    request_body(content = BTreeMap<String, Value>, description = "Keys to set"),
    responses(
        (status = 200, description = "The whole checkpoint", body = BTreeMap<String, Value>),
        (status = 400, description = "The id is not a UUID, an empty body or malformed JSON", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is not running", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The body is not a JSON object", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn save_checkpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(entries): JsonBody<Map<String, Value>>,
) -> Result<Json<Map<String, Value>>, ApiError> {
    let task = state
        .engine
        .save_checkpoint(parse_task_id(&id)?, entries)
        .await?;
    Ok(Json(task.checkpoint))
}
