//! The operational HTTP endpoint: `/healthz` (the process is alive), `/readyz` (503 until the
//! controllers run, e.g. while waiting for the Lease) and `/metrics` (Prometheus text format).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

use crate::metrics::Metrics;
use crate::{Error, Result};

/// How long one connection may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one connection may stay open.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);

/// What the endpoint reports.
pub trait Probe: Send + Sync + 'static {
    /// `/readyz` answers 200 when true.
    fn ready(&self) -> bool;
    /// The body of `/metrics`.
    fn metrics(&self) -> String;
}

/// The probe of a provider: a readiness flag and a [`Metrics`] registry.
#[derive(Debug, Default)]
pub struct Probes {
    ready: AtomicBool,
    /// The registry `/metrics` renders (clone it into the controllers' contexts).
    pub metrics: Metrics,
}

impl Probes {
    /// Probes rendering `metrics`, not ready yet.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            ready: AtomicBool::new(false),
            metrics,
        }
    }

    /// Marks the process ready (or not).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }
}

impl Probe for Probes {
    fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }
}

fn respond(path: &str, probe: &dyn Probe) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match path {
        "/metrics" => (StatusCode::OK, probe.metrics(), "text/plain; version=0.0.4"),
        "/healthz" => (StatusCode::OK, "ok\n".to_owned(), "text/plain"),
        "/readyz" if probe.ready() => (StatusCode::OK, "ok\n".to_owned(), "text/plain"),
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready\n".to_owned(),
            "text/plain",
        ),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned(), "text/plain"),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

/// Binds `addr` (e.g. `0.0.0.0:8080`) for the endpoint named `what`.
pub async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { what, addr, source })
}

/// Serves the endpoint on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, probe: Arc<dyn Probe>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "accepting an endpoint connection");
                    continue;
                }
            },
        };
        let probe = probe.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let resp = respond(req.uri().path(), &*probe);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                tracing::debug!(error = %e, "serving an endpoint connection");
            }
        });
    }
}

/// A blocking HTTP/1.1 GET for tests and examples: `(status, body)`.
pub fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {out:?}")))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readyz_answers_503_until_ready_and_metrics_are_served() {
        let listener = bind("test", "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("bound");
        let probes = Arc::new(Probes::default());
        probes.metrics.record("thing", Duration::ZERO, None);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, probes.clone(), async move {
            let _ = stopped.await;
        }));
        let get = |path: &'static str| async move {
            tokio::task::spawn_blocking(move || get(addr, path).expect("answers"))
                .await
                .expect("joins")
        };
        assert_eq!(get("/readyz").await.0, 503);
        assert_eq!(get("/healthz").await.0, 200);
        assert_eq!(get("/nope").await.0, 404);
        let (status, body) = get("/metrics").await;
        assert_eq!(status, 200);
        assert!(
            body.contains("controller_runtime_reconcile_total{controller=\"thing\",result=\"success\"} 1"),
            "{body}"
        );
        probes.set_ready(true);
        assert_eq!(get("/readyz").await.0, 200);
        let _ = stop.send(());
        server.await.expect("server stops");
    }

    #[tokio::test]
    async fn binding_a_taken_address_names_the_endpoint() {
        let taken = bind("metrics", "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("binds");
        let addr = taken.local_addr().expect("bound");
        let err = bind("health probe", addr).await.expect_err("address in use");
        assert!(err.to_string().contains("health probe"), "{err}");
    }
}
