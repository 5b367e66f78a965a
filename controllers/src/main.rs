//! `banlieue`: the banlieue command line.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// banlieue: hypervisor-neutral virtual machines and Cluster API infrastructure providers.
#[derive(Debug, Parser)]
#[command(name = "banlieue", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print every banlieue CustomResourceDefinition as multi-document YAML
    /// (`banlieue crds | kubectl apply -f -`).
    Crds,
    /// Run the banlieue controller (VirtualMachine → infrastructure machine → status) against
    /// the cluster of the current kubeconfig / in-cluster config, until Ctrl-C or SIGTERM.
    Controller {
        /// Watch only this namespace (default: every namespace).
        #[arg(long)]
        namespace: Option<String>,
        /// Address of the `/metrics`, `/healthz` and `/readyz` endpoint.
        #[arg(long, default_value = "0.0.0.0:8080")]
        metrics_addr: std::net::SocketAddr,
        /// Reconcile only while holding the Lease `banlieue-controller` (for several replicas).
        #[arg(long)]
        leader_elect: bool,
        /// Namespace of the leader-election Lease (default: `$POD_NAMESPACE`, else `default`).
        #[arg(long)]
        leader_election_namespace: Option<String>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => {
            let yaml = banlieue_controllers::all_crds_yaml()?;
            std::io::stdout()
                .lock()
                .write_all(yaml.as_bytes())
                .context("writing CRDs to stdout")?;
        }
        Command::Controller {
            namespace,
            metrics_addr,
            leader_elect,
            leader_election_namespace,
        } => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                let client = kube::Client::try_default()
                    .await
                    .context("connecting to Kubernetes (kubeconfig or in-cluster config)")?;
                tracing::info!(
                    namespace = namespace.as_deref().unwrap_or("*"),
                    "banlieue controller starting"
                );
                let listener = banlieue_controllers::http::bind(metrics_addr)
                    .await
                    .with_context(|| format!("binding the metrics endpoint {metrics_addr}"))?;
                let metrics = std::sync::Arc::new(banlieue_controllers::controller::Metrics::default());
                let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
                let http = tokio::spawn(banlieue_controllers::http::serve(
                    listener,
                    metrics.clone(),
                    async move {
                        let _ = http_stopped.await;
                    },
                ));
                let lost = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let client_for_release = client.clone();
                let mut lease = None;
                let shutdown: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>> =
                    if leader_elect {
                        let lease_ns = leader_election_namespace
                            .or_else(|| std::env::var("POD_NAMESPACE").ok())
                            .unwrap_or_else(|| "default".to_owned());
                        let identity = std::env::var("POD_NAME")
                            .unwrap_or_else(|_| format!("banlieue-controller-{}", std::process::id()));
                        let cfg = banlieue_controllers::leader::LeaseConfig::new(
                            "banlieue-controller",
                            lease_ns,
                            identity,
                        );
                        lease = Some(cfg.clone());
                        tokio::select! {
                            () = banlieue_controllers::leader::acquire(&client, &cfg) => {}
                            () = shutdown_signal() => {
                                let _ = stop_http.send(());
                                return anyhow::Ok(());
                            }
                        }
                        // The renewal loop runs as its own task (the shutdown future must be Sync).
                        let (client, lost) = (client.clone(), lost.clone());
                        let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
                        tokio::spawn(async move {
                            banlieue_controllers::leader::hold(&client, &cfg).await;
                            lost.store(true, std::sync::atomic::Ordering::SeqCst);
                            let _ = lost_tx.send(());
                        });
                        Box::pin(async move {
                            tokio::select! {
                                _ = lost_rx => {}
                                () = shutdown_signal() => {}
                            }
                        })
                    } else {
                        Box::pin(shutdown_signal())
                    };
                banlieue_controllers::controller::run_with_metrics(
                    client,
                    namespace.clone(),
                    shutdown,
                    metrics,
                )
                .await;
                let _ = stop_http.send(());
                let _ = http.await;
                if let Some(cfg) = &lease
                    && !lost.load(std::sync::atomic::Ordering::SeqCst)
                    && let Err(e) = banlieue_controllers::leader::release(&client_for_release, cfg).await
                {
                    tracing::warn!(error = %e, "cannot release the Lease (a standby takes over after it expires)");
                }
                if lost.load(std::sync::atomic::Ordering::SeqCst) {
                    anyhow::bail!("leadership lost: exiting so that a fresh process competes again");
                }
                tracing::info!("banlieue controller stopped");
                anyhow::Ok(())
            })?;
        }
    }
    Ok(())
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the controller");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
