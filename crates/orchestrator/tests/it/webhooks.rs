//! Notifications through the real binary: a webhook receiver on loopback
//! that checks each request's Standard Webhooks signature, answers as
//! told (500 twice, then 200), and records what it got; the service's
//! outbox retries, logs each attempt, re-sends, survives a `kill -9`,
//! and refuses a target outside the HTTP allowlist.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use orchestrator_engine::webhooks::{secret_key, sign};
use serde_json::{Value, json};

use crate::cli::{Daemon, submit};

/// One request as the receiver got it.
#[derive(Debug, Clone)]
struct Received {
    id: String,
    timestamp: i64,
    signature: String,
    body: String,
}

#[derive(Default)]
struct Receiver {
    /// Answers to give, in order; 200 once they are used up.
    answers: VecDeque<u16>,
    /// The answer when `answers` is empty.
    otherwise: Option<u16>,
    received: Vec<Received>,
}

type Shared = Arc<Mutex<Receiver>>;

/// A webhook receiver on a free loopback port, in a thread of its own.
struct Hook {
    port: u16,
    shared: Shared,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Hook {
    fn start(answers: &[u16]) -> Hook {
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Mutex::new(Receiver {
            answers: answers.iter().copied().collect(),
            ..Default::default()
        }));
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        Hook {
            port,
            shared,
            _stop: stop,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn allow(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn answer_from_now(&self, code: u16) {
        let mut receiver = self.shared.lock().unwrap();
        receiver.answers.clear();
        receiver.otherwise = Some(code);
    }

    fn received(&self) -> Vec<Received> {
        self.shared.lock().unwrap().received.clone()
    }

    /// Waits until the receiver got `n` requests (a minute at most).
    fn until_received(&self, n: usize) -> Vec<Received> {
        for _ in 0..1200 {
            let received = self.received();
            if received.len() >= n {
                return received;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the receiver never got {n} requests: {:?}", self.received());
    }
}

async fn receive(State(shared): State<Shared>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let mut receiver = shared.lock().unwrap();
    receiver.received.push(Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp").parse().unwrap_or(0),
        signature: header("webhook-signature"),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let code = receiver
        .answers
        .pop_front()
        .or(receiver.otherwise)
        .unwrap_or(200);
    StatusCode::from_u16(code).unwrap()
}

/// Whether the request carries a valid signature under `secret`, as a
/// receiver checks it.
fn verified(received: &Received, secret: &str) -> bool {
    let key = secret_key(secret).expect("a whsec_ secret");
    received.signature
        == sign(
            &key,
            &received.id,
            received.timestamp,
            received.body.as_bytes(),
        )
}

fn daemon(data: &std::path::Path, hook: &Hook) -> Daemon {
    Daemon::start(
        data,
        &[
            "--http-allow",
            &hook.allow(),
            "--webhook-retry-base-ms",
            "50",
        ],
    )
}

/// `webhook add` with a body template; returns the subscription's id and
/// its secret.
fn subscribe(daemon: &Daemon, hook: &Hook, dir: &std::path::Path) -> (String, String) {
    let template = dir.join("slack.json");
    std::fs::write(
        &template,
        r#"{"text": "${event.summary}", "workflow": "${event.workflow_name}", "type": "${event.type}", "id": "${event.id}", "note": "sent with hunter2-webhook-token"}"#,
    )
    .unwrap();
    let created = daemon.cli_json(&[
        "webhook",
        "add",
        &hook.url(),
        "--events",
        "workflow.failed",
        "--body-template",
        template.to_str().unwrap(),
        "--json",
    ]);
    let secret = created["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{created}");
    let listed = daemon.cli_json(&["webhook", "list", "--json"]);
    assert!(
        !listed.to_string().contains(&secret),
        "the secret is shown once: {listed}"
    );
    (
        created["subscription"]["id"].as_str().unwrap().to_owned(),
        secret,
    )
}

fn fail_a_workflow(daemon: &Daemon) -> String {
    let created = submit(
        &format!("{}/workflows", daemon.url),
        json!({"template": "chain", "vars": {"fail_c": true}}),
    );
    created["id"].as_str().expect("submitted").to_owned()
}

/// Waits until the delivery log shows a delivery in `status` whose
/// number of attempts passes `attempts`.
fn until_delivery(daemon: &Daemon, status: &str, attempts: impl Fn(usize) -> bool) -> Value {
    for _ in 0..1200 {
        let page = daemon.cli_json(&["webhook", "deliveries", "--json"]);
        if let Some(found) =
            page["deliveries"].as_array().unwrap().iter().find(|d| {
                d["status"] == status && attempts(d["attempts"].as_array().unwrap().len())
            })
        {
            return found.clone();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!(
        "no delivery became {status} with the attempts expected: {}",
        daemon.cli_json(&["webhook", "deliveries", "--json"])
    );
}

/// PUTs JSON through a throwaway runtime, as `submit` POSTs.
fn put(url: &str, body: Value) -> u16 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .put(url)
            .json(&body)
            .send()
            .await
            .unwrap();
        response.status().as_u16()
    })
}

#[test]
fn a_failed_workflow_is_signed_templated_retried_logged_and_resent() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(&[500, 500]);
    let daemon = daemon(&dir.path().join("data"), &hook);
    // A secret's value written into the template is redacted from the
    // payload, as from a log.
    let stored = put(
        &format!("{}/secrets/webhook-token", daemon.url),
        json!({"value": "hunter2-webhook-token"}),
    );
    assert_eq!(stored, 200);
    let (subscription, secret) = subscribe(&daemon, &hook, dir.path());
    let workflow = fail_a_workflow(&daemon);

    // 500, 500, then 200: three attempts of one message, each signed.
    let received = hook.until_received(3);
    let delivery = until_delivery(&daemon, "delivered", |n| n == 3);
    assert_eq!(delivery["subscription_id"], subscription.as_str());
    let codes: Vec<&Value> = delivery["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["status_code"])
        .collect();
    assert_eq!(codes, [&json!(500), &json!(500), &json!(200)], "{delivery}");
    for request in &received {
        assert_eq!(request.id, delivery["id"].as_str().unwrap());
        assert!(verified(request, &secret), "bad signature: {request:?}");
        assert!(!verified(request, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
    }
    let body: Value = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(
        body,
        json!({
            "text": "workflow `Chain` failed",
            "workflow": "Chain",
            "type": "workflow.failed",
            "id": delivery["id"],
            "note": "sent with <redacted>",
        }),
        "workflow {workflow}"
    );

    // A re-send: the same id and body, a fourth attempt in the log.
    let resent = daemon.cli(&["webhook", "resend", delivery["id"].as_str().unwrap()]);
    assert!(resent.status.success(), "{resent:?}");
    let received = hook.until_received(4);
    assert_eq!(received[3].id, received[0].id);
    assert_eq!(received[3].body, received[0].body);
    assert!(verified(&received[3], &secret));
    until_delivery(&daemon, "delivered", |n| n == 4);
    let again = daemon.cli(&["webhook", "resend", "msg_nope"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("msg_nope"));

    let removed = daemon.cli(&["webhook", "rm", &subscription]);
    assert!(removed.status.success(), "{removed:?}");
    assert_eq!(
        daemon.cli_json(&["webhook", "list", "--json"])["webhooks"],
        json!([])
    );
}

#[test]
fn a_pending_delivery_is_sent_after_a_kill_9_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let hook = Hook::start(&[]);
    hook.answer_from_now(503);
    let secret = {
        let daemon = daemon(&data, &hook);
        let (_, secret) = subscribe(&daemon, &hook, dir.path());
        fail_a_workflow(&daemon);
        hook.until_received(1);
        secret
        // Dropped: killed with SIGKILL while the delivery is pending.
    };
    hook.answer_from_now(200);
    let daemon = daemon(&data, &hook);
    // The attempt the kill interrupted may be missing from the log (it is
    // sent again: at least once); the last one is the 200.
    let delivery = until_delivery(&daemon, "delivered", |n| n >= 1);
    let attempts = delivery["attempts"].as_array().unwrap();
    assert_eq!(attempts.last().unwrap()["status_code"], 200, "{delivery}");
    let received = hook.received();
    let last = received.last().unwrap();
    assert_eq!(last.id, delivery["id"].as_str().unwrap());
    assert!(verified(last, &secret), "the secret survives the restart");
}

#[test]
fn a_target_outside_the_allowlist_is_refused_naming_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(&[]);
    let daemon = daemon(&dir.path().join("data"), &hook);
    let refused = daemon.cli(&[
        "webhook",
        "add",
        "http://hooks.elsewhere.example/x",
        "--events",
        "workflow.failed",
    ]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("hooks.elsewhere.example") && stderr.contains("allowlist"),
        "{stderr}"
    );
    let answer = submit(
        &format!("{}/webhooks", daemon.url),
        json!({"url": "http://hooks.elsewhere.example/x", "events": ["workflow.failed"]}),
    );
    assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("url: "),
        "{answer}"
    );
    let unknown = submit(
        &format!("{}/webhooks", daemon.url),
        json!({"url": hook.url(), "events": ["approval.asked"]}),
    );
    assert!(
        unknown["error"]["message"]
            .as_str()
            .unwrap()
            .contains("events[0]"),
        "{unknown}"
    );
    assert_eq!(
        daemon.cli_json(&["webhook", "list", "--json"])["webhooks"],
        json!([])
    );
}

#[test]
fn an_approval_gate_that_opens_is_announced_signed() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Hook::start(&[]);
    let daemon = daemon(&dir.path().join("data"), &hook);
    let created = daemon.cli_json(&[
        "webhook",
        "add",
        &hook.url(),
        "--events",
        "approval.requested",
        "--json",
    ]);
    let secret = created["secret"].as_str().unwrap().to_owned();
    let workflow = submit(
        &format!("{}/workflows", daemon.url),
        json!({"template": {
            "name": "gated", "ref_name": "gated", "schema_version": 1,
            "steps": [
                {"ref_name": "plan", "script": "dag/step.py", "input": {"name": "plan"}},
                {"ref_name": "approve", "kind": "approval", "depends_on": ["plan"],
                 "approval": {"approvers": {"role": "operator"}}},
            ]
        }}),
    );
    let workflow = workflow["id"].as_str().expect("submitted").to_owned();
    let received = hook.until_received(1);
    assert!(verified(&received[0], &secret), "{received:?}");
    // No body template: the Standard Webhooks shape, `type` and `data`.
    let body: Value = serde_json::from_str(&received[0].body).unwrap();
    assert_eq!(body["type"], "approval.requested", "{body}");
    assert_eq!(body["data"]["workflow_id"], workflow.as_str(), "{body}");
    assert_eq!(body["data"]["step"], "approve", "{body}");
    assert!(
        body["data"]["summary"]
            .as_str()
            .unwrap()
            .contains("waits for a decision"),
        "{body}"
    );
}
