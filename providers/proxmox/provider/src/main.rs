//! `banlieue-proxmox`: the Cluster API infrastructure provider for Proxmox VE.
//!
//! Runs the ProxmoxCluster, ProxmoxMachine and ProxmoxMachineTemplate controllers, optionally
//! behind Lease leader election, with `/healthz` and `/readyz` on the probe address and
//! Prometheus `/metrics` on the metrics address (both from `banlieue-provider-runtime`). Logs are
//! JSON by default. SIGTERM/SIGINT shut down gracefully (in-flight reconciles finish, the Lease
//! is released).

use std::sync::Arc;

use anyhow::Context as _;
use banlieue_api::infrastructure::ProxmoxMachineTemplate;
use banlieue_provider_kit::template::{self, TemplateContext};
use banlieue_provider_runtime::flags::RuntimeArgs;
use banlieue_provider_runtime::http::Probes;
use banlieue_provider_runtime::{logging, manager, shutdown};
use banlieue_proxmox::cluster_controller;
use banlieue_proxmox::credentials::ClientConnector;
use banlieue_proxmox::machine_controller;
use clap::Parser;

/// Command-line flags (each also settable through the named environment variable).
#[derive(Parser, Debug)]
#[command(version, about = "Cluster API infrastructure provider for Proxmox VE")]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Proxmox storage (content `iso`) the bootstrap seed ISOs are uploaded to.
    #[arg(long, env = "SEED_STORAGE", default_value = "local")]
    seed_storage: String,
}

const NAME: &str = "banlieue-proxmox";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    logging::init(args.runtime.log_format);
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes")?;
    let probes = Arc::new(Probes::default());
    let mut machine = machine_controller::context(
        client.clone(),
        ClientConnector::default(),
        args.seed_storage.clone(),
        NAME,
    );
    machine.metrics = probes.metrics.clone();
    let mut cluster = cluster_controller::context(client.clone(), ClientConnector::default(), NAME);
    cluster.metrics = probes.metrics.clone();
    let (machine, cluster) = (Arc::new(machine), Arc::new(cluster));
    let templates = Arc::new(TemplateContext {
        client: client.clone(),
        field_manager: machine_controller::FIELD_MANAGER,
        metrics: probes.metrics.clone(),
    });
    let (namespace, concurrency) = (args.runtime.namespace.as_deref(), args.runtime.concurrency);
    let p = probes.clone();
    manager::run(
        client,
        args.runtime.manager(NAME),
        probes,
        shutdown::signal(),
        |stop| async move {
            p.set_ready(true);
            futures::future::join3(
                machine_controller::run(machine, namespace, concurrency, stop.clone()),
                cluster_controller::run(cluster, namespace, concurrency, stop.clone()),
                template::run::<ProxmoxMachineTemplate>(templates, namespace, stop),
            )
            .await;
        },
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_provider_runtime::logging::LogFormat;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent_and_default_to_json_logs_without_leader_election() {
        Args::command().debug_assert();
        let args = Args::try_parse_from([NAME]).unwrap();
        assert!(!args.runtime.leader_elect);
        assert_eq!(args.runtime.log_format, LogFormat::Json);
        assert_eq!(args.runtime.concurrency, 10);
        assert_eq!(args.seed_storage, "local");
        let args = Args::try_parse_from([
            NAME,
            "--namespace",
            "capi",
            "--leader-elect",
            "--log-format",
            "text",
        ])
        .unwrap();
        assert_eq!(args.runtime.namespace.as_deref(), Some("capi"));
        assert_eq!(
            args.runtime.manager(NAME).leader.map(|l| l.name),
            Some("banlieue-proxmox-leader".into()),
            "the Lease name the clusterctl RBAC grants"
        );
        assert!(Args::try_parse_from([NAME, "--log-format", "xml"]).is_err());
    }
}
