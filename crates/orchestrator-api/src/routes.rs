//! Route table and handlers.

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orchestrator_core::{Task, TaskId, TaskStatus, WorkflowId, WorkflowStatus};
use orchestrator_engine::builtin::{Builtin, BuiltinRequest};
use orchestrator_engine::{Engine, Meta, SubmitRequest, TemplateSource, WorkflowView};
use orchestrator_storage::{TaskQuery, WorkflowQuery};
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

/// 200 while storage answers; 503 with the reason while it does not (a
/// SurrealDB server that went away, a poisoned journal), so a load balancer
/// or orchestrator of orchestrators stops sending work here.
async fn health(State(state): State<AppState>) -> (StatusCode, Json<serde_json::Value>) {
    let (queued, running) = state.engine.load();
    let mut body = json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "storage": state.engine.store().name(),
        "workers": state.engine.config().workers,
        "queued": queued,
        "running": running,
    });
    match state.engine.store().health().await {
        Ok(()) => (StatusCode::OK, Json(body)),
        Err(e) => {
            tracing::warn!(error = %e, "health check: storage is unhealthy");
            body["status"] = "unhealthy".into();
            body["reason"] = e.to_string().into();
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

pub(crate) fn page_bounds(
    limit: Option<usize>,
    offset: Option<usize>,
) -> Result<(usize, usize), ApiError> {
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
    /// Stream the log as it is written, until the task ends.
    #[serde(default)]
    follow: bool,
}

/// The log as plain text. `X-Next-Offset` tells where to continue for a
/// `tail -f` style follow; `X-Task-Status` whether more can come.
async fn task_logs(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<LogParams>,
) -> Result<Response, ApiError> {
    let id = parse_task_id(&id)?;
    if params.follow {
        return crate::live::follow_log(state.engine.clone(), id, params.offset.unwrap_or(0)).await;
    }
    let task = state.engine.task(id).await?;
    let limit = params
        .limit_bytes
        .unwrap_or(DEFAULT_LOG_BYTES)
        .min(16 * DEFAULT_LOG_BYTES);
    let chunk = state
        .engine
        .store()
        .tasks()
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

async fn get_checkpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Map<String, serde_json::Value>>, ApiError> {
    Ok(Json(
        state.engine.task(parse_task_id(&id)?).await?.checkpoint,
    ))
}

/// Merges the body's keys into a running task's checkpoint. Answers once
/// the checkpoint is durable, so a script may act on it right away.
async fn save_checkpoint(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(entries): JsonBody<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<serde_json::Map<String, serde_json::Value>>, ApiError> {
    let task = state
        .engine
        .save_checkpoint(parse_task_id(&id)?, entries)
        .await?;
    Ok(Json(task.checkpoint))
}

#[derive(Deserialize)]
struct WorkflowListParams {
    status: Option<String>,
    template: Option<String>,
    #[serde(rename = "ref")]
    reference: Option<String>,
    trace_id: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

/// A workflow without its tasks, for listings.
#[derive(Serialize)]
struct WorkflowSummary {
    id: WorkflowId,
    template: String,
    name: String,
    status: WorkflowStatus,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    reference: Option<String>,
    revision: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<chrono::DateTime<chrono::Utc>>,
    task_count: usize,
}

async fn list_workflows(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<WorkflowListParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
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
    Ok(Json(
        json!({"workflows": workflows, "total": page.total, "limit": limit, "offset": offset}),
    ))
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

#[derive(Deserialize)]
struct CountParams {
    template: Option<String>,
    #[serde(rename = "ref")]
    reference: Option<String>,
    trace_id: Option<String>,
}

/// `GET /workflows/counts`: the number of workflows in each status, with
/// the listing's other filters, for the dashboard's counters.
async fn count_workflows(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<CountParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let base = WorkflowQuery {
        kind: params.template,
        reference: params.reference,
        trace_id: params.trace_id,
        ..WorkflowQuery::default()
    };
    let counts = count_by_status(&state.engine, &base).await?;
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    let counts: serde_json::Map<String, serde_json::Value> = counts
        .into_iter()
        .map(|(status, n)| (status.as_str().to_owned(), json!(n)))
        .collect();
    Ok(Json(json!({"counts": counts, "total": total})))
}

async fn get_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(state.engine.workflow(parse_workflow_id(&id)?).await?))
}

async fn cancel_workflow(
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

async fn retry_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(
        state.engine.retry_workflow(parse_workflow_id(&id)?).await?,
    ))
}

/// `POST /workflows/{id}/rerun`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Rerun {
    from: String,
    #[serde(default = "yes")]
    include_downstream: bool,
    #[serde(default)]
    vars: serde_json::Map<String, serde_json::Value>,
}

fn yes() -> bool {
    true
}

/// A new revision of a finished workflow, run again from a step.
async fn rerun_workflow(
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
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkflowSubmission {
    template: TemplateField,
    /// Pick a `schema_version` of a named template (newest by default).
    version: Option<u32>,
    #[serde(default)]
    vars: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    meta: MetaField,
    schedule: Option<Schedule>,
    #[serde(default)]
    check_mode: bool,
    #[serde(default)]
    priority: orchestrator_core::Priority,
    max_attempts: Option<u32>,
    timeout_secs: Option<u64>,
    parallel_limit: Option<usize>,
    #[serde(default)]
    wait: bool,
    wait_timeout_secs: Option<u64>,
}

/// A template's `ref_name`, or a whole template object. Kept as JSON until
/// it is read, so that a bad inline template gets a message with its path.
#[derive(Deserialize)]
#[serde(transparent)]
struct TemplateField(serde_json::Value);

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

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MetaField {
    #[serde(rename = "ref")]
    reference: Option<String>,
    trace_id: Option<String>,
    name: Option<String>,
    description: Option<String>,
    /// How long to keep the workflow once finished: `30d`, `forever`.
    retain: Option<orchestrator_core::retention::Keep>,
}

#[derive(Deserialize)]
#[serde(tag = "when", rename_all = "snake_case", deny_unknown_fields)]
enum Schedule {
    Now,
    At {
        start: chrono::DateTime<chrono::Utc>,
    },
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
            timeout: self.timeout_secs.map(Duration::from_secs),
            parallel_limit: self.parallel_limit,
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

async fn submit_workflow(
    State(state): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    let submission: WorkflowSubmission = parse_body(&body)?;
    let wait = wait_limit(submission.wait, submission.wait_timeout_secs);
    let request = submission.into_request(body, idempotency_key(&headers)?)?;
    submit(&state.engine, request, wait).await
}

async fn validate_workflow(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<serde_json::Value>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let submission: WorkflowSubmission = parse_body(&body)?;
    let view = state
        .engine
        .validate(&submission.into_request(body, None)?)
        .await?;
    Ok(Json(json!({"valid": true, "workflow": view})))
}

/// Typed view of a body already parsed as JSON, with the same 422 errors.
fn parse_body<T: serde::de::DeserializeOwned>(body: &serde_json::Value) -> Result<T, ApiError> {
    crate::extract::from_value(body.clone())
}

/// The nodes sharing this store: their last heartbeat and whether it is
/// recent enough (within one lease) to count them alive.
async fn list_nodes(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let nodes: Vec<serde_json::Value> = state
        .engine
        .nodes()
        .await?
        .into_iter()
        .map(|(node, alive)| {
            let mut value = serde_json::to_value(&node).unwrap_or_default();
            value["alive"] = json!(alive);
            value["this_node"] = json!(node.id == state.engine.config().node_id);
            value
        })
        .collect();
    Ok(Json(json!({"nodes": nodes})))
}

async fn list_templates(State(state): State<AppState>) -> Json<serde_json::Value> {
    let templates: Vec<serde_json::Value> = state
        .engine
        .templates()
        .all()
        .map(|t| {
            json!({
                "ref_name": t.ref_name, "name": t.name, "description": t.description,
                "schema_version": t.schema_version, "inputs": t.inputs,
                "steps": t.steps.iter().map(|s| &s.ref_name).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(json!({"templates": templates}))
}

async fn get_template(
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

#[derive(Deserialize)]
struct TemplateParams {
    version: Option<u32>,
}

/// The answer to a built-in submission.
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
    body: JsonBody<BuiltinRequest>,
) -> Result<Response, ApiError> {
    builtin(&state.engine, Builtin::ServersCreate, body.0).await
}

async fn create_taskservs(
    State(state): State<AppState>,
    body: JsonBody<BuiltinRequest>,
) -> Result<Response, ApiError> {
    builtin(&state.engine, Builtin::TaskservCreate, body.0).await
}

async fn create_cluster(
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
    let wait = wait_limit(request.wait, request.wait_timeout_secs);
    let (status, _, view) = submit_and_wait(engine, request.into_request(endpoint)?, wait).await?;
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
