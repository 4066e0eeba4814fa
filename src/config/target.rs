//! The two kinds of upstream address a config names, parsed once: a base URL
//! (`http://host:port/prefix`) and a DNS discovery target (`dns://NAME:PORT`).

use http::uri::Scheme;
use http::Uri;

/// Checks an upstream base URL: `http://host:port` (or `https://`) with an optional path
/// prefix, no query.
pub fn parse_base_url(url: &str) -> Result<Uri, String> {
    let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    match uri.scheme() {
        Some(s) if *s == Scheme::HTTP || *s == Scheme::HTTPS => {}
        _ => return Err("scheme must be http:// or https://".into()),
    }
    if uri.authority().is_none() {
        return Err("missing host".into());
    }
    if uri.query().is_some() {
        return Err("a query string is not allowed".into());
    }
    Ok(uri)
}

/// A checked base URL: the text as written (it names the replica in logs and labels) and its
/// parsed form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    text: String,
    uri: Uri,
}

impl BaseUrl {
    pub fn parse(url: &str) -> Result<BaseUrl, String> {
        Ok(BaseUrl {
            uri: parse_base_url(url)?,
            text: url.to_string(),
        })
    }
    pub fn as_str(&self) -> &str {
        &self.text
    }
    pub fn uri(&self) -> &Uri {
        &self.uri
    }
}

impl std::fmt::Display for BaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// One `dns://NAME:PORT` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsTarget {
    pub host: String,
    pub port: u16,
}

impl DnsTarget {
    pub fn parse(s: &str) -> Result<DnsTarget, String> {
        let rest = s
            .strip_prefix("dns://")
            .ok_or("must look like dns://NAME:PORT")?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or("missing :PORT (the engines' port)")?;
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("bad port `{port}`"))?;
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
        if host.is_empty() || !host.chars().all(valid) {
            return Err(format!("bad host name `{host}`"));
        }
        Ok(DnsTarget {
            host: host.to_string(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        for (url, ok) in [
            ("http://127.0.0.1:8000", true),
            ("http://engine:8000/", true),
            ("http://engine/prefix", true),
            ("https://engine", true),
            ("ftp://engine", false),
            ("engine:8000", false),
            ("http://e/?a=b", false),
        ] {
            assert_eq!(parse_base_url(url).is_ok(), ok, "{url}");
            assert_eq!(BaseUrl::parse(url).is_ok(), ok, "{url}");
        }
    }

    #[test]
    fn targets_parse() {
        assert_eq!(
            DnsTarget::parse("dns://vllm-headless.ns.svc:8000"),
            Ok(DnsTarget {
                host: "vllm-headless.ns.svc".into(),
                port: 8000
            })
        );
        for bad in [
            "http://x:1",
            "dns://x",
            "dns://x:0",
            "dns://x:http",
            "dns://:80",
            "dns://a b:80",
        ] {
            assert!(DnsTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
