//! `banlieue-vsphere`: runs the VSphereCluster and VSphereMachine controllers.

use std::sync::Arc;

use banlieue_vsphere::machine_controller::Context;
use banlieue_vsphere::{cluster_controller, machine_controller};
use clap::Parser;

/// The banlieue vSphere infrastructure provider.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Log as JSON lines.
    #[arg(long, env = "BANLIEUE_LOG_JSON")]
    log_json: bool,
    /// Watch only this namespace (default: all).
    #[arg(long, env = "BANLIEUE_WATCH_NAMESPACE")]
    namespace: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if args.log_json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let kube = kube::Client::try_default().await?;
    let ctx = Arc::new(Context::new(kube, "banlieue-vsphere"));
    let ns = args.namespace.as_deref();
    tokio::join!(
        machine_controller::run(ctx.clone(), ns),
        cluster_controller::run(ctx, ns)
    );
    Ok(())
}
