//! goodput-loadtest: phased load with exact client-side percentiles.

use clap::Parser;
use goodput_loadtest::cli::{Cli, Command};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Run(args) => goodput_loadtest::cli::run(*args).await,
        Command::Report { dir } => goodput_loadtest::cli::rerender(&dir),
        Command::Bench(args) => goodput_loadtest::bench::run(args).await.and_then(|r| {
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }),
        Command::Autoscale(args) => goodput_loadtest::autoscale::run(args).await,
        Command::Soak(args) => {
            let json = args.json;
            match goodput_loadtest::soak::run(args).await {
                Ok(r) => {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
                    } else {
                        print!("{}", goodput_loadtest::soak::render(&r));
                    }
                    if !r.pass {
                        std::process::exit(2);
                    }
                    Ok(())
                }
                Err(e) => Err(e),
            }
        }
    };
    if let Err(e) = res {
        eprintln!("goodput-loadtest: {e:#}");
        std::process::exit(1);
    }
}
