//! `/schedules`: recurring runs of a template (create, list, show, change,
//! delete), each with its OpenAPI declaration.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use orchestrator_core::ScheduleId;
use orchestrator_core::schedule::{CatchUp, Overlap};
use orchestrator_engine::{SchedulePatch, ScheduleRequest, ScheduleView};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::error::{ErrorBody, StorageUnavailable};
use crate::extract::{JsonBody, Submitter};
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_schedules, create_schedule))
        .routes(routes!(preview_schedule))
        .routes(routes!(get_schedule, update_schedule, delete_schedule))
}

fn parse_schedule_id(raw: &str) -> Result<ScheduleId, ApiError> {
    raw.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "`{raw}` is not a valid schedule id (expected a UUID)"
        ))
    })
}

/// `POST /schedules`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "template": "servers-create",
    "vars": {"infra": "demo", "servers": ["web-01"]},
    "cron": "0 2 * * *",
    "timezone": "Europe/Berlin"
}))]
pub(crate) struct NewSchedule {
    /// Default: the template's `ref_name`.
    name: Option<String>,
    #[schema(value_type = String)]
    template: TemplateName,
    /// Its `schema_version`; the newest at each run when absent.
    #[schema(minimum = 0, maximum = 4294967295u32)]
    version: Option<u32>,
    #[serde(default)]
    vars: Map<String, Value>,
    /// Five fields, or six with seconds first.
    #[schema(example = "0 2 * * *")]
    cron: String,
    /// An IANA time zone; default `UTC`.
    #[schema(example = "Europe/Berlin")]
    timezone: Option<String>,
    #[serde(default)]
    overlap: Overlap,
    #[serde(default)]
    catch_up: CatchUp,
    /// Default 86400 (the engine's bounds).
    #[schema(minimum = 1, maximum = 31622400)]
    catch_up_window_secs: Option<u32>,
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
    #[serde(default)]
    paused: bool,
}

/// A registered template's `ref_name`: a schedule runs what the service
/// knows, so that a changed file is what its next run uses.
struct TemplateName(String);

impl<'de> Deserialize<'de> for TemplateName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(name) => Ok(TemplateName(name)),
            _ => Err(serde::de::Error::custom(
                "a schedule runs a registered template: give its ref_name",
            )),
        }
    }
}

/// `PATCH /schedules/{id}`: the fields to change; `null` clears `version`,
/// `start_at` and `end_at`, and leaves the others as they are.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScheduleChange {
    name: Option<String>,
    #[schema(value_type = Option<String>)]
    template: Option<TemplateName>,
    #[serde(default, deserialize_with = "nullable")]
    #[schema(minimum = 0, maximum = 4294967295u32)]
    version: Option<Option<u32>>,
    vars: Option<Map<String, Value>>,
    cron: Option<String>,
    timezone: Option<String>,
    overlap: Option<Overlap>,
    catch_up: Option<CatchUp>,
    #[schema(minimum = 1, maximum = 31622400)]
    catch_up_window_secs: Option<u32>,
    #[serde(default, deserialize_with = "nullable")]
    start_at: Option<Option<DateTime<Utc>>>,
    #[serde(default, deserialize_with = "nullable")]
    end_at: Option<Option<DateTime<Utc>>>,
    paused: Option<bool>,
}

/// A field that is present (`Some`), possibly `null` (`Some(None)`); an
/// absent one is `None` through `#[serde(default)]`.
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// Creates a schedule.
#[utoipa::path(post, path = "/schedules", tag = "schedules",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("schedule.create"))),
    request_body = NewSchedule,
    responses(
        (status = 201, description = "Stored; its first run comes at `next_due`", body = ScheduleView, links(
            ("get" = (operation_id = "get_schedule", parameters(("id" = "$response.body#/id")))),
            ("update" = (operation_id = "update_schedule", parameters(("id" = "$response.body#/id")))),
            ("delete" = (operation_id = "delete_schedule", parameters(("id" = "$response.body#/id")))),
        )),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A bad cron expression, time zone, template or input; the message names the field", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn create_schedule(
    State(state): State<AppState>,
    Submitter(submitted_by): Submitter,
    JsonBody(body): JsonBody<NewSchedule>,
) -> Result<Response, ApiError> {
    let view = state
        .engine
        .create_schedule(ScheduleRequest {
            name: body.name,
            template: body.template.0,
            version: body.version,
            vars: body.vars,
            cron: body.cron,
            timezone: body.timezone,
            overlap: body.overlap,
            catch_up: body.catch_up,
            catch_up_window_secs: body.catch_up_window_secs.map(u64::from),
            start_at: body.start_at,
            end_at: body.end_at,
            paused: body.paused,
            submitted_by,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ScheduleList {
    /// Oldest first; `runs` is empty in listings.
    pub schedules: Vec<ScheduleView>,
}

/// Every schedule, oldest first.
#[utoipa::path(get, path = "/schedules", tag = "schedules",
    extensions(("x-role" = json!("viewer"))),
    responses(
        (status = 200, description = "The schedules", body = ScheduleList),
        StorageUnavailable,
    ))]
pub(crate) async fn list_schedules(
    State(state): State<AppState>,
) -> Result<Json<ScheduleList>, ApiError> {
    let schedules = state.engine.list_schedules().await?;
    Ok(Json(ScheduleList { schedules }))
}

/// One schedule with its newest runs.
#[utoipa::path(get, path = "/schedules/{id}", tag = "schedules",
    extensions(("x-role" = json!("viewer"))),
    params(("id" = uuid::Uuid, Path, description = "Schedule id")),
    responses(
        (status = 200, description = "The schedule", body = ScheduleView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn get_schedule(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(state.engine.schedule(parse_schedule_id(&id)?).await?))
}

/// Changes a schedule: pause, resume, a new cron expression, ...
#[utoipa::path(patch, path = "/schedules/{id}", tag = "schedules",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("schedule.update"))),
    params(("id" = uuid::Uuid, Path, description = "Schedule id")),
    request_body = ScheduleChange,
    responses(
        (status = 200, description = "The schedule after the change", body = ScheduleView),
        (status = 400, description = "The id is not a UUID, or the body is empty or malformed", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The change is invalid; the message names the field", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn update_schedule(
    State(state): State<AppState>,
    Submitter(changed_by): Submitter,
    Path(id): Path<String>,
    JsonBody(change): JsonBody<ScheduleChange>,
) -> Result<Json<ScheduleView>, ApiError> {
    let id = parse_schedule_id(&id)?;
    let patch = SchedulePatch {
        name: change.name,
        template: change.template.map(|t| t.0),
        version: change.version,
        vars: change.vars,
        cron: change.cron,
        timezone: change.timezone,
        overlap: change.overlap,
        catch_up: change.catch_up,
        catch_up_window_secs: change.catch_up_window_secs.map(u64::from),
        start_at: change.start_at,
        end_at: change.end_at,
        paused: change.paused,
    };
    Ok(Json(
        state.engine.update_schedule(id, patch, changed_by).await?,
    ))
}

/// `POST /schedules/preview`: the times of a schedule not yet stored.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"cron": "0 2 * * *", "timezone": "Europe/Berlin"}))]
pub(crate) struct SchedulePreviewRequest {
    /// Five fields, or six with seconds first.
    #[schema(example = "0 2 * * *")]
    cron: String,
    /// An IANA time zone; default `UTC`.
    #[schema(example = "Europe/Berlin")]
    timezone: Option<String>,
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
}

/// When a schedule with these times would run.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SchedulePreview {
    /// The next three due times after now (and not before `start_at`,
    /// not after `end_at`), oldest first, in UTC.
    pub next_runs: Vec<DateTime<Utc>>,
}

/// The next due times of a cron expression in a time zone, before a
/// schedule is created: the service's own cron engine and zone database,
/// as the scheduler will read them.
#[utoipa::path(post, path = "/schedules/preview", tag = "schedules",
    extensions(("x-role" = json!("viewer"))),
    request_body = SchedulePreviewRequest,
    responses(
        (status = 200, description = "The next three due times", body = SchedulePreview),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A bad cron expression or time zone, or `end_at` not after `start_at`; the message names the field", body = ErrorBody),
    ))]
pub(crate) async fn preview_schedule(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<SchedulePreviewRequest>,
) -> Result<Json<SchedulePreview>, ApiError> {
    let next_runs = state.engine.preview_schedule(
        &body.cron,
        body.timezone.as_deref().unwrap_or("UTC"),
        body.start_at,
        body.end_at,
    )?;
    Ok(Json(SchedulePreview { next_runs }))
}

/// Deletes a schedule; runs already started go on.
#[utoipa::path(delete, path = "/schedules/{id}", tag = "schedules",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("schedule.delete"))),
    params(("id" = uuid::Uuid, Path, description = "Schedule id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such schedule", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn delete_schedule(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state
        .engine
        .delete_schedule(parse_schedule_id(&id)?)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
