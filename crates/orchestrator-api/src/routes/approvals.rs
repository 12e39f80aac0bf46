//! Approval gates: the gates waiting for a decision, one workflow's
//! waiting gate with the digest it covers now, and the decisions. Who
//! may decide is the gate's rule (a role, or named tokens; not the
//! submitter unless it allows it), enforced by the engine: the door only
//! asks for a valid token.

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use orchestrator_core::approval::Choice;
use orchestrator_engine::access::Principal;
use orchestrator_engine::approvals::{DecisionOutcome, DecisionRequest, PendingApproval, decider};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::parse_workflow_id;
use crate::auth::AuditNote;
use crate::error::{ErrorBody, ShuttingDownOrStorageUnavailable, StorageUnavailable};
use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_approvals))
        .routes(routes!(workflow_approval))
        .routes(routes!(approve_workflow))
        .routes(routes!(reject_workflow))
}

/// The gates waiting for a decision.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ApprovalList {
    /// Oldest first, at most 200.
    pub items: Vec<PendingApproval>,
}

/// Every approval gate waiting for a decision, with the digest a decision
/// signs now and what it covers.
#[utoipa::path(get, path = "/approvals", tag = "approvals",
    extensions(("x-role" = json!("viewer"))),
    responses(
        (status = 200, description = "The waiting gates", body = ApprovalList),
        StorageUnavailable,
    ))]
pub(crate) async fn list_approvals(
    State(state): State<AppState>,
) -> Result<Json<ApprovalList>, ApiError> {
    Ok(Json(ApprovalList {
        items: state.engine.pending_approvals().await?,
    }))
}

/// Which gate of the workflow, when several wait.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct GateParams {
    /// The gate's step (`ref_name`).
    #[param(max_length = 128)]
    step: Option<String>,
}

/// The workflow's gate that waits for a decision, with the digest a
/// decision signs now.
#[utoipa::path(get, path = "/workflows/{id}/approval", tag = "approvals",
    extensions(("x-role" = json!("viewer"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id"), GateParams),
    responses(
        (status = 200, description = "The waiting gate", body = PendingApproval),
        (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "No gate waits, or several do and `step` names none of them", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn workflow_approval(
    State(state): State<AppState>,
    Path(id): Path<String>,
    QueryParams(params): QueryParams<GateParams>,
) -> Result<Json<PendingApproval>, ApiError> {
    Ok(Json(
        state
            .engine
            .workflow_approval(parse_workflow_id(&id)?, params.step.as_deref())
            .await?,
    ))
}

/// A decision on a workflow's waiting gate.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// The digest the decider was shown (`GET /workflows/{id}/approval`):
    /// a decision on anything else is refused with 409.
    #[schema(min_length = 64, max_length = 64, pattern = "^[0-9a-f]{64}$")]
    pub digest: String,
    /// Why; kept with the decision (at most 2048 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 2048)]
    pub comment: Option<String>,
    /// The gate's step, when the workflow has several waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128)]
    pub step: Option<String>,
}

/// Approves the workflow's waiting gate; the last approval it needs lets
/// the gated steps start.
#[utoipa::path(post, path = "/workflows/{id}/approve", tag = "approvals",
    extensions(("x-role" = json!("viewer")), ("x-audit" = json!("workflow.approve"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    request_body = Decision,
    responses(
        (status = 200, description = "The decision, stored", body = DecisionOutcome),
        (status = 400, description = "The id is not a UUID, an empty body or malformed JSON", body = ErrorBody),
        (status = 403, description = "This token may not decide this gate (its role, its name, or it submitted the workflow)", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "No gate waits, the digest is stale (both are named), the token approved already, or another decision came first", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A bad field; the message names it", body = ErrorBody),
        ShuttingDownOrStorageUnavailable,
    ))]
pub(crate) async fn approve_workflow(
    State(state): State<AppState>,
    principal: Option<axum::Extension<Principal>>,
    Path(id): Path<String>,
    JsonBody(decision): JsonBody<Decision>,
) -> Result<Response, ApiError> {
    decide(&state, principal, &id, decision, Choice::Approve).await
}

/// Rejects the workflow's waiting gate: it ends `cancelled`, and the
/// gated steps are skipped.
#[utoipa::path(post, path = "/workflows/{id}/reject", tag = "approvals",
    extensions(("x-role" = json!("viewer")), ("x-audit" = json!("workflow.reject"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    request_body = Decision,
    responses(
        (status = 200, description = "The decision, stored", body = DecisionOutcome),
        (status = 400, description = "The id is not a UUID, an empty body or malformed JSON", body = ErrorBody),
        (status = 403, description = "This token may not decide this gate", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "No gate waits, the digest is stale (both are named), or another decision came first", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A bad field; the message names it", body = ErrorBody),
        ShuttingDownOrStorageUnavailable,
    ))]
pub(crate) async fn reject_workflow(
    State(state): State<AppState>,
    principal: Option<axum::Extension<Principal>>,
    Path(id): Path<String>,
    JsonBody(decision): JsonBody<Decision>,
) -> Result<Response, ApiError> {
    decide(&state, principal, &id, decision, Choice::Reject).await
}

async fn decide(
    state: &AppState,
    principal: Option<axum::Extension<Principal>>,
    id: &str,
    decision: Decision,
    choice: Choice,
) -> Result<Response, ApiError> {
    let id = parse_workflow_id(id)?;
    let principal = principal.map_or_else(Principal::local, |p| p.0);
    if decision.digest.len() != 64
        || !decision
            .digest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(ApiError::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!(
                "digest: `{}` is not a sha256 digest (64 lowercase hex digits)",
                decision.digest.chars().take(80).collect::<String>()
            ),
        ));
    }
    // The audit record names the digest decided on, refused or not.
    let note = AuditNote(format!("digest {}", decision.digest));
    let request = DecisionRequest {
        choice,
        step: decision.step,
        digest: decision.digest,
        comment: decision.comment,
    };
    match state
        .engine
        .decide_approval(id, decider(&principal.actor, principal.role), request)
        .await
    {
        Ok(outcome) => {
            let mut response = Json(outcome).into_response();
            response.extensions_mut().insert(note);
            Ok(response)
        }
        Err(error) => {
            let mut response = ApiError::from(error).into_response();
            response.extensions_mut().insert(note);
            Ok(response)
        }
    }
}
