//! The simulated vLLM engine.
