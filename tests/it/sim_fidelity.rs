//! Simulator fidelity: the real vLLM 0.32 captures (tests/sim_fixtures/vllm-0.32, copied from
//! shared/fixtures) are the reference. Each captured request is replayed against the sim and
//! the responses are compared chunk by chunk on structure: header names in order, fixed
//! header values, every JSON key in order, value types, and the values that carry meaning
//! (object, role, finish_reason, stop_reason, system_fingerprint, index). Ids, timestamps,
//! token text and logprob numbers are masked. Runs of identical content-chunk skeletons are
//! collapsed, so a capture whose length depends on the model's text (a stop string) still
//! compares. `/metrics` is compared on its family list, types and bucket grids.

use std::collections::BTreeMap;

use crate::support::raw_http::*;
use goodput_sim::SimConfig;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sim_fixtures/vllm-0.32");
/// The project's captures (including the later ones); read in place, preferred over `DIR`.
const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/vllm-0.32");

fn capture_path(name: &str) -> String {
    let fix = format!("{FIX}/{name}");
    if std::path::Path::new(&fix).exists() {
        fix
    } else {
        format!("{DIR}/{name}")
    }
}

pub(crate) struct Capture {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) body: String,
    pub(crate) head: String,
    pub(crate) resp_body: String,
}

pub(crate) fn load(name: &str) -> Capture {
    let raw = std::fs::read_to_string(capture_path(name)).unwrap();
    let mut method = String::new();
    let mut path = String::new();
    let mut body = String::new();
    let mut rest = raw.as_str();
    while let Some(line) = rest.strip_prefix("### ") {
        let (l, r) = line.split_once('\n').unwrap();
        if let Some(b) = l.strip_prefix("request body: ") {
            body = b.to_string();
        } else if let Some((m, p)) = l.split_once(' ') {
            if m == "POST" || m == "GET" {
                method = m.to_string();
                path = p.trim().to_string();
            }
        }
        rest = r;
    }
    let (head, resp_body) = rest.split_once("\r\n\r\n").unwrap();
    Capture {
        method,
        path,
        body,
        head: head.to_string(),
        resp_body: resp_body.to_string(),
    }
}

/// Values kept verbatim in skeletons; every other string becomes "S", number N.
const KEEP: &[&str] = &[
    "object",
    "role",
    "finish_reason",
    "stop_reason",
    "system_fingerprint",
    "index",
    "type",
    "param",
    "code",
];

struct Sk<'a> {
    b: &'a [u8],
    i: usize,
}

impl Sk<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && (self.b[self.i] as char).is_whitespace() {
            self.i += 1;
        }
    }
    fn string(&mut self) -> String {
        let start = self.i;
        self.i += 1;
        while self.b[self.i] != b'"' {
            if self.b[self.i] == b'\\' {
                self.i += 1;
            }
            self.i += 1;
        }
        self.i += 1;
        String::from_utf8(self.b[start..self.i].to_vec()).unwrap()
    }
    fn value(&mut self, key: &str, out: &mut String) {
        self.ws();
        match self.b[self.i] {
            b'{' => {
                self.i += 1;
                let mut inner = String::new();
                let mut keys = Vec::new();
                loop {
                    self.ws();
                    if self.b[self.i] == b'}' {
                        self.i += 1;
                        break;
                    }
                    if self.b[self.i] == b',' {
                        self.i += 1;
                        continue;
                    }
                    let k = self.string();
                    self.ws();
                    self.i += 1; // ':'
                    let mut v = String::new();
                    self.value(k.trim_matches('"'), &mut v);
                    keys.push(k.clone());
                    inner.push_str(&format!("{k}:{v},"));
                }
                // A legacy top_logprobs dict: token -> logprob, keys are text.
                if key == "top_logprobs" && !keys.iter().any(|k| k == "\"token\"") {
                    out.push_str(&format!("{{dict of {}}}", keys.len()));
                } else {
                    out.push_str(&format!("{{{inner}}}"));
                }
            }
            b'[' => {
                self.i += 1;
                let mut items = Vec::new();
                loop {
                    self.ws();
                    if self.b[self.i] == b']' {
                        self.i += 1;
                        break;
                    }
                    if self.b[self.i] == b',' {
                        self.i += 1;
                        continue;
                    }
                    let mut v = String::new();
                    self.value(key, &mut v);
                    items.push(v);
                }
                if key == "bytes" {
                    out.push_str("[bytes]");
                } else {
                    out.push_str(&format!("[{}]", items.join(",")));
                }
            }
            b'"' => {
                let s = self.string();
                out.push_str(if KEEP.contains(&key) { &s } else { "S" });
            }
            b't' | b'f' | b'n' => {
                let start = self.i;
                while self.i < self.b.len() && self.b[self.i].is_ascii_alphabetic() {
                    self.i += 1;
                }
                out.push_str(std::str::from_utf8(&self.b[start..self.i]).unwrap());
            }
            _ => {
                let start = self.i;
                while self.i < self.b.len() && b"-+.eE0123456789".contains(&self.b[self.i]) {
                    self.i += 1;
                }
                let n = std::str::from_utf8(&self.b[start..self.i]).unwrap();
                out.push_str(if KEEP.contains(&key) { n } else { "N" });
            }
        }
    }
}

pub(crate) fn skeleton(json: &str) -> String {
    let mut out = String::new();
    Sk {
        b: json.as_bytes(),
        i: 0,
    }
    .value("", &mut out);
    out
}

/// Event skeletons with consecutive duplicates collapsed; an SSE comment (`: keep-alive`) is
/// its own text.
pub(crate) fn stream_shape(body: &str) -> Vec<String> {
    assert!(body.ends_with("\n\n"), "events end with a blank line");
    let mut out: Vec<String> = Vec::new();
    for ev in body.split("\n\n").filter(|e| !e.is_empty()) {
        if ev.starts_with(':') {
            if out.last().map(String::as_str) != Some(ev) {
                out.push(ev.to_string());
            }
            continue;
        }
        let data = ev
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not a data line: {ev}"));
        assert!(!data.contains('\n'), "one line per event");
        let sk = if data == "[DONE]" {
            data.to_string()
        } else {
            skeleton(data)
        };
        if out.last() != Some(&sk) {
            out.push(sk);
        }
    }
    out
}

pub(crate) fn header_names(head: &str) -> Vec<String> {
    head.split("\r\n")
        .skip(1)
        .map(|l| l.split_once(": ").unwrap().0.to_ascii_lowercase())
        .collect()
}

pub(crate) fn fixed_headers(head: &str) -> Vec<String> {
    head.split("\r\n")
        .skip(1)
        .filter(|l| !l.starts_with("date:") && !l.starts_with("content-length:"))
        .map(str::to_string)
        .collect()
}

async fn replay(name: &str) -> (Capture, Resp) {
    replay_with(name, SimConfig::fast()).await
}

/// Sends the captured request to a simulator started with `cfg`.
pub(crate) async fn replay_with(name: &str, cfg: SimConfig) -> (Capture, Resp) {
    let cap = load(name);
    let sim = start(cfg).await;
    let r = send(sim.local_addr(), &cap.method, &cap.path, &[], &cap.body).await;
    sim.shutdown().await;
    (cap, r)
}

pub(crate) fn sim_head(r: &Resp) -> String {
    let mut h = r.status_line.clone();
    // Our client asks for `connection: close`; the captures' client kept the connection.
    for (k, v) in r.headers.iter().filter(|(k, _)| k != "connection") {
        h.push_str(&format!("\r\n{k}: {v}"));
    }
    h
}

#[tokio::test]
async fn streams_match_the_captures_chunk_by_chunk() {
    for name in [
        "stream-chat.txt",
        "stream-chat-usage.txt",
        "stream-chat-usage-continuous.txt",
        "stream-chat-logprobs.txt",
        "stream-chat-stop.txt",
        "stream-chat-n2.txt",
        "stream-completions.txt",
        "stream-completions-logprobs.txt",
    ] {
        let (cap, r) = replay(name).await;
        let head = sim_head(&r);
        assert_eq!(
            header_names(&head),
            header_names(&cap.head),
            "{name}: header names"
        );
        assert_eq!(
            fixed_headers(&head),
            fixed_headers(&cap.head),
            "{name}: header values"
        );
        assert!(r.complete, "{name}");
        let mut want = stream_shape(&cap.resp_body);
        let mut got = stream_shape(&r.text());
        if name == "stream-chat-stop.txt" {
            // Where the stop string falls depends on the text: plain content chunks before
            // the finish chunk may number zero or more.
            let plain = |s: &String| s.contains("\"finish_reason\":null,\"token_ids\":null");
            want.retain(|s| !plain(s));
            got.retain(|s| !plain(s));
        }
        assert_eq!(got, want, "{name}: chunk structure");
        // Same number of events wherever the length does not depend on the model's text.
        if name != "stream-chat-stop.txt" {
            assert_eq!(
                r.events().len(),
                cap.resp_body.matches("\n\n").count(),
                "{name}: event count"
            );
        }
    }
}

#[tokio::test]
async fn json_and_error_responses_match_the_captures() {
    for name in [
        "nonstream-chat.txt",
        "nonstream-chat-n2.txt",
        "nonstream-chat-logprobs.txt",
        "nonstream-completions.txt",
        "error-too-long.txt",
        "error-unknown-model.txt",
        "error-unknown-model-completions.txt",
        // Request validation (pydantic): "Bad Request", param = body.<loc>.
        "error-invalid-json.txt",
        "error-empty-body.txt",
        "error-missing-messages.txt",
        "error-bad-type.txt",
        // Semantic: BadRequestError, " (parameter=X)", param = X.
        "error-missing-prompt.txt",
        "error-stream-options-nonstream.txt",
    ] {
        let (cap, r) = replay(name).await;
        let head = sim_head(&r);
        assert_eq!(
            head.lines().next(),
            cap.head.lines().next(),
            "{name}: status line"
        );
        assert_eq!(header_names(&head), header_names(&cap.head), "{name}");
        assert_eq!(fixed_headers(&head), fixed_headers(&cap.head), "{name}");
        assert_eq!(
            skeleton(&r.text()),
            skeleton(&cap.resp_body),
            "{name}: body"
        );
        if name.starts_with("error-") {
            assert_eq!(r.text(), cap.resp_body, "{name}: error bytes");
        }
    }
}

#[tokio::test]
async fn info_endpoints_match_the_captures() {
    let raw = std::fs::read_to_string(format!("{DIR}/get-endpoints.txt")).unwrap();
    let sim = start(SimConfig::fast()).await;
    for part in raw.split("### GET ").filter(|p| !p.is_empty()) {
        let (path, rest) = part.split_once('\n').unwrap();
        let (head, body) = rest.split_once("\r\n\r\n").unwrap();
        let r = get(sim.local_addr(), path.trim()).await;
        let h = sim_head(&r);
        assert_eq!(header_names(&h), header_names(head), "{path}");
        assert_eq!(fixed_headers(&h), fixed_headers(head), "{path}");
        let body = body.trim_end_matches('\n');
        if body.is_empty() {
            assert!(r.body.is_empty(), "{path}");
        } else {
            assert_eq!(skeleton(&r.text()), skeleton(body), "{path}");
        }
    }
    sim.shutdown().await;
}

/// `GET /ping`, an unknown path and a wrong method, byte for byte (status, headers, body).
#[tokio::test]
async fn ping_unknown_path_and_wrong_method_match_the_captures() {
    let raw = std::fs::read_to_string(format!("{FIX}/get-extra.txt")).unwrap();
    let sim = start(SimConfig::fast()).await;
    let mut seen = 0;
    for part in raw.split("### GET ").filter(|p| !p.is_empty()) {
        let (path, rest) = part.split_once('\n').unwrap();
        let (head, body) = rest.split_once("\r\n\r\n").unwrap();
        // The capture file puts a newline after each body; content-length says how much is body.
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let body = &body[..len];
        let r = get(sim.local_addr(), path.trim()).await;
        let h = sim_head(&r);
        assert_eq!(h.lines().next(), head.lines().next(), "{path}: status line");
        assert_eq!(header_names(&h), header_names(head), "{path}: header names");
        assert_eq!(
            fixed_headers(&h),
            fixed_headers(head),
            "{path}: header values"
        );
        assert_eq!(r.text(), body, "{path}: body bytes");
        seen += 1;
    }
    assert_eq!(seen, 3, "405, 404 and /ping");
    sim.shutdown().await;
}

/// family -> (type, sorted label names, bucket bounds)
fn families(text: &str) -> BTreeMap<String, (String, Vec<String>, Vec<String>)> {
    let mut fams: BTreeMap<String, (String, Vec<String>, Vec<String>)> = BTreeMap::new();
    for l in text.lines() {
        if let Some(t) = l.strip_prefix("# TYPE vllm:") {
            let (name, kind) = t.split_once(' ').unwrap();
            fams.insert(name.to_string(), (kind.to_string(), Vec::new(), Vec::new()));
        }
    }
    for l in text.lines().filter(|l| l.starts_with("vllm:")) {
        let (series, _) = l.rsplit_once(' ').unwrap();
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        let name = &name["vllm:".len()..];
        let (fam, is_bucket) = match name.strip_suffix("_bucket") {
            Some(f) if fams.contains_key(f) => (f.to_string(), true),
            _ => {
                let f = [
                    name,
                    name.trim_end_matches("_count"),
                    name.trim_end_matches("_sum"),
                ]
                .into_iter()
                .find(|f| fams.contains_key(*f))
                .unwrap_or_else(|| panic!("sample of no family: {name}"));
                (f.to_string(), false)
            }
        };
        let entry = fams.get_mut(&fam).unwrap();
        for kv in labels
            .trim_end_matches('}')
            .split(',')
            .filter(|s| !s.is_empty())
        {
            let (k, v) = kv.split_once('=').unwrap();
            if k == "le" {
                if is_bucket && !entry.2.contains(&v.to_string()) {
                    entry.2.push(v.to_string());
                }
            } else if !entry.1.contains(&k.to_string()) {
                entry.1.push(k.to_string());
            }
        }
    }
    fams
}

#[tokio::test]
async fn metrics_families_types_and_buckets_match_the_capture() {
    let raw = std::fs::read_to_string(format!("{DIR}/metrics.txt")).unwrap();
    let (head, real) = raw.split_once("\r\n\r\n").unwrap();
    let sim = start(SimConfig::fast()).await;
    let r = get(sim.local_addr(), "/metrics").await;
    sim.shutdown().await;
    assert_eq!(
        r.header("content-type"),
        head.lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .map(str::trim)
    );
    let want = families(real);
    let got = families(&r.text());
    assert_eq!(
        want.len(),
        72,
        "39 families plus the _created gauges of counters and histograms"
    );
    let names = |m: &BTreeMap<String, (String, Vec<String>, Vec<String>)>| {
        m.keys().cloned().collect::<Vec<_>>()
    };
    assert_eq!(names(&got), names(&want));
    for (fam, (kind, labels, buckets)) in &want {
        let (gk, gl, gb) = &got[fam];
        assert_eq!(gk, kind, "{fam}: type");
        assert_eq!(gb, buckets, "{fam}: buckets");
        if fam != "cache_config_info" {
            assert_eq!(gl, labels, "{fam}: labels");
        }
    }
}
