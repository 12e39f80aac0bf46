//! Route table and handlers of tasks, workflows, templates and nodes,
//! each with its OpenAPI declaration (`#[utoipa::path]`) naming the types
//! it really reads and answers with.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use orchestrator_core::{Node, Priority, Task, TaskId, TaskStatus, WorkflowId, WorkflowStatus};
use orchestrator_engine::builtin::{Builtin, BuiltinRequest};
use orchestrator_engine::{Engine, Meta, SubmitRequest, TemplateSource, WorkflowView};
use orchestrator_storage::{TaskQuery, WorkflowQuery};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::error::ErrorBody;
use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState, DEFAULT_WAIT, MAX_WAIT};

pub(crate) const DEFAULT_PAGE: u32 = 50;
/// The largest `limit` of a listing; the document's `maximum` (a test
/// compares them).
pub(crate) const MAX_PAGE: u32 = 1000;
const DEFAULT_LOG_BYTES: u32 = 1024 * 1024;
/// The most a log read returns, whatever `limit_bytes` asks.
const MAX_LOG_BYTES: u32 = 16 * DEFAULT_LOG_BYTES;

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/events", get(crate::live::events))
        .route("/tasks", get(list_tasks))
        .route("/tasks/{id}", get(get_task))
        .route("/tasks/{id}/logs", get(task_logs))
        .route("/tasks/{id}/cancel", post(cancel_task))
        .route(
            "/tasks/{id}/checkpoint",
            get(get_checkpoint).put(save_checkpoint),
        )
        .route("/workflows", get(list_workflows).post(submit_workflow))
        .route("/workflows/validate", post(validate_workflow))
        .route("/workflows/counts", get(count_workflows))
        .route("/workflows/{id}", get(get_workflow))
        .route("/workflows/{id}/cancel", post(cancel_workflow))
        .route("/workflows/{id}/retry", post(retry_workflow))
        .route("/workflows/{id}/rerun", post(rerun_workflow))
        .route("/cluster/nodes", get(list_nodes))
        .route("/templates", get(list_templates))
        .route("/templates/{ref_name}", get(get_template))
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

/// Liveness and load.
#[derive(Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok`, or `unhealthy` with a 503.
    #[schema(example = "ok")]
    status: &'static str,
    /// Why storage is unhealthy; only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    version: &'static str,
    /// The storage backend.
    storage: &'static str,
    workers: usize,
    /// Tasks waiting for a worker.
    queued: usize,
    running: usize,
}

/// Liveness and load. Needs no token.
///
/// 200 while storage answers; 503 with the reason while it does not (a
/// SurrealDB server that went away, a poisoned journal), so a load balancer
/// or orchestrator of orchestrators stops sending work here.
#[utoipa::path(get, path = "/health", tag = "operations", responses(
    (status = 200, description = "Storage can be read and written", body = Health),
    (status = 503, description = "Storage is unhealthy; `reason` says why", body = Health),
))]
pub(crate) async fn health(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let (queued, running) = state.engine.load();
    let mut body = Health {
        status: "ok",
        reason: None,
        version: env!("CARGO_PKG_VERSION"),
        storage: state.engine.store().name(),
        workers: state.engine.config().workers,
        queued,
        running,
    };
    match state.engine.store().health().await {
        Ok(()) => (StatusCode::OK, Json(body)),
        Err(e) => {
            tracing::warn!(error = %e, "health check: storage is unhealthy");
            body.status = "unhealthy";
            body.reason = Some(e.to_string());
            (StatusCode::SERVICE_UNAVAILABLE, Json(body))
        }
    }
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
}

/// A page of tasks, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct TaskList {
    tasks: Vec<Task>,
    /// How many tasks match, in all pages.
    total: usize,
    limit: usize,
    offset: usize,
}

/// The page a listing asks for, within [`MAX_PAGE`]. (An `offset` beyond
/// `u32` is refused by the parameters' parser, as the document's
/// `maximum` says.)
pub(crate) fn page_bounds(
    limit: Option<u32>,
    offset: Option<u32>,
) -> Result<(usize, usize), ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if limit > MAX_PAGE {
        return Err(ApiError::bad_request(format!(
            "limit: {limit} is more than the maximum of {MAX_PAGE}"
        )));
    }
    Ok((limit as usize, offset.unwrap_or(0) as usize))
}

/// Tasks, newest first.
#[utoipa::path(get, path = "/tasks", tag = "tasks",
    params(ListParams),
    responses(
        (status = 200, description = "A page of tasks", body = TaskList),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
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

/// One task.
#[utoipa::path(get, path = "/tasks/{id}", tag = "tasks",
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task", body = Task),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
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
    params(("id" = uuid::Uuid, Path, description = "Task id"), LogParams),
    responses(
        (status = 200, description = "The log from `offset`", content_type = "text/plain; charset=utf-8", body = String,
            headers(
                ("x-next-offset" = u64, description = "Where to continue reading"),
                ("x-task-status" = TaskStatus, description = "The task's status when read"),
            )),
        (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
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
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task after the request", body = Task),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task already finished", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
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
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The checkpoint", body = BTreeMap<String, Value>),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
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
    params(("id" = uuid::Uuid, Path, description = "Task id")),
    request_body(content = BTreeMap<String, Value>, description = "Keys to set"),
    responses(
        (status = 200, description = "The whole checkpoint", body = BTreeMap<String, Value>),
        (status = 400, description = "The id is not a UUID, an empty body or malformed JSON", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is not running", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The body is not a JSON object", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
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

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WorkflowListParams {
    /// Only workflows in this status.
    #[param(value_type = Option<WorkflowStatus>)]
    status: Option<String>,
    /// Only workflows of this template ref_name.
    template: Option<String>,
    /// Only revisions of this meta.ref.
    #[serde(rename = "ref")]
    reference: Option<String>,
    /// Only workflows with this meta.trace_id.
    trace_id: Option<String>,
    /// Page size, default 50.
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
    /// Records to skip.
    #[param(minimum = 0, maximum = 4294967295u32)]
    offset: Option<u32>,
}

/// A workflow without its tasks, for listings.
#[derive(Serialize, ToSchema)]
pub(crate) struct WorkflowSummary {
    id: WorkflowId,
    /// The template's `ref_name`.
    template: String,
    name: String,
    status: WorkflowStatus,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
    revision: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<DateTime<Utc>>,
    task_count: usize,
}

/// A page of workflows, newest first.
#[derive(Serialize, ToSchema)]
pub(crate) struct WorkflowList {
    workflows: Vec<WorkflowSummary>,
    /// How many workflows match, in all pages.
    total: usize,
    limit: usize,
    offset: usize,
}

/// Workflows, newest first.
#[utoipa::path(get, path = "/workflows", tag = "workflows",
    params(WorkflowListParams),
    responses(
        (status = 200, description = "A page of workflows", body = WorkflowList),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn list_workflows(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<WorkflowListParams>,
) -> Result<Json<WorkflowList>, ApiError> {
    let (limit, offset) = page_bounds(params.limit, params.offset)?;
    let status = params
        .status
        .as_deref()
        .map(|s| {
            s.parse::<WorkflowStatus>()
                .map_err(|e| ApiError::bad_request(format!("status: {e}")))
        })
        .transpose()?;
    let query = WorkflowQuery {
        status,
        kind: params.template,
        reference: params.reference,
        trace_id: params.trace_id,
        idempotency_key: None,
        limit,
        offset,
    };
    let page = state.engine.list_workflows(&query).await?;
    let workflows: Vec<WorkflowSummary> = page
        .items
        .into_iter()
        .map(|w| WorkflowSummary {
            id: w.id,
            template: w.kind,
            name: w.name,
            status: w.status,
            reference: w.reference,
            revision: w.revision,
            trace_id: w.trace_id,
            created_at: w.created_at,
            finished_at: w.finished_at,
            task_count: w.task_ids.len(),
        })
        .collect();
    Ok(Json(WorkflowList {
        workflows,
        total: page.total,
        limit,
        offset,
    }))
}

/// How many workflows match `base` (its status, limit and offset
/// ignored), by status: one count per status, each answered by storage
/// as the total of an empty page, so nothing is loaded.
pub(crate) async fn count_by_status(
    engine: &Engine,
    base: &WorkflowQuery,
) -> orchestrator_engine::Result<Vec<(WorkflowStatus, usize)>> {
    let mut counts = Vec::with_capacity(WorkflowStatus::ALL.len());
    for &status in WorkflowStatus::ALL {
        let query = WorkflowQuery {
            status: Some(status),
            limit: 0,
            offset: 0,
            ..base.clone()
        };
        counts.push((status, engine.list_workflows(&query).await?.total));
    }
    Ok(counts)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct CountParams {
    /// Only workflows of this template ref_name.
    template: Option<String>,
    /// Only revisions of this meta.ref.
    #[serde(rename = "ref")]
    reference: Option<String>,
    /// Only workflows with this meta.trace_id.
    trace_id: Option<String>,
}

/// Workflows by status.
#[derive(Serialize, ToSchema)]
pub(crate) struct WorkflowCounts {
    /// Every status, with how many workflows are in it.
    counts: BTreeMap<&'static str, usize>,
    /// The sum of `counts`.
    total: usize,
}

/// How many workflows are in each status, with the listing's other
/// filters, for the dashboard's counters.
#[utoipa::path(get, path = "/workflows/counts", tag = "workflows",
    params(CountParams),
    responses(
        (status = 200, description = "The counts", body = WorkflowCounts),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn count_workflows(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<CountParams>,
) -> Result<Json<WorkflowCounts>, ApiError> {
    let base = WorkflowQuery {
        kind: params.template,
        reference: params.reference,
        trace_id: params.trace_id,
        ..WorkflowQuery::default()
    };
    let counts = count_by_status(&state.engine, &base).await?;
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    let counts = counts
        .into_iter()
        .map(|(status, n)| (status.as_str(), n))
        .collect();
    Ok(Json(WorkflowCounts { counts, total }))
}

/// One workflow with its steps, edges and tasks.
#[utoipa::path(get, path = "/workflows/{id}", tag = "workflows",
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn get_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(state.engine.workflow(parse_workflow_id(&id)?).await?))
}

/// Cancels a workflow.
#[utoipa::path(post, path = "/workflows/{id}/cancel", tag = "workflows",
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow after the request", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow already finished", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn cancel_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(
        state
            .engine
            .cancel_workflow(parse_workflow_id(&id)?)
            .await?,
    ))
}

/// Re-runs what did not complete in a finished workflow.
#[utoipa::path(post, path = "/workflows/{id}/retry", tag = "workflows",
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow, running again", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "Not finished, or nothing to retry", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn retry_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(
        state.engine.retry_workflow(parse_workflow_id(&id)?).await?,
    ))
}

/// `POST /workflows/{id}/rerun`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rerun {
    /// The `ref_name` of the first step to run again.
    from: String,
    /// Whether the steps after `from` run again too; default true.
    #[serde(default = "yes")]
    #[schema(default = true)]
    include_downstream: bool,
    /// New inputs for the steps that run again, checked like a submission's.
    #[serde(default)]
    vars: Map<String, Value>,
}

fn yes() -> bool {
    true
}

/// Re-runs a finished workflow from a step, as a new revision.
#[utoipa::path(post, path = "/workflows/{id}/rerun", tag = "workflows",
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    request_body = Rerun,
    responses(
        (status = 202, description = "The new revision, running; steps before `from` keep their outputs", body = WorkflowView),
        (status = 400, description = "The id is not a UUID, or the body is empty or malformed", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow has not finished", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "An unknown step, or bad `vars`; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn rerun_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(rerun): JsonBody<Rerun>,
) -> Result<Response, ApiError> {
    let request = orchestrator_engine::RerunRequest {
        from: rerun.from,
        include_downstream: rerun.include_downstream,
        vars: rerun.vars,
    };
    let view = state
        .engine
        .rerun_workflow(parse_workflow_id(&id)?, request)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

/// `POST /workflows`: a template by name or inline, with inputs.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "template": "servers-create",
    "vars": {"infra": "demo", "servers": ["web-01"]},
    "meta": {"ref": "demo-web"},
    "check_mode": true
}))]
pub(crate) struct WorkflowSubmission {
    template: TemplateField,
    /// Pick a `schema_version` of a named template (newest by default).
    #[schema(minimum = 0, maximum = 4294967295u32)]
    version: Option<u32>,
    /// The template's inputs.
    #[serde(default)]
    vars: Map<String, Value>,
    #[serde(default)]
    meta: MetaField,
    schedule: Option<Schedule>,
    /// Dry run: scripts are told to change nothing.
    #[serde(default)]
    check_mode: bool,
    #[serde(default)]
    priority: Priority,
    /// Attempts per task; the service default when absent (the engine's
    /// limits, which a test compares with these).
    #[schema(minimum = 1, maximum = 100)]
    max_attempts: Option<u32>,
    /// Per-attempt timeout in seconds (at most 30 days); the service
    /// default when absent.
    #[schema(minimum = 1, maximum = 2592000)]
    timeout_secs: Option<u32>,
    /// Most tasks of the workflow running at once; the template's when absent.
    #[schema(minimum = 1, maximum = 100000)]
    parallel_limit: Option<u32>,
    /// Answer only when the workflow has finished (or `wait_timeout_secs`
    /// passed, then with 202).
    #[serde(default)]
    wait: bool,
    /// The most seconds `wait` may block (default 120; more than 600
    /// waits 600).
    #[schema(minimum = 0, maximum = 4294967295u32)]
    wait_timeout_secs: Option<u32>,
}

/// A template's `ref_name`, or a whole template object. Kept as JSON until
/// it is read, so that a bad inline template gets a message with its path.
#[derive(Deserialize)]
#[serde(transparent)]
pub(crate) struct TemplateField(Value);

/// What [`TemplateField`] accepts: a string or an object (the template
/// model of docs/templates.md, checked by the core with path-named errors).
impl utoipa::PartialSchema for TemplateField {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .description(Some("A registered template's `ref_name`")),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .description(Some("A whole template (see docs/templates.md)")),
            )
            .into()
    }
}

impl ToSchema for TemplateField {}

impl TemplateField {
    fn source(self, version: Option<u32>) -> Result<TemplateSource, ApiError> {
        match self.0 {
            serde_json::Value::String(ref_name) => Ok(TemplateSource::Named { ref_name, version }),
            inline @ serde_json::Value::Object(_) => {
                let template: orchestrator_core::template::Template =
                    crate::extract::from_value(inline).map_err(|mut e| {
                        e.message = format!("template.{}", e.message);
                        e
                    })?;
                Ok(TemplateSource::Inline(Box::new(template)))
            }
            _ => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "template: expected a template ref_name or a template object",
            )),
        }
    }
}

/// The caller's names for a submission.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetaField {
    /// The caller's own name for what this workflow does: a later
    /// submission with the same `ref` and another body is its next revision.
    #[serde(rename = "ref")]
    reference: Option<String>,
    trace_id: Option<String>,
    /// The workflow's name; the template's by default.
    name: Option<String>,
    description: Option<String>,
    /// How long to keep the workflow once finished, instead of the
    /// service's `--retain-finished`: `30d`, `12h`, or `forever`.
    retain: Option<orchestrator_core::retention::Keep>,
}

/// When a submission starts: `{"when": "now"}` or `{"when": "at",
/// "start": "<RFC 3339>"}`.
#[derive(Deserialize, ToSchema)]
#[serde(tag = "when", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Schedule {
    Now,
    At { start: DateTime<Utc> },
}

impl WorkflowSubmission {
    fn into_request(
        self,
        body: serde_json::Value,
        idempotency_key: Option<String>,
    ) -> Result<SubmitRequest, ApiError> {
        let template = self.template.source(self.version)?;
        Ok(SubmitRequest {
            template,
            vars: self.vars,
            meta: Meta {
                reference: self.meta.reference,
                trace_id: self.meta.trace_id,
                name: self.meta.name,
                description: self.meta.description,
                retain: self.meta.retain,
            },
            start_at: match self.schedule {
                Some(Schedule::At { start }) => Some(start),
                Some(Schedule::Now) | None => None,
            },
            check_mode: self.check_mode,
            priority: self.priority,
            max_attempts: self.max_attempts,
            timeout: self.timeout_secs.map(|s| Duration::from_secs(s.into())),
            parallel_limit: self.parallel_limit.map(|n| n as usize),
            idempotency_key,
            body,
        })
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            ApiError::bad_request("Idempotency-Key: must be 1-255 visible ASCII characters")
        })?;
    Ok(Some(key.to_owned()))
}

/// Submits a workflow from a template.
#[utoipa::path(post, path = "/workflows", tag = "workflows",
    params(("Idempotency-Key" = Option<String>, Header,
        description = "1-255 visible ASCII characters (spaces inside; around them, ignored); a repeat returns the first workflow",
        pattern = "^[\t ]*[!-~]([\t -~]{0,253}[!-~])?[\t ]*$")),
    request_body = WorkflowSubmission,
    responses(
        (status = 200, description = "With `wait`, the workflow finished; or a repeat (`idempotent-replayed: true`)", body = WorkflowView),
        (status = 202, description = "Stored and running", body = WorkflowView, links(
            ("get" = (operation_id = "get_workflow", parameters(("id" = "$response.body#/id")))),
            ("cancel" = (operation_id = "cancel_workflow", parameters(("id" = "$response.body#/id")))),
            ("retry" = (operation_id = "retry_workflow", parameters(("id" = "$response.body#/id")))),
            ("rerun" = (operation_id = "rerun_workflow", parameters(("id" = "$response.body#/id")))),
            ("task" = (operation_id = "get_task", parameters(("id" = "$response.body#/task_ids/0")))),
            ("task_logs" = (operation_id = "task_logs", parameters(("id" = "$response.body#/task_ids/0")))),
        )),
        (status = 400, description = "Empty body, malformed JSON, or a bad Idempotency-Key", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key was used for a different body", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The submission is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn submit_workflow(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let submission: WorkflowSubmission = parse_body(&body)?;
    let wait = wait_limit(submission.wait, submission.wait_timeout_secs.map(u64::from));
    let request = submission.into_request(body, idempotency_key(&headers)?)?;
    submit(&state.engine, request, wait).await
}

/// A valid submission, and the workflow it would create.
#[derive(Serialize, ToSchema)]
pub(crate) struct Validated {
    /// Always `true`: an invalid one gets 422.
    valid: bool,
    workflow: WorkflowView,
}

/// Validates a submission and shows its DAG, storing nothing.
#[utoipa::path(post, path = "/workflows/validate", tag = "workflows",
    request_body = WorkflowSubmission,
    responses(
        (status = 200, description = "Valid; the workflow it would create", body = Validated),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The submission is invalid", body = ErrorBody),
    ))]
pub(crate) async fn validate_workflow(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Validated>, ApiError> {
    let submission: WorkflowSubmission = parse_body(&body)?;
    let workflow = state
        .engine
        .validate(&submission.into_request(body, None)?)
        .await?;
    Ok(Json(Validated {
        valid: true,
        workflow,
    }))
}

/// Typed view of a body already parsed as JSON, with the same 422 errors.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    crate::extract::from_value(body.clone())
}

/// A node sharing the store, and whether it is alive.
#[derive(Serialize, ToSchema)]
pub(crate) struct NodeView {
    #[serde(flatten)]
    node: Node,
    /// Its last heartbeat is within one lease.
    alive: bool,
    /// It is the node that answered.
    this_node: bool,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct NodeList {
    nodes: Vec<NodeView>,
}

/// The nodes sharing this store: their last heartbeat and whether it is
/// recent enough (within one lease) to count them alive.
#[utoipa::path(get, path = "/cluster/nodes", tag = "operations", responses(
    (status = 200, description = "The nodes", body = NodeList),
    (status = 503, description = "Storage unavailable", body = ErrorBody),
))]
pub(crate) async fn list_nodes(State(state): State<AppState>) -> Result<Json<NodeList>, ApiError> {
    let this_node = &state.engine.config().node_id;
    let nodes = state
        .engine
        .nodes()
        .await?
        .into_iter()
        .map(|(node, alive)| NodeView {
            this_node: node.id == *this_node,
            node,
            alive,
        })
        .collect();
    Ok(Json(NodeList { nodes }))
}

/// A registered template, as listed.
#[derive(Serialize, ToSchema)]
pub(crate) struct TemplateSummary {
    ref_name: String,
    schema_version: u32,
    name: String,
    description: Option<String>,
    /// Input name to its declaration (`type`, `default`, `description`,
    /// ...; see docs/templates.md).
    inputs: BTreeMap<String, Value>,
    /// The steps' `ref_name`s.
    steps: Vec<String>,
}

#[derive(Serialize, ToSchema)]
pub(crate) struct TemplateList {
    templates: Vec<TemplateSummary>,
}

/// Every registered template, every version.
#[utoipa::path(get, path = "/templates", tag = "templates", responses(
    (status = 200, description = "The templates", body = TemplateList),
))]
pub(crate) async fn list_templates(State(state): State<AppState>) -> Json<TemplateList> {
    let templates = state
        .engine
        .templates()
        .all()
        .map(|t| TemplateSummary {
            ref_name: t.ref_name.clone(),
            schema_version: t.schema_version,
            name: t.name.clone(),
            description: t.description.clone(),
            inputs: t
                .inputs
                .iter()
                .map(|(name, spec)| (name.clone(), serde_json::to_value(spec).unwrap_or_default()))
                .collect(),
            steps: t.steps.iter().map(|s| s.ref_name.clone()).collect(),
        })
        .collect();
    Json(TemplateList { templates })
}

/// One template: the whole model as parsed, defaults filled in. Its
/// schema is a free-form object: the template model (steps, inputs, http
/// blocks) is documented in docs/templates.md and checked by the core.
#[utoipa::path(get, path = "/templates/{ref_name}", tag = "templates",
    params(("ref_name" = String, Path, description = "The template's ref_name"), TemplateParams),
    responses(
        (status = 200, description = "The template", body = Object),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 404, description = "No such template or version", body = ErrorBody),
    ))]
pub(crate) async fn get_template(
    State(state): State<AppState>,
    Path(ref_name): Path<String>,
    QueryParams(params): QueryParams<TemplateParams>,
) -> Result<Json<orchestrator_core::template::Template>, ApiError> {
    state
        .engine
        .templates()
        .get(&ref_name, params.version)
        .map(|t| Json((*t).clone()))
        .ok_or_else(|| ApiError::not_found(format!("template `{ref_name}` not found")))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TemplateParams {
    /// A schema_version; the newest by default.
    #[param(minimum = 0, maximum = 4294967295u32)]
    version: Option<u32>,
}

/// The answer to a built-in submission.
#[derive(Serialize, ToSchema)]
pub(crate) struct Submitted {
    workflow_id: WorkflowId,
    task_ids: Vec<TaskId>,
    status: WorkflowStatus,
    /// False when `wait` was asked for but the cap passed first.
    finished: bool,
    tasks: Vec<Task>,
}

/// Creates servers (template `servers-create`).
#[utoipa::path(post, path = "/workflows/servers/create", tag = "workflows",
    request_body = BuiltinRequest,
    responses(
        (status = 200, description = "With `wait`, the workflow finished", body = Submitted),
        (status = 202, description = "Stored and running", body = Submitted, links(
            ("workflow" = (operation_id = "get_workflow", parameters(("id" = "$response.body#/workflow_id")))),
            ("task" = (operation_id = "get_task", parameters(("id" = "$response.body#/task_ids/0")))),
        )),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The request is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn create_servers(
    State(state): State<AppState>,
    body: JsonBody<BuiltinRequest>,
) -> Result<Response, ApiError> {
    builtin(&state.engine, Builtin::ServersCreate, body.0).await
}

/// Installs task services on servers, in order (template `taskserv-create`).
#[utoipa::path(post, path = "/workflows/taskserv/create", tag = "workflows",
    request_body = BuiltinRequest,
    responses(
        (status = 200, description = "With `wait`, the workflow finished", body = Submitted),
        (status = 202, description = "Stored and running", body = Submitted, links(
            ("workflow" = (operation_id = "get_workflow", parameters(("id" = "$response.body#/workflow_id")))),
            ("task" = (operation_id = "get_task", parameters(("id" = "$response.body#/task_ids/0")))),
        )),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The request is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn create_taskservs(
    State(state): State<AppState>,
    body: JsonBody<BuiltinRequest>,
) -> Result<Response, ApiError> {
    builtin(&state.engine, Builtin::TaskservCreate, body.0).await
}

/// Servers, then task services, then the cluster join (template `cluster-create`).
#[utoipa::path(post, path = "/workflows/cluster/create", tag = "workflows",
    request_body = BuiltinRequest,
    responses(
        (status = 200, description = "With `wait`, the workflow finished", body = Submitted),
        (status = 202, description = "Stored and running", body = Submitted, links(
            ("workflow" = (operation_id = "get_workflow", parameters(("id" = "$response.body#/workflow_id")))),
            ("task" = (operation_id = "get_task", parameters(("id" = "$response.body#/task_ids/0")))),
        )),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The request is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
pub(crate) async fn create_cluster(
    State(state): State<AppState>,
    body: JsonBody<BuiltinRequest>,
) -> Result<Response, ApiError> {
    builtin(&state.engine, Builtin::ClusterCreate, body.0).await
}

/// How long to block for the outcome, if at all.
fn wait_limit(wait: bool, secs: Option<u64>) -> Option<Duration> {
    wait.then(|| secs.map_or(DEFAULT_WAIT, Duration::from_secs).min(MAX_WAIT))
}

/// Submits and, with `wait`, blocks (up to the cap) for the outcome.
/// 201 for a new workflow, 200 for an idempotent repeat or a finished wait,
/// 202 while it still runs.
async fn submit_and_wait(
    engine: &Engine,
    request: SubmitRequest,
    wait: Option<Duration>,
) -> Result<(StatusCode, bool, WorkflowView), ApiError> {
    let (view, replayed) = engine.submit(request).await?;
    let id = view.workflow.id;
    match wait {
        Some(limit) => {
            let finished = engine.wait_for_workflow(id, limit).await?;
            let view = engine.workflow(id).await?;
            Ok((
                if finished {
                    StatusCode::OK
                } else {
                    StatusCode::ACCEPTED
                },
                replayed,
                view,
            ))
        }
        None if replayed => Ok((StatusCode::OK, true, view)),
        None => Ok((StatusCode::ACCEPTED, false, view)),
    }
}

async fn submit(
    engine: &Engine,
    request: SubmitRequest,
    wait: Option<Duration>,
) -> Result<Response, ApiError> {
    let (status, replayed, view) = submit_and_wait(engine, request, wait).await?;
    let mut response = (status, Json(view)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// The built-in endpoints answer in their own shape: ids first, then tasks.
async fn builtin(
    engine: &Engine,
    endpoint: Builtin,
    request: BuiltinRequest,
) -> Result<Response, ApiError> {
    let wait = wait_limit(request.wait, request.wait_timeout_secs.map(u64::from));
    let submission = request.into_request(endpoint, &engine.config().limits)?;
    let (status, _, view) = submit_and_wait(engine, submission, wait).await?;
    let finished = view.workflow.status.is_terminal();
    let body = Submitted {
        workflow_id: view.workflow.id,
        task_ids: view.workflow.task_ids.clone(),
        status: view.workflow.status,
        finished,
        tasks: view.tasks,
    };
    Ok((status, Json(body)).into_response())
}
