//! `/test/environments` and `/test/topologies`: test environments (create,
//! list, show, run, logs, delete) and the topology templates, and their
//! declarations. The environments themselves are the
//! `orchestrator-testenv` crate's; this module maps HTTP onto it.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use orchestrator_testenv::catalog::TaskservInfo;
use orchestrator_testenv::model::{CreateRequest, Topology};
use orchestrator_testenv::service::{EnvView, LimitsEnforcement, LogEntry};
use orchestrator_testenv::{Error as EnvError, TestEnvs};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ErrorBody, StorageUnavailable};
use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState, MAX_WAIT};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_environments))
        .routes(routes!(create_environment))
        .routes(routes!(get_environment, delete_environment))
        .routes(routes!(run_environment))
        .routes(routes!(environment_logs))
        .routes(routes!(list_topologies))
        .routes(routes!(get_topology))
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
            EnvError::Unsupported(message) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unsupported_host", message)
            }
            EnvError::Unavailable(message) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "provider_unavailable",
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
#[derive(Deserialize, Default, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitQuery {
    /// Answer once the workflow has finished.
    #[serde(default)]
    wait: bool,
}

fn wait_for(wait: bool) -> Option<Duration> {
    wait.then_some(MAX_WAIT)
}

/// `GET /test/environments`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EnvironmentList {
    pub environments: Vec<EnvView>,
    /// How this host enforces the nodes' limits, or why it cannot.
    pub limits: LimitsEnforcement,
}

/// `GET /test/environments/{id}/logs`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EnvironmentLogs {
    pub id: String,
    /// Every step's and check's output: create, runs, teardown.
    pub entries: Vec<LogEntry>,
}

/// `GET /test/topologies`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TopologyList {
    pub topologies: Vec<Topology>,
    /// The taskservs a node can run.
    pub taskservs: Vec<TaskservInfo>,
}

/// Creates a test environment: its nodes, its taskservs installed by
/// the provisioning scripts, started (with `auto_start`).
#[utoipa::path(post, path = "/test/environments/create", tag = "test",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("testenv.create"))),
    request_body = CreateRequest,
    responses(
        (status = 201, description = "Accepted and recorded (with `wait`, made or failed)", body = EnvView),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 409, description = "Too many environments exist (`limit_exceeded`)", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A bad type, name, topology, taskserv, ttl or limit; the message names the field and the bound", body = ErrorBody),
        (status = 503, description = "The service lacks CAP_SYS_ADMIN or CAP_NET_ADMIN (`missing_capability`), no cgroup hierarchy of the host can enforce the nodes' limits (`unsupported_host`), or the container engine does not answer (`provider_unavailable`, naming its socket): nothing was made; or storage is unavailable", body = ErrorBody),
    ))]
pub(crate) async fn create_environment(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateRequest>,
) -> Result<(StatusCode, Json<EnvView>), ApiError> {
    let wait = wait_for(body.wait);
    let view = envs(&state)?.create(body, wait).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// Every environment, newest first (deleted ones too).
#[utoipa::path(get, path = "/test/environments", tag = "test",
    extensions(("x-role" = json!("viewer"))),
    responses(
        (status = 200, description = "The environments", body = EnvironmentList),
        StorageUnavailable,
    ))]
pub(crate) async fn list_environments(
    State(state): State<AppState>,
) -> Result<Json<EnvironmentList>, ApiError> {
    let envs = envs(&state)?;
    let environments = envs.list().await?;
    Ok(Json(EnvironmentList {
        environments,
        limits: envs.limits_enforcement(),
    }))
}

/// One environment, with its newest run's checks.
#[utoipa::path(get, path = "/test/environments/{id}", tag = "test",
    extensions(("x-role" = json!("viewer"))),
    params(("id" = uuid::Uuid, Path, description = "Environment id")),
    responses(
        (status = 200, description = "The environment", body = EnvView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such environment", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn get_environment(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<EnvView>, ApiError> {
    let id = parse_env_id(&id)?;
    Ok(Json(envs(&state)?.show(id).await?))
}

/// Runs the checks: each taskserv's on its node, then the topology's
/// across nodes; `last_run` reports pass or fail per check.
#[utoipa::path(post, path = "/test/environments/{id}/run", tag = "test",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("testenv.run"))),
    params(("id" = uuid::Uuid, Path, description = "Environment id"), WaitQuery),
    responses(
        (status = 202, description = "The run started (with `wait`, finished)", body = EnvView),
        (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
        (status = 404, description = "No such environment", body = ErrorBody),
        (status = 409, description = "The environment is not ready, or runs already", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn run_environment(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<(StatusCode, Json<EnvView>), ApiError> {
    let id = parse_env_id(&id)?;
    let view = envs(&state)?.run(id, wait_for(query.wait)).await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

/// Tears the environment down: processes, namespaces, links, directories.
#[utoipa::path(delete, path = "/test/environments/{id}", tag = "test",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("testenv.delete"))),
    params(("id" = uuid::Uuid, Path, description = "Environment id"), WaitQuery),
    responses(
        (status = 202, description = "The teardown started (with `wait`, finished)", body = EnvView),
        (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
        (status = 404, description = "No such environment", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn delete_environment(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<WaitQuery>,
) -> Result<(StatusCode, Json<EnvView>), ApiError> {
    let id = parse_env_id(&id)?;
    let view = envs(&state)?.delete(id, wait_for(query.wait)).await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

/// Every step's and check's output.
#[utoipa::path(get, path = "/test/environments/{id}/logs", tag = "test",
    extensions(("x-role" = json!("viewer"))),
    params(("id" = uuid::Uuid, Path, description = "Environment id")),
    responses(
        (status = 200, description = "The logs", body = EnvironmentLogs),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such environment", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn environment_logs(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<EnvironmentLogs>, ApiError> {
    let id = parse_env_id(&id)?;
    let entries = envs(&state)?.logs(id).await?;
    Ok(Json(EnvironmentLogs {
        id: id.to_owned(),
        entries,
    }))
}

/// The topology templates and the taskservs nodes can run.
#[utoipa::path(get, path = "/test/topologies", tag = "test",
    extensions(("x-role" = json!("viewer"))),
    responses(
        (status = 200, description = "The topologies and taskservs", body = TopologyList),
        (status = 404, description = "Test environments are not enabled", body = ErrorBody),
    ))]
pub(crate) async fn list_topologies(
    State(state): State<AppState>,
) -> Result<Json<TopologyList>, ApiError> {
    let envs = envs(&state)?;
    let topologies = envs.catalog().topologies().cloned().collect();
    let taskservs = envs
        .catalog()
        .taskserv_names()
        .iter()
        .filter_map(|name| envs.catalog().taskserv(name).cloned())
        .collect();
    Ok(Json(TopologyList {
        topologies,
        taskservs,
    }))
}

/// One topology template.
#[utoipa::path(get, path = "/test/topologies/{name}", tag = "test",
    extensions(("x-role" = json!("viewer"))),
    params(("name" = String, Path, description = "Topology name")),
    responses(
        (status = 200, description = "The topology", body = Topology),
        (status = 404, description = "No such topology, or test environments are not enabled", body = ErrorBody),
    ))]
pub(crate) async fn get_topology(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Topology>, ApiError> {
    let envs = envs(&state)?;
    match envs.catalog().topology(&name) {
        Some(topology) => Ok(Json(topology.clone())),
        None => Err(ApiError::not_found(format!(
            "no topology `{name}` (known: {})",
            envs.catalog().topology_names().join(", ")
        ))),
    }
}
