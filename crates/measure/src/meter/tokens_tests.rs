//! Tokens of one event (DESIGN.md): the growth of the engine's running
//! `usage.completion_tokens` when it sends continuous usage (vLLM `continuous_usage_stats`,
//! `--enable-force-include-usage`; counted per choice), else the event's `logprobs` entries,
//! else 1. Table-driven over the shapes engines send, then a property: however the bytes are
//! split, each event's tokens are counted when its last byte is fed, and the totals agree.

use proptest::prelude::*;

use super::*;

const PROMPT: u64 = 5;

fn usage_json(completion: u64) -> String {
    format!(
        r#","usage":{{"prompt_tokens":{PROMPT},"total_tokens":{},"completion_tokens":{completion}}}"#,
        PROMPT + completion
    )
}

/// One event: choice `index`'s role chunk (`text` None) or a delta with `text` and `logprobs`
/// entries, an optional finish, and an optional running count.
fn chunk(
    index: u32,
    text: Option<&str>,
    logprobs: usize,
    finish: Option<&str>,
    running: Option<u64>,
) -> String {
    let delta = match text {
        None => r#"{"role":"assistant","content":""}"#.to_string(),
        Some(t) => format!(r#"{{"content":"{t}"}}"#),
    };
    let lp = if logprobs > 0 {
        let one = r#"{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[]}"#;
        format!(
            r#","logprobs":{{"content":[{}]}}"#,
            vec![one; logprobs].join(",")
        )
    } else {
        String::new()
    };
    let finish = finish.map_or("null".to_string(), |f| format!(r#""{f}""#));
    let usage = running.map_or(String::new(), usage_json);
    format!(
        r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{{"index":{index},"delta":{delta}{lp},"finish_reason":{finish}}}]{usage}}}"#
    ) + "\n\n"
}

fn final_usage(completion: u64) -> String {
    format!(
        r#"data: {{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[]{}}}"#,
        usage_json(completion)
    ) + "\n\n"
}

const DONE: &str = "data: [DONE]\n\n";

/// Feeds each event as its own frame, 10 ms apart from 100 ms; returns each event's tokens
/// (what it added to the request's count) and the measurement.
fn per_event(events: &[String]) -> (Vec<u64>, Measurement, StreamMeter) {
    let t0 = Instant::now();
    let mut m = StreamMeter::new(t0, true);
    m.on_head(t0, 200);
    let mut counts = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let before = m.tl.counted_tokens;
        m.on_frame(
            t0 + Duration::from_millis(100 + 10 * i as u64),
            e.as_bytes(),
            |_| {},
        );
        counts.push(m.tl.counted_tokens - before);
    }
    let end = t0 + Duration::from_millis(100 + 10 * events.len() as u64);
    let measured = m.finish(end, Ending::Complete);
    (counts, measured, m)
}

#[test]
fn the_tokens_of_one_chunk_entry() {
    // (running count now, the choice's previous one, logprobs-or-1) -> tokens
    let cases: [(Option<u64>, Option<u64>, u32, u64); 7] = [
        (Some(5), Some(1), 1, 4), // growth: a packed event of 4 tokens
        (Some(5), Some(1), 2, 4), // growth wins over logprobs entries
        (Some(1), Some(1), 0, 0), // no growth (a chunk without output): nothing
        (Some(3), None, 1, 1),    // first count of the choice: nothing to grow from
        (None, Some(3), 2, 2),    // no usage on this chunk: logprobs entries
        (None, None, 1, 1),       // nothing: 1 for an output event
        (Some(2), Some(9), 1, 1), // a count that went down is no running count
    ];
    for (running, before, scanned, want) in cases {
        assert_eq!(
            event_tokens(running, before, scanned),
            want,
            "{running:?} after {before:?}, scanned {scanned}"
        );
    }
}

#[test]
fn each_event_counts_its_tokens_as_the_engine_sent_them() {
    let c = |i, t, f, r| chunk(i, Some(t), 0, f, r);
    // (name, events, each event's tokens, completion tokens, exact, per-choice tokens)
    type Case = (&'static str, Vec<String>, Vec<u64>, u64, bool, Vec<u64>);
    let cases: Vec<Case> = vec![
        (
            // vLLM --stream-interval 4 with continuous usage: events of 1, 4, 4, 1 tokens;
            // the end-of-sequence token rides on the finish chunk without text.
            "stream interval 4, continuous usage",
            vec![
                chunk(0, None, 0, None, Some(0)),
                c(0, "a", None, Some(1)),
                c(0, "bcde", None, Some(5)),
                c(0, "fghi", None, Some(9)),
                c(0, "j", None, Some(10)),
                c(0, "", Some("stop"), Some(11)),
                final_usage(11),
                DONE.into(),
            ],
            vec![0, 1, 4, 4, 1, 1, 0, 0],
            11,
            true,
            vec![11],
        ),
        (
            // The same stream cut before its final usage chunk: the running count is exact.
            "continuous usage, no final usage chunk",
            vec![
                chunk(0, None, 0, None, Some(0)),
                c(0, "ab", None, Some(2)),
                c(0, "cde", None, Some(5)),
            ],
            vec![0, 2, 3],
            5,
            true,
            vec![5],
        ),
        (
            // n = 2 interleaved: vLLM's running count is per choice; the final usage sums.
            "two choices, continuous usage",
            vec![
                chunk(0, None, 0, None, Some(0)),
                chunk(1, None, 0, None, Some(0)),
                c(0, "ab", None, Some(2)),
                c(1, "abc", None, Some(3)),
                c(0, "cd", Some("length"), Some(4)),
                c(1, "def", Some("length"), Some(6)),
                final_usage(10),
                DONE.into(),
            ],
            vec![0, 0, 2, 3, 2, 3, 0, 0],
            10,
            true,
            vec![4, 6],
        ),
        (
            // Two choices cut short: their running counts add up to the request's tokens
            // (the last count seen would be one choice's).
            "two choices, cut short",
            vec![
                chunk(0, None, 0, None, Some(0)),
                chunk(1, None, 0, None, Some(0)),
                c(0, "ab", None, Some(2)),
                c(1, "abc", None, Some(3)),
            ],
            vec![0, 0, 2, 3],
            5,
            true,
            vec![2, 3],
        ),
        (
            // No continuous usage: logprobs entries, then the final usage for the total.
            "logprobs entries",
            vec![
                chunk(0, None, 0, None, None),
                chunk(0, Some("ab"), 2, None, None),
                chunk(0, Some("c"), 1, Some("stop"), None),
                final_usage(3),
                DONE.into(),
            ],
            vec![0, 2, 1, 0, 0],
            3,
            true,
            vec![3],
        ),
        (
            // Nothing but events: one token each, a lower bound.
            "events only",
            vec![
                chunk(0, None, 0, None, None),
                c(0, "ab", None, None),
                c(0, "cd", Some("stop"), None),
                DONE.into(),
            ],
            vec![0, 1, 1, 0],
            2,
            false,
            vec![2],
        ),
        (
            // Usage only on the last chunk (llama.cpp's shape): it has nothing to grow from,
            // so that event counts 1; the count itself is the request's (exact).
            "usage on the last chunk only",
            vec![
                c(0, "ab", None, None),
                c(0, "cd", None, None),
                c(0, "e", Some("stop"), Some(7)),
                DONE.into(),
            ],
            vec![1, 1, 1, 0],
            7,
            true,
            vec![3],
        ),
    ];
    for (name, events, want, completion, exact, choices) in cases {
        let (got, m, meter) = per_event(&events);
        assert_eq!(got, want, "{name}: tokens per event");
        assert_eq!(
            (m.completion_tokens, m.tokens_exact),
            (Some(completion), exact),
            "{name}: request tokens"
        );
        let per_choice: Vec<u64> = meter.tl.all_choices().map(|c| c.tokens).collect();
        assert_eq!(per_choice, choices, "{name}: tokens per choice");
    }
}

#[test]
fn several_choices_time_per_token_on_their_own_counts() {
    // Two choices packed differently (vLLM under load): choice 0 in events of 3 tokens,
    // choice 1 one token per event; 10 ms between events. With continuous usage each TPOT
    // is its span over its own tokens - 1; counting events would make choice 0's 3x larger.
    let mut events = vec![
        chunk(0, None, 0, None, Some(0)),
        chunk(1, None, 0, None, Some(0)),
    ];
    for k in 1..=4u64 {
        let finish = (k == 4).then_some("length");
        events.push(chunk(0, Some("abc"), 0, finish, Some(3 * k)));
        events.push(chunk(1, Some("a"), 0, finish, Some(k)));
    }
    events.push(final_usage(16));
    events.push(DONE.into());
    let (_, m, _) = per_event(&events);
    // Choice 0: events at 120, 140, 160, 180 ms: 60 ms over 12 - 1 tokens; choice 1: events
    // at 130 .. 190 ms: 60 ms over 4 - 1.
    let want = [
        Duration::from_millis(60) / 11,
        Duration::from_millis(60) / 3,
    ];
    assert_eq!(&m.choice_tpots[..], &want[..]);
    assert_eq!(m.tpot, Some(want[1]), "the SLO judges the slowest choice");
    assert_eq!((m.completion_tokens, m.tokens_exact), (Some(16), true));
    // ITL stays one gap per event of a choice (DESIGN.md): 3 + 3.
    assert_eq!(m.itl_count, 6);
}

/// A stream of `choices` (each a list of event sizes in tokens) interleaved in `order`, with
/// continuous usage on every chunk, role chunks first, an optional final usage chunk, `[DONE]`.
/// Returns its bytes and, per event, where it ends and how many tokens it carries.
fn generated(
    choices: &[Vec<u64>],
    order: &[usize],
    final_chunk: bool,
) -> (Vec<u8>, Vec<(usize, u64)>) {
    let mut events: Vec<(String, u64)> = Vec::new();
    for i in 0..choices.len() {
        events.push((chunk(i as u32, None, 0, None, Some(0)), 0));
    }
    let n = choices.len();
    let mut next = vec![0usize; n];
    let mut running = vec![0u64; n];
    let mut picks = order.iter().cycle();
    let total: usize = choices.iter().map(Vec::len).sum();
    for _ in 0..total {
        // The picked choice, or the first unfinished one when it is done.
        let want = picks.next().copied().unwrap_or(0) % n;
        let i = if next[want] < choices[want].len() {
            want
        } else {
            (0..n).find(|&j| next[j] < choices[j].len()).unwrap_or(want)
        };
        let k = choices[i][next[i]];
        next[i] += 1;
        running[i] += k;
        let finish = (next[i] == choices[i].len()).then_some("length");
        let text = "t".repeat(k as usize);
        events.push((chunk(i as u32, Some(&text), 0, finish, Some(running[i])), k));
    }
    if final_chunk {
        events.push((final_usage(running.iter().sum()), 0));
    }
    events.push((DONE.into(), 0));
    let mut bytes = Vec::new();
    let mut ends = Vec::new();
    for (e, k) in events {
        bytes.extend_from_slice(e.as_bytes());
        ends.push((bytes.len(), k));
    }
    (bytes, ends)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// However the body is cut, after each frame the request's count is the sum of the
    /// tokens of the events whose last byte was fed, with and without the repeat cache.
    #[test]
    fn tokens_per_event_survive_any_split(
        choices in proptest::collection::vec(proptest::collection::vec(1u64..=5, 1..6), 1..=3),
        order in proptest::collection::vec(0usize..3, 1..8),
        cuts in proptest::collection::vec(any::<usize>(), 0..16),
        final_chunk in any::<bool>(),
        cache in any::<bool>(),
    ) {
        let (body, ends) = generated(&choices, &order, final_chunk);
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        at.push(body.len());
        at.sort_unstable();
        at.dedup();
        let t0 = Instant::now();
        let mut m = StreamMeter::new(t0, true);
        if !cache {
            m = m.without_repeat_cache();
        }
        m.on_head(t0, 200);
        let mut from = 0;
        for (k, cut) in at.into_iter().enumerate() {
            m.on_frame(t0 + Duration::from_millis(k as u64), &body[from..cut], |_| {});
            from = cut;
            let want: u64 = ends.iter().filter(|(end, _)| *end <= cut).map(|(_, k)| k).sum();
            prop_assert_eq!(m.tl.counted_tokens, want, "after {} bytes", cut);
        }
        let per_choice: Vec<u64> = m.tl.all_choices().map(|c| c.tokens).collect();
        let want: Vec<u64> = choices.iter().map(|c| c.iter().sum()).collect();
        prop_assert_eq!(per_choice, want);
        let measured = m.finish(t0 + Duration::from_secs(1), Ending::Complete);
        let total: u64 = choices.iter().flatten().sum();
        prop_assert_eq!((measured.completion_tokens, measured.tokens_exact), (Some(total), true));
        prop_assert_eq!(measured.outcome, Outcome::Success);
    }
}
