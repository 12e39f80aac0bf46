//! Secrets have a scope, and redaction holds wherever text is cut: a
//! service with auth on, an admin who stores secrets, and a viewer who
//! reads what the tasks left (their errors, logs, outputs, checkpoints).

use std::io::{Read, Write};

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

const ADMIN: &str = "bootstrap-admin-token-for-the-secret-tests-0123456789";

/// A client whose every request carries `token`.
fn client_with(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

/// A service with auth on, the fixture templates registered, loopback
/// `ports` allowed for http steps; `service.http` is the admin's client.
/// Also a viewer's client.
async fn start(dir: &std::path::Path, ports: &[u16]) -> (TestService, reqwest::Client) {
    let mut settings = fixture_settings(dir);
    settings.auth = true;
    settings.rate_limit = 0;
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(ADMIN));
    settings.http_allow =
        orchestrator_http::Allowlist::parse(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .unwrap();
    let mut service = TestService::start(settings).await;
    service.http = client_with(ADMIN);
    let (status, created) = service
        .post("/tokens", json!({"name": "reader", "role": "viewer"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let viewer = client_with(created["token"].as_str().unwrap());
    (service, viewer)
}

async fn put_secret(service: &TestService, name: &str, body: Value) -> (u16, Value) {
    let response = service
        .http
        .put(format!("{}/secrets/{name}", service.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Everything a viewer can read of a task, as one text.
async fn as_viewer(service: &TestService, viewer: &reqwest::Client, task: &str) -> String {
    let mut seen = String::new();
    for path in [format!("/tasks/{task}"), format!("/tasks/{task}/logs")] {
        let response = viewer
            .get(format!("{}{path}", service.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        seen.push_str(&response.text().await.unwrap());
        seen.push('\n');
    }
    seen
}

/// Submits the registered `secret-use` template in `mode` and waits.
async fn run_secret_use(service: &TestService, proof: &std::path::Path, mode: &str) -> Value {
    let (status, view) = service
        .post(
            "/workflows",
            json!({"template": "secret-use", "max_attempts": 1, "wait": true,
                   "vars": {"proof": proof.display().to_string(), "mode": mode}}),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    view
}

/// Neither the value nor any part of it that a reader could join with
/// another: its halves are looked for too, in any case.
fn assert_hidden(text: &str, secret: &str) {
    let lower = text.to_lowercase();
    let half = secret.len() / 2;
    for part in [secret, &secret[..half], &secret[half..]] {
        assert!(
            !lower.contains(&part.to_lowercase()),
            "`{part}` (of the secret) shows: {}",
            &text[..text.len().min(4000)]
        );
    }
}

/// An operator's inline template may not use a secret, nor may a
/// registered template its scope does not name, nor a registered template
/// given the reference through its inputs; the one the scope names may.
#[tokio::test]
async fn a_secret_is_used_only_by_the_templates_its_scope_names() {
    const VALUE: &str = "scoped-s3cret-VALUE-77";
    let dir = tempfile::tempdir().unwrap();
    let (service, _) = start(dir.path(), &[]).await;
    let proof = service.state_dir().join("proof");

    // A secret without a scope (as every secret stored before scopes)
    // is usable nowhere.
    let (status, info) = put_secret(&service, "db_password", json!({"value": VALUE})).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["scope"], json!({"templates": [], "origins": []}));
    let submit = json!({"template": "secret-use", "vars": {"proof": proof.display().to_string()}});
    let (status, refused) = service.post("/workflows", submit.clone()).await;
    assert_eq!(status, 403, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("secret `db_password` may not be used by template `secret-use`")
            && message.contains("it has no scope yet"),
        "{message}"
    );

    // Scoped to another template: still refused, on validate too.
    let (status, info) = service
        .patch(
            "/secrets/db_password",
            json!({"templates": ["deploy"], "origins": ["https://Vault.example:443"]}),
        )
        .await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(
        info["scope"],
        json!({"templates": ["deploy"], "origins": ["https://vault.example"]})
    );
    for path in ["/workflows", "/workflows/validate"] {
        let (status, refused) = service.post(path, submit.clone()).await;
        assert_eq!(status, 403, "{path}: {refused}");
        // It says why, but not what the scope names: that is an admin's
        // to read.
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("its scope does not name this template")
                && !message.contains("deploy")
                && !message.contains("vault.example"),
            "{refused}"
        );
    }

    // An inline template never may, whatever it calls itself.
    let inline = json!({"template": {
        "name": "uses a secret", "ref_name": "deploy", "schema_version": 1,
        "steps": [{"ref_name": "connect", "script": "secrets/leaky.py",
                   "input": {"password": "${secrets.db_password}", "proof": "/dev/null"}}]
    }});
    let (status, refused) = service.post("/workflows", inline).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("secret `db_password` may not be used by an inline template"),
        "{refused}"
    );

    // Granted: the template runs and its script gets the value.
    let (status, _) = service
        .patch(
            "/secrets/db_password",
            json!({"templates": ["secret-use", "deploy"]}),
        )
        .await;
    assert_eq!(status, 200);
    let view = run_secret_use(&service, &proof, "plain").await;
    assert_eq!(view["status"], "completed", "{view}");
    use sha2::Digest;
    let expected = format!("{:x}", sha2::Sha256::digest(VALUE.as_bytes()));
    assert_eq!(std::fs::read_to_string(&proof).unwrap(), expected);

    // A template in scope for nothing cannot be handed the reference in
    // its inputs: `chain` puts `gate` into a step's input.
    let (status, refused) = service
        .post(
            "/workflows",
            json!({"template": "chain", "vars": {"gate": "${secrets.db_password}"}}),
        )
        .await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("secret `db_password` may not be used by template `chain`"),
        "{refused}"
    );
    // Nor can an unknown secret be named.
    let (status, refused) = service
        .post(
            "/workflows",
            json!({"template": "chain", "vars": {"gate": "${secrets.nothing_here}"}}),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("secret `nothing_here`: does not exist"),
        "{refused}"
    );

    // The listing shows each scope; the audit log has the change.
    let (_, listed) = service.get("/secrets").await;
    assert_eq!(
        listed["secrets"][0]["scope"]["templates"],
        json!(["deploy", "secret-use"]),
        "{listed}"
    );
    let (_, audit) = service.get("/audit?action=secret.scope").await;
    assert_eq!(audit["records"].as_array().unwrap().len(), 2, "{audit}");
    // A bad origin is named.
    let (status, refused) = service
        .patch(
            "/secrets/db_password",
            json!({"origins": ["https://x/path"]}),
        )
        .await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("origins[0]: `https://x/path`"),
        "{refused}"
    );
    service.stop().await;
}

/// An http step of a template in scope whose URL host is built from a
/// secret is refused before anything is sent, and neither its error nor
/// its log shows the secret, in any case.
#[tokio::test]
async fn a_secret_used_as_a_host_is_refused_and_shown_nowhere() {
    // Mixed case: a URL parser lower-cases a host.
    const VALUE: &str = "Vault-Host-PW-8q2";
    let dir = tempfile::tempdir().unwrap();
    let (service, viewer) = start(dir.path(), &[]).await;
    let (status, _) = put_secret(
        &service,
        "host_pw",
        json!({"value": VALUE, "templates": ["secret-host"], "origins": ["https://vault.example"]}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, view) = service
        .post(
            "/workflows",
            json!({"template": "secret-host", "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "failed", "{view}");
    let task = view["tasks"][0]["id"].as_str().unwrap();
    let seen = as_viewer(&service, &viewer, task).await;
    let error = view["tasks"][0]["error"].as_str().unwrap();
    assert!(
        error.contains("secret `host_pw` may not be sent to `http://<redacted>`"),
        "{error}"
    );
    assert_hidden(&seen, VALUE);
    assert_hidden(&view.to_string(), VALUE);
    service.stop().await;
}

/// A line longer than the log's pieces, with the secret across the cut:
/// no piece of the secret is left to join; a stderr tail cut through the
/// secret leaves none of it in the error; every form of it is redacted;
/// and a checkpoint a viewer reads with its task holds none of it.
#[tokio::test]
async fn redaction_comes_before_every_cut_and_catches_every_form() {
    const VALUE: &str = "Pl@nted \"s3cr3t\"/VALUE 4242";
    let dir = tempfile::tempdir().unwrap();
    let (service, viewer) = start(dir.path(), &[]).await;
    let proof = service.state_dir().join("proof");
    let (status, _) = put_secret(
        &service,
        "db_password",
        json!({"value": VALUE, "templates": ["secret-use"]}),
    )
    .await;
    assert_eq!(status, 200);
    for (mode, expected) in [
        ("long_line", "completed"),
        ("stderr_tail", "failed"),
        ("forms", "completed"),
        ("checkpoint", "completed"),
    ] {
        let view = run_secret_use(&service, &proof, mode).await;
        assert_eq!(view["status"], expected, "{mode}: {view}");
        let task = view["tasks"][0]["id"].as_str().unwrap();
        let seen = as_viewer(&service, &viewer, task).await;
        assert!(seen.contains("<redacted>"), "{mode}: nothing was redacted");
        match mode {
            "long_line" => {
                // The line was cut, and joining its pieces shows nothing.
                let (_, log) = service.get_text(&format!("/tasks/{task}/logs")).await;
                assert!(log.contains("the line above was split"), "{mode}");
                let joined: String = log
                    .lines()
                    .filter(|l| !l.starts_with("[orchestrator]"))
                    .collect();
                assert_hidden(&joined, VALUE);
            }
            "stderr_tail" => {
                let error = view["tasks"][0]["error"].as_str().unwrap();
                assert!(error.starts_with("script exited with code 3"), "{error}");
                assert_hidden(error, VALUE);
            }
            "checkpoint" => {
                let (_, task_view) = service.get(&format!("/tasks/{task}")).await;
                assert_eq!(
                    task_view["checkpoint"],
                    json!({"kept": "<redacted>", "note": "used <redacted>"}),
                    "{task_view}"
                );
            }
            _ => {}
        }
        assert_hidden(&seen, VALUE);
        // The JSON-escaped and URL-encoded forms too.
        for form in [
            r#"Pl@nted \"s3cr3t\"/VALUE 4242"#,
            "Pl%40nted%20%22s3cr3t%22%2FVALUE%204242",
            "Pl%40nted+%22s3cr3t%22%2FVALUE+4242",
        ] {
            assert!(
                !seen.to_lowercase().contains(&form.to_lowercase()),
                "{mode}: {form} shows"
            );
        }
    }
    service.stop().await;
}

/// A loopback server that answers every request with `status` and `body`,
/// until the test ends; its port.
fn answering(status: u16, body: String) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            // The request's head, then the answer; the body (if any) is
            // not needed to answer.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = write!(
                stream,
                "HTTP/1.1 {status} Whatever\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// An http step's answer whose body holds a secret across the 2 KiB the
/// log shows of it: the log shows no part of it.
#[tokio::test]
async fn a_body_excerpt_cut_through_a_secret_shows_none_of_it() {
    const VALUE: &str = "body-s3cret-VALUE-5150";
    let half = VALUE.len() / 2;
    let body = format!(
        "{{\"pad\": \"{}{VALUE}{}\"}}",
        // `{"pad": "` is 9 bytes: the secret starts `half` bytes before
        // the cut.
        "z".repeat(2048 - 9 - half),
        "w".repeat(3000)
    );
    let port = answering(500, body);
    let dir = tempfile::tempdir().unwrap();
    let (service, viewer) = start(dir.path(), &[port]).await;
    // The secret is known (so it is redacted) but not used by the step.
    let (status, _) = put_secret(&service, "other", json!({"value": VALUE})).await;
    assert_eq!(status, 200);
    let base = format!("http://127.0.0.1:{port}");
    let step = json!({
        "ref_name": "call", "kind": "http", "retries": 0,
        "http": {
            "launch": {"url": format!("{base}/launch"), "expect": [201]},
            "job_id": "/job",
            "poll": {"url": format!("{base}/jobs/${{job.id}}"), "status": "/status",
                     "status_map": {"success": ["done"], "running": ["running"], "failure": ["failed"]}}
        }
    });
    let (status, view) = service
        .post(
            "/workflows",
            json!({"template": {"name": "call", "ref_name": "call", "schema_version": 1,
                                "steps": [step]}, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "failed", "{view}");
    let task = view["tasks"][0]["id"].as_str().unwrap();
    let seen = as_viewer(&service, &viewer, task).await;
    assert!(seen.contains("zzzz<redacted>"), "{seen}");
    assert_hidden(&seen, VALUE);
    service.stop().await;
}

/// `orchestrator secret`: put (the value from stdin), scope, list and
/// delete, against a running service, with the admin's token.
#[tokio::test]
async fn the_cli_stores_scopes_lists_and_deletes_secrets() {
    const VALUE: &str = "cli-s3cret-VALUE-31337";
    let dir = tempfile::tempdir().unwrap();
    let (service, _) = start(dir.path(), &[]).await;
    let cli = |args: &[&str], stdin: Option<&str>| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"));
        command
            .args(args)
            .env("ORCHESTRATOR_URL", &service.base)
            .env("ORCHESTRATOR_TOKEN", ADMIN)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let stdin = stdin.map(str::to_owned);
        async move {
            let mut child = command.spawn().unwrap();
            let mut input = child.stdin.take().unwrap();
            if let Some(stdin) = stdin {
                tokio::io::AsyncWriteExt::write_all(&mut input, stdin.as_bytes())
                    .await
                    .unwrap();
            }
            drop(input);
            let output = child.wait_with_output().await.unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            (output.status.success(), text)
        }
    };
    let (ok, text) = cli(
        &["secret", "put", "db_password", "--templates", "secret-use"],
        Some(&format!("{VALUE}\n")),
    )
    .await;
    assert!(
        ok && text.contains("templates [secret-use]  origins []"),
        "{text}"
    );
    let (ok, text) = cli(
        &[
            "secret",
            "scope",
            "db_password",
            "--origins",
            "https://Vault.example",
        ],
        None,
    )
    .await;
    assert!(
        ok && text.contains("templates [secret-use]  origins [https://vault.example]"),
        "{text}"
    );
    let (ok, text) = cli(
        &["secret", "scope", "db_password", "--origins", "ftp://x"],
        None,
    )
    .await;
    assert!(!ok && text.contains("origins[0]: `ftp://x`"), "{text}");
    let (ok, text) = cli(&["secret", "list"], None).await;
    assert!(ok && text.contains("db_password"), "{text}");
    assert!(!text.contains(VALUE), "{text}");
    // The value arrived without its newline: the template's script gets it.
    let proof = service.state_dir().join("proof");
    let view = run_secret_use(&service, &proof, "plain").await;
    assert_eq!(view["status"], "completed", "{view}");
    use sha2::Digest;
    let expected = format!("{:x}", sha2::Sha256::digest(VALUE.as_bytes()));
    assert_eq!(std::fs::read_to_string(&proof).unwrap(), expected);
    let (ok, text) = cli(&["secret", "delete", "db_password"], None).await;
    assert!(ok && text.contains("deleted secret db_password"), "{text}");
    let (ok, text) = cli(&["secret", "delete", "db_password"], None).await;
    assert!(!ok && text.contains("HTTP 404"), "{text}");
    service.stop().await;
}
