//! Response types. Only the fields banlieue needs are typed; all numeric and boolean fields use
//! the tolerant deserialisers of [`crate::de`].

use serde::Deserialize;

use crate::de;

/// `GET /version`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Version {
    /// e.g. `9.1.2`.
    pub version: String,
    /// e.g. `9.1`.
    pub release: String,
    /// Git commit of pve-manager.
    #[serde(default)]
    pub repoid: String,
}

/// An entry of `GET /nodes`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Node {
    /// Node name.
    pub node: String,
    /// `online`, `offline` or `unknown`.
    pub status: String,
    /// CPU utilisation (0–1).
    #[serde(default, deserialize_with = "de::opt_float")]
    pub cpu: Option<f64>,
    /// Number of CPUs.
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub maxcpu: Option<u64>,
    /// Used memory (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub mem: Option<u64>,
    /// Total memory (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub maxmem: Option<u64>,
    /// Uptime (seconds).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub uptime: Option<u64>,
}

/// Memory figures of a node.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
pub struct NodeMemory {
    /// Total (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub total: Option<u64>,
    /// Used (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub used: Option<u64>,
    /// Free (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub free: Option<u64>,
}

/// `GET /nodes/{node}/status`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct NodeStatus {
    /// CPU utilisation (0–1).
    #[serde(default, deserialize_with = "de::opt_float")]
    pub cpu: Option<f64>,
    /// Uptime (seconds).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub uptime: Option<u64>,
    /// Memory.
    #[serde(default)]
    pub memory: NodeMemory,
    /// e.g. `pve-manager/9.1.2/…`.
    #[serde(default)]
    pub pveversion: Option<String>,
    /// Kernel version string.
    #[serde(default)]
    pub kversion: Option<String>,
}

/// An entry of `GET /cluster/resources`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ClusterResource {
    /// e.g. `qemu/100`, `node/pve1`, `storage/pve1/local`.
    pub id: String,
    /// `qemu`, `lxc`, `node`, `storage`, `pool`, `sdn`, …
    #[serde(rename = "type")]
    pub resource_type: String,
    /// Node, for node-bound resources.
    #[serde(default)]
    pub node: Option<String>,
    /// VMID, for guests.
    #[serde(default, deserialize_with = "de::opt_vmid")]
    pub vmid: Option<u32>,
    /// Guest name (absent for a few seconds after creation).
    #[serde(default, deserialize_with = "de::opt_string")]
    pub name: Option<String>,
    /// `running`, `stopped`, `online`, `available`, `unknown`, …
    #[serde(default)]
    pub status: Option<String>,
    /// Whether the guest is a template (0/1).
    #[serde(default, deserialize_with = "de::bool01")]
    pub template: bool,
    /// Pool the guest belongs to.
    #[serde(default)]
    pub pool: Option<String>,
    /// Storage id, for storages.
    #[serde(default)]
    pub storage: Option<String>,
    /// Tags (`;`-separated).
    #[serde(default, deserialize_with = "de::opt_string")]
    pub tags: Option<String>,
    /// Maximum memory (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub maxmem: Option<u64>,
    /// Used memory (bytes), for nodes and guests.
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub mem: Option<u64>,
    /// Whether the storage is shared by the nodes (for storages).
    #[serde(default, deserialize_with = "de::bool01")]
    pub shared: bool,
    /// Maximum disk (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub maxdisk: Option<u64>,
    /// CPUs.
    #[serde(default, deserialize_with = "de::opt_float")]
    pub maxcpu: Option<f64>,
}

/// Filter for `GET /cluster/resources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceType {
    /// Guests (`qemu` and `lxc`).
    Vm,
    /// Storages.
    Storage,
    /// Nodes.
    Node,
    /// SDN zones.
    Sdn,
}

impl ResourceType {
    /// The query value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vm => "vm",
            Self::Storage => "storage",
            Self::Node => "node",
            Self::Sdn => "sdn",
        }
    }
}

/// An entry of `GET /nodes/{node}/qemu`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct VmSummary {
    /// VMID.
    #[serde(deserialize_with = "de::vmid")]
    pub vmid: u32,
    /// Name.
    #[serde(default, deserialize_with = "de::opt_string")]
    pub name: Option<String>,
    /// `running` or `stopped`.
    pub status: String,
    /// Present (1) only on templates.
    #[serde(default, deserialize_with = "de::bool01")]
    pub template: bool,
    /// Tags (`;`-separated).
    #[serde(default, deserialize_with = "de::opt_string")]
    pub tags: Option<String>,
    /// Config lock, e.g. `clone`.
    #[serde(default)]
    pub lock: Option<String>,
    /// Maximum memory (bytes).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub maxmem: Option<u64>,
    /// CPUs.
    #[serde(default, deserialize_with = "de::opt_float")]
    pub cpus: Option<f64>,
    /// Uptime (seconds).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub uptime: Option<u64>,
}

/// `GET /nodes/{node}/qemu/{vmid}/status/current`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct VmStatus {
    /// VMID.
    #[serde(deserialize_with = "de::vmid")]
    pub vmid: u32,
    /// `running` or `stopped`.
    pub status: String,
    /// QMP status (`running`, `paused`, `prelaunch`, …).
    #[serde(default)]
    pub qmpstatus: Option<String>,
    /// Name.
    #[serde(default, deserialize_with = "de::opt_string")]
    pub name: Option<String>,
    /// Present (1) only on templates.
    #[serde(default, deserialize_with = "de::bool01")]
    pub template: bool,
    /// Config lock.
    #[serde(default)]
    pub lock: Option<String>,
    /// Guest agent enabled in config.
    #[serde(default, deserialize_with = "de::bool01")]
    pub agent: bool,
    /// Uptime (seconds).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub uptime: Option<u64>,
    /// Tags (`;`-separated).
    #[serde(default, deserialize_with = "de::opt_string")]
    pub tags: Option<String>,
    /// High Availability: whether the VM is an HA resource.
    #[serde(default)]
    pub ha: VmHaStatus,
}

/// The `ha` object of a VM's status.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct VmHaStatus {
    /// 1 when the VM is an HA resource.
    #[serde(default, deserialize_with = "de::bool01")]
    pub managed: bool,
}

impl VmStatus {
    /// `status == "running"`.
    pub fn is_running(&self) -> bool {
        self.status == "running"
    }
}

/// An entry of `GET /nodes/{node}/storage`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct StorageInfo {
    /// Storage id.
    pub storage: String,
    /// Storage type (`dir`, `lvmthin`, `nfs`, …).
    #[serde(rename = "type")]
    pub storage_type: String,
    /// Allowed content types (comma-separated).
    #[serde(default)]
    pub content: String,
    /// Accessible.
    #[serde(default, deserialize_with = "de::bool01")]
    pub active: bool,
    /// Enabled.
    #[serde(default, deserialize_with = "de::bool01")]
    pub enabled: bool,
    /// Shared between nodes.
    #[serde(default, deserialize_with = "de::bool01")]
    pub shared: bool,
    /// Total bytes.
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub total: Option<u64>,
    /// Used bytes.
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub used: Option<u64>,
    /// Available bytes.
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub avail: Option<u64>,
}

impl StorageInfo {
    /// True if the storage accepts `content` (e.g. `iso`, `images`).
    pub fn allows(&self, content: &str) -> bool {
        self.content.split(',').any(|c| c.trim() == content)
    }
}

/// An entry of `GET /nodes/{node}/storage/{storage}/content`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct StorageContent {
    /// Volume id, e.g. `local:iso/seed.iso`.
    pub volid: String,
    /// Content type (`iso`, `images`, …).
    pub content: String,
    /// Format (`iso`, `raw`, `qcow2`, …).
    #[serde(default)]
    pub format: String,
    /// Size in bytes.
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub size: Option<u64>,
    /// Owner VMID.
    #[serde(default, deserialize_with = "de::opt_vmid")]
    pub vmid: Option<u32>,
    /// Creation time (UNIX seconds).
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub ctime: Option<u64>,
}

/// Content types that `POST /nodes/{node}/storage/{storage}/upload` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadContent {
    /// ISO images (e.g. a NoCloud seed).
    Iso,
    /// Container templates.
    Vztmpl,
    /// Import images.
    Import,
}

impl UploadContent {
    /// The `content` field value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Iso => "iso",
            Self::Vztmpl => "vztmpl",
            Self::Import => "import",
        }
    }
}

/// A member of a pool.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct PoolMember {
    /// e.g. `qemu/100`.
    pub id: String,
    /// `qemu`, `lxc`, `storage`.
    #[serde(rename = "type")]
    pub member_type: String,
    /// VMID for guests.
    #[serde(default, deserialize_with = "de::opt_vmid")]
    pub vmid: Option<u32>,
    /// Node.
    #[serde(default)]
    pub node: Option<String>,
}

/// An entry of `GET /pools` (with `members` when a `poolid` filter was given).
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Pool {
    /// Pool id.
    pub poolid: String,
    /// Comment.
    #[serde(default)]
    pub comment: Option<String>,
    /// Members.
    #[serde(default)]
    pub members: Vec<PoolMember>,
}

/// One address of a guest interface.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AgentIpAddress {
    /// The address.
    #[serde(rename = "ip-address")]
    pub ip_address: String,
    /// `ipv4` or `ipv6`.
    #[serde(rename = "ip-address-type")]
    pub ip_address_type: String,
    /// Prefix length.
    #[serde(default, deserialize_with = "de::opt_uint")]
    pub prefix: Option<u64>,
}

/// One interface reported by the guest agent.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct AgentInterface {
    /// Interface name (`lo`, `eth0`, `ens18`).
    pub name: String,
    /// MAC address.
    #[serde(rename = "hardware-address", default)]
    pub hardware_address: Option<String>,
    /// Addresses.
    #[serde(rename = "ip-addresses", default)]
    pub ip_addresses: Vec<AgentIpAddress>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct AgentResult<T> {
    pub(crate) result: T,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_list_tolerates_perl_types() {
        let list: Vec<VmSummary> = serde_json::from_str(
            r#"[{"vmid":"100","name":"web","status":"running","maxmem":"2147483648","cpus":2},
                {"vmid":9000,"name":"tpl","status":"stopped","template":1,"tags":"template;ubuntu"}]"#,
        )
        .unwrap();
        assert_eq!(
            (list[0].vmid, list[0].template, list[0].maxmem),
            (100, false, Some(2 << 30))
        );
        assert!(list[1].template);
    }

    #[test]
    fn cluster_resources_template_flag() {
        let list: Vec<ClusterResource> = serde_json::from_str(
            r#"[{"id":"qemu/101","type":"qemu","node":"pve1","vmid":101,"status":"unknown","template":0},
                {"id":"node/pve1","type":"node","node":"pve1","status":"online"}]"#,
        )
        .unwrap();
        assert_eq!(list[0].vmid, Some(101));
        assert!(!list[0].template);
        assert_eq!(list[0].name, None);
        assert_eq!(list[1].resource_type, "node");
    }

    #[test]
    fn storage_content_types() {
        let s: StorageInfo = serde_json::from_str(
            r#"{"storage":"local","type":"dir","content":"iso,vztmpl,backup","active":1,"enabled":"1","shared":0}"#,
        )
        .unwrap();
        assert!(s.allows("iso") && !s.allows("images"));
        assert!(s.active && s.enabled && !s.shared);
    }

    #[test]
    fn agent_interfaces() {
        let r: AgentResult<Vec<AgentInterface>> = serde_json::from_str(
            r#"{"result":[{"name":"eth0","hardware-address":"bc:24:11:00:00:01",
                "ip-addresses":[{"ip-address":"10.0.0.5","ip-address-type":"ipv4","prefix":24}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.result[0].ip_addresses[0].ip_address, "10.0.0.5");
        assert_eq!(r.result[0].ip_addresses[0].prefix, Some(24));
    }
}
