//! Secrets: stored encrypted, each with a scope that says who may use it,
//! handed to steps in their input, and kept out of everything else.
//!
//! A template says `${secrets.<name>}`. The stored task input keeps that
//! text, never the value: the value is put in only when the step's input
//! is built for an attempt. A secret's scope names the registered
//! templates whose workflows may reference it (checked at submission,
//! [`Secrets::check_use`]) and the origins an http step may send it to
//! (checked by the step, with every reference resolved). Everything that
//! comes back (log lines, outputs, errors, checkpoints) is redacted by one
//! [`Redactor`] before it is stored; see `orchestrator_executor::Redactor`.
//!
//! Values are sealed with XChaCha20-Poly1305 under the service's key, with
//! the secret's name as associated data, so a ciphertext cannot be moved to
//! another name.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use chrono::{DateTime, Utc};
use orchestrator_core::access::{SecretRecord, SecretScope, valid_secret_name};
use orchestrator_core::refs::{Piece, Root, scan};
use orchestrator_executor::{KnownSecret, Redactor};
use orchestrator_storage::Storage;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{Error, Result};

pub use orchestrator_executor::{REDACTED, is_sensitive};

/// A secret as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretInfo {
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Who may use it; empty lists: nobody.
    pub scope: SecretScope,
}

impl SecretInfo {
    fn of(record: SecretRecord) -> SecretInfo {
        SecretInfo {
            name: record.name,
            created_at: record.created_at,
            updated_at: record.updated_at,
            scope: record.scope,
        }
    }
}

/// Which template a workflow runs, as a secret's scope sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretUser<'a> {
    /// A registered template (the built-ins included), by `ref_name`.
    Registered(&'a str),
    /// A template sent with the submission: anyone with the operator role
    /// can write one, so no scope names it.
    Inline,
}

/// A change of scope: each list given replaces the stored one.
#[derive(Debug, Clone, Default)]
pub struct ScopeChange {
    pub templates: Option<Vec<String>>,
    pub origins: Option<Vec<String>>,
}

/// The decrypted secrets and the redactor built from them, replaced
/// together.
#[derive(Default)]
struct Known {
    secrets: BTreeMap<String, (String, SecretScope)>,
    redactor: Arc<Redactor>,
}

impl Known {
    fn new(secrets: BTreeMap<String, (String, SecretScope)>) -> Known {
        let redactor = Arc::new(Redactor::new(secrets.iter().map(
            |(name, (value, scope))| KnownSecret {
                name: name.clone(),
                value: value.clone(),
                origins: scope.origins.clone(),
            },
        )));
        Known { secrets, redactor }
    }
}

pub struct Secrets {
    store: Storage,
    cipher: XChaCha20Poly1305,
    /// Decrypted at start and kept current by this node. An RwLock: every
    /// log line and output is redacted against it (many readers), while
    /// puts and deletes are rare; never held across an await.
    known: RwLock<Known>,
}

impl Secrets {
    /// Decrypts every stored secret; a wrong key fails the start here,
    /// naming the secret, rather than every task later.
    pub(crate) async fn load(store: Storage, key: [u8; 32]) -> Result<Secrets> {
        let secrets = Secrets {
            store,
            cipher: XChaCha20Poly1305::new(&key.into()),
            known: RwLock::new(Known::default()),
        };
        secrets.reload().await?;
        Ok(secrets)
    }

    async fn reload(&self) -> Result<()> {
        let mut secrets = BTreeMap::new();
        for record in self.store.access().secrets().await? {
            let value = self.open(&record)?;
            secrets.insert(record.name, (value, record.scope));
        }
        *self.known.write().unwrap_or_else(|e| e.into_inner()) = Known::new(secrets);
        Ok(())
    }

    /// Replaces one secret in the cache (`None`: removes it).
    fn remember(&self, name: &str, entry: Option<(String, SecretScope)>) {
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        let mut secrets = std::mem::take(&mut known.secrets);
        match entry {
            Some(entry) => secrets.insert(name.to_owned(), entry),
            None => secrets.remove(name),
        };
        *known = Known::new(secrets);
    }

    /// The redactor of the secrets known now: an attempt keeps the one it
    /// started with.
    pub fn redactor(&self) -> Arc<Redactor> {
        self.known
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .redactor
            .clone()
    }
    fn open(&self, record: &SecretRecord) -> Result<String> {
        let unreadable = || Error::Validation {
            field: format!("secret `{}`", record.name),
            message: "cannot be decrypted: the secret key (--secret-key-file, \
                      ORCHESTRATOR_SECRET_KEY, the systemd credential secret-key or \
                      <data-dir>/secret.key) is not the one it was stored with"
                .into(),
        };
        let nonce = BASE64.decode(&record.nonce).map_err(|_| unreadable())?;
        let sealed = BASE64
            .decode(&record.ciphertext)
            .map_err(|_| unreadable())?;
        if nonce.len() != 24 {
            return Err(unreadable());
        }
        let plain = self
            .cipher
            .decrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &sealed,
                    aad: record.name.as_bytes(),
                },
            )
            .map_err(|_| unreadable())?;
        String::from_utf8(plain).map_err(|_| unreadable())
    }

    /// Stores (or replaces) a secret. `scope` `None` keeps the scope of
    /// the secret it replaces (a new secret gets the empty scope: usable
    /// nowhere until an admin grants one).
    pub async fn put(
        &self,
        name: &str,
        value: &str,
        scope: Option<SecretScope>,
    ) -> Result<SecretInfo> {
        if !valid_secret_name(name) {
            return Err(Error::Validation {
                field: "name".into(),
                message: format!(
                    "`{name}`: a secret name is 1 to 64 letters, digits, `_`, `.` or `-`"
                ),
            });
        }
        if value.is_empty() {
            return Err(Error::Validation {
                field: "value".into(),
                message: "a secret value must not be empty".into(),
            });
        }
        let scope = scope.map(checked_scope).transpose()?;
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: value.as_bytes(),
                    aad: name.as_bytes(),
                },
            )
            .map_err(|_| Error::Validation {
                field: "value".into(),
                message: "cannot be encrypted".into(),
            })?;
        let now = Utc::now();
        let previous = self.stored(name).await?;
        let record = SecretRecord {
            name: name.to_owned(),
            nonce: BASE64.encode(nonce),
            ciphertext: BASE64.encode(sealed),
            created_at: previous.as_ref().map_or(now, |p| p.created_at),
            updated_at: now,
            version: previous.as_ref().map_or(0, |p| p.version + 1),
            scope: scope.unwrap_or_else(|| previous.map(|p| p.scope).unwrap_or_default()),
        };
        self.store.access().put_secret(&record).await?;
        self.remember(name, Some((value.to_owned(), record.scope.clone())));
        Ok(SecretInfo::of(record))
    }

    /// Changes a secret's scope, its value untouched.
    pub async fn change_scope(&self, name: &str, change: ScopeChange) -> Result<SecretInfo> {
        let Some(mut record) = self.stored(name).await? else {
            return Err(Error::NotFound {
                what: "secret",
                id: name.to_owned(),
            });
        };
        let value = self.open(&record)?;
        let stored = std::mem::take(&mut record.scope);
        record.scope = checked_scope(SecretScope {
            templates: change.templates.unwrap_or(stored.templates),
            origins: change.origins.unwrap_or(stored.origins),
        })?;
        record.updated_at = Utc::now();
        record.version += 1;
        self.store.access().put_secret(&record).await?;
        self.remember(name, Some((value, record.scope.clone())));
        Ok(SecretInfo::of(record))
    }

    /// Seals a value that is not a named secret (a webhook's signing
    /// secret) under the service's key, bound to `purpose` as the
    /// associated data, so a sealed value cannot be moved to another use.
    pub(crate) fn seal(
        &self,
        purpose: &str,
        value: &[u8],
    ) -> Result<orchestrator_core::webhook::Sealed> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: value,
                    aad: purpose.as_bytes(),
                },
            )
            .map_err(|_| Error::Internal(format!("{purpose}: cannot be encrypted")))?;
        Ok(orchestrator_core::webhook::Sealed {
            nonce: BASE64.encode(nonce),
            ciphertext: BASE64.encode(sealed),
        })
    }

    /// Opens what [`Secrets::seal`] sealed for `purpose`.
    pub(crate) fn unseal(
        &self,
        purpose: &str,
        sealed: &orchestrator_core::webhook::Sealed,
    ) -> Result<Vec<u8>> {
        let unreadable = || {
            Error::Internal(format!(
                "{purpose}: cannot be decrypted (the secret key is not the one it was sealed with)"
            ))
        };
        let nonce = BASE64.decode(&sealed.nonce).map_err(|_| unreadable())?;
        let ciphertext = BASE64
            .decode(&sealed.ciphertext)
            .map_err(|_| unreadable())?;
        if nonce.len() != 24 {
            return Err(unreadable());
        }
        self.cipher
            .decrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: &ciphertext,
                    aad: purpose.as_bytes(),
                },
            )
            .map_err(|_| unreadable())
    }

    async fn stored(&self, name: &str) -> Result<Option<SecretRecord>> {
        Ok(self
            .store
            .access()
            .secrets()
            .await?
            .into_iter()
            .find(|s| s.name == name))
    }

    /// Deletes a secret; whether there was one.
    pub async fn delete(&self, name: &str) -> Result<bool> {
        let deleted = self.store.access().delete_secret(name).await?;
        self.remember(name, None);
        Ok(deleted)
    }

    /// Names, dates and scopes, never values.
    pub async fn list(&self) -> Result<Vec<SecretInfo>> {
        Ok(self
            .store
            .access()
            .secrets()
            .await?
            .into_iter()
            .map(SecretInfo::of)
            .collect())
    }

    /// Whether a workflow of `user` may use every secret named in `texts`
    /// (a template, its inputs, its tasks' inputs): checked wherever a
    /// template and inputs become tasks, and again before an attempt puts
    /// them in. An unknown secret is refused too, as no scope can allow it.
    /// The secrets are read from the store first: another node may have
    /// stored one or changed a scope since.
    pub async fn check_use(&self, user: SecretUser<'_>, names: &BTreeSet<String>) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        self.reload().await?;
        let known = self.known.read().unwrap_or_else(|e| e.into_inner());
        for name in names {
            let Some((_, scope)) = known.secrets.get(name) else {
                return Err(Error::validation(
                    format!("secret `{name}`"),
                    format!("does not exist (an admin stores it with PUT /secrets/{name})"),
                ));
            };
            let allowed = match user {
                SecretUser::Registered(ref_name) => scope.allows_template(ref_name),
                SecretUser::Inline => false,
            };
            if !allowed {
                // The scope itself is an admin's to read (`GET /secrets`):
                // the refusal says why, not which templates and origins it
                // names.
                let (who, why) = match user {
                    SecretUser::Registered(ref_name) if scope.templates.is_empty() => (
                        format!("template `{ref_name}`"),
                        "it has no scope yet, so no template may",
                    ),
                    SecretUser::Registered(ref_name) => (
                        format!("template `{ref_name}`"),
                        "its scope does not name this template",
                    ),
                    SecretUser::Inline => (
                        "an inline template".to_owned(),
                        "only registered templates may use secrets",
                    ),
                };
                return Err(Error::SecretNotAllowed(format!(
                    "secret `{name}` may not be used by {who}: {why} (an admin grants a \
                     registered template with PATCH /secrets/{name})"
                )));
            }
        }
        Ok(())
    }

    /// The step's input: every `${secrets.<name>}` replaced by its value.
    /// An unknown name is an error that names it (another node may have
    /// stored it since: the cache is reloaded once first).
    pub async fn resolve(&self, input: &Value) -> std::result::Result<Value, String> {
        if secrets_named(input).is_empty() {
            return Ok(input.clone());
        }
        match self.substitute(input) {
            Err(missing) if !missing.is_empty() => {
                if let Err(e) = self.reload().await {
                    return Err(format!("cannot read secrets: {e}"));
                }
                self.substitute(input)
                    .map_err(|name| format!("secret `{name}` does not exist (PUT /secrets/{name})"))
            }
            other => other.map_err(|name| format!("secret `{name}` does not exist")),
        }
    }

    fn substitute(&self, value: &Value) -> std::result::Result<Value, String> {
        match value {
            Value::String(text) if text.contains("${secrets.") => {
                let known = self.known.read().unwrap_or_else(|e| e.into_inner());
                let Ok(pieces) = scan(text) else {
                    return Ok(value.clone());
                };
                let mut out = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(t) => out.push_str(&t),
                        Piece::Ref(r) => match &r.root {
                            Root::Secret(name) => {
                                let (value, _) =
                                    known.secrets.get(name).ok_or_else(|| name.clone())?;
                                out.push_str(value);
                            }
                            _ => out.push_str(&r.to_string()),
                        },
                    }
                }
                Ok(Value::String(out))
            }
            Value::Array(items) => items
                .iter()
                .map(|v| self.substitute(v))
                .collect::<std::result::Result<_, _>>()
                .map(Value::Array),
            Value::Object(map) => map
                .iter()
                .map(|(k, v)| Ok((k.clone(), self.substitute(v)?)))
                .collect::<std::result::Result<_, _>>()
                .map(Value::Object),
            other => Ok(other.clone()),
        }
    }

    /// `text` with every known secret value replaced.
    pub fn redact_text(&self, text: &str) -> String {
        self.redactor().text(text)
    }

    /// Bytes of a log, with every known secret value replaced.
    pub fn redact_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        self.redactor().bytes(bytes)
    }

    /// A JSON value with every known secret value redacted, and every
    /// field whose key looks sensitive replaced whatever it holds.
    pub fn redact_value(&self, value: Value) -> Value {
        self.redactor().value(value)
    }
}

/// The secrets a JSON value names (`${secrets.<name>}` in any string, keys
/// included), in any template, input or task input.
pub fn secrets_named(value: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut strings = vec![value];
    while let Some(value) = strings.pop() {
        match value {
            Value::String(text) => collect_names(text, &mut names),
            Value::Array(items) => strings.extend(items),
            Value::Object(map) => {
                for (key, value) in map {
                    collect_names(key, &mut names);
                    strings.push(value);
                }
            }
            _ => {}
        }
    }
    names
}

fn collect_names(text: &str, names: &mut BTreeSet<String>) {
    if !text.contains("${secrets.") {
        return;
    }
    for piece in scan(text).into_iter().flatten() {
        if let Piece::Ref(reference) = piece
            && let Root::Secret(name) = reference.root
        {
            names.insert(name);
        }
    }
}

/// Who uses a secret in a stored workflow: the registered template of its
/// kind, unless it was submitted with an inline template (a re-run keeps
/// the body it was first submitted with).
pub(crate) fn secret_user_of(workflow: &orchestrator_core::Workflow) -> SecretUser<'_> {
    match workflow.input.get("template") {
        Some(Value::Object(_)) => SecretUser::Inline,
        _ => SecretUser::Registered(&workflow.kind),
    }
}

/// Checkpoint entries with every secret value taken out: a checkpoint is
/// stored as it is, and shown with its task to every role.
pub(crate) fn redacted_entries(
    redactor: &orchestrator_executor::Redactor,
    entries: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Map<String, serde_json::Value> {
    match redactor.strings(serde_json::Value::Object(entries)) {
        serde_json::Value::Object(entries) => entries,
        _ => serde_json::Map::new(),
    }
}

/// A scope as stored: template names checked, origins checked and written
/// as `scheme://host[:port]`, both sorted without repeats.
fn checked_scope(scope: SecretScope) -> Result<SecretScope> {
    let mut templates = BTreeSet::new();
    for (i, name) in scope.templates.into_iter().enumerate() {
        if !orchestrator_core::template::valid_name(&name) {
            return Err(Error::validation(
                format!("templates[{i}]"),
                format!(
                    "`{name}` is not a template ref_name (1 to 100 letters, digits, `_` or `-`)"
                ),
            ));
        }
        templates.insert(name);
    }
    let mut origins = BTreeSet::new();
    for (i, text) in scope.origins.into_iter().enumerate() {
        origins.insert(origin_of(&text).map_err(|why| {
            Error::validation(format!("origins[{i}]"), format!("`{text}`: {why}"))
        })?);
    }
    Ok(SecretScope {
        templates: templates.into_iter().collect(),
        origins: origins.into_iter().collect(),
    })
}

/// `text` as an origin: `http` or `https`, a host, an optional port, and
/// nothing else; written as browsers write origins (lower-case host, no
/// default port).
fn origin_of(text: &str) -> std::result::Result<String, String> {
    let url = url::Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("the scheme must be http or https".into());
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("it has no host".into());
    }
    if !url.username().is_empty()
        || url.password().is_some()
        || url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err("an origin is `scheme://host[:port]`, without user, path or query".into());
    }
    Ok(url.origin().ascii_serialization())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_checked_and_written_one_way() {
        assert_eq!(
            origin_of("https://Vault.Example:443").unwrap(),
            "https://vault.example"
        );
        assert_eq!(
            origin_of("http://10.0.0.1:8200/").unwrap(),
            "http://10.0.0.1:8200"
        );
        for bad in [
            "vault.example",
            "ftp://x",
            "https://x/path",
            "https://u:p@x",
            "https://x?q",
        ] {
            assert!(origin_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_are_found_anywhere_in_a_value() {
        let value = serde_json::json!({
            "a": ["x ${secrets.one} y", {"b": "${secrets.two}"}],
            "${secrets.three}": 1,
            "c": "${workflow.input.x}"
        });
        let names: Vec<String> = secrets_named(&value).into_iter().collect();
        assert_eq!(names, ["one", "three", "two"]);
    }
}
