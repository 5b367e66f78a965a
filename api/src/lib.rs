//! banlieue's Kubernetes API types: the hypervisor-neutral `banlieue.io/v1alpha1` kinds
//! ([`VirtualMachine`](banlieue::VirtualMachine), [`Provider`](banlieue::Provider),
//! [`VirtualMachineClass`](banlieue::VirtualMachineClass),
//! [`VirtualMachineImage`](banlieue::VirtualMachineImage)) and the per-hypervisor
//! `infrastructure.banlieue.io/v1alpha1` kinds implementing the Cluster API v1beta2
//! InfraCluster / InfraMachine / template contracts (Proxmox VE, libvirt, vSphere).
//!
//! The Rust types are the single source of truth for the CRDs: [`crds::all`] returns every
//! `CustomResourceDefinition`, and `config/crd/` holds the committed YAML.
//!
//! This crate depends on nothing else of banlieue's.

// `#[kube(printcolumn(type_ = …), …)]` repeats keys by design; clippy mistakes them for
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod banlieue;
pub mod common;
pub mod condition;
pub mod crds;
pub mod infrastructure;
pub mod policies;
pub mod standalone;
pub mod support;
pub mod validation;
pub mod yaml;

/// API group of the hypervisor-neutral kinds.
pub const BANLIEUE_GROUP: &str = "banlieue.io";
/// API group of the Cluster API infrastructure kinds.
pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.banlieue.io";
/// The only API version served so far.
pub const VERSION: &str = "v1alpha1";
/// CRD label CAPI reads to find which of our versions implements its v1beta2 contract.
pub const CAPI_CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";
/// Value of [`CAPI_CONTRACT_LABEL`]: `_`-separated served versions implementing the contract.
pub const CAPI_CONTRACT_VERSIONS: &str = "v1alpha1";
/// Label CAPI puts on every object belonging to a Cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Annotation of a credentials Secret naming the namespaces (comma-separated, or `*` for all)
/// whose infrastructure clusters may name it from another namespace; without it, only objects
/// of the Secret's own namespace (and Providers) may use it.
pub const ALLOWED_NAMESPACES_ANNOTATION: &str = "banlieue.io/allowed-namespaces";
/// Annotation of a credentials Secret naming the endpoints (comma-separated, as infrastructure
/// clusters and Providers write them, or `*` for any) the credentials may be sent to. Where set,
/// it holds for every object using the Secret; a Secret that other namespaces may use
/// ([`ALLOWED_NAMESPACES_ANNOTATION`]) must set it, since those namespaces choose the endpoint.
pub const ALLOWED_ENDPOINTS_ANNOTATION: &str = "banlieue.io/allowed-endpoints";
