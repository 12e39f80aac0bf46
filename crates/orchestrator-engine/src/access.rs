//! Who is calling: API tokens (created, revoked, checked), the per-task
//! tokens of running scripts, and the audit log. The HTTP side (which route
//! needs which role, rate limits) is the API crate's; this is the part that
//! touches storage.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;
use orchestrator_core::TaskId;
use orchestrator_core::access::{
    ApiToken, AuditRecord, Role, hex, task_token, task_token_task, token_hash, token_id, token_text,
};
use orchestrator_storage::{AuditQuery, Page, Storage};
use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::{Error, Result};

/// How stale the token cache may get before a request reloads it, so that
/// a token created or revoked through another node is seen soon.
const CACHE_TTL: Duration = Duration::from_secs(5);
/// A token the cache does not know reloads it at most this often: random
/// tokens must not turn into a storage read each.
const MISS_RELOAD: Duration = Duration::from_secs(1);

/// Who every caller is, when auth is off.
pub const LOCAL_ACTOR: &str = "local";

/// Settings of access control.
#[derive(Debug, Clone)]
pub struct AccessConfig {
    /// Off only with `--no-auth`, which the service allows on loopback only.
    pub auth: bool,
    /// Requests per second per caller before 429; 0 for no limit.
    pub rate_limit: u32,
    /// Requests per second per client address before 429, checked before
    /// the token is; 0 for no limit. It caps what one address can make
    /// the service do (token checks, refusals) whatever it sends.
    pub address_rate_limit: u32,
    /// The key secrets are sealed with. `None`: a key for this process
    /// only (tests), so stored secrets do not survive a restart.
    pub secret_key: Option<[u8; 32]>,
    /// The service is reached over HTTPS (TLS ends at it or at a proxy in
    /// front): the dashboard's session cookie is `Secure`, under a
    /// `__Host-` name.
    pub secure_cookies: bool,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            auth: true,
            rate_limit: 50,
            address_rate_limit: 200,
            secret_key: None,
            secure_cookies: false,
        }
    }
}

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's name; `task:<id>` for a task token; `local` without auth.
    pub actor: String,
    /// What it may do. A task token may do nothing but its task's checkpoint.
    pub role: Option<Role>,
    /// For a task token: the one task it speaks for.
    pub task: Option<TaskId>,
    /// The token record's id (rate limits count per token).
    pub token_id: Option<String>,
}

impl Principal {
    /// The holder of an API token.
    fn of_token(record: ApiToken) -> Principal {
        Principal {
            actor: record.name,
            role: Some(record.role),
            task: None,
            token_id: Some(record.id),
        }
    }

    /// Everyone, when auth is off.
    pub fn local() -> Principal {
        Principal {
            actor: LOCAL_ACTOR.into(),
            role: Some(Role::Admin),
            task: None,
            token_id: None,
        }
    }
}

/// A new token: its record, and the token itself, shown once.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub record: ApiToken,
    pub token: String,
}

pub struct Access {
    store: Storage,
    config: AccessConfig,
    /// Drawn at start, never stored: task tokens die with the process.
    task_key: [u8; 32],
    /// Every token record by id, so a request is checked without a storage
    /// read. A std mutex: lookups and swaps are short and never await
    /// (a reload reads storage first, then swaps the map in).
    cache: Mutex<TokenCache>,
}

struct TokenCache {
    by_id: HashMap<String, ApiToken>,
    loaded: Instant,
}

impl Access {
    /// Reads the token records from `store`; the engine does this at start,
    /// and so does a local recovery (`orchestrator token create --local`).
    pub async fn load(store: Storage, config: AccessConfig) -> Result<Access> {
        let mut task_key = [0u8; 32];
        rand::rng().fill_bytes(&mut task_key);
        let access = Access {
            store,
            config,
            task_key,
            cache: Mutex::new(TokenCache {
                by_id: HashMap::new(),
                loaded: Instant::now(),
            }),
        };
        access.reload().await?;
        Ok(access)
    }

    pub fn config(&self) -> &AccessConfig {
        &self.config
    }

    /// The token a task's script gets as `ORCHESTRATOR_TOKEN`.
    pub fn task_token(&self, task: TaskId) -> String {
        task_token(&self.task_key, task)
    }

    async fn reload(&self) -> Result<()> {
        let tokens = self.store.access().tokens().await?;
        let now = Utc::now();
        let active: HashSet<String> = (tokens.iter())
            .filter(|t| t.is_active() && !t.is_session())
            .map(|t| t.id.clone())
            .collect();
        // A session ends when it is signed out, expires, or its token is
        // revoked; nothing accepts it again, so its record is deleted
        // rather than read every few seconds from then on.
        let (ended, kept): (Vec<ApiToken>, Vec<ApiToken>) = tokens.into_iter().partition(|t| {
            t.is_session()
                && !(t.is_live(now)
                    && t.session_of
                        .as_deref()
                        .is_some_and(|of| active.contains(of)))
        });
        let ended: Vec<String> = ended.into_iter().map(|t| t.id).collect();
        {
            let mut cache = crate::lock(&self.cache);
            cache.by_id = kept.into_iter().map(|t| (t.id.clone(), t)).collect();
            cache.loaded = Instant::now();
        }
        if !ended.is_empty() {
            // Deleting them again (another node, a failed try) finds none;
            // a failure leaves them to the next reload.
            match self.store.access().delete_tokens(&ended).await {
                Ok(deleted) => tracing::debug!(deleted, "deleted ended dashboard sessions"),
                Err(e) => tracing::warn!(error = %e, "cannot delete ended dashboard sessions"),
            }
        }
        Ok(())
    }

    /// Reloads the cache if it is older than `age`. A storage failure keeps
    /// the old cache: better to serve known tokens than none.
    async fn refresh_if_older(&self, age: Duration) {
        let stale = crate::lock(&self.cache).loaded.elapsed() > age;
        if stale && let Err(e) = self.reload().await {
            tracing::warn!(error = %e, "cannot reload API tokens; using the ones known");
        }
    }

    /// Who `token` is, if anyone. Every comparison of secret material is in
    /// constant time.
    pub async fn authenticate(&self, token: &str) -> Option<Principal> {
        if let Some(task) = task_token_task(token) {
            let expected = self.task_token(task);
            return bool::from(expected.as_bytes().ct_eq(token.as_bytes())).then(|| Principal {
                actor: format!("task:{task}"),
                role: None,
                task: Some(task),
                token_id: None,
            });
        }
        self.refresh_if_older(CACHE_TTL).await;
        let hash = token_hash(token);
        let find = |cache: &TokenCache| -> Option<ApiToken> {
            match token_id(token) {
                Some(id) => cache.by_id.get(id).cloned(),
                // A token supplied by the operator at bootstrap may have any
                // shape: compare with every record, each in constant time.
                None => cache
                    .by_id
                    .values()
                    .find(|t| bool::from(t.hash.as_bytes().ct_eq(hash.as_bytes())))
                    .cloned(),
            }
        };
        let record = self.find_cached(find).await?;
        let matches = bool::from(record.hash.as_bytes().ct_eq(hash.as_bytes()));
        // A session's hash is empty and matches nothing; say so anyway.
        (matches && record.is_active() && !record.is_session()).then(|| Principal::of_token(record))
    }

    /// Who the dashboard session `id` (a session record, named by the
    /// signed cookie) stands for, if the session is live and so is the
    /// token it was made from. Asked on every request with a session, so
    /// signing out or revoking the token ends it, and the role comes from
    /// the token as it is now. The principal is the token's: rate limits
    /// and stream caps count a session with its token. Served from the
    /// cache, reloaded as for [`Access::authenticate`].
    pub async fn authenticate_session(&self, id: &str) -> Option<Principal> {
        self.refresh_if_older(CACHE_TTL).await;
        let now = Utc::now();
        let session = self
            .find_cached(|cache| cache.by_id.get(id).cloned())
            .await
            .filter(|s| s.is_session() && s.is_live(now))?;
        let token_id = session.session_of?;
        self.find_cached(|cache| cache.by_id.get(&token_id).cloned())
            .await
            .filter(|t| t.is_active() && !t.is_session())
            .map(Principal::of_token)
    }

    /// Starts a dashboard session for the API token `token_id`, ending at
    /// `expires_at`: a record of its own, stored before the cookie that
    /// names it is handed out.
    pub async fn start_session(
        &self,
        token_id: &str,
        expires_at: chrono::DateTime<Utc>,
    ) -> Result<ApiToken> {
        let token = self
            .find_cached(|cache| cache.by_id.get(token_id).cloned())
            .await
            .filter(|t| t.is_active() && !t.is_session())
            .ok_or_else(|| Error::NotFound {
                what: "token",
                id: token_id.to_owned(),
            })?;
        let id = uuid::Uuid::now_v7().simple().to_string();
        let record = ApiToken::session(id, &token, Utc::now(), expires_at);
        self.store.access().put_token(&record).await?;
        crate::lock(&self.cache)
            .by_id
            .insert(record.id.clone(), record.clone());
        Ok(record)
    }

    /// Ends the dashboard session `id`: its record is deleted from the
    /// store, so no node accepts its cookie again (another node within its
    /// cache's age, 5 s). Whether there was such a session still live.
    pub async fn end_session(&self, id: &str) -> Result<bool> {
        let now = Utc::now();
        if self
            .find_cached(|cache| cache.by_id.get(id).cloned())
            .await
            .filter(|s| s.is_session() && s.is_live(now))
            .is_none()
        {
            return Ok(false);
        }
        self.store.access().delete_tokens(&[id.to_owned()]).await?;
        crate::lock(&self.cache).by_id.remove(id);
        Ok(true)
    }

    /// A token record from the cache; one it does not know reloads the
    /// cache first (at most every [`MISS_RELOAD`]).
    async fn find_cached(
        &self,
        find: impl Fn(&TokenCache) -> Option<ApiToken>,
    ) -> Option<ApiToken> {
        let found = find(&crate::lock(&self.cache));
        if found.is_some() {
            return found;
        }
        self.refresh_if_older(MISS_RELOAD).await;
        find(&crate::lock(&self.cache))
    }

    /// Creates a token; the token itself is in the result only.
    pub async fn create_token(&self, name: &str, role: Role) -> Result<IssuedToken> {
        // Refused rather than trimmed: the API's document states this rule
        // as a pattern, and a name the service changed would not be the
        // one asked for.
        let padded = name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace);
        if name.is_empty()
            || name.chars().count() > 64
            || name.chars().any(char::is_control)
            || padded
        {
            return Err(Error::Validation {
                field: "name".into(),
                message: "a token needs a name of 1 to 64 printable characters, \
                          not starting or ending with a space"
                    .into(),
            });
        }
        let id = uuid::Uuid::now_v7().simple().to_string();
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let token = token_text(&id, &hex(&secret));
        self.store_token(
            ApiToken::new(id, name.to_owned(), role, &token, Utc::now()),
            token,
        )
        .await
    }

    async fn store_token(&self, record: ApiToken, token: String) -> Result<IssuedToken> {
        self.store.access().put_token(&record).await?;
        crate::lock(&self.cache)
            .by_id
            .insert(record.id.clone(), record.clone());
        Ok(IssuedToken { record, token })
    }

    /// Revokes a token; `None` if there is no such token. Revoking twice
    /// changes nothing.
    pub async fn revoke_token(&self, id: &str) -> Result<Option<ApiToken>> {
        self.reload().await?;
        let Some(mut record) = crate::lock(&self.cache)
            .by_id
            .get(id)
            .filter(|t| !t.is_session())
            .cloned()
        else {
            return Ok(None);
        };
        if record.is_active() {
            record.revoked_at = Some(Utc::now());
            record.version += 1;
            self.store.access().put_token(&record).await?;
            crate::lock(&self.cache)
                .by_id
                .insert(record.id.clone(), record.clone());
            // Its sessions end with it: deleted now rather than at the
            // next reload (a failure leaves them to that one).
            let sessions: Vec<String> = (crate::lock(&self.cache).by_id.values())
                .filter(|t| t.session_of.as_deref() == Some(id))
                .map(|t| t.id.clone())
                .collect();
            if !sessions.is_empty() {
                if let Err(e) = self.store.access().delete_tokens(&sessions).await {
                    tracing::warn!(error = %e, token = id, "cannot delete the revoked token's sessions");
                }
                let mut cache = crate::lock(&self.cache);
                sessions.iter().for_each(|s| drop(cache.by_id.remove(s)));
            }
        }
        Ok(Some(record))
    }

    /// Every token record, oldest first; dashboard sessions are not
    /// tokens, and are left out.
    pub async fn tokens(&self) -> Result<Vec<ApiToken>> {
        let mut tokens = self.store.access().tokens().await?;
        tokens.retain(|t| !t.is_session());
        Ok(tokens)
    }

    /// On a store without an active admin token, makes one: `supplied`
    /// (from the environment) if given, else a new one, returned so that
    /// it can be shown once. `None` when the store has an admin already.
    pub async fn bootstrap(&self, supplied: Option<&str>) -> Result<Option<IssuedToken>> {
        self.reload().await?;
        let has_admin = crate::lock(&self.cache)
            .by_id
            .values()
            .any(|t| t.is_active() && !t.is_session() && t.role == Role::Admin);
        if has_admin {
            return Ok(None);
        }
        match supplied {
            Some(token) if token.len() < 32 => Err(Error::Validation {
                field: "ORCHESTRATOR_BOOTSTRAP_TOKEN".into(),
                message: "a bootstrap token must be at least 32 characters long".into(),
            }),
            Some(token) => {
                // A token shaped like the ones this service makes
                // (`orch_<id>_<secret>`) is looked up by its id part, so it
                // must be stored under that id.
                let id = match token_id(token) {
                    Some(id) if !id.chars().all(|c| c.is_ascii_alphanumeric()) || id.len() > 64 => {
                        return Err(Error::Validation {
                            field: "ORCHESTRATOR_BOOTSTRAP_TOKEN".into(),
                            message: "a token shaped `orch_<id>_<secret>` needs an id of at most \
                                      64 letters and digits"
                                .into(),
                        });
                    }
                    Some(id) if crate::lock(&self.cache).by_id.contains_key(id) => {
                        return Err(Error::Validation {
                            field: "ORCHESTRATOR_BOOTSTRAP_TOKEN".into(),
                            message: format!(
                                "its id part `{id}` is another token's; choose another"
                            ),
                        });
                    }
                    Some(id) => id.to_owned(),
                    None => uuid::Uuid::now_v7().simple().to_string(),
                };
                let record = ApiToken::new(id, "bootstrap".into(), Role::Admin, token, Utc::now());
                self.store_token(record, token.to_owned()).await.map(Some)
            }
            None => self.create_token("bootstrap", Role::Admin).await.map(Some),
        }
    }

    /// Appends to the audit log. A failure is logged, not returned: the
    /// action it records has already happened and been answered.
    pub async fn record(&self, record: AuditRecord) {
        if let Err(e) = self.store.access().append_audit(&record).await {
            tracing::error!(error = %e, action = %record.action, actor = %record.actor,
                "cannot write an audit record");
        }
    }

    pub async fn audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        Ok(self.store.access().list_audit(query).await?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use orchestrator_storage::fs::{FsBackend, FsOptions};

    use super::*;

    async fn stored_ids(store: &Storage) -> Vec<String> {
        let mut ids: Vec<String> = (store.access().tokens().await.unwrap().into_iter())
            .map(|t| t.id)
            .collect();
        ids.sort();
        ids
    }

    /// Ended sessions leave the store: those found ended when the tokens
    /// are read (expired, revoked, of a revoked or unknown token), one
    /// signed out, and those of a token being revoked. Tokens, revoked
    /// ones included, and live sessions stay.
    #[tokio::test]
    async fn ended_sessions_are_deleted_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Storage::new(
            FsBackend::open(dir.path(), FsOptions::default())
                .await
                .unwrap(),
        );
        let now = Utc::now();
        let later = now + chrono::Duration::hours(1);
        let token = ApiToken::new("t1".into(), "ui".into(), Role::Viewer, "orch_t1_x", now);
        let mut revoked = ApiToken::new("t2".into(), "old".into(), Role::Admin, "orch_t2_y", now);
        revoked.revoked_at = Some(now);
        let mut signed_out = ApiToken::session("s3".into(), &token, now, later);
        signed_out.revoked_at = Some(now);
        let orphan = ApiToken {
            session_of: Some("gone".into()),
            ..ApiToken::session("s5".into(), &token, now, later)
        };
        for record in [
            token.clone(),
            revoked.clone(),
            ApiToken::session("s1".into(), &token, now, later),
            ApiToken::session("s2".into(), &token, now, now - chrono::Duration::seconds(1)),
            signed_out,
            ApiToken::session("s4".into(), &revoked, now, later),
            orphan,
            ApiToken::session("s6".into(), &token, now, later),
        ] {
            store.access().put_token(&record).await.unwrap();
        }

        let access = Access::load(store.clone(), AccessConfig::default())
            .await
            .unwrap();
        assert_eq!(stored_ids(&store).await, ["s1", "s6", "t1", "t2"]);
        assert!(access.authenticate_session("s1").await.is_some());
        assert!(access.authenticate_session("s2").await.is_none());

        assert!(access.end_session("s6").await.unwrap());
        assert!(!access.end_session("s6").await.unwrap(), "ended already");
        assert_eq!(stored_ids(&store).await, ["s1", "t1", "t2"]);
        assert!(access.authenticate_session("s6").await.is_none());

        access.revoke_token("t1").await.unwrap().unwrap();
        assert_eq!(stored_ids(&store).await, ["t1", "t2"]);
        assert!(access.authenticate_session("s1").await.is_none());
    }
}
