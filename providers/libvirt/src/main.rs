//! `banlieue-libvirt`: the Cluster API infrastructure provider for libvirt.
//!
//! Runs the LibvirtCluster and LibvirtMachine controllers with `/healthz` and `/readyz` on the
//! probe address. SIGTERM/SIGINT shut down gracefully (in-flight reconciles finish).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use banlieue_libvirt::cluster_controller::{self, ClusterContext};
use banlieue_libvirt::connection::VirtConnector;
use banlieue_libvirt::desired::Settings;
use banlieue_libvirt::machine_controller::{self, MachineContext};
use banlieue_libvirt::xml::{DomainType, KernelBoot};
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

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(version, about = "Cluster API infrastructure provider for libvirt")]
struct Args {
    /// Only watch this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Concurrent reconciles per controller.
    #[arg(long, env = "CONCURRENCY", default_value_t = 10)]
    concurrency: u16,
    /// libvirt domain type: `kvm` (hardware virtualization) or `qemu` (TCG emulation, for hosts
    /// without VT-x/AMD-V such as nested test machines).
    #[arg(long, env = "DOMAIN_TYPE", default_value = "kvm")]
    domain_type: DomainType,
    /// Directory on the libvirt host where each domain's serial console is also logged
    /// (`<dir>/<domain>.serial`).
    #[arg(long, env = "SERIAL_LOG_DIR")]
    serial_log_dir: Option<String>,
    /// Boot every domain from this kernel (direct kernel boot, for test guests), with
    /// `--initrd` and `--cmdline`.
    #[arg(long, requires = "initrd")]
    kernel: Option<String>,
    /// Initramfs for `--kernel`.
    #[arg(long, requires = "kernel")]
    initrd: Option<String>,
    /// Kernel command line for `--kernel`.
    #[arg(long, default_value = "console=ttyS0")]
    cmdline: String,
    /// Address of the `/healthz` and `/readyz` endpoints.
    #[arg(long, default_value = "0.0.0.0:8081")]
    health_probe_bind_address: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    log_format: LogFormat,
}

impl Args {
    fn settings(&self) -> Settings {
        Settings {
            domain_type: self.domain_type,
            serial_log_dir: self.serial_log_dir.clone(),
            kernel_boot: match (&self.kernel, &self.initrd) {
                (Some(kernel), Some(initrd)) => Some(KernelBoot {
                    kernel: kernel.clone(),
                    initrd: initrd.clone(),
                    cmdline: self.cmdline.clone(),
                }),
                _ => None,
            },
        }
    }
}

async fn serve(addr: SocketAddr, ready: Arc<AtomicBool>) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    loop {
        let (stream, _) = listener.accept().await?;
        let ready = ready.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let ready = ready.load(Ordering::Relaxed);
                async move {
                    let (status, body) = match req.uri().path() {
                        "/healthz" => (StatusCode::OK, "ok"),
                        "/readyz" if ready => (StatusCode::OK, "ok"),
                        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready"),
                        _ => (StatusCode::NOT_FOUND, "not found"),
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
    let connector = VirtConnector::default();
    let machine = Arc::new(MachineContext::new(
        client.clone(),
        connector.clone(),
        args.settings(),
        "banlieue-libvirt",
    ));
    let cluster = Arc::new(ClusterContext {
        client: client.clone(),
        connector,
    });
    let ready = Arc::new(AtomicBool::new(false));
    let probe = args.health_probe_bind_address;
    let r = ready.clone();
    tokio::spawn(async move {
        if let Err(e) = serve(probe, r).await {
            tracing::error!(error = %e, addr = %probe, "probe endpoint failed");
        }
    });
    let shutdown = shutdown_signal().shared();
    ready.store(true, Ordering::Relaxed);
    let namespace = args.namespace.as_deref();
    futures::future::join(
        machine_controller::run(machine, namespace, args.concurrency, shutdown.clone()),
        cluster_controller::run(cluster, namespace, args.concurrency, shutdown),
    )
    .await;
    tracing::info!("controllers stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_default_to_kvm_and_kernel_boot_needs_both_files() {
        Args::command().debug_assert();
        let args = Args::try_parse_from(["banlieue-libvirt"]).unwrap();
        assert_eq!(args.settings().domain_type, DomainType::Kvm);
        assert_eq!(args.settings().kernel_boot, None);
        let args = Args::try_parse_from([
            "banlieue-libvirt",
            "--domain-type",
            "qemu",
            "--kernel",
            "/k",
            "--initrd",
            "/i",
        ])
        .unwrap();
        let s = args.settings();
        assert_eq!(s.domain_type, DomainType::Qemu);
        assert_eq!(s.kernel_boot.map(|k| k.cmdline), Some("console=ttyS0".into()));
        assert!(Args::try_parse_from(["banlieue-libvirt", "--kernel", "/k"]).is_err());
        assert!(Args::try_parse_from(["banlieue-libvirt", "--domain-type", "xen"]).is_err());
    }
}
