//! Redaction: every known secret value taken out of what a step produces
//! (log lines, errors, outputs, checkpoints), in one place.
//!
//! A [`Redactor`] holds the values the service knows, each in the forms a
//! step may write it in: as it is, JSON-escaped (as `serde_json` writes it,
//! and with `\uXXXX` for non-ASCII as Python's `json.dumps` does) and
//! URL-encoded (as a path or query component, and as a form). Matching
//! ignores ASCII case, so a host name lower-cased by a URL parser is caught.
//!
//! Whoever cuts text (a long line split into pieces, the last 2 KiB of
//! stderr, a body excerpt) redacts *before* the cut: a cut through a secret
//! leaves two halves that no later search finds.
//!
//! The redactor also knows where each secret may be sent (its scope's
//! origins), so that a step that sends requests asks it before sending.

use std::collections::BTreeSet;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// What replaces a secret value wherever it would show.
pub const REDACTED: &str = "<redacted>";

/// Values shorter than this (in bytes) are not searched for in text:
/// redacting every `a` or `on` would garble logs and protect nothing.
pub const MIN_REDACTED_LEN: usize = 4;

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

/// RFC 3986 unreserved characters stay as they are; everything else is
/// encoded (`encodeURIComponent`, Python's `quote(safe="")`).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A secret as the redactor knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownSecret {
    pub name: String,
    pub value: String,
    /// Origins (`scheme://host[:port]`) the secret may be sent to.
    pub origins: Vec<String>,
}

/// The secret values to take out of text. Built when the secrets change,
/// shared (`Arc`) by every attempt that runs meanwhile.
#[derive(Debug, Default)]
pub struct Redactor {
    secrets: Vec<KnownSecret>,
    /// Which secret each searched form belongs to (an index in `secrets`).
    owner: Vec<usize>,
    /// Leftmost-longest: what is replaced.
    replacing: Option<AhoCorasick>,
    /// Every occurrence, overlapping: where a stream must not be cut.
    overlapping: Option<AhoCorasick>,
    /// The longest form, in bytes.
    longest: usize,
}

/// The forms of `value` a step may write it in, without repeats.
fn forms(value: &str) -> Vec<String> {
    let mut forms = vec![value.to_owned()];
    if let Ok(json) = serde_json::to_string(value) {
        let escaped = json[1..json.len() - 1].to_owned();
        let mut ascii = String::with_capacity(escaped.len());
        for c in escaped.chars() {
            if c.is_ascii() {
                ascii.push(c);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    ascii.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        forms.push(escaped);
        forms.push(ascii);
    }
    forms.push(utf8_percent_encode(value, NON_ALPHANUMERIC).to_string());
    forms.push(utf8_percent_encode(value, COMPONENT).to_string());
    forms.push(form_urlencoded::byte_serialize(value.as_bytes()).collect());
    let mut seen = BTreeSet::new();
    forms.retain(|form| seen.insert(form.to_ascii_lowercase()));
    forms
}

impl Redactor {
    /// A redactor for `secrets`; values shorter than [`MIN_REDACTED_LEN`]
    /// are not searched for.
    pub fn new(secrets: impl IntoIterator<Item = KnownSecret>) -> Redactor {
        let secrets: Vec<KnownSecret> = secrets.into_iter().collect();
        let mut patterns = Vec::new();
        let mut owner = Vec::new();
        for (index, secret) in secrets.iter().enumerate() {
            if secret.value.len() < MIN_REDACTED_LEN {
                continue;
            }
            for form in forms(&secret.value) {
                patterns.push(form);
                owner.push(index);
            }
        }
        let build = |kind: MatchKind| {
            (!patterns.is_empty())
                .then(|| {
                    AhoCorasick::builder()
                        .ascii_case_insensitive(true)
                        .match_kind(kind)
                        .build(&patterns)
                        .ok()
                })
                .flatten()
        };
        Redactor {
            replacing: build(MatchKind::LeftmostLongest),
            overlapping: build(MatchKind::Standard),
            longest: patterns.iter().map(String::len).max().unwrap_or(0),
            owner,
            secrets,
        }
    }

    /// `text` with every known secret value replaced.
    pub fn text(&self, text: &str) -> String {
        match &self.replacing {
            Some(automaton) if automaton.is_match(text) => {
                let mut out = String::with_capacity(text.len());
                automaton.replace_all_with(text, &mut out, |_, _, out| {
                    out.push_str(REDACTED);
                    true
                });
                out
            }
            _ => text.to_owned(),
        }
    }

    /// `bytes` with every known secret value replaced; bytes that are not
    /// UTF-8 stay as they are around the replacements.
    pub fn bytes(&self, bytes: &[u8]) -> Vec<u8> {
        match &self.replacing {
            Some(automaton) if automaton.is_match(bytes) => {
                let mut out = Vec::with_capacity(bytes.len());
                automaton.replace_all_with_bytes(bytes, &mut out, |_, _, out| {
                    out.extend_from_slice(REDACTED.as_bytes());
                    true
                });
                out
            }
            _ => bytes.to_vec(),
        }
    }

    /// A JSON value with every known secret value redacted from its
    /// strings (keys included), and every field whose key looks sensitive
    /// replaced whatever it holds.
    pub fn value(&self, value: Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.text(&text)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.value(v)).collect()),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, value)| {
                        let value = if is_sensitive(&key) && !value.is_null() {
                            Value::String(REDACTED.into())
                        } else {
                            self.value(value)
                        };
                        (self.text(&key), value)
                    })
                    .collect(),
            ),
            other => other,
        }
    }

    /// A JSON value with every known secret value redacted from its
    /// strings (keys included), and nothing else changed: for state a step
    /// reads back (a checkpoint), where a key that merely looks sensitive
    /// must keep its value.
    pub fn strings(&self, value: Value) -> Value {
        match value {
            Value::String(text) => Value::String(self.text(&text)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.strings(v)).collect())
            }
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(key, value)| (self.text(&key), self.strings(value)))
                    .collect(),
            ),
            other => other,
        }
    }

    /// The names of the secrets whose value (in any form) is in `bytes`.
    pub fn secrets_in(&self, bytes: &[u8]) -> BTreeSet<&str> {
        let Some(automaton) = &self.overlapping else {
            return BTreeSet::new();
        };
        automaton
            .find_overlapping_iter(bytes)
            .map(|found| {
                self.secrets[self.owner[found.pattern().as_usize()]]
                    .name
                    .as_str()
            })
            .collect()
    }

    /// Why a request to `origin` that holds `parts` must not be sent: the
    /// first secret in it whose scope does not name that origin. The
    /// message names the secret, never its value (an origin built from a
    /// secret is shown redacted).
    pub fn refuse_origin(&self, origin: &str, parts: &[&[u8]]) -> Option<String> {
        for part in parts {
            for name in self.secrets_in(part) {
                let Some(secret) = self.secrets.iter().find(|s| s.name == name) else {
                    continue;
                };
                if !secret.origins.iter().any(|o| o == origin) {
                    // Not which origins the scope names: the error is a
                    // task's, which viewers read, and the scope an admin's.
                    return Some(format!(
                        "secret `{name}` may not be sent to `{}`: its scope does not name \
                         that origin (an admin grants one with PATCH /secrets/{name})",
                        self.text(origin),
                    ));
                }
            }
        }
        None
    }

    /// Where in `held` a stream may be cut at most `cut` bytes in, so that
    /// no occurrence of a secret (whole, or begun and possibly completed by
    /// what comes next) straddles the cut.
    fn safe_cut(&self, held: &[u8]) -> usize {
        if self.longest == 0 {
            return held.len();
        }
        // The last `longest - 1` bytes may begin a secret that the next
        // piece completes; a whole secret across the cut moves it back.
        let mut cut = held.len().saturating_sub(self.longest - 1);
        if let Some(automaton) = &self.overlapping {
            for found in automaton.find_overlapping_iter(held) {
                if found.start() < cut && cut < found.end() {
                    cut = found.start();
                }
            }
        }
        cut
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

/// Redacts text that arrives in pieces. A secret split across two pieces
/// (a PEM key printed line by line, a batch boundary) is still caught: the
/// bytes that could be the start of one are held back until the next
/// piece, or the end.
#[derive(Debug)]
pub struct StreamRedactor {
    redactor: Arc<Redactor>,
    held: Vec<u8>,
}

impl StreamRedactor {
    pub fn new(redactor: Arc<Redactor>) -> StreamRedactor {
        StreamRedactor {
            redactor,
            held: Vec::new(),
        }
    }

    /// Takes the next piece; returns what can be passed on now, redacted.
    pub fn push(&mut self, piece: &[u8]) -> Vec<u8> {
        self.push_owned(piece.to_vec())
    }

    /// As [`StreamRedactor::push`], without a copy when there is nothing
    /// to look for: this runs for every byte a step prints.
    pub fn push_owned(&mut self, piece: Vec<u8>) -> Vec<u8> {
        if self.redactor.longest == 0 && self.held.is_empty() {
            return piece;
        }
        self.held.extend_from_slice(&piece);
        let cut = self.redactor.safe_cut(&self.held);
        let ready = self.redactor.bytes(&self.held[..cut]);
        // A move of the rest, not a byte-by-byte collect: this runs for
        // every byte a step prints.
        self.held.drain(..cut);
        ready
    }

    /// The end of the text: whatever is held, redacted.
    pub fn finish(&mut self) -> Vec<u8> {
        let rest = std::mem::take(&mut self.held);
        self.redactor.bytes(&rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor(value: &str) -> Arc<Redactor> {
        Arc::new(Redactor::new([KnownSecret {
            name: "vault_pw".into(),
            value: value.into(),
            origins: vec!["https://vault.example".into()],
        }]))
    }

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

    #[test]
    fn every_form_in_any_case_is_redacted() {
        let value = "S3cret \"pass\"/word&é";
        let redactor = redactor(value);
        let json = serde_json::to_string(value).unwrap();
        for shown in [
            value.to_owned(),
            value.to_lowercase(),
            value.to_ascii_uppercase(),
            json[1..json.len() - 1].to_owned(),
            r#"S3cret \"pass\"/word&\u00e9"#.to_owned(),
            utf8_percent_encode(value, NON_ALPHANUMERIC).to_string(),
            utf8_percent_encode(value, COMPONENT)
                .to_string()
                .to_lowercase(),
            form_urlencoded::byte_serialize(value.as_bytes()).collect(),
        ] {
            let text = format!("before {shown} after");
            assert_eq!(
                redactor.text(&text),
                format!("before {REDACTED} after"),
                "{shown}"
            );
        }
        // Too short to be searched for.
        assert_eq!(
            super::Redactor::new([KnownSecret {
                name: "x".into(),
                value: "abc".into(),
                origins: Vec::new(),
            }])
            .text("abc"),
            "abc"
        );
    }

    #[test]
    fn a_request_may_carry_a_secret_only_to_its_origins() {
        let redactor = redactor("hunter22");
        assert_eq!(
            redactor.refuse_origin("https://vault.example", &[b"token=HUNTER22"]),
            None
        );
        assert_eq!(
            redactor.refuse_origin("https://other.example", &[b"nothing"]),
            None
        );
        let refusal = redactor
            .refuse_origin("http://hunter22:80", &[b"http://hunter22/x"])
            .unwrap();
        assert!(
            refusal.contains("secret `vault_pw` may not be sent"),
            "{refusal}"
        );
        assert!(!refusal.contains("hunter22"), "{refusal}");
        // Nor what the scope names: that is an admin's to read.
        assert!(!refusal.contains("vault.example"), "{refusal}");
    }

    #[test]
    fn a_secret_split_across_pieces_and_lines_is_still_redacted() {
        let pem = "-----BEGIN KEY-----\nMIIEpAIBAAKCAQEA7\nqwertyuiop\n-----END KEY-----";
        let redactor = redactor(pem);
        let log = format!("start\n{pem}\nend\n");
        // Every way of cutting the log into two pieces, and one byte a piece.
        let mut cuts: Vec<Vec<&[u8]>> = (0..log.len())
            .map(|at| vec![&log.as_bytes()[..at], &log.as_bytes()[at..]])
            .collect();
        cuts.push(log.as_bytes().chunks(1).collect());
        for pieces in cuts {
            let mut stream = StreamRedactor::new(redactor.clone());
            let mut stored = Vec::new();
            for piece in pieces {
                stored.extend(stream.push(piece));
            }
            stored.extend(stream.finish());
            let stored = String::from_utf8(stored).unwrap();
            assert_eq!(stored, format!("start\n{REDACTED}\nend\n"));
        }
    }
}
