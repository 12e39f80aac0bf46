//! Where HTTP steps may send requests: `host` (any port) or `host:port`
//! entries, and nothing when there are none. Checked for every URL a step
//! states literally when its template is loaded or submitted, and for
//! every request it sends (redirect hops included).

use std::fmt;
use std::net::Ipv6Addr;

use reqwest::Url;

/// The hosts HTTP steps may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// As `Url::host_str` writes it: lower case, an IPv6 address in brackets.
    host: String,
    /// `None`: any port.
    port: Option<u16>,
}

/// Whether HTTPS targets can be reached: the `https` feature.
pub const HTTPS: bool = cfg!(feature = "https");

impl Allowlist {
    /// Parses `host` and `host:port` entries (`[::1]:8080` for IPv6); the
    /// error names the entry at fault.
    pub fn parse<S: AsRef<str>>(entries: impl IntoIterator<Item = S>) -> Result<Allowlist, String> {
        let entries = entries
            .into_iter()
            .map(|entry| parse_entry(entry.as_ref().trim()))
            .collect::<Result<_, _>>()?;
        Ok(Allowlist { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn allows(&self, host: &str, port: u16) -> bool {
        self.entries
            .iter()
            .any(|e| e.host == host && e.port.is_none_or(|p| p == port))
    }

    /// Whether a request may go to `url`; the reason, naming the host, if not.
    pub fn check(&self, url: &Url) -> Result<(), String> {
        match url.scheme() {
            "http" => {}
            "https" if HTTPS => {}
            "https" => {
                return Err(format!(
                    "`{url}`: https:// needs a build with the `https` feature \
                     (cargo build --features orchestrator/https)"
                ));
            }
            other => return Err(format!("`{url}`: `{other}` is not http or https")),
        }
        let host = url
            .host_str()
            .ok_or_else(|| format!("`{url}` has no host"))?;
        let port = url.port_or_known_default().unwrap_or(80);
        if self.allows(host, port) {
            Ok(())
        } else {
            Err(format!(
                "host `{host}:{port}` is not in the HTTP allowlist ({self}); \
                 allow it with --http-allow {host}:{port}"
            ))
        }
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("empty: nothing is allowed");
        }
        f.write_str("allowed: ")?;
        for (i, entry) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            match entry.port {
                Some(port) => write!(f, "{}:{port}", entry.host)?,
                None => f.write_str(&entry.host)?,
            }
        }
        Ok(())
    }
}

fn parse_entry(entry: &str) -> Result<Entry, String> {
    let bad = |why: &str| format!("`{entry}`: {why} (expected host or host:port)");
    if entry.contains("://") || entry.contains('/') {
        return Err(bad("a host, not a URL"));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (address, after) = rest.split_once(']').ok_or_else(|| bad("unclosed `[`"))?;
        let address: Ipv6Addr = address
            .parse()
            .map_err(|_| bad("not an IPv6 address in brackets"))?;
        let port = match after {
            "" => None,
            after => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| bad("expected `:port` after `]`"))?
                    .to_owned(),
            ),
        };
        (format!("[{address}]"), port)
    } else {
        match entry.split_once(':') {
            Some((_, rest)) if rest.contains(':') => {
                return Err(bad("an IPv6 address needs brackets, like [::1]:8080"));
            }
            Some((host, port)) => (host.to_ascii_lowercase(), Some(port.to_owned())),
            None => (entry.to_ascii_lowercase(), None),
        }
    };
    let valid_host = !host.is_empty()
        && (host.starts_with('[')
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')));
    if !valid_host {
        return Err(bad("not a host name or address"));
    }
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| bad("the port is not a number from 0 to 65535"))
        })
        .transpose()?;
    Ok(Entry { host, port })
}

/// The scheme and authority of a URL written in a template, when they are
/// literal: the whole URL if it has no `${...}`, else what comes before
/// the first reference if the authority ends there
/// (`https://awx.example.com/api/v2/jobs/${job.id}/`). `None` when the
/// host itself comes from a reference: it is checked when known.
pub fn literal_origin(url: &str) -> Option<Result<Url, String>> {
    let (literal, whole) = match url.split_once("${") {
        Some((before, _)) => (before, false),
        None => (url, true),
    };
    if whole {
        return Some(Url::parse(url).map_err(|e| format!("`{url}` is not a valid URL: {e}")));
    }
    let (scheme, rest) = literal.split_once("://")?;
    let end = rest.find(['/', '?', '#'])?;
    let origin = format!("{scheme}://{}/", &rest[..end]);
    Some(Url::parse(&origin).map_err(|e| format!("`{url}` is not a valid URL: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(list: &Allowlist, url: &str) -> Result<(), String> {
        list.check(&Url::parse(url).unwrap())
    }

    #[test]
    fn entries_allow_a_host_on_any_port_or_one_port() {
        let list = Allowlist::parse(["AWX.example.com", "127.0.0.1:8080", "[::1]:9000"]).unwrap();
        assert!(check(&list, "http://awx.example.com/api").is_ok());
        assert!(check(&list, "http://awx.example.com:8443/api").is_ok());
        assert!(check(&list, "http://127.0.0.1:8080/x").is_ok());
        assert!(check(&list, "http://[::1]:9000/x").is_ok());
        let refused = check(&list, "http://127.0.0.1:8081/x").unwrap_err();
        assert!(refused.contains("`127.0.0.1:8081`"), "{refused}");
        assert!(check(&list, "http://[::1]:9001/").is_err());
        assert!(check(&list, "http://evil.example.com/").is_err());
        assert!(check(&list, "ftp://awx.example.com/").is_err());
    }

    #[test]
    fn the_default_allows_nothing_and_says_so() {
        let list = Allowlist::default();
        let refused = check(&list, "http://localhost:8080/").unwrap_err();
        assert!(
            refused.contains("`localhost:8080`") && refused.contains("nothing is allowed"),
            "{refused}"
        );
    }

    #[test]
    fn bad_entries_are_named() {
        for entry in ["http://x", "a:b:c", "host:99999", "", "[::1", "bad host"] {
            let error = Allowlist::parse([entry]).unwrap_err();
            assert!(error.contains(&format!("`{entry}`")), "{error}");
        }
    }

    #[test]
    fn a_literal_host_is_found_before_the_first_reference() {
        let origin = |url| literal_origin(url).map(|u| u.unwrap().to_string());
        assert_eq!(
            origin("https://awx.example.com/api/v2/jobs/${job.id}/").as_deref(),
            Some("https://awx.example.com/")
        );
        assert_eq!(origin("http://h:81/x").as_deref(), Some("http://h:81/x"));
        assert_eq!(origin("${workflow.input.base}/api"), None);
        assert_eq!(
            origin("http://awx-${workflow.input.env}.example.com/"),
            None
        );
        assert!(literal_origin("http://[bad/").unwrap().is_err());
    }
}
