//! Workflows: listing and counts, one workflow, cancel, retry, rerun,
//! pause and resume, two compared; submissions from a template, and
//! their validation.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use orchestrator_core::compare::Comparison;
use orchestrator_core::{Priority, WorkflowId, WorkflowStatus};
use orchestrator_engine::{Engine, Meta, SubmitRequest, TemplateSource, WorkflowView};
use orchestrator_storage::WorkflowQuery;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::{next_after, page_bounds, parse_workflow_id, with_lookahead};
use crate::error::{ErrorBody, ShuttingDownOrStorageUnavailable, StorageUnavailable};
use crate::extract::{JsonBody, QueryParams, Submitter};
use crate::{ApiError, AppState, DEFAULT_WAIT, MAX_WAIT};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_workflows, submit_workflow))
        .routes(routes!(validate_workflow))
        .routes(routes!(count_workflows))
        .routes(routes!(get_workflow))
        .routes(routes!(cancel_workflow))
        .routes(routes!(retry_workflow))
        .routes(routes!(rerun_workflow))
        .routes(routes!(pause_workflow))
        .routes(routes!(resume_workflow))
        .routes(routes!(compare_workflows))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct WorkflowListParams {
    /// Only workflows in this status.
    #[param(value_type = Option<WorkflowStatus>)]
    status: Option<String>,
    /// Only workflows of this template ref_name.
    template: Option<String>,
    /// Only revisions of this meta.ref.
    #[serde(rename = "ref")]
    reference: Option<String>,
    /// Only workflows with this meta.trace_id.
    trace_id: Option<String>,
    /// Only workflows whose name, template, meta.ref or one of whose input
    /// values holds this text, ignoring case (at most 200 characters, no
    /// control characters; empty means no filter).
    #[param(max_length = 200, pattern = r"^[^\x00-\x1F\x7F-\x9F]*$")]
    q: Option<String>,
    /// Page size, default 50.
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
    /// Records to skip.
    #[param(minimum = 0, maximum = 4294967295u32)]
    offset: Option<u32>,
    /// Keyset paging: only workflows after this one in the listing (older
    /// than it), usually the previous page's `next_after`. Exact while
    /// workflows are added, where `offset` shifts. The workflow need not
    /// exist any more.
    #[param(value_type = Option<uuid::Uuid>)]
    after: Option<String>,
}

/// A workflow without its tasks, for listings.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkflowSummary {
    pub id: WorkflowId,
    /// The template's `ref_name`.
    pub template: String,
    pub name: String,
    pub status: WorkflowStatus,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    pub revision: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    pub task_count: usize,
    /// Paused by an operator: no new step of it starts until it is resumed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// A page of workflows, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkflowList {
    pub workflows: Vec<WorkflowSummary>,
    /// How many workflows match, in all pages (`after` aside).
    pub total: usize,
    pub limit: usize,
    pub offset: usize,
    /// The `after` of the next page; absent on the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<WorkflowId>,
}

/// Workflows, newest first.
#[utoipa::path(get, path = "/workflows", tag = "workflows",
    extensions(("x-role" = json!("viewer"))),
    params(WorkflowListParams),
    responses(
        (status = 200, description = "A page of workflows", body = WorkflowList),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn list_workflows(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<WorkflowListParams>,
) -> Result<Json<WorkflowList>, ApiError> {
    let (limit, offset) = page_bounds(params.limit, params.offset)?;
    let status = params
        .status
        .as_deref()
        .map(|s| {
            s.parse::<WorkflowStatus>()
                .map_err(|e| ApiError::bad_request(format!("status: {e}")))
        })
        .transpose()?;
    let query = WorkflowQuery {
        status,
        kind: params.template,
        reference: params.reference,
        trace_id: params.trace_id,
        idempotency_key: None,
        text: search_text(params.q)?,
        after: params
            .after
            .as_deref()
            .map(|a| {
                parse_workflow_id(a)
                    .map_err(|e| ApiError::bad_request(format!("after: {}", e.message)))
            })
            .transpose()?,
        limit: with_lookahead(limit),
        offset,
    };
    let mut page = state.engine.list_workflows(&query).await?;
    let next_after = next_after(&mut page.items, limit, |w| w.id);
    let workflows: Vec<WorkflowSummary> = page
        .items
        .into_iter()
        .map(|w| WorkflowSummary {
            id: w.id,
            template: w.kind,
            name: w.name,
            status: w.status,
            reference: w.reference,
            revision: w.revision,
            trace_id: w.trace_id,
            created_at: w.created_at,
            finished_at: w.finished_at,
            task_count: w.task_ids.len(),
            paused: w.paused,
        })
        .collect();
    Ok(Json(WorkflowList {
        workflows,
        total: page.total,
        limit,
        offset,
        next_after,
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct CountParams {
    /// Only workflows of this template ref_name.
    template: Option<String>,
    /// Only revisions of this meta.ref.
    #[serde(rename = "ref")]
    reference: Option<String>,
    /// Only workflows with this meta.trace_id.
    trace_id: Option<String>,
    /// Only workflows whose name, template, meta.ref or one of whose input
    /// values holds this text, ignoring case (at most 200 characters, no
    /// control characters; empty means no filter).
    #[param(max_length = 200, pattern = r"^[^\x00-\x1F\x7F-\x9F]*$")]
    q: Option<String>,
}

/// The longest `q` a listing takes, in characters.
const MAX_SEARCH: usize = 200;

/// The `q` of a listing: `None` when absent or blank; refused when longer
/// than [`MAX_SEARCH`] or holding a control character (a line break would
/// let a needle span two values of the searched text).
fn search_text(q: Option<String>) -> Result<Option<String>, ApiError> {
    let Some(q) = q else { return Ok(None) };
    let chars = q.chars().count();
    if chars > MAX_SEARCH {
        return Err(ApiError::bad_request(format!(
            "q: {chars} characters is more than the maximum of {MAX_SEARCH}"
        )));
    }
    if let Some(c) = q.chars().find(|c| c.is_control()) {
        return Err(ApiError::bad_request(format!(
            "q: the control character {c:?} is not allowed"
        )));
    }
    let q = q.trim();
    Ok((!q.is_empty()).then(|| q.to_owned()))
}

/// Workflows by status.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkflowCounts {
    /// Every status, with how many workflows are in it.
    pub counts: BTreeMap<Cow<'static, str>, usize>,
    /// The sum of `counts`.
    pub total: usize,
}

/// How many workflows are in each status, with the listing's other
/// filters, for the dashboard's counters.
#[utoipa::path(get, path = "/workflows/counts", tag = "workflows",
    extensions(("x-role" = json!("viewer"))),
    params(CountParams),
    responses(
        (status = 200, description = "The counts", body = WorkflowCounts),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn count_workflows(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<CountParams>,
) -> Result<Json<WorkflowCounts>, ApiError> {
    let base = WorkflowQuery {
        kind: params.template,
        reference: params.reference,
        trace_id: params.trace_id,
        text: search_text(params.q)?,
        ..WorkflowQuery::default()
    };
    let counts = state.engine.count_workflows_by_status(&base).await?;
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    let counts = counts
        .into_iter()
        .map(|(status, n)| (Cow::Borrowed(status.as_str()), n))
        .collect();
    Ok(Json(WorkflowCounts { counts, total }))
}

/// One workflow with its steps, edges and tasks.
#[utoipa::path(get, path = "/workflows/{id}", tag = "workflows",
    extensions(("x-role" = json!("viewer"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn get_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(state.engine.workflow(parse_workflow_id(&id)?).await?))
}

/// Compares two runs of one template (two workflows, or two revisions of
/// one): inputs, template revision, and step by step (matched by step,
/// `for_each` instances by their values) the status, duration, script
/// hash, changed outputs and the first differing line of the logs. Logs
/// are compared up to `limits` (the first 64 KiB and 2,000 lines of each);
/// `capped` says when a log went on past them.
#[utoipa::path(get, path = "/workflows/{a}/compare/{b}", tag = "workflows",
    extensions(("x-role" = json!("viewer"))),
    params(
        ("a" = uuid::Uuid, Path, description = "The first workflow's id"),
        ("b" = uuid::Uuid, Path, description = "The workflow to compare it with"),
    ),
    responses(
        (status = 200, description = "The two runs side by side", body = Comparison),
        (status = 400, description = "An id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 422, description = "The workflows run different templates", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn compare_workflows(
    State(state): State<AppState>,
    Path((a, b)): Path<(String, String)>,
) -> Result<Json<Comparison>, ApiError> {
    let (a, b) = (parse_workflow_id(&a)?, parse_workflow_id(&b)?);
    Ok(Json(state.engine.compare_workflows(a, b).await?))
}

/// Cancels a workflow.
#[utoipa::path(post, path = "/workflows/{id}/cancel", tag = "workflows",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.cancel"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow after the request", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow already finished", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn cancel_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(
        state
            .engine
            .cancel_workflow(parse_workflow_id(&id)?)
            .await?,
    ))
}

/// Pauses a workflow: no new step of it starts (queued ones stay queued)
/// until it is resumed; running steps finish. Pausing a paused workflow
/// changes nothing.
#[utoipa::path(post, path = "/workflows/{id}/pause", tag = "workflows",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.pause"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow, paused", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow already finished", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn pause_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(
        state.engine.pause_workflow(parse_workflow_id(&id)?).await?,
    ))
}

/// Resumes a paused workflow: its queued steps may start again. Resuming
/// a workflow that is not paused changes nothing.
#[utoipa::path(post, path = "/workflows/{id}/resume", tag = "workflows",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.resume"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow, no longer paused", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn resume_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(
        state
            .engine
            .resume_workflow(parse_workflow_id(&id)?)
            .await?,
    ))
}

/// Re-runs what did not complete in a finished workflow.
#[utoipa::path(post, path = "/workflows/{id}/retry", tag = "workflows",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.retry"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow, running again", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "Not finished, or nothing to retry", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn retry_workflow(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<WorkflowView>, ApiError> {
    Ok(Json(
        state.engine.retry_workflow(parse_workflow_id(&id)?).await?,
    ))
}

/// `POST /workflows/{id}/rerun`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Rerun {
    /// The `ref_name` of the first step to run again.
    from: String,
    /// Whether the steps after `from` run again too; default true.
    #[serde(default = "yes")]
    #[schema(default = true)]
    include_downstream: bool,
    /// New inputs for the steps that run again, checked like a submission's.
    #[serde(default)]
    vars: Map<String, Value>,
}

fn yes() -> bool {
    true
}

/// Re-runs a finished workflow from a step, as a new revision.
#[utoipa::path(post, path = "/workflows/{id}/rerun", tag = "workflows",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.rerun"))),
    params(("id" = uuid::Uuid, Path, description = "Workflow id")),
    request_body = Rerun,
    responses(
        (status = 202, description = "The new revision, running; steps before `from` keep their outputs", body = WorkflowView),
        (status = 400, description = "The id is not a UUID, or the body is empty or malformed", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow has not finished", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "An unknown step, or bad `vars`; the message names the field", body = ErrorBody),
        ShuttingDownOrStorageUnavailable,
    ))]
pub(crate) async fn rerun_workflow(
    State(state): State<AppState>,
    Submitter(submitted_by): Submitter,
    Path(id): Path<String>,
    JsonBody(rerun): JsonBody<Rerun>,
) -> Result<Response, ApiError> {
    let request = orchestrator_engine::RerunRequest {
        from: rerun.from,
        include_downstream: rerun.include_downstream,
        vars: rerun.vars,
        submitted_by,
    };
    let view = state
        .engine
        .rerun_workflow(parse_workflow_id(&id)?, request)
        .await?;
    Ok((StatusCode::ACCEPTED, Json(view)).into_response())
}

/// `POST /workflows`: a template by name or inline, with inputs.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "template": "servers-create",
    "vars": {"infra": "demo", "servers": ["web-01"]},
    "meta": {"ref": "demo-web"},
    "check_mode": true
}))]
pub(crate) struct WorkflowSubmission {
    template: TemplateField,
    /// Pick a `schema_version` of a named template (newest by default).
    #[schema(minimum = 0, maximum = 4294967295u32)]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    version: Option<u32>,
    /// The template's inputs.
    #[serde(default)]
    vars: Map<String, Value>,
    #[serde(default)]
    meta: MetaField,
    schedule: Option<StartWhen>,
    /// Dry run: scripts are told to change nothing.
    #[serde(default)]
    check_mode: bool,
    #[serde(default)]
    priority: Priority,
    /// Attempts per task; the service default when absent (the engine's
    /// limits, which a test compares with these).
    #[schema(minimum = 1, maximum = 100)]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    max_attempts: Option<u32>,
    /// Per-attempt timeout in seconds (at most 30 days); the service
    /// default when absent.
    #[schema(minimum = 1, maximum = 2592000)]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    timeout_secs: Option<u32>,
    /// Most tasks of the workflow running at once; the template's when absent.
    #[schema(minimum = 1, maximum = 100000)]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    parallel_limit: Option<u32>,
    /// Answer only when the workflow has finished (or `wait_timeout_secs`
    /// passed, then with 202).
    #[serde(default)]
    wait: bool,
    /// The most seconds `wait` may block (default 120; more than 600
    /// waits 600).
    #[schema(minimum = 0, maximum = 4294967295u32)]
    #[serde(
        default,
        deserialize_with = "orchestrator_core::whole_number::option_u32"
    )]
    wait_timeout_secs: Option<u32>,
}

/// A template's `ref_name`, or a whole template object. Kept as JSON until
/// it is read, so that a bad inline template gets a message with its path.
#[derive(Deserialize)]
#[serde(transparent)]
pub(crate) struct TemplateField(Value);

/// What [`TemplateField`] accepts: a string or an object (the template
/// model of docs/templates.md, checked by the core with path-named errors).
impl utoipa::PartialSchema for TemplateField {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .description(Some("A registered template's `ref_name`")),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .description(Some("A whole template (see docs/templates.md)")),
            )
            .into()
    }
}

impl ToSchema for TemplateField {}

impl TemplateField {
    fn source(self, version: Option<u32>) -> Result<TemplateSource, ApiError> {
        match self.0 {
            serde_json::Value::String(ref_name) => Ok(TemplateSource::Named { ref_name, version }),
            inline @ serde_json::Value::Object(_) => {
                let template: orchestrator_core::template::Template =
                    crate::extract::from_value(inline).map_err(|mut e| {
                        e.message = format!("template.{}", e.message);
                        e
                    })?;
                Ok(TemplateSource::Inline(Box::new(template)))
            }
            _ => Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                "template: expected a template ref_name or a template object",
            )),
        }
    }
}

/// The caller's names for a submission.
#[derive(Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MetaField {
    /// The caller's own name for what this workflow does: a later
    /// submission with the same `ref` and another body is its next revision.
    #[serde(rename = "ref")]
    reference: Option<String>,
    trace_id: Option<String>,
    /// The workflow's name; the template's by default.
    name: Option<String>,
    description: Option<String>,
    /// How long to keep the workflow once finished, instead of the
    /// service's `--retain-finished`: `30d`, `12h`, or `forever`.
    retain: Option<orchestrator_core::retention::Keep>,
}

/// When a submission starts: `{"when": "now"}` or `{"when": "at",
/// "start": "<RFC 3339>"}`. (Not `Schedule`: that schema is a recurring
/// run's, `GET /schedules`; two types of one name would share a schema.)
#[derive(Deserialize, ToSchema)]
#[serde(tag = "when", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum StartWhen {
    Now,
    At { start: DateTime<Utc> },
}

impl WorkflowSubmission {
    fn into_request(
        self,
        body: serde_json::Value,
        idempotency_key: Option<String>,
    ) -> Result<SubmitRequest, ApiError> {
        let template = self.template.source(self.version)?;
        Ok(SubmitRequest {
            template,
            vars: self.vars,
            meta: Meta {
                reference: self.meta.reference,
                trace_id: self.meta.trace_id,
                name: self.meta.name,
                description: self.meta.description,
                retain: self.meta.retain,
                submitted_by: None,
            },
            start_at: match self.schedule {
                Some(StartWhen::At { start }) => Some(start),
                Some(StartWhen::Now) | None => None,
            },
            check_mode: self.check_mode,
            priority: self.priority,
            max_attempts: self.max_attempts,
            timeout: self.timeout_secs.map(|s| Duration::from_secs(s.into())),
            parallel_limit: self.parallel_limit.map(|n| n as usize),
            idempotency_key,
            body,
        })
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            ApiError::bad_request("Idempotency-Key: must be 1-255 visible ASCII characters")
        })?;
    Ok(Some(key.to_owned()))
}

/// Submits a workflow from a template.
#[utoipa::path(post, path = "/workflows", tag = "workflows",
    extensions(("x-role" = json!("operator")), ("x-audit" = json!("workflow.submit"))),
    params(("Idempotency-Key" = Option<String>, Header,
        description = "1-255 visible ASCII characters (spaces inside; around them, ignored); a repeat returns the first workflow",
        pattern = "^[\t ]*[!-~]([\t -~]{0,253}[!-~])?[\t ]*$")),
    request_body = WorkflowSubmission,
    responses(
        (status = 200, description = "With `wait`, the workflow finished; or a repeat (`idempotent-replayed: true`)", body = WorkflowView),
        (status = 202, description = "Stored and running", body = WorkflowView, links(
            ("get" = (operation_id = "get_workflow", parameters(("id" = "$response.body#/id")))),
            ("cancel" = (operation_id = "cancel_workflow", parameters(("id" = "$response.body#/id")))),
            ("retry" = (operation_id = "retry_workflow", parameters(("id" = "$response.body#/id")))),
            ("rerun" = (operation_id = "rerun_workflow", parameters(("id" = "$response.body#/id")))),
            ("task" = (operation_id = "get_task", parameters(("id" = "$response.body#/task_ids/0")))),
            ("task_logs" = (operation_id = "task_logs", parameters(("id" = "$response.body#/task_ids/0")))),
        )),
        (status = 400, description = "Empty body, malformed JSON, or a bad Idempotency-Key", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key was used for a different body", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The submission is invalid; the message names the field", body = ErrorBody),
        ShuttingDownOrStorageUnavailable,
    ))]
pub(crate) async fn submit_workflow(
    State(state): State<AppState>,
    Submitter(submitted_by): Submitter,
    headers: HeaderMap,
    JsonBody(body): JsonBody<Value>,
) -> Result<Response, ApiError> {
    let submission: WorkflowSubmission = parse_body(&body)?;
    let wait = wait_limit(submission.wait, submission.wait_timeout_secs.map(u64::from));
    let mut request = submission.into_request(body, idempotency_key(&headers)?)?;
    request.meta.submitted_by = submitted_by;
    submit(&state.engine, request, wait).await
}

/// A valid submission, and the workflow it would create.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Validated {
    /// Always `true`: an invalid one gets 422.
    pub valid: bool,
    pub workflow: WorkflowView,
}

/// Validates a submission and shows its DAG, storing nothing.
#[utoipa::path(post, path = "/workflows/validate", tag = "workflows",
    extensions(("x-role" = json!("viewer"))),
    request_body = WorkflowSubmission,
    responses(
        (status = 200, description = "Valid; the workflow it would create", body = Validated),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The submission is invalid", body = ErrorBody),
    ))]
pub(crate) async fn validate_workflow(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<Value>,
) -> Result<Json<Validated>, ApiError> {
    let submission: WorkflowSubmission = parse_body(&body)?;
    let workflow = state
        .engine
        .validate(&submission.into_request(body, None)?)
        .await?;
    Ok(Json(Validated {
        valid: true,
        workflow,
    }))
}

/// Typed view of a body already parsed as JSON, with the same 422 errors.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    crate::extract::from_value(body.clone())
}

/// How long to block for the outcome, if at all.
pub(super) fn wait_limit(wait: bool, secs: Option<u64>) -> Option<Duration> {
    wait.then(|| secs.map_or(DEFAULT_WAIT, Duration::from_secs).min(MAX_WAIT))
}

/// Submits and, with `wait`, blocks (up to the cap) for the outcome.
/// 201 for a new workflow, 200 for an idempotent repeat or a finished wait,
/// 202 while it still runs.
pub(super) async fn submit_and_wait(
    engine: &Engine,
    request: SubmitRequest,
    wait: Option<Duration>,
) -> Result<(StatusCode, bool, WorkflowView), ApiError> {
    let (view, replayed) = engine.submit(request).await?;
    let id = view.workflow.id;
    match wait {
        Some(limit) => {
            let finished = engine.wait_for_workflow(id, limit).await?;
            let view = engine.workflow(id).await?;
            Ok((
                if finished {
                    StatusCode::OK
                } else {
                    StatusCode::ACCEPTED
                },
                replayed,
                view,
            ))
        }
        None if replayed => Ok((StatusCode::OK, true, view)),
        None => Ok((StatusCode::ACCEPTED, false, view)),
    }
}

async fn submit(
    engine: &Engine,
    request: SubmitRequest,
    wait: Option<Duration>,
) -> Result<Response, ApiError> {
    let (status, replayed, view) = submit_and_wait(engine, request, wait).await?;
    let mut response = (status, Json(view)).into_response();
    if replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}
