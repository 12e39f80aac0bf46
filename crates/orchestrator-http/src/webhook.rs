//! Webhook requests: a signed POST to a subscription's target, only to a
//! host of the [`Allowlist`], no redirect followed (a redirect could lead
//! the signed body off the allowlist), the answer's body not read.

use std::time::Duration;

use reqwest::Url;
use reqwest::redirect::Policy;

use crate::Allowlist;

/// Sends webhook requests. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WebhookClient {
    allow: std::sync::Arc<Allowlist>,
    client: reqwest::Client,
}

impl WebhookClient {
    /// Fails only if the HTTP client cannot be built (no TLS backend).
    pub fn new(allow: Allowlist) -> Result<WebhookClient, String> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .user_agent(concat!("orchestrator/", env!("CARGO_PKG_VERSION")))
            .redirect(Policy::none())
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(WebhookClient {
            allow: std::sync::Arc::new(allow),
            client,
        })
    }

    /// Whether `url` may be reached; the reason, naming the host, if not.
    pub fn check(&self, url: &str) -> Result<(), String> {
        let parsed = Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        self.allow.check(&parsed)
    }

    /// POSTs `body` with `headers`; the answer's status code, or why none
    /// came within `timeout`.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<u16, String> {
        self.check(url)?;
        let mut request = self.client.post(url).timeout(timeout).body(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        match request.send().await {
            Ok(response) => Ok(response.status().as_u16()),
            Err(e) if e.is_timeout() => Err(format!("no answer within {}s", timeout.as_secs_f32())),
            Err(e) if e.is_connect() => Err(format!("cannot connect to {url}")),
            Err(e) => Err(format!("request failed: {e}")),
        }
    }
}
