//! client: who a request without an API key is, for anonymous limits. Pure.
//!
//! The client address is the socket's peer, unless the peer is a trusted proxy
//! (`limits.trusted_proxies`): then it is the right-most address of `X-Forwarded-For` that is not
//! trusted. Only trusted proxies append to that list, so everything left of the last untrusted entry
//! may be made up by the client and is never used. An entry that is not an address stops the walk at
//! the last trusted hop (counting that hop's requests together is safe; trusting a made-up entry is
//! not). IPv6 clients are grouped by a prefix (`limits.ipv6_prefix`, default /64): one host is
//! handed a whole /64, and counting per address would let it use 2^64 of them.

use std::net::IpAddr;

use http::HeaderMap;
use ipnet::IpNet;

use super::headers::X_FORWARDED_FOR;
use crate::config::ConfigError;

/// The trusted proxies, as configured: comma-separated CIDRs or single addresses.
pub fn parse_trusted(list: &str) -> Result<Vec<IpNet>, ConfigError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<IpNet>()
                .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    ConfigError::option(
                        "limits.trusted_proxies",
                        format!("{s:?} is not an address or a CIDR (such as 10.0.0.0/8)"),
                    )
                })
        })
        .collect()
}

fn trusted(nets: &[IpNet], ip: IpAddr) -> bool {
    nets.iter().any(|n| n.contains(&ip))
}

/// One `X-Forwarded-For` entry: an address, possibly with a port (`1.2.3.4:80`, `[::1]:80`).
fn entry_address(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()))
        .map(|ip| ip.to_canonical())
}

/// The client's address (see the module comment).
pub fn client_address(peer: IpAddr, headers: &HeaderMap, trusted_proxies: &[IpNet]) -> IpAddr {
    let peer = peer.to_canonical();
    if !trusted(trusted_proxies, peer) {
        return peer;
    }
    let mut last_trusted = peer;
    let lines: Vec<&[u8]> = headers
        .get_all(X_FORWARDED_FOR)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    for line in lines.iter().rev() {
        let Ok(line) = std::str::from_utf8(line) else {
            return last_trusted;
        };
        for entry in line.rsplit(',') {
            let Some(ip) = entry_address(entry) else {
                return last_trusted;
            };
            if !trusted(trusted_proxies, ip) {
                return ip;
            }
            last_trusted = ip;
        }
    }
    last_trusted
}

/// The group an address is counted in: itself for IPv4, its `/prefix` network for IPv6.
pub fn group(ip: IpAddr, ipv6_prefix: u8) -> IpNet {
    match ip {
        IpAddr::V4(v4) => IpNet::from(IpAddr::V4(v4)),
        IpAddr::V6(v6) => ipnet::Ipv6Net::new(v6, ipv6_prefix.min(128))
            .map(|n| IpNet::V6(n.trunc()))
            .unwrap_or_else(|_| IpNet::from(IpAddr::V6(v6))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn xff(lines: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for l in lines {
            h.append(X_FORWARDED_FOR, HeaderValue::from_str(l).unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let t = parse_trusted("10.0.0.0/8").unwrap();
        assert_eq!(
            client_address(ip("203.0.113.9"), &xff(&["1.1.1.1"]), &t),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &xff(&["1.1.1.1"]), &[]),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_entry_is_the_client() {
        let t = parse_trusted("10.0.0.0/8, 192.168.1.1").unwrap();
        let h = xff(&["6.6.6.6, 203.0.113.9", "10.1.1.1, 192.168.1.1"]);
        assert_eq!(
            client_address(ip("10.0.0.1"), &h, &t),
            ip("203.0.113.9"),
            "6.6.6.6 is the client's own claim"
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &xff(&["203.0.113.9:4711"]), &t),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &xff(&["[2001:db8::1]:80"]), &t),
            ip("2001:db8::1")
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &HeaderMap::new(), &t),
            ip("10.0.0.1"),
            "no list: the proxy itself"
        );
        assert_eq!(
            client_address(ip("10.0.0.1"), &xff(&["10.2.2.2"]), &t),
            ip("10.2.2.2"),
            "all trusted: the left-most"
        );
        assert_eq!(
            client_address(
                ip("10.0.0.1"),
                &xff(&["203.0.113.9, garbage, 10.3.3.3"]),
                &t
            ),
            ip("10.3.3.3"),
            "a bad entry stops the walk at the last trusted hop"
        );
        assert_eq!(
            client_address(ip("::ffff:10.0.0.1"), &xff(&["::ffff:203.0.113.9"]), &t),
            ip("203.0.113.9"),
            "IPv4-mapped addresses are IPv4"
        );
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix() {
        assert_eq!(
            group(ip("2001:db8:1:2:3:4:5:6"), 64).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            group(ip("2001:db8:1:2:ffff::1"), 64),
            group(ip("2001:db8:1:2::9"), 64)
        );
        assert_eq!(group(ip("2001:db8::1"), 128).to_string(), "2001:db8::1/128");
        assert_eq!(group(ip("192.0.2.7"), 64).to_string(), "192.0.2.7/32");
    }

    #[test]
    fn bad_trusted_lists_are_refused() {
        assert!(parse_trusted("").unwrap().is_empty());
        assert_eq!(parse_trusted("10.0.0.0/8,::1/128").unwrap().len(), 2);
        let e = parse_trusted("10.0.0.0/33").unwrap_err();
        assert_eq!(e.option_name(), Some("limits.trusted_proxies"));
        assert!(
            e.reason()
                .starts_with("\"10.0.0.0/33\" is not an address or a CIDR"),
            "{e}"
        );
    }
}
