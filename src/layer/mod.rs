//! Tower layers, one concern each. `stack.rs` says in which order they run and why.

pub mod access_log;
pub mod collect;
pub mod error_response;
pub mod hold;
pub mod limit;
pub mod meter;
pub mod request_id;
pub mod route;

/// The boxed future every layer here returns: layers are small and the box keeps their types
/// readable; one allocation per layer per request is noise next to a network hop.
pub type BoxFuture<T, E> = futures_util::future::BoxFuture<'static, Result<T, E>>;
