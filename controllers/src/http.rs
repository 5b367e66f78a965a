//! The controller's HTTP endpoint: `/metrics` (Prometheus text format, metric names as
//! controller-runtime's so existing dashboards work), `/healthz` and `/readyz`.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::warn;

use crate::controller::{Metrics, MetricsSnapshot};

/// Name of the controller in metric labels.
pub const CONTROLLER_LABEL: &str = "virtualmachine";
/// How long one connection may take to send its request.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The Prometheus text exposition of `m`.
pub fn render(m: &MetricsSnapshot) -> String {
    let c = CONTROLLER_LABEL;
    let mut out = String::new();
    let success = m.reconciles.saturating_sub(m.errors);
    let _ = writeln!(
        out,
        "# HELP controller_runtime_reconcile_total Total number of reconciliations per controller"
    );
    let _ = writeln!(out, "# TYPE controller_runtime_reconcile_total counter");
    let _ = writeln!(
        out,
        "controller_runtime_reconcile_total{{controller=\"{c}\",result=\"success\"}} {success}"
    );
    let _ = writeln!(
        out,
        "controller_runtime_reconcile_total{{controller=\"{c}\",result=\"error\"}} {}",
        m.errors
    );
    let _ = writeln!(
        out,
        "# HELP controller_runtime_reconcile_errors_total Total number of reconciliation errors per controller"
    );
    let _ = writeln!(out, "# TYPE controller_runtime_reconcile_errors_total counter");
    let _ = writeln!(
        out,
        "controller_runtime_reconcile_errors_total{{controller=\"{c}\"}} {}",
        m.errors
    );
    let _ = writeln!(
        out,
        "# HELP banlieue_controller_writes_total API writes by the banlieue controller, by target"
    );
    let _ = writeln!(out, "# TYPE banlieue_controller_writes_total counter");
    let _ = writeln!(
        out,
        "banlieue_controller_writes_total{{target=\"infrastructure_machine\"}} {}",
        m.machine_applies
    );
    let _ = writeln!(
        out,
        "banlieue_controller_writes_total{{target=\"virtualmachine_status\"}} {}",
        m.status_writes
    );
    let _ = writeln!(
        out,
        "banlieue_controller_writes_total{{target=\"infrastructure_cluster\"}} {}",
        m.cluster_applies
    );
    let _ = writeln!(
        out,
        "banlieue_controller_writes_total{{target=\"virtualmachine_finalizer\"}} {}",
        m.finalizer_writes
    );
    let _ = writeln!(
        out,
        "banlieue_controller_writes_total{{target=\"infrastructure_machine_delete\"}} {}",
        m.machine_deletes
    );
    out
}

fn respond(req: &Request<hyper::body::Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, body, content_type) = match req.uri().path() {
        "/metrics" => (
            StatusCode::OK,
            render(&metrics.snapshot()),
            "text/plain; version=0.0.4",
        ),
        "/healthz" => (StatusCode::OK, "ok\n".to_owned(), "text/plain"),
        "/readyz" if metrics.ready.load(std::sync::atomic::Ordering::Relaxed) => {
            (StatusCode::OK, "ok\n".to_owned(), "text/plain")
        }
        "/readyz" => (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting\n".to_owned(),
            "text/plain",
        ),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned(), "text/plain"),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

/// Serves the endpoint on `listener` until `shutdown` completes.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "accepting a metrics connection");
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let resp = respond(&req, &metrics);
                async move { Ok::<_, Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = tokio::time::timeout(Duration::from_secs(60), conn)
                .await
                .unwrap_or(Ok(()))
            {
                warn!(error = %e, "serving a metrics connection");
            }
        });
    }
}

/// Binds `addr` (e.g. `0.0.0.0:8080`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_controller_runtime_names_from_the_counters() {
        let text = render(&MetricsSnapshot {
            reconciles: 10,
            errors: 3,
            machine_applies: 4,
            status_writes: 7,
            cluster_applies: 1,
            finalizer_writes: 5,
            machine_deletes: 2,
        });
        assert!(text.contains(
            "controller_runtime_reconcile_total{controller=\"virtualmachine\",result=\"success\"} 7\n"
        ));
        assert!(text.contains(
            "controller_runtime_reconcile_total{controller=\"virtualmachine\",result=\"error\"} 3\n"
        ));
        assert!(
            text.contains("controller_runtime_reconcile_errors_total{controller=\"virtualmachine\"} 3\n")
        );
        assert!(text.contains("banlieue_controller_writes_total{target=\"infrastructure_machine\"} 4\n"));
        assert!(text.contains("banlieue_controller_writes_total{target=\"virtualmachine_status\"} 7\n"));
        assert!(text.contains("banlieue_controller_writes_total{target=\"infrastructure_cluster\"} 1\n"));
        assert!(text.contains("banlieue_controller_writes_total{target=\"virtualmachine_finalizer\"} 5\n"));
        assert!(
            text.contains("banlieue_controller_writes_total{target=\"infrastructure_machine_delete\"} 2\n")
        );
    }

    #[tokio::test]
    async fn readyz_answers_503_until_the_controller_runs() {
        let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("binds");
        let addr = listener.local_addr().expect("bound");
        let metrics = Arc::new(Metrics::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, metrics.clone(), async move {
            let _ = stopped.await;
        }));
        let status = |path: &'static str| async move {
            tokio::task::spawn_blocking(move || {
                use std::io::{Read, Write};
                let mut s = std::net::TcpStream::connect(addr).expect("connects");
                s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
                write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").expect("writes");
                let mut out = String::new();
                s.read_to_string(&mut out).expect("reads");
                out.split(' ').nth(1).unwrap_or_default().to_owned()
            })
            .await
            .expect("joins")
        };
        assert_eq!(status("/readyz").await, "503");
        assert_eq!(status("/healthz").await, "200");
        assert_eq!(status("/nope").await, "404");
        metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(status("/readyz").await, "200");
        let _ = stop.send(());
        server.await.expect("server stops");
    }
}
