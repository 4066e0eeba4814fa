//! The one tower stack, assembled in one place.
