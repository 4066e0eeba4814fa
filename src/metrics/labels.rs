//! The label sets of the proxy's families, one type per set: the names and the order of the
//! values are written once, in the impl beside the type. Values come only from bounded sets:
//! `model` from `ModelLabels`, `upstream` from `UpstreamLabels` (or the engines' labels of the
//! same replicas), `tenant` from the configured tenants, the rest from closed enums.

use goodput_measure::agent::ToolCallOutcome;
use goodput_measure::outcome::{FinishReason, Outcome, NO_FINISH_REASON};
use goodput_measure::record::RouteReason;

use super::family::LabelSet;
use crate::config::EngineKind;

/// Implements [`LabelSet`] for a set's `'static` form (`Type<'static>`, or a type without a
/// lifetime): the label names, then the values of a series `s` in the same order.
macro_rules! label_set {
    ($ty:ident<'static>, [$($name:literal),*], |$s:ident| [$($value:expr),*]) => {
        // As many values as names, checked when compiling (a mismatch would panic in
        // prometheus at the first `get`).
        const _: () = assert!([$($name),*].len() == [$(stringify!($value)),*].len());
        impl LabelSet for $ty<'static> {
            const NAMES: &'static [&'static str] = &[$($name),*];
            type Series<'a> = $ty<'a>;
            fn with_values<R>($s: &$ty<'_>, f: impl FnOnce(&[&str]) -> R) -> R {
                f(&[$($value),*])
            }
        }
    };
    ($ty:ident, [$($name:literal),*], |$s:ident| [$($value:expr),*]) => {
        const _: () = assert!([$($name),*].len() == [$(stringify!($value)),*].len());
        impl LabelSet for $ty {
            const NAMES: &'static [&'static str] = &[$($name),*];
            type Series<'a> = $ty;
            fn with_values<R>($s: &$ty, f: impl FnOnce(&[&str]) -> R) -> R {
                f(&[$($value),*])
            }
        }
    };
}

/// Per model: tokens, requests in flight, goodput ratio, agent timings.
#[derive(Debug, Clone, Copy)]
pub struct ByModel<'a> {
    pub model: &'a str,
}
label_set!(ByModel<'static>, ["model"], |s| [s.model]);

/// Per model and the replica that answered: the latency histograms, good requests.
#[derive(Debug, Clone, Copy)]
pub struct Served<'a> {
    pub model: &'a str,
    pub upstream: &'a str,
}
label_set!(Served<'static>, ["model", "upstream"], |s| [
    s.model, s.upstream
]);

/// The parts of a request's TTFT split, in the order they add up: the proxy's own time, the
/// engine's queue, the engine's prefill (its TTFT from scheduling), and the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtftPart {
    Proxy,
    EngineQueue,
    EnginePrefill,
    Rest,
}

impl TtftPart {
    /// In the order of `TtftSplit::parts`.
    pub const ALL: [TtftPart; 4] = [
        TtftPart::Proxy,
        TtftPart::EngineQueue,
        TtftPart::EnginePrefill,
        TtftPart::Rest,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TtftPart::Proxy => "proxy",
            TtftPart::EngineQueue => "engine_queue",
            TtftPart::EnginePrefill => "engine_prefill",
            TtftPart::Rest => "rest",
        }
    }
}

/// One part of the TTFT split of a request served by a replica:
/// `goodput_proxy_ttft_split_seconds`.
#[derive(Debug, Clone, Copy)]
pub struct SplitPart<'a> {
    pub model: &'a str,
    pub upstream: &'a str,
    pub part: TtftPart,
}
label_set!(SplitPart<'static>, ["model", "upstream", "part"], |s| [
    s.model,
    s.upstream,
    s.part.as_str()
]);

/// A finished request: `goodput_proxy_requests_total`.
#[derive(Debug, Clone, Copy)]
pub struct Finished<'a> {
    pub model: &'a str,
    pub upstream: &'a str,
    pub outcome: Outcome,
    /// `none` when the request has none.
    pub finish_reason: Option<FinishReason>,
}
label_set!(
    Finished<'static>,
    ["model", "upstream", "outcome", "finish_reason"],
    |s| [
        s.model,
        s.upstream,
        s.outcome.as_str(),
        s.finish_reason
            .map_or(NO_FINISH_REASON, FinishReason::as_str)
    ]
);

/// The SLOs a request can miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloName {
    Ttft,
    Tpot,
    E2e,
    ToolCalls,
    Stall,
}

impl SloName {
    pub fn as_str(self) -> &'static str {
        match self {
            SloName::Ttft => "ttft",
            SloName::Tpot => "tpot",
            SloName::E2e => "e2e",
            SloName::ToolCalls => "tool_calls",
            SloName::Stall => "stall",
        }
    }
}

/// A missed SLO: `goodput_proxy_slo_violations_total`.
#[derive(Debug, Clone, Copy)]
pub struct Violation<'a> {
    pub model: &'a str,
    pub upstream: &'a str,
    pub slo: SloName,
}
label_set!(Violation<'static>, ["model", "upstream", "slo"], |s| [
    s.model,
    s.upstream,
    s.slo.as_str()
]);

/// Tool-call requests by their worst call: `goodput_proxy_tool_calls_total`.
#[derive(Debug, Clone, Copy)]
pub struct ToolCalls<'a> {
    pub model: &'a str,
    pub outcome: ToolCallOutcome,
}
label_set!(ToolCalls<'static>, ["model", "outcome"], |s| [
    s.model,
    s.outcome.as_str()
]);

/// The record sinks: its own label set (`sink`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Jsonl,
    Clickhouse,
}

impl Sink {
    pub const ALL: [Sink; 2] = [Sink::Jsonl, Sink::Clickhouse];

    pub fn as_str(self) -> &'static str {
        match self {
            Sink::Jsonl => "jsonl",
            Sink::Clickhouse => "clickhouse",
        }
    }
}
label_set!(Sink, ["sink"], |s| [s.as_str()]);

/// Per tenant (a configured name, or `none`).
#[derive(Debug, Clone, Copy)]
pub struct ByTenant<'a> {
    pub tenant: &'a str,
}
label_set!(ByTenant<'static>, ["tenant"], |s| [s.tenant]);

/// A tenant's finished request: `goodput_proxy_tenant_requests_total`.
#[derive(Debug, Clone, Copy)]
pub struct TenantFinished<'a> {
    pub tenant: &'a str,
    pub outcome: Outcome,
}
label_set!(TenantFinished<'static>, ["tenant", "outcome"], |s| [
    s.tenant,
    s.outcome.as_str()
]);

/// Per replica (the engine families' `upstream` value).
#[derive(Debug, Clone, Copy)]
pub struct ByUpstream<'a> {
    pub upstream: &'a str,
}
label_set!(ByUpstream<'static>, ["upstream"], |s| [s.upstream]);

/// SLO attainment over one sliding window (`window`: `30s`, `5m`, the configured lengths) per
/// model: `goodput_proxy_slo_attainment`.
#[derive(Debug, Clone, Copy)]
pub struct WindowModel<'a> {
    pub window: &'a str,
    pub model: &'a str,
}
label_set!(WindowModel<'static>, ["window", "model"], |s| [
    s.window, s.model
]);

/// The same per tenant: `goodput_proxy_slo_attainment_by_tenant`.
#[derive(Debug, Clone, Copy)]
pub struct WindowTenant<'a> {
    pub window: &'a str,
    pub tenant: &'a str,
}
label_set!(WindowTenant<'static>, ["window", "tenant"], |s| [
    s.window, s.tenant
]);

/// The same per replica: `goodput_proxy_slo_attainment_by_upstream`.
#[derive(Debug, Clone, Copy)]
pub struct WindowUpstream<'a> {
    pub window: &'a str,
    pub upstream: &'a str,
}
label_set!(WindowUpstream<'static>, ["window", "upstream"], |s| [
    s.window, s.upstream
]);

/// The kind of work still to do at a replica: prompt tokens to prefill, output tokens to
/// decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenPhase {
    Prefill,
    Decode,
}

impl TokenPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenPhase::Prefill => "prefill",
            TokenPhase::Decode => "decode",
        }
    }
}

/// A replica's pending tokens of one kind: `goodput_proxy_upstream_tokens_pending`.
#[derive(Debug, Clone, Copy)]
pub struct PendingTokens<'a> {
    pub upstream: &'a str,
    pub phase: TokenPhase,
}
label_set!(PendingTokens<'static>, ["upstream", "phase"], |s| [
    s.upstream,
    s.phase.as_str()
]);

/// The engine a replica runs: `goodput_proxy_engine_kind`.
#[derive(Debug, Clone, Copy)]
pub struct EngineOf<'a> {
    pub upstream: &'a str,
    pub kind: EngineKind,
}
label_set!(EngineOf<'static>, ["upstream", "kind"], |s| [
    s.upstream,
    s.kind.as_str()
]);

// Why the balancer chose a replica (a closed enum): `goodput_proxy_route_decisions_total`.
label_set!(RouteReason, ["reason"], |s| [s.as_str()]);
