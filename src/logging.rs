//! Tracing setup: text or JSON logs, access lines.
