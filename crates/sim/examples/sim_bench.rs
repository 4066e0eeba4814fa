//! Benchmark of the simulated engine alone (bounded; 127.0.0.1 only; stops by itself).
//!
//! ```text
//! cargo run --release -p goodput-sim --example sim_bench -- throughput [SECONDS] [CONNS] [MAX_TOKENS]
//! cargo run --release -p goodput-sim --example sim_bench -- paced [SECONDS] [CONNS] [MAX_TOKENS] [TPOT_MS]
//! cargo run --release -p goodput-sim --example sim_bench -- streams [N]
//! ```
//! `throughput`: the sim runs on one current-thread runtime in its own OS thread (one core),
//! the client on another; zero think time; keep-alive connections each loop streaming chat
//! requests. Reports SSE events/s by wall clock and per CPU-second of the sim thread (the
//! figure that does not depend on what else the machine runs).
//! `paced`: the same with a per-token decode time, so every token is its own frame and timer
//! wake-up (the per-token path of realistic runs).
//! `streams`: opens N concurrent streams that stay open (one token per second), checks the
//! sim holds them all, and reports the process RSS growth (sim + client sockets: an upper
//! bound for the sim).

// A benchmark tool: a failure stops it loudly rather than reporting a figure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use goodput_sim::{SimConfig, SimServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

fn request(max_tokens: u32) -> Vec<u8> {
    let body = format!(
        r#"{{"model":"tiny","messages":[{{"role":"user","content":"Hello"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    );
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Unix ticks (utime + stime) of one thread.
fn thread_cpu_secs(tid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Starts the sim on its own single-threaded runtime; returns its address and thread id.
fn spawn_sim(cfg: SimConfig) -> (SocketAddr, String, std::sync::Arc<goodput_sim::Engine>) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = SimServer::bind(cfg, "127.0.0.1:0".parse().unwrap())
                .await
                .unwrap();
            let handle = server.spawn();
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name().map(|f| f.to_string_lossy().to_string()))
                .unwrap_or_default();
            tx.send((handle.local_addr(), tid, handle.engine().clone()))
                .unwrap();
            // Serve until the process exits.
            std::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

async fn client_loop(addr: SocketAddr, req: std::sync::Arc<Vec<u8>>, until: Instant) -> (u64, u64) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let (mut events, mut requests) = (0u64, 0u64);
    let finder = memchr::memmem::Finder::new(b"data: ");
    while Instant::now() < until {
        s.write_all(&req).await.unwrap();
        // Read until the terminating chunk. "data: " never spans reads in a way that
        // matters for the count by more than one per read, so keep a 5-byte tail.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "sim closed the connection");
            let mut window = std::mem::take(&mut tail);
            window.extend_from_slice(&buf[..n]);
            events += finder.find_iter(&window).count() as u64;
            let done = window.ends_with(b"\r\n0\r\n\r\n");
            let keep = window.len().min(5);
            tail = window[window.len() - keep..].to_vec();
            if done {
                break;
            }
        }
        requests += 1;
    }
    (events, requests)
}

fn throughput(secs: u64, conns: usize, max_tokens: u32, tpot_ms: f64) {
    let cfg = SimConfig {
        max_num_seqs: conns.max(1),
        ..SimConfig::with_timing(0.0, tpot_ms)
    };
    let (addr, tid, _eng) = spawn_sim(cfg);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let req = std::sync::Arc::new(request(max_tokens));
    let cpu0 = thread_cpu_secs(&tid);
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(secs);
    let (events, requests) = rt.block_on(async {
        let tasks: Vec<_> = (0..conns)
            .map(|_| tokio::spawn(client_loop(addr, req.clone(), until)))
            .collect();
        let mut total = (0, 0);
        for t in tasks {
            let (e, r) = t.await.unwrap();
            total.0 += e;
            total.1 += r;
        }
        total
    });
    let wall = t0.elapsed().as_secs_f64();
    let cpu = thread_cpu_secs(&tid) - cpu0;
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    if tpot_ms > 0.0 {
        println!("paced: {secs}s, {conns} keep-alive connections, max_tokens {max_tokens}, one token per {tpot_ms} ms per stream");
    } else {
        println!("throughput: {secs}s, {conns} keep-alive connections, max_tokens {max_tokens}, zero think time");
    }
    println!(
        "  requests          {requests} ({:.0}/s)",
        requests as f64 / wall
    );
    println!(
        "  SSE events        {events} ({:.0}/s wall)",
        events as f64 / wall
    );
    println!(
        "  sim thread CPU    {cpu:.2}s of {wall:.2}s wall ({:.0}% of one core)",
        100.0 * cpu / wall
    );
    if cpu > 0.0 {
        println!("  events per sim CPU-second  {:.0}", events as f64 / cpu);
    }
    println!("  loadavg at end    {}", load.trim());
}

fn streams(n: usize) {
    let cfg = SimConfig {
        max_num_seqs: n.max(1),
        ..SimConfig::with_timing(0.0, 1000.0)
    };
    let rss0 = rss_mib();
    let (addr, _tid, eng) = spawn_sim(cfg);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let req = std::sync::Arc::new(request(2000));
    let t0 = Instant::now();
    let socks = rt.block_on(async {
        // Connect 64 at a time: loopback connects are slow in some sandboxes.
        let mut socks = Vec::with_capacity(n);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..n {
            let req = req.clone();
            set.spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(&req).await.unwrap();
                s
            });
            if set.len() >= 64 || i + 1 == n {
                while let Some(s) = set.join_next().await {
                    socks.push(s.unwrap());
                }
            }
        }
        eprintln!("  connected and sent in {:.2?}", t0.elapsed());
        // Wait for every stream's first event.
        let mut buf = [0u8; 4096];
        for s in socks.iter_mut() {
            let got = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf)).await;
            assert!(matches!(got, Ok(Ok(k)) if k > 0), "stream did not start");
        }
        socks
    });
    let opened = t0.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let running = eng.running();
    let rss1 = rss_mib();
    drop(socks);
    let freed = {
        let t = Instant::now();
        while eng.running() > 0 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        t.elapsed()
    };
    println!("streams: {n} concurrent open streams (tpot 1 s), opened in {opened:.2?}");
    println!("  sim running seqs  {running}");
    println!("  RSS before {rss0:.1} MiB, with streams open {rss1:.1} MiB, growth {:.1} MiB ({:.1} KiB per stream, sim + client)", rss1 - rss0, (rss1 - rss0) * 1024.0 / n as f64);
    println!(
        "  all slots freed {freed:.2?} after the clients closed (running now {})",
        eng.running()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    match args.first().map(String::as_str) {
        Some("streams") => streams(num(1, 5000) as usize),
        Some("throughput") | None => throughput(
            num(1, 5).min(60),
            num(2, 32) as usize,
            num(3, 256) as u32,
            0.0,
        ),
        Some("paced") => throughput(
            num(1, 5).min(60),
            num(2, 1000) as usize,
            num(3, 256) as u32,
            num(4, 10) as f64,
        ),
        Some(other) => {
            eprintln!(
                "unknown mode {other}: use throughput [SECONDS] [CONNS] [MAX_TOKENS] | paced [SECONDS] [CONNS] [MAX_TOKENS] [TPOT_MS] | streams [N]"
            );
            std::process::exit(2);
        }
    }
}
