//! The web dashboard at `/ui`: its files, compiled into the binary, and the
//! session routes that trade an API token for a cookie (see `session`).
//!
//! The files are plain ES modules and one stylesheet with no build step,
//! so what is in `ui/` is what the browser runs (docs/dashboard.md says
//! why). They are embedded with `include_bytes!` through the table below:
//! the service works with no network and nothing to install, and a file
//! that exists in `ui/` but not in the table is caught by a test.

use std::sync::LazyLock;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use orchestrator_core::access::Role;
use orchestrator_engine::access::Principal;
use serde::Serialize;
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::error::ErrorBody;
use crate::session::{self, Session};
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(index))
        .routes(routes!(index_slash))
        .routes(routes!(current_session, create_session))
        .routes(routes!(logout))
        // `{*path}` takes the rest of the path (`js/app.js`); OpenAPI has no
        // such parameter, so the document declares it as `/ui/{path}`
        // (`routes::document`) and the route is added here by hand.
        .route("/ui/{*path}", axum::routing::get(file))
}

/// One embedded file.
pub(crate) struct Asset {
    /// Under `/ui/`.
    pub path: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $content_type:literal) => {
        Asset {
            path: $path,
            content_type: $content_type,
            bytes: include_bytes!(concat!("../../ui/", $path)),
        }
    };
}

/// Every file of `ui/`; the page first ([`INDEX`]).
pub(crate) const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("app.js", "text/javascript; charset=utf-8"),
    asset!("api.js", "text/javascript; charset=utf-8"),
    asset!("live.js", "text/javascript; charset=utf-8"),
    asset!("dom.js", "text/javascript; charset=utf-8"),
    asset!("dag.js", "text/javascript; charset=utf-8"),
    asset!("gantt.js", "text/javascript; charset=utf-8"),
    asset!("page-workflows.js", "text/javascript; charset=utf-8"),
    asset!("page-workflow.js", "text/javascript; charset=utf-8"),
    asset!("page-submit.js", "text/javascript; charset=utf-8"),
    asset!("page-nodes.js", "text/javascript; charset=utf-8"),
    asset!("page-audit.js", "text/javascript; charset=utf-8"),
    asset!("page-schedules.js", "text/javascript; charset=utf-8"),
    asset!("cron-words.js", "text/javascript; charset=utf-8"),
    asset!("page-environments.js", "text/javascript; charset=utf-8"),
    asset!("page-storage.js", "text/javascript; charset=utf-8"),
    asset!("page-access.js", "text/javascript; charset=utf-8"),
    asset!("page-approvals.js", "text/javascript; charset=utf-8"),
    asset!("page-locks.js", "text/javascript; charset=utf-8"),
    asset!("page-notifications.js", "text/javascript; charset=utf-8"),
    asset!("page-compare.js", "text/javascript; charset=utf-8"),
];

/// For working on the dashboard: a debug build started with
/// `ORCHESTRATOR_UI_DIR=crates/orchestrator-api/ui` reads the files of the
/// table above from that directory at each request, so an edit shows on
/// the next reload without a rebuild. A release build has no such hook:
/// what it serves is what it was built with.
#[cfg(debug_assertions)]
static UI_DIR: LazyLock<Option<std::path::PathBuf>> =
    LazyLock::new(|| std::env::var_os("ORCHESTRATOR_UI_DIR").map(Into::into));

/// The page itself, in [`ASSETS`].
const INDEX: usize = 0;

/// Each asset's ETag (a digest of its bytes), so a browser revalidates
/// with a cheap 304 instead of downloading again.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| {
            let digest = orchestrator_core::access::hex(&Sha256::digest(a.bytes));
            format!("\"{}\"", &digest[..20])
        })
        .collect()
});

/// The page may load its own files and call its own origin, nothing else:
/// no inline script or style, no other site, no framing. What an injected
/// string could run, it cannot.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// The dashboard's page. Needs no token; the page signs in itself.
#[utoipa::path(get, path = "/ui", tag = "dashboard",
    extensions(("x-role" = json!("open"))),
    params(("If-None-Match" = Option<String>, Header, description = "The ETag of a copy the client has")),
    responses(
        (status = 200, description = "The page", content_type = "text/html; charset=utf-8", body = String,
            headers(("etag" = String, description = "Send it back as `If-None-Match` to revalidate"))),
        (status = 304, description = "The copy the client has is current"),
    ))]
pub(crate) async fn index(headers: HeaderMap) -> Response {
    serve(INDEX, &headers)
}

/// The dashboard's page, as at `/ui`.
#[utoipa::path(get, path = "/ui/", tag = "dashboard",
    extensions(("x-role" = json!("open"))),
    params(("If-None-Match" = Option<String>, Header, description = "The ETag of a copy the client has")),
    responses(
        (status = 200, description = "The page", content_type = "text/html; charset=utf-8", body = String),
        (status = 304, description = "The copy the client has is current"),
    ))]
pub(crate) async fn index_slash(headers: HeaderMap) -> Response {
    serve(INDEX, &headers)
}

/// A file of the dashboard (script, stylesheet, icon), or the page itself
/// for a path without an extension, so that a link to a page under `/ui/`
/// opens the dashboard.
#[utoipa::path(get, path = "/ui/{path}", tag = "dashboard",
    extensions(("x-role" = json!("open"))),
    params(
        ("path" = String, Path, description = "A file under /ui/, e.g. app.js"),
        ("If-None-Match" = Option<String>, Header, description = "The ETag of a copy the client has"),
    ),
    responses(
        (status = 200, description = "The file", content(
            (String = "text/javascript; charset=utf-8"),
            (String = "text/css; charset=utf-8"),
            (String = "image/svg+xml"),
            (String = "text/html; charset=utf-8"),
        )),
        (status = 304, description = "The copy the client has is current"),
        (status = 404, description = "No such file", body = ErrorBody),
    ))]
pub(crate) async fn file(Path(path): Path<String>, headers: HeaderMap) -> Response {
    if let Some(index) = ASSETS.iter().position(|a| a.path == path) {
        return serve(index, &headers);
    }
    let last = path.rsplit('/').next().unwrap_or_default();
    if last.contains('.') {
        return ApiError::not_found(format!("no dashboard file {path}")).into_response();
    }
    serve(INDEX, &headers)
}

fn serve(index: usize, request: &HeaderMap) -> Response {
    let asset = &ASSETS[index];
    #[cfg(debug_assertions)]
    if let Some(dir) = UI_DIR.as_ref() {
        // Only the table's own paths are read, so no request names a file
        // outside the directory; no ETag, since the file may change.
        let response = match std::fs::read(dir.join(asset.path)) {
            Ok(bytes) => bytes.into_response(),
            Err(e) => return ApiError::not_found(format!("{}: {e}", asset.path)).into_response(),
        };
        return with_headers(response, asset, None);
    }
    let etag = &ETAGS[index];
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
    let response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        asset.bytes.into_response()
    };
    with_headers(response, asset, Some(etag))
}

fn with_headers(mut response: Response, asset: &Asset, etag: Option<&str>) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    if let Some(Ok(etag)) = etag.map(HeaderValue::from_str) {
        headers.insert(header::ETAG, etag);
    }
    // Always revalidate: a new binary serves new files at the same URLs.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// Who the dashboard speaks for: the answer of both session routes.
#[derive(Serialize, ToSchema)]
pub(crate) struct SessionView {
    /// The token's name (`local` without auth).
    name: String,
    role: Option<Role>,
    /// Whether the service requires tokens; `false` with `--no-auth`.
    auth: bool,
    /// When the session ends; `null` without a session cookie.
    expires_at: Option<DateTime<Utc>>,
    /// To send as `X-CSRF-Token` with every change made with the cookie;
    /// `null` without a session cookie.
    csrf_token: Option<String>,
}

fn session_view(principal: &Principal, session: Option<&Session>, auth: bool) -> SessionView {
    SessionView {
        name: principal.actor.clone(),
        role: principal.role,
        auth,
        expires_at: session.map(|s| s.expires_at),
        csrf_token: session.map(|s| s.csrf.clone()),
    }
}

fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Trades the bearer token for a session cookie (`HttpOnly;
/// SameSite=Strict`, 12 h).
///
/// The token comes in the `Authorization` header (the guard has checked
/// it, and it is never in a URL or a body that might be logged); the
/// answer sets the cookie and gives the page its CSRF token.
#[utoipa::path(post, path = "/ui/session", tag = "dashboard", extensions(("x-role" = json!("viewer")), ("x-audit" = json!("ui.sign_in"))),
    responses(
    (status = 200, description = "Signed in; the cookie is in `Set-Cookie` (none without auth)", body = SessionView,
        headers(("set-cookie" = String, description = "orch_session=...; Max-Age=43200; Path=/; HttpOnly; SameSite=Strict"))),
))]
pub(crate) async fn create_session(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
) -> Result<Response, ApiError> {
    let Some(Extension(principal)) = principal else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send the API token as `Authorization: Bearer <token>`",
        ));
    };
    let auth = state.engine.access().config().auth;
    let Some(token_id) = principal.token_id.as_deref().filter(|_| auth) else {
        // Auth is off: there is no token to stand for, and none is needed.
        return Ok(no_store(
            Json(session_view(&principal, None, auth)).into_response(),
        ));
    };
    // The session is a record of its own, stored before its cookie is
    // handed out, so that signing out can end it in the store.
    let now = Utc::now();
    let record = state
        .engine
        .access()
        .start_session(token_id, session::expiry(now))
        .await?;
    let (session, cookie) = state.sessions.issue(&record.id, now);
    let mut response = Json(session_view(&principal, Some(&session), auth)).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, state.sessions.set_cookie(&cookie));
    Ok(no_store(response))
}

/// Who the session cookie (or bearer token) is; for a cookie, its CSRF
/// token again.
///
/// The page keeps the CSRF token in memory only, so it asks after a
/// reload. Another site cannot read this answer (no CORS) and its pages
/// never send the cookie (`SameSite=Strict`).
#[utoipa::path(get, path = "/ui/session", tag = "dashboard", extensions(("x-role" = json!("optional"))),
    responses(
    (status = 200, description = "Signed in", body = SessionView),
))]
pub(crate) async fn current_session(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    session: Option<Extension<Session>>,
) -> Result<Response, ApiError> {
    // The guard lets this route through without a credential (see
    // `auth::need`), and has put the caller's principal here if there is
    // one. A script's task token has no role, and no session either.
    let Some(Extension(principal)) = principal.filter(|p| p.0.role.is_some()) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "not signed in: sign in with POST /ui/session",
        ));
    };
    let auth = state.engine.access().config().auth;
    let session = session.map(|Extension(s)| s);
    Ok(no_store(
        Json(session_view(&principal, session.as_ref(), auth)).into_response(),
    ))
}

/// Ends the session and clears its cookie. Needs no token.
///
/// The session's record is ended in the store, so its cookie, even a copy
/// kept elsewhere, is refused from now on by this node and, within their
/// token cache's age (5 s), by the others. Revoking the token ends every
/// session made with it.
#[utoipa::path(post, path = "/ui/logout", tag = "dashboard", extensions(("x-role" = json!("open")), ("x-audit" = json!("ui.sign_out"))),
    responses(
    (status = 204, description = "The session is ended and the cookie cleared",
        headers(("set-cookie" = String, description = "orch_session=; Max-Age=0; ..."))),
))]
pub(crate) async fn logout(
    State(state): State<AppState>,
    session: Option<Extension<Session>>,
) -> Result<Response, ApiError> {
    if let Some(Extension(session)) = session {
        state.engine.access().end_session(&session.token_id).await?;
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, state.sessions.clear_cookie());
    Ok(no_store(response))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_file_of_the_ui_directory_is_embedded() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.path.to_owned()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
        assert_eq!(ASSETS[INDEX].path, "index.html");
    }

    #[test]
    fn the_page_refers_only_to_embedded_files() {
        // Every `/ui/<file>` and `./<file>.js` the files name is in the table.
        for asset in ASSETS {
            let text = std::str::from_utf8(asset.bytes).unwrap();
            for piece in text.split(['"', '\'']) {
                let named = piece
                    .strip_prefix("/ui/")
                    .or_else(|| piece.strip_prefix("./"))
                    .filter(|p| p.ends_with(".js") || p.ends_with(".css") || p.ends_with(".svg"));
                if let Some(name) = named {
                    assert!(
                        ASSETS.iter().any(|a| a.path == name),
                        "{} refers to {name}, which is not embedded",
                        asset.path
                    );
                }
            }
        }
    }
}
