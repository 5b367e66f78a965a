//! banlieue-vsphere: the Cluster API v1beta2 infrastructure provider for VMware vSphere,
//! over the thin SOAP client `banlieue-vsphere-client`.
//!
//! - [`connection`]: VSphereCluster / Provider → endpoint, credentials, TLS; client cache.
//! - [`owner`]: a machine's controlling owner (CAPI Machine or banlieue VirtualMachine).
//! - [`phase`]: the provisioning state machine persisted in status.
//! - [`provision`]: one provisioning or deletion step against vCenter.
//! - [`readopt`]: finding the VM of a machine re-created by `clusterctl move` or a restore.
//! - [`update`]: CPU, memory, disks and NICs towards the spec (pure), during provisioning and as drift.
//! - [`machine_controller`], [`cluster_controller`], [`template_controller`]: the reconcilers.

pub mod cluster_controller;
pub mod connection;
pub mod error;
pub mod machine_controller;
pub mod owner;
pub mod phase;
pub mod provision;
pub mod rbac;
pub mod readopt;
pub mod template_controller;
pub mod update;
