//! The `http` step kind as data: what a template's `http:` block says
//! (launch a job on another system, find its id, poll it until its status
//! is terminal, read outputs, cancel it), and every check that needs no
//! network. The block becomes the task's input, so its `${...}`
//! references resolve like a script's input; the `orchestrator-http`
//! runner reads it back, resolved, and sends the requests.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{TemplateError, parse_timeout};

/// The launch header that carries the step's idempotency key, unless the
/// block names another (`idempotency_header`).
pub const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// How long one request may take unless the block says (`request_timeout`).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The first wait between polls unless the block says (`poll.interval`).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// The longest wait between polls unless the block says (`poll.max_interval`).
pub const DEFAULT_MAX_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// Polling faster than this only loads the other system.
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// An `http` step: `http:` in a template step of `kind: http`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpStep {
    /// Sent with every request (launch, poll, cancel); a request's own
    /// header of the same name wins. The usual place for
    /// `Authorization: Bearer ${secrets.x}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The request that starts the job. Sent at most once per run of the
    /// step: its job id is saved as the task's checkpoint before polling.
    pub launch: Request,
    /// JSON pointer to the job's id in the launch response (`/id`,
    /// `/data/id`); `${job.id}` in `poll` and `cancel` is that value.
    pub job_id: String,
    pub poll: Poll,
    /// The step's output: name → JSON pointer into the final poll response.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub outputs: BTreeMap<String, String>,
    /// Sent when the task is cancelled or times out, once the job id is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel: Option<Request>,
    /// Redirects are refused unless this is set; followed ones are checked
    /// against the allowlist at every hop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub follow_redirects: bool,
    /// The limit of one request: seconds, or `"30s"`, `"2m"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout: Option<Value>,
    /// The header that carries the launch's idempotency key
    /// ([`IDEMPOTENCY_HEADER`] by default); `""` sends none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_header: Option<String>,
    /// In a dry run the step sends nothing, unless this is set: for
    /// targets told of the dry run in the request itself (another
    /// orchestrator's `check_mode`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run_in_check_mode: bool,
}

/// The methods a step may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    #[serde(alias = "get")]
    Get,
    #[serde(alias = "post")]
    Post,
    #[serde(alias = "put")]
    Put,
    #[serde(alias = "patch")]
    Patch,
    #[serde(alias = "delete")]
    Delete,
}

crate::named_variants!(Method, "method", [
    Get => "GET",
    Post => "POST",
    Put => "PUT",
    Patch => "PATCH",
    Delete => "DELETE",
]);

/// One request (the launch, the cancel).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// `POST` unless given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    pub url: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Sent as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// The status codes that count as accepted; any 2xx when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect: Vec<u16>,
}

/// How the job is watched: a request (its fields as in [`Request`],
/// repeated because serde cannot flatten them into a struct that refuses
/// unknown fields, and a misspelt field must be refused), and what its
/// answers mean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Poll {
    /// `GET` unless given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    /// Usually holds `${job.id}`.
    pub url: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect: Vec<u16>,
    /// The first wait between polls: `"500ms"`, `"5s"`, `"1m"` or seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Value>,
    /// Each wait is the previous one times this (at least 1, the default:
    /// no backoff), up to `max_interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<Value>,
    /// JSON pointer to the job's status in a poll response.
    pub status: String,
    pub status_map: StatusMap,
}

/// What each status of the other system means. Matching ignores case; a
/// status in no list fails the step, naming it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusMap {
    pub success: Vec<String>,
    #[serde(default)]
    pub running: Vec<String>,
    #[serde(default)]
    pub failure: Vec<String>,
}

/// Where a job is, by its status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    Running,
    Succeeded,
    Failed,
}

impl StatusMap {
    /// The state a status means; `None` for a status in no list.
    pub fn classify(&self, status: &str) -> Option<JobState> {
        let listed = |list: &[String]| list.iter().any(|s| s.eq_ignore_ascii_case(status));
        if listed(&self.success) {
            Some(JobState::Succeeded)
        } else if listed(&self.failure) {
            Some(JobState::Failed)
        } else if listed(&self.running) {
            Some(JobState::Running)
        } else {
            None
        }
    }
}

impl Request {
    pub fn method_or(&self, default: Method) -> Method {
        self.method.unwrap_or(default)
    }

    /// Whether a response status counts as accepted.
    pub fn accepts(&self, status: u16) -> bool {
        accepts(&self.expect, status)
    }
}

impl Poll {
    /// The poll as one request (a `GET` unless it says).
    pub fn request(&self) -> Request {
        Request {
            method: Some(self.method.unwrap_or(Method::Get)),
            url: self.url.clone(),
            headers: self.headers.clone(),
            body: self.body.clone(),
            expect: self.expect.clone(),
        }
    }

    /// The waits between polls: the first, the backoff factor, the longest.
    pub fn schedule(&self) -> Result<(Duration, f64, Duration), String> {
        let first = match &self.interval {
            Some(v) => parse_interval(v)?,
            None => DEFAULT_POLL_INTERVAL,
        };
        let longest = match &self.max_interval {
            Some(v) => parse_interval(v)?,
            None => DEFAULT_MAX_POLL_INTERVAL.max(first),
        };
        Ok((first, self.backoff.unwrap_or(1.0), longest))
    }
}

fn accepts(expect: &[u16], status: u16) -> bool {
    if expect.is_empty() {
        (200..300).contains(&status)
    } else {
        expect.contains(&status)
    }
}

impl HttpStep {
    /// The limit of one request.
    pub fn request_timeout(&self) -> Result<Duration, String> {
        self.request_timeout
            .as_ref()
            .map_or(Ok(DEFAULT_REQUEST_TIMEOUT), parse_timeout)
    }

    /// The launch's idempotency-key header, if one is sent.
    pub fn idempotency_header(&self) -> Option<&str> {
        match self.idempotency_header.as_deref() {
            None => Some(IDEMPOTENCY_HEADER),
            Some("") => None,
            Some(name) => Some(name),
        }
    }

    /// Every check that needs neither the network nor the submission's
    /// values; `at` is the block's path (`steps.awx.http`). References are
    /// checked with the template's others.
    pub fn validate(&self, at: &str) -> Result<(), TemplateError> {
        let err = |field: String, message: String| TemplateError { field, message };
        check_headers(&format!("{at}.headers"), &self.headers)?;
        check_request(&format!("{at}.launch"), &self.launch)?;
        check_pointer(&format!("{at}.job_id"), &self.job_id)?;
        let poll = format!("{at}.poll");
        check_request(&poll, &self.poll.request())?;
        check_pointer(&format!("{poll}.status"), &self.poll.status)?;
        let (first, backoff, longest) = self
            .poll
            .schedule()
            .map_err(|m| err(format!("{poll}.interval"), m))?;
        if let Some(v) = &self.poll.max_interval {
            parse_interval(v).map_err(|m| err(format!("{poll}.max_interval"), m))?;
        }
        if !(1.0..=10.0).contains(&backoff) {
            return Err(err(
                format!("{poll}.backoff"),
                format!("{backoff} must be between 1 (no backoff) and 10"),
            ));
        }
        if longest < first {
            return Err(err(
                format!("{poll}.max_interval"),
                "must not be shorter than the interval".into(),
            ));
        }
        check_status_map(&format!("{poll}.status_map"), &self.poll.status_map)?;
        for (name, pointer) in &self.outputs {
            if !super::valid_name(name) {
                return Err(err(
                    format!("{at}.outputs.{name}"),
                    "is not a valid output name (letters, digits, `_` or `-`)".into(),
                ));
            }
            check_pointer(&format!("{at}.outputs.{name}"), pointer)?;
        }
        if let Some(cancel) = &self.cancel {
            check_request(&format!("{at}.cancel"), cancel)?;
        }
        self.request_timeout()
            .map_err(|m| err(format!("{at}.request_timeout"), m))?;
        if let Some(name) = self.idempotency_header.as_deref().filter(|n| !n.is_empty()) {
            check_header_name(&format!("{at}.idempotency_header"), name)?;
        }
        Ok(())
    }
}

/// A wait: whole seconds, or `"<n>ms"`, `"<n>s"`, `"<n>m"`, `"<n>h"`; at
/// least 100 ms, at most [`super::MAX_DURATION`].
pub fn parse_interval(value: &Value) -> Result<Duration, String> {
    let duration = match value.as_str().map(str::trim) {
        Some(text) if text.ends_with("ms") => {
            let millis: u64 = text[..text.len() - 2]
                .parse()
                .map_err(|_| format!("`{text}` is not a duration like \"500ms\" or \"5s\""))?;
            Duration::from_millis(millis)
        }
        _ => parse_timeout(value)?,
    };
    if duration < MIN_POLL_INTERVAL {
        return Err(format!(
            "must be at least {} ms",
            MIN_POLL_INTERVAL.as_millis()
        ));
    }
    // A wait is added to the clock: as bounded as a timeout.
    if duration > super::MAX_DURATION {
        return Err(format!(
            "{value} is longer than the maximum of {} seconds (30 days)",
            super::MAX_DURATION.as_secs()
        ));
    }
    Ok(duration)
}

/// Where a reference may stand in an `http` block (`at` is its path
/// inside the step, such as `.http.poll.url`): `${...}` belongs in
/// requests' urls, headers and bodies, and `${job.id}` only in the poll
/// and the cancel, which are sent once the job exists.
pub(crate) fn reference_allowed(path: &str, job: bool) -> Result<(), String> {
    let in_request = |request: &str| {
        ["url", "headers", "body"]
            .iter()
            .any(|field| path.starts_with(&format!(".http.{request}{field}")))
    };
    let in_poll_or_cancel = in_request("poll.") || in_request("cancel.");
    if job && !in_poll_or_cancel {
        return Err("can only be used in an http step's poll and cancel requests (the job does not exist before the launch answers)".into());
    }
    if !(in_poll_or_cancel || in_request("launch.") || in_request("")) {
        return Err("references can only be used in a request's url, headers and body".into());
    }
    Ok(())
}

fn check_request(at: &str, request: &Request) -> Result<(), TemplateError> {
    let err = |field: String, message: String| TemplateError { field, message };
    let url = request.url.trim();
    if url.is_empty() {
        return Err(err(format!("{at}.url"), "must not be empty".into()));
    }
    // A URL may start with a reference (`${workflow.input.awx_url}/api/...`):
    // its scheme is then checked when it is known, at submission or run time.
    let literal = url
        .split("${")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if !literal.is_empty() && !literal.starts_with("http://") && !literal.starts_with("https://") {
        return Err(err(
            format!("{at}.url"),
            format!("`{url}` must start with http:// or https://"),
        ));
    }
    check_headers(&format!("{at}.headers"), &request.headers)?;
    if let Some(bad) = request.expect.iter().find(|c| !(100..=599).contains(*c)) {
        return Err(err(
            format!("{at}.expect"),
            format!("{bad} is not an HTTP status code"),
        ));
    }
    Ok(())
}

fn check_headers(at: &str, headers: &BTreeMap<String, String>) -> Result<(), TemplateError> {
    for (name, value) in headers {
        check_header_name(&format!("{at}.{name}"), name)?;
        if value.contains(['\r', '\n']) {
            return Err(TemplateError {
                field: format!("{at}.{name}"),
                message: "a header value must not contain a line break".into(),
            });
        }
    }
    Ok(())
}

fn check_header_name(at: &str, name: &str) -> Result<(), TemplateError> {
    // RFC 9110 token characters.
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if token {
        Ok(())
    } else {
        Err(TemplateError {
            field: at.to_owned(),
            message: format!("`{name}` is not a valid header name"),
        })
    }
}

fn check_pointer(at: &str, pointer: &str) -> Result<(), TemplateError> {
    if pointer.is_empty() || pointer.starts_with('/') {
        Ok(())
    } else {
        Err(TemplateError {
            field: at.to_owned(),
            message: format!("`{pointer}` is not a JSON pointer (like /id or /data/id)"),
        })
    }
}

fn check_status_map(at: &str, map: &StatusMap) -> Result<(), TemplateError> {
    let err = |field: String, message: String| TemplateError { field, message };
    if map.success.is_empty() {
        return Err(err(
            format!("{at}.success"),
            "must list at least one status".into(),
        ));
    }
    let mut seen: BTreeMap<String, &str> = BTreeMap::new();
    for (list, statuses) in [
        ("success", &map.success),
        ("running", &map.running),
        ("failure", &map.failure),
    ] {
        for status in statuses {
            if status.trim().is_empty() {
                return Err(err(
                    format!("{at}.{list}"),
                    "a status must not be empty".into(),
                ));
            }
            if let Some(other) = seen.insert(status.to_ascii_lowercase(), list) {
                return Err(err(
                    format!("{at}.{list}"),
                    format!("`{status}` is also listed under {other}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn step(block: Value) -> HttpStep {
        serde_json::from_value(block).unwrap()
    }

    fn awx() -> Value {
        json!({
            "launch": {"url": "https://awx.example.com/api/v2/job_templates/7/launch/", "body": {"extra_vars": {"a": 1}}},
            "job_id": "/job",
            "poll": {
                "url": "https://awx.example.com/api/v2/jobs/${job.id}/",
                "interval": "500ms", "backoff": 2, "max_interval": "10s",
                "status": "/status",
                "status_map": {"success": ["successful"], "running": ["pending", "running"], "failure": ["failed"]}
            },
            "outputs": {"artifacts": "/artifacts"}
        })
    }

    #[test]
    fn statuses_are_matched_ignoring_case() {
        let step = step(awx());
        let map = &step.poll.status_map;
        assert_eq!(map.classify("Successful"), Some(JobState::Succeeded));
        assert_eq!(map.classify("RUNNING"), Some(JobState::Running));
        assert_eq!(map.classify("failed"), Some(JobState::Failed));
        assert_eq!(map.classify("teleporting"), None);
    }

    #[test]
    fn defaults_fill_what_the_block_leaves_out() {
        let mut block = awx();
        block["poll"].as_object_mut().unwrap().remove("interval");
        block["poll"]
            .as_object_mut()
            .unwrap()
            .remove("max_interval");
        block["poll"].as_object_mut().unwrap().remove("backoff");
        let step = step(block);
        assert_eq!(
            step.poll.schedule().unwrap(),
            (DEFAULT_POLL_INTERVAL, 1.0, DEFAULT_MAX_POLL_INTERVAL)
        );
        assert_eq!(step.request_timeout().unwrap(), DEFAULT_REQUEST_TIMEOUT);
        assert_eq!(step.idempotency_header(), Some(IDEMPOTENCY_HEADER));
        assert_eq!(step.launch.method_or(Method::Post), Method::Post);
        assert_eq!(step.poll.request().method, Some(Method::Get));
        assert!(step.launch.accepts(201) && !step.launch.accepts(302));
    }

    #[test]
    fn every_problem_names_its_field() {
        let cases: [(&str, Value, &str); 10] = [
            ("/launch/url", json!("ftp://x/"), "at.launch.url"),
            ("/launch/url", json!(" "), "at.launch.url"),
            ("/job_id", json!("id"), "at.job_id"),
            ("/poll/status", json!("status"), "at.poll.status"),
            ("/poll/interval", json!("10ms"), "at.poll.interval"),
            ("/poll/backoff", json!(0.5), "at.poll.backoff"),
            ("/poll/max_interval", json!("100ms"), "at.poll.max_interval"),
            (
                "/poll/status_map/failure",
                json!(["SUCCESSFUL"]),
                "at.poll.status_map.failure",
            ),
            ("/launch/expect", json!([42]), "at.launch.expect"),
            ("/headers", json!({"Bad Name": "x"}), "at.headers.Bad Name"),
        ];
        for (pointer, value, field) in cases {
            let mut block = awx();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            block.pointer_mut(parent).unwrap()[key] = value;
            let error = step(block).validate("at").unwrap_err();
            assert_eq!(error.field, field, "{pointer}: {error}");
        }
        let mut block = awx();
        block["outputs"] = json!({"ok": "no-slash"});
        assert_eq!(
            step(block).validate("at").unwrap_err().field,
            "at.outputs.ok"
        );
        assert!(step(awx()).validate("at").is_ok());
    }

    #[test]
    fn references_belong_in_urls_headers_and_bodies() {
        assert!(reference_allowed(".http.launch.url", false).is_ok());
        assert!(reference_allowed(".http.headers.Authorization", false).is_ok());
        assert!(reference_allowed(".http.launch.body.extra_vars", false).is_ok());
        assert!(reference_allowed(".http.poll.url", true).is_ok());
        assert!(reference_allowed(".http.cancel.body.id", true).is_ok());
        assert!(reference_allowed(".http.launch.url", true).is_err());
        assert!(reference_allowed(".http.headers.X", true).is_err());
        assert!(reference_allowed(".http.job_id", false).is_err());
        assert!(reference_allowed(".http.poll.status", false).is_err());
        assert!(reference_allowed(".http.poll.status_map.success[0]", false).is_err());
    }
}
