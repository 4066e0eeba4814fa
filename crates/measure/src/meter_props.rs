//! The event inspection's property, as the meter applies it to a body ([`StreamMeter`]):
//! however the body is framed (one frame, any cuts, byte by byte), the measurement is the same:
//! outcome, finish reason, tokens, usage, events, choices, timings (every frame at one instant,
//! so framing is the only difference). Shared by the proptest below (in CI) and the fuzz target
//! `fuzz/fuzz_targets/meter.rs`, which includes this file by path (public items only, named
//! through `super::`, which the includer brings into scope).

use std::time::Duration;

use super::{Ending, Measurement, StreamMeter};

/// Meters `frames` as one response served at fixed instants.
pub fn measure(streaming: bool, frames: &[&[u8]]) -> Measurement {
    let t0 = tokio::time::Instant::now();
    let mut m = StreamMeter::new(t0, streaming);
    m.on_head(t0, 200);
    for f in frames {
        m.on_frame(t0 + Duration::from_millis(1), f, |_| {});
    }
    m.finish(t0 + Duration::from_millis(2), Ending::Complete)
}

/// [`measure`], the frames handed over as the proxy's body has them ([`StreamMeter::on_data`]:
/// a JSON body of one frame is kept, not copied).
pub fn measure_shared(streaming: bool, frames: &[&[u8]]) -> Measurement {
    let t0 = tokio::time::Instant::now();
    let mut m = StreamMeter::new(t0, streaming);
    m.on_head(t0, 200);
    for f in frames {
        let data = bytes::Bytes::copy_from_slice(f);
        m.on_data(t0 + Duration::from_millis(1), &data, |_| {});
    }
    m.finish(t0 + Duration::from_millis(2), Ending::Complete)
}

/// `body` cut at `cuts` (positions taken modulo its length) and byte by byte (bodies up to
/// 4 KiB) measures as `body` in one frame, and so does each handed over as [`bytes::Bytes`].
pub fn check(streaming: bool, body: &[u8], cuts: &[usize]) -> Result<(), String> {
    let whole = measure(streaming, &[body]);
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
    at.sort_unstable();
    let mut frames = Vec::with_capacity(at.len() + 1);
    let mut from = 0;
    for c in at {
        frames.push(&body[from..c]);
        from = c;
    }
    frames.push(&body[from..]);
    let split = measure(streaming, &frames);
    if split != whole {
        return Err(format!(
            "cut at {cuts:?}: {split:?}\nwhole: {whole:?}\nbody {:?}",
            String::from_utf8_lossy(body)
        ));
    }
    for (how, shared) in [
        ("shared, whole", measure_shared(streaming, &[body])),
        ("shared, cut", measure_shared(streaming, &frames)),
    ] {
        if shared != whole {
            return Err(format!(
                "{how} at {cuts:?}: {shared:?}\nwhole: {whole:?}\nbody {:?}",
                String::from_utf8_lossy(body)
            ));
        }
    }
    if body.len() <= 4096 {
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        let one_by_one = measure(streaming, &bytes);
        if one_by_one != whole {
            return Err(format!(
                "byte by byte: {one_by_one:?}\nwhole: {whole:?}\nbody {:?}",
                String::from_utf8_lossy(body)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    /// Response bodies of the vLLM 0.32 captures (streams and JSON).
    fn captures() -> Vec<(bool, Vec<u8>)> {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/vllm-0.32"
        );
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir).expect("the captures") {
            let path = e.expect("a capture").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_owned();
            let stream = name.starts_with("stream-");
            if !(stream || name.starts_with("nonstream-")) {
                continue;
            }
            let raw = std::fs::read(&path).expect("readable capture");
            if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                out.push((stream, raw[at + 4..].to_vec()));
            }
        }
        assert!(out.len() >= 10, "only {} captures", out.len());
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_framing_of_a_capture_measures_alike(
            pick in any::<prop::sample::Index>(),
            cuts in proptest::collection::vec(any::<usize>(), 0..24),
            flip in proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
        ) {
            let all = captures();
            let (stream, mut body) = all[pick.index(all.len())].clone();
            if let Some((i, b)) = flip {
                let i = i.index(body.len());
                body[i] = b;
            }
            if let Err(e) = super::check(stream, &body, &cuts) {
                prop_assert!(false, "{}", e);
            }
        }

        #[test]
        fn any_framing_of_any_bytes_measures_alike(
            stream in any::<bool>(),
            body in proptest::collection::vec(prop_oneof![Just(b'\n'), Just(b'\r'), Just(b':'), any::<u8>()], 0..256),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            prop_assert_eq!(super::check(stream, &body, &cuts), Ok(()));
        }
    }
}
