//! clusterctl artifacts for banlieue, generated from the Rust sources of truth (CRD types, RBAC
//! rules in `banlieue_proxmox::rbac`, `banlieue_libvirt::rbac`, `banlieue_vsphere::rbac` and
//! `banlieue_controllers::rbac`, the release version):
//!
//! - [`components`]: `infrastructure-components.yaml` of each infrastructure provider ([`Infra`])
//!   and the plain `kubectl apply` manifest of the banlieue core (VirtualMachine API + controller);
//! - [`metadata`]: clusterctl's `metadata.yaml` and `clusterctl-settings.json`;
//! - [`repository`]: a clusterctl local repository (our providers, plus CAPI's core and kubeadm
//!   providers built from CAPI's CRDs) and its `clusterctl.yaml`;
//! - [`offline`]: what an offline `clusterctl init` needs besides (a cert-manager stand-in,
//!   `clusterctl-offline.yaml`);
//! - [`artifacts`]: the committed copies and the drift check.

pub mod artifacts;
pub mod components;
pub mod metadata;
pub mod offline;
pub mod repository;
pub mod yaml;

/// clusterctl's name of the Proxmox provider (`--infrastructure banlieue-proxmox`).
pub const PROXMOX_PROVIDER: &str = "banlieue-proxmox";
/// The provider label clusterctl puts on every object of the provider (and the directory name in
/// a local repository).
pub const PROXMOX_PROVIDER_LABEL: &str = "infrastructure-banlieue-proxmox";
/// Namespace the Proxmox provider runs in.
pub const PROXMOX_NAMESPACE: &str = "banlieue-proxmox-system";
/// banlieue's infrastructure providers, each installed by clusterctl as
/// `--infrastructure banlieue-<name>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Infra {
    /// Proxmox VE (`banlieue-proxmox`).
    Proxmox,
    /// libvirt (`banlieue-libvirt`).
    Libvirt,
    /// VMware vSphere (`banlieue-vsphere`).
    Vsphere,
}

impl Infra {
    /// Every provider, in release order.
    pub const ALL: [Infra; 3] = [Infra::Proxmox, Infra::Libvirt, Infra::Vsphere];

    /// Short name (`proxmox`, `libvirt`, `vsphere`): the templates' folder and image suffix.
    pub fn short(self) -> &'static str {
        match self {
            Self::Proxmox => "proxmox",
            Self::Libvirt => "libvirt",
            Self::Vsphere => "vsphere",
        }
    }

    /// clusterctl's provider name and the binary (`banlieue-libvirt`).
    pub fn name(self) -> String {
        format!("banlieue-{}", self.short())
    }

    /// The provider label value and the local-repository folder
    /// (`infrastructure-banlieue-libvirt`).
    pub fn label(self) -> String {
        format!("infrastructure-banlieue-{}", self.short())
    }

    /// Namespace the provider runs in (`banlieue-libvirt-system`).
    pub fn namespace(self) -> String {
        format!("banlieue-{}-system", self.short())
    }

    /// Kind prefix of its `infrastructure.banlieue.io` CRDs (`Libvirt`, `VSphere`).
    pub fn kind_prefix(self) -> &'static str {
        match self {
            Self::Proxmox => "Proxmox",
            Self::Libvirt => "Libvirt",
            Self::Vsphere => "VSphere",
        }
    }

    /// Prefix of its clusterctl variables (`BANLIEUE_LIBVIRT`).
    pub fn var_prefix(self) -> String {
        format!("BANLIEUE_{}", self.short().to_uppercase())
    }
}

/// Namespace of the banlieue controller.
pub const CORE_NAMESPACE: &str = "banlieue-system";
/// The release of this source tree, as clusterctl spells versions.
pub const VERSION: &str = concat!("v", env!("CARGO_PKG_VERSION"));
/// Label key clusterctl uses to find a provider's objects.
pub const PROVIDER_LABEL_KEY: &str = "cluster.x-k8s.io/provider";

/// Errors of the generator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A document could not be rendered or parsed.
    #[error("YAML of {what}")]
    Yaml {
        /// Which document.
        what: String,
        /// The serializer's error.
        #[source]
        source: serde_yaml::Error,
    },
    /// A file could not be read or written.
    #[error("{action} {path}")]
    Io {
        /// What was done.
        action: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The input (e.g. a CRD folder) is not what the generator expects.
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// An [`Error::Io`].
    pub fn io(action: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.display().to_string(),
            source,
        }
    }

    /// A short, stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Yaml { .. } => "yaml",
            Self::Io { .. } => "io",
            Self::Invalid(_) => "invalid",
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
