//! The dashboard's session: a cookie that stands for an API token, so the
//! page never holds the token after signing in.
//!
//! The cookie is `<payload>.<tag>`, both base64url, where the payload
//! names the session's record in the store (its id), the expiry and a
//! random CSRF nonce, and the tag is HMAC-SHA256 of the payload under a key
//! derived from the service's secret key. What a signature cannot say,
//! whether the session was ended by signing out, whether its token is still
//! active and what its role is now, the guard asks on every request (see
//! `Access::authenticate_session`), so signing out ends the session and
//! revoking the token ends all of its sessions.
//!
//! Pure functions of their inputs (the time comes in as `now`), so the
//! rules are unit-tested below without a server.

use axum::http::{HeaderMap, HeaderValue, header};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The cookie's name over plain HTTP.
pub(crate) const COOKIE: &str = "orch_session";

/// The cookie's name when the service is told it is reached over HTTPS
/// (`--secure-cookies`): browsers accept a `__Host-` cookie only with
/// `Secure`, `Path=/` and no `Domain`, so no other host under the same
/// domain, and no page served over plain HTTP, can set or overwrite it.
pub(crate) const SECURE_COOKIE: &str = "__Host-orch_session";

/// The header that must repeat the session's CSRF token on every request
/// that changes something.
pub(crate) const CSRF_HEADER: &str = "x-csrf-token";

/// How long a session lasts: a working day, then the user pastes the token
/// again. Long enough not to annoy, short enough that a forgotten browser
/// does not stay signed in for days.
pub(crate) const LIFETIME: chrono::Duration = chrono::Duration::hours(12);

/// Separates this key's use from every other use of the secret key (which
/// seals secrets): the session key is HMAC(secret key, this label).
const KEY_LABEL: &[u8] = b"orchestrator dashboard session v1";

type HmacSha256 = Hmac<Sha256>;

/// Issues and checks session cookies. Cloned into the guard and the
/// handlers; the key never changes after start.
#[derive(Clone)]
pub(crate) struct Sessions {
    key: [u8; 32],
    /// `Secure` cookies under the `__Host-` name (behind TLS).
    secure: bool,
}

impl std::fmt::Debug for Sessions {
    // Never the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("secure", &self.secure)
            .finish_non_exhaustive()
    }
}

/// What a valid cookie says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// The API token record it stands for.
    pub token_id: String,
    pub expires_at: DateTime<Utc>,
    /// Returned to the page once, which repeats it in [`CSRF_HEADER`].
    pub csrf: String,
}

/// The signed part of the cookie. Short field names: it travels with every
/// request.
#[derive(Serialize, Deserialize)]
struct Payload {
    /// Token record id.
    t: String,
    /// Expiry, Unix seconds.
    e: i64,
    /// CSRF nonce, hex.
    n: String,
}

impl Sessions {
    /// Sessions under a key derived from the service's secret key. Without
    /// one (tests, embedded use), a key drawn now: sessions then end with
    /// the process.
    pub(crate) fn new(secret_key: Option<[u8; 32]>, secure: bool) -> Sessions {
        let base = secret_key.unwrap_or_else(|| {
            let mut key = [0u8; 32];
            rand::rng().fill_bytes(&mut key);
            key
        });
        let mut mac = HmacSha256::new_from_slice(&base).unwrap_or_else(|_| {
            // HMAC takes keys of any length; this cannot happen.
            unreachable!("HMAC accepts a 32-byte key")
        });
        mac.update(KEY_LABEL);
        Sessions {
            key: mac.finalize().into_bytes().into(),
            secure,
        }
    }

    /// The cookie's name: [`SECURE_COOKIE`] behind TLS, else [`COOKIE`].
    pub(crate) fn cookie_name(&self) -> &'static str {
        if self.secure { SECURE_COOKIE } else { COOKIE }
    }

    /// The session cookie's value in a request, if it sent one. Only the
    /// name in use counts: behind TLS, a plain `orch_session` cookie (which
    /// any page of the domain could have set) is ignored.
    pub(crate) fn cookie<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let name = self.cookie_name();
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|line| line.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(found, _)| *found == name)
            .map(|(_, value)| value.trim_matches('"'))
    }

    /// `Set-Cookie` for a new session. `HttpOnly`: page scripts cannot
    /// read it (an injected script cannot steal it); `SameSite=Strict`:
    /// other sites' pages never send it; `Path=/`: the page calls the API
    /// at the root; `Secure` behind TLS: never sent over plain HTTP.
    pub(crate) fn set_cookie(&self, value: &str) -> HeaderValue {
        self.cookie_header(value, LIFETIME.num_seconds())
    }

    /// `Set-Cookie` that removes the session cookie.
    pub(crate) fn clear_cookie(&self) -> HeaderValue {
        self.cookie_header("", 0)
    }

    fn cookie_header(&self, value: &str, max_age: i64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let text = format!(
            "{}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict{secure}",
            self.cookie_name()
        );
        // base64url and the fixed attributes are visible ASCII.
        HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static(""))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts a 32-byte key"))
    }

    /// A new session for a session record, and the cookie's value.
    pub(crate) fn issue(&self, token_id: &str, now: DateTime<Utc>) -> (Session, String) {
        let mut nonce = [0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        let session = Session {
            token_id: token_id.to_owned(),
            expires_at: expiry(now),
            csrf: orchestrator_core::access::hex(&nonce),
        };
        let payload = serde_json::to_vec(&Payload {
            t: session.token_id.clone(),
            e: session.expires_at.timestamp(),
            n: session.csrf.clone(),
        })
        .unwrap_or_default();
        let payload = B64.encode(payload);
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        let tag = B64.encode(mac.finalize().into_bytes());
        (session, format!("{payload}.{tag}"))
    }

    /// The session a cookie value stands for, if its tag is right and it
    /// has not expired. Whether its token is still active is the caller's
    /// question.
    pub(crate) fn verify(&self, value: &str, now: DateTime<Utc>) -> Option<Session> {
        let (payload, tag) = value.split_once('.')?;
        let tag = B64.decode(tag).ok()?;
        let mut mac = self.mac();
        mac.update(payload.as_bytes());
        // Constant-time comparison.
        mac.verify_slice(&tag).ok()?;
        let payload: Payload = serde_json::from_slice(&B64.decode(payload).ok()?).ok()?;
        let expires_at = DateTime::from_timestamp(payload.e, 0)?;
        (expires_at > now).then_some(Session {
            token_id: payload.t,
            expires_at,
            csrf: payload.n,
        })
    }
}

/// When a session started at `now` ends: [`LIFETIME`] later, in whole
/// seconds, as the cookie carries Unix seconds.
pub(crate) fn expiry(now: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp((now + LIFETIME).timestamp(), 0).unwrap_or(now)
}

impl Session {
    /// Whether a request's CSRF header repeats this session's token, in
    /// constant time.
    pub(crate) fn csrf_matches(&self, sent: &str) -> bool {
        bool::from(self.csrf.as_bytes().ct_eq(sent.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-22T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn a_cookie_verifies_until_it_expires() {
        let sessions = Sessions::new(Some([7; 32]), false);
        let (session, value) = sessions.issue("tok-1", now());
        assert_eq!(session.expires_at, now() + LIFETIME);
        assert_eq!(session.csrf.len(), 32);
        assert_eq!(sessions.verify(&value, now()), Some(session.clone()));
        let almost = now() + LIFETIME - chrono::Duration::seconds(1);
        assert_eq!(sessions.verify(&value, almost), Some(session));
        assert_eq!(sessions.verify(&value, now() + LIFETIME), None);
    }

    #[test]
    fn a_changed_or_foreign_cookie_is_refused() {
        let sessions = Sessions::new(Some([7; 32]), false);
        let (_, value) = sessions.issue("tok-1", now());
        // Another key (another service, or a changed secret key).
        assert_eq!(
            Sessions::new(Some([8; 32]), false).verify(&value, now()),
            None
        );
        // A payload naming another token, or living longer, with the old tag.
        let (payload, tag) = value.split_once('.').unwrap();
        let mut decoded: serde_json::Value =
            serde_json::from_slice(&B64.decode(payload).unwrap()).unwrap();
        decoded["t"] = "admin-token".into();
        let forged = format!("{}.{tag}", B64.encode(decoded.to_string()));
        assert_eq!(sessions.verify(&forged, now()), None);
        for junk in [
            "",
            ".",
            "x",
            "x.y",
            &format!("{payload}."),
            &format!(".{tag}"),
        ] {
            assert_eq!(sessions.verify(junk, now()), None, "{junk:?}");
        }
    }

    #[test]
    fn keys_are_derived_not_reused() {
        // The session key is not the secret key itself, which seals secrets.
        assert_ne!(Sessions::new(Some([7; 32]), false).key, [7; 32]);
        // Without a secret key, each process draws its own.
        assert_ne!(
            Sessions::new(None, false).key,
            Sessions::new(None, false).key
        );
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; orch_session=abc.def; b=2"),
        );
        let plain = Sessions::new(None, false);
        assert_eq!(plain.cookie(&headers), Some("abc.def"));
        headers.insert(header::COOKIE, HeaderValue::from_static("orch_sessionx=1"));
        assert_eq!(plain.cookie(&headers), None);
        let text = plain.set_cookie("abc.def").to_str().unwrap().to_owned();
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
            assert!(text.contains(attribute), "{text}");
        }
        assert!(!text.contains("Secure"), "{text}");
    }

    #[test]
    fn behind_tls_the_cookie_is_secure_and_host_only() {
        let secure = Sessions::new(None, true);
        let text = secure.set_cookie("abc.def").to_str().unwrap().to_owned();
        assert!(text.starts_with("__Host-orch_session=abc.def;"), "{text}");
        for attribute in ["Secure", "HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(text.contains(attribute), "{text}");
        }
        assert!(!text.contains("Domain"), "{text}");
        let cleared = secure.clear_cookie().to_str().unwrap().to_owned();
        assert!(cleared.starts_with("__Host-orch_session=;") && cleared.contains("Max-Age=0"));
        // A plain cookie of the same name is not the session behind TLS.
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("orch_session=abc.def"),
        );
        assert_eq!(secure.cookie(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("__Host-orch_session=x.y"),
        );
        assert_eq!(secure.cookie(&headers), Some("x.y"));
    }

    #[test]
    fn csrf_tokens_compare_whole() {
        let (session, _) = Sessions::new(None, false).issue("t", now());
        assert!(session.csrf_matches(&session.csrf.clone()));
        assert!(!session.csrf_matches(""));
        assert!(!session.csrf_matches(&session.csrf[..31]));
    }
}
