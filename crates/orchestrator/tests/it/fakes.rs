//! Test doubles of the systems http steps drive: a fake AWX and a fake
//! Terraform Cloud, small axum apps on loopback. Their jobs move through
//! states as time passes (a [`Plan`]), and they record every launch, poll
//! and cancel they receive, so that a test can count launches across a
//! crash. Each runs on its own thread and runtime, so that both the async
//! tests (whose service shares their runtime) and the tests that drive
//! the real binary can use them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// Which API the fake speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `POST /api/v2/job_templates/{id}/launch/` answers `{"job": n, ...}`;
    /// `GET /api/v2/jobs/{n}/` has `status`.
    Awx,
    /// `POST /api/v2/runs` answers `{"data": {"id": "run-n", ...}}`;
    /// `GET /api/v2/runs/{id}` has `data.attributes.status`.
    Terraform,
}

/// The statuses a job goes through, each for how long; the last one stays.
#[derive(Debug, Clone)]
pub struct Plan(pub Vec<(&'static str, Duration)>);

impl Plan {
    /// `pending`, `running` for `running`, then `end`.
    pub fn ending(end: &'static str, running: Duration) -> Plan {
        Plan(vec![
            ("pending", Duration::from_millis(100)),
            ("running", running),
            (end, Duration::ZERO),
        ])
    }

    fn status_at(&self, elapsed: Duration) -> &'static str {
        let mut until = Duration::ZERO;
        for (status, lasts) in &self.0 {
            until += *lasts;
            if elapsed < until {
                return status;
            }
        }
        self.0.last().map_or("unknown", |(status, _)| status)
    }
}

/// One launch as the fake received it.
#[derive(Debug, Clone)]
pub struct Launch {
    pub idempotency_key: Option<String>,
    pub body: Value,
}

/// Everything the fake received.
#[derive(Debug, Default)]
pub struct Seen {
    pub launches: Vec<Launch>,
    /// Job ids, one per poll, in order.
    pub polls: Vec<String>,
    /// Job ids, one per cancel.
    pub cancels: Vec<String>,
    /// Requests refused for a missing or wrong token.
    pub unauthorized: usize,
}

impl Seen {
    pub fn polls_of(&self, job: &str) -> usize {
        self.polls.iter().filter(|p| *p == job).count()
    }
}

struct Job {
    started: Instant,
    cancelled: bool,
    launch: Value,
}

struct Inner {
    flavor: Flavor,
    plan: Plan,
    /// `Authorization: Bearer <token>` is required when set.
    token: Option<String>,
    /// Answers put the token back in their bodies, as a careless API
    /// might: what the step logs and returns must still not show it.
    echo_token: bool,
    jobs: HashMap<String, Job>,
    seen: Seen,
}

type Shared = Arc<Mutex<Inner>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Inner> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running fake. Dropping it stops it.
pub struct Fake {
    pub port: u16,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    shared: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Fake {
    pub fn start(flavor: Flavor, plan: Plan) -> Fake {
        Fake::start_on(flavor, plan, 0)
    }

    /// On a given port (0: any free one).
    pub fn start_on(flavor: Flavor, plan: Plan, port: u16) -> Fake {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Mutex::new(Inner {
            flavor,
            plan,
            token: None,
            echo_token: false,
            jobs: HashMap::new(),
            seen: Seen::default(),
        }));
        let app = match flavor {
            Flavor::Awx => axum::Router::new()
                .route("/api/v2/job_templates/{template}/launch/", post(launch))
                .route("/api/v2/jobs/{job}/", get(poll))
                .route("/api/v2/jobs/{job}/cancel/", post(cancel)),
            Flavor::Terraform => axum::Router::new()
                .route("/api/v2/runs", post(launch))
                .route("/api/v2/runs/{job}", get(poll))
                .route("/api/v2/runs/{job}/actions/cancel", post(cancel)),
        }
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            authorize,
        ))
        .with_state(shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
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
        Fake {
            port,
            base: format!("http://127.0.0.1:{port}"),
            shared,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Requires `Authorization: Bearer <token>`, and optionally echoes it.
    pub fn require_token(&self, token: &str, echo: bool) {
        let mut inner = lock(&self.shared);
        inner.token = Some(token.to_owned());
        inner.echo_token = echo;
    }

    /// What the fake received so far.
    pub fn seen<T>(&self, read: impl FnOnce(&Seen) -> T) -> T {
        read(&lock(&self.shared).seen)
    }

    pub fn launches(&self) -> usize {
        self.seen(|s| s.launches.len())
    }

    /// Waits (in an async test) until `ready` holds, or panics after a minute.
    pub async fn until(&self, what: &str, ready: impl Fn(&Seen) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.seen(&ready) {
            assert!(Instant::now() < deadline, "the fake never saw {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// As [`Fake::until`], for the tests that drive the real binary.
    pub fn until_blocking(&self, what: &str, ready: impl Fn(&Seen) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.seen(&ready) {
            assert!(Instant::now() < deadline, "the fake never saw {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Every request passes the token check first.
async fn authorize(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let refusal = refused(&mut lock(&shared), request.headers());
    match refusal {
        Some(refusal) => refusal,
        None => next.run(request).await,
    }
}

/// The token check; `Some(answer)` refuses the request.
fn refused(inner: &mut Inner, headers: &HeaderMap) -> Option<Response> {
    let token = inner.token.as_ref()?;
    let sent = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if sent == format!("Bearer {token}") {
        return None;
    }
    inner.seen.unauthorized += 1;
    Some(
        (
            StatusCode::UNAUTHORIZED,
            Json(json!({"detail": "Authentication credentials were not provided."})),
        )
            .into_response(),
    )
}

/// Starts a job, if the token allows, and answers with its id where the
/// flavor puts it.
async fn launch(
    State(shared): State<Shared>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let mut inner = lock(&shared);
    let n = inner.seen.launches.len() + 1;
    let (job, answer) = match inner.flavor {
        Flavor::Awx => (
            n.to_string(),
            json!({"job": n, "id": n, "type": "job", "status": "pending"}),
        ),
        Flavor::Terraform => {
            let id = format!("run-{n:04}");
            let answer =
                json!({"data": {"id": id, "type": "runs", "attributes": {"status": "pending"}}});
            (id, answer)
        }
    };
    inner.jobs.insert(
        job,
        Job {
            started: Instant::now(),
            cancelled: false,
            launch: body.clone(),
        },
    );
    inner.seen.launches.push(Launch {
        idempotency_key: headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
    });
    (StatusCode::CREATED, Json(answer)).into_response()
}

async fn poll(State(shared): State<Shared>, Path(job): Path<String>) -> Response {
    let mut inner = lock(&shared);
    let echo = inner
        .echo_token
        .then(|| inner.token.clone())
        .flatten()
        .unwrap_or_default();
    let Some(record) = inner.jobs.get(&job) else {
        return (StatusCode::NOT_FOUND, Json(json!({"detail": "Not found."}))).into_response();
    };
    let status = if record.cancelled {
        "canceled"
    } else {
        inner.plan.status_at(record.started.elapsed())
    };
    let body = match inner.flavor {
        Flavor::Awx => json!({
            "id": job.parse::<u64>().unwrap_or_default(),
            "status": status,
            "extra_vars": record.launch["extra_vars"].to_string(),
            "artifacts": if status == "successful" {
                json!({"vm_ips": ["10.1.0.11", "10.1.0.12"], "seen_token": echo})
            } else {
                json!({})
            },
        }),
        Flavor::Terraform => json!({"data": {
            "id": job,
            "type": "runs",
            "attributes": {
                "status": status,
                "has-changes": true,
                "message": record.launch["data"]["attributes"]["message"],
            },
        }}),
    };
    inner.seen.polls.push(job);
    Json(body).into_response()
}

async fn cancel(State(shared): State<Shared>, Path(job): Path<String>) -> Response {
    let mut inner = lock(&shared);
    match inner.jobs.get_mut(&job) {
        Some(record) => record.cancelled = true,
        None => return StatusCode::NOT_FOUND.into_response(),
    }
    inner.seen.cancels.push(job);
    StatusCode::ACCEPTED.into_response()
}
