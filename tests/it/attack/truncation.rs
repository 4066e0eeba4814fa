//! An upstream that breaks its stream after 3 events: the client must see a broken stream,
//! never a clean end (HTTP/1.1: no final zero-length chunk; HTTP/2: the stream is reset), and
//! the record must say `truncated`.

use bytes::Bytes;
use goodput_sim::SimConfig;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::*;
use crate::support::meter::*;
use crate::support::proxy::*;
use crate::support::raw_http;

#[tokio::test]
async fn a_stream_cut_after_3_events_reaches_the_client_broken_and_is_recorded_truncated() {
    let sim = start_sim(SimConfig::with_timing(5.0, 5.0)).await;
    let proxy = start_proxy(meter_config(&sim.base_url())).await;
    let body = chat_body(16, "");
    let fault = [("x-sim-fault", "truncate-after=3")];

    // HTTP/1.1, raw: the tokens before the cut arrive, the terminating chunk never does.
    let resp = raw_http::send(proxy.addr, "POST", CHAT, &fault, &body).await;
    assert_eq!(resp.status, 200);
    assert!(!resp.complete, "the proxy ended a broken stream cleanly");
    let text = resp.text();
    assert!(!text.contains("[DONE]"), "{text}");
    let tokens = resp
        .json_events()
        .iter()
        .filter(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .count();
    assert_eq!(tokens, 3, "{text}");

    // HTTP/2: the body ends in an error (RST_STREAM), not in END_STREAM.
    let h2: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let req = with_fault(post_json(&proxy.url(CHAT), &body), "truncate-after=3");
    let resp = tokio::time::timeout(QUICK, h2.request(req))
        .await
        .expect("head in time")
        .unwrap();
    assert_eq!(resp.status(), 200);
    let end = tokio::time::timeout(QUICK, resp.into_body().collect())
        .await
        .expect("body ends in time");
    assert!(end.is_err(), "HTTP/2 stream ended cleanly");

    let s = wait_requests(&proxy, 2).await;
    assert_eq!(s["outcomes"]["truncated"], 2, "{s}");
    sim.shutdown().await;
}
