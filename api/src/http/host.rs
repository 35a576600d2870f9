//! Which `Host` a request may name: the defence against DNS rebinding. A page of another site
//! can make its own name resolve to this node's address, and the browser then sends that page's
//! requests here with the attacker's name in `Host` (and in `Origin`, so a same-origin check
//! alone passes). So a request must name the node by an IP address, by `localhost`, or by one of
//! the names in `http.allowed_hosts` (what clients and the proxy in front use); any other name
//! is answered 421 before anything else runs. A request with no `Host` (HTTP/1.0) comes from no
//! browser page and passes.

use std::net::IpAddr;

use hyper::HeaderMap;
use hyper::StatusCode;

use super::error::ApiError;

/// Names in `http.allowed_hosts` at most.
pub const ALLOWED_HOSTS_MAX: usize = 64;
/// A host name's bytes at most (DNS).
const HOST_NAME_BYTES_MAX: usize = 253;

/// Refuses a request whose `Host` names this node by a name it does not know.
pub fn check(headers: &HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    let Some(value) = headers.get(hyper::header::HOST) else {
        return Ok(());
    };
    let unknown = |shown: &str| {
        ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "unknown_host",
            format!(
                "host {shown:?} is not a name of this node: add it to http.allowed_hosts (IP \
                 addresses and localhost are always accepted)"
            ),
        )
    };
    let text = value.to_str().map_err(|_| unknown("(not text)"))?;
    let name = host_name(text).to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    let known = name.parse::<IpAddr>().is_ok()
        || name == "localhost"
        || allowed
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(name));
    if known { Ok(()) } else { Err(unknown(text)) }
}

/// The name of a `Host` value without its port; an IPv6 literal without its brackets.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(address, _)| address);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Checks one entry of `http.allowed_hosts`: a DNS name (letters, digits, `-` and `.`), no port.
pub fn check_allowed_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= HOST_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !name.starts_with('.')
        && !name.contains("..");
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a host name (letters, digits, '-' and '.', no port, at most \
             {HOST_NAME_BYTES_MAX} bytes)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_host(host: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(hyper::header::HOST, host.parse().expect("a header value"));
        headers
    }

    #[test]
    fn only_addresses_localhost_and_the_allowed_names_pass() {
        let allowed = vec!["reins.example.com".to_owned()];
        for good in [
            "127.0.0.1:7420",
            "10.1.2.3",
            "[::1]:7420",
            "[fd00::1]",
            "localhost:7420",
            "LOCALHOST",
            "reins.example.com",
            "Reins.Example.com:443",
            "reins.example.com.",
        ] {
            assert!(check(&with_host(good), &allowed).is_ok(), "{good}");
        }
        assert!(check(&HeaderMap::new(), &allowed).is_ok());
        for bad in [
            "rebind.attacker.example",
            "rebind.attacker.example:7420",
            "reins.example.com.attacker.example",
            "example.com",
            "x",
            "127.0.0.1.nip.io",
        ] {
            let error = check(&with_host(bad), &allowed).expect_err(bad);
            assert_eq!(error.status, StatusCode::MISDIRECTED_REQUEST, "{bad}");
            assert!(
                error.message.contains("http.allowed_hosts"),
                "{}",
                error.message
            );
        }
    }

    #[test]
    fn allowed_names_are_plain_dns_names() {
        assert!(check_allowed_name("reins.example.com").is_ok());
        for bad in [
            "",
            "reins.example.com:443",
            "*.example.com",
            ".example.com",
            "a..b",
            "a b",
        ] {
            assert!(check_allowed_name(bad).is_err(), "{bad}");
        }
        assert!(check_allowed_name(&"a".repeat(254)).is_err());
    }
}
