//! `banlieue-vsphere`: the Cluster API infrastructure provider for vSphere.
//!
//! Runs the VSphereCluster, VSphereMachine and VSphereMachineTemplate controllers, optionally
//! behind Lease leader election, with `/healthz` and `/readyz` on the probe address and
//! Prometheus `/metrics` on the metrics address (both from `banlieue-provider-runtime`). Logs are
//! JSON by default.
//! SIGTERM/SIGINT shut down gracefully (in-flight reconciles finish, the Lease is released).

use std::sync::Arc;

use anyhow::Context as _;
use banlieue_api::infrastructure::VSphereMachineTemplate;
use banlieue_provider_kit::template::{self, TemplateContext};
use banlieue_provider_runtime::flags::RuntimeArgs;
use banlieue_provider_runtime::http::Probes;
use banlieue_provider_runtime::{logging, manager, shutdown};
use banlieue_vsphere::machine_controller::Context;
use banlieue_vsphere::{cluster_controller, machine_controller};
use clap::Parser;

/// The banlieue vSphere infrastructure provider.
#[derive(Parser, Debug)]
#[command(version, about = "Cluster API infrastructure provider for vSphere")]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

const NAME: &str = "banlieue-vsphere";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    logging::init(args.runtime.log_format);
    let kube = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes")?;
    let probes = Arc::new(Probes::default());
    let mut ctx = Context::new(kube.clone(), NAME);
    ctx.metrics = probes.metrics.clone();
    ctx.concurrency = args.runtime.concurrency;
    let ctx = Arc::new(ctx);
    let templates = Arc::new(TemplateContext {
        client: kube.clone(),
        field_manager: machine_controller::FIELD_MANAGER,
        metrics: probes.metrics.clone(),
    });
    let namespace = args.runtime.namespace.as_deref();
    let p = probes.clone();
    manager::run(
        kube,
        args.runtime.manager(NAME),
        probes,
        shutdown::signal(),
        |stop| async move {
            p.set_ready(true);
            tokio::join!(
                machine_controller::run_until(ctx.clone(), namespace, stop.clone()),
                cluster_controller::run_until(ctx.clone(), namespace, stop.clone()),
                template::run::<VSphereMachineTemplate>(templates, namespace, stop)
            );
        },
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_the_runtime_flags() {
        Args::command().debug_assert();
        let args = Args::try_parse_from([NAME, "--namespace", "capi", "--leader-elect"]).unwrap();
        assert_eq!(args.runtime.namespace.as_deref(), Some("capi"));
        assert_eq!(
            args.runtime.manager(NAME).leader.map(|l| l.name),
            Some("banlieue-vsphere-leader".into())
        );
    }
}
