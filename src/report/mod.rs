//! `goodput-proxy report --clickhouse URL`: the whole fleet's exact figures over a window,
//! from every replica's records in ClickHouse: per model and upstream, p50/p90/p99 of TTFT,
//! TPOT and E2E, goodput ratio and outcomes, plus a fleet-wide row (`*`).

pub mod sql;
pub mod table;

use std::time::Duration;

use clap::Args;

use crate::sink::http::ChHttp;
pub use table::{parse_rows, render, FleetRow};

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// ClickHouse HTTP interface, e.g. http://clickhouse:8123.
    #[arg(long, value_name = "URL")]
    pub clickhouse: String,
    #[arg(long, default_value = "goodput")]
    pub database: String,
    #[arg(long, default_value = "records")]
    pub table: String,
    /// Records that started within this many seconds before now.
    #[arg(long, default_value_t = 300)]
    pub window: u64,
    #[arg(long, default_value = "default")]
    pub user: String,
    /// Environment variable holding the password (empty when unset).
    #[arg(long, default_value = "CLICKHOUSE_PASSWORD")]
    pub password_env: String,
    /// Print the rows as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The fleet rows: one per `(model, upstream)`, then the fleet total (`*`, `*`).
pub async fn fetch(args: &ReportArgs) -> anyhow::Result<Vec<FleetRow>> {
    let ident =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    anyhow::ensure!(
        ident(&args.database) && ident(&args.table),
        "database and table: letters, digits and _ only"
    );
    let password = std::env::var(&args.password_env).unwrap_or_default();
    let http = ChHttp::new(
        &args.clickhouse,
        &args.user,
        &password,
        Duration::from_secs(60),
    )
    .map_err(|e| anyhow::anyhow!("--clickhouse: {e}"))?;
    let mut rows = Vec::new();
    for by_group in [true, false] {
        let q = sql::report_query(&args.database, &args.table, args.window, by_group);
        let answer = http.query(&q).await?;
        rows.extend(parse_rows(&String::from_utf8_lossy(&answer)).map_err(|e| anyhow::anyhow!(e))?);
    }
    Ok(rows)
}

/// Runs the subcommand: prints the table (or JSON) on stdout.
pub async fn run(args: ReportArgs) -> anyhow::Result<()> {
    let rows = fetch(&args).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", render(&rows, args.window));
    }
    Ok(())
}
