//! Accept loop, TLS, hyper-util server, graceful shutdown.
