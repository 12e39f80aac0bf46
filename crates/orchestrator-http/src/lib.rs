//! The `http` step kind: a job launched on another system over HTTP (an
//! AWX job template, a Terraform Cloud run, a workflow on another
//! orchestrator), then polled until its status is terminal. The step's
//! `http` block (`orchestrator_core::http::HttpStep`) is the task's input,
//! so it arrives here with its references resolved and its secrets put in.
//!
//! The launch happens at most once per run of the step: its job id is
//! saved as the task's checkpoint, durably, before the first poll, and an
//! attempt that finds one polls that job instead of launching. Requests
//! go only to hosts of the [`Allowlist`]; every request and answer is
//! written to the task log (header names only, bodies cut short), and the
//! engine redacts secret values from it.

mod allowlist;
mod job;
mod webhook;
mod wire;

use std::sync::Arc;

use async_trait::async_trait;
use orchestrator_core::http::HttpStep;
use orchestrator_executor::{Attempt, InputRefusal, Outcome, StepRunner};
use reqwest::redirect::Policy;
use serde_json::Value;

pub use allowlist::{Allowlist, HTTPS, literal_origin};
pub use webhook::WebhookClient;

/// The largest request body a step may send.
pub const MAX_REQUEST_BODY: usize = 1 << 20;
/// The largest response body a step reads; a longer one fails the attempt.
pub const MAX_RESPONSE_BODY: usize = 4 << 20;
/// How much of a body the task log shows.
pub const LOGGED_BODY: usize = 2048;
/// Redirects followed at most, when a step follows them at all.
const MAX_REDIRECTS: usize = 10;

/// Runs `http` steps. Cheap to clone: the allowlist and two connection
/// pools, shared.
#[derive(Debug, Clone)]
pub struct HttpExecutor {
    allow: Arc<Allowlist>,
    /// Follows no redirect: a 3xx is an answer like any other.
    direct: reqwest::Client,
    /// Follows redirects, each hop checked against the allowlist.
    following: reqwest::Client,
}

impl HttpExecutor {
    /// Fails only if the HTTP client cannot be built (no TLS backend).
    pub fn new(allow: Allowlist) -> Result<HttpExecutor, String> {
        let allow = Arc::new(allow);
        let hops = allow.clone();
        // No proxy from the environment: the allowlist names the hosts a
        // step reaches, and a proxy would be one more party to trust.
        let client = |policy: Policy| {
            reqwest::Client::builder()
                .no_proxy()
                .user_agent(concat!("orchestrator/", env!("CARGO_PKG_VERSION")))
                .redirect(policy)
                .build()
                .map_err(|e| format!("cannot build the HTTP client: {e}"))
        };
        Ok(HttpExecutor {
            direct: client(Policy::none())?,
            following: client(Policy::custom(move |attempt| {
                if attempt.previous().len() >= MAX_REDIRECTS {
                    attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
                } else if let Err(why) = hops.check(attempt.url()) {
                    attempt.error(format!("redirect refused: {why}"))
                } else {
                    attempt.follow()
                }
            }))?,
            allow,
        })
    }

    pub fn allowlist(&self) -> &Allowlist {
        &self.allow
    }
}

/// The block, read back from a task's input; the error names the field.
fn parse(input: &Value) -> Result<HttpStep, InputRefusal> {
    serde_path_to_error::deserialize(input).map_err(|e| {
        let path = e.path().to_string();
        InputRefusal {
            at: if path == "." {
                String::new()
            } else {
                format!(".{path}")
            },
            message: e.inner().to_string(),
        }
    })
}

#[async_trait]
impl StepRunner for HttpExecutor {
    fn name(&self) -> &'static str {
        "http"
    }

    /// A step's requests are its template's `http` block.
    fn input_field(&self) -> &'static str {
        "http"
    }

    /// An http step has no target of its own: what it reaches is in its
    /// input, checked by `check_input`.
    fn check(&self, _target: &str) -> Result<(), String> {
        Ok(())
    }

    /// Every URL whose host is written out (in the template, or put in by
    /// the submission's inputs) must be allowed; a host that comes from a
    /// step's output or a secret is checked when the request is sent.
    fn check_input(&self, input: &Value) -> Result<(), InputRefusal> {
        let step = parse(input)?;
        let poll = step.poll.request();
        let requests = [
            (".launch.url", Some(&step.launch)),
            (".poll.url", Some(&poll)),
            (".cancel.url", step.cancel.as_ref()),
        ];
        for (at, request) in requests {
            let Some(origin) = request.and_then(|r| literal_origin(&r.url)) else {
                continue;
            };
            origin
                .and_then(|url| self.allow.check(&url))
                .map_err(|message| InputRefusal {
                    at: at.to_owned(),
                    message,
                })?;
        }
        Ok(())
    }

    async fn run(&self, attempt: Attempt<'_>) -> Outcome {
        job::run(self, attempt).await
    }

    /// Nothing of an http step runs here between attempts: its job runs
    /// on the other system, and the next attempt resumes it.
    fn stop_leftovers(&self, _task_id: &str) -> usize {
        0
    }
}
