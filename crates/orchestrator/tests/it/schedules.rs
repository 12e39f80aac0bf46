//! Recurring schedules: one short real-time run through HTTP, the overlap
//! and catch-up policies with a clock of the test's own (the engine's
//! scheduler round at a given `now`), bad input, and two nodes on one
//! SurrealDB server starting each due run exactly once.

use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use orchestrator_engine::Engine;
use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

fn engine(service: &TestService) -> Engine {
    service.handle.as_ref().unwrap().engine.clone()
}

/// Polls `GET /schedules/{id}` until `done` holds (or panics after a minute).
async fn wait_schedule(service: &TestService, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, schedule) = service.get(&format!("/schedules/{id}")).await;
        assert_eq!(status, 200, "{schedule}");
        if done(&schedule) {
            return schedule;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the schedule never got there: {schedule}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn runs_in(schedule: &Value, state: &str) -> Vec<Value> {
    schedule["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["state"] == state)
        .cloned()
        .collect()
}

async fn create(service: &TestService, body: Value) -> String {
    let (status, created) = service.post("/schedules", body).await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_schedule_every_second_starts_workflows_until_paused_and_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let id = create(
        &service,
        json!({"name": "every second", "template": "chain", "cron": "* * * * * *",
               "timezone": "Europe/Berlin", "overlap": "queue"}),
    )
    .await;
    let schedule = wait_schedule(&service, &id, |s| runs_in(s, "started").len() >= 2).await;
    assert_eq!(schedule["name"], "every second");
    assert!(schedule["next_due"].is_string(), "{schedule}");
    for run in runs_in(&schedule, "started") {
        let workflow = service
            .wait_workflow(run["workflow_id"].as_str().unwrap())
            .await;
        assert_eq!(workflow["status"], "completed", "{workflow}");
        assert_eq!(workflow["trace_id"], format!("schedule:{id}"));
    }
    let (_, listed) = service
        .get(&format!("/workflows?trace_id=schedule:{id}"))
        .await;
    assert!(listed["total"].as_u64().unwrap() >= 2, "{listed}");

    let (status, paused) = service
        .patch(&format!("/schedules/{id}"), json!({"paused": true}))
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["paused"], true);
    assert!(paused["next_due"].is_null(), "{paused}");
    let (_, metrics) = service.get_text("/metrics").await;
    assert!(
        metrics.contains("orchestrator_schedule_runs_total{outcome=\"started\"}"),
        "{metrics}"
    );

    let (status, _) = service.delete(&format!("/schedules/{id}")).await;
    assert_eq!(status, 204);
    let (status, gone) = service.get(&format!("/schedules/{id}")).await;
    assert_eq!(status, 404, "{gone}");
    let (_, all) = service.get("/schedules").await;
    assert_eq!(all["schedules"], json!([]));
    service.stop().await;
}

#[tokio::test]
async fn bad_schedules_get_422_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let good = json!({"template": "chain", "cron": "0 2 * * *"});
    let with = |key: &str, value: Value| {
        let mut body = good.clone();
        body[key] = value;
        body
    };
    for (body, start) in [
        (
            with("cron", json!("61 * * * *")),
            "cron: `61 * * * *` is not valid",
        ),
        (with("cron", json!("* * *")), "cron: `* * *` has 3 fields"),
        (
            with("cron", json!("0 0 30 2 *")),
            "cron: `0 0 30 2 *` never comes due",
        ),
        (
            with("timezone", json!("Mars/Olympus")),
            "timezone: `Mars/Olympus` is not an IANA time zone",
        ),
        (
            with("template", json!("nope")),
            "template: unknown template `nope`",
        ),
        (
            with("template", json!({"name": "t"})),
            "template: a schedule runs a registered template",
        ),
        (
            with("vars", json!({"sleep": "long"})),
            "vars.sleep: expected a number",
        ),
        (
            with("overlap", json!("later")),
            "overlap: unknown variant `later`",
        ),
        (
            with("catch_up", json!("some")),
            "catch_up: unknown variant `some`",
        ),
        (
            with("catch_up_window_secs", json!(0)),
            "catch_up_window_secs: must be at least 1",
        ),
        (
            with("end_at", json!("2020-01-01T00:00:00Z")),
            "end_at: 2020-01-01 00:00:00 UTC is not after start_at",
        ),
        (with("colour", json!(1)), "colour: unknown field"),
    ] {
        let mut body = body;
        if body.get("end_at").is_some() {
            body["start_at"] = json!("2021-01-01T00:00:00Z");
        }
        let (status, answer) = service.post("/schedules", body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(start), "{body}: {message}");
    }
    let id = create(&service, good).await;
    let (status, answer) = service
        .patch(
            &format!("/schedules/{id}"),
            json!({"timezone": "Nowhere/Land"}),
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("timezone:")
    );
    let (status, _) = service.get("/schedules/not-a-uuid").await;
    assert_eq!(status, 400);
    service.stop().await;
}

/// A schedule whose due times the service's own (real-time) round never
/// reaches: it starts in ten days, and the test drives the rounds.
fn future_hourly(sleep: f64, overlap: &str) -> (Value, DateTime<Utc>) {
    let start = (Utc::now() + TimeDelta::days(10))
        .duration_trunc(TimeDelta::hours(1))
        .unwrap();
    let body = json!({"template": "chain", "cron": "0 * * * *", "overlap": overlap,
                      "vars": {"sleep": sleep}, "start_at": start});
    (body, start)
}

async fn tick(service: &TestService, at: DateTime<Utc>) {
    engine(service).tick_schedules(at).await.unwrap();
}

/// A round at `at`, then waits until the runs it started have finished.
async fn tick_and_settle(service: &TestService, id: &str, at: DateTime<Utc>) {
    tick(service, at).await;
    for run in runs_in(&schedule_of(service, id).await, "started") {
        service
            .wait_workflow(run["workflow_id"].as_str().unwrap())
            .await;
    }
}

async fn schedule_of(service: &TestService, id: &str) -> Value {
    service.get(&format!("/schedules/{id}")).await.1
}

#[tokio::test]
async fn each_overlap_policy_with_a_clock_of_the_tests_own() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let second = TimeDelta::seconds(1);
    let hour = TimeDelta::hours(1);

    // skip: the run due while the previous one still goes does not start.
    let (body, start) = future_hourly(3.0, "skip");
    let skip = create(&service, body).await;
    tick(&service, start + second).await;
    tick(&service, start + hour + second).await;
    let schedule = schedule_of(&service, &skip).await;
    assert_eq!(runs_in(&schedule, "started").len(), 1, "{schedule}");
    let skipped = runs_in(&schedule, "skipped");
    assert_eq!(skipped.len(), 1, "{schedule}");
    assert!(
        skipped[0]["reason"]
            .as_str()
            .unwrap()
            .contains("still going"),
        "{skipped:?}"
    );

    // queue: it waits, and starts once the previous run has finished.
    let (body, start) = future_hourly(1.0, "queue");
    let queue = create(&service, body).await;
    tick(&service, start + second).await;
    tick(&service, start + hour + second).await;
    let schedule = schedule_of(&service, &queue).await;
    assert_eq!(runs_in(&schedule, "waiting").len(), 1, "{schedule}");
    let first = runs_in(&schedule, "started")[0]["workflow_id"]
        .as_str()
        .unwrap()
        .to_owned();
    service.wait_workflow(&first).await;
    let schedule = wait_schedule(&service, &queue, |s| runs_in(s, "started").len() == 2).await;
    assert!(runs_in(&schedule, "waiting").is_empty(), "{schedule}");

    // cancel_previous: the previous run is cancelled, the new one starts.
    let (body, start) = future_hourly(3.0, "cancel_previous");
    let cancel = create(&service, body).await;
    tick(&service, start + second).await;
    tick(&service, start + hour + second).await;
    let schedule = schedule_of(&service, &cancel).await;
    let started = runs_in(&schedule, "started");
    assert_eq!(started.len(), 2, "{schedule}");
    // Newest first: the older run is the one cancelled.
    let older = service
        .wait_workflow(started[1]["workflow_id"].as_str().unwrap())
        .await;
    assert_eq!(older["status"], "cancelled", "{older}");
    let newer = service
        .wait_workflow(started[0]["workflow_id"].as_str().unwrap())
        .await;
    assert_eq!(newer["status"], "completed", "{newer}");
    service.stop().await;
}

/// The next `schedule_changed` event about schedule `id`.
async fn schedule_changed(events: &mut orchestrator_engine::events::Subscription, id: &str) {
    let wait = async {
        loop {
            let event = events.recv().await.expect("the bus is gone");
            if event.kind == orchestrator_core::event::EventKind::ScheduleChanged
                && event.schedule_id.map(|s| s.to_string()).as_deref() == Some(id)
            {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("no schedule_changed event");
}

#[tokio::test]
async fn next_runs_previews_and_schedule_changed_events() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;

    // A preview reads the expression in its zone, as the scheduler will:
    // 02:00 in Berlin in winter is 01:00 UTC.
    let (status, preview) = service
        .post(
            "/schedules/preview",
            json!({"cron": "0 2 * * *", "timezone": "Europe/Berlin",
                   "start_at": "2030-01-01T00:00:00Z", "end_at": "2030-01-02T12:00:00Z"}),
        )
        .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(
        preview["next_runs"],
        json!(["2030-01-01T01:00:00Z", "2030-01-02T01:00:00Z"])
    );
    let (status, preview) = service
        .post("/schedules/preview", json!({"cron": "*/15 * * * *"}))
        .await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(preview["next_runs"].as_array().unwrap().len(), 3);
    for (body, start) in [
        (json!({"cron": "* * *"}), "cron: `* * *` has 3 fields"),
        (
            json!({"cron": "0 0 30 2 *"}),
            "cron: `0 0 30 2 *` never comes due",
        ),
        (
            json!({"cron": "* * * * *", "timezone": "Mars/Olympus"}),
            "timezone: `Mars/Olympus` is not an IANA time zone",
        ),
        (
            json!({"cron": "* * * * *", "start_at": "2030-01-01T00:00:00Z",
                   "end_at": "2029-01-01T00:00:00Z"}),
            "end_at:",
        ),
        (
            json!({"cron": "* * * * *", "colour": 1}),
            "colour: unknown field",
        ),
    ] {
        let (status, answer) = service.post("/schedules/preview", body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(start), "{body}: {message}");
    }

    // A stored schedule shows its next three runs, and each change is
    // announced after it is stored.
    let mut events = engine(&service).subscribe();
    let (body, start) = future_hourly(0.0, "skip");
    let id = create(&service, body).await;
    schedule_changed(&mut events, &id).await;
    let schedule = schedule_of(&service, &id).await;
    let hour = TimeDelta::hours(1);
    assert_eq!(
        schedule["next_runs"],
        json!([start, start + hour, start + hour * 2])
    );
    assert_eq!(schedule["next_runs"][0], schedule["next_due"]);
    assert!(schedule.get("last_run").is_none(), "{schedule}");

    // A due run: its claim is announced, and the listing shows it as the
    // last run.
    tick(&service, start + TimeDelta::seconds(1)).await;
    schedule_changed(&mut events, &id).await;
    let (_, listed) = service.get("/schedules").await;
    let listed = &listed["schedules"][0];
    assert_eq!(listed["last_run"]["state"], "started", "{listed}");
    assert_eq!(listed["last_run"]["due"], json!(start));
    assert_eq!(listed["runs"], json!([]));
    assert_eq!(listed["next_runs"].as_array().unwrap().len(), 3);

    let (status, paused) = service
        .patch(&format!("/schedules/{id}"), json!({"paused": true}))
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["next_runs"], json!([]));
    schedule_changed(&mut events, &id).await;
    let (status, _) = service.delete(&format!("/schedules/{id}")).await;
    assert_eq!(status, 204);
    schedule_changed(&mut events, &id).await;
    service.stop().await;
}

#[tokio::test]
async fn catch_up_after_downtime_and_a_paused_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let second = TimeDelta::seconds(1);
    let hour = TimeDelta::hours(1);

    // Nobody ran the schedule from 01:00 to 05:10: 02:00, 03:00, 04:00 and
    // 05:00 passed. `latest` starts 05:00 and counts three missed.
    let (mut body, start) = future_hourly(0.0, "skip");
    body["catch_up"] = json!("latest");
    let latest = create(&service, body).await;
    tick_and_settle(&service, &latest, start + second).await;
    tick_and_settle(&service, &latest, start + hour * 4 + TimeDelta::minutes(10)).await;
    let schedule = schedule_of(&service, &latest).await;
    let started = runs_in(&schedule, "started");
    assert_eq!(started.len(), 2, "{schedule}");
    assert_eq!(
        started[0]["due"].as_str().unwrap(),
        (start + hour * 4).to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    );
    assert_eq!(started[0]["missed"], 3, "{schedule}");

    // `none`: nothing of the gap starts; one claim marks the three missed.
    let (body, start) = future_hourly(0.0, "skip");
    let none = create(&service, body).await;
    tick_and_settle(&service, &none, start + second).await;
    tick_and_settle(&service, &none, start + hour * 3 + TimeDelta::minutes(10)).await;
    let schedule = schedule_of(&service, &none).await;
    assert_eq!(runs_in(&schedule, "started").len(), 1, "{schedule}");
    assert_eq!(runs_in(&schedule, "missed")[0]["missed"], 3, "{schedule}");

    // Paused: nothing starts, and nothing is claimed.
    let (mut body, start) = future_hourly(0.0, "skip");
    body["catch_up"] = json!("all");
    body["paused"] = json!(true);
    let paused = create(&service, body).await;
    tick(&service, start + second).await;
    assert_eq!(schedule_of(&service, &paused).await["runs"], json!([]));
    service.stop().await;
}

#[cfg(feature = "surrealdb")]
mod surrealdb {
    use super::*;
    use crate::backends::dev_server::DevServer;
    use orchestrator_storage::{StorageType, SurrealdbConfig};

    #[tokio::test]
    async fn two_nodes_on_one_server_start_each_due_run_exactly_once() {
        let server = DevServer::start_memory();
        let database = format!("test_{}", uuid::Uuid::now_v7().simple());
        let settings = |dir: &std::path::Path| {
            let mut settings = fixture_settings(dir);
            settings.storage_type = StorageType::SurrealdbServer;
            settings.surrealdb = SurrealdbConfig {
                url: server.url(),
                database: database.clone(),
                request_timeout: Duration::from_secs(5),
                ..SurrealdbConfig::default()
            };
            settings
        };
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let a = TestService::start(settings(dir_a.path())).await;
        let b = TestService::start(settings(dir_b.path())).await;
        let (body, start) = future_hourly(0.0, "queue");
        let id = create(&a, body).await;
        // Both nodes reach every due time at the same moment.
        let (on_a, on_b) = (engine(&a), engine(&b));
        for hours in 0..4 {
            let at = start + TimeDelta::hours(hours) + TimeDelta::seconds(1);
            let (x, y) = tokio::join!(on_a.tick_schedules(at), on_b.tick_schedules(at));
            x.unwrap();
            y.unwrap();
        }
        let schedule = wait_schedule(&b, &id, |s| runs_in(s, "started").len() == 4).await;
        let dues: Vec<&str> = schedule["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["due"].as_str().unwrap())
            .collect();
        assert_eq!(dues.len(), 4, "one claim per due time: {schedule}");
        let (_, listed) = a.get(&format!("/workflows?trace_id=schedule:{id}")).await;
        assert_eq!(listed["total"], 4, "one workflow per due time: {listed}");
        a.stop().await;
        b.stop().await;
    }
}
