//! Where finished records go besides the `/stats` ring: the JSONL file
//! ([`jsonl::RecordSink`]) and ClickHouse ([`clickhouse::ClickHouseSink`]). Both take a
//! record without waiting and count what they drop.

pub mod clickhouse;
pub mod http;
pub mod jsonl;
pub mod row;

use std::sync::Arc;

use crate::sink::jsonl::RecordSink;
use goodput_measure::record::RequestRecord;

/// Every configured sink; the meter hands each record to all of them.
#[derive(Debug, Clone, Default)]
pub struct Sinks {
    pub jsonl: Option<RecordSink>,
    pub clickhouse: Option<clickhouse::ClickHouseSink>,
}

impl Sinks {
    /// Never blocks (each sink queues or drops and counts).
    pub fn send(&self, record: &Arc<RequestRecord>) {
        if let Some(s) = &self.jsonl {
            s.send(record.clone());
        }
        if let Some(s) = &self.clickhouse {
            s.send(record);
        }
    }
}
