//! The HTTP API. This is the only crate that knows HTTP: it maps requests
//! onto the engine and engine results (and errors) onto responses.

mod admin;
mod auth;
mod backup;
mod dashboard;
mod error;
mod extract;
mod layers;
mod live;
pub mod openapi;
pub mod prometheus;
mod refusals;
mod routes;
mod schedules;
mod session;
mod storage;
mod testenv;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use orchestrator_engine::Engine;
use tokio::net::TcpListener;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

pub use error::ApiError;
pub use layers::{REQUEST_TIMEOUT, SUBMISSION_TIMEOUT};

/// Largest request body accepted. An inline template at its largest
/// (`--max-template-bytes`) with inputs at theirs (`--max-input-bytes`)
/// must fit, with [`BODY_OVERHEAD_BYTES`] to spare: the service refuses to
/// start with limits that would not, so a template is refused by its own
/// limit (naming it), not by the body's.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;
/// What a submission's body holds besides its template and inputs
/// (options, `meta`, whitespace).
pub const BODY_OVERHEAD_BYTES: usize = 64 * 1024;

/// How long `wait: true` blocks unless the request says otherwise, and the
/// most it may ask for.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(120);
pub const MAX_WAIT: Duration = Duration::from_secs(600);

#[derive(Clone)]
pub(crate) struct AppState {
    engine: Engine,
    /// Issues the dashboard's session cookies; the guard checks them.
    sessions: session::Sessions,
    /// Test environments, when the service runs them (`/test/...`).
    testenvs: Option<orchestrator_testenv::TestEnvs>,
}

impl AppState {
    pub(crate) fn new(engine: Engine) -> AppState {
        let sessions = session::Sessions::new(engine.access().config().secret_key);
        AppState {
            engine,
            sessions,
            testenvs: None,
        }
    }
}

/// The full router with its middleware.
pub fn app(engine: Engine) -> Router {
    app_with_testenvs(engine, None)
}

/// [`app`], with the test environment service behind `/test/...`.
pub fn app_with_testenvs(
    engine: Engine,
    testenvs: Option<orchestrator_testenv::TestEnvs>,
) -> Router {
    let mut state = AppState::new(engine);
    state.testenvs = testenvs;
    with_layers(all_routes(), state, layers::Deadlines::default())
}

/// Every route, before middleware: the API's, the dashboard's and the
/// operational ones.
pub(crate) fn all_routes() -> Router<AppState> {
    routes::router()
        .merge(admin::router())
        .merge(storage::router())
        .merge(dashboard::router())
        .merge(schedules::router())
        .merge(testenv::router())
        .merge(
            Router::new()
                .route("/metrics", get(prometheus::metrics))
                .route("/openapi.json", get(openapi::openapi_json)),
        )
}

/// The middleware stack, innermost first. `Router::layer` wraps each route
/// (and the fallback) after routing, so every layer sees the `MatchedPath`.
fn with_layers(routes: Router<AppState>, state: AppState, deadlines: layers::Deadlines) -> Router {
    let request_id = axum::http::HeaderName::from_static("x-request-id");
    let guard = auth::Guard::new(state.engine.clone(), state.sessions.clone());
    routes
        .with_state(state)
        // Bodies over the limit: by `Content-Length` at once (413 from the
        // layer), or while a handler reads a longer body (413 from the
        // extractor). Both answer with the JSON error body.
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(RequestBodyLimitLayer::new(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(move |request, next| {
            deadlines.enforce(request, next)
        }))
        .layer(axum::middleware::map_response(layers::json_error_body))
        // Tokens, roles, rate limits and the audit log; after routing, so
        // it knows the route template.
        .layer(axum::middleware::from_fn_with_state(
            guard.clone(),
            auth::guard,
        ))
        .layer(axum::middleware::from_fn(prometheus::track_requests))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        // One span per request, with the request id as a field, so every
        // log line of the request carries it (in JSON logs as
        // `span.request_id`); one INFO line per answered request.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|request: &axum::http::Request<_>| {
                    let id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!("request", method = %request.method(), uri = %request.uri(), request_id = %id)
                })
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        // Outermost: the per-address rate limit, before anything is spent
        // on the request (see `auth::limit_address`).
        .layer(axum::middleware::from_fn_with_state(
            guard,
            auth::limit_address,
        ))
    // No CORS layer: browsers get no cross-origin access.
}

/// Serves the API on `listener` until `shutdown` resolves, then stops
/// accepting and lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    engine: Engine,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with_testenvs(listener, engine, None, shutdown).await
}

/// [`serve`], with the test environment service behind `/test/...`.
pub async fn serve_with_testenvs(
    listener: TcpListener,
    engine: Engine,
    testenvs: Option<orchestrator_testenv::TestEnvs>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // The peer address tells the guard whether `/metrics` is asked from
    // this machine.
    axum::serve(
        listener,
        app_with_testenvs(engine, testenvs)
            .into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}
