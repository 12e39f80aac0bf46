//! `GET /openapi.json`: the OpenAPI 3 document of the API, generated with
//! `utoipa` from the declarations below.
//!
//! The schemas mirror the wire shapes instead of deriving `ToSchema` on the
//! core's and engine's types: those crates must not know HTTP or how the
//! API documents itself, several of their types are serialized with
//! flattening or as free JSON, and what a client sees is the serialized
//! shape, which is what is declared here. The mirrors cannot drift
//! silently: the tests check that every route of the router is documented
//! with its methods, and that the objects the service really returns have
//! no field that their schema lacks.
//!
//! Each path is declared on a stub next to its schemas, not on the
//! handler, so the routes stay readable; the router is the single list of
//! routes, and the tests compare it with this document.

#![allow(dead_code)] // the mirrors and stubs exist for the document only

use std::collections::BTreeMap;

use axum::Json;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};
use uuid::Uuid;

/// `GET /openapi.json`.
pub(crate) async fn openapi_json() -> Response {
    Json(document()).into_response()
}

/// The document, as JSON.
pub fn document() -> Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_default()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "orchestrator",
        description = "Runs provisioning scripts as tasks and workflows. See docs/api.md for the prose.",
        license(name = "Apache-2.0"),
    ),
    paths(
        health, metrics, openapi,
        list_workflows, submit_workflow, validate_workflow, get_workflow, cancel_workflow, retry_workflow,
        rerun_workflow,
        crate::schedules::doc::list_schedules, crate::schedules::doc::create_schedule,
        crate::schedules::doc::get_schedule, crate::schedules::doc::update_schedule,
        crate::schedules::doc::delete_schedule,
        crate::testenv::doc::create_environment, crate::testenv::doc::list_environments, crate::testenv::doc::get_environment, crate::testenv::doc::run_environment, crate::testenv::doc::delete_environment, crate::testenv::doc::environment_logs, crate::testenv::doc::list_topologies, crate::testenv::doc::get_topology,
        create_servers, create_taskservs, create_cluster,
        list_templates, get_template,
        list_tasks, get_task, task_logs, cancel_task, get_checkpoint, save_checkpoint,
        events,
        list_nodes, count_workflows,
        dashboard, dashboard_slash, dashboard_file, get_session, create_session, logout,
        list_tokens, create_token, revoke_token, list_audit,
        list_secrets, put_secret, delete_secret,
        create_backup, prune,
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    modifiers(&BearerAuth),
    tags(
        (name = "workflows", description = "Submitting, watching, cancelling and retrying workflows"),
        (name = "tasks", description = "Tasks, their logs and checkpoints"),
        (name = "templates", description = "The registered workflow templates"),
        (name = "schedules", description = "Recurring runs of a template on a cron expression"),
        (name = "test", description = "Test environments: isolated nodes in Linux namespaces, made, checked and torn down as workflows"),
        (name = "operations", description = "Health, metrics, cluster nodes and this document"),
        (name = "admin", description = "API tokens, secrets, the audit log and backups (role admin)"),
        (name = "dashboard", description = "The web dashboard at /ui: its files, and the session cookie it signs in with"),
    ),
)]
struct ApiDoc;

/// Paths that need no token (the others need `Authorization: Bearer`, or
/// the dashboard's session cookie).
pub(crate) const OPEN_PATHS: &[&str] = &["/health", "/ui", "/ui/", "/ui/{path}", "/ui/logout"];

/// Declares the `bearerAuth` and `sessionCookie` schemes, requires either
/// everywhere, and lifts them from the open paths (an empty `security`
/// list).
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearerAuth",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API token: `Authorization: Bearer <token>`."))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "sessionCookie",
            SecurityScheme::ApiKey(utoipa::openapi::security::ApiKey::Cookie(
                utoipa::openapi::security::ApiKeyValue::with_description(
                    crate::session::COOKIE,
                    "The dashboard's session, from `POST /ui/session`. A request that changes \
                     something must also send `X-CSRF-Token` with the session's `csrf_token`.",
                ),
            )),
        );
        openapi.security = Some(
            ["bearerAuth", "sessionCookie"]
                .into_iter()
                .map(|scheme| {
                    utoipa::openapi::security::SecurityRequirement::new(
                        scheme,
                        Vec::<String>::new(),
                    )
                })
                .collect(),
        );
        for path in OPEN_PATHS {
            if let Some(item) = openapi.paths.paths.get_mut(*path) {
                for operation in [
                    &mut item.get,
                    &mut item.put,
                    &mut item.post,
                    &mut item.delete,
                    &mut item.patch,
                ]
                .into_iter()
                .flatten()
                {
                    operation.security = Some(Vec::new());
                }
            }
        }
        // What the door answers on every other route.
        let door = [
            ("401", "No token, or not a valid one"),
            ("403", "The token's role does not allow this"),
            ("429", "Over the token's rate limit; see `Retry-After`"),
        ];
        for (path, item) in openapi.paths.paths.iter_mut() {
            if OPEN_PATHS.contains(&path.as_str()) {
                continue;
            }
            for operation in [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ]
            .into_iter()
            .flatten()
            {
                for (status, description) in door {
                    let response = utoipa::openapi::ResponseBuilder::new()
                        .description(description)
                        .content(
                            "application/json",
                            utoipa::openapi::ContentBuilder::new()
                                .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                                .build(),
                        )
                        .build();
                    operation
                        .responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert(response.into());
                }
            }
        }
    }
}

// ---- shared schemas -------------------------------------------------------

/// The one error body of every failed request.
#[derive(ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

#[derive(ToSchema)]
pub(crate) struct ErrorDetail {
    /// Stable and meant for programs: `bad_request`, `invalid_json`,
    /// `not_found`, `method_not_allowed`, `conflict`, `request_timeout`,
    /// `payload_too_large`, `invalid_request`, `shutting_down`,
    /// `storage_unavailable`, ...
    #[schema(example = "invalid_request")]
    code: String,
    /// For people; names the field, parameter or id at fault.
    #[schema(example = "servers[1]: invalid name")]
    message: String,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
enum Priority {
    Low,
    Normal,
    High,
    Critical,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
enum TaskStatus {
    Pending,
    Queued,
    Running,
    RetryWaiting,
    Completed,
    Failed,
    Cancelled,
    Skipped,
    NotStarted,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
enum WorkflowStatus {
    Scheduled,
    Queued,
    Running,
    RollingBack,
    Completed,
    Failed,
    Cancelled,
}

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
enum FailurePolicy {
    Fail,
    Continue,
    Rollback,
}

// ---- health --------------------------------------------------------------

#[derive(ToSchema)]
struct Health {
    /// `ok`, or `unhealthy` with a 503.
    status: String,
    /// Why storage is unhealthy; only then.
    reason: Option<String>,
    version: String,
    storage: String,
    workers: u64,
    queued: u64,
    running: u64,
}

/// Liveness and load. Needs no token.
#[utoipa::path(get, path = "/health", tag = "operations", responses(
    (status = 200, description = "Storage can be read and written", body = Health),
    (status = 503, description = "Storage is unhealthy; `reason` says why", body = Health),
))]
fn health() {}

/// Prometheus text exposition (format 0.0.4). docs/api.md lists the metrics.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses(
    (status = 200, description = "The metrics", content_type = "text/plain; version=0.0.4", body = String),
))]
fn metrics() {}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "operations", responses(
    (status = 200, description = "The OpenAPI document", body = Object),
))]
fn openapi() {}

// ---- tasks ---------------------------------------------------------------

/// One task: one run of a script, with its attempts.
#[derive(ToSchema)]
struct Task {
    id: Uuid,
    workflow_id: Uuid,
    name: String,
    /// Relative to the scripts directory.
    script: String,
    /// The JSON object written to the script's stdin; `null` until resolved.
    input: Option<Value>,
    priority: Priority,
    status: TaskStatus,
    /// Omitted when there are none.
    depends_on: Option<Vec<Uuid>>,
    check_mode: bool,
    attempts: u32,
    max_attempts: u32,
    timeout_secs: u64,
    retry_at: Option<DateTime<Utc>>,
    not_before: Option<DateTime<Utc>>,
    step: Option<StepSettings>,
    reruns: u32,
    /// In a re-run revision: the task of the previous revision whose output it keeps (it did not run).
    kept_from: Option<Uuid>,
    cancel_requested: bool,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
    output: Option<Value>,
    error: Option<String>,
    exit_code: Option<i32>,
    node: Option<String>,
    lease_until: Option<DateTime<Utc>>,
    history: Option<Vec<AttemptRecord>>,
    checkpoint: Option<BTreeMap<String, Value>>,
    version: u64,
}

/// What a task knows of its template step; unset fields are omitted.
#[derive(ToSchema)]
struct StepSettings {
    ref_name: Option<String>,
    each: Option<Value>,
    input_template: Option<Value>,
    optional: Option<bool>,
    always_run: Option<bool>,
    on_failure: Option<FailurePolicy>,
    rollback: Option<String>,
    rollback_of: Option<Uuid>,
}

#[derive(ToSchema)]
struct AttemptRecord {
    attempt: u32,
    node: Option<String>,
    started_at: Option<DateTime<Utc>>,
    ended_at: DateTime<Utc>,
    outcome: TaskStatus,
    error: Option<String>,
}

#[derive(ToSchema)]
struct TaskList {
    tasks: Vec<Task>,
    total: u64,
    limit: u64,
    offset: u64,
}

/// A task's checkpoint: free keys and JSON values.
#[derive(ToSchema)]
#[schema(value_type = Object)]
struct Checkpoint(BTreeMap<String, Value>);

/// Tasks, newest first.
#[utoipa::path(get, path = "/tasks", tag = "tasks",
    params(
        ("status" = Option<TaskStatus>, Query, description = "Only tasks in this status"),
        ("workflow" = Option<Uuid>, Query, description = "Only tasks of this workflow"),
        ("limit" = Option<u32>, Query, description = "Page size, default 50, at most 1000", maximum = 1000),
        ("offset" = Option<u32>, Query, description = "Records to skip"),
    ),
    responses(
        (status = 200, description = "A page of tasks", body = TaskList),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn list_tasks() {}

/// One task.
#[utoipa::path(get, path = "/tasks/{id}", tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task", body = Task),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn get_task() {}

/// A task's captured stdout and stderr, as plain text.
#[utoipa::path(get, path = "/tasks/{id}/logs", tag = "tasks",
    params(
        ("id" = Uuid, Path, description = "Task id"),
        ("offset" = Option<u64>, Query, description = "Byte offset to read from"),
        ("limit_bytes" = Option<u64>, Query, description = "Most bytes to return (default 1 MiB, capped at 16 MiB)"),
        ("follow" = Option<bool>, Query, description = "Stream the log as it is written, ending when the task ends (the headers below are then absent)"),
    ),
    responses(
        (status = 200, description = "The log from `offset`", content_type = "text/plain; charset=utf-8", body = String,
            headers(
                ("x-next-offset" = u64, description = "Where to continue reading"),
                ("x-task-status" = String, description = "The task's status when read"),
            )),
        (status = 400, description = "The id is not a UUID, or a bad query parameter", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn task_logs() {}

/// Every durable change of a task or workflow as it happens, as
/// server-sent events: a `snapshot` first, then `change` events (each with
/// an `id` for `Last-Event-ID`), and `resync` when events were lost.
#[utoipa::path(get, path = "/events", tag = "operations",
    params(
        ("workflow" = Option<Uuid>, Query, description = "Only this workflow's events"),
        ("kind" = Option<String>, Query, description = "Only these event kinds, comma-separated"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event"),
    ),
    responses(
        (status = 200, description = "The event stream", content_type = "text/event-stream", body = String),
        (status = 400, description = "An unknown kind or a bad workflow id", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn events() {}

/// Cancels a task: at once if it is not running, else its script is stopped.
#[utoipa::path(post, path = "/tasks/{id}/cancel", tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task after the request", body = Task),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task already finished", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn cancel_task() {}

/// A task's checkpoint (`{}` while nothing was saved).
#[utoipa::path(get, path = "/tasks/{id}/checkpoint", tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The checkpoint", body = Checkpoint),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn get_checkpoint() {}

/// Merges the body's keys into a running task's checkpoint; answers once durable.
#[utoipa::path(put, path = "/tasks/{id}/checkpoint", tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id")),
    request_body(content = Checkpoint, description = "Keys to set"),
    responses(
        (status = 200, description = "The whole checkpoint", body = Checkpoint),
        (status = 400, description = "The id is not a UUID, an empty body or malformed JSON", body = ErrorBody),
        (status = 404, description = "No such task", body = ErrorBody),
        (status = 409, description = "The task is not running", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The body is not a JSON object", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn save_checkpoint() {}

// ---- workflows -----------------------------------------------------------

/// A workflow without its tasks, as listed.
#[derive(ToSchema)]
struct WorkflowSummary {
    id: Uuid,
    /// The template's `ref_name`.
    template: String,
    name: String,
    status: WorkflowStatus,
    #[schema(rename = "ref")]
    reference: Option<String>,
    revision: u32,
    trace_id: Option<String>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    task_count: u64,
}

#[derive(ToSchema)]
struct WorkflowList {
    workflows: Vec<WorkflowSummary>,
    total: u64,
    limit: u64,
    offset: u64,
}

/// Why a step failure stopped the workflow.
#[derive(ToSchema)]
struct Halt {
    reason: String,
    rollback: bool,
    rollback_started: bool,
}

#[derive(ToSchema)]
struct StepView {
    ref_name: String,
    /// The worst status among its tasks.
    status: TaskStatus,
    task_ids: Vec<Uuid>,
}

/// A workflow with its steps, the edges of its DAG, and its tasks.
#[derive(ToSchema)]
struct WorkflowView {
    id: Uuid,
    /// The template's `ref_name`.
    kind: String,
    template_version: Option<u32>,
    name: String,
    description: Option<String>,
    /// The request body as received.
    input: Value,
    check_mode: bool,
    priority: Priority,
    status: WorkflowStatus,
    on_failure: FailurePolicy,
    parallel_limit: Option<u64>,
    reference: Option<String>,
    trace_id: Option<String>,
    revision: u32,
    previous_revision: Option<Uuid>,
    idempotency_key: Option<String>,
    request_digest: Option<String>,
    start_at: Option<DateTime<Utc>>,
    /// The inputs after defaults.
    vars: Value,
    halt: Option<Halt>,
    cancel_requested: bool,
    task_ids: Vec<Uuid>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
    version: u64,
    steps: Vec<StepView>,
    /// `[from, to]` task id pairs: `to` depends on `from`.
    edges: Vec<[Uuid; 2]>,
    /// Each step's output by `ref_name`: an object (`null` until it
    /// completed), or a list for a `for_each` step.
    outputs: BTreeMap<String, Value>,
    tasks: Vec<Task>,
}

#[derive(ToSchema)]
struct SubmissionMeta {
    #[schema(rename = "ref")]
    reference: Option<String>,
    trace_id: Option<String>,
    name: Option<String>,
    description: Option<String>,
    /// How long to keep the workflow once finished, instead of the
    /// service's `--retain-finished`: `30d`, `12h`, or `forever`.
    #[schema(example = "30d")]
    retain: Option<String>,
}

/// `{"when": "now"}` or `{"when": "at", "start": "<RFC 3339>"}`.
#[derive(ToSchema)]
struct Schedule {
    #[schema(pattern = "^(now|at)$")]
    when: String,
    start: Option<DateTime<Utc>>,
}

/// A submission: a template by name or inline, with its inputs.
#[derive(ToSchema)]
struct WorkflowSubmission {
    /// A template's `ref_name`, or a whole template object.
    #[schema(value_type = Object)]
    template: Value,
    version: Option<u32>,
    vars: Option<BTreeMap<String, Value>>,
    meta: Option<SubmissionMeta>,
    schedule: Option<Schedule>,
    check_mode: Option<bool>,
    priority: Option<Priority>,
    #[schema(minimum = 1, maximum = 100)]
    max_attempts: Option<u32>,
    #[schema(minimum = 1)]
    timeout_secs: Option<u64>,
    #[schema(minimum = 1)]
    parallel_limit: Option<u64>,
    wait: Option<bool>,
    wait_timeout_secs: Option<u64>,
}

#[derive(ToSchema)]
struct Validated {
    valid: bool,
    workflow: WorkflowView,
}

/// Workflows, newest first.
#[utoipa::path(get, path = "/workflows", tag = "workflows",
    params(
        ("status" = Option<WorkflowStatus>, Query, description = "Only workflows in this status"),
        ("template" = Option<String>, Query, description = "Only workflows of this template ref_name"),
        ("ref" = Option<String>, Query, description = "Only revisions of this meta.ref"),
        ("trace_id" = Option<String>, Query, description = "Only workflows with this meta.trace_id"),
        ("limit" = Option<u32>, Query, description = "Page size, default 50, at most 1000", maximum = 1000),
        ("offset" = Option<u32>, Query, description = "Records to skip"),
    ),
    responses(
        (status = 200, description = "A page of workflows", body = WorkflowList),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn list_workflows() {}

/// Submits a workflow from a template.
#[utoipa::path(post, path = "/workflows", tag = "workflows",
    params(("Idempotency-Key" = Option<String>, Header, description = "1-255 visible ASCII characters; a repeat returns the first workflow")),
    request_body = WorkflowSubmission,
    responses(
        (status = 200, description = "With `wait`, the workflow finished; or a repeat (`idempotent-replayed: true`)", body = WorkflowView),
        (status = 202, description = "Stored and running", body = WorkflowView),
        (status = 400, description = "Empty body, malformed JSON, or a bad Idempotency-Key", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key was used for a different body", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The submission is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
fn submit_workflow() {}

/// Validates a submission and shows its DAG, storing nothing.
#[utoipa::path(post, path = "/workflows/validate", tag = "workflows",
    request_body = WorkflowSubmission,
    responses(
        (status = 200, description = "Valid; the workflow it would create", body = Validated),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The submission is invalid", body = ErrorBody),
    ))]
fn validate_workflow() {}

/// One workflow with its steps, edges and tasks.
#[utoipa::path(get, path = "/workflows/{id}", tag = "workflows",
    params(("id" = Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn get_workflow() {}

/// Cancels a workflow.
#[utoipa::path(post, path = "/workflows/{id}/cancel", tag = "workflows",
    params(("id" = Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow after the request", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow already finished", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn cancel_workflow() {}

/// Re-runs what did not complete in a finished workflow.
#[utoipa::path(post, path = "/workflows/{id}/retry", tag = "workflows",
    params(("id" = Uuid, Path, description = "Workflow id")),
    responses(
        (status = 200, description = "The workflow, running again", body = WorkflowView),
        (status = 400, description = "The id is not a UUID", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "Not finished, or nothing to retry", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn retry_workflow() {}

/// `POST /workflows/{id}/rerun`.
#[derive(ToSchema)]
struct Rerun {
    /// The `ref_name` of the first step to run again.
    from: String,
    /// Whether the steps after `from` run again too; default true.
    include_downstream: Option<bool>,
    /// New inputs for the steps that run again, checked like a submission's.
    vars: Option<BTreeMap<String, Value>>,
}

/// Re-runs a finished workflow from a step, as a new revision.
#[utoipa::path(post, path = "/workflows/{id}/rerun", tag = "workflows",
    params(("id" = Uuid, Path, description = "Workflow id")),
    request_body = Rerun,
    responses(
        (status = 202, description = "The new revision, running; steps before `from` keep their outputs", body = WorkflowView),
        (status = 400, description = "The id is not a UUID, or the body is empty or malformed", body = ErrorBody),
        (status = 404, description = "No such workflow", body = ErrorBody),
        (status = 409, description = "The workflow has not finished", body = ErrorBody),
        (status = 422, description = "An unknown step, or bad `vars`; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
fn rerun_workflow() {}

// ---- built-in submissions --------------------------------------------------

/// The fields shared by the built-in submissions, with `servers`,
/// `taskservs` and `cluster` as each route needs them (see docs/api.md).
#[derive(ToSchema)]
struct BuiltinRequest {
    /// A name: 1-63 of letters, digits, `.`, `_`, `-`.
    infra: String,
    settings: Option<String>,
    servers: Vec<String>,
    /// Required by `/workflows/taskserv/create`; optional for the cluster.
    taskservs: Option<Vec<String>>,
    /// Required by `/workflows/cluster/create` only.
    cluster: Option<String>,
    priority: Option<Priority>,
    #[schema(minimum = 1, maximum = 100)]
    max_attempts: Option<u32>,
    #[schema(minimum = 1)]
    timeout_secs: Option<u64>,
    check_mode: Option<bool>,
    wait: Option<bool>,
    wait_timeout_secs: Option<u64>,
}

/// The answer of a built-in submission.
#[derive(ToSchema)]
struct Submitted {
    workflow_id: Uuid,
    task_ids: Vec<Uuid>,
    status: WorkflowStatus,
    finished: bool,
    tasks: Vec<Task>,
}

/// Creates servers (template `servers-create`).
#[utoipa::path(post, path = "/workflows/servers/create", tag = "workflows",
    request_body = BuiltinRequest,
    responses(
        (status = 200, description = "With `wait`, the workflow finished", body = Submitted),
        (status = 202, description = "Stored and running", body = Submitted),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The request is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
fn create_servers() {}

/// Installs task services on servers, in order (template `taskserv-create`).
#[utoipa::path(post, path = "/workflows/taskserv/create", tag = "workflows",
    request_body = BuiltinRequest,
    responses(
        (status = 200, description = "With `wait`, the workflow finished", body = Submitted),
        (status = 202, description = "Stored and running", body = Submitted),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The request is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
fn create_taskservs() {}

/// Servers, then task services, then the cluster join (template `cluster-create`).
#[utoipa::path(post, path = "/workflows/cluster/create", tag = "workflows",
    request_body = BuiltinRequest,
    responses(
        (status = 200, description = "With `wait`, the workflow finished", body = Submitted),
        (status = 202, description = "Stored and running", body = Submitted),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 408, description = "The request took too long", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "The request is invalid; the message names the field", body = ErrorBody),
        (status = 503, description = "Shutting down, or storage unavailable", body = ErrorBody),
    ))]
fn create_cluster() {}

// ---- templates and nodes -------------------------------------------------

#[derive(ToSchema)]
struct TemplateSummary {
    ref_name: String,
    schema_version: u32,
    name: String,
    description: Option<String>,
    /// Input name to its declaration (`type`, `default`, `description`, ...).
    inputs: BTreeMap<String, Value>,
    /// The steps' `ref_name`s.
    steps: Vec<String>,
}

#[derive(ToSchema)]
struct TemplateList {
    templates: Vec<TemplateSummary>,
}

/// A whole template as parsed, defaults filled in; see docs/templates.md.
#[derive(ToSchema)]
#[schema(value_type = Object)]
struct Template(Value);

#[derive(ToSchema)]
struct NodeView {
    id: String,
    address: String,
    started_at: DateTime<Utc>,
    last_seen: DateTime<Utc>,
    alive: bool,
    this_node: bool,
}

#[derive(ToSchema)]
struct NodeList {
    nodes: Vec<NodeView>,
}

/// Every registered template, every version.
#[utoipa::path(get, path = "/templates", tag = "templates", responses(
    (status = 200, description = "The templates", body = TemplateList),
))]
fn list_templates() {}

/// One template.
#[utoipa::path(get, path = "/templates/{ref_name}", tag = "templates",
    params(
        ("ref_name" = String, Path, description = "The template's ref_name"),
        ("version" = Option<u32>, Query, description = "A schema_version; the newest by default"),
    ),
    responses(
        (status = 200, description = "The template", body = Template),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 404, description = "No such template or version", body = ErrorBody),
    ))]
fn get_template() {}

/// The nodes sharing this store.
#[utoipa::path(get, path = "/cluster/nodes", tag = "operations", responses(
    (status = 200, description = "The nodes", body = NodeList),
    (status = 503, description = "Storage unavailable", body = ErrorBody),
))]
fn list_nodes() {}

/// Workflows by status.
#[derive(ToSchema)]
struct WorkflowCounts {
    /// Every status, with how many workflows are in it.
    counts: BTreeMap<String, u64>,
    /// The sum of `counts`.
    total: u64,
}

/// How many workflows are in each status, with the listing's filters.
#[utoipa::path(get, path = "/workflows/counts", tag = "workflows",
    params(
        ("template" = Option<String>, Query, description = "Only workflows of this template ref_name"),
        ("ref" = Option<String>, Query, description = "Only revisions of this meta.ref"),
        ("trace_id" = Option<String>, Query, description = "Only workflows with this meta.trace_id"),
    ),
    responses(
        (status = 200, description = "The counts", body = WorkflowCounts),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn count_workflows() {}

// ---- the dashboard ------------------------------------------------------------

/// Who the dashboard speaks for.
#[derive(ToSchema)]
struct SessionView {
    /// The token's name (`local` without auth).
    name: String,
    role: Role,
    /// Whether the service requires tokens; `false` with `--no-auth`.
    auth: bool,
    /// When the session ends; `null` without a session cookie.
    expires_at: Option<DateTime<Utc>>,
    /// To send as `X-CSRF-Token` with every change made with the cookie;
    /// `null` without a session cookie.
    csrf_token: Option<String>,
}

/// The dashboard's page. Needs no token; the page signs in itself.
#[utoipa::path(get, path = "/ui", tag = "dashboard", responses(
    (status = 200, description = "The page (revalidate with its ETag: 304 when unchanged)", content_type = "text/html; charset=utf-8", body = String),
))]
fn dashboard() {}

/// The dashboard's page, as at `/ui`.
#[utoipa::path(get, path = "/ui/", tag = "dashboard", responses(
    (status = 200, description = "The page", content_type = "text/html; charset=utf-8", body = String),
))]
fn dashboard_slash() {}

/// A file of the dashboard (script, stylesheet, icon), or the page itself
/// for a path without an extension.
#[utoipa::path(get, path = "/ui/{path}", tag = "dashboard",
    params(("path" = String, Path, description = "A file under /ui/, e.g. app.js")),
    responses(
        (status = 200, description = "The file", content_type = "text/javascript; charset=utf-8", body = String),
        (status = 404, description = "No such file", body = ErrorBody),
    ))]
fn dashboard_file() {}

/// Who the session cookie (or bearer token) is; for a cookie, its CSRF token again.
#[utoipa::path(get, path = "/ui/session", tag = "dashboard", responses(
    (status = 200, description = "Signed in", body = SessionView),
))]
fn get_session() {}

/// Trades the bearer token for a session cookie (`HttpOnly; SameSite=Strict`, 12 h).
#[utoipa::path(post, path = "/ui/session", tag = "dashboard", responses(
    (status = 200, description = "Signed in; the cookie is in `Set-Cookie`", body = SessionView,
        headers(("set-cookie" = String, description = "orch_session=...; Max-Age=43200; Path=/; HttpOnly; SameSite=Strict"))),
))]
fn create_session() {}

/// Clears the session cookie. Needs no token.
#[utoipa::path(post, path = "/ui/logout", tag = "dashboard", responses(
    (status = 204, description = "The cookie is cleared",
        headers(("set-cookie" = String, description = "orch_session=; Max-Age=0; ..."))),
))]
fn logout() {}

// ---- admin: tokens and the audit log --------------------------------------

#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
enum Role {
    Viewer,
    Operator,
    Admin,
}

#[derive(ToSchema)]
struct NewToken {
    name: String,
    role: Role,
}

/// A token as listed: never its hash.
#[derive(ToSchema)]
struct TokenView {
    id: String,
    name: String,
    role: Role,
    created_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
}

/// A new token; `token` is shown this once only.
#[derive(ToSchema)]
struct IssuedToken {
    id: String,
    name: String,
    role: Role,
    created_at: DateTime<Utc>,
    token: String,
}

#[derive(ToSchema)]
struct TokenList {
    tokens: Vec<TokenView>,
}

#[derive(ToSchema)]
struct AuditPage {
    /// Audit records, newest first (see docs/api.md).
    records: Vec<Object>,
    total: u64,
    limit: u64,
    offset: u64,
}

/// A free-form JSON object.
#[derive(ToSchema)]
#[schema(value_type = Object)]
struct Object(Value);

/// Every token, active or revoked.
#[utoipa::path(get, path = "/tokens", tag = "admin", responses(
    (status = 200, description = "The tokens", body = TokenList),
    (status = 503, description = "Storage unavailable", body = ErrorBody),
))]
fn list_tokens() {}

/// Creates a token.
#[utoipa::path(post, path = "/tokens", tag = "admin", request_body = NewToken, responses(
    (status = 201, description = "The token, shown once", body = IssuedToken),
    (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
    (status = 409, description = "A token with this name exists", body = ErrorBody),
    (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
    (status = 422, description = "A bad name or role", body = ErrorBody),
    (status = 503, description = "Storage unavailable", body = ErrorBody),
))]
fn create_token() {}

/// Revokes a token.
#[utoipa::path(delete, path = "/tokens/{id}", tag = "admin",
    params(("id" = String, Path, description = "Token id")),
    responses(
        (status = 200, description = "The revoked token", body = TokenView),
        (status = 404, description = "No such token", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn revoke_token() {}

/// The audit log, newest first.
#[utoipa::path(get, path = "/audit", tag = "admin",
    params(
        ("since" = Option<DateTime<Utc>>, Query, description = "At or after (RFC 3339)"),
        ("until" = Option<DateTime<Utc>>, Query, description = "Before (RFC 3339)"),
        ("actor" = Option<String>, Query, description = "Token name"),
        ("action" = Option<String>, Query, description = "Action"),
        ("target" = Option<String>, Query, description = "Target"),
        ("limit" = Option<u32>, Query, description = "Page size, default 50, 1-1000", minimum = 1, maximum = 1000),
        ("offset" = Option<u32>, Query, description = "Records to skip"),
    ),
    responses(
        (status = 200, description = "A page of audit records", body = AuditPage),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn list_audit() {}

/// A secret's value, write-only.
#[derive(ToSchema)]
struct NewSecret {
    value: String,
}

#[derive(ToSchema)]
struct SecretList {
    /// Names and metadata, never values.
    secrets: Vec<Object>,
}

/// Secret names and metadata; never values.
#[utoipa::path(get, path = "/secrets", tag = "admin", responses(
    (status = 200, description = "The secrets", body = SecretList),
    (status = 503, description = "Storage unavailable", body = ErrorBody),
))]
fn list_secrets() {}

/// Stores a secret, encrypted, replacing one of the same name.
#[utoipa::path(put, path = "/secrets/{name}", tag = "admin",
    params(("name" = String, Path, description = "Secret name")),
    request_body = NewSecret,
    responses(
        (status = 200, description = "The secret's metadata", body = Object),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A bad name or body", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn put_secret() {}

/// Deletes a secret.
#[utoipa::path(delete, path = "/secrets/{name}", tag = "admin",
    params(("name" = String, Path, description = "Secret name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such secret", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn delete_secret() {}

/// A backup archive of the store (a zstd-compressed tar with a manifest and
/// checksums; see docs/deployment.md), for `orchestrator backup` when the
/// store cannot be read from outside the service (embedded SurrealDB).
#[utoipa::path(post, path = "/backup", tag = "admin",
    responses(
        (status = 200, description = "The archive", content_type = "application/zstd", body = Vec<u8>),
        (status = 409, description = "The store kept changing; try again later", body = ErrorBody),
        (status = 503, description = "The backup failed; the service log says why", body = ErrorBody),
    ))]
fn create_backup() {}

/// `POST /prune`.
#[derive(ToSchema)]
struct PruneBody {
    /// Finished workflows that ended longer ago than this go, with their
    /// tasks and logs (a workflow's own `meta.retain` still wins; the
    /// newest revision of a `meta.ref` stays): `7d`, `12h`. Absent: none.
    #[schema(example = "7d")]
    older_than: Option<String>,
    /// Audit records older than this go. Absent: none.
    #[schema(example = "90d")]
    audit_older_than: Option<String>,
    /// Count what would go; delete nothing.
    #[schema(default = false)]
    dry_run: Option<bool>,
}

/// What a prune deleted, or would delete.
#[derive(ToSchema)]
struct PruneReport {
    dry_run: bool,
    workflows: u64,
    tasks: u64,
    audit_records: u64,
}

/// Deletes finished workflows and audit records past keeping, now (the
/// service also does it in the background under `--retain-finished` and
/// `--retain-audit`).
#[utoipa::path(post, path = "/prune", tag = "admin", request_body = PruneBody,
    responses(
        (status = 200, description = "What went (or would go)", body = PruneReport),
        (status = 422, description = "A period is not valid", body = ErrorBody),
        (status = 503, description = "Storage unavailable", body = ErrorBody),
    ))]
fn prune() {}
