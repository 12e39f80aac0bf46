//! The registered workflow templates.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use crate::error::ErrorBody;
use crate::extract::QueryParams;
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_templates))
        .routes(routes!(get_template))
}

/// A registered template, as listed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TemplateSummary {
    pub ref_name: String,
    pub schema_version: u32,
    pub name: String,
    pub description: Option<String>,
    /// Input name to its declaration (`type`, `default`, `description`,
    /// ...; see docs/templates.md).
    pub inputs: BTreeMap<String, Value>,
    /// The steps' `ref_name`s.
    pub steps: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<TemplateSummary>,
}

/// Every registered template, every version.
#[utoipa::path(get, path = "/templates", tag = "templates", extensions(("x-role" = json!("viewer"))),
    responses(
    (status = 200, description = "The templates", body = TemplateList),
))]
pub(crate) async fn list_templates(State(state): State<AppState>) -> Json<TemplateList> {
    let templates = state
        .engine
        .templates()
        .all()
        .map(|t| TemplateSummary {
            ref_name: t.ref_name.clone(),
            schema_version: t.schema_version,
            name: t.name.clone(),
            description: t.description.clone(),
            inputs: t
                .inputs
                .iter()
                .map(|(name, spec)| (name.clone(), serde_json::to_value(spec).unwrap_or_default()))
                .collect(),
            steps: t.steps.iter().map(|s| s.ref_name.clone()).collect(),
        })
        .collect();
    Json(TemplateList { templates })
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TemplateParams {
    /// A schema_version; the newest by default.
    #[param(minimum = 0, maximum = 4294967295u32)]
    version: Option<u32>,
}

/// One template: the whole model as parsed, defaults filled in. Its
/// schema is a free-form object: the template model (steps, inputs, http
/// blocks) is documented in docs/templates.md and checked by the core.
#[utoipa::path(get, path = "/templates/{ref_name}", tag = "templates",
    extensions(("x-role" = json!("viewer"))),
    params(("ref_name" = String, Path, description = "The template's ref_name"), TemplateParams),
    responses(
        (status = 200, description = "The template", body = Object),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 404, description = "No such template or version", body = ErrorBody),
    ))]
pub(crate) async fn get_template(
    State(state): State<AppState>,
    Path(ref_name): Path<String>,
    QueryParams(params): QueryParams<TemplateParams>,
) -> Result<Json<orchestrator_core::template::Template>, ApiError> {
    state
        .engine
        .templates()
        .get(&ref_name, params.version)
        .map(|t| Json((*t).clone()))
        .ok_or_else(|| ApiError::not_found(format!("template `{ref_name}` not found")))
}
