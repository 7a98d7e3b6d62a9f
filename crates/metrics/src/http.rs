//! The monitoring HTTP server: `/metrics`, `/healthz` and `/readyz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::CONTENT_TYPE;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{Metrics, Role};

/// The monitoring server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Binding the monitoring port failed.
    #[error("cannot listen for monitoring on {addr}: {source}")]
    Bind {
        /// The address tried.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Bind `addr` and serve the endpoints until `shutdown` is cancelled. Returns the bound address
/// (useful with port 0) once listening; the server runs in a spawned task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<SocketAddr, ServeError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = listener.accept() => a,
            };
            let (stream, _) = match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("monitoring accept failed: {e}");
                    continue;
                }
            };
            let metrics = Arc::clone(&metrics);
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| respond(req, Arc::clone(&metrics)));
                let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    r = conn => if let Err(e) = r { tracing::debug!("monitoring connection: {e}") },
                }
            });
        }
    });
    Ok(local)
}

async fn respond(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, ctype: &'static str, body: String| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(ctype));
        Ok(r)
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode(),
        ),
        "/healthz" => reply(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => {
            let role = match metrics.role() {
                Role::Active => "active",
                Role::Leader => "leader",
                Role::Standby => "standby",
            };
            if metrics.connected() {
                reply(
                    StatusCode::OK,
                    "text/plain",
                    format!("ready: connected, {role}\n"),
                )
            } else {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: not connected, {role}\n"),
                )
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}
