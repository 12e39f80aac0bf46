//! Admin routes of live storage migration: move the running service to
//! another store, watch it, cancel it, roll it back.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use orchestrator_core::storage_move::MoveStatus;
use orchestrator_storage::live::{LiveError, LiveMigrations, StoreInfo};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ErrorBody, StorageUnavailable};
use crate::extract::JsonBody;
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(current_store))
        .routes(routes!(list_migrations, start_migration))
        .routes(routes!(get_migration))
        .routes(routes!(cancel_migration))
        .routes(routes!(rollback))
}

/// Most records read and written per batch.
pub(crate) const MAX_BATCH_SIZE: usize = 10_000;

/// `POST /admin/storage/migrations`.
#[derive(Deserialize, ToSchema)]
// The document keeps the names the API shipped with.
#[schema(as = MigrationRequest)]
#[serde(deny_unknown_fields)]
pub(crate) struct MoveRequest {
    /// The store to move to, as `<backend>:<location>`: `filesystem:/dir`,
    /// `surrealdb-embedded:/dir` (the store is `/dir/surrealdb`) or
    /// `surrealdb-server:ws://host:port/namespace/database`. A directory
    /// must be absolute. A server is signed in to with the service's own
    /// SurrealDB credentials.
    #[schema(example = "surrealdb-embedded:/var/lib/orchestrator", min_length = 1)]
    target: String,
    /// Records per batch (default 2000).
    #[schema(minimum = 1, maximum = 10000)]
    batch_size: Option<usize>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[schema(as = MigrationList)]
pub struct MoveList {
    /// Oldest first; the last 20 are kept.
    pub migrations: Vec<MoveStatus>,
}

fn live(state: &AppState) -> Result<&LiveMigrations, ApiError> {
    state.engine.live_migrations().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            "this service was started without storage move",
        )
    })
}

impl From<LiveError> for ApiError {
    fn from(error: LiveError) -> ApiError {
        match error {
            LiveError::BadTarget(_) | LiveError::NotCompiled(_) | LiveError::SameStore(_) => {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    error.to_string(),
                )
            }
            LiveError::NotFound(_) => ApiError::not_found(error.to_string()),
            LiveError::TargetNotEmpty { .. }
            | LiveError::Shared(_)
            | LiveError::Running(_)
            | LiveError::TooLate(_)
            | LiveError::Rollback(_) => {
                ApiError::new(StatusCode::CONFLICT, "conflict", error.to_string())
            }
            LiveError::Storage(e) => {
                tracing::error!(error = %e, "storage move: storage failed");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_unavailable",
                    "the service could not read or write its storage; see the service log",
                )
            }
        }
    }
}

/// The store this service works on, and the one it left at its last
/// switch.
#[utoipa::path(get, path = "/admin/storage", tag = "admin",
    extensions(("x-role" = json!("admin"))),
    responses(
        (status = 200, description = "The current store", body = StoreInfo),
        (status = 409, description = "Started without storage move", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn current_store(
    State(state): State<AppState>,
) -> Result<Json<StoreInfo>, ApiError> {
    Ok(Json(live(&state)?.store()?))
}

/// Moves the running service to another store, in the background:
/// copy, mirror, verify, then a switch that pauses writes for
/// milliseconds. Watch it at the `Location`, or as `storage_migration`
/// events.
#[utoipa::path(post, path = "/admin/storage/migrations", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("storage.migrate"))),
    request_body = MoveRequest,
    responses(
        (status = 202, description = "Started; the body is its first status", body = MoveStatus,
            headers(("location" = String, description = "The migration's URL"))),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 409, description = "The target holds records, the store is shared, or a migration runs", body = ErrorBody),
        (status = 422, description = "The target is malformed, not compiled in, unreachable, or the current store", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn start_migration(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<MoveRequest>,
) -> Result<Response, ApiError> {
    let target = body.target.trim();
    if let Some((backend, location)) = target.split_once(':')
        && backend != "surrealdb-server"
        && !std::path::Path::new(location).is_absolute()
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!(
                "target: `{target}`: the directory must be absolute, since it is the service's \
                 and not the caller's"
            ),
        ));
    }
    if let Some(size) = body.batch_size
        && !(1..=MAX_BATCH_SIZE).contains(&size)
    {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("batch_size: {size} is not between 1 and {MAX_BATCH_SIZE}"),
        ));
    }
    let status = live(&state)?.start(target, body.batch_size).await?;
    let location = format!("/admin/storage/migrations/{}", status.id);
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(status),
    )
        .into_response())
}

/// The migrations this service remembers, oldest first.
#[utoipa::path(get, path = "/admin/storage/migrations", tag = "admin",
    extensions(("x-role" = json!("admin"))),
    responses(
        (status = 200, description = "The migrations", body = MoveList),
        (status = 409, description = "Started without storage move", body = ErrorBody),
    ))]
pub(crate) async fn list_migrations(
    State(state): State<AppState>,
) -> Result<Json<MoveList>, ApiError> {
    Ok(Json(MoveList {
        migrations: live(&state)?.list(),
    }))
}

/// One migration: its phase, records copied, rate and ETA, the time of
/// each phase, and the stall at the switch.
#[utoipa::path(get, path = "/admin/storage/migrations/{id}", tag = "admin",
    extensions(("x-role" = json!("admin"))),
    params(("id" = String, Path, description = "The migration's id")),
    responses(
        (status = 200, description = "The migration", body = MoveStatus),
        (status = 404, description = "No such migration", body = ErrorBody),
        (status = 409, description = "Started without storage move", body = ErrorBody),
    ))]
pub(crate) async fn get_migration(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<MoveStatus>, ApiError> {
    Ok(Json(live(&state)?.get(&id)?))
}

/// Cancels a migration before its switch: the service stays on its
/// store, and the target is left incomplete (a new migration to it
/// continues it).
#[utoipa::path(post, path = "/admin/storage/migrations/{id}/cancel", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("storage.migration_cancel"))),
    params(("id" = String, Path, description = "The migration's id")),
    responses(
        (status = 202, description = "Cancelling; the body is its status before", body = MoveStatus),
        (status = 404, description = "No such migration", body = ErrorBody),
        (status = 409, description = "It is switching, or has ended", body = ErrorBody),
    ))]
pub(crate) async fn cancel_migration(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<MoveStatus>), ApiError> {
    Ok((StatusCode::ACCEPTED, Json(live(&state)?.cancel(&id)?)))
}

/// Switches back to the store left at the last switch, while nothing has
/// been written since (it is still level); otherwise 409 with the reason.
#[utoipa::path(post, path = "/admin/storage/rollback", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("storage.rollback"))),
    responses(
        (status = 200, description = "Rolled back; the store now current", body = StoreInfo),
        (status = 409, description = "No switch to undo, a migration runs, or the old store is behind", body = ErrorBody),
        (status = 422, description = "The old store's backend is not compiled in", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn rollback(State(state): State<AppState>) -> Result<Json<StoreInfo>, ApiError> {
    Ok(Json(live(&state)?.rollback().await?))
}
