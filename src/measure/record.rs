//! Raw per-request records, the bounded ring that keeps them, and the `/stats` computation.
