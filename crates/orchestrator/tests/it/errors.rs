//! Bad input gets a 4xx with the one error body, naming what is wrong.

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

#[track_caller]
fn check(response: (u16, Value), status: u16, code: &str, mentions: &str) {
    let (got, body) = response;
    assert_eq!(got, status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(mentions),
        "`{message}` should mention `{mentions}`"
    );
}

#[tokio::test]
async fn bad_submissions_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let servers = "/workflows/servers/create";

    check(
        service.post_raw(servers, "{\"infra\": ").await,
        400,
        "invalid_json",
        "malformed JSON",
    );
    check(
        service
            .post_raw(servers, r#"{"infra": "p", "servers": ["a"]} trailing"#)
            .await,
        400,
        "invalid_json",
        "trailing",
    );
    check(
        service.post_raw(servers, "").await,
        400,
        "bad_request",
        "empty",
    );
    check(
        service.post(servers, json!({"infra": "p"})).await,
        422,
        "invalid_request",
        "servers",
    );
    check(
        service.post(servers, json!({"servers": ["a"]})).await,
        422,
        "invalid_request",
        "infra",
    );
    check(
        service
            .post(servers, json!({"infra": "p", "servers": "web-01"}))
            .await,
        422,
        "invalid_request",
        "servers",
    );
    check(
        service
            .post(servers, json!({"infra": "p", "servers": ["a", 7]}))
            .await,
        422,
        "invalid_request",
        "servers[1]",
    );
    check(
        service
            .post(servers, json!({"infra": "p", "servers": []}))
            .await,
        422,
        "invalid_request",
        "servers",
    );
    check(
        service
            .post(servers, json!({"infra": "p", "servers": ["a"], "sever": 1}))
            .await,
        422,
        "invalid_request",
        "sever",
    );
    check(
        service
            .post(
                servers,
                json!({"infra": "p", "servers": ["a"], "priority": "urgent"}),
            )
            .await,
        422,
        "invalid_request",
        "priority",
    );
    check(
        service
            .post(
                servers,
                json!({"infra": "p", "servers": ["a"], "check_mode": "yes"}),
            )
            .await,
        422,
        "invalid_request",
        "check_mode",
    );
    check(
        service
            .post(
                servers,
                json!({"infra": "p", "servers": ["a"], "max_attempts": 0}),
            )
            .await,
        422,
        "invalid_request",
        "max_attempts",
    );
    check(
        service.post(servers, json!([1, 2])).await,
        422,
        "invalid_request",
        "must be a JSON object, not an array",
    );
    check(
        service
            .post(
                "/workflows/taskserv/create",
                json!({"infra": "p", "servers": ["a"], "taskservs": []}),
            )
            .await,
        422,
        "invalid_request",
        "taskservs",
    );
    check(
        service
            .post(
                "/workflows/cluster/create",
                json!({"infra": "p", "servers": ["a"]}),
            )
            .await,
        422,
        "invalid_request",
        "cluster",
    );

    let huge = format!(
        "{{\"infra\": \"p\", \"servers\": [\"{}\"]}}",
        "a".repeat(2 * 1024 * 1024)
    );
    check(
        service.post_raw(servers, huge).await,
        413,
        "payload_too_large",
        "larger than",
    );

    // Nothing above created anything.
    assert_eq!(service.get("/tasks").await.1["total"], 0);
    service.stop().await;
}

#[tokio::test]
async fn names_that_would_escape_the_state_dir_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    for (body, field) in [
        (
            json!({"infra": "p", "servers": ["ok", "../../etc"]}),
            "servers[1]",
        ),
        (json!({"infra": "/etc", "servers": ["a"]}), "infra"),
        (json!({"infra": "p", "servers": ["a/b"]}), "servers[0]"),
        (json!({"infra": "p", "servers": [".hidden"]}), "servers[0]"),
    ] {
        check(
            service.post("/workflows/servers/create", body).await,
            422,
            "invalid_request",
            field,
        );
    }
    check(
        service
            .post(
                "/workflows/taskserv/create",
                json!({"infra": "p", "servers": ["a"], "taskservs": ["x/../../y"]}),
            )
            .await,
        422,
        "invalid_request",
        "taskservs[0]",
    );
    assert_eq!(service.get("/tasks").await.1["total"], 0);
    service.stop().await;
}

#[tokio::test]
async fn a_script_missing_from_the_scripts_dir_is_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.scripts_dir = scripts.path().to_path_buf();
    // Only the built-in templates, whose scripts are checked at submit.
    settings.templates_dir = scripts.path().join("no-templates");
    let service = TestService::start(settings).await;
    check(
        service
            .post(
                "/workflows/servers/create",
                json!({"infra": "p", "servers": ["a"]}),
            )
            .await,
        422,
        "invalid_request",
        "servers/create.nu",
    );
    service.stop().await;
}

#[tokio::test]
async fn unknown_things_are_404_and_bad_ids_400() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let missing = "01900000-0000-7000-8000-000000000000";
    check(
        service.get(&format!("/tasks/{missing}")).await,
        404,
        "not_found",
        missing,
    );
    check(
        service.get(&format!("/tasks/{missing}/logs")).await,
        404,
        "not_found",
        missing,
    );
    check(
        service
            .post(&format!("/tasks/{missing}/cancel"), json!(null))
            .await,
        404,
        "not_found",
        missing,
    );
    check(
        service.get(&format!("/workflows/{missing}")).await,
        404,
        "not_found",
        missing,
    );
    check(
        service.get("/tasks/not-a-uuid").await,
        400,
        "bad_request",
        "not-a-uuid",
    );
    check(
        service.get("/tasks?status=bogus").await,
        400,
        "bad_request",
        "status",
    );
    check(
        service.get("/tasks?workflow=nope").await,
        400,
        "bad_request",
        "workflow",
    );
    check(
        service.get("/tasks?limit=abc").await,
        400,
        "bad_request",
        "limit",
    );
    check(
        service.get("/tasks?limit=100000").await,
        400,
        "bad_request",
        "limit",
    );
    check(
        service.get("/no/such/route").await,
        404,
        "not_found",
        "/no/such/route",
    );
    check(
        service.get("/workflows/servers/create").await,
        405,
        "method_not_allowed",
        "/workflows/servers/create",
    );
    let (status, health) = service.get("/health").await;
    assert_eq!(status, 200);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["storage"], "filesystem");
    service.stop().await;
}
