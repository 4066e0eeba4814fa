//! Optional JSONL sink for records, off the request path.
