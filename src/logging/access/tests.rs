use super::*;
use crate::logging::capture::{Capture, FixedTime};
use crate::logging::dispatch;
use proptest::prelude::*;
use std::time::Duration;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::EnvFilter;

fn stamp_text(t: SystemTime) -> String {
    let mut b = Vec::new();
    Stamp::of(t).unwrap().write(&mut b);
    String::from_utf8(b).unwrap()
}

/// What the subscriber of `format` writes for `line` at `now` (its timer writes the own
/// stamp of `now`, checked against the subscriber's own timer below).
fn traced(format: LogFormat, line: &AccessLine<'_>, now: SystemTime) -> Vec<u8> {
    let out = Capture::default();
    let d = dispatch(
        format,
        false,
        EnvFilter::new("info"),
        out.clone(),
        FixedTime(stamp_text(now)),
    );
    tracing::dispatcher::with_default(&d, || line.write_traced());
    let v = out.0.lock().unwrap().clone();
    v
}

fn own(format: LogFormat, line: &AccessLine<'_>, now: SystemTime) -> Vec<u8> {
    let mut out = b"left alone".to_vec();
    assert!(line.format(format, now, &mut out));
    out.split_off(10)
}

fn assert_same(line: &AccessLine<'_>, now: SystemTime) {
    for format in [LogFormat::Text, LogFormat::Json] {
        let (a, b) = (own(format, line, now), traced(format, line, now));
        assert_eq!(
            String::from_utf8_lossy(&a),
            String::from_utf8_lossy(&b),
            "{format:?} {line:?}"
        );
        assert_eq!(a, b);
    }
}

#[test]
fn the_own_lines_are_the_subscribers() {
    let now = UNIX_EPOCH + Duration::from_micros(1_796_299_127_123_456);
    for line in [
        AccessLine {
            request_id: "0123456789abcdef0123456789abcdef",
            method: "POST",
            path: "/v1/chat/completions",
            status: 200,
            upstream: "http://127.0.0.1:8000",
            duration_ms: 12.345,
        },
        AccessLine {
            request_id: "-",
            method: "GET",
            path: "/",
            status: 100,
            upstream: "-",
            duration_ms: 0.0,
        },
        AccessLine {
            request_id: "a\"b\\c'd{e} f",
            method: "PURGE",
            path: "/v1/a b\"c\\d/é\u{1}\n",
            status: 999,
            upstream: "tab\there\u{1b}[31m\u{7f}ü\u{301}\u{200b}",
            duration_ms: 2.05,
        },
        AccessLine {
            request_id: "",
            method: "",
            path: "",
            status: 503,
            upstream: "",
            duration_ms: 1e12 + 0.05,
        },
    ] {
        assert_same(&line, now);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Any values, any time of the years the own stamp covers: the same bytes as the
    /// subscriber's, in both formats.
    #[test]
    fn any_line_is_the_subscribers(
        request_id in prop_oneof!["[!-~]{1,40}", any::<String>()],
        method in "[A-Z]{1,8}",
        path in prop_oneof!["/[ -~]{0,60}", any::<String>()],
        status in 100u16..1000,
        upstream in prop_oneof!["https?://[a-z0-9.:\\[\\]]{1,30}(/[ -~]{0,10})?", any::<String>()],
        nanos in 0u64..10_000_000_000_000,
        micros in 0u64..253_402_300_799_999_999,
    ) {
        let line = AccessLine {
            request_id: &request_id,
            method: &method,
            path: &path,
            status,
            upstream: &upstream,
            duration_ms: Duration::from_nanos(nanos).as_secs_f64() * 1e3,
        };
        assert_same(&line, UNIX_EPOCH + Duration::from_micros(micros));
    }
}

/// The own stamp at known instants (leap days, centuries, the last second of 9999).
#[test]
fn stamps_at_known_instants() {
    for (secs, micros, want) in [
        (0, 0, "1970-01-01T00:00:00.000000Z"),
        (951_782_400, 1, "2000-02-29T00:00:00.000001Z"),
        (951_868_799, 999_999, "2000-02-29T23:59:59.999999Z"),
        (1_709_164_800, 500_000, "2024-02-29T00:00:00.500000Z"),
        (1_796_299_127, 123_456, "2026-12-03T11:58:47.123456Z"),
        (4_107_542_400, 0, "2100-03-01T00:00:00.000000Z"),
        (4_107_542_399, 0, "2100-02-28T23:59:59.000000Z"),
        (253_402_300_799, 999_999, "9999-12-31T23:59:59.999999Z"),
    ] {
        let t = UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros);
        assert_eq!(stamp_text(t), want, "{secs}");
    }
    // Outside the years covered the line is the subscriber's.
    assert!(Stamp::of(UNIX_EPOCH - Duration::from_secs(1)).is_none());
    assert!(Stamp::of(UNIX_EPOCH + Duration::from_secs(253_402_300_800)).is_none());
    let line = AccessLine {
        request_id: "-",
        method: "GET",
        path: "/",
        status: 200,
        upstream: "-",
        duration_ms: 0.0,
    };
    let mut out = Vec::new();
    assert!(!line.format(
        LogFormat::Text,
        UNIX_EPOCH - Duration::from_secs(1),
        &mut out
    ));
    assert!(out.is_empty());
}

/// Day by day over four centuries (every leap rule), the own date is the one counted by
/// hand: days since the epoch walked one by one through the calendar.
#[test]
fn every_day_of_four_centuries() {
    let (mut y, mut m, mut d) = (1970u32, 1u32, 1u32);
    for days in 0..146_097u64 + 365 * 30 {
        assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let len = match m {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        d += 1;
        if d > len {
            d = 1;
            m += 1;
            if m > 12 {
                m = 1;
                y += 1;
            }
        }
    }
}

/// The subscriber's own timer, read between two instants: its stamp lies between the own
/// stamps of those instants (equal-width, so they sort as the times do).
#[test]
fn the_own_stamp_is_the_subscribers_timer() {
    for _ in 0..1_000 {
        let before = SystemTime::now();
        let mut theirs = String::new();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut Writer::new(&mut theirs))
            .unwrap();
        let after = SystemTime::now();
        let (lo, hi) = (stamp_text(before), stamp_text(after));
        assert_eq!(theirs.len(), lo.len());
        assert!(lo <= theirs && theirs <= hi, "{lo} {theirs} {hi}");
    }
}

#[test]
fn decimals() {
    for n in [0u16, 7, 10, 99, 100, 200, 404, 999, 1000, 65_535] {
        let mut out = Vec::new();
        decimal(n, &mut out);
        assert_eq!(out, n.to_string().into_bytes());
    }
}

/// Who writes a line under a subscriber whose own writer is `own`: (the own writer's bytes,
/// the subscriber's).
fn who_writes(own: Option<LogFormat>, filter: &str, in_span: bool) -> (Vec<u8>, String) {
    let line = AccessLine {
        request_id: "r",
        method: "GET",
        path: "/",
        status: 200,
        upstream: "-",
        duration_ms: 1.0,
    };
    let captured = Capture::default();
    let d = dispatch(
        own.unwrap_or(LogFormat::Text),
        false,
        EnvFilter::new(filter),
        captured.clone(),
        FixedTime(stamp_text(UNIX_EPOCH)),
    );
    let mut mine = Vec::new();
    tracing::dispatcher::with_default(&d, || {
        let span = in_span.then(|| tracing::info_span!("conn", peer = 1).entered());
        line.write_to(own, UNIX_EPOCH, |b| mine = b.to_vec());
        drop(span);
    });
    (mine, captured.text())
}

/// The own writer writes the line when it stands in for the subscriber; inside a span the
/// subscriber writes it (with the span's context); a filtered target is written by neither.
#[test]
fn the_own_writer_stands_in_only_where_it_can() {
    for format in [LogFormat::Text, LogFormat::Json] {
        let (mine, theirs) = who_writes(Some(format), "info", false);
        assert!(!mine.is_empty() && theirs.is_empty(), "{format:?}");
        let (mine, theirs) = who_writes(Some(format), "info", true);
        assert!(mine.is_empty(), "{format:?}");
        assert!(theirs.contains("conn"), "{format:?}: {theirs}");
        for filter in ["warn", "info,goodput_proxy::access=off"] {
            let (mine, theirs) = who_writes(Some(format), filter, false);
            assert!(mine.is_empty() && theirs.is_empty(), "{format:?} {filter}");
        }
        let (mine, theirs) = who_writes(Some(format), "warn,goodput_proxy::access=info", false);
        assert!(!mine.is_empty() && theirs.is_empty(), "{format:?}");
    }
    let (mine, theirs) = who_writes(None, "info", false);
    assert!(mine.is_empty() && !theirs.is_empty());
}

/// `logging::init` enables the own writer only where it can make the subscriber's lines.
#[test]
fn enabled_only_for_plain_lines_and_static_filters() {
    for (ansi, directives, can) in [
        (false, "info", true),
        (false, "goodput_proxy=debug,info", true),
        (true, "info", false),
        (
            false,
            "info,goodput_proxy::access[{status=500}]=info",
            false,
        ),
        (false, "[conn]=info", false),
    ] {
        assert_eq!(own_writer_can(ansi, directives), can, "{ansi} {directives}");
    }
}

/// Tenths as `{:.1}` writes them: durations as the layer makes them, any finite values,
/// and values a few units in the last place around every half-tenth boundary.
#[test]
fn tenths_are_the_formatters() {
    let check = |x: f64| {
        let mut out = Vec::new();
        tenths(x, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), format!("{x:.1}"), "{x:e}");
    };
    for x in [
        0.0,
        0.05,
        0.15,
        0.25,
        0.35,
        2.05,
        1e14,
        1e14 + 0.05,
        9.95,
        99.95,
        1e300,
    ] {
        check(x);
    }
    for k in 0..200_000u64 {
        let half = (k as f64 + 0.5) / 10.0;
        let mut x = half;
        for _ in 0..4 {
            x = f64::from_bits(x.to_bits() - 1);
        }
        for _ in 0..9 {
            check(x);
            x = f64::from_bits(x.to_bits() + 1);
        }
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..200_000 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let nanos = rng % 100_000_000_000_000;
        check(Duration::from_nanos(nanos).as_secs_f64() * 1e3);
        check(f64::from_bits(rng & !(1 << 63))); // any positive value, infinity and NaN too
    }
}
