//! The API's operations by resource. Each is declared once, on its
//! handler's `#[utoipa::path]`: method, path, request and answer, and in
//! its `extensions` the role it needs (`x-role`) and the audit action it
//! records (`x-audit`). The router, the document, the door's table of
//! roles and the audit log are all made from that declaration
//! ([`operations`], `auth::Declarations`).

pub(crate) mod admin;
pub(crate) mod approvals;
pub(crate) mod backup;
pub(crate) mod builtin;
pub(crate) mod dashboard;
pub(crate) mod document;
pub(crate) mod health;
pub(crate) mod locks;
pub(crate) mod schedules;
pub(crate) mod storage_moves;
pub(crate) mod tasks;
pub(crate) mod templates;
pub(crate) mod testenv;
pub(crate) mod webhooks;
pub(crate) mod workflows;

use axum::http::{StatusCode, Uri};
use orchestrator_core::{TaskId, WorkflowId};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::{ApiError, AppState};

pub(crate) const DEFAULT_PAGE: u32 = 50;
/// The largest `limit` of a listing; the document's `maximum` (a test
/// compares them).
pub(crate) const MAX_PAGE: u32 = 1000;
pub(crate) const DEFAULT_LOG_BYTES: u32 = 1024 * 1024;
/// The most a log read returns, whatever `limit_bytes` asks.
pub(crate) const MAX_LOG_BYTES: u32 = 16 * DEFAULT_LOG_BYTES;

/// Every operation, as one router carrying its document: each module
/// lists its handlers, and `routes!` reads method and path from the
/// handler's `#[utoipa::path]`, so neither is written twice.
pub(crate) fn operations() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(health::routes())
        .merge(tasks::routes())
        .merge(workflows::routes())
        .merge(builtin::routes())
        .merge(templates::routes())
        .merge(schedules::routes())
        .merge(approvals::routes())
        .merge(admin::routes())
        .merge(backup::routes())
        .merge(storage_moves::routes())
        .merge(testenv::routes())
        .merge(dashboard::routes())
        .merge(webhooks::routes())
        .routes(routes!(crate::live::events))
        .routes(routes!(crate::prometheus::metrics))
        .merge(document::routes())
        .merge(locks::routes())
}

pub(crate) async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}

pub(crate) async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("method not allowed on {}", uri.path()),
    )
}

pub(crate) fn parse_task_id(raw: &str) -> Result<TaskId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad_request(format!("`{raw}` is not a valid task id (expected a UUID)"))
    })
}

pub(crate) fn parse_workflow_id(raw: &str) -> Result<WorkflowId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "`{raw}` is not a valid workflow id (expected a UUID)"
        ))
    })
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

/// How many records to ask the store for a page of `limit`: one more,
/// so that whether a next page exists is known without a second query.
pub(crate) fn with_lookahead(limit: usize) -> usize {
    if limit == 0 { 0 } else { limit + 1 }
}

/// Cuts a page read [`with_lookahead`] back to `limit`, and answers the
/// keyset cursor of the next page (its `after`): the last item's key,
/// when more items follow.
pub(crate) fn next_after<T, K>(
    items: &mut Vec<T>,
    limit: usize,
    key: impl Fn(&T) -> K,
) -> Option<K> {
    if items.len() <= limit {
        return None;
    }
    items.truncate(limit);
    items.last().map(key)
}
