//! `banlieue-clusterctl`: generates banlieue's clusterctl artifacts.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use banlieue_clusterctl::{Infra, artifacts, metadata, repository};
use clap::{Parser, Subcommand};

/// The repository root (this crate lives in `clusterctl/`).
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// Generates banlieue's clusterctl artifacts: provider components, metadata, local repositories.
#[derive(Debug, Parser)]
#[command(name = "banlieue-clusterctl", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print `infrastructure-components.yaml` of an infrastructure provider.
    Components {
        /// The provider.
        #[arg(long, value_enum, default_value = "proxmox")]
        provider: ProviderArg,
    },
    /// Print the banlieue core install manifest (VirtualMachine API + controller).
    Core,
    /// Print `metadata.yaml`.
    Metadata,
    /// Regenerate the committed artifacts (metadata.yaml, clusterctl-settings.json,
    /// clusterctl/dist/*) in the repository.
    Write {
        /// Repository root.
        #[arg(long, default_value = ROOT)]
        root: PathBuf,
        /// Only report drift; exit 1 if any artifact differs.
        #[arg(long)]
        check: bool,
    },
    /// Write a clusterctl local repository and its `clusterctl.yaml` into DIR.
    Repository {
        /// Target folder (created).
        dir: PathBuf,
        /// Folder of the cluster templates (Proxmox's at its top level, libvirt's and vSphere's in
        /// `libvirt/` and `vsphere/`).
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../templates"))]
        templates: PathBuf,
        /// Also write Cluster API's core, kubeadm bootstrap and kubeadm control-plane providers
        /// (Namespace + CRDs only) from this folder of CAPI CRDs, e.g.
        /// `tests/controlplane/bin/capi-crds`.
        #[arg(long)]
        capi_crds: Option<PathBuf>,
        /// Version of the CAPI providers written with --capi-crds.
        #[arg(long, default_value = repository::CAPI_VERSION)]
        capi_version: String,
    },
}

/// An infrastructure provider on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ProviderArg {
    /// banlieue-proxmox.
    Proxmox,
    /// banlieue-libvirt.
    Libvirt,
    /// banlieue-vsphere.
    Vsphere,
}

impl From<ProviderArg> for Infra {
    fn from(p: ProviderArg) -> Self {
        match p {
            ProviderArg::Proxmox => Infra::Proxmox,
            ProviderArg::Libvirt => Infra::Libvirt,
            ProviderArg::Vsphere => Infra::Vsphere,
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    match cli.command {
        Command::Components { provider } => {
            stdout.write_all(artifacts::components_yaml(provider.into())?.as_bytes())?
        }
        Command::Core => stdout.write_all(artifacts::core_manifest_yaml()?.as_bytes())?,
        Command::Metadata => stdout.write_all(metadata::metadata_yaml()?.as_bytes())?,
        Command::Write { root, check } => {
            if check {
                let drifted = artifacts::drifted(&root)?;
                for path in &drifted {
                    writeln!(stdout, "drifted: {path}")?;
                }
                if !drifted.is_empty() {
                    anyhow::bail!(
                        "{} artifact(s) differ; run `banlieue-clusterctl write`",
                        drifted.len()
                    );
                }
            } else {
                for path in artifacts::write_all(&root)? {
                    writeln!(stdout, "wrote {path}")?;
                }
            }
        }
        Command::Repository {
            dir,
            templates,
            capi_crds,
            capi_version,
        } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let dir = std::fs::canonicalize(&dir)?;
            let mut entries = Vec::new();
            if let Some(crds) = capi_crds {
                entries.extend(repository::write_capi(&dir, &crds, &capi_version)?);
            }
            entries.extend(repository::write_all_infra(&dir, &templates)?);
            let config = repository::write_config(&dir, &entries)?;
            writeln!(stdout, "{}", config.display())?;
        }
    }
    Ok(())
}
