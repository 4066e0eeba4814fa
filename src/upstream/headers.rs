//! Header hygiene: hop-by-hop headers (RFC 9110 7.6.1) never cross the proxy, in either
//! direction, including every header the `Connection` header names; `X-Forwarded-For` gets this
//! hop appended to the part of the chain the proxy trusts ([`Forwarded`]).

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

/// The end-to-end headers of a response: without hop-by-hop headers and those listed in
/// `Connection` (`Upgrade` goes too: the proxy does not tunnel protocol upgrades), in a map of
/// their own size. hyper parses a response head into the map its request went out with (room
/// for the client's headers and the forwarding ones), and the client's connection keeps the
/// map of the response it wrote until its next request: for a held stream, its whole life.
/// A stream's head carries `Transfer-Encoding`: its headers are copied (a name or value copy is
/// a reference count) instead of removed by hash one hop-by-hop name at a time.
pub fn end_to_end(headers: HeaderMap) -> HeaderMap {
    // Most messages with a known length carry none: kept as they are, without a copy (a JSON
    // answer's connection is idle again at once, and its next request is parsed into the map).
    if !headers.keys().any(is_hop_by_hop) {
        return headers;
    }
    let named = connection_named(&headers);
    let mut kept = HeaderMap::with_capacity(headers.len());
    // The iterator names an entry's first value only; the others follow it unnamed.
    let mut name: Option<HeaderName> = None;
    for (next, value) in headers {
        if next.is_some() {
            name = next.filter(|n| !is_hop_by_hop(n) && !named.contains(n));
        }
        if let Some(name) = &name {
            kept.append(name, value);
        }
    }
    kept
}

/// A header that only describes one connection (or `Upgrade`, which the proxy does not do).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name == header::UPGRADE
}

/// The names the `Connection` header lists (also hop-by-hop); none without it.
pub fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect()
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// How much of the `X-Forwarded-*` a client sends is believed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Forwarded {
    /// Proxies in front of this one whose `X-Forwarded-For` entries are kept: the last
    /// `trusted_proxies` entries the connection's peer sent (each proxy appends its own peer).
    /// Everything left of them was written by the client and is dropped, so a client cannot
    /// make the upstream believe another address. Default 0: the peer is the client, every
    /// `X-Forwarded-*` it sent is replaced.
    pub trusted_proxies: usize,
}

/// This hop, as the proxy saw it.
#[derive(Debug, Clone)]
pub struct Hop<'a> {
    /// The connection's peer address (its IP as an `X-Forwarded-For` entry).
    pub peer: Option<&'a HeaderValue>,
    /// `http` or `https`: how the client reached the proxy.
    pub proto: &'static str,
    /// The `Host` (or `:authority`) the client asked for.
    pub host: Option<HeaderValue>,
}

impl Forwarded {
    /// Sets `X-Forwarded-For` to the trusted part of the incoming chain plus the peer, and
    /// `X-Forwarded-Proto` / `-Host` to this hop's (a trusted proxy's, when there is one and it
    /// sent them).
    pub fn apply(&self, headers: &mut HeaderMap, hop: Hop<'_>) {
        if self.trusted_proxies == 0 || !headers.contains_key(&X_FORWARDED_FOR) {
            // Nothing of the incoming chain is kept: the chain is the peer alone, as it is
            // (no parsing, joining or copying of the value, which is a reference count).
            headers.remove(&X_FORWARDED_FOR);
            if let Some(peer) = hop.peer {
                headers.insert(X_FORWARDED_FOR, peer.clone());
            }
        } else {
            self.extend_chain(headers, hop.peer);
        }
        let trusted = self.trusted_proxies > 0;
        let proto = HeaderValue::from_static(hop.proto);
        set_unless_trusted(headers, X_FORWARDED_PROTO, Some(proto), trusted);
        set_unless_trusted(headers, X_FORWARDED_HOST, hop.host, trusted);
    }

    /// Whether this hop writes `name` whatever the client sent in it: with no trusted proxy,
    /// every `X-Forwarded-*` header is this hop's alone. A map copied without them can take
    /// [`apply_copied`](Self::apply_copied).
    pub fn replaces(&self, name: &HeaderName) -> bool {
        self.trusted_proxies == 0
            && (name == X_FORWARDED_FOR || name == X_FORWARDED_PROTO || name == X_FORWARDED_HOST)
    }

    /// [`apply`](Self::apply) to a map copied without the headers [`replaces`](Self::replaces)
    /// names: with no trusted proxy there is nothing of the client's to look up or remove
    /// (three hashed look-ups and removals saved per request), this hop's values are added.
    /// The result is `apply`'s on the same map.
    pub fn apply_copied(&self, headers: &mut HeaderMap, hop: Hop<'_>) {
        if self.trusted_proxies > 0 {
            return self.apply(headers, hop);
        }
        if let Some(peer) = hop.peer {
            headers.append(X_FORWARDED_FOR, peer.clone());
        }
        headers.append(X_FORWARDED_PROTO, HeaderValue::from_static(hop.proto));
        if let Some(host) = hop.host {
            headers.append(X_FORWARDED_HOST, host);
        }
    }

    /// The trusted end of the incoming chain, then the peer.
    fn extend_chain(&self, headers: &mut HeaderMap, peer: Option<&HeaderValue>) {
        let mut chain: Vec<String> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(String::from)
            .collect();
        chain.drain(..chain.len().saturating_sub(self.trusted_proxies));
        chain.extend(peer.and_then(|p| p.to_str().ok()).map(String::from));
        headers.remove(&X_FORWARDED_FOR);
        if let Ok(v) = HeaderValue::from_str(&chain.join(", ")) {
            if !chain.is_empty() {
                headers.insert(X_FORWARDED_FOR, v);
            }
        }
    }
}

/// Keeps a trusted proxy's single value of `name`; otherwise this hop's value replaces it.
fn set_unless_trusted(
    headers: &mut HeaderMap,
    name: HeaderName,
    ours: Option<HeaderValue>,
    trusted: bool,
) {
    if trusted && headers.get_all(&name).iter().count() == 1 {
        return;
    }
    headers.remove(&name);
    if let Some(v) = ours {
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
        let h = map(&[
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
        let left = end_to_end(h);
        let left: Vec<&str> = left.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn end_to_end_keeps_every_value_in_order_in_a_map_of_its_size() {
        // (headers in, headers out); a map with nothing to drop is kept as it is.
        type Pairs = &'static [(&'static str, &'static str)];
        let cases: &[(Pairs, Pairs)] = &[
            (&[], &[]),
            (
                &[
                    ("content-type", "text/event-stream"),
                    ("x-request-id", "r1"),
                ],
                &[
                    ("content-type", "text/event-stream"),
                    ("x-request-id", "r1"),
                ],
            ),
            (
                &[
                    ("set-cookie", "a=1"),
                    ("transfer-encoding", "chunked"),
                    ("set-cookie", "b=2"),
                    ("connection", "close"),
                    ("set-cookie", "c=3"),
                    ("date", "x"),
                ],
                &[
                    ("set-cookie", "a=1"),
                    ("set-cookie", "b=2"),
                    ("set-cookie", "c=3"),
                    ("date", "x"),
                ],
            ),
            (
                &[
                    ("te", "a"),
                    ("te", "b"),
                    ("x-hop", "1"),
                    ("x-hop", "2"),
                    ("connection", "x-hop"),
                    ("server", "s"),
                ],
                &[("server", "s")],
            ),
        ];
        for (input, want) in cases {
            // Parsed into a map sized for a request's headers, as hyper does.
            let mut h = HeaderMap::with_capacity(32);
            h.extend(map(input));
            let out = end_to_end(h);
            let got: Vec<(&str, &str)> = out
                .iter()
                .map(|(k, v)| (k.as_str(), v.to_str().unwrap()))
                .collect();
            assert_eq!(&got, want, "{input:?}");
            let copied = input.len() != want.len();
            assert_eq!(
                out.capacity() < 32,
                copied,
                "{input:?}: capacity {}",
                out.capacity()
            );
        }
    }

    fn hop<'a>(peer: &'a HeaderValue, proto: &'static str, host: Option<&str>) -> Hop<'a> {
        Hop {
            peer: Some(peer),
            proto,
            host: host.map(|h| HeaderValue::from_str(h).unwrap()),
        }
    }

    fn ip(text: &'static str) -> HeaderValue {
        HeaderValue::from_static(text)
    }

    #[test]
    fn untrusted_chain_is_replaced_by_the_peer() {
        let mut h = map(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "spoofed.example"),
        ]);
        Forwarded::default().apply(&mut h, hop(&ip("127.0.0.1"), "http", Some("example.com")));
        assert_eq!(h["x-forwarded-for"], "127.0.0.1");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(h["x-forwarded-host"], "example.com");
        let mut h = map(&[("x-forwarded-host", "spoofed.example")]);
        Forwarded::default().apply(&mut h, hop(&ip("::1"), "https", None));
        assert_eq!(h["x-forwarded-for"], "::1");
        assert!(h.get("x-forwarded-host").is_none());
    }

    #[test]
    fn trusted_proxies_keep_their_entries_and_no_more() {
        let two = Forwarded { trusted_proxies: 2 };
        // Over several lines: entries count, not lines.
        let mut h = map(&[
            ("x-forwarded-for", "6.6.6.6, 1.1.1.1"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-proto", "https"),
        ]);
        two.apply(&mut h, hop(&ip("10.0.0.2"), "http", Some("example.com")));
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.1, 10.0.0.2");
        assert_eq!(
            h["x-forwarded-proto"], "https",
            "a trusted proxy's proto is kept"
        );
        assert_eq!(h["x-forwarded-host"], "example.com");
        // Fewer entries than trusted proxies: all kept.
        let mut h = map(&[("x-forwarded-for", "1.1.1.1")]);
        two.apply(&mut h, hop(&ip("10.0.0.2"), "http", None));
        assert_eq!(h["x-forwarded-for"], "1.1.1.1, 10.0.0.2");
        // No header at all: the peer.
        let mut h = HeaderMap::new();
        Forwarded { trusted_proxies: 1 }.apply(&mut h, hop(&ip("10.0.0.2"), "http", None));
        assert_eq!(h["x-forwarded-for"], "10.0.0.2");
    }

    /// Each name's values in order, names sorted: what a header map says, whatever the
    /// order of its entries.
    fn by_name(h: &HeaderMap) -> Vec<(String, Vec<String>)> {
        let mut names: Vec<&HeaderName> = h.keys().collect();
        names.sort_by_key(|n| n.as_str());
        names
            .into_iter()
            .map(|n| {
                let values = h.get_all(n).iter();
                let values = values.map(|v| v.to_str().unwrap().to_owned()).collect();
                (n.as_str().to_owned(), values)
            })
            .collect()
    }

    #[test]
    fn apply_copied_to_a_map_without_what_this_hop_replaces_is_apply() {
        type Pairs = &'static [(&'static str, &'static str)];
        let inputs: &[Pairs] = &[
            &[],
            &[("content-type", "application/json")],
            &[
                ("x-forwarded-for", "6.6.6.6, 1.1.1.1"),
                ("accept", "*/*"),
                ("x-forwarded-for", "10.0.0.1"),
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "spoofed.example"),
            ],
            &[
                ("x-forwarded-proto", "https"),
                ("x-forwarded-proto", "http"),
            ],
        ];
        let peer = ip("10.0.0.2");
        for trusted in [0, 1, 2] {
            let f = Forwarded {
                trusted_proxies: trusted,
            };
            for input in inputs {
                for (peer, host) in [(Some(&peer), Some("example.com")), (None, None)] {
                    let hop = Hop {
                        peer,
                        proto: "https",
                        host: host.map(|h| HeaderValue::from_str(h).unwrap()),
                    };
                    let mut whole = map(input);
                    f.apply(&mut whole, hop.clone());
                    let mut copied = HeaderMap::new();
                    for (name, value) in &map(input) {
                        if !f.replaces(name) {
                            copied.append(name.clone(), value.clone());
                        }
                    }
                    f.apply_copied(&mut copied, hop);
                    assert_eq!(
                        by_name(&copied),
                        by_name(&whole),
                        "{trusted} {input:?} {host:?}"
                    );
                }
            }
        }
    }
}
