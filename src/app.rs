//! Builds metrics, upstreams and the stack; binds listeners; runs; drains.
