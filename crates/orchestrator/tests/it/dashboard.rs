//! The dashboard's server side over HTTP: its embedded files, the session
//! cookie that stands for a token (expiry, revocation, CSRF), and the
//! counts by status. The page itself is tested in a real browser
//! (`ui-tests/`, run by `make test`).

use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

const ADMIN: &str = "bootstrap-admin-token-for-the-dashboard-tests-0123456789";

async fn service(dir: &std::path::Path) -> TestService {
    let mut settings = fixture_settings(dir);
    settings.auth = true;
    settings.rate_limit = 0;
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(ADMIN));
    TestService::start(settings).await
}

/// A request with optional bearer token, session cookie and CSRF header.
async fn send(
    service: &TestService,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    cookie: Option<&str>,
    csrf: Option<&str>,
) -> reqwest::Response {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = service
        .http
        .request(method, format!("{}{path}", service.base));
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    if let Some(cookie) = cookie {
        request = request.header(COOKIE, format!("theme=dark; orch_session={cookie}"));
    }
    if let Some(csrf) = csrf {
        request = request.header("x-csrf-token", csrf);
    }
    request.send().await.unwrap()
}

async fn json_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Signs in with `token`: (cookie value, csrf token, the whole answer).
async fn sign_in(service: &TestService, token: &str) -> (String, String, Value) {
    let response = send(service, "POST", "/ui/session", Some(token), None, None).await;
    assert_eq!(response.status(), 200);
    let set_cookie = response.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert_eq!(response.headers()["cache-control"], "no-store");
    let value = set_cookie
        .strip_prefix("orch_session=")
        .and_then(|rest| rest.split(';').next())
        .unwrap()
        .to_owned();
    let body: Value = response.json().await.unwrap();
    let csrf = body["csrf_token"].as_str().unwrap().to_owned();
    (value, csrf, body)
}

async fn create_token(service: &TestService, name: &str, role: &str) -> (String, String) {
    let response = service
        .http
        .post(format!("{}/tokens", service.base))
        .bearer_auth(ADMIN)
        .json(&json!({"name": name, "role": role}))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    (
        body["token"].as_str().unwrap().to_owned(),
        body["id"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn a_session_stands_for_its_token_until_revoked_and_changes_need_the_csrf_token() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path()).await;
    let (operator, operator_id) = create_token(&service, "ops-browser", "operator").await;
    let (cookie, csrf, answer) = sign_in(&service, &operator).await;
    assert_eq!(answer["name"], "ops-browser");
    assert_eq!(answer["role"], "operator");
    assert_eq!(answer["auth"], true);
    assert!(answer["expires_at"].is_string(), "{answer}");
    assert!(!cookie.contains(&operator), "the token is in its cookie");

    // Reads with the cookie alone; the session (and its CSRF token) again.
    let (status, _) =
        json_of(send(&service, "GET", "/workflows", None, Some(&cookie), None).await).await;
    assert_eq!(status, 200);
    let (status, again) =
        json_of(send(&service, "GET", "/ui/session", None, Some(&cookie), None).await).await;
    assert_eq!(status, 200);
    assert_eq!(again["csrf_token"], csrf.as_str());
    assert_eq!(again["name"], "ops-browser");

    // A change with the cookie: refused without the CSRF header, or with a
    // wrong one, and the refusal names the header; allowed with it.
    let body = json!({"infra": "ui", "servers": ["ok-1"]});
    let submit = |csrf: Option<&str>| {
        let mut request = service
            .http
            .post(format!("{}/workflows/servers/create", service.base))
            .header(COOKIE, format!("orch_session={cookie}"))
            .json(&body);
        if let Some(csrf) = csrf {
            request = request.header("X-CSRF-Token", csrf);
        }
        request.send()
    };
    let (status, refused) = json_of(submit(None).await.unwrap()).await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["error"]["code"], "forbidden");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("header X-CSRF-Token is missing"),
        "{refused}"
    );
    let (status, refused) = json_of(submit(Some("0123")).await.unwrap()).await;
    assert_eq!(status, 403);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not match"),
        "{refused}"
    );
    let (status, submitted) = json_of(submit(Some(&csrf)).await.unwrap()).await;
    assert_eq!(status, 202, "{submitted}");

    // A bearer token needs no CSRF header, cookie or not.
    let response = send(&service, "POST", "/ui/logout", Some(&operator), None, None).await;
    assert_eq!(response.status(), 204);

    // The audit log names the token behind the session.
    let (_, audit) =
        json_of(send(&service, "GET", "/audit?limit=100", Some(ADMIN), None, None).await).await;
    let records = audit["records"].as_array().unwrap();
    let by = |action: &str, outcome: &str| {
        records.iter().any(|r| {
            r["action"] == action && r["actor"] == "ops-browser" && r["outcome"] == outcome
        })
    };
    assert!(by("ui.sign_in", "ok"), "{audit}");
    assert!(by("workflow.submit_servers", "ok"), "{audit}");
    assert!(by("workflow.submit_servers", "denied"), "{audit}");
    assert!(
        !audit.to_string().contains(&cookie),
        "a cookie reached the audit log"
    );

    // A forged or damaged cookie is no session.
    let mut forged = cookie.clone();
    forged.replace_range(2..3, if &cookie[2..3] == "A" { "B" } else { "A" });
    let (status, refused) =
        json_of(send(&service, "GET", "/workflows", None, Some(&forged), None).await).await;
    assert_eq!(status, 401);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sign in again"),
        "{refused}"
    );

    // Revoking the token ends its sessions at once.
    let response = send(
        &service,
        "DELETE",
        &format!("/tokens/{operator_id}"),
        Some(ADMIN),
        None,
        None,
    )
    .await;
    assert_eq!(response.status(), 200);
    let (status, _) =
        json_of(send(&service, "GET", "/workflows", None, Some(&cookie), None).await).await;
    assert_eq!(status, 401);

    // Signing out clears the cookie.
    let response = send(&service, "POST", "/ui/logout", None, Some(&cookie), None).await;
    assert_eq!(response.status(), 204);
    let cleared = response.headers()[SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.starts_with("orch_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    let data_dir = service.data_dir.clone();
    service.stop().await;
    // The revoked token's session left the store with the revocation.
    assert_eq!(stored_sessions(&data_dir).await, []);
}

#[tokio::test]
async fn signing_out_ends_the_session_in_the_service_not_only_in_the_browser() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path()).await;
    let (operator, operator_id) = create_token(&service, "ops-laptop", "operator").await;
    let (kept, _, _) = sign_in(&service, &operator).await;
    let (copied, _, _) = sign_in(&service, &operator).await;
    assert_ne!(kept, copied, "each sign-in is a session of its own");
    let read = |cookie: String| {
        let service = &service;
        async move {
            send(service, "GET", "/workflows", None, Some(&cookie), None)
                .await
                .status()
        }
    };
    assert_eq!(read(copied.clone()).await, 200);

    // Signing out clears the cookie, and a copy of it kept elsewhere (a
    // stolen cookie, another tab) no longer works.
    let response = send(&service, "POST", "/ui/logout", None, Some(&copied), None).await;
    assert_eq!(response.status(), 204);
    let cleared = response.headers()[SET_COOKIE].to_str().unwrap();
    assert!(
        cleared.starts_with("orch_session=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    assert_eq!(read(copied.clone()).await, 401);
    let (status, _) =
        json_of(send(&service, "GET", "/ui/session", None, Some(&copied), None).await).await;
    assert_eq!(status, 401);
    // The token's other session, and the token itself, go on.
    assert_eq!(read(kept.clone()).await, 200);
    let response = send(&service, "GET", "/workflows", Some(&operator), None, None).await;
    assert_eq!(response.status(), 200);
    // A second sign-out of the ended session changes nothing.
    let response = send(&service, "POST", "/ui/logout", None, Some(&copied), None).await;
    assert_eq!(response.status(), 204);

    // Sessions are not tokens: the token list shows the two tokens only.
    let (_, tokens) =
        json_of(send(&service, "GET", "/tokens", Some(ADMIN), None, None).await).await;
    let names: Vec<&str> = tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bootstrap", "ops-laptop"], "{tokens}");
    let (_, audit) =
        json_of(send(&service, "GET", "/audit?limit=100", Some(ADMIN), None, None).await).await;
    assert!(
        audit["records"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["action"] == "ui.sign_out" && r["actor"] == "ops-laptop"),
        "{audit}"
    );
    let data_dir = service.data_dir.clone();
    service.stop().await;
    // The ended session's record is gone from the store, not only refused:
    // what is left is the session still signed in.
    let sessions = stored_sessions(&data_dir).await;
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(
        sessions[0].session_of.as_deref(),
        Some(operator_id.as_str())
    );
}

/// The dashboard sessions a stopped service's filesystem store holds.
async fn stored_sessions(data_dir: &std::path::Path) -> Vec<orchestrator_core::access::ApiToken> {
    use orchestrator_storage::fs::{FsBackend, FsOptions};
    let store = orchestrator_storage::Storage::new(
        FsBackend::open(data_dir, FsOptions::default())
            .await
            .unwrap(),
    );
    let mut tokens = store.access().tokens().await.unwrap();
    store.close().await.unwrap();
    tokens.retain(|t| t.is_session());
    tokens
}

#[tokio::test]
async fn behind_tls_the_session_cookie_is_secure_and_host_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.auth = true;
    settings.rate_limit = 0;
    settings.secure_cookies = true;
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(ADMIN));
    let service = TestService::start(settings).await;
    let response = send(&service, "POST", "/ui/session", Some(ADMIN), None, None).await;
    assert_eq!(response.status(), 200);
    let set_cookie = response.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    assert!(
        set_cookie.starts_with("__Host-orch_session="),
        "{set_cookie}"
    );
    for attribute in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert!(!set_cookie.contains("Domain"), "{set_cookie}");
    let value = set_cookie
        .strip_prefix("__Host-orch_session=")
        .and_then(|rest| rest.split(';').next())
        .unwrap();
    let with_cookie = |cookie: String| {
        service
            .http
            .get(format!("{}/workflows", service.base))
            .header(COOKIE, cookie)
            .send()
    };
    let status = with_cookie(format!("__Host-orch_session={value}"))
        .await
        .unwrap()
        .status();
    assert_eq!(status, 200);
    // The same value under the plain name, which a page served over plain
    // HTTP from a sibling host could have set, is no session here.
    let status = with_cookie(format!("orch_session={value}"))
        .await
        .unwrap()
        .status();
    assert_eq!(status, 401);
    service.stop().await;
}

#[tokio::test]
async fn roles_hold_through_a_session_and_task_tokens_get_none() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path()).await;
    let (viewer, _) = create_token(&service, "viewer-browser", "viewer").await;
    let (cookie, csrf, answer) = sign_in(&service, &viewer).await;
    assert_eq!(answer["role"], "viewer");
    let workflow = uuid::Uuid::now_v7();
    let (status, refused) = json_of(
        send(
            &service,
            "POST",
            &format!("/workflows/{workflow}/cancel"),
            None,
            Some(&cookie),
            Some(&csrf),
        )
        .await,
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(refused["error"]["message"], "this needs the operator role");
    // Not signed in: 401, and the page shows its sign-in form.
    let (status, _) = json_of(send(&service, "GET", "/ui/session", None, None, None).await).await;
    assert_eq!(status, 401);
    // A script's own token opens its checkpoint, not a session.
    let task = orchestrator_core::TaskId::new();
    let task_token = service
        .handle
        .as_ref()
        .unwrap()
        .engine
        .access()
        .task_token(task);
    let (status, _) = json_of(
        send(
            &service,
            "POST",
            "/ui/session",
            Some(&task_token),
            None,
            None,
        )
        .await,
    )
    .await;
    assert_eq!(status, 403);
    service.stop().await;
}

#[tokio::test]
async fn the_dashboard_files_are_served_from_the_binary_to_anyone() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path()).await;
    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/workflows/anything", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/style.css", "text/css; charset=utf-8"),
    ] {
        let response = send(&service, "GET", path, None, None, None).await;
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        assert!(
            headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("script-src 'self'")
        );
        assert_eq!(headers["x-content-type-options"], "nosniff");
        // Revalidated with its ETag: unchanged files cost a 304.
        let etag = headers["etag"].to_str().unwrap();
        let again = service
            .http
            .get(format!("{}{path}", service.base))
            .header("if-none-match", etag)
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 304, "{path}");
    }
    let index = send(&service, "GET", "/ui", None, None, None)
        .await
        .text()
        .await
        .unwrap();
    assert!(index.contains("/ui/app.js"), "{index}");
    let (status, missing) =
        json_of(send(&service, "GET", "/ui/nope.js", None, None, None).await).await;
    assert_eq!(status, 404);
    assert_eq!(missing["error"]["code"], "not_found");
    service.stop().await;
}

#[tokio::test]
async fn counts_by_status_match_the_listing_and_take_its_filters() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.workers = 2;
    let service = TestService::start(settings).await;
    let (workflow, _) = service
        .create_servers(&["ok-1"], json!({"wait": true}))
        .await;
    service
        .create_servers(&["fail-1"], json!({"max_attempts": 1, "wait": true}))
        .await;
    let (status, body) = service
        .post(
            "/workflows",
            json!({"template": "chain", "meta": {"ref": "counted"}, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    let (status, counts) = service.get("/workflows/counts").await;
    assert_eq!(status, 200, "{counts}");
    assert_eq!(counts["total"], 3, "{counts}");
    for status in [
        "scheduled",
        "queued",
        "running",
        "rolling_back",
        "completed",
        "failed",
        "cancelled",
    ] {
        let (_, listed) = service
            .get(&format!("/workflows?status={status}&limit=0"))
            .await;
        assert_eq!(
            counts["counts"][status], listed["total"],
            "{status}: {counts}"
        );
    }
    assert_eq!(counts["counts"]["completed"], 2);
    assert_eq!(counts["counts"]["failed"], 1);
    let (_, by_template) = service
        .get("/workflows/counts?template=servers-create")
        .await;
    assert_eq!(by_template["total"], 2, "{by_template}");
    let (_, by_ref) = service.get("/workflows/counts?ref=counted").await;
    assert_eq!(by_ref["counts"]["completed"], 1, "{by_ref}");
    assert_eq!(by_ref["total"], 1, "{by_ref}");
    assert!(!workflow.is_empty());

    // Without auth, the page needs no sign-in: the session says so.
    let (status, session) = service.get("/ui/session").await;
    assert_eq!(status, 200);
    assert_eq!(
        session,
        json!({"name": "local", "role": "admin", "auth": false, "expires_at": null, "csrf_token": null})
    );
    service.stop().await;
}
