//! A `/metrics` endpoint: plain HTTP/1.1 on `MetricsListenAddress=`,
//! served by hyper's HTTP/1 server (no client, no HTTP/2: the smallest
//! well-kept server that speaks HTTP correctly, so no request parser is
//! written here).
//!
//! Every peer is hostile, so each bound is fixed here:
//! * at most [`MAX_CONNECTIONS`] connections at once; one more is closed at
//!   accept, without a byte read (a scraper opens one, maybe two);
//! * a request head must arrive within [`HEAD_TIMEOUT`] and fit in
//!   [`MAX_HEAD`] bytes with at most [`MAX_HEADERS`] headers, or the
//!   connection is closed; a body is never read;
//! * a connection lives at most [`CONNECTION_LIFETIME`], keep-alive or not;
//! * `GET`/`HEAD /metrics` (a query string is ignored) is the one answer;
//!   any other path is 404, any other method 405;
//! * the format follows `Accept`, as Prometheus's own clients do:
//!   OpenMetrics when it names `application/openmetrics-text` (Prometheus
//!   does), else the older text format 0.0.4 (`curl`, `promtool`).
//!
//! A scrape renders on tokio's blocking pool (`spawn_blocking`), never on
//! the runtime's worker threads: the body of a large fleet takes
//! milliseconds to build, and a worker busy that long delays every other
//! task queued on it (a `StartUnit` on its way to an agent). What the
//! render reads is the daemon's business (its collectors say what a scrape
//! costs it).
//!
//! The manager and the agent serve through [`serve`] alike, so a bound
//! changed here changes for both.

use crate::text::{CLASSIC, Exposition, OPENMETRICS, classic};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ACCEPT, ALLOW, CONTENT_TYPE as CONTENT_TYPE_HEADER};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Time for a request head to arrive.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes a request head may take (hyper's smallest read buffer).
pub const MAX_HEAD: usize = 8192;
/// Headers a request may carry.
pub const MAX_HEADERS: usize = 32;
/// The longest a connection lives.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Serves `exposition` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, exposition: Arc<Exposition>, stop: CancellationToken) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: wait, not spin.
                tracing::warn!("metrics endpoint: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("metrics endpoint: {peer}: over {MAX_CONNECTIONS} connections, closed");
            continue;
        };
        let exposition = exposition.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req| {
                let exposition = exposition.clone();
                async move { Ok::<_, Infallible>(answer(exposition, &req).await) }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .max_headers(MAX_HEADERS);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                () = stop.cancelled() => {}
                r = tokio::time::timeout(CONNECTION_LIFETIME, conn) => {
                    if let Ok(Err(e)) = r {
                        tracing::debug!("metrics endpoint: {peer}: {e}");
                    }
                }
            }
        });
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE_HEADER,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The answer to one request (see the module docs).
async fn answer(exposition: Arc<Exposition>, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        r.headers_mut()
            .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let openmetrics = req.headers().get_all(ACCEPT).iter().any(|v| {
        v.as_bytes()
            .windows(20)
            .any(|w| w == b"application/openmetr")
    });
    let rendered = tokio::task::spawn_blocking(move || {
        let text = exposition.render()?;
        Ok::<_, std::fmt::Error>(if openmetrics {
            (text, OPENMETRICS)
        } else {
            (classic(&text), CLASSIC)
        })
    })
    .await;
    match rendered {
        Ok(Ok((text, kind))) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                CONTENT_TYPE_HEADER,
                hyper::header::HeaderValue::from_static(kind),
            );
            r
        }
        Ok(Err(_)) | Err(_) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "cannot render the metrics\n",
        ),
    }
}
