//! Cluster API v1beta2 types generated from CAPI's published CRDs, plus hand-written contract helpers.
//!
//! - [`generated`]: one module per CAPI kind, made by kopium 0.24.1 from CAPI v1.14's CRDs (see
//!   `api/capi/generate.sh`, and the header of each file for its source CRD and exact command).
//!   Never edit those files; change the script and regenerate.
//! - [`contract`]: label/annotation keys, pause rule, owner lookup, contract-label parsing and
//!   `{apiGroup, kind, name}` references of the v1beta2 provider contract.
//! - [`bootstrap`]: the bootstrap data Secret.
//! - [`ipam`]: creating `IPAddressClaim`s and reading the `IPAddress` an IPAM provider allocated.
//! - [`crds`]: where CAPI's published CRDs are (`api/capi/crds`, or `$BANLIEUE_CAPI_CRDS`).
//! - [`clusterctl`]: the provider `metadata.yaml` (`Metadata`, hand-written: kopium cannot
//!   generate spec-less kinds).
//! - [`webhooks`]: where CAPI's managers' admission webhook configurations are
//!   (`api/capi/webhooks`, or `$BANLIEUE_CAPI_WEBHOOKS`).
//! - [`v1beta1`]: the old condition shape still found under `status.deprecated.v1beta1`.
//!
//! The root kinds are re-exported at the crate root (`banlieue_capi::Cluster`, …).

pub mod bootstrap;
pub mod clusterctl;
pub mod contract;
pub mod crds;
mod error;
pub mod generated;
pub mod ipam;
pub mod v1beta1;
pub mod webhooks;

pub use error::{Error, Result};
pub use generated::cluster::{Cluster, ClusterSpec, ClusterStatus};
pub use generated::cluster_class::{ClusterClass, ClusterClassSpec, ClusterClassStatus};
pub use generated::cluster_resource_set::{
    ClusterResourceSet, ClusterResourceSetSpec, ClusterResourceSetStatus,
};
pub use generated::cluster_resource_set_binding::{ClusterResourceSetBinding, ClusterResourceSetBindingSpec};
pub use generated::ip_address::{IpAddress, IpAddressSpec};
pub use generated::ip_address_claim::{IpAddressClaim, IpAddressClaimSpec, IpAddressClaimStatus};
pub use generated::kubeadm_config::{KubeadmConfig, KubeadmConfigSpec, KubeadmConfigStatus};
pub use generated::kubeadm_config_template::{KubeadmConfigTemplate, KubeadmConfigTemplateSpec};
pub use generated::kubeadm_control_plane::{
    KubeadmControlPlane, KubeadmControlPlaneSpec, KubeadmControlPlaneStatus,
};
pub use generated::kubeadm_control_plane_template::{
    KubeadmControlPlaneTemplate, KubeadmControlPlaneTemplateSpec,
};
pub use generated::machine::{Machine, MachineSpec, MachineStatus};
pub use generated::machine_deployment::{MachineDeployment, MachineDeploymentSpec, MachineDeploymentStatus};
pub use generated::machine_health_check::{
    MachineHealthCheck, MachineHealthCheckSpec, MachineHealthCheckStatus,
};
pub use generated::machine_pool::{MachinePool, MachinePoolSpec, MachinePoolStatus};
pub use generated::machine_set::{MachineSet, MachineSetSpec, MachineSetStatus};
