//! Tokens, roles, rate limits and the audit log, through HTTP and the CLI:
//! every route against no token, a bad token and each role.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use orchestrator::settings::ServeSettings;
use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");
pub(crate) const ADMIN: &str = "bootstrap-admin-token-for-the-auth-tests-0123456789";

pub(crate) fn with_auth(dir: &std::path::Path) -> ServeSettings {
    let mut settings = fixture_settings(dir);
    settings.auth = true;
    settings.rate_limit = 0;
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(ADMIN));
    settings
}

/// One request with an optional bearer token: (status, body).
pub(crate) async fn call(
    service: &TestService,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = service
        .http
        .request(method, format!("{}{path}", service.base));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    // An event stream never ends: its status is the answer.
    let streams = response
        .headers()
        .get("content-type")
        .is_some_and(|t| t == "text/event-stream");
    if streams {
        return (status, Value::Null);
    }
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A bootstrap token shaped like the service's own (`orch_<id>_<secret>`)
/// is found by its id part, as the service's tokens are.
#[tokio::test]
async fn a_bootstrap_token_shaped_like_the_service_s_own_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    let token = "orch_0a1b2c_rescue-secret-of-enough-length-0123456789";
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(token));
    let service = TestService::start(settings).await;
    let (status, body) = call(&service, "GET", "/tokens", Some(token), None).await;
    assert_eq!(status, 200, "{body}");
    let ids: Vec<&str> = body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["0a1b2c"], "stored under its id part");
    let (status, _) = call(
        &service,
        "GET",
        "/tokens",
        Some("orch_0a1b2c_wrong-secret"),
        None,
    )
    .await;
    assert_eq!(status, 401, "the id alone opens nothing");
    service.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(
        "orch_not/an:id_rescue-secret-of-enough-length-0123456789",
    ));
    let err = orchestrator::service::start(settings)
        .await
        .err()
        .expect("refused");
    let message = format!("{err:#}");
    assert!(
        message.contains("ORCHESTRATOR_BOOTSTRAP_TOKEN"),
        "{message}"
    );
}

pub(crate) async fn create_token(service: &TestService, name: &str, role: &str) -> String {
    let (status, body) = call(
        service,
        "POST",
        "/tokens",
        Some(ADMIN),
        Some(json!({"name": name, "role": role})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_owned()
}

/// Who may call a route: `None` for anyone.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Min {
    Anyone,
    Viewer,
    Operator,
    Admin,
}

#[tokio::test]
async fn every_route_answers_each_caller_as_its_role_allows_and_is_audited() {
    const NO_ENV: &str = "0190f0a0-0000-7000-8000-000000000000";
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(with_auth(dir.path())).await;
    let viewer = create_token(&service, "viewer-1", "viewer").await;
    let operator = create_token(&service, "operator-1", "operator").await;
    create_token(&service, "spare", "viewer").await;
    let (_, listed) = call(&service, "GET", "/tokens", Some(ADMIN), None).await;
    let revocable = listed["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "spare")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Something to point the routes at.
    let (status, submitted) = call(
        &service,
        "POST",
        "/workflows/servers/create",
        Some(&operator),
        Some(json!({"infra": "t", "servers": ["ok-1"], "wait": true})),
    )
    .await;
    assert_eq!(status, 200, "{submitted}");
    let workflow = submitted["workflow_id"].as_str().unwrap().to_owned();
    let task = submitted["task_ids"][0].as_str().unwrap().to_owned();

    let (status, created) = call(
        &service,
        "POST",
        "/schedules",
        Some(&operator),
        Some(json!({"template": "chain", "cron": "0 3 * * *", "timezone": "Europe/Berlin"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let schedule = created["id"].as_str().unwrap().to_owned();

    let servers = json!({"infra": "t", "servers": ["ok-2"]});
    let template = json!({"template": "chain", "vars": {}});
    // (method, template, concrete path, body, who may call it)
    let routes: Vec<(&str, &str, String, Option<Value>, Min)> = vec![
        ("GET", "/health", "/health".into(), None, Min::Anyone),
        (
            "GET",
            "/openapi.json",
            "/openapi.json".into(),
            None,
            Min::Anyone,
        ),
        // Asked from loopback: open (elsewhere it needs a token).
        ("GET", "/metrics", "/metrics".into(), None, Min::Anyone),
        ("GET", "/tasks", "/tasks".into(), None, Min::Viewer),
        (
            "GET",
            "/events",
            format!("/events?workflow={workflow}"),
            None,
            Min::Viewer,
        ),
        (
            "GET",
            "/tasks/{id}",
            format!("/tasks/{task}"),
            None,
            Min::Viewer,
        ),
        (
            "GET",
            "/tasks/{id}/logs",
            format!("/tasks/{task}/logs"),
            None,
            Min::Viewer,
        ),
        (
            "POST",
            "/tasks/{id}/cancel",
            format!("/tasks/{task}/cancel"),
            None,
            Min::Operator,
        ),
        (
            "GET",
            "/tasks/{id}/checkpoint",
            format!("/tasks/{task}/checkpoint"),
            None,
            Min::Operator,
        ),
        (
            "PUT",
            "/tasks/{id}/checkpoint",
            format!("/tasks/{task}/checkpoint"),
            Some(json!({"k": 1})),
            Min::Operator,
        ),
        ("GET", "/workflows", "/workflows".into(), None, Min::Viewer),
        (
            "POST",
            "/workflows",
            "/workflows".into(),
            Some(template.clone()),
            Min::Operator,
        ),
        (
            "POST",
            "/workflows/validate",
            "/workflows/validate".into(),
            Some(template),
            Min::Viewer,
        ),
        (
            "GET",
            "/workflows/{id}",
            format!("/workflows/{workflow}"),
            None,
            Min::Viewer,
        ),
        (
            "GET",
            "/workflows/{a}/compare/{b}",
            format!("/workflows/{workflow}/compare/{workflow}"),
            None,
            Min::Viewer,
        ),
        (
            "POST",
            "/workflows/{id}/cancel",
            format!("/workflows/{workflow}/cancel"),
            None,
            Min::Operator,
        ),
        ("GET", "/approvals", "/approvals".into(), None, Min::Viewer),
        (
            "GET",
            "/workflows/{id}/approval",
            format!("/workflows/{workflow}/approval"),
            None,
            Min::Viewer,
        ),
        // The gate's own rule says who decides: the door asks for any
        // valid token (and there is no gate here: 409).
        (
            "POST",
            "/workflows/{id}/approve",
            format!("/workflows/{workflow}/approve"),
            Some(json!({"digest": "0".repeat(64)})),
            Min::Viewer,
        ),
        (
            "POST",
            "/workflows/{id}/reject",
            format!("/workflows/{workflow}/reject"),
            Some(json!({"digest": "0".repeat(64)})),
            Min::Viewer,
        ),
        (
            "POST",
            "/workflows/{id}/retry",
            format!("/workflows/{workflow}/retry"),
            None,
            Min::Operator,
        ),
        (
            "POST",
            "/workflows/{id}/rerun",
            format!("/workflows/{workflow}/rerun"),
            Some(json!({"from": "server"})),
            Min::Operator,
        ),
        (
            "POST",
            "/workflows/{id}/pause",
            format!("/workflows/{workflow}/pause"),
            None,
            Min::Operator,
        ),
        (
            "POST",
            "/workflows/{id}/resume",
            format!("/workflows/{workflow}/resume"),
            None,
            Min::Operator,
        ),
        ("GET", "/schedules", "/schedules".into(), None, Min::Viewer),
        (
            "POST",
            "/schedules/preview",
            "/schedules/preview".into(),
            Some(json!({"cron": "*/15 * * * *", "timezone": "Europe/Berlin"})),
            Min::Viewer,
        ),
        (
            "POST",
            "/schedules",
            "/schedules".into(),
            Some(json!({"template": "chain", "cron": "0 4 * * *", "paused": true})),
            Min::Operator,
        ),
        (
            "GET",
            "/schedules/{id}",
            format!("/schedules/{schedule}"),
            None,
            Min::Viewer,
        ),
        (
            "PATCH",
            "/schedules/{id}",
            format!("/schedules/{schedule}"),
            Some(json!({"paused": true})),
            Min::Operator,
        ),
        (
            "DELETE",
            "/schedules/{id}",
            format!("/schedules/{schedule}"),
            None,
            Min::Operator,
        ),
        (
            "GET",
            "/cluster/nodes",
            "/cluster/nodes".into(),
            None,
            Min::Viewer,
        ),
        ("GET", "/locks", "/locks".into(), None, Min::Viewer),
        ("GET", "/templates", "/templates".into(), None, Min::Viewer),
        (
            "GET",
            "/templates/{ref_name}",
            "/templates/chain".into(),
            None,
            Min::Viewer,
        ),
        (
            "POST",
            "/workflows/servers/create",
            "/workflows/servers/create".into(),
            Some(servers.clone()),
            Min::Operator,
        ),
        (
            "POST",
            "/workflows/taskserv/create",
            "/workflows/taskserv/create".into(),
            Some(json!({"infra": "t", "server": "ok-1", "taskservs": ["containerd"]})),
            Min::Operator,
        ),
        (
            "POST",
            "/workflows/cluster/create",
            "/workflows/cluster/create".into(),
            Some(json!({"infra": "t", "cluster": "c", "servers": ["ok-3"]})),
            Min::Operator,
        ),
        ("GET", "/tokens", "/tokens".into(), None, Min::Admin),
        (
            "POST",
            "/tokens",
            "/tokens".into(),
            Some(json!({"name": "made", "role": "viewer"})),
            Min::Admin,
        ),
        (
            "DELETE",
            "/tokens/{id}",
            format!("/tokens/{revocable}"),
            None,
            Min::Admin,
        ),
        ("GET", "/audit", "/audit".into(), None, Min::Admin),
        (
            "GET",
            "/workflows/counts",
            "/workflows/counts".into(),
            None,
            Min::Viewer,
        ),
        // The dashboard: its files load before signing in; a session is
        // made from the caller's own bearer token.
        ("GET", "/ui", "/ui".into(), None, Min::Anyone),
        ("GET", "/ui/", "/ui/".into(), None, Min::Anyone),
        ("GET", "/ui/{path}", "/ui/app.js".into(), None, Min::Anyone),
        (
            "GET",
            "/ui/session",
            "/ui/session".into(),
            None,
            Min::Viewer,
        ),
        (
            "POST",
            "/ui/session",
            "/ui/session".into(),
            None,
            Min::Viewer,
        ),
        ("POST", "/ui/logout", "/ui/logout".into(), None, Min::Anyone),
        ("GET", "/secrets", "/secrets".into(), None, Min::Admin),
        (
            "PUT",
            "/secrets/{name}",
            "/secrets/s1".into(),
            Some(json!({"value": "v-1234"})),
            Min::Admin,
        ),
        (
            "PATCH",
            "/secrets/{name}",
            "/secrets/s1".into(),
            Some(json!({"templates": ["chain"]})),
            Min::Admin,
        ),
        (
            "DELETE",
            "/secrets/{name}",
            "/secrets/s1".into(),
            None,
            Min::Admin,
        ),
        // A webhook's target URL is itself a credential (Slack's): every
        // webhook operation is the admin's, reading the log included.
        ("GET", "/webhooks", "/webhooks".into(), None, Min::Admin),
        (
            "POST",
            "/webhooks",
            "/webhooks".into(),
            Some(json!({"url": "http://127.0.0.1:9/hook", "events": ["workflow.failed"]})),
            Min::Admin,
        ),
        (
            "DELETE",
            "/webhooks/{id}",
            "/webhooks/wh_unknown".into(),
            None,
            Min::Admin,
        ),
        (
            "GET",
            "/webhook-deliveries",
            "/webhook-deliveries".into(),
            None,
            Min::Admin,
        ),
        (
            "POST",
            "/webhook-deliveries/{id}/resend",
            "/webhook-deliveries/msg_unknown/resend".into(),
            None,
            Min::Admin,
        ),
        // A backup holds every record, token hashes and sealed secrets too.
        ("POST", "/backup", "/backup".into(), None, Min::Admin),
        // A prune deletes history, the audit log included.
        (
            "POST",
            "/prune",
            "/prune".into(),
            Some(json!({"older_than": "3650d", "dry_run": true})),
            Min::Admin,
        ),
        // Live storage migration: a refused target, an unknown id and a
        // rollback with no switch, so that the store stays where it is
        // (tests/it/storage_moves.rs moves it).
        (
            "GET",
            "/admin/storage",
            "/admin/storage".into(),
            None,
            Min::Admin,
        ),
        (
            "GET",
            "/admin/storage/migrations",
            "/admin/storage/migrations".into(),
            None,
            Min::Admin,
        ),
        (
            "POST",
            "/admin/storage/migrations",
            "/admin/storage/migrations".into(),
            Some(json!({"target": "filesystem:relative/dir"})),
            Min::Admin,
        ),
        (
            "GET",
            "/admin/storage/migrations/{id}",
            "/admin/storage/migrations/nope".into(),
            None,
            Min::Admin,
        ),
        (
            "POST",
            "/admin/storage/migrations/{id}/cancel",
            "/admin/storage/migrations/nope/cancel".into(),
            None,
            Min::Admin,
        ),
        (
            "POST",
            "/admin/storage/rollback",
            "/admin/storage/rollback".into(),
            None,
            Min::Admin,
        ),
        // Test environments: refused bodies and unknown ids, so that
        // nothing is made here (tests/it/testenv.rs makes them).
        (
            "POST",
            "/test/environments/create",
            "/test/environments/create".into(),
            Some(json!({"type": "single_taskserv", "taskserv": "no-such-taskserv"})),
            Min::Operator,
        ),
        (
            "GET",
            "/test/environments",
            "/test/environments".into(),
            None,
            Min::Viewer,
        ),
        (
            "GET",
            "/test/environments/{id}",
            format!("/test/environments/{NO_ENV}"),
            None,
            Min::Viewer,
        ),
        (
            "POST",
            "/test/environments/{id}/run",
            format!("/test/environments/{NO_ENV}/run"),
            None,
            Min::Operator,
        ),
        (
            "DELETE",
            "/test/environments/{id}",
            format!("/test/environments/{NO_ENV}"),
            None,
            Min::Operator,
        ),
        (
            "GET",
            "/test/environments/{id}/logs",
            format!("/test/environments/{NO_ENV}/logs"),
            None,
            Min::Viewer,
        ),
        (
            "GET",
            "/test/topologies",
            "/test/topologies".into(),
            None,
            Min::Viewer,
        ),
        (
            "GET",
            "/test/topologies/{name}",
            "/test/topologies/etcd_cluster".into(),
            None,
            Min::Viewer,
        ),
    ];

    // Every route the service documents is in the table.
    let (_, openapi) = call(&service, "GET", "/openapi.json", None, None).await;
    let documented: BTreeSet<(String, String)> = openapi["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|m| ["get", "post", "put", "delete", "patch"].contains(&m.as_str()))
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let tested: BTreeSet<(String, String)> = routes
        .iter()
        .map(|(m, t, ..)| ((*m).to_owned(), (*t).to_owned()))
        .collect();
    let untested: Vec<_> = documented.difference(&tested).collect();
    assert!(
        untested.is_empty(),
        "routes missing from the auth matrix: {untested:?}"
    );

    let callers = [
        ("no token", None, 0),
        ("bad token", Some("orch_0190_notarealtoken"), 0),
        ("viewer", Some(viewer.as_str()), 1),
        ("operator", Some(operator.as_str()), 2),
        ("admin", Some(ADMIN), 3),
    ];
    for (method, template, path, body, min) in &routes {
        for (who, token, rank) in callers {
            let (status, answer) = call(&service, method, path, token, body.clone()).await;
            let needed = match min {
                Min::Anyone => 0,
                Min::Viewer => 1,
                Min::Operator => 2,
                Min::Admin => 3,
            };
            let expected_denial = if rank >= needed {
                None
            } else if rank == 0 {
                Some(401)
            } else {
                Some(403)
            };
            match expected_denial {
                Some(code) => {
                    assert_eq!(status, code, "{method} {template} as {who}: {answer}");
                    assert_eq!(
                        answer["error"]["code"],
                        if code == 401 {
                            "unauthorized"
                        } else {
                            "forbidden"
                        }
                    );
                }
                None => assert!(
                    status != 401 && status != 403 && status < 500,
                    "{method} {template} as {who}: {status} {answer}"
                ),
            }
        }
    }

    // The audit log has every change and every refusal, and no token.
    let (status, audit) = call(&service, "GET", "/audit?limit=1000", Some(ADMIN), None).await;
    assert_eq!(status, 200, "{audit}");
    let records = audit["records"].as_array().unwrap();
    for (method, template, _, _, min) in &routes {
        if *method == "GET" || *template == "/workflows/validate" {
            continue;
        }
        let mine: Vec<&Value> = records
            .iter()
            .filter(|r| {
                r["status"].as_u64().is_some_and(|s| s != 401 && s != 403)
                    && r["actor"]
                        == if *min == Min::Admin {
                            "bootstrap"
                        } else {
                            "operator-1"
                        }
            })
            .filter(|r| {
                let action = r["action"].as_str().unwrap();
                // `/admin/<resource>/...` is audited as `<resource>.<verb>`;
                // `/webhook-deliveries/...` as `webhook.<verb>`.
                template
                    .trim_start_matches("/admin")
                    .split('/')
                    .find(|s| !s.is_empty())
                    .and_then(|first| first.split('-').next())
                    .is_some_and(|first| action.starts_with(first.trim_end_matches('s')))
            })
            .collect();
        assert!(!mine.is_empty(), "no audit record for {method} {template}");
    }
    let denied: Vec<&Value> = records
        .iter()
        .filter(|r| r["outcome"] == "denied")
        .collect();
    assert!(
        denied
            .iter()
            .any(|r| r["actor"] == "anonymous" && r["status"] == 401)
    );
    assert!(
        denied
            .iter()
            .any(|r| r["actor"] == "viewer-1" && r["status"] == 403)
    );
    let cancel = records
        .iter()
        .find(|r| r["action"] == "workflow.cancel" && r["actor"] == "operator-1")
        .unwrap();
    assert_eq!(cancel["target"], workflow.as_str());
    assert_eq!(cancel["role"], "operator");
    assert!(
        cancel["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    // Newest first: the last is the first submission.
    let submit = records
        .iter()
        .rev()
        .find(|r| r["action"] == "workflow.submit_servers" && r["outcome"] == "ok")
        .unwrap();
    assert_eq!(
        submit["target"],
        workflow.as_str(),
        "the created workflow is the target"
    );
    let text = audit.to_string();
    for secret in [ADMIN, viewer.as_str(), operator.as_str()] {
        assert!(!text.contains(secret), "a token reached the audit log");
    }
    let (_, filtered) = call(
        &service,
        "GET",
        "/audit?action=token.create&actor=bootstrap",
        Some(ADMIN),
        None,
    )
    .await;
    assert!(filtered["total"].as_u64().unwrap() >= 3, "{filtered}");

    // A revoked token is refused from then on.
    let (_, list) = call(&service, "GET", "/tokens", Some(ADMIN), None).await;
    let viewer_id = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "viewer-1")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!list.to_string().contains("hash"), "{list}");
    call(
        &service,
        "DELETE",
        &format!("/tokens/{viewer_id}"),
        Some(ADMIN),
        None,
    )
    .await;
    let (status, _) = call(&service, "GET", "/tasks", Some(&viewer), None).await;
    assert_eq!(status, 401);
    service.stop().await;
}

#[tokio::test]
async fn a_caller_over_its_rate_gets_429_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    settings.rate_limit = 2;
    let service = TestService::start(settings).await;
    let mut limited = None;
    for _ in 0..20 {
        let response = service
            .http
            .get(format!("{}/tasks", service.base))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        if response.status() == 429 {
            limited = Some(response);
            break;
        }
    }
    let response = limited.expect("never limited");
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    // /health is never limited by tokens, and is open.
    assert_eq!(service.get("/health").await.0, 200);
    service.stop().await;
}

/// The bytes under `dir`, recursively: the store's journal and snapshots.
fn bytes_under(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => bytes_under(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

#[tokio::test]
async fn a_flood_of_wrong_tokens_is_limited_by_address_and_audited_in_aggregate() {
    const FLOOD: usize = 4000;
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    settings.address_rate_limit = 100;
    let service = TestService::start(settings).await;
    let viewer = create_token(&service, "viewer-1", "viewer").await;
    let before = bytes_under(&service.data_dir);

    // The flood comes from 127.0.0.2 (any 127/8 address is this machine);
    // the legitimate client keeps 127.0.0.1, and its own rate.
    let flooder = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let url = format!("{}/tasks", service.base);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for batch in 0..FLOOD / 40 {
        let mut requests = tokio::task::JoinSet::new();
        for i in 0..40 {
            let request = flooder
                .get(&url)
                .bearer_auth(format!("wrong-token-{batch}-{i}"));
            requests.spawn(async move { request.send().await.unwrap().status().as_u16() });
        }
        for status in requests.join_all().await {
            *statuses.entry(status).or_default() += 1;
        }
        if batch % 10 == 0 {
            // The service still answers its real clients.
            let (status, _) = call(&service, "GET", "/tasks", Some(&viewer), None).await;
            assert_eq!(status, 200, "during the flood");
        }
    }
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        vec![401, 429],
        "{statuses:?}"
    );
    assert!(statuses[&429] > statuses[&401], "{statuses:?}");

    // A valid token without the role: one record for each refusal.
    for _ in 0..3 {
        let (status, _) = call(&service, "GET", "/tokens", Some(&viewer), None).await;
        assert_eq!(status, 403);
    }

    let (status, audit) = call(&service, "GET", "/audit?limit=1000", Some(ADMIN), None).await;
    assert_eq!(status, 200, "{audit}");
    let records = audit["records"].as_array().unwrap();
    let anonymous: Vec<&Value> = records
        .iter()
        .filter(|r| r["actor"] == "anonymous")
        .collect();
    // Within its first minute, an address gets one record, at once; the
    // rest of its refusals are counted for the next.
    assert_eq!(anonymous.len(), 1, "{anonymous:?}");
    assert_eq!(anonymous[0]["action"], "auth.refused");
    assert_eq!(anonymous[0]["target"], "127.0.0.2");
    assert_eq!(anonymous[0]["count"], 1);
    assert_eq!(anonymous[0]["outcome"], "denied");
    let forbidden = records
        .iter()
        .filter(|r| r["actor"] == "viewer-1" && r["status"] == 403)
        .count();
    assert_eq!(forbidden, 3, "{audit}");

    // Thousands of refusals, and the store grew by a few records' worth
    // (one record per refusal was about 250 bytes each).
    let grown = bytes_under(&service.data_dir).saturating_sub(before);
    assert!(grown < 16 * 1024, "the store grew by {grown} bytes");

    // Every refusal is counted where it happens.
    let (_, metrics) = service.get_text("/metrics").await;
    let refused: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("orchestrator_auth_refusals_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(refused >= FLOOD as f64, "{refused} in {metrics}");
    service.stop().await;
}

#[tokio::test]
async fn a_task_token_opens_its_own_checkpoint_only() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(with_auth(dir.path())).await;
    // The script saves its checkpoint through the API with its own token.
    let (status, body) = call(
        &service,
        "POST",
        "/workflows",
        Some(ADMIN),
        Some(json!({"template": "fault-drill", "vars": {"tag": "t"}, "wait": true})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "completed", "{body}");
    let (_, audit) = call(
        &service,
        "GET",
        "/audit?action=task.checkpoint",
        Some(ADMIN),
        None,
    )
    .await;
    let record = &audit["records"][0];
    assert_eq!(record["outcome"], "ok", "{audit}");
    assert!(
        record["actor"].as_str().unwrap().starts_with("task:"),
        "{audit}"
    );

    // A task token of another task, or for anything else, is refused.
    let other = orchestrator_core::TaskId::new();
    let forged = format!("task_{other}_{}", "0".repeat(64));
    let (status, _) = call(
        &service,
        "GET",
        &format!("/tasks/{other}/checkpoint"),
        Some(&forged),
        None,
    )
    .await;
    assert_eq!(status, 401, "a forged task token");
    service.stop().await;
}

#[test]
fn no_auth_is_refused_off_loopback_and_loud_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args([
            "serve",
            "--no-auth",
            "--bind",
            "0.0.0.0",
            "--port",
            "0",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let text = String::from_utf8_lossy(&output.stderr);
    assert!(
        text.contains("--no-auth is allowed only on a loopback address"),
        "{text}"
    );
}

#[test]
fn the_first_start_prints_an_admin_token_once_and_the_cli_manages_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let start = || start_binary(&data);
    let cli = |url: &str, token: &str, args: &[&str]| {
        let output = Command::new(BIN)
            .args(args)
            .env("ORCHESTRATOR_URL", url)
            .env("ORCHESTRATOR_TOKEN", token)
            .output()
            .unwrap();
        (
            output.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        )
    };

    let (mut child, admin, url) = start();
    let admin = admin.expect("the first start prints the admin token");
    let (ok, text) = cli(
        &url,
        &admin,
        &["token", "create", "--name", "ci", "--role", "viewer"],
    );
    assert!(ok, "{text}");
    let viewer = text.lines().last().unwrap().trim().to_owned();
    assert!(viewer.starts_with("orch_"), "{text}");
    let (ok, listed) = cli(&url, &admin, &["token", "list"]);
    assert!(
        ok && listed.contains("ci") && listed.contains("viewer"),
        "{listed}"
    );
    assert!(!listed.contains(&viewer), "a listing shows no token");
    let (ok, text) = cli(&url, &viewer, &["tasks"]);
    assert!(ok, "{text}");
    let (ok, text) = cli(&url, &viewer, &["token", "list"]);
    assert!(!ok && text.contains("this needs the admin role"), "{text}");
    let (ok, text) = cli(&url, "", &["tasks"]);
    assert!(!ok && text.contains("ORCHESTRATOR_TOKEN"), "{text}");
    let id = listed
        .lines()
        .find(|l| l.contains(" ci "))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    let (ok, text) = cli(&url, &admin, &["token", "revoke", &id]);
    assert!(ok, "{text}");
    let (ok, text) = cli(&url, &viewer, &["tasks"]);
    assert!(!ok && text.contains("unknown or revoked"), "{text}");
    let (ok, text) = cli(&url, &admin, &["audit", "--action", "token.revoke"]);
    assert!(
        ok && text.contains("token.revoke") && text.contains(&id),
        "{text}"
    );
    nix_kill(&mut child);

    // A restart prints no new token: the store has an admin.
    let (mut child, again, url) = start();
    assert_eq!(again, None);
    let (ok, text) = cli(&url, &admin, &["token", "list"]);
    assert!(ok, "{text}");
    nix_kill(&mut child);
}

fn nix_kill(child: &mut std::process::Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
}

/// A secret planted in the store reaches its script, and nothing else: no
/// API answer, no log, no stored byte, no service log line holds it.
#[test]
fn a_planted_secret_reaches_its_script_and_nothing_else() {
    use sha2::Digest;

    const PLANTED: &str = "PLANTED-s3cr3t-VALUE-4242";
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Where a sandboxed script can write and the test can read: the
    // scripts' state dir.
    let proof = crate::harness::script_state(&data).join("proof");
    let log_path = dir.path().join("service.log");
    let log_file = std::fs::File::create(&log_path).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0", "--log-format", "json", "--data-dir"])
        .arg(&data)
        .arg("--scripts-dir")
        .arg(crate::harness::fixture_scripts())
        .arg("--templates-dir")
        .arg(crate::harness::fixture_templates())
        .env("ORCHESTRATOR_BOOTSTRAP_TOKEN", ADMIN)
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .unwrap();
    let url = {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(at) = log.find("listening on http://") {
                let rest = &log[at + "listening on ".len()..];
                break rest
                    .split(|c: char| c.is_whitespace() || c == '"')
                    .next()
                    .unwrap()
                    .to_owned();
            }
            assert!(std::time::Instant::now() < deadline, "no address: {log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut answers = String::new();
    runtime.block_on(async {
        let http = reqwest::Client::new();
        let send = |method: reqwest::Method, path: String, body: Option<Value>| {
            let mut request = http
                .request(method, format!("{url}{path}"))
                .bearer_auth(ADMIN);
            if let Some(body) = body {
                request = request.json(&body);
            }
            async move {
                let response = request.send().await.unwrap();
                (response.status().as_u16(), response.text().await.unwrap())
            }
        };
        let (status, body) = send(
            reqwest::Method::PUT,
            "/secrets/db_password".into(),
            Some(json!({"value": PLANTED, "templates": ["secret-use"]})),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        answers.push_str(&body);
        let template = |fail: bool| {
            json!({"template": "secret-use", "max_attempts": 1, "wait": true,
                   "vars": {"proof": proof.display().to_string(), "fail": fail}})
        };
        for fail in [false, true] {
            let (status, body) = send(
                reqwest::Method::POST,
                "/workflows".into(),
                Some(template(fail)),
            )
            .await;
            assert_eq!(status, 200, "{body}");
            let view: Value = serde_json::from_str(&body).unwrap();
            let expected = if fail { "failed" } else { "completed" };
            assert_eq!(view["status"], expected, "{body}");
            let task = view["tasks"][0]["id"].as_str().unwrap().to_owned();
            assert_eq!(
                view["tasks"][0]["input"]["password"],
                "${secrets.db_password}"
            );
            if !fail {
                let output = &view["tasks"][0]["output"];
                assert_eq!(output["echo"], "<redacted>", "{output}");
                assert_eq!(output["db_password"], "<redacted>", "{output}");
                assert_eq!(output["note"], "used <redacted> to connect", "{output}");
                assert_eq!(output["nested"]["api_key"], "<redacted>", "{output}");
            } else {
                let error = view["tasks"][0]["error"].as_str().unwrap();
                assert!(error.contains("<redacted>"), "{error}");
            }
            answers.push_str(&body);
            for path in [
                format!("/tasks/{task}"),
                format!("/tasks/{task}/logs"),
                "/tasks?limit=10".to_owned(),
                "/workflows?limit=10".to_owned(),
                "/secrets".to_owned(),
                "/audit?limit=1000".to_owned(),
                "/metrics".to_owned(),
            ] {
                let (status, body) = send(reqwest::Method::GET, path.clone(), None).await;
                assert_eq!(status, 200, "{path}: {body}");
                answers.push_str(&body);
            }
            let (_, log) = send(reqwest::Method::GET, format!("/tasks/{task}/logs"), None).await;
            assert!(log.contains("with password <redacted>"), "{log}");
        }
        let (_, listed) = send(reqwest::Method::GET, "/secrets".into(), None).await;
        assert!(listed.contains("db_password"), "{listed}");
    });
    // The script did get the value.
    let expected = format!("{:x}", sha2::Sha256::digest(PLANTED.as_bytes()));
    assert_eq!(std::fs::read_to_string(&proof).unwrap(), expected);
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    child.wait().unwrap();

    assert!(!answers.contains(PLANTED), "an API answer holds the secret");
    let service_log = std::fs::read_to_string(&log_path).unwrap();
    assert!(
        !service_log.contains(PLANTED),
        "the service log holds the secret"
    );
    // Every stored byte: journal, snapshot, logs, work dirs.
    let mut stack = vec![data.clone()];
    let mut files = 0;
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path).unwrap() {
            let entry = entry.unwrap().path();
            if entry.is_dir() {
                stack.push(entry);
            } else {
                files += 1;
                let bytes = std::fs::read(&entry).unwrap();
                let text = String::from_utf8_lossy(&bytes);
                assert!(
                    !text.contains(PLANTED),
                    "{} holds the secret",
                    entry.display()
                );
            }
        }
    }
    assert!(files > 3, "the store was searched");
}

/// Starts `orchestrator serve` on `data` with the fixture scripts; returns
/// the process, the admin token it printed (on a first start) and its URL.
fn start_binary(data: &std::path::Path) -> (std::process::Child, Option<String>, String) {
    let mut child = Command::new(BIN)
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(data)
        .args(["--scripts-dir"])
        .arg(crate::harness::fixture_scripts())
        .env_remove("ORCHESTRATOR_BOOTSTRAP_TOKEN")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    let mut token = None;
    let mut url = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.trim_start().starts_with("orch_") {
            token = Some(line.trim().to_owned());
        }
        if let Some(at) = line.find("listening on http://") {
            let rest = &line[at + "listening on ".len()..];
            url = rest.split_whitespace().next().map(str::to_owned);
            break;
        }
    }
    // Keep draining, so the service never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, token, url.expect("the service starts"))
}

/// Every admin token lost: someone with the data dir writes a new one
/// into the store while the service is stopped, and is audited for it.
#[test]
fn a_lost_admin_token_is_recovered_locally_with_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = || {
        let (child, _, url) = start_binary(&data);
        (child, url)
    };
    let local = |args: &[&str]| {
        let output = Command::new(BIN)
            .args(["token", "create", "--local", "--data-dir"])
            .arg(&data)
            .args(args)
            .env_remove("ORCHESTRATOR_TOKEN")
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    // The bootstrap token was printed once, and is now lost.
    let (mut child, _) = serve();
    // While the service runs, the store is its own: refused, saying why.
    let (ok, _, stderr) = local(&["--name", "rescue", "--role", "admin"]);
    assert!(!ok);
    assert!(stderr.contains("in use by a running service"), "{stderr}");
    child.kill().unwrap();
    child.wait().unwrap();
    let (ok, _, stderr) = local(&["--name", "rescue", "--role", "superuser"]);
    assert!(!ok);
    assert!(
        stderr.contains("--role") && stderr.contains("superuser"),
        "{stderr}"
    );
    let (ok, stdout, stderr) = local(&["--name", "rescue", "--role", "admin"]);
    assert!(ok, "{stdout}{stderr}");
    let rescue = stdout.lines().last().unwrap().trim().to_owned();
    assert!(rescue.starts_with("orch_"), "{stdout}");

    let (mut child, url) = serve();
    let audit = Command::new(BIN)
        .args(["audit", "--action", "token.create", "--json"])
        .env("ORCHESTRATOR_URL", &url)
        .env("ORCHESTRATOR_TOKEN", &rescue)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&audit.stdout);
    assert!(
        audit.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&audit.stderr)
    );
    assert!(text.contains("local:"), "the recovery is audited: {text}");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A workflow records the token that submitted it (`submitted_by`),
/// whichever route it came through; a re-run, the token that asked for
/// it. Without auth there is no token to name.
#[tokio::test]
async fn a_workflow_records_the_token_that_submitted_it() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(with_auth(dir.path())).await;
    let alice = create_token(&service, "alice", "operator").await;
    let bob = create_token(&service, "bob", "operator").await;

    let (status, built) = call(
        &service,
        "POST",
        "/workflows/servers/create",
        Some(&alice),
        Some(json!({"infra": "t", "servers": ["ok-1"], "wait": true})),
    )
    .await;
    assert_eq!(status, 200, "{built}");
    let id = built["workflow_id"].as_str().unwrap();
    let (_, workflow) = call(
        &service,
        "GET",
        &format!("/workflows/{id}"),
        Some(&bob),
        None,
    )
    .await;
    assert_eq!(workflow["submitted_by"], "alice", "{workflow}");

    let (status, rerun) = call(
        &service,
        "POST",
        &format!("/workflows/{id}/rerun"),
        Some(&bob),
        Some(json!({"from": "server"})),
    )
    .await;
    assert_eq!(status, 202, "{rerun}");
    assert_eq!(rerun["submitted_by"], "bob", "{rerun}");

    let (status, submitted) = call(
        &service,
        "POST",
        "/workflows",
        Some(&bob),
        Some(json!({"template": "chain", "vars": {}})),
    )
    .await;
    assert_eq!(status, 202, "{submitted}");
    assert_eq!(submitted["submitted_by"], "bob", "{submitted}");

    let open = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(open.path())).await;
    let (status, submitted) = service
        .post("/workflows", json!({"template": "chain", "vars": {}}))
        .await;
    assert_eq!(status, 202, "{submitted}");
    assert!(submitted.get("submitted_by").is_none(), "{submitted}");
}

/// A schedule's runs are submissions of the token that set up what it
/// runs: the one that created it, then the last that changed its inputs.
/// Another token's pause changes nothing of that.
#[tokio::test]
async fn a_schedule_s_runs_are_submitted_by_the_token_that_set_up_what_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(with_auth(dir.path())).await;
    let alice = create_token(&service, "alice", "operator").await;
    let bob = create_token(&service, "bob", "operator").await;
    let (status, created) = call(
        &service,
        "POST",
        "/schedules",
        Some(&alice),
        Some(json!({"template": "chain", "cron": "* * * * * *", "overlap": "queue"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["submitted_by"], "alice", "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    // Some run of the schedule whose workflow `token` submitted.
    let run_of = |token: &'static str| {
        let (service, alice, id) = (&service, &alice, &id);
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let (_, schedule) = call(
                    service,
                    "GET",
                    &format!("/schedules/{id}"),
                    Some(alice),
                    None,
                )
                .await;
                for run in schedule["runs"].as_array().into_iter().flatten() {
                    let Some(workflow) = run["workflow_id"].as_str() else {
                        continue;
                    };
                    let (_, workflow) = call(
                        service,
                        "GET",
                        &format!("/workflows/{workflow}"),
                        Some(alice),
                        None,
                    )
                    .await;
                    if workflow["submitted_by"] == token {
                        return workflow;
                    }
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no run of {token}'s: {schedule}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    run_of("alice").await;

    let (status, paused) = call(
        &service,
        "PATCH",
        &format!("/schedules/{id}"),
        Some(&bob),
        Some(json!({"paused": true})),
    )
    .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["submitted_by"], "alice", "{paused}");
    let (status, changed) = call(
        &service,
        "PATCH",
        &format!("/schedules/{id}"),
        Some(&bob),
        Some(json!({"vars": {"sleep": 0}, "paused": false})),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["submitted_by"], "bob", "{changed}");
    let workflow = run_of("bob").await;
    assert_eq!(workflow["trace_id"], format!("schedule:{id}"), "{workflow}");
}
