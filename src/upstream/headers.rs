//! Header hygiene: hop-by-hop headers (RFC 9110 7.6.1) never cross the proxy, in either
//! direction, including every header the `Connection` header names; `X-Forwarded-*` are appended.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that only describe one connection. `Proxy-Connection` is not standard but widely sent.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers and those listed in `Connection`. `Upgrade` goes too: the proxy
/// does not tunnel protocol upgrades.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP.iter() {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Appends this hop to `X-Forwarded-For`, `-Proto` and `-Host` (comma-joined with what the
/// client sent, so earlier hops are kept).
pub fn append_forwarded(
    headers: &mut HeaderMap,
    client_ip: Option<&str>,
    proto: &str,
    host: Option<&str>,
) {
    if let Some(ip) = client_ip {
        append(headers, X_FORWARDED_FOR, ip);
    }
    append(headers, X_FORWARDED_PROTO, proto);
    if let Some(host) = host {
        append(headers, X_FORWARDED_HOST, host);
    }
}

fn append(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    let joined = match headers
        .get_all(&name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
    {
        prior if prior.is_empty() => value.to_string(),
        prior => format!("{}, {value}", prior.join(", ")),
    };
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(name, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn strips_standard_and_connection_named() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret-Hop"),
            ("connection", "x-other"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("trailer", "x-t"),
            ("x-secret-hop", "1"),
            ("x-other", "2"),
            ("authorization", "Bearer end-to-end"),
            ("content-type", "application/json"),
        ]);
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn forwarded_headers_append() {
        let mut h = map(&[("x-forwarded-for", "10.0.0.1")]);
        append_forwarded(&mut h, Some("127.0.0.1"), "http", Some("example.com"));
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.com");
        let mut h = map(&[("x-forwarded-for", "a"), ("x-forwarded-for", "b")]);
        append_forwarded(&mut h, Some("c"), "https", None);
        assert_eq!(h["x-forwarded-for"], "a, b, c");
        assert!(h.get("x-forwarded-host").is_none());
    }
}
