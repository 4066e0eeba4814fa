//! Command-line interface: `serve` (the default), `sim`, `check-config`, `compare`, `report`,
//! `hash-key`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, Origin, Override};

#[derive(Debug, Parser)]
#[command(
    name = "goodput-proxy",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `serve` flags, accepted without the subcommand name too.
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (the default). With no upstream, starts the built-in simulated engine.
    Serve(ServeArgs),
    /// Run the simulated vLLM engine on its own (see `sim --help`).
    Sim(Box<goodput_sim::SimArgs>),
    /// Load a config file (plus GOODPUT_PROXY_* overrides), validate it, and exit.
    CheckConfig {
        /// The TOML file to check.
        file: PathBuf,
    },
    /// The fleet's exact percentiles, goodput and outcomes over a window, from the records
    /// every replica shipped to ClickHouse (`[sink.clickhouse]`).
    Report(crate::report::ReportArgs),
    /// Print the SHA-256 digest of an API key, as `[auth.tenants.NAME] keys` takes it. The key
    /// is read from stdin (one line; not an argument, so it stays out of shell history and
    /// `ps`): `printf %s "$KEY" | goodput-proxy hash-key`.
    HashKey {
        /// Make a new random key instead (256 bits): the key on the first line of stdout, its
        /// digest on the second.
        #[arg(long)]
        generate: bool,
    },
    /// Exact vs proxy-histogram vs engine-histogram TTFT / TPOT / E2E percentiles of a running
    /// proxy over one window, with the engines' counters over it.
    Compare(CompareArgs),
}

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// The proxy's admin URL (server.admin_listen), e.g. http://127.0.0.1:9090.
    #[arg(long, value_name = "URL")]
    pub admin: String,
    /// Seconds between the two scrapes (the requests compared finish in this window).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    pub window: f64,
    /// Print the table as JSON.
    #[arg(long)]
    pub json: bool,
    /// One group per model and upstream instead of per model.
    #[arg(long)]
    pub by_upstream: bool,
}

#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    /// TOML config file (see config/goodput-proxy.toml).
    #[arg(long, short, env = crate::config::ENV_CONFIG_FILE, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Public listen address [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Admin listen address (/healthz, /readyz, /metrics) [default: 127.0.0.1:9090].
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// Upstream base URL, e.g. http://127.0.0.1:8000 (repeat for replicas; replaces the
    /// config's list).
    #[arg(long = "upstream", value_name = "URL")]
    pub upstreams: Vec<String>,
}

impl ServeArgs {
    /// Loads the file and environment with these flags on top, and checks the result.
    pub fn load_config(&self) -> Result<Config, crate::config::ConfigError> {
        Config::load(self.config.as_deref(), std::env::vars(), self.overrides())
    }

    /// The flags given, as overrides of their config fields.
    fn overrides(&self) -> Vec<Override> {
        use toml::Value;
        let flag = |flag, field: &str, value| Override {
            field: field.to_string(),
            value,
            origin: Origin::Flag(flag),
        };
        let mut out = Vec::new();
        if let Some(a) = self.listen {
            out.push(flag(
                "--listen",
                "server.listen",
                Value::String(a.to_string()),
            ));
        }
        if let Some(a) = self.admin_listen {
            let v = Value::String(a.to_string());
            out.push(flag("--admin-listen", "server.admin_listen", v));
        }
        if !self.upstreams.is_empty() {
            let urls = self.upstreams.iter().cloned().map(Value::String).collect();
            out.push(flag("--upstream", "upstream.urls", Value::Array(urls)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_is_the_default() {
        let cli = Cli::try_parse_from(["goodput-proxy", "--listen", "127.0.0.1:1"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.serve.listen, Some("127.0.0.1:1".parse().unwrap()));
        let cli = Cli::try_parse_from([
            "goodput-proxy",
            "serve",
            "--upstream",
            "http://a:1",
            "--upstream",
            "http://b:2",
        ])
        .unwrap();
        match cli.command {
            Some(Command::Serve(a)) => assert_eq!(a.upstreams.len(), 2),
            other => panic!("{other:?}"),
        }
        let cli = Cli::try_parse_from(["goodput-proxy", "check-config", "x.toml"]).unwrap();
        assert!(matches!(cli.command, Some(Command::CheckConfig { .. })));
        let cli = Cli::try_parse_from(["goodput-proxy", "hash-key", "--generate"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::HashKey { generate: true })
        ));
    }

    #[test]
    fn flags_override_config() {
        let args = ServeArgs {
            listen: Some("127.0.0.1:7".parse().unwrap()),
            upstreams: vec!["http://u:1".into()],
            ..ServeArgs::default()
        };
        let c = args.load_config().unwrap();
        assert_eq!(c.server.listen.port(), 7);
        let urls: Vec<&str> = c.upstream.urls.iter().map(|u| u.as_str()).collect();
        assert_eq!(urls, ["http://u:1"]);
        let bad = ServeArgs {
            upstreams: vec!["ftp://u".into()],
            ..ServeArgs::default()
        };
        let msg = bad.load_config().unwrap_err().to_string();
        assert!(
            msg.starts_with("flag --upstream: field `upstream.urls`"),
            "{msg}"
        );
    }
}
