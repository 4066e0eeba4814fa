//! Typed errors and their one mapping to status + OpenAI-style JSON.
