//! Route table and handlers.

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orchestrator_core::{Task, TaskId, TaskStatus, WorkflowId, WorkflowStatus};
use orchestrator_engine::builtin::{ClusterCreate, ServersCreate, TaskservCreate, WorkflowPlan};
use orchestrator_engine::{Engine, WorkflowView};
use orchestrator_storage::TaskQuery;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState, DEFAULT_WAIT, MAX_WAIT};

const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 1000;
const DEFAULT_LOG_BYTES: usize = 1024 * 1024;

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/tasks", get(list_tasks))
        .route("/tasks/{id}", get(get_task))
        .route("/tasks/{id}/logs", get(task_logs))
        .route("/tasks/{id}/cancel", post(cancel_task))
        .route("/workflows", get(list_workflows))
        .route("/workflows/{id}", get(get_workflow))
        .route("/workflows/servers/create", post(create_servers))
        .route("/workflows/taskserv/create", post(create_taskservs))
        .route("/workflows/cluster/create", post(create_cluster))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}

async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("method not allowed on {}", uri.path()),
    )
}

async fn health(State(state): State<AppState>) -> Json<serde_json::Value> {
    let (queued, running) = state.engine.load();
    Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "storage": state.engine.store().name(),
        "workers": state.engine.config().workers,
        "queued": queued,
        "running": running,
    }))
}

fn parse_task_id(raw: &str) -> Result<TaskId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad_request(format!("`{raw}` is not a valid task id (expected a UUID)"))
    })
}

fn parse_workflow_id(raw: &str) -> Result<WorkflowId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "`{raw}` is not a valid workflow id (expected a UUID)"
        ))
    })
}

#[derive(Deserialize)]
struct ListParams {
    status: Option<String>,
    workflow: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

#[derive(Serialize)]
struct TaskList {
    tasks: Vec<Task>,
    total: usize,
    limit: usize,
    offset: usize,
}

fn page_bounds(limit: Option<usize>, offset: Option<usize>) -> Result<(usize, usize), ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is more than the maximum of {MAX_PAGE}"
        )));
    }
    Ok((limit, offset.unwrap_or(0)))
}

async fn list_tasks(
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
    let (limit, offset) = page_bounds(params.limit, params.offset)?;
    let page = state
        .engine
        .list_tasks(&TaskQuery {
            status,
            workflow,
            limit,
            offset,
        })
        .await?;
    Ok(Json(TaskList {
        tasks: page.items,
        total: page.total,
        limit,
        offset,
    }))
}

async fn get_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Task>, ApiError> {
    Ok(Json(state.engine.task(parse_task_id(&id)?).await?))
}

#[derive(Deserialize)]
struct LogParams {
    offset: Option<u64>,
    limit_bytes: Option<usize>,
}

/// The log as plain text. `X-Next-Offset` tells where to continue for a
/// `tail -f` style follow; `X-Task-Status` whether more can come.
async fn task_logs(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<LogParams>,
) -> Result<Response, ApiError> {
    let id = parse_task_id(&id)?;
    let task = state.engine.task(id).await?;
    let limit = params
        .limit_bytes
        .unwrap_or(DEFAULT_LOG_BYTES)
        .min(16 * DEFAULT_LOG_BYTES);
    let chunk = state
        .engine
        .store()
        .read_log(id, params.offset.unwrap_or(0), limit)
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

async fn cancel_task(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Task>, ApiError> {
    Ok(Json(state.engine.cancel_task(parse_task_id(&id)?).await?))
}

#[derive(Deserialize)]
struct WorkflowListParams {
    limit: Option<usize>,
    offset: Option<usize>,
}

#[derive(Serialize)]
struct WorkflowSummary {
    id: WorkflowId,
    kind: String,
    name: String,
    status: WorkflowStatus,
    created_at: chrono::DateTime<chrono::Utc>,
    task_ids: Vec<TaskId>,
}

async fn list_workflows(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<WorkflowListParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (limit, offset) = page_bounds(params.limit, params.offset)?;
    let page = state
        .engine
        .store()
        .list_workflows(&orchestrator_storage::WorkflowQuery {
            limit,
            offset,
            ..Default::default()
        })
        .await
        .map_err(orchestrator_engine::Error::from)?;
    let mut workflows = Vec::with_capacity(page.items.len());
    for workflow in page.items {
        workflows.push(WorkflowSummary {
            id: workflow.id,
            kind: workflow.kind,
            name: workflow.name,
            status: workflow.status,
            created_at: workflow.created_at,
            task_ids: workflow.task_ids,
        });
    }
    Ok(Json(
        json!({"workflows": workflows, "total": page.total, "limit": limit, "offset": offset}),
    ))
}

async fn get_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(state.engine.workflow(parse_workflow_id(&id)?).await?))
}

/// The answer to a workflow submission.
#[derive(Serialize)]
struct Submitted {
    workflow_id: WorkflowId,
    task_ids: Vec<TaskId>,
    status: WorkflowStatus,
    /// False when `wait` was asked for but the cap passed first.
    finished: bool,
    tasks: Vec<Task>,
}

async fn create_servers(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<ServersCreate>,
) -> Result<Response, ApiError> {
    submit(&state.engine, request.plan()?).await
}

async fn create_taskservs(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<TaskservCreate>,
) -> Result<Response, ApiError> {
    submit(&state.engine, request.plan()?).await
}

async fn create_cluster(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<ClusterCreate>,
) -> Result<Response, ApiError> {
    submit(&state.engine, request.plan()?).await
}

/// Submits a plan; with `wait`, blocks (up to the cap) for the outcome.
async fn submit(engine: &Engine, plan: WorkflowPlan) -> Result<Response, ApiError> {
    let wait = plan.options.wait;
    let wait_limit = plan
        .options
        .wait_timeout_secs
        .map_or(DEFAULT_WAIT, Duration::from_secs)
        .min(MAX_WAIT);
    let submission = engine.submit(plan).await?;
    let workflow_id = submission.workflow.id;
    let task_ids = submission.workflow.task_ids.clone();
    if !wait {
        let body = Submitted {
            workflow_id,
            task_ids,
            status: WorkflowStatus::of(&submission.tasks),
            finished: false,
            tasks: submission.tasks,
        };
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    let finished = engine.wait_for_workflow(workflow_id, wait_limit).await?;
    let view = engine.workflow(workflow_id).await?;
    let status = if finished {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let body = Submitted {
        workflow_id,
        task_ids,
        status: view.status,
        finished,
        tasks: view.tasks,
    };
    Ok((status, Json(body)).into_response())
}
