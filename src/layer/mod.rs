//! Tower layers, one concern each: request id, auth, limits, meter.
