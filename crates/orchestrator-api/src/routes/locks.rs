//! Named resource locks (`GET /locks`): who holds each lock, with which
//! fencing token, and who waits for it, in order.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use orchestrator_core::lock::{LockMode, LockRecord};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::StorageUnavailable;
use crate::{ApiError, AppState};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_locks))
}

/// Every lock that has a holder or a waiter.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LockList {
    pub locks: Vec<LockView>,
}

/// One lock.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LockView {
    /// The resource's name, as the template's `locks.<key>.name` resolved.
    pub name: String,
    /// The last fencing token handed out: the next grant gets a greater one.
    pub fencing: u64,
    pub holders: Vec<LockHolderView>,
    /// In the order they asked; the first is granted next.
    pub waiters: Vec<LockWaiterView>,
}

/// A grant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LockHolderView {
    pub workflow_id: String,
    /// The step whose task asked for it.
    pub step: String,
    pub mode: LockMode,
    /// Its fencing token.
    pub token: u64,
    /// When it was granted.
    pub since: DateTime<Utc>,
    /// The nodes running the workflow's tasks under it; the grant lasts
    /// while one of them does (in the life it had when it asked).
    pub nodes: Vec<String>,
}

/// A request not granted yet.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LockWaiterView {
    pub workflow_id: String,
    pub step: String,
    pub mode: LockMode,
    /// The semaphore it asked under, for a shared lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// When it first asked.
    pub since: DateTime<Utc>,
    pub node: String,
}

impl From<LockRecord> for LockView {
    fn from(lock: LockRecord) -> LockView {
        LockView {
            name: lock.name,
            fencing: lock.fencing,
            holders: lock
                .holders
                .into_iter()
                .map(|h| LockHolderView {
                    workflow_id: h.workflow.to_string(),
                    step: h.step,
                    mode: h.mode,
                    token: h.token,
                    since: h.since,
                    nodes: h.lives.into_iter().map(|l| l.node).collect(),
                })
                .collect(),
            waiters: lock
                .waiters
                .into_iter()
                .map(|w| LockWaiterView {
                    workflow_id: w.workflow.to_string(),
                    step: w.step,
                    mode: w.mode,
                    limit: w.limit,
                    since: w.since,
                    node: w.life.node,
                })
                .collect(),
        }
    }
}

/// The locks that are held or waited for, by name: each holder with its
/// fencing token, workflow, step and since when; the waiters in the order
/// they are granted. See docs/locks.md.
#[utoipa::path(get, path = "/locks", tag = "workflows", extensions(("x-role" = json!("viewer"))),
    responses(
    (status = 200, description = "The held and awaited locks", body = LockList),
    StorageUnavailable,
))]
pub(crate) async fn list_locks(State(state): State<AppState>) -> Result<Json<LockList>, ApiError> {
    let locks = state
        .engine
        .locks()
        .await?
        .into_iter()
        .map(LockView::from)
        .collect();
    Ok(Json(LockList { locks }))
}
