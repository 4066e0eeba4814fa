#![forbid(unsafe_code)]
//! `goodput-proxy` binary. For now only the `sim` subcommand (the simulated vLLM engine);
//! the proxy's own subcommands are added by its CLI.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "goodput-proxy", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the simulated vLLM engine.
    Sim(goodput_proxy::sim::SimArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Sim(args) => rt.block_on(goodput_proxy::sim::run_cli(args)),
    }
}
