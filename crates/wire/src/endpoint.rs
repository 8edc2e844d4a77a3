//! tcp:// endpoint parsing with the rules the load protocol depends on: bracketed IPv6 only
//! (a bare `::1:5557` is ambiguous), and wildcard detection on the *parsed* host (a substring
//! test would call every IPv6 address a wildcard, because each contains `::`).

use std::net::Ipv6Addr;
use thiserror::Error;

/// Hosts a PUB binds on rather than connects to.
pub const WILDCARD_HOSTS: [&str; 3] = ["*", "0.0.0.0", "::"];

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EndpointError {
    #[error("{0:?}: expected a tcp:// endpoint (tcp://HOST:PORT)")]
    NotTcp(String),
    #[error("{0:?}: missing port (expected tcp://HOST:PORT)")]
    MissingPort(String),
    #[error("{0:?}: empty host (expected tcp://HOST:PORT, e.g. tcp://*:5557)")]
    EmptyHost(String),
    #[error("{0:?}: bare IPv6 host is ambiguous; bracket it, e.g. tcp://[::1]:5557")]
    BareIpv6(String),
    #[error("{0:?}: host inside brackets is not an IPv6 address")]
    BadIpv6(String),
    #[error("{0:?}: port must be an integer in 1..=65535")]
    BadPort(String),
}

/// A parsed tcp endpoint. `host` is stored without brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpEndpoint {
    pub host: String,
    pub port: u16,
}

impl TcpEndpoint {
    /// Parses `tcp://HOST:PORT` (HOST may be `*`, a name, IPv4 or bracketed IPv6).
    pub fn parse(endpoint: &str) -> Result<Self, EndpointError> {
        let err = |f: fn(String) -> EndpointError| f(endpoint.to_string());
        let rest = endpoint
            .strip_prefix("tcp://")
            .ok_or_else(|| err(EndpointError::NotTcp))?;
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let close = inner.find(']').ok_or_else(|| err(EndpointError::BadIpv6))?;
            let host = &inner[..close];
            if host.parse::<Ipv6Addr>().is_err() {
                return Err(err(EndpointError::BadIpv6));
            }
            let port = inner[close + 1..]
                .strip_prefix(':')
                .ok_or_else(|| err(EndpointError::MissingPort))?;
            (host, port)
        } else {
            let (host, port) = rest
                .rsplit_once(':')
                .ok_or_else(|| err(EndpointError::MissingPort))?;
            if host.is_empty() {
                return Err(err(EndpointError::EmptyHost));
            }
            if host.contains(':') {
                return Err(err(EndpointError::BareIpv6));
            }
            (host, port)
        };
        if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.len() > 5 {
            return Err(err(EndpointError::BadPort));
        }
        let port: u32 = port.parse().map_err(|_| err(EndpointError::BadPort))?;
        if port == 0 || port > 65535 {
            return Err(err(EndpointError::BadPort));
        }
        Ok(TcpEndpoint {
            host: host.to_string(),
            port: port as u16,
        })
    }

    /// True when a PUB would bind this host (`*`, `0.0.0.0`, `::`).
    pub fn is_wildcard(&self) -> bool {
        WILDCARD_HOSTS.contains(&self.host.as_str())
    }

    pub fn is_ipv6(&self) -> bool {
        self.host.parse::<Ipv6Addr>().is_ok()
    }

    /// The host as it goes into a URL or endpoint (IPv6 re-bracketed).
    pub fn url_host(&self) -> String {
        url_host(&self.host)
    }
}

/// Brackets an IPv6 literal; passes other hosts through (already bracketed ones too).
pub fn url_host(host: &str) -> String {
    if host.parse::<Ipv6Addr>().is_ok() {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// `tcp://HOST:PORT` with IPv6 bracketed.
pub fn tcp_endpoint(host: &str, port: u16) -> String {
    format!("tcp://{}:{port}", url_host(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_classifies() {
        let e = TcpEndpoint::parse("tcp://[::]:5557").unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.is_wildcard()),
            ("::", 5557, true)
        );
        let e = TcpEndpoint::parse("tcp://[2001:db8::1]:5557").unwrap();
        assert!(
            !e.is_wildcard(),
            "a concrete IPv6 host contains '::' but is not a wildcard"
        );
        assert_eq!(e.url_host(), "[2001:db8::1]");
        assert!(TcpEndpoint::parse("tcp://*:1").unwrap().is_wildcard());
        assert!(
            !TcpEndpoint::parse("tcp://10.0.0.1:5557")
                .unwrap()
                .is_wildcard()
        );
        assert_eq!(
            TcpEndpoint::parse("tcp://::1:5557"),
            Err(EndpointError::BareIpv6("tcp://::1:5557".into()))
        );
        assert!(matches!(
            TcpEndpoint::parse("ipc:///tmp/x"),
            Err(EndpointError::NotTcp(_))
        ));
        assert!(matches!(
            TcpEndpoint::parse("tcp://*:65536"),
            Err(EndpointError::BadPort(_))
        ));
        assert!(matches!(
            TcpEndpoint::parse("tcp://*:0"),
            Err(EndpointError::BadPort(_))
        ));
        assert!(matches!(
            TcpEndpoint::parse("tcp://*"),
            Err(EndpointError::MissingPort(_))
        ));
        assert!(matches!(
            TcpEndpoint::parse("tcp://:5557"),
            Err(EndpointError::EmptyHost(_))
        ));
        assert!(matches!(
            TcpEndpoint::parse("tcp://[zz]:5557"),
            Err(EndpointError::BadIpv6(_))
        ));
        assert_eq!(tcp_endpoint("::1", 9), "tcp://[::1]:9");
    }
}
