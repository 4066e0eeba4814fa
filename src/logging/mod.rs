//! Tracing setup: text or JSON to stderr; `RUST_LOG` overrides the configured level. The
//! access lines have their own writer of the same bytes ([`access`]).

pub mod access;

use tracing::Dispatch;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

/// Installs the global subscriber once; later calls are no-ops (tests start many apps).
pub fn init(config: &LogConfig) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let directives = filter.to_string();
    let d = dispatch(
        config.format,
        ansi,
        filter,
        std::io::stderr,
        tracing_subscriber::fmt::time::SystemTime,
    );
    if d.try_init().is_ok() {
        access::enable(config.format, ansi, &directives);
    }
}

/// The subscriber every line goes through: `format`, ANSI styling or not, `filter`, written
/// by `writer`, stamped by `timer` (the wall clock's RFC 3339 in microseconds in the binary;
/// the tests pass a fixed one to pin the lines byte for byte).
pub fn dispatch<W, T>(
    format: LogFormat,
    ansi: bool,
    filter: EnvFilter,
    writer: W,
    timer: T,
) -> Dispatch
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    T: FormatTime + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_timer(timer);
    match format {
        LogFormat::Json => Dispatch::new(builder.json().flatten_event(true).finish()),
        LogFormat::Text => Dispatch::new(builder.with_ansi(ansi).finish()),
    }
}

/// What the tests capture: every line the subscriber writes, in one buffer, and a fixed time.
#[cfg(test)]
pub(crate) mod capture {
    use std::io;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::FormatTime;
    use tracing_subscriber::fmt::MakeWriter;

    /// The lines written so far.
    #[derive(Clone, Default)]
    pub struct Capture(pub Arc<Mutex<Vec<u8>>>);

    impl Capture {
        pub fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    impl io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Capture {
        type Writer = Capture;
        fn make_writer(&'w self) -> Capture {
            self.clone()
        }
    }

    /// A stamp that does not move, to pin whole lines.
    pub struct FixedTime(pub String);

    impl FormatTime for FixedTime {
        fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
            w.write_str(&self.0)
        }
    }
}
