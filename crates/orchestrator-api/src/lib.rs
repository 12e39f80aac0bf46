//! The HTTP API. This is the only crate that knows HTTP: it maps requests
//! onto the engine and engine results (and errors) onto responses.

mod error;
mod extract;
mod routes;

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use orchestrator_engine::Engine;
use tokio::net::TcpListener;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub use error::ApiError;

/// Largest request body accepted; workflow submissions are small.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How long `wait: true` blocks unless the request says otherwise, and the
/// most it may ask for.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(120);
pub const MAX_WAIT: Duration = Duration::from_secs(600);

#[derive(Clone)]
pub(crate) struct AppState {
    engine: Engine,
}

/// The full router with its middleware.
pub fn app(engine: Engine) -> Router {
    let request_id = axum::http::HeaderName::from_static("x-request-id");
    routes::router()
        .with_state(AppState { engine })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(TraceLayer::new_for_http().make_span_with(|request: &axum::http::Request<_>| {
            let id = request
                .headers()
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            tracing::info_span!("request", method = %request.method(), uri = %request.uri(), request_id = %id)
        }))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
}

/// Serves the API on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(engine))
        .with_graceful_shutdown(shutdown)
        .await
}
