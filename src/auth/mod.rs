//! API keys and tenants: which keys are accepted, whose they are, and the tenants'
//! limits. Off unless `[auth]` configures a tenant or a keys file.
//!
//! - [`keys`]: digests, hex, the constant-time lookup (pure).
//! - [`tenant`]: a tenant's name and limits (in-flight, token bucket).
//! - [`file`]: the keys file (`auth.keys_file`), read at startup and on SIGHUP.
//! - this file: [`Auth`], the live state the auth layer reads (`src/layer/auth.rs`).

pub mod file;
pub mod keys;
pub mod tenant;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use tokio::time::Instant;

pub use keys::{digest_of, hex, parse_digest, Digest, KeySet};
pub use tenant::{Tenant, TenantLimits, NO_TENANT};

/// `[auth]`, checked: digests parsed, names valid, no key owned twice, the keys file read.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub keys_file: Option<PathBuf>,
    /// `[auth.tenants]`, in name order.
    pub tenants: Vec<TenantConfig>,
    /// What `keys_file` held when the config was loaded (re-read on SIGHUP).
    pub file_tenants: Vec<TenantConfig>,
}

impl AuthConfig {
    /// Keys are required as soon as a tenant or a keys file is configured.
    pub fn enabled(&self) -> bool {
        self.keys_file.is_some() || !self.tenants.is_empty()
    }
}

/// One tenant: its name (the `tenant` label value), key digests and limits.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantConfig {
    pub name: String,
    pub keys: Vec<Digest>,
    pub limits: TenantLimits,
}

impl std::fmt::Debug for TenantConfig {
    /// Digests are not secrets, but nobody needs them in a debug print either.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantConfig")
            .field("name", &self.name)
            .field("keys", &self.keys.len())
            .field("limits", &self.limits)
            .finish()
    }
}

/// Most tenants (config and keys file together): each is a `tenant` label value.
pub const MAX_TENANTS: usize = 256;

/// Whether `name` can be a tenant (and so a label value): 1 to 64 of `A-Z a-z 0-9 _ - .`,
/// and not the reserved [`NO_TENANT`].
pub fn check_tenant_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("tenant name `{name}`: 1 to 64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err(format!(
            "tenant name `{name}`: letters, digits, `_`, `-` and `.` only"
        ));
    }
    if name == NO_TENANT {
        return Err(format!(
            "tenant name `{NO_TENANT}` is reserved (the label of requests without a tenant)"
        ));
    }
    Ok(())
}

/// `goodput-proxy hash-key`: the digest (hex) of the key on stdin; one trailing line end is
/// not part of the key (`echo "$KEY" |` works as well as `printf %s "$KEY" |`).
pub fn hash_key_input(input: &str) -> Result<String, String> {
    let key = input
        .strip_suffix('\n')
        .map(|k| k.strip_suffix('\r').unwrap_or(k))
        .unwrap_or(input);
    if key.is_empty() {
        return Err("no key on stdin".into());
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a key is visible ASCII without spaces (it travels in an HTTP header)".into());
    }
    Ok(hex(&digest_of(key.as_bytes())))
}

/// A new random key: `gp-` and 256 random bits in hex.
pub fn generate_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("gp-{}", hex(&bytes))
}

/// The live key set and tenants. Tenants are kept by name for the life of the process, so a
/// reload never resets a tenant's limits state (and the label set only grows, bounded by
/// [`MAX_TENANTS`] at every load).
#[derive(Debug)]
pub struct Auth {
    config: AuthConfig,
    keys: RwLock<Arc<KeySet>>,
    tenants: Mutex<BTreeMap<String, Arc<Tenant>>>,
}

impl Auth {
    /// `None` when auth is off (no tenant, no keys file). `file_tenants`: what the keys file
    /// held at startup (already read and checked by the config).
    pub fn new(config: &AuthConfig) -> Option<Arc<Auth>> {
        if !config.enabled() {
            return None;
        }
        let auth = Auth {
            config: config.clone(),
            keys: RwLock::new(Arc::new(KeySet::default())),
            tenants: Mutex::new(BTreeMap::new()),
        };
        auth.install(&config.file_tenants);
        Some(Arc::new(auth))
    }

    /// The tenant owning `key`.
    pub fn lookup(&self, key: &[u8]) -> Option<Arc<Tenant>> {
        let keys = match self.keys.read() {
            Ok(k) => k.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        keys.lookup(key).cloned()
    }

    /// Every tenant name known so far (the `tenant` label values besides `none`).
    pub fn tenant_names(&self) -> Vec<String> {
        lock(&self.tenants).keys().cloned().collect()
    }

    /// Re-reads the keys file; on any problem the keys in use stay. Returns what was loaded.
    pub fn reload(&self) -> Result<String, String> {
        let Some(path) = &self.config.keys_file else {
            return Ok("no keys file".into());
        };
        let from_file = file::load(path, &self.config.tenants).map_err(|p| p.join("; "))?;
        let keys = self.install(&from_file);
        Ok(format!("{keys} keys from {}", path.display()))
    }

    /// Builds and installs the key set of the config's tenants plus `from_file`; returns the
    /// number of keys.
    fn install(&self, from_file: &[TenantConfig]) -> usize {
        let now = Instant::now();
        let mut tenants = lock(&self.tenants);
        let mut pairs = Vec::new();
        for t in self.config.tenants.iter().chain(from_file) {
            let limits = self.limits_of(&t.name);
            let tenant = tenants
                .entry(t.name.clone())
                .or_insert_with(|| Arc::new(Tenant::with_limits(&t.name, limits, now)))
                .clone();
            tenant.set_limits(limits, now);
            pairs.extend(t.keys.iter().map(|d| (*d, tenant.clone())));
        }
        let set = Arc::new(KeySet::new(pairs));
        let n = set.len();
        match self.keys.write() {
            Ok(mut k) => *k = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
        n
    }

    /// A tenant's limits come from the config only (the keys file holds keys).
    fn limits_of(&self, name: &str) -> TenantLimits {
        self.config
            .tenants
            .iter()
            .find(|t| t.name == name)
            .map(|t| t.limits)
            .unwrap_or_default()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_key_takes_one_line() {
        let want = hex(&digest_of(b"sk-1"));
        assert_eq!(hash_key_input("sk-1").unwrap(), want);
        assert_eq!(hash_key_input("sk-1\n").unwrap(), want);
        assert_eq!(hash_key_input("sk-1\r\n").unwrap(), want);
        assert!(hash_key_input("").is_err());
        assert!(hash_key_input("\n").is_err());
        assert!(hash_key_input("sk 1").is_err());
        assert!(hash_key_input("sk-1\n\n").is_err());
        let k = generate_key();
        assert_eq!(k.len(), 3 + 64);
        assert_ne!(k, generate_key());
        assert!(hash_key_input(&k).is_ok());
    }

    #[test]
    fn tenant_names() {
        for ok in ["team-a", "A.b_c-9", &"x".repeat(64)] {
            assert!(check_tenant_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "none",
            "has space",
            "ä",
            &"x".repeat(65),
            "a{b}",
            "a\"b",
        ] {
            assert!(check_tenant_name(bad).is_err(), "{bad}");
        }
    }
}
