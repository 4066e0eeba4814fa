//! How fast one proxy can ship records to ClickHouse, and the CPU that costs per record.
//!
//!   cargo run --release --example clickhouse_ship -- http://127.0.0.1:18123 [records]
//!
//! Builds `records` realistic records up front (not timed), then hands them to the sink exactly
//! as the meter does (`send`, never waiting; the queue is sized so nothing drops) and waits
//! until ClickHouse acknowledged all of them. Prints records/s (wall clock, send to last
//! acknowledgement) and this process's CPU time per record (user + system from
//! /proc/self/stat, so it includes encoding on the blocking thread, gzip, HTTP and the
//! runtime). Needs `goodput.records` (scripts/clickhouse.sh start applies schema.sql).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;

use goodput_measure::meter::Measurement;
use goodput_measure::outcome::{FinishReason, Outcome};
use goodput_measure::record::RequestRecord;
use goodput_measure::slo::{judge, Slo};
use goodput_proxy::config::ClickHouseConfig;
use goodput_proxy::sink::clickhouse::{ClickHouseSink, SinkCounters};
use prometheus::IntCounter;

/// utime + stime of this process, seconds (fields 14 and 15 of /proc/self/stat, in ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name may hold spaces: count fields after its closing parenthesis.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // rest starts at field 3 (state), so utime (14) is index 11 and stime (15) index 12.
    let ticks = f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0);
    ticks / 100.0 // USER_HZ is 100 on Linux
}

fn record(i: u64) -> Arc<RequestRecord> {
    let d = |ms: u64| Duration::from_micros(ms * 1000 + i % 997);
    let mut m = Measurement::without_body(Outcome::Success, Some(200), d(1800 + i % 400));
    m.streaming = true;
    m.finish_reason = Some(FinishReason::Length);
    m.ttft = Some(d(150 + i % 300));
    m.ttfc = m.ttft;
    m.tpot = Some(d(12));
    m.itl_count = 127;
    m.itl_max = Some(d(40));
    m.prompt_tokens = Some(512);
    m.completion_tokens = Some(128);
    m.tokens_exact = true;
    let v = judge(&m, &Slo::default());
    let start = 1_764_590_000_000 + i;
    let rec = RequestRecord::new(
        format!("chatcmpl-{i:016x}").into(),
        "meta-llama/Llama-3.1-8B-Instruct".into(),
        Some(format!("http://vllm-{}:8000", i % 4).into()),
        start,
        tokio::time::Instant::now(),
        m,
        v,
    );
    Arc::new(rec.with_instance("proxy-bench"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:18123".into());
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let records: Vec<_> = (0..n).map(record).collect();
    let c = |name: &str| IntCounter::new(name, name);
    let counters = SinkCounters {
        dropped: c("dropped")?,
        shipped: c("shipped")?,
        errors: c("errors")?,
    };
    let cfg = ClickHouseConfig {
        url: goodput_proxy::config::BaseUrl::parse(&url).map_err(anyhow::Error::msg)?,
        queue: n as usize,
        ..ClickHouseConfig::default()
    };
    let (sink, task) = ClickHouseSink::spawn(&cfg, counters.clone()).map_err(anyhow::Error::msg)?;
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    for r in &records {
        sink.send(r);
    }
    drop(sink);
    task.await.context("shipper")?;
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    assert_eq!(
        counters.dropped.get(),
        0,
        "nothing may drop in the benchmark"
    );
    assert_eq!(counters.shipped.get(), n, "every record acknowledged");
    println!(
        "{n} records in {wall:.2} s: {:.0} records/s; CPU {cpu:.2} s = {:.2} us per record \
         (batch {}, gzip {}, {} failed attempts)",
        n as f64 / wall,
        cpu / n as f64 * 1e6,
        cfg.batch_size,
        cfg.gzip,
        counters.errors.get()
    );
    Ok(())
}
