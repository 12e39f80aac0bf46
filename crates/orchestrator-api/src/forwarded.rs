//! Who the client is, behind a reverse proxy.
//!
//! Behind a proxy every request arrives from the proxy's address, so the
//! per-address rate limit, the refusal tally and the audit log would see
//! one client. The proxy says whom it relays in `X-Forwarded-For`; but
//! anyone can send that header, so it is read only from the peers listed
//! in `--trusted-proxy`, and from them only as far as the trusted hops go:
//! the client is the right-most address in the header that is not itself
//! a trusted proxy (every entry to its left was written by someone the
//! service cannot check). From any other peer the header is ignored.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::http::HeaderMap;
use axum::http::Request;
use ipnet::IpNet;

/// The client's address as the service takes it: the peer's, or the one
/// a trusted proxy forwarded. An extension of every request that came in
/// over a connection (set by the outermost layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClientAddress(pub IpAddr);

/// The proxies whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub(crate) fn new(ranges: Vec<IpNet>) -> TrustedProxies {
        TrustedProxies(ranges)
    }

    fn trusts(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        self.0.iter().any(|range| range.contains(&address))
    }

    /// The client behind `peer`: `peer` itself unless it is a trusted
    /// proxy; else the right-most address of `X-Forwarded-For` (all its
    /// lines, in order) that is not a trusted proxy, or the left-most one
    /// if all are. An entry that is not an address ends the walk at the
    /// last good one: what lies beyond it cannot be checked.
    pub(crate) fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.trusts(peer) {
            return peer;
        }
        let entries: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for entry in entries.iter().rev() {
            let Some(address) = parse_entry(entry) else {
                break;
            };
            client = address;
            if !self.trusts(address) {
                break;
            }
        }
        client
    }

    /// The client of `request`, from its connection's peer address; `None`
    /// for a request that came over no connection (tests' `oneshot`).
    pub(crate) fn client_of<B>(&self, request: &Request<B>) -> Option<IpAddr> {
        let peer = request.extensions().get::<ConnectInfo<SocketAddr>>()?.0;
        Some(self.client(peer.ip(), request.headers()))
    }
}

/// An `X-Forwarded-For` entry: an address, or an address with a port
/// (`1.2.3.4:5678`, `[::1]:5678`), as some proxies write it.
fn parse_entry(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .map(canonical)
}

/// An IPv4 address seen on a dual-stack socket (`::ffff:1.2.3.4`) is the
/// IPv4 address: one client, one key, whichever way it arrived.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// One `--trusted-proxy` value: an address (`10.0.0.5`, `::1`) or a range
/// (`10.0.0.0/8`).
pub fn parse_trusted_proxy(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map(|range| range.trunc())
        .map_err(|_| {
            format!("`{text}` is not an address or a CIDR range (10.0.0.5, 10.0.0.0/8, ::1)")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies(ranges: &[&str]) -> TrustedProxies {
        TrustedProxies::new(
            ranges
                .iter()
                .map(|r| parse_trusted_proxy(r).unwrap())
                .collect(),
        )
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-forwarded-for", value.parse().unwrap());
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn the_header_is_read_only_from_a_trusted_peer_and_only_as_far_as_trusted_hops_go() {
        let trusted = proxies(&["127.0.0.1", "10.0.0.0/8"]);
        let check = |peer: &str, values: &[&str], expected: &str| {
            assert_eq!(
                trusted.client(ip(peer), &forwarded(values)),
                ip(expected),
                "{peer} {values:?}"
            );
        };
        // From an untrusted peer the header is ignored.
        check("203.0.113.9", &["198.51.100.1"], "203.0.113.9");
        // From a trusted one, the right-most untrusted entry: what the
        // client wrote itself (the left-most) is not believed.
        check("127.0.0.1", &["198.51.100.1"], "198.51.100.1");
        check("127.0.0.1", &["6.6.6.6, 198.51.100.1"], "198.51.100.1");
        check(
            "127.0.0.1",
            &["6.6.6.6, 198.51.100.1, 10.1.2.3"],
            "198.51.100.1",
        );
        check(
            "127.0.0.1",
            &["6.6.6.6", "198.51.100.1, 10.1.2.3"],
            "198.51.100.1",
        );
        // Every hop trusted: the left-most.
        check("127.0.0.1", &["10.9.9.9, 10.1.2.3"], "10.9.9.9");
        // No header, or garbage at the right: the last address checked.
        check("127.0.0.1", &[], "127.0.0.1");
        check("127.0.0.1", &["6.6.6.6, not-an-address"], "127.0.0.1");
        check("127.0.0.1", &["[2001:db8::1]:4711"], "2001:db8::1");
        check("::ffff:127.0.0.1", &["198.51.100.1"], "198.51.100.1");
        // No trusted proxies: the peer, always.
        assert_eq!(
            proxies(&[]).client(ip("127.0.0.1"), &forwarded(&["198.51.100.1"])),
            ip("127.0.0.1")
        );
    }

    #[test]
    fn trusted_proxies_are_addresses_or_ranges_and_anything_else_is_named() {
        assert_eq!(
            parse_trusted_proxy("10.0.0.5").unwrap().to_string(),
            "10.0.0.5/32"
        );
        assert_eq!(
            parse_trusted_proxy("10.1.2.3/8").unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(parse_trusted_proxy("::1").unwrap().to_string(), "::1/128");
        let error = parse_trusted_proxy("proxy.example").unwrap_err();
        assert!(error.contains("`proxy.example`"), "{error}");
    }
}
