//! Admin routes: API tokens, secrets, the audit log, backups and prunes. Only admins reach them (see
//! `auth::need`).

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{delete, get, post, put};
use chrono::{DateTime, Utc};
use orchestrator_core::access::{ApiToken, Role};
use orchestrator_core::retention::Keep;
use orchestrator_engine::{PruneReport, PruneRequest};
use orchestrator_storage::AuditQuery;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState};

pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/tokens", get(list_tokens).post(create_token))
        .route("/tokens/{id}", delete(revoke_token))
        .route("/audit", get(list_audit))
        .route("/secrets", get(list_secrets))
        .route("/secrets/{name}", put(put_secret).delete(delete_secret))
        .route("/backup", post(crate::backup::create_backup))
        .route("/prune", post(prune))
}

/// `POST /prune`: one retention pass now, as `orchestrator prune`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PruneBody {
    /// Finished workflows older than this go (their own `meta.retain`
    /// still wins); absent: none.
    older_than: Option<Keep>,
    /// Audit records older than this go; absent: none.
    audit_older_than: Option<Keep>,
    #[serde(default)]
    dry_run: bool,
}

async fn prune(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<PruneBody>,
) -> Result<Json<PruneReport>, ApiError> {
    let request = PruneRequest {
        finished: body.older_than.unwrap_or(Keep::Forever),
        audit: body.audit_older_than.unwrap_or(Keep::Forever),
        dry_run: body.dry_run,
    };
    Ok(Json(state.engine.prune(request).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSecret {
    value: String,
}

async fn put_secret(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<NewSecret>,
) -> Result<Json<orchestrator_engine::secrets::SecretInfo>, ApiError> {
    Ok(Json(state.engine.secrets().put(&name, &body.value).await?))
}

async fn delete_secret(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.engine.secrets().delete(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("secret {name} not found")))
    }
}

async fn list_secrets(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(
        json!({ "secrets": state.engine.secrets().list().await? }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewToken {
    name: String,
    role: String,
}

/// A token as listed: never its hash.
#[derive(Serialize)]
struct TokenView {
    id: String,
    name: String,
    role: Role,
    created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_at: Option<DateTime<Utc>>,
}

impl From<ApiToken> for TokenView {
    fn from(t: ApiToken) -> TokenView {
        TokenView {
            id: t.id,
            name: t.name,
            role: t.role,
            created_at: t.created_at,
            revoked_at: t.revoked_at,
        }
    }
}

async fn create_token(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<NewToken>,
) -> Result<impl IntoResponse, ApiError> {
    let role: Role = body.role.parse().map_err(|e: String| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("role: {e}"),
        )
    })?;
    let issued = state.engine.access().create_token(&body.name, role).await?;
    let view = TokenView::from(issued.record);
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": view.id,
            "name": view.name,
            "role": view.role,
            "created_at": view.created_at,
            // The only time it is ever shown.
            "token": issued.token,
        })),
    ))
}

async fn list_tokens(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let tokens: Vec<TokenView> = state
        .engine
        .access()
        .tokens()
        .await?
        .into_iter()
        .map(TokenView::from)
        .collect();
    Ok(Json(json!({ "tokens": tokens })))
}

async fn revoke_token(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    match state.engine.access().revoke_token(&id).await? {
        Some(token) => Ok(Json(token.into())),
        None => Err(ApiError::not_found(format!("token {id} not found"))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditParams {
    since: Option<String>,
    until: Option<String>,
    actor: Option<String>,
    action: Option<String>,
    target: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

fn time_param(name: &str, value: Option<String>) -> Result<Option<DateTime<Utc>>, ApiError> {
    value
        .map(|v| {
            DateTime::parse_from_rfc3339(&v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| {
                    ApiError::bad_request(format!(
                        "{name}: `{v}` is not an RFC 3339 time such as 2026-11-22T10:00:00Z ({e})"
                    ))
                })
        })
        .transpose()
}

async fn list_audit(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<AuditParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let (limit, offset) = crate::routes::page_bounds(params.limit, params.offset)?;
    let query = AuditQuery {
        since: time_param("since", params.since)?,
        until: time_param("until", params.until)?,
        actor: params.actor,
        action: params.action,
        target: params.target,
        limit,
        offset,
    };
    let page = state.engine.access().audit(&query).await?;
    Ok(Json(json!({
        "records": page.items,
        "total": page.total,
        "limit": query.limit,
        "offset": query.offset,
    })))
}
