//! Shapes shared by several kinds: references, the neutral machine shape (CPU, memory, disks,
//! networks), CAPI contract fragments (addresses, failure domains, initialization) and TLS trust.
//!
//! The neutral machine shape is deliberately identical in the `VirtualMachine` and in every
//! infrastructure machine, so that the banlieue controller can map one onto the other with a
//! data-driven table instead of per-backend code.

mod backend;
mod capi;
mod download;
mod machine;
mod references;
mod tls;

pub use backend::Backend;
pub use capi::{
    ApiEndpoint, FailureDomain, Initialization, MachineAddress, MachineAddressType, MachineTemplateStatus,
    NodeInfo, ObjectMetaTemplate,
};
pub use download::{ChecksumAlgorithm, ImageDownload};
pub use machine::{
    CloneMode, Cpu, Disk, Firmware, IpAddressing, IpAddressingMode, LABEL_KEY_PATTERN, MIN_MEMORY_MIB,
    NetworkInterface, PowerState, ProvisioningState, ProvisioningStatus, ReadinessChecks, RestartPolicy,
    SeedDriveBus,
};
pub use references::{
    ContractReference, IpPoolReference, LocalObjectReference, ProviderReference, SecretKeyReference,
    SecretReference,
};
pub use tls::{CaBundleKind, CaBundleReference, TlsTrust};
