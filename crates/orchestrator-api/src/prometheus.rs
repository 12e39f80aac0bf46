//! `GET /metrics`: the Prometheus text exposition.
//!
//! Two sources make up a scrape:
//!
//! - Events, recorded where they happen through the `metrics` facade
//!   (attempts, retries and task durations in the engine, storage latency in
//!   `orchestrator_storage::timed`, HTTP requests here). The facade's one
//!   process-wide recorder is the Prometheus exporter, installed on first use
//!   ([`handle`]); tests start several services in one process, so it is a
//!   `OnceLock`, and these counters add up across them.
//! - Levels, computed at scrape time from this service's own engine and
//!   storage (queue depth, running tasks, workflows by status), so they are
//!   exact and per service even when several share a process.

use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use orchestrator_storage::WorkflowQuery;

use crate::AppState;

/// The content type of the text format, version 0.0.4.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets, in seconds. Scripts run for seconds to an hour; requests and
/// storage calls for micro- to milliseconds, except `wait` submissions.
const TASK_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];
const HTTP_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0, 600.0,
];
const STORAGE_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The process's exporter handle, installing the recorder on first call.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let builder = [
            ("orchestrator_task_duration_seconds", TASK_BUCKETS),
            ("orchestrator_http_request_duration_seconds", HTTP_BUCKETS),
            (
                "orchestrator_storage_operation_duration_seconds",
                STORAGE_BUCKETS,
            ),
        ]
        .into_iter()
        .fold(PrometheusBuilder::new(), |builder, (name, buckets)| {
            // Only an empty bucket list is refused, and none is.
            builder
                .set_buckets_for_metric(Matcher::Full(name.into()), buckets)
                .expect("bucket lists are not empty")
        });
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "another metrics recorder is installed; /metrics shows only the levels computed at scrape time"
            );
        } else {
            describe();
            // Histograms buffer samples until they are drained; a service
            // that is never scraped must not grow without bound.
            let upkeep = handle.clone();
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(Duration::from_secs(5));
                        upkeep.run_upkeep();
                    }
                });
        }
        handle
    })
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        "orchestrator_task_attempts_total",
        "Attempts started (claims stored), by script."
    );
    describe_counter!(
        "orchestrator_task_retries_total",
        "Attempts that failed and left the task waiting for a retry, by script."
    );
    describe_histogram!(
        "orchestrator_task_duration_seconds",
        Unit::Seconds,
        "Wall time of an attempt, from its claim to its stored outcome, by script and outcome (the status it led to)."
    );
    describe_counter!(
        "orchestrator_auth_refusals_total",
        "Requests refused without a valid token (reason: unauthorized, or rate_limited by address or before sign-in); the audit log has them in aggregate, one record per address per minute."
    );
    metrics::describe_gauge!(
        "orchestrator_http_connections",
        "HTTP connections open now (at most --max-connections)."
    );
    describe_counter!(
        "orchestrator_http_connections_refused_total",
        "Connections over --max-connections, answered 503 (or closed) at once."
    );
    describe_counter!(
        "orchestrator_http_requests_total",
        "HTTP requests answered, by method, route template and status."
    );
    describe_histogram!(
        "orchestrator_http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer an HTTP request, by method and route template."
    );
    describe_histogram!(
        "orchestrator_storage_operation_duration_seconds",
        Unit::Seconds,
        "Latency of storage calls, by backend and operation."
    );
    describe_counter!(
        "orchestrator_storage_errors_total",
        "Storage calls that failed (a lost compare-and-set is not a failure), by backend and operation."
    );
    describe_counter!(
        "orchestrator_schedule_runs_total",
        "Due runs of schedules this node claimed, by outcome: started, skipped (overlap), missed (no node ran the schedule then), failed (could not be submitted)."
    );
}

/// Counts and times every request by its route template (`/tasks/{id}`,
/// never the raw path, so ids cannot multiply the series). Requests that
/// match no route are `route="unmatched"`; unusual methods are `other`.
pub(crate) async fn track_requests(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(
        "orchestrator_http_requests_total",
        "method" => method,
        "route" => route.clone(),
        "status" => status,
    )
    .increment(1);
    metrics::histogram!(
        "orchestrator_http_request_duration_seconds",
        "method" => method,
        "route" => route,
    )
    .record(started.elapsed().as_secs_f64());
    response
}

fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Prometheus text exposition (format 0.0.4); docs/api.md lists the
/// metrics. Needs no token when asked from loopback (the `security` of
/// this operation lists "none" as one way in); from elsewhere, any valid
/// token.
#[utoipa::path(get, path = "/metrics", tag = "operations", extensions(("x-role" = json!("local-or-token"))),
    responses(
    (status = 200, description = "The metrics", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String),
))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let mut text = handle().render();
    levels(&state, &mut text).await;
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    response
}

/// The gauges computed from this service's engine and storage.
async fn levels(state: &AppState, out: &mut String) {
    let engine = &state.engine;
    let (ready, delayed) = engine.queue_depth();
    gauge_family(
        out,
        "orchestrator_queue_depth",
        "Tasks in the ready queue that may start now, by priority.",
    );
    for (priority, n) in ready {
        let _ = writeln!(
            out,
            "orchestrator_queue_depth{{priority=\"{priority}\"}} {n}"
        );
    }
    gauge_family(
        out,
        "orchestrator_queue_delayed",
        "Tasks queued for a later time: retries waiting for their backoff, scheduled starts.",
    );
    let _ = writeln!(out, "orchestrator_queue_delayed {delayed}");
    let (_, running) = engine.load();
    gauge_family(
        out,
        "orchestrator_tasks_running",
        "Attempts this node runs now.",
    );
    let _ = writeln!(out, "orchestrator_tasks_running {running}");
    gauge_family(
        out,
        "orchestrator_workers",
        "How many scripts this node may run at once.",
    );
    let _ = writeln!(out, "orchestrator_workers {}", engine.config().workers);

    let by_status = engine
        .count_workflows_by_status(&WorkflowQuery::default())
        .await
        .inspect_err(|e| {
            // The events still render; the levels need storage.
            tracing::warn!(error = %e, "metrics: cannot count workflows");
        });
    let up = by_status.is_ok();
    if let Ok(by_status) = by_status {
        gauge_family(
            out,
            "orchestrator_workflows",
            "Workflows in storage, by status (every node's, on a shared store).",
        );
        for (status, n) in by_status {
            let _ = writeln!(out, "orchestrator_workflows{{status=\"{status}\"}} {n}");
        }
    }
    gauge_family(
        out,
        "orchestrator_storage_up",
        "1 when storage answered this scrape's queries, else 0.",
    );
    let _ = writeln!(out, "orchestrator_storage_up {}", u8::from(up));
}

fn gauge_family(out: &mut String, name: &str, help: &str) {
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}
