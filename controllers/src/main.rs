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
                banlieue_controllers::controller::run_with_metrics(
                    client,
                    namespace.clone(),
                    shutdown_signal(),
                    metrics,
                )
                .await;
                let _ = stop_http.send(());
                let _ = http.await;
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
