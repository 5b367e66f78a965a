//! `banlieue-proxmox`: the Cluster API infrastructure provider for Proxmox VE.
//!
//! Runs the ProxmoxCluster, ProxmoxMachine and ProxmoxMachineTemplate controllers, optionally
//! behind Lease leader election, with `/healthz` and `/readyz` on the probe address and
//! Prometheus `/metrics` on the metrics address (both from `banlieue-provider-runtime`). Logs are
//! JSON by default. SIGTERM/SIGINT shut down gracefully (in-flight reconciles finish, the Lease
//! is released).

use banlieue_provider_runtime::flags::RuntimeArgs;
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
    banlieue_proxmox::provider(NAME, args.seed_storage.clone())
        .main(&args.runtime)
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
