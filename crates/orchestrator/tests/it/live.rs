//! The live views over HTTP: `GET /events` (server-sent events) and
//! `GET /tasks/{id}/logs?follow=true`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

/// One server-sent event as received.
#[derive(Debug, Clone)]
pub(crate) struct Sse {
    pub(crate) event: String,
    id: Option<String>,
    pub(crate) data: Value,
}

/// A reader of one `text/event-stream` response (`testenv.rs` reads
/// environment events with it too).
pub(crate) struct Stream {
    response: reqwest::Response,
    pending: String,
}

impl Stream {
    pub(crate) async fn open(service: &TestService, query: &str, last_id: Option<&str>) -> Stream {
        let mut request = service.http.get(format!("{}/events{query}", service.base));
        if let Some(id) = last_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{:?}",
            response.headers()
        );
        Stream {
            response,
            pending: String::new(),
        }
    }

    /// The next event, or the next keep-alive comment as an event named
    /// `:`; panics after `limit`.
    async fn next_within(&mut self, limit: Duration) -> Sse {
        tokio::time::timeout(limit, async {
            loop {
                if let Some(end) = self.pending.find("\n\n") {
                    let block: String = self.pending.drain(..end + 2).collect();
                    let mut sse = Sse {
                        event: "message".into(),
                        id: None,
                        data: Value::Null,
                    };
                    let mut comment = false;
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("event:") {
                            sse.event = v.trim().to_owned();
                        } else if let Some(v) = line.strip_prefix("id:") {
                            sse.id = Some(v.trim().to_owned());
                        } else if let Some(v) = line.strip_prefix("data:") {
                            sse.data = serde_json::from_str(v.trim()).unwrap();
                        } else if line.starts_with(':') {
                            comment = true;
                        }
                    }
                    if comment && sse.data.is_null() {
                        sse.event = ":".into();
                    }
                    return sse;
                }
                let chunk = self
                    .response
                    .chunk()
                    .await
                    .unwrap()
                    .expect("the stream stays open");
                self.pending.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .await
        .expect("an event in time")
    }

    pub(crate) async fn next(&mut self) -> Sse {
        loop {
            let sse = self.next_within(Duration::from_secs(30)).await;
            if sse.event != ":" {
                return sse;
            }
        }
    }

    /// Changes until the workflow's own final status arrives.
    async fn until_finished(&mut self, workflow: &str) -> Vec<Sse> {
        let mut seen = Vec::new();
        loop {
            let sse = self.next().await;
            let done = sse.data["workflow_id"] == workflow
                && sse.data.get("task_id").is_none()
                && sse.data["kind"] == "workflow_status_changed"
                && matches!(sse.data["status"].as_str(), Some("completed" | "failed"));
            seen.push(sse);
            if done {
                return seen;
            }
        }
    }
}

fn kinds_of_task(seen: &[Sse], task: &str) -> Vec<String> {
    seen.iter()
        .filter(|s| s.data["task_id"] == task && s.data["kind"] != "log_appended")
        .map(|s| s.data["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn events_stream_a_snapshot_then_each_change_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let mut stream = Stream::open(&service, "", None).await;
    let snapshot = stream.next().await;
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["workflows"], json!([]));
    let (workflow, tasks) = service.create_servers(&["web-01"], json!({})).await;
    let seen = stream.until_finished(&workflow).await;
    assert_eq!(
        kinds_of_task(&seen, &tasks[0]),
        [
            "submitted",
            "claimed",
            "started",
            "attempt_ended",
            "completed"
        ]
    );
    for sse in &seen {
        assert_eq!(sse.event, "change");
        let id = sse.id.as_deref().expect("every change has an id");
        assert!(id.ends_with(&format!("-{}", sse.data["seq"])), "{id}");
    }
    // A second stream starts from the state as it is now.
    let mut later = Stream::open(&service, &format!("?workflow={workflow}"), None).await;
    let snapshot = later.next().await;
    assert_eq!(snapshot.data["workflows"][0]["status"], "completed");
    assert_eq!(
        snapshot.data["workflows"][0]["tasks"][0]["id"],
        tasks[0].as_str()
    );
    service.stop().await;
}

#[tokio::test]
async fn events_filter_by_workflow_and_kind_and_refuse_unknown_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (first, _) = service
        .create_servers(&["web-01"], json!({"wait": true}))
        .await;
    let (status, body) = service.get("/events?kind=completed,bogus").await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("kind") && message.contains("bogus"),
        "{message}"
    );
    let (status, body) = service.get("/events?workflow=nope").await;
    assert_eq!(status, 400, "{body}");

    let mut only_completed = Stream::open(&service, "?kind=completed", None).await;
    assert_eq!(only_completed.next().await.event, "snapshot");
    let (second, tasks) = service.create_servers(&["web-02"], json!({})).await;
    let event = only_completed.next().await;
    assert_eq!(event.data["kind"], "completed");
    assert_eq!(event.data["task_id"], tasks[0].as_str());
    assert_eq!(event.data["workflow_id"], second.as_str());
    assert_ne!(second, first);
    service.stop().await;
}

#[tokio::test]
async fn last_event_id_resumes_without_a_gap_or_asks_to_resync() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let mut stream = Stream::open(&service, "", None).await;
    stream.next().await; // the snapshot
    let (workflow, _) = service.create_servers(&["web-01"], json!({})).await;
    let seen = stream.until_finished(&workflow).await;
    let middle = &seen[seen.len() / 2];
    drop(stream);
    // Resuming after an event replays the ones after it, no snapshot.
    let mut resumed = Stream::open(&service, "", middle.id.as_deref()).await;
    let next = resumed.next().await;
    assert_eq!(next.event, "change");
    assert_eq!(next.data["seq"], middle.data["seq"].as_u64().unwrap() + 1);
    // An id from another life of the service cannot be resumed: resync.
    let mut stale = Stream::open(&service, "", Some("1-5")).await;
    let first = stale.next().await;
    assert_eq!(first.event, "resync");
    assert_eq!(first.data["kind"], "resync");
    service.stop().await;
}

#[tokio::test]
async fn an_idle_stream_gets_keep_alive_comments() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let mut stream = Stream::open(&service, "?kind=resync", None).await;
    assert_eq!(stream.next().await.event, "snapshot");
    // Nothing happens; within the keep-alive period a comment arrives.
    let keep_alive = stream.next_within(Duration::from_secs(20)).await;
    assert_eq!(keep_alive.event, ":");
    service.stop().await;
}

#[tokio::test]
async fn events_need_a_viewer_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.auth = true;
    let service = TestService::start(settings).await;
    let (status, body) = service.get("/events").await;
    assert_eq!(status, 401, "{body}");
    let engine = &service.handle.as_ref().unwrap().engine;
    let viewer = engine
        .access()
        .create_token("watcher", orchestrator_core::access::Role::Viewer)
        .await
        .unwrap();
    let response = service
        .http
        .get(format!("{}/events", service.base))
        .bearer_auth(&viewer.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    service.stop().await;
}

#[tokio::test]
async fn a_followed_log_streams_lines_as_written_and_ends_with_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let engine = service.handle.as_ref().unwrap().engine.clone();
    // A step that prints, pauses and prints again.
    let template = json!({
        "name": "talk", "ref_name": "talk", "schema_version": 1,
        "steps": [{"ref_name": "talk", "script": "dag/step.py",
                   "input": {"name": "talk", "sleep": 1.5}}]
    });
    let (status, view) = service
        .post("/workflows", json!({"template": template}))
        .await;
    assert!(status == 202 || status == 200, "{view}");
    let task = view["tasks"][0]["id"].as_str().unwrap().to_owned();
    let mut response = service
        .http
        .get(format!("{}/tasks/{task}/logs?follow=true", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = Vec::new();
    let mut chunks = 0;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(60), response.chunk())
        .await
        .expect("the stream moves or ends")
        .unwrap()
    {
        chunks += 1;
        body.extend_from_slice(&chunk);
    }
    // It ended by itself, and only once the task had.
    let status = engine.task(task.parse().unwrap()).await.unwrap().status;
    assert!(status.is_terminal(), "{status}");
    let text = String::from_utf8(body).unwrap();
    let (_, stored) = service.get_text(&format!("/tasks/{task}/logs")).await;
    assert_eq!(text, stored, "the followed log is the whole log");
    assert!(
        chunks >= 2,
        "the log came as it was written ({chunks} chunk)"
    );
    // An unknown task is a 404 before any stream starts.
    let (status, _) = service
        .get(&format!("/tasks/{}/logs?follow=true", uuid::Uuid::now_v7()))
        .await;
    assert_eq!(status, 404);
    service.stop().await;
}

/// Resident memory of this process (service and clients), in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Many idle streams cost bounded memory, and a burst of events that none
/// of them reads does not pile up for them: each still works afterwards.
#[tokio::test]
async fn two_hundred_idle_streams_cost_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    // All of them are the one local user's: above the per-caller cap
    // (`--max-streams`, tested in network.rs), which this is not about.
    let mut settings = fixture_settings(dir.path());
    settings.network.max_streams = 256;
    let service = TestService::start(settings).await;
    // Warm up: one stream and one workflow, so that lazily built state
    // (connection pools, the first workflow) is not counted.
    let mut warm = Stream::open(&service, "", None).await;
    warm.next().await;
    service
        .create_servers(&["warm"], json!({"wait": true}))
        .await;
    drop(warm);
    let before = rss();
    let mut streams = Vec::new();
    for _ in 0..200 {
        // One client, and so one connection per open stream, as 200
        // browser tabs would have: what is counted is mostly the service's.
        let response = service
            .http
            .get(format!("{}/events", service.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        streams.push(Stream {
            response,
            pending: String::new(),
        });
    }
    let with_streams = rss();
    // A burst of events that nobody reads.
    let servers: Vec<String> = (0..40).map(|i| format!("burst-{i}")).collect();
    let names: Vec<&str> = servers.iter().map(String::as_str).collect();
    let (workflow, _) = service.create_servers(&names, json!({"wait": true})).await;
    let after_burst = rss();
    let per_stream = with_streams.saturating_sub(before) / 200;
    assert!(
        per_stream < 64 * 1024,
        "each idle stream costs {per_stream} bytes"
    );
    assert!(
        after_burst.saturating_sub(with_streams) < 32 * 1024 * 1024,
        "the unread burst grew memory by {} bytes",
        after_burst - with_streams
    );
    // Every stream still answers: its snapshot, then events (or a resync).
    for stream in streams.iter_mut().step_by(20) {
        assert_eq!(stream.next().await.event, "snapshot");
        let next = stream.next().await;
        assert!(next.event == "change" || next.event == "resync", "{next:?}");
    }
    assert!(!workflow.is_empty());
    service.stop().await;
}

/// A script that prints 1 GiB, with and without newlines, costs the
/// service bounded memory: its output streams to the log (up to the log's
/// limit) instead of being held, and the result after it is still read.
#[tokio::test]
async fn a_flood_of_output_costs_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.max_log_bytes = 16 * 1024 * 1024;
    let service = TestService::start(settings).await;
    service
        .create_servers(&["warm"], json!({"wait": true}))
        .await;
    let idle = rss();
    for newlines in [true, false] {
        let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let sampling = {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    peak.fetch_max(rss(), std::sync::atomic::Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let template = json!({
            "name": "loud", "ref_name": "loud", "schema_version": 1,
            "steps": [{"ref_name": "loud", "script": "dag/loud.py",
                       "input": {"bytes": 1u64 << 30, "newlines": newlines}}]
        });
        let (status, view) = service
            .post(
                "/workflows",
                json!({"template": template, "wait": true, "wait_timeout_secs": 600}),
            )
            .await;
        sampling.abort();
        assert_eq!(status, 200, "{view}");
        let task = &view["tasks"][0];
        assert_eq!(task["status"], "completed", "{task}");
        assert_eq!(task["output"]["printed"], 1u64 << 30);
        let grew = peak
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(idle);
        assert!(
            grew < 64 * 1024 * 1024,
            "printing 1 GiB (newlines: {newlines}) grew memory by {} MiB",
            grew >> 20
        );
        // The log stopped at its limit, and says so.
        let id = task["id"].as_str().unwrap();
        let from = 15 * 1024 * 1024;
        let (_, tail) = service
            .get_text(&format!(
                "/tasks/{id}/logs?offset={from}&limit_bytes=16777216"
            ))
            .await;
        assert!(
            from + tail.len() <= 16 * 1024 * 1024 + 300,
            "the log holds {} bytes",
            from + tail.len()
        );
        assert!(
            tail.trim_end()
                .ends_with("the rest of its output is dropped"),
            "{:?}",
            &tail[tail.len().saturating_sub(300)..]
        );
    }
    service.stop().await;
}

/// A live storage migration announces each phase on the event stream,
/// with its status, in order, ending with the switch's stall.
#[tokio::test]
async fn a_storage_migration_announces_its_phases() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(&dir.path().join("data"))).await;
    let mut stream = Stream::open(&service, "?kind=storage_migration", None).await;
    assert_eq!(stream.next().await.event, "snapshot");
    let target = format!("filesystem:{}", dir.path().join("moved").display());
    let (status, started) = service
        .post("/admin/storage/migrations", json!({"target": target}))
        .await;
    assert_eq!(status, 202, "{started}");
    let mut phases: Vec<String> = Vec::new();
    loop {
        let sse = stream.next().await;
        assert_eq!(sse.data["kind"], "storage_migration", "{:?}", sse.data);
        let migration = &sse.data["migration"];
        assert_eq!(migration["id"], started["id"]);
        assert_eq!(sse.data["status"], migration["phase"]);
        let phase = migration["phase"].as_str().unwrap().to_owned();
        if phases.last() != Some(&phase) {
            phases.push(phase.clone());
        }
        if phase == "completed" {
            assert!(
                migration["switch_stall_ms"].as_f64().is_some(),
                "{migration}"
            );
            break;
        }
    }
    assert_eq!(
        phases,
        [
            "copying",
            "mirroring",
            "verifying",
            "switching",
            "completed"
        ],
        "{phases:?}"
    );
    service.stop().await;
}
