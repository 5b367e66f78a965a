//! Simulator configuration.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

/// A storage present on every node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageSpec {
    /// Storage id (`local`, `local-lvm`).
    pub id: String,
    /// Plugin type (`dir`, `lvmthin`, `nfs`, ...).
    pub kind: String,
    /// Allowed content types (`iso`, `images`, ...).
    pub content: Vec<String>,
    /// Whether the storage is shared between nodes (cross-node clones need shared storage).
    pub shared: bool,
    /// Total size in bytes.
    pub total: u64,
}

impl StorageSpec {
    /// A storage with the given id, type and content types.
    pub fn new(id: &str, kind: &str, content: &[&str]) -> Self {
        Self {
            id: id.to_owned(),
            kind: kind.to_owned(),
            content: content.iter().map(|c| (*c).to_owned()).collect(),
            shared: false,
            total: 100 << 30,
        }
    }
}

/// A VM (usually a template) created at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSpec {
    /// VMID.
    pub vmid: u32,
    /// Node it lives on.
    pub node: String,
    /// Config keys and values as PVE stores them (strings), including `name` and `template`.
    pub config: BTreeMap<String, String>,
    /// Pool membership.
    pub pool: Option<String>,
}

impl TemplateSpec {
    /// The default template: vmid 9000 `ubuntu-2404-template` on `node`.
    pub fn ubuntu(node: &str) -> Self {
        let config = [
            ("name", "ubuntu-2404-template"),
            ("template", "1"),
            ("scsi0", "local-lvm:base-9000-disk-0,size=8G"),
            ("scsihw", "virtio-scsi-single"),
            ("net0", "virtio=BC:24:11:00:90:00,bridge=vmbr0"),
            ("ide2", "local-lvm:vm-9000-cloudinit,media=cdrom"),
            ("agent", "1"),
            ("tags", "template;ubuntu"),
            ("memory", "2048"),
            ("cores", "2"),
            ("sockets", "1"),
            ("ostype", "l26"),
            ("boot", "order=scsi0"),
            ("smbios1", "uuid=6c1f3e7a-0d2b-4a59-9c1e-5f0c2b9a9000"),
            ("vmgenid", "0c2a2b4e-6c55-4f0e-8d7a-2f1b9a909000"),
        ];
        Self {
            vmid: 9000,
            node: node.to_owned(),
            config: config
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            pool: None,
        }
    }
}

/// Everything the simulator can be configured with. `Default` is realistic (tasks take time, auth
/// failures are delayed 3 s); [`SimConfig::fast`] makes everything immediate for tests.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Cluster node names, all online.
    pub nodes: Vec<String>,
    /// Seed for faults, MACs, uuids, tickets and the token secret.
    pub seed: u64,
    /// Duration of tasks without an entry in `task_durations`.
    pub task_duration: Duration,
    /// Duration per task type (`qmclone`, `qmstart`, `qmstop`, `qmshutdown`, `qmreboot`, `qmdestroy`,
    /// `qmconfig`, `resize`, `imgcopy`, `imgdel`).
    pub task_durations: BTreeMap<String, Duration>,
    /// Time after a VM's start until its guest agent answers.
    pub agent_delay: Duration,
    /// Delay before a 401 answer (PVE waits ~3 s).
    pub auth_failure_delay: Duration,
    /// Ticket lifetime (2 h).
    pub ticket_lifetime: Duration,
    /// How long a new VM shows `status: unknown` without a name in `/cluster/resources`.
    pub resources_lag: Duration,
    /// Storages on every node.
    pub storages: Vec<StorageSpec>,
    /// Pools created at start-up.
    pub pools: Vec<String>,
    /// VMs/templates created at start-up.
    pub templates: Vec<TemplateSpec>,
    /// First address handed to guest agents of VMs without a static `ipconfig0` ip.
    pub address_pool_start: Ipv4Addr,
    /// Prefix length reported for pool addresses.
    pub address_pool_prefix: u8,
    /// Guest agents also report the interfaces a Kubernetes node has beside its NICs, as real
    /// ones do: `docker0` (172.17.0.1), `cni0` (10.244.0.1), `flannel.1` (10.244.0.0) and a
    /// Calico `cali…` veth.
    pub container_interfaces: bool,
    /// The guests are real (a test harness boots one per started VM): a running VM's guest agent
    /// answers only once [`crate::SimHandle::report_guest_interfaces`] said what the guest has,
    /// and reports exactly that; no address is invented for it.
    pub external_guests: bool,
    /// Where to load the API schema from; `None` means [`crate::schema::default_schema_path`].
    pub schema_path: Option<PathBuf>,
    /// Port to bind on [`SimConfig::bind_address`] (0 = any free port).
    pub port: u16,
    /// Address to listen on: loopback by default; a test whose clients run elsewhere (Pods on
    /// a real node) gives the host's address they reach. The certificate names it too.
    pub bind_address: Ipv4Addr,
    /// The user of the ticket login and the token.
    pub username: String,
    /// The password for `POST /access/ticket`; derived from the seed when `None`.
    pub password: Option<String>,
    /// Token name, the part after `!`.
    pub token_name: String,
    /// Token secret (a uuid); derived from the seed when `None`.
    pub token_secret: Option<String>,
    /// Request body limit (PVE: 512 KiB).
    pub body_limit: usize,
    /// Body limit for multipart uploads.
    pub upload_limit: usize,
    /// Finished tasks kept for status/log queries (oldest are forgotten).
    pub max_finished_tasks: usize,
    /// Check every successful response against the schema's declared `returns`; mismatches are
    /// logged and collected ([`crate::SimHandle::returns_violations`]).
    pub check_returns: bool,
    /// PCI resource mappings (`/cluster/mapping/pci`) present on every node: a VM whose
    /// `hostpciN` names another mapping fails to start, as on PVE.
    pub pci_mappings: Vec<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        let durations = [
            ("qmclone", 3000),
            ("qmstart", 1000),
            ("qmstop", 500),
            ("qmshutdown", 2000),
            ("qmreboot", 2000),
            ("qmdestroy", 1000),
            ("qmconfig", 0),
            ("resize", 500),
            ("imgcopy", 500),
            ("imgdel", 0),
        ];
        Self {
            nodes: vec!["pve1".into(), "pve2".into(), "pve3".into()],
            seed: 0x5eed,
            task_duration: Duration::from_secs(1),
            task_durations: durations
                .iter()
                .map(|(k, ms)| ((*k).to_owned(), Duration::from_millis(*ms)))
                .collect(),
            agent_delay: Duration::from_secs(5),
            auth_failure_delay: Duration::from_secs(3),
            ticket_lifetime: Duration::from_secs(2 * 3600),
            resources_lag: Duration::from_secs(10),
            storages: vec![
                StorageSpec::new("local", "dir", &["iso", "vztmpl", "backup", "snippets", "import"]),
                StorageSpec::new("local-lvm", "lvmthin", &["images", "rootdir"]),
            ],
            pools: vec!["banlieue".into()],
            templates: vec![TemplateSpec::ubuntu("pve1")],
            address_pool_start: Ipv4Addr::new(10, 99, 0, 10),
            address_pool_prefix: 16,
            container_interfaces: false,
            external_guests: false,
            schema_path: None,
            port: 0,
            bind_address: Ipv4Addr::LOCALHOST,
            username: "root@pam".into(),
            password: None,
            token_name: "banlieue".into(),
            token_secret: None,
            body_limit: 512 * 1024,
            upload_limit: 64 * 1024 * 1024,
            max_finished_tasks: 10_000,
            check_returns: true,
            pci_mappings: Vec::new(),
        }
    }
}

impl SimConfig {
    /// Zero-delay tasks, no agent delay, no auth-failure delay, no resource lag.
    pub fn fast() -> Self {
        let mut cfg = Self {
            task_duration: Duration::ZERO,
            agent_delay: Duration::ZERO,
            auth_failure_delay: Duration::ZERO,
            resources_lag: Duration::ZERO,
            ..Self::default()
        };
        cfg.task_durations.clear();
        cfg
    }

    /// Checks that nodes, storages, pools and templates fit together.
    pub fn validate(&self) -> Result<(), String> {
        if self.nodes.is_empty() {
            return Err("at least one node is required".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.nodes {
            if !seen.insert(n) {
                return Err(format!("node '{n}' is listed twice"));
            }
        }
        let mut vmids = std::collections::BTreeSet::new();
        for t in &self.templates {
            if !self.nodes.contains(&t.node) {
                return Err(format!("template {} is on unknown node '{}'", t.vmid, t.node));
            }
            if !(100..=999_999_999).contains(&t.vmid) || !vmids.insert(t.vmid) {
                return Err(format!("template vmid {} is out of range or duplicated", t.vmid));
            }
            if let Some(p) = &t.pool
                && !self.pools.contains(p)
            {
                return Err(format!("template {} is in unknown pool '{p}'", t.vmid));
            }
        }
        if self.address_pool_prefix > 32 {
            return Err(format!(
                "address pool prefix /{} is not an IPv4 prefix",
                self.address_pool_prefix
            ));
        }
        Ok(())
    }

    /// How long a task of type `kind` runs.
    pub fn duration_for(&self, kind: &str) -> Duration {
        self.task_durations
            .get(kind)
            .copied()
            .unwrap_or(self.task_duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_catches_inconsistent_configs() {
        assert_eq!(SimConfig::default().validate(), Ok(()));
        let cfg = SimConfig {
            nodes: vec!["a".into()],
            ..SimConfig::fast()
        };
        assert_eq!(
            cfg.validate(),
            Err("template 9000 is on unknown node 'pve1'".into())
        );
        let cfg = SimConfig {
            nodes: vec![],
            ..SimConfig::fast()
        };
        assert!(cfg.validate().is_err());
        let mut cfg = SimConfig::fast();
        cfg.templates.push(TemplateSpec::ubuntu("pve2"));
        assert!(cfg.validate().unwrap_err().contains("duplicated"));
    }

    #[test]
    fn fast_has_no_delays() {
        let cfg = SimConfig::fast();
        assert_eq!(cfg.duration_for("qmclone"), Duration::ZERO);
        assert_eq!(cfg.agent_delay, Duration::ZERO);
        assert_eq!(
            SimConfig::default().duration_for("qmclone"),
            Duration::from_secs(3)
        );
        assert_eq!(SimConfig::default().duration_for("other"), Duration::from_secs(1));
    }
}
