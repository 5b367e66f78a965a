//! `banlieue-proxmox`: the Cluster API infrastructure provider for Proxmox VE.
//!
//! Runs the ProxmoxCluster and ProxmoxMachine controllers, optionally behind Lease leader
//! election, with `/healthz` and `/readyz` on the probe address and Prometheus `/metrics` on the
//! metrics address. Logs are JSON by default. SIGTERM/SIGINT shut down gracefully (in-flight
//! reconciles finish, the Lease is released).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use banlieue_proxmox::cluster_controller::{self, ClusterContext};
use banlieue_proxmox::credentials::ClientConnector;
use banlieue_proxmox::leader::LeaderElector;
use banlieue_proxmox::machine_controller::{self, MachineContext};
use banlieue_proxmox::template_controller::{self, TemplateContext};
use clap::{Parser, ValueEnum};
use futures::FutureExt;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Log output format.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Command-line flags (each also settable through the named environment variable).
#[derive(Parser, Debug)]
#[command(version, about = "Cluster API infrastructure provider for Proxmox VE")]
struct Args {
    /// Only watch this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Concurrent reconciles per controller.
    #[arg(long, env = "CONCURRENCY", default_value_t = 10)]
    concurrency: u16,
    /// Proxmox storage (content `iso`) the bootstrap seed ISOs are uploaded to.
    #[arg(long, env = "SEED_STORAGE", default_value = "local")]
    seed_storage: String,
    /// Address of the Prometheus `/metrics` endpoint.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_bind_address: SocketAddr,
    /// Address of the `/healthz` and `/readyz` endpoints.
    #[arg(long, default_value = "0.0.0.0:8081")]
    health_probe_bind_address: SocketAddr,
    /// Elect a leader through a Lease before running the controllers.
    #[arg(long, env = "LEADER_ELECT")]
    leader_elect: bool,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "banlieue-proxmox-leader")]
    leader_election_id: String,
    /// Namespace of the leader election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    leader_election_namespace: String,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    log_format: LogFormat,
}

struct Shared {
    ready: AtomicBool,
    machine: Arc<MachineContext<ClientConnector>>,
    cluster: Arc<ClusterContext<ClientConnector>>,
}

async fn serve(addr: SocketAddr, shared: Arc<Shared>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    loop {
        let (stream, _) = listener.accept().await?;
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let shared = shared.clone();
                async move {
                    let (status, body) = match req.uri().path() {
                        "/healthz" => (StatusCode::OK, "ok".to_owned()),
                        "/readyz" if shared.ready.load(Ordering::Relaxed) => {
                            (StatusCode::OK, "ok".to_owned())
                        }
                        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready".to_owned()),
                        "/metrics" => (
                            StatusCode::OK,
                            format!(
                                "{}{}",
                                shared.machine.metrics.render(),
                                shared.cluster.metrics.render()
                            ),
                        ),
                        _ => (StatusCode::NOT_FOUND, "not found".to_owned()),
                    };
                    Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::from(body)))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "probe connection");
            }
        });
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match args.log_format {
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
    }
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes")?;
    let shared = Arc::new(Shared {
        ready: AtomicBool::new(false),
        machine: Arc::new(MachineContext::new(
            client.clone(),
            ClientConnector::default(),
            args.seed_storage.clone(),
            "banlieue-proxmox",
        )),
        cluster: Arc::new(ClusterContext::new(
            client.clone(),
            ClientConnector::default(),
            "banlieue-proxmox",
        )),
    });
    for addr in [args.metrics_bind_address, args.health_probe_bind_address] {
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(addr, shared).await {
                tracing::error!(error = %e, %addr, "HTTP endpoint failed");
            }
        });
    }
    let shutdown = shutdown_signal().shared();
    let elector = args.leader_elect.then(|| {
        let identity = std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| format!("banlieue-proxmox-{}", std::process::id()));
        LeaderElector::new(
            client.clone(),
            &args.leader_election_namespace,
            &args.leader_election_id,
            &identity,
        )
    });
    if let Some(elector) = &elector {
        tracing::info!("waiting for leadership");
        tokio::select! {
            () = elector.acquire() => tracing::info!("acquired leadership"),
            () = shutdown.clone() => return Ok(()),
        }
    }
    shared.ready.store(true, Ordering::Relaxed);
    let lost = async {
        match &elector {
            Some(e) => e.hold().await,
            None => std::future::pending().await,
        }
    };
    let stop = shutdown.clone();
    let namespace = args.namespace.as_deref();
    let templates = Arc::new(TemplateContext {
        client: client.clone(),
    });
    let controllers = futures::future::join3(
        machine_controller::run(shared.machine.clone(), namespace, args.concurrency, stop.clone()),
        cluster_controller::run(shared.cluster.clone(), namespace, args.concurrency, stop.clone()),
        template_controller::run(templates, namespace, stop),
    );
    tokio::select! {
        _ = controllers => tracing::info!("controllers stopped"),
        () = lost => {
            tracing::error!("lost leadership; exiting");
            std::process::exit(1);
        }
    }
    if let Some(elector) = &elector
        && let Err(e) = elector.release().await
    {
        tracing::warn!(error = %e, "cannot release the leader Lease");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent_and_default_to_json_logs_without_leader_election() {
        Args::command().debug_assert();
        let args = Args::try_parse_from(["banlieue-proxmox"]).unwrap();
        assert!(!args.leader_elect);
        assert!(matches!(args.log_format, LogFormat::Json));
        assert_eq!(args.concurrency, 10);
        let args = Args::try_parse_from([
            "banlieue-proxmox",
            "--namespace",
            "capi",
            "--leader-elect",
            "--log-format",
            "text",
        ])
        .unwrap();
        assert_eq!(args.namespace.as_deref(), Some("capi"));
        assert!(args.leader_elect);
        assert!(Args::try_parse_from(["banlieue-proxmox", "--log-format", "xml"]).is_err());
    }
}
