//! `/test/environments` and `/test/topologies`: test environments (create,
//! list, show, run, logs, delete) and the topology templates, and their
//! OpenAPI declarations. The environments themselves are the
//! `orchestrator-testenv` crate's; this module maps HTTP onto it.

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orchestrator_testenv::model::CreateRequest;
use orchestrator_testenv::{Error as EnvError, TestEnvs};
use serde::Deserialize;
use serde_json::json;

use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState, MAX_WAIT};

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/test/environments", get(list_environments))
        .route("/test/environments/create", post(create_environment))
        .route(
            "/test/environments/{id}",
            get(get_environment).delete(delete_environment),
        )
        .route("/test/environments/{id}/run", post(run_environment))
        .route("/test/environments/{id}/logs", get(environment_logs))
        .route("/test/topologies", get(list_topologies))
        .route("/test/topologies/{name}", get(get_topology))
}

impl From<EnvError> for ApiError {
    fn from(error: EnvError) -> ApiError {
        match error {
            EnvError::Invalid { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                error.to_string(),
            ),
            EnvError::NotFound(_) => ApiError::not_found(error.to_string()),
            EnvError::Conflict(message) => ApiError::new(StatusCode::CONFLICT, "conflict", message),
            EnvError::Limit(message) => {
                ApiError::new(StatusCode::CONFLICT, "limit_exceeded", message)
            }
            EnvError::Privileges(message) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "missing_capability",
                message,
            ),
            EnvError::Engine(e) => e.into(),
            error => {
                tracing::error!(error = %error, "test environment request failed");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "provider_failed",
                    "the test environment provider failed; see the service log",
                )
            }
        }
    }
}

fn envs(state: &AppState) -> Result<&TestEnvs, ApiError> {
    state.testenvs.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_enabled",
            "test environments are not enabled on this service",
        )
    })
}

fn parse_env_id(raw: &str) -> Result<&str, ApiError> {
    uuid::Uuid::parse_str(raw).map(|_| raw).map_err(|_| {
        ApiError::bad_request(format!(
            "`{raw}` is not a valid environment id (expected a UUID)"
        ))
    })
}

/// `?wait=true`: answer once the workflow has finished (up to `MAX_WAIT`).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    #[serde(default)]
    wait: bool,
}

fn wait_for(wait: bool) -> Option<Duration> {
    wait.then_some(MAX_WAIT)
}

async fn create_environment(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateRequest>,
) -> Result<Response, ApiError> {
    let wait = wait_for(body.wait);
    let view = envs(&state)?.create(body, wait).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn list_environments(State(state): State<AppState>) -> Result<Response, ApiError> {
    let environments = envs(&state)?.list().await?;
    Ok(Json(json!({"environments": environments})).into_response())
}

async fn get_environment(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_env_id(&id)?;
    Ok(Json(envs(&state)?.show(id).await?).into_response())
}

async fn run_environment(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Response, ApiError> {
    let id = parse_env_id(&id)?;
    let view = envs(&state)?.run(id, wait_for(query.wait)).await?;
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

async fn delete_environment(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<Response, ApiError> {
    let id = parse_env_id(&id)?;
    let view = envs(&state)?.delete(id, wait_for(query.wait)).await?;
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

async fn environment_logs(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_env_id(&id)?;
    let entries = envs(&state)?.logs(id).await?;
    Ok(Json(json!({"id": id, "entries": entries})).into_response())
}

async fn list_topologies(State(state): State<AppState>) -> Result<Response, ApiError> {
    let envs = envs(&state)?;
    let topologies: Vec<_> = envs.catalog().topologies().cloned().collect();
    let taskservs: Vec<_> = envs
        .catalog()
        .taskserv_names()
        .iter()
        .filter_map(|name| envs.catalog().taskserv(name).cloned())
        .collect();
    Ok(Json(json!({"topologies": topologies, "taskservs": taskservs})).into_response())
}

async fn get_topology(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let envs = envs(&state)?;
    match envs.catalog().topology(&name) {
        Some(topology) => Ok(Json(topology).into_response()),
        None => Err(ApiError::not_found(format!(
            "no topology `{name}` (known: {})",
            envs.catalog().topology_names().join(", ")
        ))),
    }
}

/// The OpenAPI declarations of these routes.
pub(crate) mod doc {
    #![allow(dead_code)]

    use orchestrator_testenv::catalog::TaskservInfo;
    use orchestrator_testenv::model::{CreateRequest, Topology};
    use orchestrator_testenv::service::{EnvView, LogEntry};
    use utoipa::ToSchema;

    use crate::error::ErrorBody;

    #[derive(ToSchema)]
    struct EnvironmentList {
        environments: Vec<EnvView>,
    }

    #[derive(ToSchema)]
    struct EnvironmentLogs {
        id: String,
        /// Every step's and check's output: create, runs, teardown.
        entries: Vec<LogEntry>,
    }

    #[derive(ToSchema)]
    struct TopologyList {
        topologies: Vec<Topology>,
        /// The taskservs a node can run.
        taskservs: Vec<TaskservInfo>,
    }

    /// Creates a test environment: its nodes, its taskservs installed by
    /// the provisioning scripts, started (with `auto_start`).
    #[utoipa::path(post, path = "/test/environments/create", tag = "test",
        request_body = CreateRequest,
        responses(
            (status = 201, description = "Accepted and recorded (with `wait`, made or failed)", body = EnvView),
            (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
            (status = 409, description = "Too many environments exist (`limit_exceeded`)", body = ErrorBody),
            (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
            (status = 422, description = "A bad type, name, topology, taskserv or ttl; the message names the field", body = ErrorBody),
            (status = 503, description = "The service lacks CAP_SYS_ADMIN or CAP_NET_ADMIN (`missing_capability`; nothing was made), or storage is unavailable", body = ErrorBody),
        ))]
    pub(crate) fn create_environment() {}

    /// Every environment, newest first (deleted ones too).
    #[utoipa::path(get, path = "/test/environments", tag = "test",
        responses(
            (status = 200, description = "The environments", body = EnvironmentList),
            (status = 503, description = "Storage unavailable", body = ErrorBody),
        ))]
    pub(crate) fn list_environments() {}

    /// One environment, with its newest run's checks.
    #[utoipa::path(get, path = "/test/environments/{id}", tag = "test",
        params(("id" = Uuid, Path, description = "Environment id")),
        responses(
            (status = 200, description = "The environment", body = EnvView),
            (status = 400, description = "The id is not a UUID", body = ErrorBody),
            (status = 404, description = "No such environment", body = ErrorBody),
            (status = 503, description = "Storage unavailable", body = ErrorBody),
        ))]
    pub(crate) fn get_environment() {}

    /// Runs the checks: each taskserv's on its node, then the topology's
    /// across nodes; `last_run` reports pass or fail per check.
    #[utoipa::path(post, path = "/test/environments/{id}/run", tag = "test",
        params(
            ("id" = Uuid, Path, description = "Environment id"),
            ("wait" = Option<bool>, Query, description = "Answer once the run has finished"),
        ),
        responses(
            (status = 202, description = "The run started (with `wait`, finished)", body = EnvView),
            (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
            (status = 404, description = "No such environment", body = ErrorBody),
            (status = 409, description = "The environment is not ready, or runs already", body = ErrorBody),
            (status = 503, description = "Storage unavailable", body = ErrorBody),
        ))]
    pub(crate) fn run_environment() {}

    /// Tears the environment down: processes, namespaces, links, directories.
    #[utoipa::path(delete, path = "/test/environments/{id}", tag = "test",
        params(
            ("id" = Uuid, Path, description = "Environment id"),
            ("wait" = Option<bool>, Query, description = "Answer once the teardown has finished"),
        ),
        responses(
            (status = 202, description = "The teardown started (with `wait`, finished)", body = EnvView),
            (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
            (status = 404, description = "No such environment", body = ErrorBody),
            (status = 503, description = "Storage unavailable", body = ErrorBody),
        ))]
    pub(crate) fn delete_environment() {}

    /// Every step's and check's output.
    #[utoipa::path(get, path = "/test/environments/{id}/logs", tag = "test",
        params(("id" = Uuid, Path, description = "Environment id")),
        responses(
            (status = 200, description = "The logs", body = EnvironmentLogs),
            (status = 400, description = "The id is not a UUID", body = ErrorBody),
            (status = 404, description = "No such environment", body = ErrorBody),
            (status = 503, description = "Storage unavailable", body = ErrorBody),
        ))]
    pub(crate) fn environment_logs() {}

    /// The topology templates and the taskservs nodes can run.
    #[utoipa::path(get, path = "/test/topologies", tag = "test",
        responses(
            (status = 200, description = "The topologies and taskservs", body = TopologyList),
            (status = 404, description = "Test environments are not enabled", body = ErrorBody),
        ))]
    pub(crate) fn list_topologies() {}

    /// One topology template.
    #[utoipa::path(get, path = "/test/topologies/{name}", tag = "test",
        params(("name" = String, Path, description = "Topology name")),
        responses(
            (status = 200, description = "The topology", body = Topology),
            (status = 404, description = "No such topology", body = ErrorBody),
        ))]
    pub(crate) fn get_topology() {}
}
