//! `banlieue-libvirt`: the Cluster API infrastructure provider for libvirt.
//!
//! Runs the LibvirtCluster, LibvirtMachine and LibvirtMachineTemplate controllers, optionally
//! behind Lease leader election, with `/healthz` and `/readyz` on the probe address and
//! Prometheus `/metrics` on the metrics address (both from `banlieue-provider-runtime`). Logs are
//! JSON by default.
//! SIGTERM/SIGINT shut down gracefully (in-flight reconciles finish, the Lease is released).

use banlieue_libvirt::connection::VirtConnector;
use banlieue_libvirt::desired::Settings;
use banlieue_libvirt::xml::{DomainType, KernelBoot};
use banlieue_provider_runtime::flags::RuntimeArgs;
use clap::Parser;

/// Command-line flags.
#[derive(Parser, Debug)]
#[command(version, about = "Cluster API infrastructure provider for libvirt")]
struct Args {
    #[command(flatten)]
    runtime: RuntimeArgs,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    banlieue_libvirt::provider(VirtConnector::default(), args.settings())
        .main(&args.runtime)
        .await?;
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
        assert!(!args.runtime.leader_elect);
        let args = Args::try_parse_from([
            "banlieue-libvirt",
            "--domain-type",
            "qemu",
            "--kernel",
            "/k",
            "--initrd",
            "/i",
            "--leader-elect",
        ])
        .unwrap();
        let s = args.settings();
        assert_eq!(s.domain_type, DomainType::Qemu);
        assert_eq!(s.kernel_boot.map(|k| k.cmdline), Some("console=ttyS0".into()));
        assert_eq!(
            args.runtime
                .manager(banlieue_libvirt::NAME)
                .leader
                .map(|l| l.name),
            Some("banlieue-libvirt-leader".into())
        );
        assert!(Args::try_parse_from(["banlieue-libvirt", "--kernel", "/k"]).is_err());
        assert!(Args::try_parse_from(["banlieue-libvirt", "--domain-type", "xen"]).is_err());
    }
}
