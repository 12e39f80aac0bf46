//! The built-in workflows: servers, taskservs and a cluster, each from
//! its own request shape.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use orchestrator_core::{Task, TaskId, WorkflowId, WorkflowStatus};
use orchestrator_engine::Engine;
use orchestrator_engine::builtin::{Builtin, BuiltinRequest, FieldUse};
use serde::Serialize;
use serde_json::json;
use utoipa::openapi::schema::{SchemaType, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use super::workflows::{submit_and_wait, wait_limit};
use crate::error::{ErrorBody, ShuttingDownOrStorageUnavailable};
use crate::extract::{JsonBody, Submitter};
use crate::{ApiError, AppState};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_servers))
        .routes(routes!(create_taskservs))
        .routes(routes!(create_cluster))
}

/// One endpoint's request schema: [`BuiltinRequest`]'s, with what
/// [`Builtin::field_use`] says of the fields that differ by endpoint:
/// required ones listed as required, refused ones left out (the schema
/// admits no other property). So the document states what the checks do.
fn request_schema(endpoint: Builtin) -> RefOr<Schema> {
    let mut schema = <BuiltinRequest as PartialSchema>::schema();
    if let RefOr::T(Schema::Object(object)) = &mut schema {
        for field in Builtin::PER_ENDPOINT {
            match endpoint.field_use(field) {
                FieldUse::Required => {
                    object.required.push(field.to_owned());
                    if let Some(RefOr::T(property)) = object.properties.get_mut(field) {
                        required_value(property);
                    }
                }
                FieldUse::Refused => {
                    object.properties.remove(field);
                }
                FieldUse::Optional => {}
            }
        }
        object.examples = vec![match endpoint {
            Builtin::ServersCreate => {
                json!({"infra": "demo", "servers": ["web-01"], "check_mode": true})
            }
            Builtin::TaskservCreate => {
                json!({"infra": "demo", "servers": ["web-01"], "taskservs": ["containerd"], "check_mode": true})
            }
            Builtin::ClusterCreate => {
                json!({"infra": "demo", "servers": ["cp-01"], "cluster": "k8s", "check_mode": true})
            }
        }];
        object.example = None;
    }
    schema
}

/// What a required field takes, as the checks hold it: a value (`null`
/// is refused as missing), and for a list, at least one name.
fn required_value(schema: &mut Schema) {
    let types = match schema {
        Schema::Object(object) => &mut object.schema_type,
        Schema::Array(array) => {
            array.min_items = Some(1);
            &mut array.schema_type
        }
        _ => return,
    };
    if let SchemaType::Array(list) = types {
        list.retain(|t| *t != Type::Null);
        if let [only] = list.as_slice() {
            *types = SchemaType::Type(only.clone());
        }
    }
}

/// The request schema of each endpoint, named for the document (see
/// [`request_schema`]); the handlers all read [`BuiltinRequest`].
macro_rules! endpoint_schema {
    ($name:ident, $endpoint:expr) => {
        pub(crate) struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                request_schema($endpoint)
            }
        }

        impl ToSchema for $name {
            fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
                <BuiltinRequest as ToSchema>::schemas(schemas);
            }
        }
    };
}

endpoint_schema!(ServersCreateRequest, Builtin::ServersCreate);
endpoint_schema!(TaskservCreateRequest, Builtin::TaskservCreate);
endpoint_schema!(ClusterCreateRequest, Builtin::ClusterCreate);

/// The answer to a built-in submission.
#[derive(Serialize, ToSchema)]
pub(crate) struct Submitted {
    workflow_id: WorkflowId,
    task_ids: Vec<TaskId>,
    status: WorkflowStatus,
    /// False when `wait` was asked for but the cap passed first.
    finished: bool,
    tasks: Vec<Task>,
}

/// One built-in endpoint: its declaration and its handler, alike but for
/// the path, the audit action, the request schema and the template.
macro_rules! builtin_endpoint {
    ($(#[$doc:meta])* $handler:ident, $path:tt, $audit:tt, $request:ty, $endpoint:expr) => {
        $(#[$doc])*
        #[utoipa::path(post, path = $path, tag = "workflows",
            extensions(("x-role" = json!("operator")), ("x-audit" = json!($audit))),
            request_body = $request,
            responses(
                (status = 200, description = "With `wait`, the workflow finished", body = Submitted),
                (status = 202, description = "Stored and running", body = Submitted, links(
                    ("workflow" = (operation_id = "get_workflow", parameters(("id" = "$response.body#/workflow_id")))),
                    ("task" = (operation_id = "get_task", parameters(("id" = "$response.body#/task_ids/0")))),
                )),
                (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
                (status = 408, description = "The request took too long", body = ErrorBody),
                (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
                (status = 422, description = "The request is invalid; the message names the field", body = ErrorBody),
                ShuttingDownOrStorageUnavailable,
            ))]
        pub(crate) async fn $handler(
            State(state): State<AppState>,
            Submitter(submitted_by): Submitter,
            body: JsonBody<BuiltinRequest>,
        ) -> Result<Response, ApiError> {
            builtin(&state.engine, $endpoint, body.0, submitted_by).await
        }
    };
}

builtin_endpoint!(
    /// Creates servers (template `servers-create`).
    create_servers,
    "/workflows/servers/create",
    "workflow.submit_servers",
    ServersCreateRequest,
    Builtin::ServersCreate
);

builtin_endpoint!(
    /// Installs task services on servers, in order (template `taskserv-create`).
    create_taskservs,
    "/workflows/taskserv/create",
    "workflow.submit_taskservs",
    TaskservCreateRequest,
    Builtin::TaskservCreate
);

builtin_endpoint!(
    /// Servers, then task services, then the cluster join (template `cluster-create`).
    create_cluster,
    "/workflows/cluster/create",
    "workflow.submit_cluster",
    ClusterCreateRequest,
    Builtin::ClusterCreate
);

/// The built-in endpoints answer in their own shape: ids first, then tasks.
async fn builtin(
    engine: &Engine,
    endpoint: Builtin,
    request: BuiltinRequest,
    submitted_by: Option<String>,
) -> Result<Response, ApiError> {
    let wait = wait_limit(request.wait, request.wait_timeout_secs.map(u64::from));
    let mut submission = request.into_request(endpoint, &engine.config().limits)?;
    submission.meta.submitted_by = submitted_by;
    let (status, _, view) = submit_and_wait(engine, submission, wait).await?;
    let finished = view.workflow.status.is_terminal();
    let body = Submitted {
        workflow_id: view.workflow.id,
        task_ids: view.workflow.task_ids.clone(),
        status: view.workflow.status,
        finished,
        tasks: view.tasks,
    };
    Ok((status, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use orchestrator_core::template::Limits;
    use serde_json::Value;

    use super::*;

    fn check(endpoint: Builtin, body: &Value) -> Result<(), String> {
        let request: BuiltinRequest =
            serde_json::from_value(body.clone()).map_err(|e| e.to_string())?;
        request
            .into_request(endpoint, &Limits::default())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The document of each endpoint says what its checks do: its example
    /// passes them, each field it lists as required is missed when absent,
    /// and each field it leaves out is refused when sent.
    #[test]
    fn each_endpoint_documents_what_it_requires_and_refuses() {
        for endpoint in Builtin::ALL {
            let RefOr::T(Schema::Object(schema)) = request_schema(endpoint) else {
                panic!("{endpoint:?}: not an object schema");
            };
            let example = schema.examples[0].clone();
            check(endpoint, &example).unwrap_or_else(|e| panic!("{endpoint:?}: {e}"));
            for field in &schema.required {
                let mut body = example.clone();
                body.as_object_mut().unwrap().remove(field);
                let error = check(endpoint, &body).expect_err(field);
                assert!(
                    error.contains(field.as_str()),
                    "{endpoint:?} {field}: {error}"
                );
            }
            for field in Builtin::PER_ENDPOINT {
                if schema.properties.contains_key(field) {
                    continue;
                }
                let mut body = example.clone();
                body[field] = json!(if field == "cluster" {
                    json!("k8s")
                } else {
                    json!(["etcd"])
                });
                let error = check(endpoint, &body).expect_err(field);
                assert!(error.contains(field), "{endpoint:?} {field}: {error}");
            }
        }
    }
}
