//! `banlieue`: the banlieue command line.

use std::io::Write;

use std::sync::Arc;

use anyhow::Context;
use banlieue_controllers::controller::{Metrics, run_with_metrics};
use banlieue_controllers::http::Endpoint;
use banlieue_provider_runtime::logging::{self, LogFormat};
use banlieue_provider_runtime::manager::{self, LeaseSettings, ManagerConfig};
use banlieue_provider_runtime::shutdown;
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
        /// Log format: `text` (colour only on a terminal) or `json` (one object per line).
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
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
            log_format,
        } => {
            logging::init(log_format);
            let leader = leader_elect.then(|| LeaseSettings {
                name: banlieue_controllers::leader::LEASE_NAME.to_owned(),
                namespace: leader_election_namespace
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .unwrap_or_else(|| "default".to_owned()),
                identity: std::env::var("POD_NAME")
                    .unwrap_or_else(|_| format!("banlieue-controller-{}", std::process::id())),
            });
            let config = ManagerConfig {
                metrics_addr,
                health_addr: None,
                leader,
            };
            let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            runtime.block_on(async move {
                let client = kube::Client::try_default()
                    .await
                    .context("connecting to Kubernetes (kubeconfig or in-cluster config)")?;
                tracing::info!(
                    namespace = namespace.as_deref().unwrap_or("*"),
                    "banlieue controller starting"
                );
                let metrics = Arc::new(Metrics::default());
                let endpoint = Arc::new(Endpoint(metrics.clone()));
                manager::run(client.clone(), config, endpoint, shutdown::signal(), |stop| {
                    run_with_metrics(client, namespace, stop, metrics)
                })
                .await
                .context(
                    "running the controller (a lost Lease exits non-zero, so a fresh process competes again)",
                )?;
                tracing::info!("banlieue controller stopped");
                anyhow::Ok(())
            })?;
        }
    }
    Ok(())
}
