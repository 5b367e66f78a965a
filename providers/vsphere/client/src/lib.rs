//! banlieue-vsphere-client: a thin async client for the vSphere SOAP API (vim25), covering the
//! calls a Cluster API provider needs. See the crate README for why it is not `vim_rs`.
//!
//! - [`client`]: transport, session cookie, re-login on `NotAuthenticated`, timeouts.
//! - [`objects`]: managed object references and the service content.
//! - [`device`]: disks and NICs of a VM, network backings, `deviceChange` entries.
//! - [`ovf`]: importing an OVF package (import spec, `ImportVApp`, the lease's uploads).
//! - [`hosts`]: the hosts a clone into a resource pool may land on, with their memory left.
//! - [`vim`]: typed calls (find, clone, reconfigure, power, destroy, tasks, properties).
//! - [`tagging`]: vSphere tags over the vAPI REST service (categories, tags, a VM's tags).
//! - [`tls`]: web PKI, CA bundle, SHA-256 thumbprint pinning, explicit insecure.
//! - [`xml`]: the XML subset SOAP uses.

pub mod client;
pub mod device;
pub mod error;
pub mod hosts;
pub mod objects;
pub mod ovf;
pub mod secret;
pub mod tagging;
pub mod tls;
pub mod vim;
pub mod xml;

pub use client::{Client, ClientBuilder};
pub use device::{DeviceChange, Hardware, NetworkBacking, PciPassthrough, VirtualDisk, VirtualNic};
pub use error::{Error, ErrorClass, Result};
pub use hosts::{HostRoom, PoolHosts};
pub use secret::Secret;
pub use tls::{TlsVerification, thumbprint_of};
pub use vim::{CloneSpec, ConfigSpec, MoRef, TaskInfo, TaskState, VmInfo, VmPowerState};
