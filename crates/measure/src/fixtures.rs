//! Test-only access to the real vLLM 0.32 captures in `tests/fixtures/vllm-0.32/`.

macro_rules! capture {
    ($name:literal) => {
        include_bytes!(concat!("../../../tests/fixtures/vllm-0.32/", $name))
    };
}

/// Every capture: (file name, raw bytes).
pub const CAPTURES: &[(&str, &[u8])] = &[
    ("stream-chat.txt", capture!("stream-chat.txt")),
    ("stream-chat-usage.txt", capture!("stream-chat-usage.txt")),
    (
        "stream-chat-usage-continuous.txt",
        capture!("stream-chat-usage-continuous.txt"),
    ),
    (
        "stream-chat-logprobs.txt",
        capture!("stream-chat-logprobs.txt"),
    ),
    ("stream-chat-stop.txt", capture!("stream-chat-stop.txt")),
    ("stream-chat-n2.txt", capture!("stream-chat-n2.txt")),
    ("stream-completions.txt", capture!("stream-completions.txt")),
    (
        "stream-completions-logprobs.txt",
        capture!("stream-completions-logprobs.txt"),
    ),
    ("nonstream-chat.txt", capture!("nonstream-chat.txt")),
    (
        "stream-chat-tool-named.txt",
        capture!("stream-chat-tool-named.txt"),
    ),
    (
        "stream-chat-tool-named-logprobs.txt",
        capture!("stream-chat-tool-named-logprobs.txt"),
    ),
    (
        "stream-chat-tool-required.txt",
        capture!("stream-chat-tool-required.txt"),
    ),
    (
        "stream-chat-tool-auto.txt",
        capture!("stream-chat-tool-auto.txt"),
    ),
    (
        "nonstream-chat-tool-named.txt",
        capture!("nonstream-chat-tool-named.txt"),
    ),
    (
        "stream-chat-reasoning.txt",
        capture!("stream-chat-reasoning.txt"),
    ),
    (
        "nonstream-chat-reasoning.txt",
        capture!("nonstream-chat-reasoning.txt"),
    ),
    ("error-too-long.txt", capture!("error-too-long.txt")),
    (
        "error-unknown-model.txt",
        capture!("error-unknown-model.txt"),
    ),
    // Engine options (`options/README` rows in the captures' README.md).
    (
        "options/force-stream-chat.txt",
        capture!("options/force-stream-chat.txt"),
    ),
    (
        "options/force-stream-chat-options-empty.txt",
        capture!("options/force-stream-chat-options-empty.txt"),
    ),
    (
        "options/force-stream-chat-usage.txt",
        capture!("options/force-stream-chat-usage.txt"),
    ),
    (
        "options/force-stream-chat-n2-usage.txt",
        capture!("options/force-stream-chat-n2-usage.txt"),
    ),
    (
        "options/force-stream-completions.txt",
        capture!("options/force-stream-completions.txt"),
    ),
    (
        "options/force-stream-chat-logprobs-usage.txt",
        capture!("options/force-stream-chat-logprobs-usage.txt"),
    ),
    (
        "options/all-stream-chat.txt",
        capture!("options/all-stream-chat.txt"),
    ),
    (
        "options/all-stream-chat-queued.txt",
        capture!("options/all-stream-chat-queued.txt"),
    ),
    (
        "options/keepalive-stream-chat-queued.txt",
        capture!("options/keepalive-stream-chat-queued.txt"),
    ),
    (
        "options/keepalive-stream-chat-queued-usage.txt",
        capture!("options/keepalive-stream-chat-queued-usage.txt"),
    ),
    (
        "options/metrics-stream-chat.txt",
        capture!("options/metrics-stream-chat.txt"),
    ),
    (
        "options/metrics-stream-chat-usage.txt",
        capture!("options/metrics-stream-chat-usage.txt"),
    ),
    (
        "options/metrics-stream-chat-usage-continuous.txt",
        capture!("options/metrics-stream-chat-usage-continuous.txt"),
    ),
    (
        "options/metrics-stream-completions-usage.txt",
        capture!("options/metrics-stream-completions-usage.txt"),
    ),
    (
        "options/metrics-nonstream-chat.txt",
        capture!("options/metrics-nonstream-chat.txt"),
    ),
    (
        "options/metrics-stream-chat-n2-usage.txt",
        capture!("options/metrics-stream-chat-n2-usage.txt"),
    ),
    (
        "options/metrics-stream-chat-prefix-again.txt",
        capture!("options/metrics-stream-chat-prefix-again.txt"),
    ),
    (
        "options/interval4-stream-chat.txt",
        capture!("options/interval4-stream-chat.txt"),
    ),
    (
        "options/interval4-stream-chat-usage.txt",
        capture!("options/interval4-stream-chat-usage.txt"),
    ),
    (
        "options/interval4-stream-chat-usage-continuous.txt",
        capture!("options/interval4-stream-chat-usage-continuous.txt"),
    ),
];

/// A parsed capture: the request body, the status, the response body.
pub struct Capture {
    pub request: &'static [u8],
    pub status: u16,
    pub body: &'static [u8],
}

pub fn capture(name: &str) -> Capture {
    let raw = CAPTURES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
        .unwrap_or_else(|| panic!("no capture {name}"));
    parse_capture(raw)
}

/// A capture file's bytes, read (see the captures' README.md).
pub fn parse_capture(raw: &'static [u8]) -> Capture {
    let mut rest = raw;
    let mut request: &[u8] = b"";
    // Our `### ` lines first.
    while rest.starts_with(b"### ") {
        let end = rest.iter().position(|b| *b == b'\n').unwrap() + 1;
        let line = &rest[..end - 1];
        if let Some(r) = line.strip_prefix(b"### request body: ") {
            request = r;
        }
        rest = &rest[end..];
    }
    // Then the HTTP head, CRLF-terminated, up to the blank line.
    let head_end = rest.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status_line = &rest[..rest.iter().position(|b| *b == b'\r').unwrap()];
    let status = std::str::from_utf8(&status_line[9..12])
        .unwrap()
        .parse()
        .unwrap();
    Capture {
        request,
        status,
        body: &rest[head_end + 4..],
    }
}
