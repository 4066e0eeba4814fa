//! Incremental Server-Sent Events parser (WHATWG `text/event-stream` framing).
//!
//! Pure: bytes in, events out, no I/O and no clock. Frames may split an event anywhere,
//! including between the `\r` and `\n` of a CRLF. No allocation per event: an event whose
//! single `data:` line lies wholly inside the chunk being fed is handed out borrowed from that
//! chunk; otherwise its data is assembled in an internal buffer that is reused.
//!
//! Memory is bounded: a line longer than [`MAX_LINE_BYTES`] (or an event whose joined data
//! grows past it) is discarded up to its end and counted in [`SseParser::discarded`], so a peer
//! that never sends a line end cannot grow the buffers without limit.

/// Longest line (and longest joined `data` of one event) the parser keeps, in bytes.
/// vLLM chunks with `top_logprobs` are a few KiB; 4 MiB leaves ample room.
pub const MAX_LINE_BYTES: usize = 4 << 20;

/// One dispatched event. `data` is the `data:` lines joined by `\n` (no trailing `\n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    pub data: &'a [u8],
    /// The `event:` field, when the event had one.
    pub event: Option<&'a [u8]>,
}

/// Where the data of the event being assembled currently lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Data {
    /// No `data:` line yet.
    None,
    /// Exactly one `data:` line, borrowed from the chunk being fed: `input[start..end]`.
    Borrowed(usize, usize),
    /// In `self.data` (several lines, or carried over from an earlier chunk).
    Buffered,
}

/// The incremental parser. Feed it chunks in order; call [`SseParser::finish`] at the end.
#[derive(Debug)]
pub struct SseParser {
    /// A line that started in an earlier chunk and has not ended yet.
    line: Vec<u8>,
    /// Joined data of the current event when it cannot be borrowed.
    data: Vec<u8>,
    /// The current event's `event:` field (short; kept in a reused buffer).
    event: Vec<u8>,
    has_event: bool,
    state: Data,
    /// The last byte seen was `\r`: a `\n` that follows belongs to the same line end.
    after_cr: bool,
    /// The current line is over the cap: drop bytes until its end.
    skipping_line: bool,
    /// The current event's data went over the cap: drop it at dispatch.
    event_oversized: bool,
    discarded: u64,
    /// Blank lines seen so far, each the end of a block (an event, or comments and fields
    /// that dispatch nothing): how [`SseParser::feed_one`] knows when to stop.
    blocks: u64,
    /// Bytes of a leading UTF-8 BOM matched so far; `None` once past the stream's start.
    bom: Option<usize>,
}

/// A stream may open with one UTF-8 byte order mark, which is not part of the first line.
const BOM: &[u8] = b"\xEF\xBB\xBF";

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    pub fn new() -> Self {
        Self {
            line: Vec::new(),
            data: Vec::new(),
            event: Vec::new(),
            has_event: false,
            state: Data::None,
            after_cr: false,
            skipping_line: false,
            event_oversized: false,
            discarded: 0,
            blocks: 0,
            bom: Some(0),
        }
    }

    /// Lines or events dropped because they exceeded [`MAX_LINE_BYTES`].
    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    /// Feed the next chunk of the stream; `on_event` is called for every event it completes.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        self.feed_until(bytes, false, &mut on_event);
    }

    /// [`SseParser::feed`] up to the end of the blank line that completes the first block
    /// (an event, or a block that dispatches nothing: comments, `id:`), its line end included:
    /// returns how many bytes of `bytes` it took (all of them when no block completes; see
    /// [`SseParser::blocks`]). The bytes taken are the block's own (from where the previous
    /// one ended), so a caller can pass, hold or drop each event's bytes as they came. Feeding
    /// the rest afterwards is feeding `bytes` whole; in between, the caller may look at the
    /// rest itself when [`SseParser::at_event_start`] (the meter frames an event that repeats
    /// its template without the parser).
    pub fn feed_one(&mut self, bytes: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) -> usize {
        self.feed_until(bytes, true, &mut on_event)
    }

    /// Blocks completed so far (blank lines seen).
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// The last byte fed was the `\r` of a line end: a `\n` that opens the next chunk belongs
    /// to that line end (and so to the block it ended).
    pub fn pending_cr(&self) -> bool {
        self.after_cr
    }

    /// Nothing of an event, line or line end is pending, and the stream's start (a BOM) is
    /// past: bytes fed from here parse as if the stream started with them.
    pub fn at_event_start(&self) -> bool {
        self.line.is_empty()
            && !self.skipping_line
            && self.state == Data::None
            && !self.has_event
            && !self.after_cr
            && !self.event_oversized
            && self.bom.is_none()
    }

    /// At the stream's start (no byte of a BOM seen yet), `bytes`, the next ones, open with a
    /// byte that is no BOM's: the stream's start is past, as [`SseParser::feed`] of them would
    /// find (it drops a BOM that is not there and parses the same bytes), and
    /// [`SseParser::at_event_start`] holds for the first event, so the meter's one-look paths
    /// may frame it. Returns whether it was settled now.
    #[inline]
    pub fn past_bom(&mut self, bytes: &[u8]) -> bool {
        let past = self.bom == Some(0) && bytes.first().is_some_and(|&b| b != BOM[0]);
        if past {
            self.bom = None;
        }
        past
    }

    fn feed_until(
        &mut self,
        bytes: &[u8],
        one: bool,
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) -> usize {
        let mut skip = 0;
        if let Some(seen) = self.bom {
            let n = bytes.len().min(BOM.len() - seen);
            if bytes[..n] == BOM[seen..seen + n] {
                skip = n;
                if seen + n < BOM.len() {
                    self.bom = Some(seen + n);
                    return bytes.len(); // still possibly a BOM (all of bytes matched)
                }
                self.bom = None;
            } else {
                // Not a BOM after all: what matched so far was data (no line end in it).
                self.bom = None;
                self.feed_lines(&BOM[..seen], false, on_event);
            }
        }
        skip + self.feed_lines(&bytes[skip..], one, on_event)
    }

    /// Returns the bytes taken: all of them, or with `one`, up to the end of the line that
    /// completed an event.
    fn feed_lines(
        &mut self,
        bytes: &[u8],
        one: bool,
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) -> usize {
        if bytes.is_empty() {
            return 0; // keeps `after_cr`: the `\n` of a CRLF may come in the next chunk
        }
        let blocks = self.blocks;
        let mut pos = 0;
        if self.after_cr {
            self.after_cr = false;
            if bytes.first() == Some(&b'\n') {
                pos = 1;
            }
        }
        while pos < bytes.len() {
            let rest = &bytes[pos..];
            if let Some((len, data)) = self.one_line_event(rest) {
                self.blocks += 1;
                on_event(SseEvent {
                    data: &rest[data],
                    event: None,
                });
                pos += len;
                if one {
                    break;
                }
                continue;
            }
            match memchr::memchr2(b'\n', b'\r', rest) {
                Some(i) => {
                    let end = pos + i;
                    let term = bytes[end];
                    if self.skipping_line {
                        self.skipping_line = false;
                    } else if self.line.is_empty() {
                        self.line_borrowed(bytes, pos, end, on_event);
                    } else {
                        self.push_partial(&bytes[pos..end]);
                        if !self.skipping_line {
                            let line = std::mem::take(&mut self.line);
                            self.process_line(&line, None, bytes, on_event);
                            self.line = line;
                            self.line.clear();
                        } else {
                            self.skipping_line = false;
                        }
                    }
                    pos = end + 1;
                    if term == b'\r' {
                        match bytes.get(pos) {
                            Some(b'\n') => pos += 1,
                            Some(_) => {}
                            None => self.after_cr = true,
                        }
                    }
                    if one && self.blocks != blocks {
                        break;
                    }
                }
                None => {
                    if !self.skipping_line {
                        self.push_partial(rest);
                    }
                    pos = bytes.len();
                }
            }
        }
        // A borrowed single-line data must not outlive this chunk: move it into the buffer.
        if let Data::Borrowed(s, e) = self.state {
            self.data.clear();
            self.data.extend_from_slice(&bytes[s..e]);
            self.state = Data::Buffered;
        }
        pos
    }

    /// The common event in one look: at an event's start, `rest` opens with one `data: ` line
    /// ended by `\n` and a blank line `\n`. Returns the bytes it spans and its data's range in
    /// `rest`: what the line-by-line path dispatches for it (the data line borrowed, the
    /// blank line dispatching it with no `event:` field), in one search for the line end
    /// rather than one per line and a search for the field's colon.
    #[inline]
    fn one_line_event(&self, rest: &[u8]) -> Option<(usize, std::ops::Range<usize>)> {
        const DATA: &[u8] = b"data: ";
        if !rest.starts_with(DATA)
            || !self.line.is_empty()
            || self.skipping_line
            || self.state != Data::None
            || self.has_event
            || self.event_oversized
        {
            return None;
        }
        let end = DATA.len() + memchr::memchr2(b'\n', b'\r', &rest[DATA.len()..])?;
        // The line as the line-by-line path sees it (a longer one is discarded there).
        if end > MAX_LINE_BYTES || rest.get(end..end + 2) != Some(&b"\n\n"[..]) {
            return None;
        }
        Some((end + 2, DATA.len()..end))
    }

    /// End of stream: a last line without its line end, and a last event without its blank
    /// line, are dispatched (lenient: servers that close right after `data: [DONE]\n`).
    pub fn finish(&mut self, mut on_event: impl FnMut(SseEvent<'_>)) {
        if let Some(seen) = self.bom.take() {
            self.feed_lines(&BOM[..seen], false, &mut on_event);
        }
        if !self.line.is_empty() && !self.skipping_line {
            let line = std::mem::take(&mut self.line);
            self.process_line(&line, None, &[], &mut on_event);
            self.line = line;
        }
        self.line.clear();
        self.skipping_line = false;
        self.after_cr = false;
        self.dispatch(&[], &mut on_event);
    }

    fn push_partial(&mut self, part: &[u8]) {
        if self.line.len() + part.len() > MAX_LINE_BYTES {
            self.line = Vec::new(); // give the memory back too
            self.skipping_line = true;
            self.discarded += 1;
        } else {
            extend_capped(&mut self.line, part);
        }
    }

    fn line_borrowed(
        &mut self,
        input: &[u8],
        start: usize,
        end: usize,
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) {
        if end - start > MAX_LINE_BYTES {
            self.discarded += 1;
            return;
        }
        self.process_line(&input[start..end], Some(start), input, on_event);
    }

    /// `line` has no terminator. `at` is its offset in `input` when it is borrowed from it.
    fn process_line(
        &mut self,
        line: &[u8],
        at: Option<usize>,
        input: &[u8],
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) {
        if line.is_empty() {
            self.dispatch(input, on_event);
            return;
        }
        if line[0] == b':' {
            return; // comment
        }
        let (name, value, value_off) = match memchr::memchr(b':', line) {
            Some(c) => {
                let v = &line[c + 1..];
                if v.first() == Some(&b' ') {
                    (&line[..c], &v[1..], c + 2)
                } else {
                    (&line[..c], v, c + 1)
                }
            }
            None => (line, &line[line.len()..], line.len()),
        };
        match name {
            b"data" => self.push_data(value, at.map(|a| a + value_off), input),
            b"event" => {
                self.event.clear();
                self.event.extend_from_slice(value);
                self.has_event = true;
            }
            _ => {} // id, retry and unknown fields do not matter for measurement
        }
    }

    fn push_data(&mut self, value: &[u8], borrowed_at: Option<usize>, input: &[u8]) {
        if self.event_oversized {
            return;
        }
        if let Data::Borrowed(s, e) = self.state {
            // A second data line: the event can no longer be one borrowed slice.
            self.data.clear();
            self.data.extend_from_slice(&input[s..e]);
            self.state = Data::Buffered;
        }
        match (self.state, borrowed_at) {
            (Data::None, Some(s)) => self.state = Data::Borrowed(s, s + value.len()),
            (Data::None, None) => {
                self.data.clear();
                self.data.extend_from_slice(value);
                self.state = Data::Buffered;
            }
            (Data::Buffered | Data::Borrowed(..), _) => {
                if self.data.len() + 1 + value.len() > MAX_LINE_BYTES {
                    self.event_oversized = true;
                    self.discarded += 1;
                    self.data = Vec::new();
                } else {
                    extend_capped(&mut self.data, b"\n");
                    extend_capped(&mut self.data, value);
                }
            }
        }
    }

    fn dispatch(&mut self, input: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) {
        self.blocks += 1;
        let event = if self.has_event {
            Some(self.event.as_slice())
        } else {
            None
        };
        match self.state {
            Data::None => {}
            _ if self.event_oversized => {}
            Data::Borrowed(s, e) => on_event(SseEvent {
                data: &input[s..e],
                event,
            }),
            Data::Buffered => on_event(SseEvent {
                data: &self.data,
                event,
            }),
        }
        self.state = Data::None;
        self.has_event = false;
        self.event_oversized = false;
    }
}

/// Append, growing by doubling but never past [`MAX_LINE_BYTES`] of capacity (the caller has
/// checked that the result fits).
fn extend_capped(buf: &mut Vec<u8>, part: &[u8]) {
    let need = buf.len() + part.len();
    if need > buf.capacity() {
        let target = need.max(buf.capacity() * 2).min(MAX_LINE_BYTES.max(need));
        buf.reserve_exact(target - buf.len());
    }
    buf.extend_from_slice(part);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Ev = (Option<Vec<u8>>, Vec<u8>);

    fn run(parser: &mut SseParser, chunks: &[&[u8]]) -> Vec<Ev> {
        let mut out = Vec::new();
        for c in chunks {
            parser.feed(c, |e| {
                out.push((e.event.map(<[u8]>::to_vec), e.data.to_vec()))
            });
        }
        parser.finish(|e| out.push((e.event.map(<[u8]>::to_vec), e.data.to_vec())));
        out
    }

    fn events(chunks: &[&[u8]]) -> Vec<Ev> {
        run(&mut SseParser::new(), chunks)
    }

    fn data(v: &[&str]) -> Vec<Ev> {
        v.iter().map(|d| (None, d.as_bytes().to_vec())).collect()
    }

    #[test]
    fn table() {
        type Case<'a> = (&'a str, &'a [&'a [u8]], Vec<Ev>);
        let cases: &[Case] = &[
            ("lf", &[b"data: a\n\n"], data(&["a"])),
            ("crlf", &[b"data: a\r\n\r\n"], data(&["a"])),
            ("cr", &[b"data: a\r\rdata: b\r\r"], data(&["a", "b"])),
            (
                "mixed ends",
                &[b"data: a\r\n\rdata: b\n\r\n"],
                data(&["a", "b"]),
            ),
            ("comment", &[b": ping\ndata: x\n\n:\n\n"], data(&["x"])),
            (
                "multi-line",
                &[b"data: a\ndata: b\ndata:c\n\n"],
                data(&["a\nb\nc"]),
            ),
            ("no space", &[b"data:a\n\n"], data(&["a"])),
            ("one space stripped", &[b"data:  a\n\n"], data(&[" a"])),
            ("bare data", &[b"data\n\n"], data(&[""])),
            ("empty data", &[b"data:\n\n"], data(&[""])),
            ("blank lines only", &[b"\n\n\r\n\r\r"], vec![]),
            (
                "no data, no event",
                &[b"id: 1\nretry: 5\nfoo: bar\n\n"],
                vec![],
            ),
            (
                "missing final blank",
                &[b"data: a\n\ndata: [DONE]\n"],
                data(&["a", "[DONE]"]),
            ),
            (
                "missing final line end",
                &[b"data: [DONE]"],
                data(&["[DONE]"]),
            ),
            (
                "event name",
                &[b"event: error\ndata: {}\n\n"],
                vec![(Some(b"error".to_vec()), b"{}".to_vec())],
            ),
            (
                "event name resets",
                &[b"event: x\n\ndata: y\n\n"],
                data(&["y"]),
            ),
            (
                "non-utf8",
                &[b"data: \xff\xfe\x00\n\n"],
                vec![(None, b"\xff\xfe\x00".to_vec())],
            ),
            (
                "crlf split at cr",
                &[b"data: a\r", b"\ndata: b\r\n\r\n"],
                data(&["a\nb"]),
            ),
            (
                "cr then cr across chunks",
                &[b"data: a\r", b"\r"],
                data(&["a"]),
            ),
            (
                "crlf blank split",
                &[b"data: a\r\n\r", b"\ndata: b\r\n\r\n"],
                data(&["a", "b"]),
            ),
            (
                "split mid field",
                &[b"da", b"ta: h", b"i\n", b"\n"],
                data(&["hi"]),
            ),
            (
                "value with colon",
                &[b"data: {\"a\":1}\n\n"],
                data(&["{\"a\":1}"]),
            ),
            ("leading BOM", &[b"\xEF\xBB\xBFdata: a\n\n"], data(&["a"])),
            (
                "BOM split",
                &[b"\xEF", b"\xBB", b"\xBFdata: a\n\n"],
                data(&["a"]),
            ),
            (
                "BOM only once",
                &[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n"],
                vec![],
            ),
            (
                "BOM later is data",
                &[b"data: \xEF\xBB\xBF\n\n"],
                vec![(None, b"\xEF\xBB\xBF".to_vec())],
            ),
            ("half a BOM is data", &[b"\xEF\xBB", b"data: a\n\n"], vec![]),
            (
                "half a BOM, then a line",
                &[b"\xEF", b"\n", b"data: a\n\n"],
                data(&["a"]),
            ),
        ];
        for (name, chunks, want) in cases {
            assert_eq!(&events(chunks), want, "case {name}");
            // Settled by each chunk's first byte first, as the meter does: the same events.
            let mut p = SseParser::new();
            let mut got = Vec::new();
            for c in chunks.iter() {
                p.past_bom(c);
                p.feed(c, |e| {
                    got.push((e.event.map(<[u8]>::to_vec), e.data.to_vec()))
                });
            }
            p.finish(|e| got.push((e.event.map(<[u8]>::to_vec), e.data.to_vec())));
            assert_eq!(&got, want, "case {name}, BOM settled first");
        }
    }

    #[test]
    fn event_inside_one_chunk_is_borrowed_from_it() {
        let input = b"data: {\"x\":1}\n\ndata: [DONE]\n\n";
        let range = input.as_ptr_range();
        let mut p = SseParser::new();
        let mut n = 0;
        p.feed(input, |e| {
            assert!(range.contains(&e.data.as_ptr()), "not borrowed");
            n += 1;
        });
        assert_eq!(n, 2);
        assert_eq!(p.data.capacity(), 0, "no buffer was needed");
    }

    #[test]
    fn buffers_are_reused_across_events() {
        let mut p = SseParser::new();
        let mut seen = 0;
        for _ in 0..100 {
            p.feed(b"data: a", |_| seen += 1);
            p.feed(b"bc\ndata: d\n\n", |e| {
                assert_eq!(e.data, b"abc\nd");
                seen += 1;
            });
        }
        assert_eq!(seen, 100);
        assert!(p.data.capacity() < 64 && p.line.capacity() < 64);
    }

    #[test]
    fn a_line_that_never_ends_is_capped() {
        let mut p = SseParser::new();
        let piece = vec![b'x'; 64 * 1024];
        p.feed(b"data: ", |_| panic!("no event yet"));
        for _ in 0..(MAX_LINE_BYTES / piece.len() + 8) {
            p.feed(&piece, |_| panic!("an overlong line is not an event"));
        }
        assert!(p.line.capacity() <= MAX_LINE_BYTES, "buffer bounded");
        assert_eq!(p.discarded(), 1);
        let got = run(&mut p, &[b"tail\n\ndata: ok\n\n"]);
        assert_eq!(got, data(&["ok"]), "parsing resumes after the line ends");
    }

    #[test]
    fn an_event_whose_joined_data_is_too_big_is_dropped() {
        let line = [b"data: ".as_slice(), &vec![b'y'; MAX_LINE_BYTES / 2], b"\n"].concat();
        let mut p = SseParser::new();
        let got = run(&mut p, &[&line, &line, &line, b"\ndata: ok\n\n"]);
        assert_eq!(got, data(&["ok"]));
        assert_eq!(p.discarded(), 1);
    }

    #[test]
    fn every_capture_parses_to_its_data_lines() {
        for (name, _) in crate::fixtures::CAPTURES {
            let c = crate::fixtures::capture(name);
            if !name.starts_with("stream-") {
                continue;
            }
            let got = events(&[c.body]);
            let want: Vec<Ev> = c
                .body
                .split(|b| *b == b'\n')
                .filter_map(|l| l.strip_prefix(b"data: "))
                .map(|d| (None, d.to_vec()))
                .collect();
            assert!(want.len() > 2, "{name}");
            assert_eq!(got, want, "{name}");
            assert_eq!(got.last().unwrap().1, b"[DONE]", "{name}");
        }
    }

    /// Pieces that exercise every rule, glued at random.
    fn piece() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"data: {\"a\":1}".to_vec()),
            Just(b"data: ".to_vec()),
            Just(b"data: {\"a\":1}\n\n".to_vec()),
            Just(b"data:x".to_vec()),
            Just(b"data".to_vec()),
            Just(b"event: error".to_vec()),
            Just(b": comment".to_vec()),
            Just(b"id: 7".to_vec()),
            Just(b"\n".to_vec()),
            Just(b"\r".to_vec()),
            Just(b"\r\n".to_vec()),
            Just(b"\n\n".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..8),
        ]
    }

    fn split_stream() -> impl Strategy<Value = (Vec<u8>, Vec<usize>)> {
        proptest::collection::vec(piece(), 0..40).prop_flat_map(|pieces| {
            let stream = pieces.concat();
            let len = stream.len();
            (Just(stream), proptest::collection::vec(0..=len, 0..12))
        })
    }

    #[test]
    fn an_empty_chunk_between_cr_and_lf_is_not_a_blank_line() {
        // Found by the split proptest: an empty frame used to forget the pending `\r`, so the
        // `\n` after it ended a second (blank) line and dispatched the event early.
        let want = events(&[b"event: e\r\ndata: x\r\n\r\n"]);
        assert_eq!(want, vec![(Some(b"e".to_vec()), b"x".to_vec())]);
        let got = events(&[b"event: e\r", b"", b"\ndata: x\r", b"", b"", b"\n\r\n"]);
        assert_eq!(got, want);
    }

    proptest! {
        #[test]
        fn any_split_yields_the_same_events((stream, mut cuts) in split_stream(), bom in 0usize..6) {
            // Sometimes a whole or a partial BOM up front.
            let stream = [&BOM[..bom.min(3)], stream.as_slice()].concat();
            cuts.iter_mut().for_each(|c| *c = (*c).min(stream.len()));
            cuts.sort_unstable();
            let mut chunks: Vec<&[u8]> = Vec::new();
            let mut at = 0;
            for c in cuts {
                chunks.push(&stream[at..c]);
                at = c;
            }
            chunks.push(&stream[at..]);
            prop_assert_eq!(events(&chunks), events(&[&stream]));
            // Byte by byte too: every line reaches the line-by-line path (an event in one look
            // needs all of it in one chunk), the reference for `one_line_event`.
            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            prop_assert_eq!(events(&bytes), events(&[&stream]));
        }

        #[test]
        fn garbage_never_panics(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..16)) {
            let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            let _ = events(&refs);
        }
    }
}
