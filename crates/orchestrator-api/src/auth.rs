//! The door: who is calling (bearer token, or the dashboard's session
//! cookie), whether their role allows the route, whether a cookie's request
//! carries its CSRF token, whether they are over their rate, and the audit
//! record of every change and every refusal.
//!
//! Which route needs which role, and which calls are audited under which
//! action, each operation declares on its handler (`x-role`, `x-audit`);
//! the door looks them up by route template ([`Declarations`]).

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use axum::RequestExt;
use axum::body::Body;
use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use governor::Quota;
use orchestrator_core::access::{AuditRecord, Role};
use orchestrator_engine::Engine;
use orchestrator_engine::access::Principal;

use crate::ApiError;
use crate::declarations::{Declarations, Need};
use crate::forwarded::{ClientAddress, TrustedProxies};
use crate::limiter::{Limiter, MAX_KEYS};
use crate::refusals::{AUDIT_INTERVAL, Due, MAX_ADDRESSES, RefusalTally};
use crate::session::{self, Session, Sessions};

/// What a handler adds to its call's audit record, after the target (an
/// approval's digest), as an extension of its response.
#[derive(Debug, Clone)]
pub(crate) struct AuditNote(pub(crate) String);

/// What the guard needs: the engine (tokens, audit), the session keys,
/// the rate limiters and the tally of anonymous refusals.
#[derive(Clone)]
pub(crate) struct Guard {
    /// What each operation needs and records.
    declarations: Declarations,
    engine: Engine,
    sessions: Sessions,
    /// Per token (per address for the open routes), after authentication.
    /// Both limiters keep at most [`MAX_KEYS`] callers apart (see
    /// `limiter`).
    limiter: Option<Arc<Limiter<String>>>,
    /// Per client address, before authentication: what one address can
    /// make the service do (hash a token, refuse, answer) is bounded
    /// whatever it sends.
    address_limiter: Option<Arc<Limiter<IpAddr>>>,
    /// Whose `X-Forwarded-For` names the client (for the limits, the
    /// refusal tally and `/metrics`).
    trusted_proxies: TrustedProxies,
    /// Refusals of callers without a valid token, audited in aggregate.
    refusals: Arc<RefusalAudit>,
}

/// The tally of anonymous refusals, with the engine its records go to.
/// The guard holds it; the task that writes the records due holds it
/// weakly, so that neither the tally nor the engine (and the store's lock
/// with it) outlives the router.
struct RefusalAudit {
    tally: RefusalTally,
    engine: Engine,
}

/// A governor quota of `rate` per second with bursts of twice that.
fn quota(rate: NonZeroU32) -> Quota {
    let burst = rate.saturating_mul(NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN));
    Quota::per_second(rate).allow_burst(burst)
}

impl Guard {
    pub(crate) fn new(
        declarations: Declarations,
        engine: Engine,
        sessions: Sessions,
        trusted_proxies: TrustedProxies,
    ) -> Guard {
        let config = engine.access().config();
        // Off when auth is off: one local user needs no protection from
        // itself. Callers beyond the table's cap share one bucket: the
        // overflow keys below, which no real caller has.
        let limiter = NonZeroU32::new(config.rate_limit)
            .filter(|_| config.auth)
            .map(|rate| {
                Arc::new(crate::limiter::limiter(
                    quota(rate),
                    MAX_KEYS,
                    "(other callers)".to_owned(),
                ))
            });
        let address_limiter = NonZeroU32::new(config.address_rate_limit)
            .filter(|_| config.auth)
            .map(|rate| {
                Arc::new(crate::limiter::limiter(
                    quota(rate),
                    MAX_KEYS,
                    IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                ))
            });
        if let Some(limiter) = &limiter {
            crate::limiter::prune_periodically(limiter);
        }
        if let Some(limiter) = &address_limiter {
            crate::limiter::prune_periodically(limiter);
        }
        let refusals = Arc::new(RefusalAudit {
            tally: RefusalTally::new(AUDIT_INTERVAL, MAX_ADDRESSES),
            engine: engine.clone(),
        });
        // The records of the counts that accumulate after an address's
        // first refusal are written by a task, each interval; it holds the
        // tally weakly, and ends when the router (and so the guard) is
        // dropped. Without a runtime (a router built outside one, never
        // served) there is nothing to flush.
        if config.auth
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(flush_refusals(Arc::downgrade(&refusals), AUDIT_INTERVAL));
        }
        Guard {
            declarations,
            engine,
            sessions,
            limiter,
            address_limiter,
            trusted_proxies,
            refusals,
        }
    }

    /// Counts a refusal of a caller without a valid token; writes its
    /// audit record if one is due now.
    async fn refused_anonymous(
        &self,
        client: Option<IpAddr>,
        status: StatusCode,
        request_id: Option<String>,
    ) {
        let reason = match status {
            StatusCode::TOO_MANY_REQUESTS => "rate_limited",
            StatusCode::FORBIDDEN => "forbidden",
            _ => "unauthorized",
        };
        metrics::counter!("orchestrator_auth_refusals_total", "reason" => reason).increment(1);
        if let Some(due) = self
            .refusals
            .tally
            .note(client, status.as_u16(), Instant::now())
        {
            let mut record = aggregate_record(due);
            record.request_id = request_id;
            self.engine.access().record(record).await;
        }
    }
}

/// The audit record of `due.count` refusals of callers without a valid
/// token from one address.
fn aggregate_record(due: Due) -> AuditRecord {
    AuditRecord {
        id: uuid::Uuid::now_v7().to_string(),
        time: Utc::now(),
        actor: "anonymous".to_owned(),
        role: None,
        action: "auth.refused".to_owned(),
        target: Some(due.source.target()),
        outcome: "denied".to_owned(),
        status: due.status,
        request_id: None,
        count: Some(due.count),
    }
}

/// Writes the aggregate records as they fall due, until the guard is gone.
async fn flush_refusals(audit: Weak<RefusalAudit>, interval: Duration) {
    // A quarter of the interval: a record is at most that late.
    let mut ticks = tokio::time::interval(interval / 4);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // Held only while this tick's records are written.
        let Some(audit) = audit.upgrade() else {
            return;
        };
        for due in audit.tally.drain(Instant::now()) {
            audit.engine.access().record(aggregate_record(due)).await;
        }
    }
}

/// The per-address limit: the outermost layer, so that a request over it
/// costs a hash map lookup and a short answer, before any span, log line,
/// request id, metric or token check is spent on it. A flood of wrong
/// tokens from one address is refused here, and counted in aggregate.
pub(crate) async fn limit_address(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    // Who the client is, once for every layer after this one.
    let client = guard.trusted_proxies.client_of(&request);
    if let Some(client) = client {
        request.extensions_mut().insert(ClientAddress(client));
    }
    if let (Some(limiter), Some(client)) = (&guard.address_limiter, client)
        && let Err(not_until) = limiter.check_key(&client)
    {
        let request_id = request
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        guard
            .refused_anonymous(Some(client), StatusCode::TOO_MANY_REQUESTS, request_id)
            .await;
        return too_many_requests(&not_until);
    }
    next.run(request).await
}

/// The middleware.
pub(crate) async fn guard(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    let access = guard.engine.access();
    let method = request.method().clone();
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let path = path.as_deref();
    let declared = guard.declarations.of(&method, path);
    // Set by `limit_address`; read from the connection where that layer
    // did not run (tests that build the guard alone).
    let peer = request
        .extensions()
        .get::<ClientAddress>()
        .map(|c| c.0)
        .or_else(|| guard.trusted_proxies.client_of(&request));
    let request_id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let target = request
        .extract_parts::<RawPathParams>()
        .await
        .ok()
        .and_then(|params| params.iter().next().map(|(_, value)| value.to_owned()));

    let credential = credential(&request, &guard.sessions);
    let principal = if !access.config().auth {
        Some(Principal::local())
    } else {
        match &credential {
            Credential::Bearer(token) => access.authenticate(token).await,
            Credential::Session(Some(session)) => {
                access.authenticate_session(&session.token_id).await
            }
            _ => None,
        }
    };
    let audit = |status: StatusCode, principal: Option<&Principal>, target: Option<String>| {
        let outcome = match status.as_u16() {
            200..=399 => "ok",
            401 | 403 | 429 => "denied",
            _ => "failed",
        };
        AuditRecord {
            id: uuid::Uuid::now_v7().to_string(),
            time: Utc::now(),
            actor: principal.map_or_else(|| "anonymous".to_owned(), |p| p.actor.clone()),
            role: principal.and_then(|p| p.role),
            action: declared.audit.clone().unwrap_or_else(|| {
                format!(
                    "{} {}",
                    method.as_str().to_lowercase(),
                    path.unwrap_or("unknown")
                )
            }),
            target,
            outcome: outcome.to_owned(),
            status: status.as_u16(),
            request_id: request_id.clone(),
            count: None,
        }
    };

    let need = declared.need;
    let refusal = check(need, principal.as_ref(), &credential, peer, &target).or_else(|| {
        // A browser sends the cookie with every request to this origin, so
        // a change made with it must also prove that it comes from the
        // page, which alone knows the CSRF token. Bearer tokens are never
        // sent on their own, and need no such proof.
        let Credential::Session(Some(session)) = &credential else {
            return None;
        };
        let changes = !matches!(method, Method::GET | Method::HEAD | Method::OPTIONS);
        (access.config().auth && changes && !need.is_open())
            .then(|| csrf_refusal(session, request.headers()))
            .flatten()
    });
    if let Some(error) = refusal {
        // A valid token's refusal is someone's act: one record each. No
        // valid token: counted, and audited in aggregate.
        match &principal {
            Some(principal) => {
                access
                    .record(audit(error.status, Some(principal), target))
                    .await;
            }
            None => {
                guard
                    .refused_anonymous(peer, error.status, request_id.clone())
                    .await;
            }
        }
        return error.into_response();
    }
    if let (Some(limiter), Some(key)) = (&guard.limiter, rate_key(principal.as_ref(), peer))
        && let Err(not_until) = limiter.check_key(&key)
    {
        match &principal {
            Some(principal) if declared.audit.is_some() => {
                access
                    .record(audit(
                        StatusCode::TOO_MANY_REQUESTS,
                        Some(principal),
                        target,
                    ))
                    .await;
            }
            Some(_) => {}
            None => {
                guard
                    .refused_anonymous(peer, StatusCode::TOO_MANY_REQUESTS, request_id.clone())
                    .await;
            }
        }
        return too_many_requests(&not_until);
    }
    if let Some(principal) = &principal {
        request.extensions_mut().insert(principal.clone());
    }
    if let Credential::Session(Some(session)) = credential {
        // `GET /ui/session` hands the page its CSRF token again after a reload.
        request.extensions_mut().insert(session);
    }
    let response = next.run(request).await;
    if declared.audit.is_none() {
        return response;
    }
    // What was created has no id in the path: take it from the answer.
    let (response, target) = match target {
        Some(target) => (response, Some(target)),
        None => created_id(response).await,
    };
    let target = match response.extensions().get::<AuditNote>() {
        Some(AuditNote(note)) => Some(match target {
            Some(target) => format!("{target} {note}"),
            None => note.clone(),
        }),
        None => target,
    };
    access
        .record(audit(response.status(), principal.as_ref(), target))
        .await;
    response
}

/// `429 rate_limited`, with `Retry-After` in whole seconds (at least 1).
fn too_many_requests(not_until: &governor::NotUntil<governor::clock::QuantaInstant>) -> Response {
    let wait = not_until.wait_time_from(governor::clock::Clock::now(
        &governor::clock::DefaultClock::default(),
    ));
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut response = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        format!("too many requests; retry in {seconds} s"),
    )
    .into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

/// What a request presents to prove who it is.
#[derive(Debug)]
enum Credential {
    None,
    /// An `Authorization` header that is not `Bearer <token>`.
    Malformed,
    Bearer(String),
    /// The dashboard's session cookie (and no `Authorization` header);
    /// `None` when it is forged, damaged or expired.
    Session(Option<Session>),
}

/// The request's credential. A bearer token wins over a cookie: a client
/// that sends one means it.
fn credential(request: &Request, sessions: &Sessions) -> Credential {
    if let Some(value) = request.headers().get(header::AUTHORIZATION) {
        return value
            .to_str()
            .ok()
            .and_then(|t| {
                t.strip_prefix("Bearer ")
                    .or_else(|| t.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map_or(Credential::Malformed, |t| Credential::Bearer(t.to_owned()));
    }
    match sessions.cookie(request.headers()) {
        Some(value) => Credential::Session(sessions.verify(value, Utc::now())),
        None => Credential::None,
    }
}

/// Why a change made with a session cookie is refused, if it is: its
/// `X-CSRF-Token` header is missing or is not the session's.
fn csrf_refusal(session: &Session, headers: &axum::http::HeaderMap) -> Option<ApiError> {
    let problem = match headers.get(session::CSRF_HEADER).map(HeaderValue::to_str) {
        None => "is missing",
        Some(Ok(sent)) if session.csrf_matches(sent) => return None,
        Some(_) => "does not match the session",
    };
    Some(ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "header X-CSRF-Token {problem}: a change made with the session cookie must repeat \
             the csrf_token that POST /ui/session (or GET /ui/session) returned"
        ),
    ))
}

/// Why the caller may not pass, if they may not.
fn check(
    need: Need,
    principal: Option<&Principal>,
    credential: &Credential,
    peer: Option<IpAddr>,
    target: &Option<String>,
) -> Option<ApiError> {
    let unauthorized = || {
        let message = match credential {
            Credential::None => "this needs an API token: send `Authorization: Bearer <token>`",
            Credential::Malformed => "the Authorization header is not `Bearer <token>`",
            Credential::Bearer(_) => "the API token is unknown or revoked",
            Credential::Session(_) => {
                "the session has expired or its API token was revoked; sign in again"
            }
        };
        Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            message,
        ))
    };
    let forbidden = |needed: Role| {
        Some(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this needs the {needed} role"),
        ))
    };
    match need {
        Need::Open | Need::Optional => None,
        Need::Metrics => {
            let local = peer.is_some_and(|p| p.is_loopback());
            if local || principal.is_some_and(|p| p.role.is_some()) {
                None
            } else {
                unauthorized()
            }
        }
        Need::Checkpoint => match principal {
            None => unauthorized(),
            Some(p) if p.task.is_some() => {
                let own = p.task.map(|t| t.to_string()) == *target;
                if own { None } else { forbidden(Role::Operator) }
            }
            Some(p) if p.role.is_some_and(|r| r.allows(Role::Operator)) => None,
            Some(_) => forbidden(Role::Operator),
        },
        Need::Role(needed) => match principal {
            None => unauthorized(),
            Some(p) if p.role.is_some_and(|r| r.allows(needed)) => None,
            Some(_) => forbidden(needed),
        },
    }
}

/// Whom a rate counts against: the token, else the caller's address.
fn rate_key(principal: Option<&Principal>, client: Option<IpAddr>) -> Option<String> {
    match principal {
        Some(p) => Some(p.token_id.clone().unwrap_or_else(|| p.actor.clone())),
        None => client.map(|c| c.to_string()),
    }
}

/// The id of what a successful call created (`workflow_id`, or `id`),
/// read from its JSON answer, which is put back as it was.
async fn created_id(response: Response) -> (Response, Option<String>) {
    // Only a body of known, modest size is read: a JSON answer is one, and
    // nothing else is worth holding in memory for a target.
    use axum::body::HttpBody as _;
    let small = response
        .body()
        .size_hint()
        .exact()
        .is_some_and(|n| n <= crate::MAX_BODY_BYTES as u64 * 16);
    if !response.status().is_success() || !small {
        return (response, None);
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, crate::MAX_BODY_BYTES * 16).await else {
        return (Response::from_parts(parts, Body::empty()), None);
    };
    let id = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|json| {
            ["workflow_id", "id"]
                .iter()
                .find_map(|field| json.get(field)?.as_str().map(str::to_owned))
        });
    (Response::from_parts(parts, Body::from(bytes)), id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_open_on_loopback_only() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let remote: IpAddr = "10.1.2.3".parse().unwrap();
        assert!(check(Need::Metrics, None, &Credential::None, Some(local), &None).is_none());
        let refused = check(Need::Metrics, None, &Credential::None, Some(remote), &None).unwrap();
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
        assert!(check(Need::Metrics, None, &Credential::None, None, &None).is_some());
        let viewer = Principal {
            actor: "v".into(),
            role: Some(Role::Viewer),
            task: None,
            token_id: Some("t".into()),
        };
        assert!(
            check(
                Need::Metrics,
                Some(&viewer),
                &Credential::None,
                Some(remote),
                &None
            )
            .is_none()
        );
        // A task token is for its checkpoint, not for metrics.
        let task = Principal {
            role: None,
            task: Some(orchestrator_core::TaskId::new()),
            ..viewer
        };
        assert!(
            check(
                Need::Metrics,
                Some(&task),
                &Credential::None,
                Some(remote),
                &None
            )
            .is_some()
        );
    }
}
