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
}

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
        }
    }

    /// Lines or events dropped because they exceeded [`MAX_LINE_BYTES`].
    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    /// Feed the next chunk of the stream; `on_event` is called for every event it completes.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        let mut pos = 0;
        if self.after_cr {
            self.after_cr = false;
            if bytes.first() == Some(&b'\n') {
                pos = 1;
            }
        }
        while pos < bytes.len() {
            let rest = &bytes[pos..];
            match memchr::memchr2(b'\n', b'\r', rest) {
                Some(i) => {
                    let end = pos + i;
                    let term = bytes[end];
                    if self.skipping_line {
                        self.skipping_line = false;
                    } else if self.line.is_empty() {
                        self.line_borrowed(bytes, pos, end, &mut on_event);
                    } else {
                        self.push_partial(&bytes[pos..end]);
                        if !self.skipping_line {
                            let line = std::mem::take(&mut self.line);
                            self.process_line(&line, None, bytes, &mut on_event);
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
    }

    /// End of stream: a last line without its line end, and a last event without its blank
    /// line, are dispatched (lenient: servers that close right after `data: [DONE]\n`).
    pub fn finish(&mut self, mut on_event: impl FnMut(SseEvent<'_>)) {
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
            self.line.clear();
            self.skipping_line = true;
            self.discarded += 1;
        } else {
            self.line.extend_from_slice(part);
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
                    self.data.clear();
                } else {
                    self.data.push(b'\n');
                    self.data.extend_from_slice(value);
                }
            }
        }
    }

    fn dispatch(&mut self, input: &[u8], on_event: &mut impl FnMut(SseEvent<'_>)) {
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
