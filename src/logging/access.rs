//! The access line's own writer: one line per request (target `goodput_proxy::access`), the
//! same bytes tracing-subscriber's formatter writes for it, without its machinery.
//!
//! Through `tracing::info!` a line cost about 12k instructions: the event's dispatch, a
//! visitor per field behind `dyn` calls, every piece through `core::fmt` (the styles of a
//! terminal painted as empty strings when there is none), the date by `write!`. Here the line
//! is put together in a per-thread buffer and written to stderr in one `write_all`, as the
//! formatter writes it. Operators parse these lines: the tests compare both writers byte for
//! byte on any values (`tests.rs`).
//!
//! The own writer serves when [`enable`] was called by `logging::init` for the subscriber it
//! installed (text without a terminal's styles, or JSON) and, per line, when that subscriber
//! would write it: its filter lets the target's INFO through and no span is entered (the
//! formatter would print the span's context). Anything else (a styled terminal, a filter on
//! spans or field values, another subscriber in tests) takes `tracing::info!`, the reference.

use std::cell::Cell;
use std::io::Write;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::LogFormat;

/// The access line's target: filters (`RUST_LOG=goodput_proxy::access=off`) name it.
pub const TARGET: &str = "goodput_proxy::access";

/// One request's access line.
#[derive(Debug, Clone, Copy)]
pub struct AccessLine<'a> {
    /// `-` when the request has none.
    pub request_id: &'a str,
    pub method: &'a str,
    /// The path only, never the query (it may carry a key).
    pub path: &'a str,
    pub status: u16,
    /// `-` when no replica answered.
    pub upstream: &'a str,
    /// From the request's start until its body ended or was dropped.
    pub duration_ms: f64,
}

/// The format the installed subscriber writes, when the own writer may stand in for it.
static OWN: OnceLock<LogFormat> = OnceLock::new();

/// `logging::init` installed a subscriber of `format` (`ansi`: a terminal's styles) whose
/// filter reads `directives`: the own writer serves its access lines unless the lines are
/// styled or the filter has dynamic directives (on spans or field values, written in `[...]`),
/// which only the subscriber can judge per line.
pub(super) fn enable(format: LogFormat, ansi: bool, directives: &str) {
    if own_writer_can(ansi, directives) {
        let _ = OWN.set(format);
    }
}

fn own_writer_can(ansi: bool, directives: &str) -> bool {
    !ansi && !directives.contains('[')
}

impl AccessLine<'_> {
    /// Writes the line (when the filter lets it through).
    pub fn write(&self) {
        self.write_to(OWN.get().copied(), SystemTime::now(), |line| {
            // As the subscriber writes a line: one `write_all` on stderr, errors dropped.
            let _ = std::io::stderr().write_all(line);
        });
    }

    /// The line of the own writer of `own` (the format when enabled) at `now`, handed to
    /// `out`, when it stands in for the current subscriber; else the subscriber's event.
    fn write_to(&self, own: Option<LogFormat>, now: SystemTime, out: impl FnOnce(&[u8])) {
        if let Some(format) = own {
            if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
                return;
            }
            // Inside a span (or where the subscriber cannot tell) the formatter writes the
            // span's context: only it can.
            let outside = tracing::dispatcher::get_default(|d| {
                let current = d.current_span();
                current.is_known() && current.id().is_none()
            });
            if outside && self.write_own(format, now, out) {
                return;
            }
        }
        self.write_traced();
    }

    /// The reference: the line as an event of the installed subscriber.
    pub fn write_traced(&self) {
        tracing::info!(
            target: TARGET,
            request_id = self.request_id,
            method = %self.method,
            path = %self.path,
            status = self.status,
            upstream = self.upstream,
            duration_ms = format_args!("{:.1}", self.duration_ms),
            "access"
        );
    }

    /// Formats into this thread's buffer and hands it to `out`; `false` (nothing written)
    /// for a time the formatter's stamp is not made here for.
    fn write_own(&self, format: LogFormat, now: SystemTime, out: impl FnOnce(&[u8])) -> bool {
        thread_local! {
            static BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
        }
        let mut buf = BUF.take();
        buf.clear();
        let formatted = self.format(format, now, &mut buf);
        if formatted {
            out(&buf);
        }
        if buf.capacity() <= MAX_KEPT {
            BUF.set(buf);
        }
        formatted
    }

    /// The line the subscriber of `format` writes at `now`, appended to `out`; `false` when
    /// `now` is outside the years 1970-9999 (its stamp is left to the subscriber).
    pub fn format(&self, format: LogFormat, now: SystemTime, out: &mut Vec<u8>) -> bool {
        let Some(stamp) = Stamp::of(now) else {
            return false;
        };
        match format {
            LogFormat::Text => self.text(&stamp, out),
            LogFormat::Json => self.json(&stamp, out),
        }
        true
    }

    /// `<stamp>  INFO goodput_proxy::access: access request_id="…" method=… path=… status=…
    /// upstream="…" duration_ms=…`: string values quoted as `{:?}` quotes them, displayed
    /// values (method, path) as they are.
    fn text(&self, stamp: &Stamp, out: &mut Vec<u8>) {
        stamp.write(out);
        out.extend_from_slice(b"  INFO goodput_proxy::access: access request_id=");
        debug_str(self.request_id, out);
        out.extend_from_slice(b" method=");
        out.extend_from_slice(self.method.as_bytes());
        out.extend_from_slice(b" path=");
        out.extend_from_slice(self.path.as_bytes());
        out.extend_from_slice(b" status=");
        decimal(self.status, out);
        out.extend_from_slice(b" upstream=");
        debug_str(self.upstream, out);
        out.extend_from_slice(b" duration_ms=");
        tenths(self.duration_ms, out);
        out.push(b'\n');
    }

    /// The JSON formatter's map, flattened: timestamp, level, the fields in order, target.
    fn json(&self, stamp: &Stamp, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        stamp.write(out);
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"message\":\"access\",\"request_id\":");
        json_str(self.request_id, out);
        out.extend_from_slice(b",\"method\":");
        json_str(self.method, out);
        out.extend_from_slice(b",\"path\":");
        json_str(self.path, out);
        out.extend_from_slice(b",\"status\":");
        decimal(self.status, out);
        out.extend_from_slice(b",\"upstream\":");
        json_str(self.upstream, out);
        // A duration's digits and point need no escape.
        out.extend_from_slice(b",\"duration_ms\":\"");
        tenths(self.duration_ms, out);
        out.extend_from_slice(b"\",\"target\":\"goodput_proxy::access\"}\n");
    }
}

/// A line buffer that grew past this (a very long path) is not kept for the next line.
const MAX_KEPT: usize = 16 * 1024;

/// `s` as `{:?}` writes it: quoted, and as it is when every byte is printable ASCII other
/// than `"` and `\` (a request id, a replica's URL); else by `{:?}` itself.
fn debug_str(s: &str, out: &mut Vec<u8>) {
    // Every byte looked at (no early exit): the loop is a few vector instructions.
    let plain = s.bytes().fold(true, |ok, b| {
        ok & (b' '..=b'~').contains(&b) & (b != b'"') & (b != b'\\')
    });
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(out, "{s:?}");
    }
}

/// `x` as `{:.1}` writes it: the exact value rounded to the nearest tenth. From the product
/// `10 x` when that rounding cannot be told apart (the product is more than one unit in its
/// last place from a half: its own error is half a unit) and whole tenths fit an integer
/// exactly; else by `{:.1}` itself.
fn tenths(x: f64, out: &mut Vec<u8>) {
    let y = x * 10.0;
    if (0.0..1e15).contains(&y) {
        let ulp = f64::from_bits(y.to_bits() + 1) - y;
        if ((y - y.floor()) - 0.5).abs() > ulp {
            let t = (y + 0.5).floor() as u64;
            decimal(t / 10, out);
            out.push(b'.');
            out.push(b'0' + (t % 10) as u8);
            return;
        }
    }
    let _ = write!(out, "{x:.1}");
}

/// `s` as a JSON string, escaped as the JSON formatter's serializer escapes it.
fn json_str(s: &str, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// `n` in decimal digits.
fn decimal(n: impl Into<u64>, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n.into();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// A UTC time as the subscriber's default timer writes it: RFC 3339 in microseconds,
/// `2026-12-03T11:58:47.123456Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    year: u32,
    month: u32,
    day: u32,
    secs_of_day: u32,
    micros: u32,
}

impl Stamp {
    /// `None` before 1970 or after 9999 (the timer writes those years otherwise).
    pub(crate) fn of(t: SystemTime) -> Option<Stamp> {
        let d = t.duration_since(UNIX_EPOCH).ok()?;
        let secs = d.as_secs();
        let days = secs / 86_400;
        let (year, month, day) = civil_from_days(days);
        (year <= 9999).then_some(Stamp {
            year,
            month,
            day,
            secs_of_day: (secs % 86_400) as u32,
            micros: d.subsec_micros(),
        })
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let (h, m, s) = (
            self.secs_of_day / 3600,
            self.secs_of_day / 60 % 60,
            self.secs_of_day % 60,
        );
        let mut b = *b"0000-00-00T00:00:00.000000Z";
        put(&mut b[0..4], self.year);
        put(&mut b[5..7], self.month);
        put(&mut b[8..10], self.day);
        put(&mut b[11..13], h);
        put(&mut b[14..16], m);
        put(&mut b[17..19], s);
        put(&mut b[20..26], self.micros);
        out.extend_from_slice(&b);
    }
}

/// `n`'s last `dst.len()` decimal digits into `dst`, zero-padded.
fn put(dst: &mut [u8], mut n: u32) {
    for d in dst.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// The proleptic Gregorian (year, month, day) of `days` since 1970-01-01 (H. Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u32, u32, u32) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (
        year.min(u64::from(u32::MAX)) as u32,
        month as u32,
        day as u32,
    )
}

#[cfg(test)]
mod tests;
