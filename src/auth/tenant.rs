//! A tenant: the name its keys map to (the `tenant` label and record field) and its limits,
//! shared by every request of the tenant and kept across keys-file reloads (a reload that
//! moves a key keeps the tenant's bucket and in-flight count).
//!
//! Limits (both optional, per tenant, `[auth.tenants.NAME]`):
//! - `max_in_flight`: requests of the tenant in flight (until their response body ends);
//!   beyond, 429 `requests` at once.
//! - `tokens_per_minute`: a token bucket of that capacity, refilled continuously at
//!   `tokens_per_minute / 60` per second. A request is ADMITTED while the bucket is not empty
//!   and CHARGED afterwards with what it actually used (prompt + completion tokens, from the
//!   record), so the bucket can go into debt; while it is in debt new requests get 429
//!   `tokens` with `Retry-After` = the seconds until it is positive again. Why after: the
//!   decision is taken before the body is read (no work is spent on a request that is
//!   refused) and the charge is exact (a `max_tokens` charged up front overcharges every
//!   request that stops early and undercharges requests without one). The price: requests
//!   admitted together can overshoot the budget by what they use; `max_in_flight` bounds how
//!   many can be admitted at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The `tenant` label of a request without one (no auth, or a request auth refused).
pub const NO_TENANT: &str = "none";

/// One tenant's configured limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    pub max_in_flight: Option<usize>,
    pub tokens_per_minute: Option<u64>,
}

/// Why a tenant's request was refused (429).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_in_flight` reached.
    InFlight { limit: usize },
    /// The token bucket is in debt; `retry_after_s` until it is positive again.
    Tokens { limit: u64, retry_after_s: u64 },
}

#[derive(Debug)]
pub struct Tenant {
    pub name: Arc<str>,
    limits: Mutex<TenantLimits>,
    in_flight: Mutex<Option<Arc<Semaphore>>>,
    bucket: Mutex<Option<Bucket>>,
}

/// What a request of a tenant holds until its response body ends (the in-flight permit).
#[derive(Debug)]
pub struct Admission {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Tenant {
    /// A tenant without limits.
    pub fn new(name: &str) -> Tenant {
        Tenant {
            name: Arc::from(name),
            limits: Mutex::new(TenantLimits::default()),
            in_flight: Mutex::new(None),
            bucket: Mutex::new(None),
        }
    }

    pub fn with_limits(name: &str, limits: TenantLimits, now: Instant) -> Tenant {
        let t = Tenant::new(name);
        t.set_limits(limits, now);
        t
    }

    pub fn limits(&self) -> TenantLimits {
        *lock(&self.limits)
    }

    /// Applies (new) limits; unchanged limits keep their state (a reload does not refill a
    /// bucket or forget requests in flight).
    pub fn set_limits(&self, limits: TenantLimits, now: Instant) {
        let mut current = lock(&self.limits);
        let first = lock(&self.in_flight).is_none() && lock(&self.bucket).is_none();
        if *current == limits && !first {
            return;
        }
        if current.max_in_flight != limits.max_in_flight || first {
            *lock(&self.in_flight) = limits.max_in_flight.map(|n| Arc::new(Semaphore::new(n)));
        }
        if current.tokens_per_minute != limits.tokens_per_minute || first {
            *lock(&self.bucket) = limits.tokens_per_minute.map(|tpm| Bucket::new(tpm, now));
        }
        *current = limits;
    }

    /// Admits one request at `now`, or says why not. The token budget is checked first: a
    /// refused request must not take an in-flight permit.
    pub fn admit(&self, now: Instant) -> Result<Admission, Refusal> {
        if let Some(b) = lock(&self.bucket).as_mut() {
            b.admit(now)?;
        }
        let permits = lock(&self.in_flight).clone();
        let permit = match permits {
            Some(sem) => match sem.try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    return Err(Refusal::InFlight {
                        limit: self.limits().max_in_flight.unwrap_or(0),
                    })
                }
            },
            None => None,
        };
        Ok(Admission { _permit: permit })
    }

    /// A finished request used `tokens` (prompt + completion): taken from the bucket.
    pub fn charge(&self, tokens: u64, now: Instant) {
        if let Some(b) = lock(&self.bucket).as_mut() {
            b.charge(tokens, now);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A token bucket that may go into debt (see the module comment).
#[derive(Debug, Clone)]
struct Bucket {
    capacity: f64,
    per_second: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(tokens_per_minute: u64, now: Instant) -> Bucket {
        let capacity = tokens_per_minute as f64;
        Bucket {
            capacity,
            per_second: capacity / 60.0,
            level: capacity,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.per_second).min(self.capacity);
        self.at = now;
    }

    fn admit(&mut self, now: Instant) -> Result<(), Refusal> {
        self.refill(now);
        if self.level > 0.0 {
            return Ok(());
        }
        // Whole seconds until the level is above 0 again (at least 1: `Retry-After: 0` would
        // invite an immediate retry that fails the same way).
        let wait = Duration::from_secs_f64((-self.level + 1.0) / self.per_second.max(1e-9));
        Err(Refusal::Tokens {
            limit: self.capacity as u64,
            retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
        })
    }

    fn charge(&mut self, tokens: u64, now: Instant) {
        self.refill(now);
        self.level -= tokens as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_in_flight: Option<usize>, tpm: Option<u64>) -> TenantLimits {
        TenantLimits {
            max_in_flight,
            tokens_per_minute: tpm,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_limit_refuses_beyond_and_frees_on_drop() {
        let t = Tenant::with_limits("a", limits(Some(2), None), Instant::now());
        let a = t.admit(Instant::now()).unwrap();
        let _b = t.admit(Instant::now()).unwrap();
        assert_eq!(
            t.admit(Instant::now()).unwrap_err(),
            Refusal::InFlight { limit: 2 }
        );
        drop(a);
        assert!(t.admit(Instant::now()).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_bucket_admits_until_in_debt_and_refills_at_the_rate() {
        // 600 per minute: 10 per second.
        let t = Tenant::with_limits("a", limits(None, Some(600)), Instant::now());
        assert!(t.admit(Instant::now()).is_ok(), "starts full");
        t.charge(550, Instant::now());
        assert!(t.admit(Instant::now()).is_ok(), "50 left");
        t.charge(250, Instant::now()); // level -200
        match t.admit(Instant::now()) {
            // (200 + 1) / 10 per second = 20.1 s, rounded up.
            Err(Refusal::Tokens {
                limit: 600,
                retry_after_s: 21,
            }) => {}
            other => panic!("{other:?}"),
        }
        tokio::time::advance(Duration::from_secs(19)).await;
        assert!(t.admit(Instant::now()).is_err(), "-10 after 19 s");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(t.admit(Instant::now()).is_ok(), "+10 after 21 s");
        // Refill stops at the capacity.
        tokio::time::advance(Duration::from_secs(3600)).await;
        t.charge(600, Instant::now());
        assert!(
            t.admit(Instant::now()).is_err(),
            "capacity, not an hour's worth"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_token_request_takes_no_permit() {
        let t = Tenant::with_limits("a", limits(Some(1), Some(60)), Instant::now());
        t.charge(61, Instant::now());
        assert!(matches!(
            t.admit(Instant::now()),
            Err(Refusal::Tokens { .. })
        ));
        tokio::time::advance(Duration::from_secs(3)).await;
        let held = t.admit(Instant::now()).unwrap();
        assert_eq!(
            t.admit(Instant::now()).unwrap_err(),
            Refusal::InFlight { limit: 1 }
        );
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn same_limits_on_reload_keep_state_new_ones_reset_it() {
        let t = Tenant::with_limits("a", limits(Some(1), Some(60)), Instant::now());
        let held = t.admit(Instant::now()).unwrap();
        t.set_limits(limits(Some(1), Some(60)), Instant::now());
        assert!(t.admit(Instant::now()).is_err(), "the permit is still held");
        t.set_limits(limits(Some(2), Some(60)), Instant::now());
        assert!(t.admit(Instant::now()).is_ok(), "a new in-flight limit");
        drop(held);
        t.set_limits(limits(None, None), Instant::now());
        t.charge(1_000_000, Instant::now());
        assert!(
            t.admit(Instant::now()).is_ok(),
            "no limits: always admitted"
        );
    }
}
