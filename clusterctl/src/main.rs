//! `banlieue-clusterctl`: generates banlieue's clusterctl artifacts.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use banlieue_clusterctl::{Infra, artifacts, metadata, offline, repository};
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
    /// Write a clusterctl local repository into DIR: banlieue's providers, Cluster API's core,
    /// kubeadm bootstrap and kubeadm control-plane providers (Namespace + CRDs only, no manager
    /// Deployments) and a cert-manager stand-in (its Issuer and Certificate CRDs only), with
    /// `clusterctl.yaml` (banlieue's providers; CAPI and cert-manager from GitHub) and
    /// `clusterctl-offline.yaml` (everything from DIR: `clusterctl init` downloads nothing).
    /// Prints the path of `clusterctl.yaml`, then that of `clusterctl-offline.yaml`.
    Repository {
        /// Target folder (created).
        dir: PathBuf,
        /// Folder of the cluster templates (Proxmox's at its top level, libvirt's and vSphere's in
        /// `libvirt/` and `vsphere/`).
        #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../templates"))]
        templates: PathBuf,
        /// Folder of CAPI's CRDs the CAPI providers are made of [default: the repository's
        /// api/capi/crds, or $BANLIEUE_CAPI_CRDS].
        #[arg(long, conflicts_with = "no_capi")]
        capi_crds: Option<PathBuf>,
        /// Folder of CAPI's release components (`core-components.yaml`,
        /// `bootstrap-components.yaml`, `control-plane-components.yaml`, e.g.
        /// tests/controlplane/bin/capi-components): the CAPI providers are those, with their
        /// manager Deployments, instead of CRDs only.
        #[arg(long, conflicts_with_all = ["no_capi", "capi_crds"])]
        capi_components: Option<PathBuf>,
        /// Version of the CAPI providers.
        #[arg(long, default_value = repository::CAPI_VERSION)]
        capi_version: String,
        /// Write banlieue's providers and `clusterctl.yaml` only (no CAPI, no cert-manager, no
        /// `clusterctl-offline.yaml`).
        #[arg(long)]
        no_capi: bool,
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
            capi_components,
            capi_version,
            no_capi,
        } => {
            let capi_crds = (!no_capi && capi_components.is_none())
                .then(|| capi_crds.unwrap_or_else(offline::default_capi_crds));
            if let Some(crds) = &capi_crds {
                offline::check_capi_crds(crds)?;
            }
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let dir = std::fs::canonicalize(&dir)?;
            let infra = repository::write_all_infra(&dir, &templates)?;
            writeln!(stdout, "{}", repository::write_config(&dir, &infra)?.display())?;
            let capi = match (capi_crds, capi_components) {
                (_, Some(components)) => {
                    Some(repository::write_capi_release(&dir, &components, &capi_version)?)
                }
                (Some(crds), None) => Some(repository::write_capi(&dir, &crds, &capi_version)?),
                (None, None) => None,
            };
            if let Some(mut entries) = capi {
                entries.extend(infra);
                let cert_manager = offline::write_cert_manager_stub(&dir)?;
                let config = repository::write_named_config(
                    &dir.join(repository::OFFLINE_CONFIG_FILE),
                    &entries,
                    Some(&cert_manager),
                )?;
                writeln!(stdout, "{}", config.display())?;
            }
        }
    }
    Ok(())
}
