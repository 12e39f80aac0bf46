//! The service's connections, through real sockets: the header timeout,
//! the connection and stream caps, `X-Forwarded-For` from trusted proxies
//! only, and what a page on another site could make a browser send with
//! `--no-auth`. Raw TCP where a well-behaved client would not do it.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::{ADMIN, call, create_token, with_auth};
use crate::cli::Daemon;
use crate::harness::TestService;

/// A guard against a hang, never a measure: the service is expected to
/// answer or close long before it.
const HANG: Duration = Duration::from_secs(120);

/// `127.0.0.1:port` of a base URL.
fn authority(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// Sends `request` as it is on a new connection and reads the answer until
/// the service closes it.
async fn raw(addr: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(HANG, stream.read_to_end(&mut answer))
        .await
        .expect("the service answered and closed");
    String::from_utf8_lossy(&answer).into_owned()
}

/// The status of a raw answer (0 for none).
fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The JSON body of a raw answer.
fn body_of(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or(Value::Null)
}

/// GETs `path` until it is not refused for the connection cap: the
/// service frees a place once it has seen a connection close, a moment
/// after the client closed it.
async fn once_served(addr: &str, path: &str) -> String {
    for _ in 0..400 {
        let answer = raw(addr, &get(addr, path, "127.0.0.1")).await;
        if status_of(&answer) != 503 {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no place came free for GET {path}");
}

fn get(addr: &str, path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
        .replace("{addr}", addr)
}

#[tokio::test]
async fn half_a_request_and_an_idle_connection_are_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &["--header-timeout", "1"]);
    let addr = authority(&daemon.url);
    let mut half = TcpStream::connect(&addr).await.unwrap();
    half.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    for (what, stream) in [("half a request", &mut half), ("nothing", &mut silent)] {
        let mut answer = Vec::new();
        // Ends when the service closes the connection (or resets it).
        let closed = tokio::time::timeout(HANG, stream.read_to_end(&mut answer)).await;
        assert!(
            closed.is_ok(),
            "a connection that sent {what} is still open"
        );
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer}"
        );
    }
    // A whole request is answered as ever.
    let answer = raw(&addr, &get(&addr, "/health", "127.0.0.1")).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
}

#[tokio::test]
async fn connections_over_the_cap_get_a_503_naming_it_and_a_client_is_served_once_others_close() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        dir.path(),
        &["--max-connections", "4", "--header-timeout", "600"],
    );
    let addr = authority(&daemon.url);
    // Four connections that send nothing hold the four places (the service
    // accepts connections in the order they were made).
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    for _ in 0..3 {
        let answer = raw(&addr, &get(&addr, "/health", "127.0.0.1")).await;
        assert_eq!(status_of(&answer), 503, "{answer}");
        let body = body_of(&answer);
        assert_eq!(body["error"]["code"], "too_many_connections", "{answer}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("4 open connections") && message.contains("--max-connections"),
            "{message}"
        );
    }
    // One closes: a client that tries again is served.
    drop(held.pop());
    let answer = once_served(&addr, "/health").await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    // Every refusal was counted.
    let metrics = once_served(&addr, "/metrics").await;
    let refused: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("orchestrator_http_connections_refused_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(refused >= 3.0, "{metrics}");
}

#[tokio::test]
async fn each_token_holds_at_most_max_streams_event_streams_and_followed_logs() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    settings.network.max_streams = 2;
    let service = TestService::start(settings).await;
    let viewer = create_token(&service, "viewer-1", "viewer").await;
    let open = |token: &str, path: &str| {
        service
            .http
            .get(format!("{}{path}", service.base))
            .bearer_auth(token)
            .send()
    };
    let first = open(ADMIN, "/events").await.unwrap();
    assert_eq!(first.status(), 200);
    let second = open(ADMIN, "/events").await.unwrap();
    assert_eq!(second.status(), 200);
    for path in [
        "/events",
        "/tasks/0190a6f1-0000-7000-8000-000000000000/logs?follow=true",
    ] {
        let third = open(ADMIN, path).await.unwrap();
        assert_eq!(third.status(), 429, "{path}");
        let body: Value = third.json().await.unwrap();
        assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("2 open") && message.contains("--max-streams"),
            "{message}"
        );
    }
    // Another token has places of its own.
    let theirs = open(&viewer, "/events").await.unwrap();
    assert_eq!(theirs.status(), 200);
    // A stream the client closes gives its place back.
    drop(first);
    let mut reopened = None;
    for _ in 0..200 {
        let again = open(ADMIN, "/events").await.unwrap();
        if again.status() == 200 {
            reopened = Some(again);
            break;
        }
        assert_eq!(again.status(), 429);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reopened.is_some(),
        "the closed stream's place never came back"
    );
    drop((second, theirs, reopened));
    service.stop().await;
}

#[tokio::test]
async fn x_forwarded_for_names_the_client_in_the_audit_log_only_from_a_trusted_proxy() {
    for (trusted, expected) in [(true, "203.0.113.7"), (false, "127.0.0.1")] {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = with_auth(dir.path());
        if trusted {
            settings.network.trusted_proxies =
                vec![orchestrator_api::parse_trusted_proxy("127.0.0.1/32").unwrap()];
        }
        let service = TestService::start(settings).await;
        let refused = service
            .http
            .get(format!("{}/tasks", service.base))
            .bearer_auth("a-wrong-token")
            .header("x-forwarded-for", "6.6.6.6, 203.0.113.7")
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 401);
        let (status, audit) = call(&service, "GET", "/audit?limit=100", Some(ADMIN), None).await;
        assert_eq!(status, 200, "{audit}");
        let targets: Vec<&str> = audit["records"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["action"] == "auth.refused")
            .filter_map(|r| r["target"].as_str())
            .collect();
        assert_eq!(targets, [expected], "trusted proxy: {trusted}");
        service.stop().await;
    }
}

#[tokio::test]
async fn clients_forwarded_by_a_trusted_proxy_get_rate_limit_buckets_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    settings.address_rate_limit = 1;
    settings.network.trusted_proxies =
        vec![orchestrator_api::parse_trusted_proxy("127.0.0.1").unwrap()];
    let service = TestService::start(settings).await;
    let health = |client: &'static str| {
        service
            .http
            .get(format!("{}/health", service.base))
            .header("x-forwarded-for", client)
            .send()
    };
    let mut limited = false;
    for _ in 0..50 {
        if health("198.51.100.1").await.unwrap().status() == 429 {
            limited = true;
            break;
        }
    }
    assert!(limited, "the first client never reached its limit");
    // Right after, through the same proxy, another client is served.
    assert_eq!(health("198.51.100.2").await.unwrap().status(), 200);
    service.stop().await;
}

#[tokio::test]
async fn without_auth_what_another_site_could_make_a_browser_send_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &["--public-host", "orch.example.com"]);
    let addr = authority(&daemon.url);
    let submit = |content_type: &str, origin: &str| {
        let body = r#"{"infra": "test", "servers": ["web-1"]}"#;
        format!(
            "POST /workflows/servers/create HTTP/1.1\r\nHost: {addr}\r\n{origin}\
             Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    };

    // `fetch(url, {method: "POST", mode: "no-cors", body})` sends text/plain.
    let answer = raw(&addr, &submit("text/plain;charset=UTF-8", "")).await;
    assert_eq!(status_of(&answer), 415, "{answer}");
    let message = body_of(&answer)["error"]["message"].to_string();
    assert!(
        message.contains("Content-Type") && message.contains("text/plain"),
        "{message}"
    );

    // A name rebound to 127.0.0.1 arrives with its own Host.
    let answer = raw(&addr, &get(&addr, "/tasks", "evil.example")).await;
    assert_eq!(status_of(&answer), 421, "{answer}");
    assert!(
        body_of(&answer)["error"]["message"]
            .to_string()
            .contains("Host `evil.example`")
    );

    // Another site's page, even with the right type.
    let answer = raw(
        &addr,
        &submit("application/json", "Origin: https://evil.example\r\n"),
    )
    .await;
    assert_eq!(status_of(&answer), 403, "{answer}");
    assert!(
        body_of(&answer)["error"]["message"]
            .to_string()
            .contains("Origin")
    );

    // The service's own page, a plain client, and a public name are served.
    let own_origin = format!("Origin: http://{addr}\r\n");
    let answer = raw(&addr, &submit("application/json", &own_origin)).await;
    assert_eq!(status_of(&answer), 202, "{answer}");
    let task = body_of(&answer)["task_ids"][0].as_str().unwrap().to_owned();
    let answer = raw(&addr, &get(&addr, "/tasks", "orch.example.com")).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let answer = raw(&addr, &get(&addr, "/health", "localhost:1")).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    // A change without a body (cancel) needs no type, as the CLI sends it.
    // (It may have finished already: then the answer is 409, not 415.)
    let output = daemon.cli(&["cancel", &task]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() || !stderr.contains("Content-Type"),
        "{stderr}"
    );
}
