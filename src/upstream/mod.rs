//! Upstream: forwarding and header hygiene, pool, balancing.
