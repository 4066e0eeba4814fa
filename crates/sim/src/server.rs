//! Accept loop: HTTP/1.1 (as uvicorn serves), keep-alive, TCP_NODELAY so every SSE event
//! leaves at once. Connection tasks live in a JoinSet owned by the accept task, so aborting
//! that task closes every connection.

use std::sync::Arc;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::engine::Engine;
use super::routes::handle;

pub async fn serve(listener: TcpListener, eng: Arc<Engine>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "sim accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let eng = eng.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(eng.clone(), req));
                    let _ = http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            // Reap finished connection tasks so the set does not grow without bound.
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}
