//! One attempt of an http step: resume the job an earlier attempt
//! launched, or launch it (saving its id before anything else), poll it
//! until its status is terminal, and read its outputs. A cancelled task
//! or a timeout sends the step's cancel request; an attempt stopped for
//! any other reason (a shutdown, a takeover) leaves the job running for
//! the next attempt.

use std::future::Future;
use std::time::Duration;

use orchestrator_core::backoff::{Backoff, Jitter};
use orchestrator_core::http::{HttpStep, JobState, Method, Poll, Request};
use orchestrator_executor::{Attempt, Outcome};
use serde_json::{Map, Value, json};

use crate::HttpExecutor;
use crate::wire::{Answer, Extras, Prepared, id_text};

/// Checkpoint keys. `launch_key` is saved before the launch is sent, and
/// rides on it as the idempotency key; `job_id` as soon as the launch
/// answered; `launch_error` when an accepted launch gave no usable id (the
/// job may exist, so the step must not launch again).
const LAUNCH_KEY: &str = "launch_key";
const JOB_ID: &str = "job_id";
const LAUNCH_ERROR: &str = "launch_error";

pub(crate) async fn run(http: &HttpExecutor, attempt: Attempt<'_>) -> Outcome {
    let spec = match crate::parse(attempt.input) {
        Ok(spec) => spec,
        Err(refusal) => {
            return failed(format!(
                "the http block is not valid once its references are resolved: http{}: {}",
                refusal.at, refusal.message
            ));
        }
    };
    let (request_timeout, poll_waits) = match (spec.request_timeout(), poll_waits(&spec.poll)) {
        (Ok(timeout), Ok(waits)) => (timeout, waits),
        (Err(e), _) | (_, Err(e)) => return failed(e),
    };
    let job = Job {
        http,
        spec: &spec,
        attempt: &attempt,
        request_timeout,
        poll_waits,
    };
    if attempt.check_mode && !spec.run_in_check_mode {
        return job.dry_run().await;
    }
    let id = match job.launch_or_resume().await {
        Ok(id) => id,
        Err(outcome) => return outcome,
    };
    job.poll(&id).await
}

/// The waits between polls: the block's `interval`, times `backoff` after
/// each poll, up to `max_interval`.
fn poll_waits(poll: &Poll) -> Result<Backoff, String> {
    let (initial, factor, max) = poll.schedule()?;
    Ok(Backoff {
        initial,
        factor,
        max,
        jitter: Jitter::None,
    })
}

fn failed(error: String) -> Outcome {
    Outcome::Failed {
        exit_code: None,
        error,
    }
}

/// Why the attempt must end early.
enum Stop {
    Deadline,
    /// The cancel token fired: the task was cancelled, or only the attempt
    /// stops (see `Attempt::task_cancel`).
    Stopped,
}

struct Job<'a> {
    http: &'a HttpExecutor,
    spec: &'a HttpStep,
    attempt: &'a Attempt<'a>,
    request_timeout: Duration,
    /// The waits between polls: the block's `interval`, times `backoff`
    /// after each poll, up to `max_interval`.
    poll_waits: Backoff,
}

impl Job<'_> {
    /// Writes to the task log; waits while the log is behind.
    async fn log(&self, text: impl Into<String>) {
        let mut text = text.into();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let text = self.attempt.redactor.text(&text);
        self.attempt.log.write(text.into_bytes()).await;
    }

    /// A dry run sends nothing: the other system has no way to be told,
    /// unless the step says it does (`run_in_check_mode`).
    async fn dry_run(&self) -> Outcome {
        self.log(format!(
            "dry run: not sending {} {} (set run_in_check_mode for a target told of the dry run in the request); every output is null",
            self.spec.launch.method_or(Method::Post),
            self.spec.launch.url
        )).await;
        let output: Map<String, Value> = self
            .spec
            .outputs
            .keys()
            .map(|name| (name.clone(), Value::Null))
            .collect();
        Outcome::Succeeded {
            output: Value::Object(output),
        }
    }

    async fn save(&self, entries: Value) -> Result<(), String> {
        let Value::Object(entries) = entries else {
            return Err("a checkpoint is an object".into());
        };
        self.attempt.checkpoints.save(entries).await
    }

    /// The id of the job this run of the step polls: the one an earlier
    /// attempt saved, or a new one, launched now and saved before it is
    /// used. On failure, the attempt's outcome.
    async fn launch_or_resume(&self) -> Result<Value, Outcome> {
        let checkpoint = self.attempt.checkpoint;
        if let Some(id) = checkpoint.get(JOB_ID).filter(|id| !id.is_null()) {
            self.log(format!(
                "job {} was launched by an earlier attempt; polling it",
                id_text(id)
            ))
            .await;
            return Ok(id.clone());
        }
        if let Some(error) = checkpoint.get(LAUNCH_ERROR) {
            return Err(failed(format!(
                "an earlier attempt's launch was accepted, but {}; the job may exist, so the \
                 step does not launch again (retry the workflow to launch anew)",
                id_text(error)
            )));
        }
        let key = match checkpoint.get(LAUNCH_KEY).and_then(Value::as_str) {
            Some(key) => {
                self.log(
                    "an earlier attempt sent the launch but saved no job id; launching again \
                     with the same idempotency key",
                )
                .await;
                key.to_owned()
            }
            None => {
                // The key is durable before the launch leaves, so every
                // launch of this run of the step carries the same one.
                let key = uuid::Uuid::now_v7().to_string();
                self.save(json!({ LAUNCH_KEY: key }))
                    .await
                    .map_err(|e| failed(format!("not launching: {e}")))?;
                key
            }
        };
        if let Some(stop) = self.stop_now() {
            return Err(self.stopped(stop, None).await);
        }
        let launch = &self.spec.launch;
        let extras = Extras {
            method: Method::Post,
            job: None,
            idempotency: self.spec.idempotency_header().map(|h| (h, key.as_str())),
        };
        // Not raced against a stop: a launch in flight is awaited (for at
        // most the request timeout), so that its job id is known and saved
        // even when the attempt is stopped meanwhile.
        let answer = self
            .exchange("launch", launch, &extras, true)
            .await
            .map_err(failed)?;
        if !launch.accepts(answer.status.as_u16()) {
            return Err(failed(answer.unexpected("the launch", launch)));
        }
        let id = match answer
            .json(&self.attempt.redactor)
            .and_then(|body| self.job_id_in(&body))
        {
            Ok(id) => id,
            Err(why) => {
                let why = format!("its answer ({}) gave no job id: {why}", answer.status);
                if let Err(e) = self.save(json!({ LAUNCH_ERROR: why })).await {
                    self.log(format!("could not record the failed launch: {e}"))
                        .await;
                }
                return Err(failed(format!("the launch was accepted, but {why}")));
            }
        };
        self.save(json!({ JOB_ID: id })).await.map_err(|e| {
            failed(format!(
                "launched job {}, but {e}; the next attempt launches again with the same \
                 idempotency key",
                id_text(&id)
            ))
        })?;
        self.log(format!(
            "job {} launched; its id is saved as the task's checkpoint",
            id_text(&id)
        ))
        .await;
        if let Some(stop) = self.stop_now() {
            return Err(self.stopped(stop, Some(&id)).await);
        }
        Ok(id)
    }

    fn job_id_in(&self, body: &Value) -> Result<Value, String> {
        let pointer = &self.spec.job_id;
        match body.pointer(pointer) {
            Some(id @ (Value::String(_) | Value::Number(_))) if id != "" => Ok(id.clone()),
            Some(other) => Err(format!("`{pointer}` holds {other}, not a string or number")),
            None => Err(format!("it has nothing at `{pointer}`")),
        }
    }

    /// Polls the job until its status is terminal.
    async fn poll(&self, id: &Value) -> Outcome {
        let poll = &self.spec.poll;
        let request = poll.request();
        let extras = Extras {
            method: Method::Get,
            job: Some(id),
            idempotency: None,
        };
        // Polls that found the job still running.
        let mut polled = 0;
        let mut last_status: Option<String> = None;
        let job = format!("job {}", id_text(id));
        loop {
            let answer = match self
                .race(self.exchange("poll", &request, &extras, false))
                .await
            {
                Err(stop) => return self.stopped(stop, Some(id)).await,
                Ok(Err(e)) => return failed(e),
                Ok(Ok(answer)) => answer,
            };
            if !request.accepts(answer.status.as_u16()) {
                self.log(answer.body_line(&self.attempt.redactor)).await;
                return failed(answer.unexpected(&format!("polling {job}"), &request));
            }
            let body = match answer.json(&self.attempt.redactor) {
                Ok(body) => body,
                Err(why) => {
                    return failed(format!(
                        "polling {job} answered {}, but {why}",
                        answer.status
                    ));
                }
            };
            let status = match body.pointer(&poll.status) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => {
                    self.log(answer.body_line(&self.attempt.redactor)).await;
                    return failed(format!(
                        "polling {job}: the answer has no status at `{}`",
                        poll.status
                    ));
                }
                Some(other) => other.to_string(),
            };
            // The body only when the status changes: a long job polled
            // every few seconds would otherwise fill its log with copies.
            if last_status.as_deref() != Some(status.as_str()) {
                self.log(answer.body_line(&self.attempt.redactor)).await;
            }
            self.log(format!("  {job} is `{status}`")).await;
            match poll.status_map.classify(&status) {
                Some(JobState::Succeeded) => return self.finish(&body, &job, &status).await,
                Some(JobState::Failed) => return failed(format!("{job} ended `{status}`")),
                Some(JobState::Running) => {}
                None => {
                    let map = &poll.status_map;
                    return failed(format!(
                        "{job} has the status `{status}`, which the status map does not list \
                         (success: {}; running: {}; failure: {})",
                        map.success.join(", "),
                        map.running.join(", "),
                        map.failure.join(", ")
                    ));
                }
            }
            last_status = Some(status);
            let wait = self.poll_waits.delay(polled, 0.0);
            if let Err(stop) = self.race(tokio::time::sleep(wait)).await {
                return self.stopped(stop, Some(id)).await;
            }
            polled += 1;
        }
    }

    /// The step's output, read from the final poll's answer.
    async fn finish(&self, body: &Value, job: &str, status: &str) -> Outcome {
        let mut output = Map::new();
        for (name, pointer) in &self.spec.outputs {
            match body.pointer(pointer) {
                Some(value) => {
                    output.insert(name.clone(), value.clone());
                }
                None => {
                    return failed(format!(
                        "{job} ended `{status}`, but output `{name}` is missing: the answer has \
                         nothing at `{pointer}`"
                    ));
                }
            }
        }
        self.log(format!("{job} ended `{status}`")).await;
        Outcome::Succeeded {
            output: Value::Object(output),
        }
    }

    /// Sends one request, writing it and its answer's status to the log.
    async fn exchange(
        &self,
        what: &str,
        request: &Request,
        extras: &Extras<'_>,
        log_body: bool,
    ) -> Result<Answer, String> {
        let prepared: Prepared = self
            .http
            .prepare(&self.spec.headers, request, extras, &self.attempt.redactor)
            .map_err(|e| format!("the {what} request: {e}"))?;
        self.log(prepared.describe(&self.attempt.redactor)).await;
        let answer = self
            .http
            .send(&prepared, self.spec.follow_redirects, self.request_timeout)
            .await
            .map_err(|e| {
                let redactor = &self.attempt.redactor;
                redactor.text(&format!(
                    "{what}: {} {}: {e}",
                    prepared.method,
                    prepared.shown_url(redactor)
                ))
            })?;
        self.log(format!("< {}", answer.status_line())).await;
        if log_body {
            self.log(answer.body_line(&self.attempt.redactor)).await;
        }
        Ok(answer)
    }

    /// Runs `work` unless the attempt is stopped or times out first.
    async fn race<F: Future>(&self, work: F) -> Result<F::Output, Stop> {
        tokio::select! {
            biased;
            () = self.attempt.cancel.cancelled() => Err(Stop::Stopped),
            () = tokio::time::sleep_until(self.attempt.deadline) => Err(Stop::Deadline),
            out = work => Ok(out),
        }
    }

    fn stop_now(&self) -> Option<Stop> {
        if self.attempt.cancel.is_cancelled() {
            Some(Stop::Stopped)
        } else if tokio::time::Instant::now() >= self.attempt.deadline {
            Some(Stop::Deadline)
        } else {
            None
        }
    }

    /// How the attempt ends when it is stopped: the job is cancelled on
    /// the other system if the task was cancelled or timed out, and left
    /// running when only the attempt stops.
    async fn stopped(&self, stop: Stop, job: Option<&Value>) -> Outcome {
        let cancelled = self.attempt.task_cancel.is_cancelled();
        match stop {
            Stop::Stopped if !cancelled => {
                if let Some(id) = job {
                    self.log(format!(
                        "the attempt was stopped (the service is shutting down, or another node \
                         took the task over); job {} keeps running, and the next attempt polls it",
                        id_text(id)
                    ))
                    .await;
                }
                Outcome::Cancelled
            }
            Stop::Stopped => {
                let note = self.cancel_job(job, "the task was cancelled").await;
                self.log(note).await;
                Outcome::Cancelled
            }
            Stop::Deadline => {
                let timeout = self.attempt.timeout.as_secs_f64();
                let note = self
                    .cancel_job(job, &format!("timed out after {timeout}s"))
                    .await;
                Outcome::TimedOut { error: note }
            }
        }
    }

    /// Sends the cancel request for the job, if there is one to cancel and
    /// a request to cancel it with; says what happened.
    async fn cancel_job(&self, job: Option<&Value>, why: &str) -> String {
        let Some(id) = job else {
            return format!("{why} before the job was launched");
        };
        let job = format!("job {}", id_text(id));
        let Some(cancel) = &self.spec.cancel else {
            return format!("{why}; {job} was left running (the step has no cancel request)");
        };
        let extras = Extras {
            method: Method::Post,
            job: Some(id),
            idempotency: None,
        };
        // Not raced: the stop already happened, and the request has its
        // own timeout.
        match self.exchange("cancel", cancel, &extras, true).await {
            Ok(answer) if cancel.accepts(answer.status.as_u16()) => {
                format!("{why}; {job} was cancelled ({})", answer.status)
            }
            Ok(answer) => format!(
                "{why}; {}",
                answer.unexpected(&format!("cancelling {job}"), cancel)
            ),
            Err(e) => format!("{why}; cancelling {job} failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(timing: Value, expected_ms: &[u64]) {
        let mut block = json!({
            "url": "https://jobs.example.com/${job.id}",
            "status": "/status",
            "status_map": {"success": ["done"], "running": ["running"], "failure": ["failed"]}
        });
        block
            .as_object_mut()
            .unwrap()
            .extend(timing.as_object().unwrap().clone());
        let poll: Poll = serde_json::from_value(block).unwrap();
        let waits = poll_waits(&poll).unwrap();
        let got: Vec<u128> = (0..expected_ms.len() as u32)
            .map(|n| waits.delay(n, 0.5).as_millis())
            .collect();
        let expected: Vec<u128> = expected_ms.iter().map(|&ms| u128::from(ms)).collect();
        assert_eq!(got, expected, "{timing}");
    }

    /// docs/templates.md: the first wait is `interval`, each next one the
    /// one before times `backoff`, at most `max_interval`.
    #[test]
    fn polls_wait_as_the_block_says() {
        check(
            json!({"interval": "500ms", "backoff": 2, "max_interval": "3s"}),
            &[500, 1000, 2000, 3000, 3000],
        );
        check(
            json!({"interval": "1s", "backoff": 1.5, "max_interval": "4s"}),
            &[1000, 1500, 2250, 3375, 4000],
        );
        check(
            json!({"interval": "2s", "max_interval": "10s"}),
            &[2000, 2000, 2000],
        );
    }
}
