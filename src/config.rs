//! Configuration: serde structs, validation, defaults.
