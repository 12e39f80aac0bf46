//! `GET /openapi.json`: the document, made from the operations' own
//! declarations (`openapi` gives it its base and the door's answers).

use std::sync::LazyLock;

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::openapi;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// This document. Needs no token.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", extensions(("x-role" = json!("open"))),
    responses(
    (status = 200, description = "The OpenAPI document", body = Object),
))]
pub(crate) async fn openapi_json() -> Response {
    static DOCUMENT: LazyLock<Value> = LazyLock::new(document);
    Json(&*DOCUMENT).into_response()
}

/// Every operation comes from the router (`super::operations`) but the
/// dashboard's files: their route is a catch-all, which OpenAPI cannot
/// say, so it is declared here as `/ui/{path}`.
#[derive(OpenApi)]
#[openapi(paths(super::dashboard::file))]
struct CatchAll;

/// The document as utoipa's model.
pub(crate) fn document_model() -> utoipa::openapi::OpenApi {
    let operations = super::operations()
        .into_openapi()
        .merge_from(CatchAll::openapi());
    openapi::assemble(operations)
}

/// The document, as JSON.
pub(crate) fn document() -> Value {
    openapi::to_json(&document_model())
}
