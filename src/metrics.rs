//! Prometheus registry and metric families, registered in one place.
