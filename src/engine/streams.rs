//! What the proxy may change in a request, by the engine that serves it: usage injection
//! (`stream_options.include_usage`, for exact token counts) is decided per replica, after the
//! balancer picked it, because engines answer it differently:
//! - vLLM (and TGI, TensorRT-LLM, and an engine not known yet): one extra `"choices":[]` usage
//!   chunk that the strip removes again, byte-exactly (`meter::strip`);
//! - llama.cpp: besides the usage chunk, `timings` move from the finish chunk onto it. Not
//!   injected: its `timings` (on the finish chunk) carry `predicted_n`, the very counter its
//!   usage reports, so tokens stay exact, and the engine gets the client's request unchanged.
//!   (For a replica not known yet to be llama.cpp, the strip moves `timings` back.)

use crate::config::EngineKind;

/// Whether a stream request to an engine of `kind` gets `include_usage` injected when its
/// client did not ask for usage (`None`: the engine is not known yet).
pub fn injects_usage(kind: Option<EngineKind>) -> bool {
    !matches!(kind, Some(EngineKind::Llamacpp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injection_by_engine() {
        let cases = [
            (None, true),
            (Some(EngineKind::Vllm), true),
            (Some(EngineKind::Sglang), true),
            (Some(EngineKind::Llamacpp), false),
            (Some(EngineKind::Tgi), true),
            (Some(EngineKind::Trtllm), true),
        ];
        for (kind, want) in cases {
            assert_eq!(injects_usage(kind), want, "{kind:?}");
        }
    }
}
