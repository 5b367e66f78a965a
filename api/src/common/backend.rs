//! Which hypervisor API a Provider (and an infrastructure kind) speaks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which hypervisor API a Provider speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Proxmox VE (REST API, API token credentials).
    #[default]
    Proxmox,
    /// libvirt (a libvirt URI, e.g. `qemu+ssh://root@host/system`).
    Libvirt,
    /// VMware vSphere (vCenter SDK).
    Vsphere,
}

impl Backend {
    /// The wire form: `proxmox`, `libvirt` or `vsphere`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Proxmox => "proxmox",
            Self::Libvirt => "libvirt",
            Self::Vsphere => "vsphere",
        }
    }

    /// The finalizer this backend's provider holds on its infrastructure machines and clusters
    /// until it has deleted what it made on the hypervisor: `infrastructure.banlieue.io/<backend>`.
    /// The banlieue controller writes it with each machine it creates (the provider then has
    /// no finalizer of its own to add), and the provider adds it to any machine that lacks it.
    pub const fn finalizer(self) -> &'static str {
        match self {
            Self::Proxmox => "infrastructure.banlieue.io/proxmox",
            Self::Libvirt => "infrastructure.banlieue.io/libvirt",
            Self::Vsphere => "infrastructure.banlieue.io/vsphere",
        }
    }
}
