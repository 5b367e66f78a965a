//! `banlieue-vsphere`: the Cluster API infrastructure provider for vSphere.
//!
//! Runs the VSphereCluster, VSphereMachine and VSphereMachineTemplate controllers, optionally
//! behind Lease leader election, with `/healthz` and `/readyz` on the probe address and
//! Prometheus `/metrics` on the metrics address (both from `banlieue-provider-runtime`). Logs are
//! JSON by default.
//! SIGTERM/SIGINT shut down gracefully (in-flight reconciles finish, the Lease is released).

use banlieue_provider_runtime::flags::RuntimeArgs;
use clap::Parser;

/// Command-line flags.
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
    banlieue_vsphere::provider(NAME).main(&args.runtime).await?;
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
