//! Secrets: stored encrypted, handed to scripts in their input, and kept
//! out of everything else.
//!
//! A template says `${secrets.<name>}`. The stored task input keeps that
//! text, never the value: the value is put in only when the script's input
//! is built for an attempt. Everything that comes back (log lines, outputs,
//! errors) has every known secret value replaced with `<redacted>` before
//! it is stored, and output fields whose key looks sensitive are redacted
//! whatever their value.
//!
//! Values are sealed with XChaCha20-Poly1305 under the service's key, with
//! the secret's name as associated data, so a ciphertext cannot be moved to
//! another name.

use std::collections::BTreeMap;
use std::sync::RwLock;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use chrono::{DateTime, Utc};
use orchestrator_core::access::{SecretRecord, valid_secret_name};
use orchestrator_core::refs::{Piece, Root, scan};
use orchestrator_storage::Storage;
use serde::Serialize;
use serde_json::Value;

use crate::{Error, Result};

/// What replaces a secret value wherever it would show.
pub const REDACTED: &str = "<redacted>";

/// Output keys whose values are redacted whatever they hold.
const SENSITIVE_KEYS: [&str; 7] = [
    "password",
    "secret",
    "token",
    "credential",
    "private_key",
    "api_key",
    "auth",
];

/// Values shorter than this are not searched for in text: redacting every
/// `a` or `on` would garble logs and protect nothing.
const MIN_REDACTED_LEN: usize = 4;

/// A secret as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SecretInfo {
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

pub struct Secrets {
    store: Storage,
    cipher: XChaCha20Poly1305,
    /// Name to value, decrypted at start and kept current by this node.
    /// An RwLock: every log line and output is redacted against it (many
    /// readers), while puts and deletes are rare; never held across an
    /// await.
    values: RwLock<BTreeMap<String, String>>,
}

impl Secrets {
    /// Decrypts every stored secret; a wrong key fails the start here,
    /// naming the secret, rather than every task later.
    pub(crate) async fn load(store: Storage, key: [u8; 32]) -> Result<Secrets> {
        let secrets = Secrets {
            store,
            cipher: XChaCha20Poly1305::new(&key.into()),
            values: RwLock::new(BTreeMap::new()),
        };
        secrets.reload().await?;
        Ok(secrets)
    }

    async fn reload(&self) -> Result<()> {
        let mut values = BTreeMap::new();
        for record in self.store.access().secrets().await? {
            values.insert(record.name.clone(), self.open(&record)?);
        }
        *self.values.write().unwrap_or_else(|e| e.into_inner()) = values;
        Ok(())
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

    /// Stores (or replaces) a secret.
    pub async fn put(&self, name: &str, value: &str) -> Result<SecretInfo> {
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
        let previous = self
            .store
            .access()
            .secrets()
            .await?
            .into_iter()
            .find(|s| s.name == name);
        let record = SecretRecord {
            name: name.to_owned(),
            nonce: BASE64.encode(nonce),
            ciphertext: BASE64.encode(sealed),
            created_at: previous.as_ref().map_or(now, |p| p.created_at),
            updated_at: now,
            version: previous.map_or(0, |p| p.version + 1),
        };
        self.store.access().put_secret(&record).await?;
        self.values
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), value.to_owned());
        Ok(SecretInfo {
            name: record.name,
            created_at: record.created_at,
            updated_at: record.updated_at,
        })
    }

    /// Deletes a secret; whether there was one.
    pub async fn delete(&self, name: &str) -> Result<bool> {
        let deleted = self.store.access().delete_secret(name).await?;
        self.values
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        Ok(deleted)
    }

    /// Names and dates, never values.
    pub async fn list(&self) -> Result<Vec<SecretInfo>> {
        Ok(self
            .store
            .access()
            .secrets()
            .await?
            .into_iter()
            .map(|s| SecretInfo {
                name: s.name,
                created_at: s.created_at,
                updated_at: s.updated_at,
            })
            .collect())
    }

    /// The script's input: every `${secrets.<name>}` replaced by its value.
    /// An unknown name is an error that names it (another node may have
    /// stored it since: the cache is reloaded once first).
    pub async fn resolve(&self, input: &Value) -> std::result::Result<Value, String> {
        if !mentions_secrets(input) {
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
                let values = self.values.read().unwrap_or_else(|e| e.into_inner());
                let Ok(pieces) = scan(text) else {
                    return Ok(value.clone());
                };
                let mut out = String::new();
                for piece in pieces {
                    match piece {
                        Piece::Text(t) => out.push_str(&t),
                        Piece::Ref(r) => match &r.root {
                            Root::Secret(name) => {
                                out.push_str(values.get(name).ok_or_else(|| name.clone())?);
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
        let values = self.values.read().unwrap_or_else(|e| e.into_inner());
        let mut out = text.to_owned();
        for value in values.values().filter(|v| v.len() >= MIN_REDACTED_LEN) {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), REDACTED);
            }
        }
        out
    }

    /// Bytes of a log, redacted as text where they are text.
    pub fn redact_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        match std::str::from_utf8(bytes) {
            Ok(text) => self.redact_text(text).into_bytes(),
            Err(_) => {
                let text = String::from_utf8_lossy(bytes);
                let redacted = self.redact_text(&text);
                if redacted == text {
                    bytes.to_vec()
                } else {
                    redacted.into_bytes()
                }
            }
        }
    }

    /// The length of the longest value redaction looks for.
    fn longest(&self) -> usize {
        let values = self.values.read().unwrap_or_else(|e| e.into_inner());
        values
            .values()
            .filter(|v| v.len() >= MIN_REDACTED_LEN)
            .map(String::len)
            .max()
            .unwrap_or(0)
    }

    /// Where a known secret value lies in `bytes`: every occurrence, as
    /// (start, end).
    fn occurrences(&self, bytes: &[u8]) -> Vec<(usize, usize)> {
        let values = self.values.read().unwrap_or_else(|e| e.into_inner());
        let mut found = Vec::new();
        for value in values.values().filter(|v| v.len() >= MIN_REDACTED_LEN) {
            let needle = value.as_bytes();
            let mut from = 0;
            while let Some(at) = bytes[from..]
                .windows(needle.len())
                .position(|window| window == needle)
            {
                found.push((from + at, from + at + needle.len()));
                from += at + 1;
            }
        }
        found
    }

    /// A JSON value with every known secret value redacted, and every
    /// field whose key looks sensitive replaced whatever it holds.
    pub fn redact_value(&self, value: Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.redact_text(&text)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.redact_value(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, value)| {
                        let value = if is_sensitive(&key) && !value.is_null() {
                            Value::String(REDACTED.into())
                        } else {
                            self.redact_value(value)
                        };
                        (key, value)
                    })
                    .collect(),
            ),
            other => other,
        }
    }
}

fn mentions_secrets(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains("${secrets."),
        Value::Array(items) => items.iter().any(mentions_secrets),
        Value::Object(map) => map.values().any(mentions_secrets),
        _ => false,
    }
}

/// Whether an output key names something sensitive (`db_password`,
/// `apiKey`, `AUTH_TOKEN`, `private-key`).
pub fn is_sensitive(key: &str) -> bool {
    let key: String = key
        .chars()
        .map(|c| {
            if c == '-' {
                '_'
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect();
    let squashed = key.replace('_', "");
    SENSITIVE_KEYS.iter().any(|&s| {
        let found = |text: &str, word: &str| {
            if word == "auth" {
                // `auth`, `authorization`, `authentication`, but not an
                // `author` or an `authority`, which name people and bodies.
                text.match_indices("auth").any(|(at, _)| {
                    let after = &text[at + 4..];
                    !after.starts_with("or")
                        || after.starts_with("oriz")
                        || after.starts_with("oris")
                })
            } else {
                text.contains(word)
            }
        };
        found(&key, s) || found(&squashed, &s.replace('_', ""))
    })
}

/// Redacts a log that arrives in pieces. A secret split across two pieces
/// (a PEM key printed line by line and stored in batches, or any batch
/// boundary) is still caught: the bytes that could be the start of one
/// are held back until the next piece, or the end.
pub struct StreamRedactor {
    secrets: std::sync::Arc<Secrets>,
    held: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(secrets: std::sync::Arc<Secrets>) -> StreamRedactor {
        StreamRedactor {
            secrets,
            held: Vec::new(),
        }
    }

    /// Takes the next piece; returns what can be stored now, redacted.
    pub fn push(&mut self, piece: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(piece);
        let longest = self.secrets.longest();
        if longest == 0 {
            return std::mem::take(&mut self.held);
        }
        // The last `longest - 1` bytes may begin a secret that the next
        // piece completes; a whole secret across the cut moves it back.
        let mut cut = self.held.len().saturating_sub(longest - 1);
        for (start, end) in self.secrets.occurrences(&self.held) {
            if start < cut && cut < end {
                cut = start;
            }
        }
        let ready: Vec<u8> = self.held.drain(..cut).collect();
        self.secrets.redact_bytes(&ready)
    }

    /// The end of the log: whatever is held, redacted.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.held);
        self.secrets.redact_bytes(&rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sensitive_keys_are_found_in_any_spelling() {
        for key in [
            "password",
            "db_password",
            "apiKey",
            "AUTH_TOKEN",
            "private-key",
            "ssh_private_key",
            "credentials",
            "auth",
            "basic_auth",
            "Authorization",
            "authentication_header",
            "authorisation",
        ] {
            assert!(is_sensitive(key), "{key}");
        }
        // `auth` inside words that name people and bodies is not a secret.
        for key in [
            "ip",
            "hostname",
            "status",
            "id",
            "author",
            "authors",
            "certificate_authority",
        ] {
            assert!(!is_sensitive(key), "{key}");
        }
    }

    #[tokio::test]
    async fn a_secret_split_across_pieces_and_lines_is_still_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let store = orchestrator_storage::Storage::new(
            orchestrator_storage::fs::FsBackend::open(dir.path(), Default::default())
                .await
                .unwrap(),
        );
        let secrets = std::sync::Arc::new(Secrets::load(store, [7; 32]).await.unwrap());
        let pem = "-----BEGIN KEY-----\nMIIEpAIBAAKCAQEA7\nqwertyuiop\n-----END KEY-----";
        secrets.put("deploy_key", pem).await.unwrap();
        let log = format!("start\n{pem}\nend\n");
        // Every way of cutting the log into two pieces, and one byte a piece.
        let mut cuts: Vec<Vec<&[u8]>> = (0..log.len())
            .map(|at| vec![&log.as_bytes()[..at], &log.as_bytes()[at..]])
            .collect();
        cuts.push(log.as_bytes().chunks(1).collect());
        for pieces in cuts {
            let mut redactor = StreamRedactor::new(secrets.clone());
            let mut stored = Vec::new();
            for piece in pieces {
                stored.extend(redactor.push(piece));
            }
            stored.extend(redactor.finish());
            let stored = String::from_utf8(stored).unwrap();
            assert_eq!(stored, format!("start\n{REDACTED}\nend\n"));
        }
    }
}
