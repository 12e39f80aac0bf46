//! What a web page on another site can make a user's browser send here,
//! refused.
//!
//! A page anywhere can make the browser of someone who reaches this
//! service send it requests: a "simple" cross-site request (`fetch` with
//! `mode: "no-cors"`, a form) goes out without asking, with a
//! `text/plain` or form body, and a name the page controls can be
//! re-pointed at 127.0.0.1 (DNS rebinding), after which the page is
//! "same-origin" with the service in the browser's eyes. Three rules,
//! each checked on every route:
//!
//! - **`Content-Type`**: a request that changes something (POST, PUT,
//!   PATCH, DELETE) and has a body must say `application/json` (or
//!   `application/*+json`), which a browser never sends cross-site
//!   without a CORS preflight that this service does not answer. A
//!   request without a body (`POST /tasks/{id}/cancel`) needs no type.
//!   Auth on or off: `415`.
//! - **`Host`**, with `--no-auth` only: the name the request was sent to
//!   must be one of the service's own: an IP address, `localhost` (or a
//!   `*.localhost` name, which browsers resolve to loopback themselves),
//!   or a `--public-host` name. A rebound name is none of these: `421`.
//!   With auth on, a rebound page has no credential to send (the cookie
//!   belongs to the service's own name, and tokens are not sent by the
//!   browser), so any name is answered.
//! - **`Origin`**, when present: the page that sent the request must be
//!   the service's own (the same name as `Host`, and the same port when
//!   both give one) or on a `--public-host` name. With `--no-auth` for
//!   every request; with auth on, for requests whose credential is the
//!   dashboard's session cookie (which the browser attaches by itself),
//!   on top of their CSRF token. `403`.

use std::sync::Arc;

use axum::body::HttpBody as _;
use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::ApiError;

/// The rules' settings.
#[derive(Debug, Clone)]
pub(crate) struct BrowserRules {
    /// With auth off, `Host` is checked and every `Origin` is.
    auth: bool,
    /// `--public-host` names, lower-cased, without ports.
    public_hosts: Arc<[String]>,
    /// Tells whether a request carries the session cookie (under the name
    /// in use).
    sessions: crate::session::Sessions,
}

impl BrowserRules {
    pub(crate) fn new(
        auth: bool,
        public_hosts: &[String],
        sessions: crate::session::Sessions,
    ) -> BrowserRules {
        BrowserRules {
            auth,
            public_hosts: public_hosts.iter().map(|h| normal_name(h)).collect(),
            sessions,
        }
    }

    /// Why `request` is refused, if it is.
    fn refusal(&self, request: &Request) -> Option<ApiError> {
        let headers = request.headers();
        let host = request_host(request);
        if !self.auth
            && let Some(host) = &host
            && !self.is_own_name(host.host())
        {
            return Some(ApiError::new(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_request",
                format!(
                    "header Host `{host}` is not a name of this service: with --no-auth it \
                     answers only to IP addresses, localhost and the --public-host names"
                ),
            ));
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let cookie_only = headers.get(header::AUTHORIZATION).is_none()
                && self.sessions.cookie(headers).is_some();
            if (!self.auth || cookie_only) && !self.is_own_origin(origin, host.as_ref()) {
                let shown = origin.to_str().unwrap_or("(not text)");
                return Some(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!(
                        "header Origin `{shown}` is another site: this service takes no \
                         cross-site requests (list the names it is reached by with --public-host)"
                    ),
                ));
            }
        }
        let changes = matches!(
            *request.method(),
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        );
        let has_body = request.body().size_hint().exact() != Some(0);
        if changes && has_body && !is_json(headers) {
            let sent = headers
                .get(header::CONTENT_TYPE)
                .map_or("none", |v| v.to_str().unwrap_or("(not text)"));
            return Some(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "header Content-Type must be application/json for a {} with a body; it is \
                     `{sent}`",
                    request.method()
                ),
            ));
        }
        None
    }

    /// An IP address, a loopback name, or a public name.
    fn is_own_name(&self, name: &str) -> bool {
        let name = normal_name(name);
        name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self.public_hosts.contains(&name)
    }

    /// The page is this service's: its name is the one the request was
    /// sent to (with the same port, when both say one), or a public name.
    fn is_own_origin(&self, origin: &HeaderValue, host: Option<&Authority>) -> bool {
        // `null` (a sandboxed frame, a file) is nobody's page.
        let Some(origin) = origin
            .to_str()
            .ok()
            .and_then(|o| o.parse::<Uri>().ok())
            .and_then(|o| o.authority().cloned())
        else {
            return false;
        };
        let name = normal_name(origin.host());
        if self.public_hosts.contains(&name) {
            return true;
        }
        host.is_some_and(|host| {
            normal_name(host.host()) == name
                && match (origin.port_u16(), host.port_u16()) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        })
    }
}

/// One `--public-host` value: a name as it appears in `Host`
/// (`orch.example.com`; a port is allowed and ignored), lower-cased.
pub fn parse_public_host(text: &str) -> Result<String, String> {
    let text = text.trim();
    text.parse::<Authority>()
        .ok()
        .filter(|a| !a.host().is_empty() && a.as_str() == text && !text.contains('@'))
        .map(|a| normal_name(a.host()))
        .ok_or_else(|| format!("`{text}` is not a host name (orch.example.com, or with a :port)"))
}

/// The middleware: refuses what a foreign page could have sent.
pub(crate) async fn check(
    State(rules): State<BrowserRules>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(error) = rules.refusal(&request) {
        tracing::warn!(code = error.code, message = %error.message, "request refused");
        return error.into_response();
    }
    next.run(request).await
}

/// Where the request was sent: the URI's authority (absolute form), else
/// `Host`. `None` when neither says (HTTP/1.0 without `Host`: no browser).
fn request_host(request: &Request) -> Option<Authority> {
    if let Some(authority) = request.uri().authority() {
        return Some(authority.clone());
    }
    request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<Authority>().ok())
}

/// Lower-cased, without IPv6 brackets, a trailing dot or a port.
fn normal_name(name: &str) -> String {
    let name = name.trim();
    let name = match name.parse::<Authority>() {
        Ok(authority) => authority.host().to_owned(),
        Err(_) => name.to_owned(),
    };
    name.trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// `application/json` or `application/<something>+json`, parameters aside.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|subtype| subtype.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use axum::body::Body;

    use super::*;

    fn request(method: Method, headers: &[(&str, &str)], body: &'static str) -> Request {
        let mut builder = Request::builder().method(method).uri("/workflows");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::from(body)).unwrap()
    }

    fn status(rules: &BrowserRules, request: &Request) -> u16 {
        rules.refusal(request).map_or(200, |e| e.status.as_u16())
    }

    #[test]
    fn each_rule_refuses_what_a_foreign_page_could_send() {
        let open = BrowserRules::new(
            false,
            &["orch.example.com".to_owned()],
            crate::session::Sessions::new(None, false),
        );
        let local = [("host", "127.0.0.1:8080")];
        let json = ("content-type", "application/json; charset=utf-8");
        // Method, headers, body, the status expected.
        type Case<'a> = (Method, Vec<(&'a str, &'a str)>, &'static str, u16);
        let cases: &[Case] = &[
            (Method::POST, vec![local[0], json], "{}", 200),
            (
                Method::POST,
                vec![local[0], ("content-type", "text/plain")],
                "{}",
                415,
            ),
            (Method::POST, vec![local[0]], "{}", 415),
            (
                Method::PUT,
                vec![local[0], ("content-type", "application/merge-patch+json")],
                "{}",
                200,
            ),
            // No body: no type needed.
            (Method::POST, vec![local[0]], "", 200),
            (
                Method::GET,
                vec![local[0], ("content-type", "text/plain")],
                "x",
                200,
            ),
            (Method::GET, vec![("host", "evil.example:8080")], "", 421),
            (Method::GET, vec![("host", "localhost:8080")], "", 200),
            (Method::GET, vec![("host", "[::1]:8080")], "", 200),
            (Method::GET, vec![("host", "ORCH.example.com.")], "", 200),
            (
                Method::GET,
                vec![local[0], ("origin", "http://127.0.0.1:8080")],
                "",
                200,
            ),
            (
                Method::GET,
                vec![local[0], ("origin", "http://127.0.0.1:3000")],
                "",
                403,
            ),
            (
                Method::GET,
                vec![local[0], ("origin", "https://evil.example")],
                "",
                403,
            ),
            (Method::GET, vec![local[0], ("origin", "null")], "", 403),
            (
                Method::GET,
                vec![local[0], ("origin", "https://orch.example.com")],
                "",
                200,
            ),
            (
                Method::GET,
                vec![
                    ("host", "orch.example.com"),
                    ("origin", "https://orch.example.com"),
                ],
                "",
                200,
            ),
        ];
        for (method, headers, body, expected) in cases {
            let request = request(method.clone(), headers, body);
            assert_eq!(status(&open, &request), *expected, "{method} {headers:?}");
        }
    }

    #[test]
    fn with_auth_any_name_is_answered_and_origin_is_checked_for_the_cookie_only() {
        let guarded = BrowserRules::new(true, &[], crate::session::Sessions::new(None, false));
        let evil_host = [("host", "evil.example")];
        assert_eq!(status(&guarded, &request(Method::GET, &evil_host, "")), 200);
        let foreign = ("origin", "https://evil.example");
        let cookie_line = format!("{}=abc", crate::session::COOKIE);
        let cookie = ("cookie", cookie_line.as_str());
        let bearer = ("authorization", "Bearer t");
        let host = ("host", "orch.internal:8080");
        assert_eq!(
            status(&guarded, &request(Method::GET, &[host, foreign], "")),
            200
        );
        assert_eq!(
            status(
                &guarded,
                &request(Method::GET, &[host, foreign, cookie], "")
            ),
            403
        );
        assert_eq!(
            status(
                &guarded,
                &request(Method::GET, &[host, foreign, cookie, bearer], "")
            ),
            200
        );
        // The type rule holds with auth on too.
        assert_eq!(
            status(
                &guarded,
                &request(Method::POST, &[host, ("content-type", "text/plain")], "{}")
            ),
            415
        );
    }
}
