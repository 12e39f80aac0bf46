//! Who may do what: roles, API tokens as stored (a hash, never the token),
//! the audit record of every change, and the per-task tokens that let a
//! running script save its own checkpoint and nothing else.
//!
//! Pure data and pure functions: generating a token's random part, checking
//! a request and storing records happen elsewhere.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::TaskId;

/// What a token may do. Each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Role {
    /// Reads: tasks, workflows, logs, templates, nodes.
    Viewer,
    /// Also submits, cancels and retries workflows and tasks.
    Operator,
    /// Also manages tokens and secrets, and reads the audit log.
    Admin,
}

crate::named_variants!(Role, "role", [
    Viewer => "viewer",
    Operator => "operator",
    Admin => "admin",
]);

impl Role {
    /// Whether this role includes `needed`.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

/// An API token as stored: its hash, never the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiToken {
    /// Also the token's visible prefix: `orch_<id>_<secret>`.
    pub id: String,
    pub name: String,
    pub role: Role,
    /// SHA-256 of the whole token, hex.
    pub hash: String,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// Raised by every change, as for tasks.
    #[serde(default)]
    pub version: u64,
    /// For a dashboard session: the id of the API token it was made from.
    /// A session is a record of its own so that signing out ends it in
    /// the store, for every node, without touching its token's record
    /// (see [`ApiToken::session`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_of: Option<String>,
    /// When a session ends by itself; tokens do not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl ApiToken {
    /// A token record for `token` (see [`token_text`]).
    pub fn new(id: String, name: String, role: Role, token: &str, now: DateTime<Utc>) -> ApiToken {
        ApiToken {
            id,
            name,
            role,
            hash: token_hash(token),
            created_at: now,
            revoked_at: None,
            version: 0,
            session_of: None,
            expires_at: None,
        }
    }

    /// A dashboard session made from `token` (an API token's record),
    /// ending at `expires_at` unless signed out before. Its hash is empty,
    /// so no bearer token ever matches it: it is reached only through the
    /// signed cookie that names it.
    pub fn session(
        id: String,
        token: &ApiToken,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> ApiToken {
        ApiToken {
            id,
            name: token.name.clone(),
            role: token.role,
            hash: String::new(),
            created_at: now,
            revoked_at: None,
            version: 0,
            session_of: Some(token.id.clone()),
            expires_at: Some(expires_at),
        }
    }

    /// Not revoked. A session also ends at `expires_at`: see
    /// [`ApiToken::is_live`].
    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }

    /// Not revoked, and not past its end at `now`.
    pub fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.is_active() && self.expires_at.is_none_or(|end| now < end)
    }

    /// Whether this record is a dashboard session rather than an API token.
    pub fn is_session(&self) -> bool {
        self.session_of.is_some()
    }
}

/// The text of a token: a prefix naming its record, then the secret part.
/// The id lets the service find the one record to compare against.
pub fn token_text(id: &str, secret_hex: &str) -> String {
    format!("orch_{id}_{secret_hex}")
}

/// The record id a token names, if it has the shape of one.
pub fn token_id(token: &str) -> Option<&str> {
    let rest = token.strip_prefix("orch_")?;
    let (id, secret) = rest.split_once('_')?;
    (!id.is_empty() && !secret.is_empty()).then_some(id)
}

/// SHA-256 of a token, hex: what is stored and compared.
pub fn token_hash(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// The token a running task's script gets as `ORCHESTRATOR_TOKEN`: it
/// opens that task's checkpoint and nothing else. It is derived from a key
/// the service draws at start and never stores, so it is worthless once
/// the service restarts and the task with it.
pub fn task_token(key: &[u8], task: TaskId) -> String {
    let mut hasher = Sha256::new();
    hasher.update(key);
    hasher.update(task.to_string().as_bytes());
    format!("task_{task}_{}", hex(&hasher.finalize()))
}

/// The task a task token names, if it has the shape of one.
pub fn task_token_task(token: &str) -> Option<TaskId> {
    let rest = token.strip_prefix("task_")?;
    let (task, _) = rest.split_once('_')?;
    task.parse().ok()
}

/// What one mutating call, or any refused call, did: append-only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditRecord {
    /// UUIDv7: sorts by time.
    pub id: String,
    pub time: DateTime<Utc>,
    /// The token's name, `anonymous` without one, `task:<id>` for a task
    /// token, `local` when auth is off.
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// What was attempted, as `<resource>.<verb>`: `workflow.submit`.
    pub action: String,
    /// What it was done to: an id or a name, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `ok`, `denied` (401/403/429) or `failed` (any other error).
    pub outcome: String,
    /// The HTTP status answered.
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// How many refusals this one record stands for: the API writes
    /// refusals of callers without a valid token in aggregate, at most one
    /// record per address per interval. Absent on a record of one call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// A secret as stored: its value encrypted (by the engine, with the
/// service's key), never in the clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRecord {
    /// `[A-Za-z0-9_.-]`, 1 to 64 characters: it stands in templates as
    /// `${secrets.<name>}`.
    pub name: String,
    /// The cipher's nonce and the ciphertext with its tag, base64.
    pub nonce: String,
    pub ciphertext: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default)]
    pub version: u64,
    /// Who may use it. A secret stored before scopes existed reads as the
    /// empty scope: usable nowhere until an admin grants one.
    #[serde(default)]
    pub scope: SecretScope,
}

/// Who may use a secret: least privilege, so the empty scope (the default)
/// lets nobody use it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretScope {
    /// Registered templates, by `ref_name`, whose steps may reference it
    /// (`${secrets.<name>}`). An inline template never may.
    #[serde(default)]
    pub templates: Vec<String>,
    /// Origins (`scheme://host[:port]`, the port only when not the
    /// scheme's default) an http step may send it to, on top of the HTTP
    /// allowlist. Empty: no http step may send it anywhere.
    #[serde(default)]
    pub origins: Vec<String>,
}

impl SecretScope {
    /// Whether a workflow of the registered template `ref_name` may use it.
    pub fn allows_template(&self, ref_name: &str) -> bool {
        self.templates.iter().any(|t| t == ref_name)
    }
}

/// Whether `name` may name a secret.
pub fn valid_secret_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// Bytes as lowercase hex: how hashes, keys and token secrets are written.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_include_the_ones_below() {
        assert!(Role::Admin.allows(Role::Operator));
        assert!(Role::Operator.allows(Role::Viewer));
        assert!(!Role::Viewer.allows(Role::Operator));
        assert!(!Role::Operator.allows(Role::Admin));
        assert_eq!("operator".parse::<Role>(), Ok(Role::Operator));
        assert!(
            "root"
                .parse::<Role>()
                .unwrap_err()
                .contains("viewer, operator, admin")
        );
    }

    #[test]
    fn tokens_name_their_record_and_are_stored_hashed() {
        let token = token_text("0190abc", "deadbeef");
        assert_eq!(token_id(&token), Some("0190abc"));
        assert_eq!(token_id("orch_only"), None);
        assert_eq!(token_id("Bearer x"), None);
        let record = ApiToken::new(
            "0190abc".into(),
            "ci".into(),
            Role::Viewer,
            &token,
            Utc::now(),
        );
        assert_eq!(record.hash, token_hash(&token));
        assert!(!record.hash.contains("deadbeef"));
        assert_eq!(record.hash.len(), 64);
    }

    #[test]
    fn task_tokens_differ_per_task_and_key() {
        let (a, b) = (TaskId::new(), TaskId::new());
        assert_ne!(task_token(b"k", a), task_token(b"k", b));
        assert_ne!(task_token(b"k", a), task_token(b"other", a));
        assert_eq!(task_token_task(&task_token(b"k", a)), Some(a));
        assert_eq!(task_token_task("task_nope_x"), None);
    }

    #[test]
    fn a_session_takes_its_tokens_role_matches_no_bearer_and_ends() {
        let now = Utc::now();
        let token = ApiToken::new("t1".into(), "ci".into(), Role::Operator, "orch_t1_x", now);
        let end = now + chrono::Duration::hours(12);
        let session = ApiToken::session("s1".into(), &token, now, end);
        assert_eq!(
            (session.role, session.name.as_str()),
            (Role::Operator, "ci")
        );
        assert_eq!(session.session_of.as_deref(), Some("t1"));
        assert!(session.is_session() && !token.is_session());
        assert!(
            session.hash.is_empty(),
            "no token hashes to the empty string"
        );
        assert!(session.is_live(now));
        assert!(!session.is_live(end));
        assert!(token.is_live(end + chrono::Duration::days(999)));
        // An old record (no session fields) still reads.
        let old: ApiToken = serde_json::from_str(
            r#"{"id":"a","name":"n","role":"admin","hash":"h","created_at":"2026-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        assert!(!old.is_session() && old.expires_at.is_none());
    }
}
