// The allocator of the binary (the library and the tests use whatever their binary has):
// measured against the system one on RSS per open stream, RSS after the streams end and CPU
// per request (BENCHMARKS.md, "Allocator").
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::process::ExitCode;

use clap::Parser;
use goodput_proxy::app::{shutdown_signal, App};
use goodput_proxy::cli::{Cli, Command, ServeArgs};
use goodput_proxy::config::Config;
use goodput_proxy::logging;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => serve(cli.serve),
        Some(Command::Serve(args)) => serve(args),
        Some(Command::CheckConfig { file }) => check_config(&file),
        Some(Command::HashKey { generate }) => hash_key(generate),
        Some(Command::Sim(args)) => sim(*args),
        Some(Command::Report(args)) => report(args),
        Some(Command::Compare(args)) => compare(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("goodput-proxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = args.load_config()?;
    logging::init(&config.log);
    warn_on_low_fd_limit(goodput_net::raise_nofile_limit(), &config);
    runtime()?.block_on(async move {
        let app = App::bind(config).await?;
        tracing::info!(addr = %app.local_addr(), "proxy listening");
        tracing::info!(addr = %app.admin_addr(), "admin listening");
        if let Some(demo) = app.demo() {
            tracing::info!(engine = %demo.addr, model = %demo.model, "demo mode: no upstream configured, started the built-in simulated engine");
            println!("\nTry it:\n\n  {}\n", app.sample_curl(&demo.model));
        }
        app.run(async {
            shutdown_signal().await;
            // A second signal means "now": skip the drain (handy at an interactive terminal).
            tokio::spawn(async {
                shutdown_signal().await;
                tracing::warn!("second signal: exiting without draining");
                std::process::exit(130);
            });
        })
        .await
    })
}

/// Each stream in flight holds two sockets: say so when the limit cannot carry
/// `server.max_in_flight` of them (accepts and upstream connects would fail with EMFILE).
fn warn_on_low_fd_limit(nofile: Option<u64>, config: &Config) {
    let Some(nofile) = nofile else { return };
    let fit = goodput_net::streams_within(nofile);
    if fit < config.server.max_in_flight as u64 {
        tracing::warn!(
            open_files_limit = nofile,
            streams_that_fit = fit,
            max_in_flight = config.server.max_in_flight,
            "the open-files limit (ulimit -n) is below what server.max_in_flight needs (2 sockets a stream)"
        );
    }
}

fn sim(args: goodput_sim::SimArgs) -> anyhow::Result<()> {
    logging::init(&Default::default());
    goodput_net::raise_nofile_limit();
    runtime()?.block_on(goodput_sim::run_cli(args))
}

fn report(args: goodput_proxy::report::ReportArgs) -> anyhow::Result<()> {
    runtime()?.block_on(goodput_proxy::report::run(args))
}

fn compare(args: &goodput_proxy::cli::CompareArgs) -> anyhow::Result<()> {
    use goodput_proxy::compare::{self, admin::Admin, render};
    if !(args.window.is_finite() && args.window > 0.0) {
        anyhow::bail!("--window must be a positive number of seconds");
    }
    let admin = Admin::new(&args.admin)?;
    let window = std::time::Duration::from_secs_f64(args.window);
    let w = runtime()?.block_on(admin.window(window, args.by_upstream))?;
    let table = compare::build(&w, args.by_upstream);
    if args.json {
        println!("{}", render::json(&table));
    } else {
        print!("{}", render::text(&table));
    }
    Ok(())
}

fn hash_key(generate: bool) -> anyhow::Result<()> {
    use goodput_proxy::auth;
    if generate {
        let key = auth::generate_key();
        let digest = auth::hash_key_input(&key).map_err(anyhow::Error::msg)?;
        println!("{key}\n{digest}");
        return Ok(());
    }
    let mut input = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut input)?;
    println!(
        "{}",
        auth::hash_key_input(&input).map_err(anyhow::Error::msg)?
    );
    Ok(())
}

fn check_config(file: &std::path::Path) -> anyhow::Result<()> {
    match Config::load(Some(file), std::env::vars(), Vec::new()) {
        Ok(config) => {
            println!(
                "{}: ok (listen {}, admin {}, {} upstream(s))",
                file.display(),
                config.server.listen,
                config.server.admin_listen,
                config.upstream.urls.len()
            );
            Ok(())
        }
        Err(e) => {
            let problems = e.problems();
            for p in &problems {
                eprintln!("{p}");
            }
            anyhow::bail!("{}: {} problem(s)", file.display(), problems.len())
        }
    }
}
