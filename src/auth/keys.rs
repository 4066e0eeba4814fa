//! API keys as the proxy keeps them: SHA-256 digests (never the keys), each naming a tenant,
//! and the constant-time lookup of a presented key. Pure: no I/O, no clock.
//!
//! Lookup hashes the presented key once, then compares the digest with EVERY configured
//! digest in constant time (`subtle`), selecting the match without a branch: how long it takes
//! depends on the number of keys, not on which key matched or how many leading bytes agreed.
//! The cost is one 32-byte comparison per configured key per request; deployments with tens
//! of thousands of keys would want a keyed index instead.

use std::sync::Arc;

use ring::digest::{digest, SHA256};
use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

use super::tenant::Tenant;

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// The SHA-256 digest of a key as presented (its bytes, nothing trimmed).
pub fn digest_of(key: &[u8]) -> Digest {
    let d = digest(&SHA256, key);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Lowercase hex of a digest: what `goodput-proxy hash-key` prints and the config holds.
pub fn hex(d: &Digest) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(64);
    for b in d {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 0xf) as usize] as char);
    }
    s
}

/// Parses a configured digest: 64 hex digits (either case), optionally prefixed `sha256:`.
pub fn parse_digest(s: &str) -> Result<Digest, String> {
    let h = s.strip_prefix("sha256:").unwrap_or(s);
    if h.len() != 64 {
        return Err(format!(
            "a SHA-256 digest is 64 hex digits (got {} characters; `goodput-proxy hash-key` makes one)",
            h.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, pair) in h.as_bytes().chunks_exact(2).enumerate() {
        let hi = hex_value(pair[0]);
        let lo = hex_value(pair[1]);
        match (hi, lo) {
            (Some(hi), Some(lo)) => out[i] = hi << 4 | lo,
            _ => return Err("a SHA-256 digest is hex digits only".into()),
        }
    }
    Ok(out)
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// The accepted keys: digest -> tenant. Built at startup and on each keys-file reload.
#[derive(Debug, Default)]
pub struct KeySet {
    digests: Vec<Digest>,
    /// Index into `tenants`, one per digest.
    owner: Vec<u32>,
    tenants: Vec<Arc<Tenant>>,
}

impl KeySet {
    /// `keys`: (digest, tenant) pairs; a tenant may own several keys.
    pub fn new(keys: impl IntoIterator<Item = (Digest, Arc<Tenant>)>) -> KeySet {
        let mut set = KeySet::default();
        for (d, t) in keys {
            let idx = match set.tenants.iter().position(|x| Arc::ptr_eq(x, &t)) {
                Some(i) => i,
                None => {
                    set.tenants.push(t);
                    set.tenants.len() - 1
                }
            };
            set.digests.push(d);
            set.owner.push(idx as u32);
        }
        set
    }

    pub fn len(&self) -> usize {
        self.digests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// The tenant owning `key`, in time that depends only on the number of keys.
    pub fn lookup(&self, key: &[u8]) -> Option<&Arc<Tenant>> {
        let presented = digest_of(key);
        let mut found = Choice::from(0);
        let mut owner = 0u32;
        for (d, o) in self.digests.iter().zip(&self.owner) {
            let eq = d[..].ct_eq(&presented[..]);
            owner = u32::conditional_select(&owner, o, eq);
            found |= eq;
        }
        if bool::from(found) {
            self.tenants.get(owner as usize)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known_answer_and_hex_round_trip() {
        // FIPS 180-2 test vector.
        let d = digest_of(b"abc");
        let h = hex(&d);
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(parse_digest(&h), Ok(d));
        assert_eq!(parse_digest(&h.to_uppercase()), Ok(d));
        assert_eq!(parse_digest(&format!("sha256:{h}")), Ok(d));
    }

    #[test]
    fn bad_digests_say_why() {
        for (s, want) in [
            ("", "64 hex digits"),
            ("abc", "got 3 characters"),
            (&"g".repeat(64), "hex digits only"),
            (&"0".repeat(65), "got 65"),
            (&format!("md5:{}", "0".repeat(64)), "got 68"),
        ] {
            let e = parse_digest(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn lookup_finds_the_owner_of_each_key_and_nothing_else() {
        let a = Arc::new(Tenant::new("team-a"));
        let b = Arc::new(Tenant::new("team-b"));
        let set = KeySet::new([
            (digest_of(b"key-a1"), a.clone()),
            (digest_of(b"key-b"), b.clone()),
            (digest_of(b"key-a2"), a.clone()),
        ]);
        assert_eq!(set.len(), 3);
        let name = |k: &[u8]| set.lookup(k).map(|t| t.name.to_string());
        assert_eq!(name(b"key-a1").as_deref(), Some("team-a"));
        assert_eq!(name(b"key-a2").as_deref(), Some("team-a"));
        assert_eq!(name(b"key-b").as_deref(), Some("team-b"));
        assert_eq!(name(b"key-c"), None);
        assert_eq!(name(b""), None);
        assert_eq!(name(b"key-a1 "), None, "nothing is trimmed");
        assert!(KeySet::default().lookup(b"key-a1").is_none());
    }
}
