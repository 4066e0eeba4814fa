//! What the proxy may change in a request, by the engine that serves it: usage injection
//! (`stream_options.include_usage`, for exact token counts) is decided per replica, after the
//! balancer picked it, because engines answer it differently:
//! - vLLM (and TGI, TensorRT-LLM, and an engine not known yet): one extra `"choices":[]` usage
//!   chunk that the strip removes again, byte-exactly (`meter::strip`);
//! - llama.cpp: besides the usage chunk, `timings` move from the finish chunk onto it. Not
//!   injected: its `timings` (on the finish chunk) carry `predicted_n`, the very counter its
//!   usage reports, so tokens stay exact, and the engine gets the client's request unchanged.
//!   (For a replica not known yet to be llama.cpp, the strip moves `timings` back.)
//! - SGLang: started with `--stream-response-default-include-usage` it ends every stream with a
//!   usage chunk, asked or not, the same bytes either way: stripping it would take from the
//!   client what the engine sends it directly. Nothing in an injected stream tells, so the
//!   proxy learns it from one stream it leaves alone ([`Unasked`]): usage came (the engine
//!   adds it: never injected, nothing stripped) or not (injected from then on).
//!   `engine.usage_unasked` says it for a replica by configuration, for any engine.

use bytes::Bytes;

use crate::config::EngineKind;

/// The request body with usage injected (a request extension): forwarding sends it instead of
/// the client's body to a replica whose engine takes injection.
#[derive(Debug, Clone)]
pub struct UsageOffer(pub Bytes);

/// Whether a replica's engine ends every stream with usage its client did not ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unasked {
    /// Not known yet.
    Unknown,
    /// A stream left alone ended without usage.
    No,
    /// A stream left alone ended with usage.
    Yes,
    /// `engine.usage_unasked` lists the replica: never learned again.
    Configured,
}

impl Unasked {
    pub const ALL: [Unasked; 4] = [
        Unasked::Unknown,
        Unasked::No,
        Unasked::Yes,
        Unasked::Configured,
    ];
}

/// What to do with a stream request whose client did not ask for usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// Inject `include_usage` (the strip removes the usage chunk again).
    Inject,
    /// Send the client's body: the engine counts exactly without it, or adds usage itself.
    Leave,
    /// Send the client's body, and learn from the stream whether the engine adds usage.
    Learn,
}

/// The decision for a replica whose engine is `kind` (`None`: not known yet).
pub fn usage_for(kind: Option<EngineKind>, unasked: Unasked) -> Usage {
    match (unasked, kind) {
        (Unasked::Yes | Unasked::Configured, _) => Usage::Leave,
        (_, Some(EngineKind::Llamacpp)) => Usage::Leave,
        (Unasked::Unknown, Some(EngineKind::Sglang)) => Usage::Learn,
        _ => Usage::Inject,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_by_engine() {
        use EngineKind::*;
        use Unasked::*;
        let cases = [
            (None, Unknown, Usage::Inject),
            (Some(Vllm), Unknown, Usage::Inject),
            (Some(Vllm), No, Usage::Inject),
            (Some(Vllm), Configured, Usage::Leave),
            (Some(Sglang), Unknown, Usage::Learn),
            (Some(Sglang), No, Usage::Inject),
            (Some(Sglang), Yes, Usage::Leave),
            (Some(Sglang), Configured, Usage::Leave),
            (Some(Llamacpp), Unknown, Usage::Leave),
            (Some(Llamacpp), No, Usage::Leave),
            (Some(Tgi), Unknown, Usage::Inject),
            (Some(Trtllm), Unknown, Usage::Inject),
            (None, Configured, Usage::Leave),
        ];
        for (kind, unasked, want) in cases {
            assert_eq!(usage_for(kind, unasked), want, "{kind:?} {unasked:?}");
        }
    }
}
