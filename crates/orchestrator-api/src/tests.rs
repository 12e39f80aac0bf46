//! Tests of the router through its public surface (`oneshot` requests)
//! against a real engine on the filesystem backend in a temp dir: the
//! OpenAPI document against the router, the layers, and a property test
//! that no request makes the service answer 5xx or panic.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::response::Response;
use orchestrator_engine::templates::Templates;
use orchestrator_engine::{Engine, EngineConfig};
use orchestrator_executor::{ExecutorConfig, ScriptExecutor};
use orchestrator_storage::{StorageConfig, StorageType};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::{AppState, all_routes, app};

/// An engine on a fresh filesystem store, running the service tests'
/// fixture scripts (bash under the built-in `.nu` names), with auth off
/// (as `--no-auth`): these tests are about what is behind the door.
async fn engine(dir: &Path) -> Engine {
    let data_dir = dir.join("data");
    let storage = orchestrator_storage::open(&StorageConfig {
        storage_type: StorageType::Filesystem,
        data_dir: data_dir.clone(),
        surrealdb: Default::default(),
    })
    .await
    .unwrap();
    let scripts_dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../orchestrator/tests/fixtures/scripts");
    let executor = ScriptExecutor::new(ExecutorConfig {
        scripts_dir,
        work_dir: data_dir.join("work"),
        data_dir,
        kill_grace: Duration::from_millis(200),
        interpreters: [("nu".to_owned(), "bash".into())].into(),
        service_url: None,
        sandbox: orchestrator_executor::Sandbox::None,
    })
    .unwrap();
    let templates = Templates::load(
        None,
        &orchestrator_engine::steps::Steps::new(executor.clone()),
    )
    .unwrap();
    Engine::start(
        storage,
        executor,
        templates,
        EngineConfig {
            workers: 2,
            node_id: "api-test".into(),
            access: orchestrator_engine::access::AccessConfig {
                auth: false,
                rate_limit: 0,
                ..Default::default()
            },
            ..EngineConfig::default()
        },
    )
    .await
    .unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> Response {
    app.clone().oneshot(request).await.unwrap()
}

async fn body_json(response: Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

fn request(method: Method, uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.into())
        .unwrap()
}

/// The route templates registered in the router, read from the router
/// itself (its `Debug` lists them), so a route added anywhere is seen.
fn router_paths() -> BTreeSet<String> {
    let debug = format!("{:?}", all_routes().0);
    // `Router { path_router: .., fallback_router: .., .. }`: the routes are
    // in the first part, the fallback's own paths in the second.
    let (routes, _) = debug
        .split_once("fallback_router")
        .unwrap_or_else(|| panic!("unexpected router Debug: {debug}"));
    let paths: BTreeSet<String> = routes
        .split('"')
        .filter(|s| s.starts_with('/') && !s.contains("__private__"))
        // A catch-all (`{*path}`) is a plain parameter in OpenAPI.
        .map(|s| s.replace("{*", "{"))
        .collect();
    assert!(paths.len() >= 10, "cannot read the routes from {debug}");
    paths
}

/// A concrete URI for a route template.
fn concrete(path: &str) -> String {
    path.replace("{id}", "0190f0a0-0000-7000-8000-000000000000")
        .replace("{ref_name}", "servers-create")
        .replace("{name}", "probe")
        .replace("{path}", "app.js")
}

/// Each route with the methods it answers, found by asking the router
/// (without middleware) which methods are not `405`.
async fn router_routes(state: AppState) -> BTreeSet<(String, String)> {
    let router = all_routes().0.with_state(state);
    let mut routes = BTreeSet::new();
    for path in router_paths() {
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ] {
            let response = send(&router, request(method.clone(), &concrete(&path), "{}")).await;
            if response.status() != StatusCode::METHOD_NOT_ALLOWED {
                routes.insert((path.clone(), method.as_str().to_lowercase()));
            }
        }
    }
    routes
}

fn document_routes(doc: &Value) -> BTreeSet<(String, String)> {
    let mut routes = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in ["get", "post", "put", "delete", "patch"] {
            if item.get(method).is_some() {
                routes.insert((path.clone(), method.to_owned()));
            }
        }
    }
    routes
}

/// Follows a `#/components/schemas/...` reference.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected $ref {reference}"));
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// Every `$ref` in the document points at a schema it defines.
fn check_refs(doc: &Value, value: &Value) {
    match value {
        Value::Object(map) => {
            if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
                let name = reference.strip_prefix("#/components/schemas/").unwrap();
                assert!(
                    doc["components"]["schemas"].get(name).is_some(),
                    "dangling $ref {reference}"
                );
            }
            map.values().for_each(|v| check_refs(doc, v));
        }
        Value::Array(items) => items.iter().for_each(|v| check_refs(doc, v)),
        _ => {}
    }
}

/// The properties and required fields of an object schema, through its
/// `$ref` and its `allOf` parts (a `#[serde(flatten)]` field is one).
fn object_parts<'a>(doc: &'a Value, schema: &'a Value) -> Option<(Vec<&'a Value>, Vec<&'a str>)> {
    let schema = resolve(doc, schema);
    if let Some(parts) = schema.get("allOf").and_then(Value::as_array) {
        let (mut properties, mut required) = (Vec::new(), Vec::new());
        for part in parts {
            let (p, r) = object_parts(doc, part)?;
            properties.extend(p);
            required.extend(r);
        }
        return Some((properties, required));
    }
    let properties = schema.get("properties")?;
    let required = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    Some((vec![properties], required))
}

/// The served `value` and its schema agree both ways, recursively through
/// objects and arrays: it has no field its schema lacks, and every field
/// the schema requires.
fn check_shape(doc: &Value, schema: &Value, value: &Value, at: &str) {
    let schema = resolve(doc, schema);
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        // `Option<T>` of an object is `oneOf: [null, T]`.
        if let Some(option) = options.iter().find(|o| o["type"] != "null")
            && !value.is_null()
        {
            check_shape(doc, option, value, at);
        }
        return;
    }
    match value {
        Value::Object(map) => {
            let Some((properties, required)) = object_parts(doc, schema) else {
                return; // a free-form object
            };
            for (key, item) in map {
                let property = properties
                    .iter()
                    .find_map(|p| p.get(key))
                    .unwrap_or_else(|| panic!("{at}.{key} is served but not in the schema"));
                check_shape(doc, property, item, &format!("{at}.{key}"));
            }
            for key in required {
                assert!(
                    map.contains_key(key),
                    "{at}.{key} is required by the schema but not served"
                );
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_shape(doc, item_schema, item, &format!("{at}[{i}]"));
                }
            }
        }
        _ => {}
    }
}

fn response_schema<'a>(doc: &'a Value, path: &str, method: &str, status: &str) -> &'a Value {
    &doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]
}

#[tokio::test]
async fn the_openapi_document_is_valid_and_covers_every_route() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let app = app(engine.clone());

    let response = send(&app, request(Method::GET, "/openapi.json", Body::empty())).await;
    assert_eq!(response.status(), StatusCode::OK);
    let doc = body_json(response).await;
    assert_eq!(doc, crate::routes::document::document());

    // OpenAPI 3 structure: the version, the info, every reference resolves,
    // every path parameter is declared, every operation has a success and
    // documents its errors with the one error body. (utoipa writes 3.1,
    // which the `openapiv3` crate cannot read: it knows 3.0 only.
    // schemathesis validates the document fully; see docs/api.md.)
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    check_refs(&doc, &doc);
    let mut operation_ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            assert!(operation_ids.insert(operation["operationId"].as_str().unwrap()));
            let declared: BTreeSet<&str> = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "path")
                .map(|p| {
                    assert_eq!(p["required"], true, "{method} {path}");
                    p["name"].as_str().unwrap()
                })
                .collect();
            let in_template: BTreeSet<&str> = path
                .split('/')
                .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
                .collect();
            assert_eq!(declared, in_template, "{method} {path}");
            let responses = operation["responses"].as_object().unwrap();
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {path}"
            );
            for (status, response) in responses {
                assert!(
                    response["description"].is_string(),
                    "{method} {path} {status}"
                );
                let error = !status.starts_with('2') && !status.starts_with('3');
                if error && status != "503" || path != "/health" && status == "503" {
                    assert_eq!(
                        response["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ErrorBody",
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }
    // Bearer tokens (or the dashboard's cookie) everywhere but /health and
    // the dashboard's files.
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"],
        json!({"type": "http", "scheme": "bearer", "description": "An API token: `Authorization: Bearer <token>`."})
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["sessionCookie"]["in"],
        "cookie"
    );
    assert_eq!(
        doc["security"],
        json!([{"bearerAuth": []}, {"sessionCookie": []}])
    );
    assert_eq!(doc["paths"]["/health"]["get"]["security"], json!([]));
    assert_eq!(doc["paths"]["/ui"]["get"]["security"], json!([]));

    // Every route of the router, with its methods, and nothing else.
    let served = router_routes(AppState::new(engine.clone())).await;
    assert_eq!(document_routes(&doc), served);

    // docs/api.md lists every operation of the document in its table.
    let api_md =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md"))
            .unwrap();
    for (path, method) in &served {
        let row = format!("| `{}` | [`{path}`]", method.to_uppercase());
        assert!(api_md.contains(&row), "docs/api.md has no row `{row}`");
    }
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn served_objects_match_their_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let app = app(engine.clone());
    let doc = crate::routes::document::document();

    let body =
        json!({"infra": "doc", "servers": ["s-01", "fail-02"], "max_attempts": 1, "wait": true});
    let response = send(
        &app,
        request(Method::POST, "/workflows/servers/create", body.to_string()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    let submitted = body_json(response).await;
    let schema = response_schema(&doc, "/workflows/servers/create", "post", "200");
    check_shape(&doc, schema, &submitted, "submitted");

    let id = submitted["workflow_id"].as_str().unwrap();
    let task = submitted["task_ids"][1].as_str().unwrap();
    for (path, route) in [
        (format!("/workflows/{id}"), "/workflows/{id}"),
        ("/workflows".to_owned(), "/workflows"),
        ("/tasks".to_owned(), "/tasks"),
        (format!("/tasks/{task}"), "/tasks/{id}"),
        ("/templates".to_owned(), "/templates"),
        ("/cluster/nodes".to_owned(), "/cluster/nodes"),
        ("/locks".to_owned(), "/locks"),
        ("/health".to_owned(), "/health"),
        ("/tasks/nope".to_owned(), "/tasks/{id}"),
    ] {
        let response = send(&app, request(Method::GET, &path, Body::empty())).await;
        let status = response.status().as_u16().to_string();
        let value = body_json(response).await;
        let schema = response_schema(&doc, route, "get", &status);
        assert!(schema.is_object(), "GET {route} {status} is not documented");
        check_shape(&doc, schema, &value, &path);
    }
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The schema of a component, by name.
fn component<'a>(doc: &'a Value, name: &str) -> &'a Value {
    let schema = &doc["components"]["schemas"][name];
    assert!(schema.is_object(), "no schema {name}");
    schema
}

/// The schema of an operation's query parameter.
fn query_param<'a>(doc: &'a Value, path: &str, method: &str, name: &str) -> &'a Value {
    doc["paths"][path][method]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .map(|p| &p["schema"])
        .unwrap_or_else(|| panic!("{method} {path} has no parameter {name}"))
}

#[test]
fn the_documented_limits_are_the_checked_ones() {
    let doc = crate::routes::document::document();
    for (path, method) in [("/tasks", "get"), ("/workflows", "get"), ("/audit", "get")] {
        assert_eq!(
            query_param(&doc, path, method, "limit")["maximum"],
            crate::routes::MAX_PAGE,
            "{path}"
        );
        assert_eq!(
            query_param(&doc, path, method, "offset")["maximum"],
            u32::MAX,
            "{path}"
        );
    }
    let builtins = [
        "ServersCreateRequest",
        "TaskservCreateRequest",
        "ClusterCreateRequest",
    ];
    for name in std::iter::once("WorkflowSubmission").chain(builtins) {
        assert_eq!(
            component(&doc, name)["properties"]["max_attempts"]["maximum"],
            orchestrator_engine::MAX_ATTEMPTS,
            "{name}"
        );
    }
    for name in std::iter::once("WorkflowSubmission").chain(builtins) {
        assert_eq!(
            component(&doc, name)["properties"]["timeout_secs"]["maximum"],
            orchestrator_core::template::MAX_DURATION.as_secs(),
            "{name}"
        );
    }
    assert_eq!(
        component(&doc, "WorkflowSubmission")["properties"]["parallel_limit"]["maximum"],
        orchestrator_core::template::MAX_PARALLEL_LIMIT,
    );
    for name in ["NewSchedule", "ScheduleChange"] {
        assert_eq!(
            component(&doc, name)["properties"]["catch_up_window_secs"]["maximum"],
            orchestrator_core::schedule::MAX_CATCH_UP_WINDOW_SECS,
            "{name}"
        );
    }
    for name in ["NodeLimits", "LimitsOverride"] {
        use orchestrator_testenv::model as testenv;
        let limits = &component(&doc, name)["properties"];
        assert_eq!(limits["memory_mib"]["minimum"], testenv::MIN_MEMORY_MIB);
        assert_eq!(limits["memory_mib"]["maximum"], testenv::MAX_MEMORY_MIB);
        assert_eq!(limits["pids"]["minimum"], testenv::MIN_PIDS);
        assert_eq!(limits["pids"]["maximum"], testenv::MAX_PIDS);
        assert_eq!(limits["cpus"]["minimum"], testenv::MIN_CPUS);
    }
    for name in builtins {
        let builtin = &component(&doc, name)["properties"];
        assert_eq!(
            builtin["infra"]["pattern"],
            orchestrator_engine::builtin::NAME_PATTERN
        );
        assert_eq!(
            builtin["servers"]["items"]["pattern"],
            orchestrator_engine::builtin::NAME_PATTERN
        );
    }
}

/// What schemathesis found in issue 17, each checked where it was wrong:
/// the document, and the service's answer.
#[tokio::test]
async fn the_document_and_the_service_agree_where_they_did_not() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let app = app(engine.clone());
    let doc = crate::routes::document::document();

    // `priority` and `meta` are not nullable (they have defaults instead),
    // and the service refuses `null` for them.
    let submission = component(&doc, "WorkflowSubmission");
    let required: Vec<&Value> = submission["required"].as_array().unwrap().iter().collect();
    assert_eq!(required, vec!["template"], "{submission}");
    for field in ["priority", "meta"] {
        let text = submission["properties"][field].to_string();
        assert!(!text.contains("null"), "{field} is nullable: {text}");
        let body = json!({"template": "servers-create", field: null});
        let response = send(
            &app,
            request(Method::POST, "/workflows/validate", body.to_string()),
        )
        .await;
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{field}: null"
        );
    }
    // An empty token name or secret value is refused, and the document says so.
    assert_eq!(
        component(&doc, "NewToken")["properties"]["name"]["minLength"],
        1
    );
    assert_eq!(
        component(&doc, "NewSecret")["properties"]["value"]["minLength"],
        1
    );
    for (method, path, body) in [
        (
            Method::POST,
            "/tokens",
            json!({"name": "", "role": "viewer"}),
        ),
        (
            Method::POST,
            "/tokens",
            json!({"name": " padded", "role": "viewer"}),
        ),
        (Method::PUT, "/secrets/probe", json!({"value": ""})),
    ] {
        let response = send(&app, request(method, path, body.to_string())).await;
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{path} {body}"
        );
    }
    // An offset beyond the documented maximum is refused, naming it.
    let response = send(
        &app,
        request(Method::GET, "/tasks?offset=4294967296", Body::empty()),
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(body_json(response).await.to_string().contains("offset"));
    // 429 is documented everywhere, /health included; /metrics may be
    // called without a credential (from loopback).
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            assert!(
                operation["responses"]["429"].is_object(),
                "{method} {path} does not document 429"
            );
        }
    }
    let metrics = &doc["paths"]["/metrics"]["get"]["security"];
    assert!(
        metrics.as_array().unwrap().contains(&json!({})),
        "{metrics}"
    );
    // Links name their operation as OpenAPI spells it, and it exists.
    let link = &doc["paths"]["/workflows"]["post"]["responses"]["202"]["links"]["get"];
    assert_eq!(link["operationId"], "get_workflow", "{link}");
    assert_eq!(
        doc["paths"]["/workflows/{id}"]["get"]["operationId"],
        "get_workflow"
    );
    engine.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn bodies_over_the_limit_get_413_with_the_error_body() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let app = app(engine.clone());
    let big = vec![b' '; crate::MAX_BODY_BYTES + 1];
    // Refused by its Content-Length before the handler runs (a body
    // streamed without one is refused by the extractor: tests/it/errors.rs).
    let response = send(
        &app,
        Request::builder()
            .method(Method::POST)
            .uri("/workflows")
            .header("content-length", big.len())
            .body(Body::from(big.clone()))
            .unwrap(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(response.headers().contains_key("x-request-id"));
    let body = body_json(response).await;
    assert_eq!(body["error"]["code"], "payload_too_large", "{body}");
    engine.shutdown(Duration::from_secs(5)).await;
}

mod fuzz {
    //! Random and malformed requests at every route: never a `5xx`, never
    //! a panic, and every error in the one JSON error body.

    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    use super::*;

    /// Path segments that trouble parsers: ids of every shape, encodings,
    /// traversal, very long and non-ASCII.
    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("0190f0a0-0000-7000-8000-000000000000".to_owned()),
            Just(uuid::Uuid::now_v7().to_string()),
            Just("servers-create".to_owned()),
            Just("..".to_owned()),
            Just("%2e%2e%2f".to_owned()),
            Just("%ff%fe".to_owned()),
            Just("%00".to_owned()),
            Just("é✓".to_owned()),
            Just("x".repeat(3000)),
            "[a-zA-Z0-9._~-]{0,40}",
            "(%[0-9a-fA-F]{2}){1,6}",
        ]
    }

    /// A route template with its parameters replaced, possibly extended or
    /// with a query string; or a path that is no route.
    fn path(templates: Vec<String>) -> impl Strategy<Value = String> {
        let query = prop_oneof![
            Just(String::new()),
            Just("?limit=1001".to_owned()),
            Just("?limit=-1&offset=x".to_owned()),
            Just("?status=nope&workflow=1".to_owned()),
            Just("?offset=18446744073709551616&limit_bytes=99999999999".to_owned()),
            Just("?version=0".to_owned()),
            "\\?[a-z_]{1,10}=[a-zA-Z0-9%&=]{0,20}",
        ];
        let routed = (
            proptest::sample::select(templates),
            proptest::collection::vec(segment(), 3),
            proptest::bool::weighted(0.1),
            query,
        )
            .prop_map(|(template, segments, extend, query)| {
                let mut segments = segments.into_iter();
                let mut path: String = template
                    .split('/')
                    .map(|part| {
                        if part.starts_with('{') {
                            segments.next().unwrap_or_default()
                        } else {
                            part.to_owned()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("/");
                if extend {
                    path.push('/');
                    path.push_str(&segments.next().unwrap_or_default());
                }
                path + &query
            });
        prop_oneof![
            4 => routed,
            1 => "/[a-zA-Z0-9/%._-]{0,60}",
        ]
    }

    fn method() -> impl Strategy<Value = Method> {
        prop_oneof![
            8 => proptest::sample::select(vec![Method::GET, Method::POST, Method::PUT]),
            2 => proptest::sample::select(vec![
                Method::DELETE, Method::PATCH, Method::HEAD, Method::OPTIONS, Method::TRACE,
            ]),
            1 => "[A-Z]{1,12}".prop_map(|m| Method::from_bytes(m.as_bytes()).unwrap()),
        ]
    }

    /// JSON of any shape, with the API's field names often enough to get
    /// past the first checks.
    fn json_value() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            proptest::sample::select(vec![
                "template",
                "vars",
                "meta",
                "schedule",
                "when",
                "start",
                "ref",
                "infra",
                "servers",
                "taskservs",
                "cluster",
                "settings",
                "priority",
                "max_attempts",
                "timeout_secs",
                "parallel_limit",
                "check_mode",
                "version",
                "steps",
                "script",
                "name",
                "ref_name",
                "inputs",
                "depends_on",
                "for_each",
            ])
            .prop_map(str::to_owned),
            "[a-z_]{1,8}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            Just(json!(u64::MAX)),
            Just(json!("servers-create")),
            Just(json!("web-01")),
            Just(json!("${steps.x.output}")),
            Just(json!("2026-01-01T00:00:00Z")),
            ".{0,20}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 8, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
                proptest::collection::btree_map(key.clone(), inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(Vec::new()),
            proptest::collection::vec(any::<u8>(), 0..200),
            json_value().prop_map(|v| v.to_string().into_bytes()),
            // Valid submissions, then cut short.
            (json_value(), any::<prop::sample::Index>()).prop_map(|(v, cut)| {
                let text = v.to_string().into_bytes();
                let at = cut.index(text.len() + 1);
                text[..at].to_vec()
            }),
            Just(br#"{"infra": "f", "servers": ["a", "a"]}"#.to_vec()),
            Just(br#"{"template": {"ref_name": "x", "steps": []}}"#.to_vec()),
            Just(b"[1, 2".to_vec()),
            Just("{\"infra\": \"\u{0}\"}".as_bytes().to_vec()),
        ]
    }

    fn headers() -> impl Strategy<Value = Vec<(&'static str, String)>> {
        let value = prop_oneof![
            Just(String::new()),
            Just("application/json".to_owned()),
            Just("text/plain; charset=latin1".to_owned()),
            Just("Bearer x".to_owned()),
            Just("orch_session=eyJ0IjoieCJ9.AAAA".to_owned()),
            Just("orch_session=..; orch_session=".to_owned()),
            Just("x".repeat(300)),
            "[ -~]{0,40}",
        ];
        proptest::collection::vec(
            (
                proptest::sample::select(vec![
                    "content-type",
                    "idempotency-key",
                    "authorization",
                    "x-request-id",
                    "accept",
                    "content-encoding",
                    "origin",
                    "cookie",
                    "x-csrf-token",
                ]),
                value,
            ),
            0..4,
        )
    }

    #[test]
    fn no_request_gets_a_5xx_or_a_panic() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let engine = runtime.block_on(engine(dir.path()));
        let app = app(engine.clone());
        let templates: Vec<String> = router_paths().into_iter().collect();
        let mut runner = TestRunner::new(Config {
            cases: 400,
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = (method(), path(templates), headers(), body());
        let statuses = std::sync::Mutex::new(std::collections::BTreeMap::<u16, usize>::new());
        let result = runner.run(&strategy, |(method, path, headers, body)| {
            let mut builder = Request::builder().method(method.clone()).uri(&path);
            for (name, value) in &headers {
                builder = builder.header(*name, value);
            }
            let Ok(request) = builder.body(Body::from(body)) else {
                return Ok(()); // not a valid HTTP request at all
            };
            let (status, content_type, error) = runtime.block_on(async {
                let response = send(&app, request).await;
                let status = response.status();
                let content_type = response
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap_or("").to_owned());
                let json = if status.is_client_error() || status.is_server_error() {
                    body_json(response).await
                } else {
                    Value::Null
                };
                (status, content_type, json)
            });
            *statuses.lock().unwrap().entry(status.as_u16()).or_default() += 1;
            prop_assert!(
                !status.is_server_error(),
                "{method} {path} {headers:?} -> {status} {error}"
            );
            if status.is_client_error() && method != Method::HEAD {
                prop_assert!(
                    error["error"]["code"].is_string() && error["error"]["message"].is_string(),
                    "{method} {path} -> {status} {content_type:?} without the error body"
                );
            }
            Ok(())
        });
        runtime.block_on(engine.shutdown(Duration::from_secs(5)));
        if let Err(e) = result {
            panic!("{e}");
        }
        // The cases reached the handlers, not only the routing.
        let statuses = statuses.into_inner().unwrap();
        let reached: usize = statuses
            .iter()
            .filter(|(s, _)| !matches!(**s, 404 | 405))
            .map(|(_, n)| n)
            .sum();
        assert!(reached > 50, "{statuses:?}");
    }
}

/// The process-wide JSON log sink, installed once.
fn json_log_buffer() -> LogBuffer {
    static BUFFER: std::sync::OnceLock<LogBuffer> = std::sync::OnceLock::new();
    BUFFER
        .get_or_init(|| {
            let buffer = LogBuffer::default();
            let writer = buffer.clone();
            let subscriber = tracing_subscriber::fmt()
                .json()
                .with_env_filter("info")
                .with_writer(move || writer.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in the API tests");
            tracing::callsite::rebuild_interest_cache();
            buffer
        })
        .clone()
}

/// A log sink.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn json_logs_carry_the_request_id_and_responses_echo_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path()).await;
    let app = app(engine.clone());
    // The JSON format of `--log-format json`, as the process's subscriber:
    // a thread-local one loses lines whenever a test on another thread has
    // cached "no interest" for a callsite first. Other tests' lines land
    // here too; only this test's request ids are looked at.
    let buffer = json_log_buffer();
    let mut request = request(Method::GET, "/tasks/nope", Body::empty());
    request
        .headers_mut()
        .insert("x-request-id", "req-42".parse().unwrap());
    let response = send(&app, request).await;
    assert_eq!(response.headers()["x-request-id"], "req-42");
    // Without one, the service makes one up and returns it.
    let response = send(
        &app,
        super::tests::request(Method::GET, "/health", Body::empty()),
    )
    .await;
    let generated = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(uuid::Uuid::parse_str(&generated).is_ok(), "{generated}");
    let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let of_request = |id: &str| {
        lines
            .iter()
            .filter(|l| l["span"]["request_id"] == id)
            .count()
    };
    assert!(of_request("req-42") >= 1, "{text}");
    assert!(of_request(&generated) >= 1, "{text}");
    // Every line logged inside a request names its request.
    for line in &lines {
        if line["span"]["name"] == "request" {
            assert!(line["span"]["request_id"].is_string(), "{line}");
        }
    }
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The door's table as the operations declare it (`declarations`), read
/// from the whole document.
mod declared {
    use axum::http::Method;
    use orchestrator_core::access::Role;

    use crate::declarations::{Declarations, Need, operations};

    fn declarations() -> Declarations {
        Declarations::from_document(&crate::routes::document::document_model())
            .expect("every operation declares its role")
    }

    fn need(method: Method, path: Option<&str>) -> Need {
        declarations().of(&method, path).need
    }

    fn audit(method: Method, path: &str) -> Option<String> {
        declarations().of(&method, Some(path)).audit
    }

    #[test]
    fn reads_go_to_viewers_changes_to_operators_and_the_rest_as_declared() {
        let (get, post) = (Method::GET, Method::POST);
        assert_eq!(need(get.clone(), Some("/health")), Need::Open);
        assert_eq!(need(get.clone(), Some("/tasks")), Need::Role(Role::Viewer));
        assert_eq!(need(Method::HEAD, Some("/tasks")), Need::Role(Role::Viewer));
        assert_eq!(
            need(post.clone(), Some("/workflows")),
            Need::Role(Role::Operator)
        );
        // Checking a template changes nothing.
        assert_eq!(
            need(post.clone(), Some("/workflows/validate")),
            Need::Role(Role::Viewer)
        );
        assert_eq!(need(post.clone(), Some("/tokens")), Need::Role(Role::Admin));
        assert_eq!(need(get.clone(), Some("/audit")), Need::Role(Role::Admin));
        // A backup holds every record: token hashes and sealed secrets too.
        assert_eq!(need(post.clone(), Some("/backup")), Need::Role(Role::Admin));
        assert_eq!(need(post.clone(), Some("/prune")), Need::Role(Role::Admin));
        assert_eq!(
            need(Method::PUT, Some("/secrets/{name}")),
            Need::Role(Role::Admin)
        );
        assert_eq!(
            need(get.clone(), Some("/admin/storage/migrations/{id}")),
            Need::Role(Role::Admin)
        );
        assert_eq!(
            need(Method::PUT, Some("/tasks/{id}/checkpoint")),
            Need::Checkpoint
        );
        assert_eq!(need(Method::DELETE, None), Need::Role(Role::Viewer));
        assert_eq!(need(get.clone(), Some("/metrics")), Need::Metrics);
        // The dashboard's files and sign-out are open; a session needs a role.
        assert_eq!(need(get.clone(), Some("/ui/{*path}")), Need::Open);
        assert_eq!(need(post.clone(), Some("/ui/logout")), Need::Open);
        assert_eq!(
            need(post.clone(), Some("/ui/session")),
            Need::Role(Role::Viewer)
        );
        assert_eq!(need(get.clone(), Some("/ui/session")), Need::Optional);
        // A method the route does not have: a change needs an operator.
        assert_eq!(
            need(Method::DELETE, Some("/tasks")),
            Need::Role(Role::Operator)
        );
    }

    #[test]
    fn every_change_declares_its_audit_action() {
        assert_eq!(
            audit(Method::POST, "/workflows/{id}/cancel").as_deref(),
            Some("workflow.cancel")
        );
        assert_eq!(
            audit(Method::DELETE, "/tokens/{id}").as_deref(),
            Some("token.revoke")
        );
        assert_eq!(audit(Method::POST, "/workflows/validate"), None);
        assert_eq!(audit(Method::POST, "/schedules/preview"), None);
        assert_eq!(audit(Method::GET, "/audit"), None);
        assert_eq!(
            audit(Method::PATCH, "/tasks/{id}").as_deref(),
            Some("patch /tasks/{id}")
        );
        // Whatever is declared: every operation that changes something
        // names its action (validating a template, or previewing a
        // schedule's times, changes nothing).
        let document = crate::routes::document::document_model();
        for (path, item) in &document.paths.paths {
            for (method, operation) in operations(item) {
                let declared = declarations().of(&method, Some(path));
                let changes = method != Method::GET
                    && path != "/workflows/validate"
                    && path != "/schedules/preview";
                assert_eq!(
                    declared.audit.is_some(),
                    changes,
                    "{method} {path} ({:?})",
                    operation.operation_id
                );
            }
        }
    }

    #[test]
    fn an_operation_without_a_role_is_refused_naming_it() {
        let mut document = crate::routes::document::document_model();
        let item = document.paths.paths.get_mut("/tasks").unwrap();
        item.get.as_mut().unwrap().extensions = None;
        let error = Declarations::from_document(&document).unwrap_err();
        assert!(
            error.starts_with("GET /tasks: declares no valid x-role"),
            "{error}"
        );
    }
}

/// The document has one schema per name, and utoipa keeps the last of two
/// types that derive `ToSchema` under the same name, silently: one
/// answer is then documented with the other's schema (it happened twice,
/// `Schedule` and `NodeView`). Every type of the workspace that derives
/// `ToSchema` has a name of its own (its `schema(as = ...)` where it has
/// one).
mod schema_names {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                rust_files(&path, into);
            } else if path.extension().is_some_and(|e| e == "rs") {
                into.push(path);
            }
        }
    }

    /// The schema name of each item after attributes that derive
    /// `ToSchema`, with where it is.
    fn schema_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut attributes = String::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with("#[") || (!attributes.is_empty() && line.starts_with("//")) {
                attributes.push_str(line);
                continue;
            }
            let item = line
                .split_whitespace()
                .skip_while(|w| w.starts_with("pub"))
                .collect::<Vec<_>>();
            if let [kind, name, ..] = item.as_slice()
                && (*kind == "struct" || *kind == "enum")
                && attributes.contains("ToSchema")
            {
                let own = name
                    .split(['<', '(', '{', ';'])
                    .next()
                    .unwrap_or(name)
                    .to_owned();
                let given = attributes.split("schema(as = ").nth(1).map(|rest| {
                    rest.split([')', ','])
                        .next()
                        .unwrap_or_default()
                        .rsplit("::")
                        .next()
                        .unwrap_or_default()
                        .trim()
                        .to_owned()
                });
                names.push(given.unwrap_or(own));
            }
            if !line.starts_with("///") {
                attributes.clear();
            }
        }
        names
    }

    #[test]
    fn every_schema_has_a_name_of_its_own() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for krate in std::fs::read_dir(&crates).unwrap().flatten() {
            let src = krate.path().join("src");
            if src.is_dir() {
                rust_files(&src, &mut files);
            }
        }
        let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            for name in schema_names(&text) {
                seen.entry(name)
                    .or_default()
                    .push(file.strip_prefix(&crates).unwrap().display().to_string());
            }
        }
        assert!(seen.len() > 50, "too few schemas found: {seen:?}");
        let twice: Vec<_> = seen.iter().filter(|(_, at)| at.len() > 1).collect();
        assert!(twice.is_empty(), "schema names used twice: {twice:?}");
    }

    #[test]
    fn a_name_given_with_as_is_the_schema_name() {
        let text = "#[derive(Serialize, ToSchema)]\n#[schema(as = MigrationStatus)]\npub struct MoveStatus {\n}\n\
                    /// Doc.\n#[derive(ToSchema)]\npub(crate) enum Phase {}\n#[derive(Debug)]\nstruct Plain;\n";
        assert_eq!(schema_names(text), ["MigrationStatus", "Phase"]);
    }
}
