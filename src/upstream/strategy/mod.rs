//! The replica choice for one request, by `[balance] strategy` (docs/routing.md):
//!
//! - `p2c`: two random candidates, fewer requests in flight plus engine queue wins: near
//!   least-loaded without the herd behaviour of always picking the global minimum. A request
//!   waiting in the engine queue counts twice on purpose: at equal in-flight the replica whose
//!   engine already queues loses, and traffic it gets from elsewhere shows up at all.
//! - `prefix`: the replicas that recently served the request's longest prefix (at least
//!   `prefix_min_blocks` blocks) are tried first, the most recent first, unless all are
//!   saturated ("sticky until saturated"); otherwise power of two choices on load in tokens
//!   (and the replica chosen becomes the prefix's most recent holder: it moves there).
//! - `goodput`: power of two choices on load in tokens divided by the replica's recent SLO
//!   attainment (to the power `attainment_weight`), plus an `exploration` share sent to a
//!   random replica (not saturated) while attainments differ, so that a replica that
//!   recovered earns traffic back.
//! - `auto`: `prefix` among the replicas whose attainment is within 0.4 of the best, `goodput`
//!   otherwise, with the same exploration share.
//!
//! Load in tokens of a replica: the estimated prompt and output tokens of this proxy's requests
//! in flight there, plus the engine's waiting queue counted in requests like this one. Healthy
//! replicas are preferred; when none is healthy every candidate is tried.
//!
//! [`decide`] (`decide.rs`) is the pure core (candidates and the prefix lookup in, a choice
//! out), table-tested and checked against simpler paths on random fleets; [`Balancer`]
//! (`balancer.rs`) adds the prefix index, the per-thread buffers and the counters around it.

mod balancer;
mod decide;
#[cfg(test)]
mod fixtures;

pub use balancer::{Balancer, Belief};
pub use decide::{decide, release_cause, Ask, Cand, Choice, Room};

/// Why a replica was chosen (the `reason` label of `goodput_proxy_route_decisions_total` and
/// the record's `route_reason`).
pub use goodput_measure::record::RouteReason as Reason;
