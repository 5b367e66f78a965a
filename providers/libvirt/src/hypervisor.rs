//! The small trait the reconcilers use to reach one libvirt host: one libvirt call (or a short
//! fixed sequence) per method, every method bounded by a timeout in the implementation.
//! Implemented by [`crate::connection::VirtHypervisor`] (feature `libvirt`).

use std::future::Future;

use crate::xml::Owner;

/// Classification of a libvirt error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The object does not exist.
    NotFound,
    /// An object with that name or uuid already exists.
    Exists,
    /// The driver does not implement the call (e.g. volume upload on `test:///default`).
    Unsupported,
    /// The connection failed or timed out (retry).
    Transient,
    /// Anything else (invalid XML, operation invalid in this state, …).
    Other,
}

/// A libvirt error with its classification; the message is libvirt's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("libvirt: {operation}: {message}")]
pub struct HvError {
    /// Classification.
    pub kind: ErrorKind,
    /// What was being done.
    pub operation: String,
    /// libvirt's message.
    pub message: String,
}

impl HvError {
    /// Builds an error.
    pub fn new(kind: ErrorKind, operation: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            operation: operation.into(),
            message: message.into(),
        }
    }

    /// Whether the object was not found.
    pub fn is_not_found(&self) -> bool {
        self.kind == ErrorKind::NotFound
    }
}

/// Result of a hypervisor call.
pub type HvResult<T> = std::result::Result<T, HvError>;

/// Run state of a domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// Running (or paused/blocked: the guest exists in memory).
    Running,
    /// Shut off (defined, not running).
    ShutOff,
    /// Shutting down.
    ShuttingDown,
    /// Crashed or otherwise stopped abnormally.
    Crashed,
}

/// A domain as seen by the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainInfo {
    /// Domain name.
    pub name: String,
    /// Domain uuid (lower-case).
    pub uuid: String,
    /// Run state.
    pub state: RunState,
    /// The banlieue owner in its metadata, if any.
    pub owner: Option<Owner>,
    /// The UID of the object this domain was taken over from, when it was re-marked for a copy
    /// (`clusterctl move`, a restore).
    pub adopted_from: Option<String>,
    /// MAC addresses of its interfaces, in order.
    pub macs: Vec<String>,
    /// CPU topology and memory of its persistent definition, when readable.
    pub sizing: Option<crate::xml::Sizing>,
}

/// A storage volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Volume name.
    pub name: String,
    /// Path on the host (what a backing store refers to).
    pub path: String,
    /// Capacity in bytes.
    pub capacity: u64,
    /// Format (`qcow2`, `raw`, …).
    pub format: String,
}

/// One guest interface address (from the DHCP leases of the domain's network).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestAddress {
    /// MAC of the interface.
    pub mac: String,
    /// IP address.
    pub ip: String,
}

/// Facts about the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostInfo {
    /// libvirt version of the daemon (`major.minor.micro`).
    pub version: String,
    /// Free memory of the host in bytes (0 when the driver does not tell).
    pub free_memory: u64,
    /// Active CPUs, when the driver tells them.
    pub cpus: Option<u32>,
    /// Memory in MiB, when the driver tells it.
    pub memory_mib: Option<u64>,
}

/// Access to one libvirt host.
pub trait Hypervisor: Send + Sync + 'static {
    /// Hostname and version (connectivity check).
    fn host_info(&self) -> impl Future<Output = HvResult<HostInfo>> + Send;
    /// The domain with this uuid, if any.
    fn domain_by_uuid(&self, uuid: &str) -> impl Future<Output = HvResult<Option<DomainInfo>>> + Send;
    /// The domain with this name, if any.
    fn domain_by_name(&self, name: &str) -> impl Future<Output = HvResult<Option<DomainInfo>>> + Send;
    /// Defines (persistently) a domain from XML.
    fn define_domain(&self, xml: &str) -> impl Future<Output = HvResult<DomainInfo>> + Send;
    /// Starts a defined domain.
    fn start_domain(&self, uuid: &str) -> impl Future<Output = HvResult<()>> + Send;
    /// Asks the guest to shut down (ACPI).
    fn shutdown_domain(&self, uuid: &str) -> impl Future<Output = HvResult<()>> + Send;
    /// Stops a domain at once (power cut).
    fn destroy_domain(&self, uuid: &str) -> impl Future<Output = HvResult<()>> + Send;
    /// Replaces the banlieue owner in a domain's metadata (persistent definition, and the
    /// running domain when it runs), nothing else: used to re-mark a domain whose object was
    /// created anew (`clusterctl move`, a restore).
    /// `adopted_from` is recorded with it (the UID of the object the domain is taken from).
    fn set_domain_owner(
        &self,
        uuid: &str,
        owner: &Owner,
        adopted_from: Option<&str>,
    ) -> impl Future<Output = HvResult<()>> + Send;
    /// Removes a (stopped) domain's definition, NVRAM included where supported.
    fn undefine_domain(&self, uuid: &str) -> impl Future<Output = HvResult<()>> + Send;
    /// Addresses of the domain from its networks' DHCP leases.
    fn domain_addresses(&self, uuid: &str) -> impl Future<Output = HvResult<Vec<GuestAddress>>> + Send;
    /// A volume of a pool, if it exists.
    fn volume(&self, pool: &str, name: &str) -> impl Future<Output = HvResult<Option<VolumeInfo>>> + Send;
    /// Creates a volume from XML.
    fn create_volume(&self, pool: &str, xml: &str) -> impl Future<Output = HvResult<VolumeInfo>> + Send;
    /// Replaces a volume's content with `data`.
    fn upload_volume(
        &self,
        pool: &str,
        name: &str,
        data: Vec<u8>,
    ) -> impl Future<Output = HvResult<()>> + Send;
    /// Replaces a volume's content with the `length` bytes of the local file `path` (an image
    /// being imported), streamed.
    fn upload_volume_file(
        &self,
        pool: &str,
        name: &str,
        path: &std::path::Path,
        length: u64,
    ) -> impl Future<Output = HvResult<()>> + Send;
    /// Creates a volume from XML as a copy of the volume `from` of the same pool.
    fn clone_volume(
        &self,
        pool: &str,
        xml: &str,
        from: &str,
    ) -> impl Future<Output = HvResult<VolumeInfo>> + Send;
    /// Deletes a volume (no error when it does not exist).
    fn delete_volume(&self, pool: &str, name: &str) -> impl Future<Output = HvResult<()>> + Send;
    /// cloud-init's report of the guest's boot
    /// ([`banlieue_provider_kit::cloud_init::RESULT_FILE`]), read through the QEMU guest agent;
    /// `Ok(None)` while the agent does not answer or the file does not exist.
    fn cloud_init_result(&self, uuid: &str) -> impl Future<Output = HvResult<Option<String>>> + Send;
}
