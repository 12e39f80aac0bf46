//! One request on the wire: built from the step's block (with the job id
//! put in), checked against the allowlist, sent, and its answer read up
//! to the size cap. What is logged of it is decided here too: the method
//! and URL, header names (never values: they carry tokens), and bodies cut
//! short.

use std::collections::BTreeMap;
use std::time::Duration;

use orchestrator_core::http::{Method, Request};
use orchestrator_executor::Redactor;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{StatusCode, Url};
use serde_json::Value;

use crate::{HttpExecutor, LOGGED_BODY, MAX_REQUEST_BODY, MAX_RESPONSE_BODY};

/// A request ready to send.
pub(crate) struct Prepared {
    pub(crate) method: reqwest::Method,
    pub(crate) url: Url,
    headers: HeaderMap,
    body: Option<Vec<u8>>,
    /// Whether a secret's value is in it: such a request follows no
    /// redirect, which could carry the secret to another origin.
    carries_secret: bool,
}

/// What came back.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Vec<u8>,
    /// Where a redirect pointed, for the message that refuses it.
    location: Option<String>,
}

/// What the request is for, and what it adds to the block's request.
pub(crate) struct Extras<'a> {
    /// The method when the block gives none.
    pub(crate) method: Method,
    /// Put in for `${job.id}` (poll and cancel).
    pub(crate) job: Option<&'a Value>,
    /// `(header, key)` of the launch.
    pub(crate) idempotency: Option<(&'a str, &'a str)>,
}

const JOB_ID: &str = "${job.id}";

/// The job id as text: a string as it is, a number in JSON.
pub(crate) fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl HttpExecutor {
    /// Builds a request: common headers under the request's own, the job
    /// id put in, JSON body encoded, the URL allowed, and every secret in
    /// it bound for an origin of the secret's scope. Checked here, with
    /// every reference resolved: a host built from a secret is refused
    /// before anything is sent, and the message does not show it.
    pub(crate) fn prepare(
        &self,
        common: &BTreeMap<String, String>,
        request: &Request,
        extras: &Extras<'_>,
        redactor: &Redactor,
    ) -> Result<Prepared, String> {
        let text = |s: &str, encode: bool| match extras.job {
            Some(id) if s.contains(JOB_ID) => {
                let id = id_text(id);
                s.replace(JOB_ID, &if encode { percent_encode(&id) } else { id })
            }
            _ => s.to_owned(),
        };
        let url = text(&request.url, true);
        let url = Url::parse(&url)
            .map_err(|e| redactor.text(&format!("`{url}` is not a valid URL: {e}")))?;
        let mut headers = HeaderMap::new();
        for (name, value) in common.iter().chain(&request.headers) {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid header name"))?;
            // The value is never shown: it may hold a secret.
            let mut value = HeaderValue::from_str(&text(value, false)).map_err(|_| {
                format!("header `{name}` has a value that is not valid in a header")
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        if let Some((name, key)) = extras.idempotency {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid header name"))?;
            headers.insert(name, HeaderValue::from_str(key).map_err(|e| e.to_string())?);
        }
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        }
        let body = match &request.body {
            None => None,
            Some(body) => {
                let body = match extras.job {
                    Some(id) => with_job_id(body, id),
                    None => body.clone(),
                };
                let bytes = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
                if bytes.len() > MAX_REQUEST_BODY {
                    return Err(format!(
                        "the request body is {} bytes, more than the limit of {MAX_REQUEST_BODY}",
                        bytes.len()
                    ));
                }
                if !headers.contains_key(CONTENT_TYPE) {
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                }
                Some(bytes)
            }
        };
        let decoded_url: Vec<u8> = percent_encoding::percent_decode_str(url.as_str()).collect();
        let mut parts: Vec<&[u8]> = vec![url.as_str().as_bytes(), &decoded_url];
        parts.extend(headers.values().map(HeaderValue::as_bytes));
        parts.extend(body.as_deref());
        if let Some(refusal) = redactor.refuse_origin(&url.origin().ascii_serialization(), &parts) {
            return Err(refusal);
        }
        let carries_secret = parts
            .iter()
            .any(|part| !redactor.secrets_in(part).is_empty());
        self.allow.check(&url).map_err(|e| redactor.text(&e))?;
        Ok(Prepared {
            carries_secret,
            method: match request.method_or(extras.method) {
                Method::Get => reqwest::Method::GET,
                Method::Post => reqwest::Method::POST,
                Method::Put => reqwest::Method::PUT,
                Method::Patch => reqwest::Method::PATCH,
                Method::Delete => reqwest::Method::DELETE,
            },
            url,
            headers,
            body,
        })
    }

    /// Sends a prepared request and reads the answer, within `timeout`.
    pub(crate) async fn send(
        &self,
        request: &Prepared,
        follow_redirects: bool,
        timeout: Duration,
    ) -> Result<Answer, String> {
        let client = if follow_redirects && !request.carries_secret {
            &self.following
        } else {
            &self.direct
        };
        let mut builder = client
            .request(request.method.clone(), request.url.clone())
            .headers(request.headers.clone())
            .timeout(timeout);
        if let Some(body) = &request.body {
            builder = builder.body(body.clone());
        }
        let mut response = builder.send().await.map_err(|e| describe(&e, timeout))?;
        let status = response.status();
        let location = response
            .headers()
            .get(LOCATION)
            .and_then(|l| l.to_str().ok())
            .map(str::to_owned);
        if response
            .content_length()
            .is_some_and(|n| n > MAX_RESPONSE_BODY as u64)
        {
            return Err(too_large(status));
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e, timeout))? {
            if body.len() + chunk.len() > MAX_RESPONSE_BODY {
                return Err(too_large(status));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            body,
            location,
        })
    }
}

impl Prepared {
    /// The URL as messages show it: percent-decoded, so that a secret in
    /// it is found whatever the URL parser chose to encode, then redacted.
    pub(crate) fn shown_url(&self, redactor: &Redactor) -> String {
        let decoded = percent_encoding::percent_decode_str(self.url.as_str()).decode_utf8_lossy();
        redactor.text(&decoded)
    }

    /// The log lines of the request: method and URL, header names, body;
    /// redacted before the body is cut.
    pub(crate) fn describe(&self, redactor: &Redactor) -> String {
        let mut names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        let mut text = format!(
            "> {} {}\n  headers: {}\n",
            self.method,
            self.shown_url(redactor),
            names.join(", ")
        );
        if let Some(body) = &self.body {
            text.push_str(&format!(
                "  body: {}\n",
                excerpt(redactor, body, LOGGED_BODY)
            ));
        }
        redactor.text(&text)
    }
}

impl Answer {
    /// The status line, e.g. `201 Created`.
    pub(crate) fn status_line(&self) -> String {
        self.status.to_string()
    }

    /// The log line of the body, cut short.
    pub(crate) fn body_line(&self, redactor: &Redactor) -> String {
        format!("  body: {}\n", excerpt(redactor, &self.body, LOGGED_BODY))
    }

    /// The body as JSON; the reason, if it is not.
    pub(crate) fn json(&self, redactor: &Redactor) -> Result<Value, String> {
        serde_json::from_slice(&self.body).map_err(|e| {
            format!(
                "its body is not JSON ({e}): {}",
                excerpt(redactor, &self.body, 200)
            )
        })
    }

    /// Why an answer that was not expected is refused.
    pub(crate) fn unexpected(&self, what: &str, request: &Request) -> String {
        let expected = if request.expect.is_empty() {
            "a 2xx status".to_owned()
        } else {
            format!(
                "one of {}",
                request
                    .expect
                    .iter()
                    .map(u16::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let mut message = format!("{what} answered {}, expected {expected}", self.status);
        if self.status.is_redirection() {
            message.push_str(&format!(
                " (a redirect to {}; set follow_redirects to follow it)",
                self.location.as_deref().unwrap_or("nowhere")
            ));
        }
        message
    }
}

fn too_large(status: StatusCode) -> String {
    format!("the answer ({status}) has a body larger than the limit of {MAX_RESPONSE_BODY} bytes")
}

/// The start of a body, as text, redacted, with its length when it was
/// cut. Redacted before the cut: a cut through a secret would leave a
/// half that no later search finds.
fn excerpt(redactor: &Redactor, body: &[u8], limit: usize) -> String {
    let redacted = redactor.bytes(body);
    if redacted.len() <= limit {
        return String::from_utf8_lossy(&redacted).into_owned();
    }
    format!(
        "{}... ({} bytes)",
        String::from_utf8_lossy(&redacted[..limit]),
        body.len()
    )
}

/// What went wrong with a request that got no answer, without the URL
/// (the caller names it) and without reqwest's wrapping.
fn describe(error: &reqwest::Error, timeout: Duration) -> String {
    if error.is_timeout() {
        return format!("no answer within {}s", timeout.as_secs_f64());
    }
    let mut cause: &dyn std::error::Error = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    if error.is_connect() {
        format!("cannot connect: {cause}")
    } else if error.is_redirect() {
        cause.to_string()
    } else {
        format!("the request failed: {cause}")
    }
}

/// `value` with `${job.id}` put in: a string that is exactly the
/// reference takes the id with its JSON type, as a whole-value reference
/// does elsewhere; inside a longer string it is text.
fn with_job_id(value: &Value, id: &Value) -> Value {
    match value {
        Value::String(s) if s == JOB_ID => id.clone(),
        Value::String(s) if s.contains(JOB_ID) => Value::String(s.replace(JOB_ID, &id_text(id))),
        Value::Array(items) => Value::Array(items.iter().map(|v| with_job_id(v, id)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), with_job_id(v, id)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A job id as one URL path segment: every byte but letters, digits, `-`,
/// `_` and `~` escaped, so an id can not add path segments, climb with
/// `..`, or start a query.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_job_id_keeps_its_type_alone_and_is_text_inside_a_string() {
        let body = json!({"id": "${job.id}", "note": "job ${job.id} done", "n": [1, "${job.id}"]});
        assert_eq!(
            with_job_id(&body, &json!(42)),
            json!({"id": 42, "note": "job 42 done", "n": [1, 42]})
        );
        assert_eq!(id_text(&json!("run-abc")), "run-abc");
    }

    #[test]
    fn an_id_in_a_url_can_not_leave_its_segment() {
        assert_eq!(percent_encode("run-AbC_12~"), "run-AbC_12~");
        assert_eq!(percent_encode("../x?y=1"), "%2E%2E%2Fx%3Fy%3D1");
    }

    #[test]
    fn long_bodies_are_cut_in_the_log() {
        let long = vec![b'a'; LOGGED_BODY + 10];
        let none = Redactor::default();
        let shown = excerpt(&none, &long, LOGGED_BODY);
        assert!(shown.ends_with(&format!("... ({} bytes)", LOGGED_BODY + 10)));
        assert_eq!(excerpt(&none, b"{}", LOGGED_BODY), "{}");
    }
}
