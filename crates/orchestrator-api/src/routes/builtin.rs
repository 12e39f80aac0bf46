//! The built-in workflows: servers, taskservs and a cluster, each from
//! its own request shape.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use orchestrator_core::{Task, TaskId, WorkflowId, WorkflowStatus};
use orchestrator_engine::Engine;
use orchestrator_engine::builtin::{Builtin, BuiltinRequest};
use serde::Serialize;
use utoipa::ToSchema;

use super::workflows::{submit_and_wait, wait_limit};
use crate::error::ErrorBody;
use crate::extract::JsonBody;
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_servers))
        .routes(routes!(create_taskservs))
        .routes(routes!(create_cluster))
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
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.submit_servers"))),
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
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.submit_taskservs"))),
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
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.submit_cluster"))),
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
