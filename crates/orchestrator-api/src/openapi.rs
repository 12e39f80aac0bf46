//! The OpenAPI 3.1 document of the API (`GET /openapi.json`, served by
//! `routes::document`), generated with `utoipa`.
//!
//! This module only shapes it: the base, and what the door adds. Each
//! operation is declared on its handler (`#[utoipa::path]`, in the
//! handler's module, collected by `routes::operations`), and every schema
//! is derived (`ToSchema`) from the type the handler really reads or
//! answers with: the API's own request and response types, and the core's
//! and engine's, whose derives sit behind their `openapi` feature (those
//! crates know nothing of HTTP; only this crate turns the feature on). The
//! serde attributes (`rename`, `default`, `flatten`, `tag`) shape both the
//! wire and the schema, so the two cannot drift; the limits a handler or
//! the engine checks are stated next to the field (`#[schema(minimum =
//! ...)]`), and the tests compare them with the constants the checks use.

use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::declarations::Need;
use crate::error::ErrorBody;

/// The document: `base` (info, tags, the schemes) with `operations` (the
/// router's, see `routes::document`), what the door adds to each (its
/// schemes and answers, from the role it declares), and links spelled as
/// OpenAPI spells them.
pub(crate) fn assemble(operations: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    let mut document = ApiDoc::openapi().merge_from(operations);
    Door.modify(&mut document);
    document
}

/// The document as JSON, as served.
pub(crate) fn to_json(document: &utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(document).unwrap_or_default();
    spell_links(&mut doc);
    doc
}

/// utoipa 5.5 writes a link's `operationId` as `operation_id` (and
/// `operationRef`, `requestBody` likewise); OpenAPI, and the clients that
/// follow links (schemathesis' stateful phase), know the camel-case names.
fn spell_links(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    let responses = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(|operation| operation.get_mut("responses")?.as_object_mut())
        .flat_map(|responses| responses.values_mut());
    for response in responses {
        let Some(links) = response.get_mut("links").and_then(Value::as_object_mut) else {
            continue;
        };
        for link in links.values_mut().filter_map(Value::as_object_mut) {
            for (snake, camel) in [
                ("operation_id", "operationId"),
                ("operation_ref", "operationRef"),
                ("request_body", "requestBody"),
            ] {
                if let Some(value) = link.remove(snake) {
                    link.insert(camel.to_owned(), value);
                }
            }
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "orchestrator",
        description = "Runs provisioning scripts as tasks and workflows. See docs/api.md for the prose.",
        license(name = "Apache-2.0"),
    ),
    components(schemas(ErrorBody)),
    tags(
        (name = "workflows", description = "Submitting, watching, cancelling and retrying workflows"),
        (name = "tasks", description = "Tasks, their logs and checkpoints"),
        (name = "templates", description = "The registered workflow templates"),
        (name = "schedules", description = "Recurring runs of a template on a cron expression"),
        (name = "approvals", description = "Approval gates waiting for a decision, and the decisions"),
        (name = "webhooks", description = "Webhook subscriptions, their delivery log and re-sends (role admin)"),
        (name = "test", description = "Test environments: isolated nodes in Linux namespaces, made, checked and torn down as workflows"),
        (name = "operations", description = "Health, metrics, cluster nodes and this document"),
        (name = "admin", description = "API tokens, secrets, the audit log, backups, prunes and live storage migration (role admin)"),
        (name = "dashboard", description = "The web dashboard at /ui: its files, and the session cookie it signs in with"),
    ),
)]
struct ApiDoc;

/// Declares the `bearerAuth` and `sessionCookie` schemes, requires either
/// everywhere, lifts them from the open operations (`x-role: open`: an
/// empty `security` list), makes them optional where a credential is
/// optional (`optional`, `local-or-token`), and adds the door's answers
/// (429, and 401 and 403 where a credential is needed).
struct Door;

impl Modify for Door {
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
        let door_response = |description: &str| {
            utoipa::openapi::ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    utoipa::openapi::ContentBuilder::new()
                        .schema(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build()
        };
        for item in openapi.paths.paths.values_mut() {
            for (method, operation) in [
                ("get", &mut item.get),
                ("put", &mut item.put),
                ("post", &mut item.post),
                ("delete", &mut item.delete),
                ("patch", &mut item.patch),
            ] {
                let Some(operation) = operation else {
                    continue;
                };
                let role = operation
                    .extensions
                    .as_ref()
                    .and_then(|e| e.get("x-role"))
                    .and_then(|v| v.as_str())
                    .and_then(Need::parse);
                let open = role == Some(Need::Open);
                if open {
                    operation.security = Some(Vec::new());
                } else if matches!(role, Some(Need::Optional | Need::Metrics)) {
                    // The empty requirement first: no credential is one
                    // way in.
                    let mut ways = vec![utoipa::openapi::security::SecurityRequirement::default()];
                    ways.extend(openapi.security.iter().flatten().cloned());
                    operation.security = Some(ways);
                }
                // What the door answers: on every route, the rate limit of
                // the caller's address (checked before anything else) and
                // of its token; on the others, the token's refusals.
                let mut door = vec![(
                    "429",
                    "Over the rate limit of the caller's address, or of its token; see `Retry-After`",
                )];
                if !open {
                    door.push(("401", "No token, or not a valid one"));
                    door.push(("403", "The token's role does not allow this"));
                }
                // A change with a body must say it is JSON (see `browser`).
                if method != "get" && operation.request_body.is_some() {
                    door.push(("415", "The body's `Content-Type` is not `application/json`"));
                }
                for (status, description) in door {
                    operation
                        .responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert(door_response(description).into());
                }
            }
        }
    }
}
