//! Admin routes: API tokens, secrets, the audit log, backups and prunes. Only admins reach them (see
//! `auth::need`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use orchestrator_core::access::SecretScope;
use orchestrator_core::access::{ApiToken, AuditRecord, Role};
use orchestrator_core::retention::Keep;
use orchestrator_engine::secrets::{ScopeChange, SecretInfo};
use orchestrator_engine::{PruneReport, PruneRequest};
use orchestrator_storage::AuditQuery;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ErrorBody, StorageUnavailable};
use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .routes(routes!(list_audit))
        .routes(routes!(list_secrets))
        .routes(routes!(put_secret, change_secret_scope, delete_secret))
        .routes(routes!(prune))
}

/// `POST /prune`: one retention pass now, as `orchestrator prune`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PruneBody {
    /// Finished workflows that ended longer ago than this go, with their
    /// tasks and logs (a workflow's own `meta.retain` still wins; the
    /// newest revision of a `meta.ref` stays): `7d`, `12h`, `forever`.
    /// Absent: none.
    older_than: Option<Keep>,
    /// Audit records older than this go. Absent: none.
    audit_older_than: Option<Keep>,
    /// Count what would go; delete nothing.
    #[serde(default)]
    dry_run: bool,
}

/// Deletes finished workflows and audit records past keeping, now (the
/// service also does it in the background under `--retain-finished` and
/// `--retain-audit`).
#[utoipa::path(post, path = "/prune", tag = "admin", extensions(("x-role" = json!("admin")), ("x-audit" = json!("prune.run"))),
    request_body = PruneBody,
    responses(
        (status = 200, description = "What went (or would go)", body = PruneReport),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 422, description = "A period is not valid", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn prune(
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

/// A secret's value, write-only, and who may use it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewSecret {
    /// Not empty (the engine refuses an empty one).
    #[schema(min_length = 1)]
    value: String,
    /// Registered templates (`ref_name`) whose workflows may use it.
    /// Absent: the replaced secret's list is kept (a new secret: none).
    #[schema(schema_with = template_names_schema)]
    templates: Option<Vec<String>>,
    /// Origins (`scheme://host[:port]`) http steps may send it to.
    /// Absent: the replaced secret's list is kept (a new secret: none).
    #[schema(schema_with = origins_schema)]
    origins: Option<Vec<String>>,
}

/// A change of a secret's scope; each list given replaces the stored one.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScopeBody {
    /// Registered templates (`ref_name`) whose workflows may use it.
    #[schema(schema_with = template_names_schema)]
    templates: Option<Vec<String>>,
    /// Origins (`scheme://host[:port]`) http steps may send it to.
    #[schema(schema_with = origins_schema)]
    origins: Option<Vec<String>>,
}

/// A scope's template list: each a registered template's `ref_name`, as
/// the engine checks it.
fn template_names_schema() -> utoipa::openapi::schema::Array {
    optional_strings(r"^[A-Za-z0-9_-]{1,100}$")
}

/// A scope's origins: `scheme://host[:port]`, `http` or `https`. Whether
/// a host is one is the URL parser's call (a name whose last label is a
/// number is read as an IPv4 address, ...), which no pattern states: the
/// engine refuses what it cannot read with a `422` naming the entry.
fn origins_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(ObjectBuilder::new().schema_type(Type::String))
        .build()
}

fn optional_strings(pattern: &str) -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(pattern)),
        )
        .build()
}

/// Stores a secret, encrypted, replacing one of the same name. A secret
/// is usable only where its scope says: by the workflows of the registered
/// templates it names (never an inline template), and by http steps only
/// towards the origins it names.
#[utoipa::path(put, path = "/secrets/{name}", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("secret.put"))),
    params(("name" = String, Path, description = "Secret name: 1-64 of letters, digits, `_`, `.`, `-`",
        pattern = "^[A-Za-z0-9_.-]{1,64}$")),
    request_body = NewSecret,
    responses(
        (status = 200, description = "The secret's metadata", body = SecretInfo),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A bad name or body", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn put_secret(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<NewSecret>,
) -> Result<Json<SecretInfo>, ApiError> {
    let scope = (body.templates.is_some() || body.origins.is_some()).then(|| SecretScope {
        templates: body.templates.unwrap_or_default(),
        origins: body.origins.unwrap_or_default(),
    });
    Ok(Json(
        state
            .engine
            .secrets()
            .put(&name, &body.value, scope)
            .await?,
    ))
}

/// Changes who may use a secret, without its value.
#[utoipa::path(patch, path = "/secrets/{name}", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("secret.scope"))),
    params(("name" = String, Path, description = "Secret name")),
    request_body = ScopeBody,
    responses(
        (status = 200, description = "The secret's metadata", body = SecretInfo),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 404, description = "No such secret", body = ErrorBody),
        (status = 422, description = "A template name or an origin is not valid", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn change_secret_scope(
    State(state): State<AppState>,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<ScopeBody>,
) -> Result<Json<SecretInfo>, ApiError> {
    let change = ScopeChange {
        templates: body.templates,
        origins: body.origins,
    };
    Ok(Json(
        state.engine.secrets().change_scope(&name, change).await?,
    ))
}

/// Deletes a secret.
#[utoipa::path(delete, path = "/secrets/{name}", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("secret.delete"))),
    params(("name" = String, Path, description = "Secret name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such secret", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn delete_secret(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state.engine.secrets().delete(&name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("secret {name} not found")))
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SecretList {
    /// Names and metadata, never values.
    pub secrets: Vec<SecretInfo>,
}

/// Secret names, metadata and scopes; never values.
#[utoipa::path(get, path = "/secrets", tag = "admin", extensions(("x-role" = json!("admin"))),
    responses(
    (status = 200, description = "The secrets", body = SecretList),
    StorageUnavailable,
))]
pub(crate) async fn list_secrets(
    State(state): State<AppState>,
) -> Result<Json<SecretList>, ApiError> {
    Ok(Json(SecretList {
        secrets: state.engine.secrets().list().await?,
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewToken {
    /// 1 to 64 printable characters, not starting or ending with a space
    /// (the engine's rule). A label for people: names need not be unique
    /// (a rotation makes the new token under the old name before the old
    /// one is revoked); the id names a token.
    #[schema(
        min_length = 1,
        max_length = 64,
        pattern = r"^[^\s\x00-\x1f\x7f-\x9f]([^\x00-\x1f\x7f-\x9f]*[^\s\x00-\x1f\x7f-\x9f])?$"
    )]
    name: String,
    #[schema(value_type = Role)]
    role: String,
}

/// A token as listed: never its hash.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
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

/// A new token; `token` is shown this once only.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct IssuedToken {
    pub id: String,
    pub name: String,
    pub role: Role,
    pub created_at: DateTime<Utc>,
    /// The secret: the only time it is ever shown.
    pub token: String,
}

/// Creates a token.
#[utoipa::path(post, path = "/tokens", tag = "admin", extensions(("x-role" = json!("admin")), ("x-audit" = json!("token.create"))),
    request_body = NewToken, responses(
    (status = 201, description = "The token, shown once", body = IssuedToken, links(
        ("revoke" = (operation_id = "revoke_token", parameters(("id" = "$response.body#/id")))),
    )),
    (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
    (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
    (status = 422, description = "A bad name or role", body = ErrorBody),
    StorageUnavailable,
))]
pub(crate) async fn create_token(
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
        Json(IssuedToken {
            id: view.id,
            name: view.name,
            role: view.role,
            created_at: view.created_at,
            token: issued.token,
        }),
    ))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// Every token, active or revoked.
#[utoipa::path(get, path = "/tokens", tag = "admin", extensions(("x-role" = json!("admin"))),
    responses(
    (status = 200, description = "The tokens", body = TokenList),
    StorageUnavailable,
))]
pub(crate) async fn list_tokens(
    State(state): State<AppState>,
) -> Result<Json<TokenList>, ApiError> {
    let tokens: Vec<TokenView> = state
        .engine
        .access()
        .tokens()
        .await?
        .into_iter()
        .map(TokenView::from)
        .collect();
    Ok(Json(TokenList { tokens }))
}

/// Revokes a token.
#[utoipa::path(delete, path = "/tokens/{id}", tag = "admin",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("token.revoke"))),
    params(("id" = String, Path, description = "Token id")),
    responses(
        (status = 200, description = "The revoked token", body = TokenView),
        (status = 404, description = "No such token", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn revoke_token(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    match state.engine.access().revoke_token(&id).await? {
        Some(token) => Ok(Json(token.into())),
        None => Err(ApiError::not_found(format!("token {id} not found"))),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditParams {
    /// At or after (RFC 3339).
    #[param(value_type = Option<DateTime<Utc>>)]
    since: Option<String>,
    /// Before (RFC 3339).
    #[param(value_type = Option<DateTime<Utc>>)]
    until: Option<String>,
    /// Token name (`anonymous` for the aggregate records of refusals
    /// without a valid token).
    actor: Option<String>,
    /// Action, e.g. `workflow.submit` or `auth.refused`.
    action: Option<String>,
    /// Target.
    target: Option<String>,
    /// Page size, default 50.
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
    /// Records to skip.
    #[param(minimum = 0, maximum = 4294967295u32)]
    offset: Option<u32>,
}

/// A page of the audit log, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    pub records: Vec<AuditRecord>,
    /// How many records match, in all pages.
    pub total: usize,
    pub limit: usize,
    pub offset: usize,
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

/// The audit log, newest first.
#[utoipa::path(get, path = "/audit", tag = "admin",
    extensions(("x-role" = json!("admin"))),
    params(AuditParams),
    responses(
        (status = 200, description = "A page of audit records", body = AuditPage),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn list_audit(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<AuditParams>,
) -> Result<Json<AuditPage>, ApiError> {
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
    Ok(Json(AuditPage {
        records: page.items,
        total: page.total,
        limit: query.limit,
        offset: query.offset,
    }))
}
