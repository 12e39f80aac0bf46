//! The HTTP API. This is the only crate that knows HTTP: it maps requests
//! onto the engine and engine results (and errors) onto responses.

mod auth;
mod browser;
#[cfg(feature = "client")]
pub mod client;
mod connections;
mod declarations;
mod error;
mod extract;
mod forwarded;
mod layers;
mod limiter;
mod live;
mod openapi;
pub mod prometheus;
mod refusals;
mod routes;
mod session;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use orchestrator_engine::Engine;
use tokio::net::TcpListener;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};

pub use browser::parse_public_host;
pub use error::ApiError;
pub use forwarded::parse_trusted_proxy;
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

/// What the HTTP side holds its clients to, and whom it believes about
/// them: connections, streams, proxies and the names it answers to.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// How long a connection may take to send a request's head, from when
    /// it opens or its previous response ended (so also how long an idle
    /// keep-alive connection stays open).
    pub header_timeout: Duration,
    /// Connections served at once; one more gets `503`.
    pub max_connections: usize,
    /// Event streams and followed logs open at once per caller (token, or
    /// the `local` principal without auth); one more gets `429`.
    pub max_streams: usize,
    /// Peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Names the service is reached by besides IP addresses and
    /// `localhost` (behind a proxy): accepted in `Host` and `Origin`.
    pub public_hosts: Vec<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_streams: DEFAULT_MAX_STREAMS,
            trusted_proxies: Vec::new(),
            public_hosts: Vec::new(),
        }
    }
}

/// See [`HttpConfig::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// See [`HttpConfig::max_connections`]; the Debian unit's `LimitNOFILE`
/// leaves room for it.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// See [`HttpConfig::max_streams`]: a dashboard tab holds one event
/// stream, and one followed log per log it shows.
pub const DEFAULT_MAX_STREAMS: usize = 16;

#[derive(Clone)]
pub(crate) struct AppState {
    engine: Engine,
    /// Issues the dashboard's session cookies; the guard checks them.
    sessions: session::Sessions,
    /// Test environments, when the service runs them (`/test/...`).
    testenvs: Option<orchestrator_testenv::TestEnvs>,
    /// The open streams of each caller, against `--max-streams`.
    streams: live::StreamSlots,
}

impl AppState {
    pub(crate) fn new(engine: Engine) -> AppState {
        let config = engine.access().config();
        let sessions = session::Sessions::new(config.secret_key, config.secure_cookies);
        AppState {
            engine,
            sessions,
            testenvs: None,
            streams: live::StreamSlots::new(DEFAULT_MAX_STREAMS),
        }
    }
}

/// The full router with its middleware.
pub fn app(engine: Engine) -> Router {
    app_with(engine, None, &HttpConfig::default())
}

/// [`app`], with the test environment service behind `/test/...` and the
/// HTTP settings.
pub fn app_with(
    engine: Engine,
    testenvs: Option<orchestrator_testenv::TestEnvs>,
    http: &HttpConfig,
) -> Router {
    let mut state = AppState::new(engine);
    state.testenvs = testenvs;
    state.streams = live::StreamSlots::new(http.max_streams);
    let (routes, declarations) = all_routes();
    with_layers(
        routes,
        declarations,
        state,
        layers::Deadlines::default(),
        http,
    )
}

/// Every route, before middleware (the API's, the dashboard's and the
/// operational ones), and what each declared.
pub(crate) fn all_routes() -> (Router<AppState>, declarations::Declarations) {
    let (router, _) = routes::operations().split_for_parts();
    let router = router
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed);
    // The declarations of the whole document (with the one operation the
    // router cannot carry, see `routes::document`). A route without a role
    // is a programming error, caught by the tests before it ships.
    let declarations =
        declarations::Declarations::from_document(&routes::document::document_model())
            .unwrap_or_else(|e| panic!("{e}"));
    (router, declarations)
}

/// The middleware stack, innermost first. `Router::layer` wraps each route
/// (and the fallback) after routing, so every layer sees the `MatchedPath`.
fn with_layers(
    routes: Router<AppState>,
    declarations: declarations::Declarations,
    state: AppState,
    deadlines: layers::Deadlines,
    http: &HttpConfig,
) -> Router {
    let request_id = axum::http::HeaderName::from_static("x-request-id");
    let guard = auth::Guard::new(
        declarations,
        state.engine.clone(),
        state.sessions.clone(),
        forwarded::TrustedProxies::new(http.trusted_proxies.clone()),
    );
    let browser = browser::BrowserRules::new(
        state.engine.access().config().auth,
        &http.public_hosts,
        state.sessions.clone(),
    );
    routes
        .with_state(state)
        // What another site's page could make a browser send: a foreign
        // `Origin` or `Host`, a change whose body is not JSON. Inside the
        // body limit (a body over it is 413 whatever its type) and the
        // guard (401 before 415; a refused change is audited).
        .layer(axum::middleware::from_fn_with_state(browser, browser::check))
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
                    // The client as the limits see it: behind a trusted
                    // proxy, the address it forwarded.
                    let client = request
                        .extensions()
                        .get::<forwarded::ClientAddress>()
                        .map_or_else(|| "-".to_owned(), |c| c.0.to_string());
                    tracing::info_span!("request", method = %request.method(), uri = %request.uri(), request_id = %id, client = %client)
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
    serve_with(listener, engine, None, HttpConfig::default(), shutdown).await
}

/// [`serve`], with the test environment service behind `/test/...` and the
/// HTTP settings: the connections' timeout and cap (see `connections`).
pub async fn serve_with(
    listener: TcpListener,
    engine: Engine,
    testenvs: Option<orchestrator_testenv::TestEnvs>,
    http: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = connections::ConnectionLimits {
        header_timeout: http.header_timeout,
        max_connections: http.max_connections,
    };
    connections::serve(
        listener,
        app_with(engine, testenvs, &http),
        limits,
        shutdown,
    )
    .await
}
