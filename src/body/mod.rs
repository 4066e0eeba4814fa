//! Response bodies: the incremental SSE parser (pure) and the metering body wrapper.
