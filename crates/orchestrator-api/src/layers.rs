//! The operational middleware of the router: the request deadline, the
//! request span (with the request id) and the JSON body of errors that
//! were produced outside the handlers.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{ApiError, MAX_WAIT};

/// How long an ordinary request may take before it is answered with
/// `408 request_timeout`. Every handler but a waiting submission answers in
/// milliseconds; this only catches one stuck on a storage that hangs.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The deadline of a submission route. `wait: true` legitimately blocks up
/// to [`MAX_WAIT`], and the body is only read by the handler, so these
/// routes get `MAX_WAIT` plus the ordinary allowance for the submission
/// itself: the deadline never cuts a wait short, and still ends a request
/// that hangs.
pub const SUBMISSION_TIMEOUT: Duration = MAX_WAIT.saturating_add(REQUEST_TIMEOUT);

/// The routes that accept `wait` (by route template), and `/backup`, which
/// copies the whole store before it answers: they get the longer deadline.
const WAITING_ROUTES: &[&str] = &[
    "/workflows",
    "/workflows/servers/create",
    "/workflows/taskserv/create",
    "/workflows/cluster/create",
    "/backup",
    "/test/environments/create",
    "/test/environments/{id}",
    "/test/environments/{id}/run",
];

/// The deadlines; a value so tests can shorten them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    pub request: Duration,
    pub submission: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            request: REQUEST_TIMEOUT,
            submission: SUBMISSION_TIMEOUT,
        }
    }
}

impl Deadlines {
    fn for_request(&self, request: &Request) -> Duration {
        let route = request.extensions().get::<MatchedPath>();
        let waits = request.method() == Method::POST
            && route.is_some_and(|r| WAITING_ROUTES.contains(&r.as_str()));
        if waits { self.submission } else { self.request }
    }

    /// Runs the request under its deadline. Like tower-http's
    /// `TimeoutLayer`, but with the deadline chosen per route (above), and
    /// the answer in the API's error body. The handler's future is dropped
    /// at the deadline; nothing it stored is undone.
    pub(crate) async fn enforce(self, request: Request, next: Next) -> Response {
        let limit = self.for_request(&request);
        match tokio::time::timeout(limit, next.run(request)).await {
            Ok(response) => response,
            Err(_) => {
                tracing::warn!(limit_secs = limit.as_secs_f64(), "request timed out");
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "the request took longer than {} s and was abandoned",
                        limit.as_secs_f64()
                    ),
                )
                .into_response()
            }
        }
    }
}

/// Gives an error answered by a layer or by axum itself (a body over the
/// limit refused by its `Content-Length`, a 405 on a route merged from
/// another router, a path that is not valid UTF-8) the API's one error
/// body, keeping its status and headers. Handlers' own errors are JSON
/// already and pass untouched.
pub(crate) async fn json_error_body(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096)
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    let (code, fallback) = match status {
        StatusCode::BAD_REQUEST => ("bad_request", "the request is malformed"),
        StatusCode::NOT_FOUND => ("not_found", "no such route"),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "the route exists but not with this method",
        ),
        StatusCode::REQUEST_TIMEOUT => ("request_timeout", "the request took too long"),
        StatusCode::PAYLOAD_TOO_LARGE => ("payload_too_large", "the request body is too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ("unsupported_media_type", "unsupported content type")
        }
        StatusCode::UNPROCESSABLE_ENTITY => ("invalid_request", "the request is invalid"),
        s if s.is_server_error() => ("unavailable", "the service could not answer"),
        _ => ("bad_request", "the request was refused"),
    };
    let message = match (status, text) {
        (StatusCode::PAYLOAD_TOO_LARGE, _) => format!(
            "request body is larger than {} bytes",
            crate::MAX_BODY_BYTES
        ),
        (_, Some(text)) => text,
        (_, None) => fallback.to_owned(),
    };
    let json = ApiError::new(status, code, message).into_response();
    let (json_parts, json_body) = json.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        json_parts
            .headers
            .get(header::CONTENT_TYPE)
            .cloned()
            .unwrap_or(HeaderValue::from_static("application/json")),
    );
    Response::from_parts(parts, Body::new(json_body))
}
