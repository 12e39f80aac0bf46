//! Liveness and load (`/health`), and the nodes sharing the store.

use std::borrow::Cow;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use orchestrator_core::Node;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::StorageUnavailable;
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(list_nodes))
}

/// Liveness and load.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, or `unhealthy` with a 503.
    #[schema(example = "ok")]
    pub status: Cow<'static, str>,
    /// Why storage is unhealthy; only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub version: Cow<'static, str>,
    /// The storage backend.
    pub storage: Cow<'static, str>,
    pub workers: usize,
    /// Tasks waiting for a worker.
    pub queued: usize,
    pub running: usize,
}

/// Liveness and load. Needs no token.
///
/// 200 while storage answers; 503 with the reason while it does not (a
/// SurrealDB server that went away, a poisoned journal), so a load balancer
/// or orchestrator of orchestrators stops sending work here.
#[utoipa::path(get, path = "/health", tag = "operations", extensions(("x-role" = json!("open"))),
    responses(
    (status = 200, description = "Storage can be read and written", body = Health),
    (status = 503, description = "Storage is unhealthy; `reason` says why", body = Health),
))]
pub(crate) async fn health(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let (queued, running) = state.engine.load();
    let mut body = Health {
        status: Cow::Borrowed("ok"),
        reason: None,
        version: Cow::Borrowed(env!("CARGO_PKG_VERSION")),
        storage: Cow::Borrowed(state.engine.store().name()),
        workers: state.engine.config().workers,
        queued,
        running,
    };
    match state.engine.store().health().await {
        Ok(()) => (StatusCode::OK, Json(body)),
        Err(e) => {
            tracing::warn!(error = %e, "health check: storage is unhealthy");
            body.status = Cow::Borrowed("unhealthy");
            body.reason = Some(e.to_string());
            (StatusCode::SERVICE_UNAVAILABLE, Json(body))
        }
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    #[serde(flatten)]
    pub node: Node,
    /// Its last heartbeat is within one lease.
    pub alive: bool,
    /// It is the node that answered.
    pub this_node: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
}

/// The nodes sharing this store: their last heartbeat and whether it is
/// recent enough (within one lease) to count them alive.
#[utoipa::path(get, path = "/cluster/nodes", tag = "operations", extensions(("x-role" = json!("viewer"))),
    responses(
    (status = 200, description = "The nodes", body = NodeList),
    StorageUnavailable,
))]
pub(crate) async fn list_nodes(State(state): State<AppState>) -> Result<Json<NodeList>, ApiError> {
    let this_node = &state.engine.config().node_id;
    let nodes = state
        .engine
        .nodes()
        .await?
        .into_iter()
        .map(|(node, alive)| NodeView {
            this_node: node.id == *this_node,
            node,
            alive,
        })
        .collect();
    Ok(Json(NodeList { nodes }))
}
