//! The small hypervisor-access trait the machine and cluster reconcilers need (in the spirit of
//! CAPV's `pkg/services/interfaces.go`), and its implementation by the real
//! [`banlieue_pve_client::Client`].
//!
//! Every method is one Proxmox VE API call (never a wait loop): long operations return the task's
//! [`Upid`], which the reconciler records in status and polls with [`Hypervisor::task`] on requeue.
//! Errors are the client's [`PveError`], so their [`banlieue_pve_client::ErrorClass`] drives the
//! reconciler's decisions (adopt, back off, report a permanent failure).

use std::future::Future;
use std::net::IpAddr;

use banlieue_provider_kit::cloud_init;
use banlieue_pve_client::{
    Client, CloneRequest, ClusterResource, ConfigUpdate, DeleteVmOptions, DownloadUrlRequest, ErrorClass,
    HaResource, HaResourceSettings, HaRule, PendingConfig, ResourceType, SizeChange, TaskOutcome, Upid,
    UploadContent, VmConfig, vm_sid,
};

/// Errors of the hypervisor calls: the Proxmox client's error, classified by
/// [`PveError::class`].
pub type PveError = banlieue_pve_client::Error;

/// A Proxmox VE node and its load, for placement.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLoad {
    /// Node name.
    pub name: String,
    /// `status == online`.
    pub online: bool,
    /// Free memory in bytes (`maxmem - mem`), `0` when unknown.
    pub free_memory: u64,
    /// CPUs (`maxcpu`), when listed.
    pub cpus: Option<u32>,
    /// Memory in MiB (`maxmem`), when listed.
    pub memory_mib: Option<u64>,
}

/// The cluster in one listing (`GET /cluster/resources`): nodes with their load, guests, and
/// each node's storages that are not shared.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inventory {
    /// The nodes.
    pub nodes: Vec<NodeLoad>,
    /// Every QEMU guest, templates included.
    pub guests: Vec<Guest>,
    /// Per node, its storages that are not shared with the other nodes.
    pub local_storages: std::collections::BTreeMap<String, Vec<String>>,
}

/// A guest (VM or template) as listed cluster-wide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guest {
    /// The node holding the guest.
    pub node: String,
    /// VMID.
    pub vmid: u32,
    /// Name (absent for a few seconds after creation on real PVE).
    pub name: Option<String>,
    /// Whether the guest is a template.
    pub template: bool,
    /// Normalised tags.
    pub tags: Vec<String>,
    /// Configured memory in bytes (`maxmem`), `0` when not listed.
    pub memory: u64,
    /// `status == running`.
    pub running: bool,
    /// Proxmox has the guest's statistics (pvestatd reported it), which is where the listing
    /// takes `name`, `template`, `status` and `maxmem` from. Not so for about 10 s after a VM is
    /// created or made a template, a node boots or pvestatd restarts, nor while its node is
    /// offline: listed with status `unknown`, without name and not as a template.
    pub reported: bool,
}

/// What the reconcilers need from a Proxmox VE cluster. Implemented by
/// [`banlieue_pve_client::Client`]; tests may substitute a double.
pub trait Hypervisor: Clone + Send + Sync + 'static {
    /// Which Proxmox VE cluster this is (its API address), for what is remembered per cluster.
    fn endpoint(&self) -> String;
    /// Nodes, guests and local storages in one call.
    fn inventory(&self) -> impl Future<Output = Result<Inventory, PveError>> + Send;
    /// `GET /version`: the release string (a cheap connectivity and authentication check).
    fn version(&self) -> impl Future<Output = Result<String, PveError>> + Send;
    /// Nodes with their load.
    fn nodes(&self) -> impl Future<Output = Result<Vec<NodeLoad>, PveError>> + Send;
    /// Every QEMU guest of the cluster (templates included).
    fn guests(&self) -> impl Future<Output = Result<Vec<Guest>, PveError>> + Send;
    /// The next free VMID PVE proposes.
    fn next_vmid(&self) -> impl Future<Output = Result<u32, PveError>> + Send;
    /// Whether `vmid` is unused.
    fn vmid_is_free(&self, vmid: u32) -> impl Future<Output = Result<bool, PveError>> + Send;
    /// The VM's current config; `Ok(None)` when the VM does not exist on that node.
    fn vm_config(
        &self,
        node: &str,
        vmid: u32,
    ) -> impl Future<Output = Result<Option<VmConfig>, PveError>> + Send;
    /// `GET …/pending`: the config with pending changes applied and the keys Proxmox keeps
    /// pending until the VM restarts; `Ok(None)` when the VM does not exist on that node.
    fn vm_pending(
        &self,
        node: &str,
        vmid: u32,
    ) -> impl Future<Output = Result<Option<PendingConfig>, PveError>> + Send;
    /// Whether the VM runs; `Ok(None)` when it does not exist on that node (its
    /// [`Hypervisor::vm_run_state`]).
    fn vm_running(
        &self,
        node: &str,
        vmid: u32,
    ) -> impl Future<Output = Result<Option<bool>, PveError>> + Send {
        async move { Ok(self.vm_run_state(node, vmid).await?.map(|s| s.running)) }
    }
    /// Starts a clone of `source` (on `node`).
    fn clone_vm(
        &self,
        node: &str,
        source: u32,
        request: &CloneRequest,
    ) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// The state of a task: [`TaskOutcome::Running`], success, or [`TaskOutcome::Failed`].
    fn task(&self, upid: &Upid) -> impl Future<Output = Result<TaskOutcome, PveError>> + Send;
    /// Applies a config change (asynchronous POST); `None` when PVE finished it at once.
    fn update_config(
        &self,
        node: &str,
        vmid: u32,
        update: &ConfigUpdate,
    ) -> impl Future<Output = Result<Option<Upid>, PveError>> + Send;
    /// Applies a config change at once (synchronous PUT): for changes that allocate nothing
    /// (PVE advises the asynchronous POST for new disks and hotplug).
    fn set_config(
        &self,
        node: &str,
        vmid: u32,
        update: &ConfigUpdate,
    ) -> impl Future<Output = Result<(), PveError>> + Send;
    /// Grows a disk; `None` when PVE finished at once.
    fn resize_disk(
        &self,
        node: &str,
        vmid: u32,
        disk: &str,
        size: SizeChange,
    ) -> impl Future<Output = Result<Option<Upid>, PveError>> + Send;
    /// Uploads an ISO image to `storage` on `node` as `file_name`.
    fn upload_iso(
        &self,
        node: &str,
        storage: &str,
        file_name: &str,
        data: Vec<u8>,
    ) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Whether `storage` on `node` holds the volume `volid` (`storage:import/name.qcow2`).
    fn has_volume(
        &self,
        node: &str,
        storage: &str,
        volid: &str,
    ) -> impl Future<Output = Result<bool, PveError>> + Send;
    /// Has `storage` on `node` download a file (`download-url`).
    fn download_url(
        &self,
        node: &str,
        storage: &str,
        request: &DownloadUrlRequest,
    ) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Creates VM `vmid` on `node` with `config` (`POST /nodes/{node}/qemu`).
    fn create_vm(
        &self,
        node: &str,
        vmid: u32,
        config: &ConfigUpdate,
    ) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Makes the stopped VM a template.
    fn make_template(&self, node: &str, vmid: u32) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Deletes a volume (`storage:iso/name.iso`); `None` when PVE finished at once.
    fn delete_volume(
        &self,
        node: &str,
        volid: &str,
    ) -> impl Future<Output = Result<Option<Upid>, PveError>> + Send;
    /// Starts the VM.
    fn start_vm(&self, node: &str, vmid: u32) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Stops the VM hard.
    fn stop_vm(&self, node: &str, vmid: u32) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Shuts the VM down (ACPI / guest agent); PVE stops it hard after `timeout_secs`.
    fn shutdown_vm(
        &self,
        node: &str,
        vmid: u32,
        timeout_secs: u32,
    ) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Deletes a stopped VM with `purge` and its unreferenced disks.
    fn delete_vm(&self, node: &str, vmid: u32) -> impl Future<Output = Result<Upid, PveError>> + Send;
    /// Addresses reported by the guest agent; `Ok(None)` while the agent does not answer.
    fn guest_addresses(
        &self,
        node: &str,
        vmid: u32,
    ) -> impl Future<Output = Result<Option<Vec<IpAddr>>, PveError>> + Send;
    /// cloud-init's report of the guest's boot ([`cloud_init::RESULT_FILE`], read through the
    /// guest agent); `Ok(None)` while the file does not exist or the agent does not answer.
    fn cloud_init_result(
        &self,
        node: &str,
        vmid: u32,
    ) -> impl Future<Output = Result<Option<String>, PveError>> + Send;
    /// Whether the VM runs and whether it is an HA resource; `Ok(None)` when it does not exist
    /// on that node.
    fn vm_run_state(
        &self,
        node: &str,
        vmid: u32,
    ) -> impl Future<Output = Result<Option<RunState>, PveError>> + Send;
    /// The VM's HA resource; `Ok(None)` when it is not one.
    fn ha_resource(&self, vmid: u32) -> impl Future<Output = Result<Option<HaResource>, PveError>> + Send;
    /// Makes the VM an HA resource.
    fn create_ha_resource(
        &self,
        vmid: u32,
        settings: &HaResourceSettings,
    ) -> impl Future<Output = Result<(), PveError>> + Send;
    /// Changes the VM's HA resource.
    fn update_ha_resource(
        &self,
        vmid: u32,
        settings: &HaResourceSettings,
    ) -> impl Future<Output = Result<(), PveError>> + Send;
    /// Removes the VM from HA (and from its rules).
    fn delete_ha_resource(&self, vmid: u32) -> impl Future<Output = Result<(), PveError>> + Send;
    /// An HA rule; `Ok(None)` when there is none by that name.
    fn ha_rule(&self, rule: &str) -> impl Future<Output = Result<Option<HaRule>, PveError>> + Send;
    /// Sets the resources an HA rule applies to (refused if the rules changed since `rule` was
    /// read).
    fn set_ha_rule_resources(
        &self,
        rule: &HaRule,
        resources: &[String],
    ) -> impl Future<Output = Result<(), PveError>> + Send;
}

/// What `status/current` says of a VM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunState {
    /// It runs.
    pub running: bool,
    /// It is an HA resource.
    pub ha_managed: bool,
}

fn none_if_not_found<T>(res: Result<T, PveError>) -> Result<Option<T>, PveError> {
    match res {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.class() == ErrorClass::NotFound => Ok(None),
        // PVE answers 500 "Configuration file 'nodes/x/qemu-server/N.conf' does not exist",
        // which the client already classifies as NotFound; anything else is a real error.
        Err(e) => Err(e),
    }
}

/// Interfaces a Kubernetes node has beside its own NICs (container bridges, CNI overlays and
/// veths, kube-proxy's IPVS dummy): their addresses are not the machine's.
pub fn is_container_interface(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "docker",
        "br-",
        "cni",
        "flannel",
        "cali",
        "veth",
        "vxlan",
        "tunl",
        "cilium",
        "lxc",
        "weave",
        "kube-ipvs",
        "kube-bridge",
        "nodelocaldns",
        "genev",
        "virbr",
        "podman",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A node as `/nodes` or `/cluster/resources` lists it.
fn node_load(
    node: String,
    status: &str,
    maxmem: Option<u64>,
    mem: Option<u64>,
    maxcpu: Option<f64>,
) -> NodeLoad {
    NodeLoad {
        online: status == "online",
        free_memory: maxmem.unwrap_or(0).saturating_sub(mem.unwrap_or(0)),
        // Whole CPUs, as PVE counts them.
        cpus: maxcpu.filter(|c| c.is_finite() && *c >= 0.0).map(|c| c as u32),
        memory_mib: maxmem.map(|m| m >> 20),
        name: node,
    }
}

/// A QEMU guest of `/cluster/resources`.
fn guest(r: ClusterResource) -> Option<Guest> {
    (r.resource_type == "qemu").then_some(())?;
    Some(Guest {
        node: r.node?,
        vmid: r.vmid?,
        name: r.name,
        template: r.template,
        tags: r
            .tags
            .as_deref()
            .and_then(|t| banlieue_pve_client::config::normalize_tags(t).ok())
            .unwrap_or_default(),
        memory: r.maxmem.unwrap_or(0),
        running: r.status.as_deref() == Some("running"),
        reported: r.status.as_deref().is_some_and(|s| s != "unknown"),
    })
}

impl Hypervisor for Client {
    fn endpoint(&self) -> String {
        self.base_url().to_owned()
    }

    async fn inventory(&self) -> Result<Inventory, PveError> {
        let mut inventory = Inventory::default();
        for r in self.cluster_resources(None).await? {
            match r.resource_type.as_str() {
                "node" => {
                    let Some(node) = r.node else { continue };
                    let status = r.status.as_deref().unwrap_or("unknown");
                    inventory
                        .nodes
                        .push(node_load(node, status, r.maxmem, r.mem, r.maxcpu));
                }
                "storage" if !r.shared => {
                    if let (Some(node), Some(storage)) = (r.node, r.storage) {
                        inventory.local_storages.entry(node).or_default().push(storage);
                    }
                }
                "qemu" => inventory.guests.extend(guest(r)),
                _ => {}
            }
        }
        Ok(inventory)
    }

    async fn version(&self) -> Result<String, PveError> {
        Ok(Client::version(self).await?.version)
    }

    async fn nodes(&self) -> Result<Vec<NodeLoad>, PveError> {
        Ok(Client::nodes(self)
            .await?
            .into_iter()
            .map(|n| node_load(n.node, &n.status, n.maxmem, n.mem, n.maxcpu.map(|c| c as f64)))
            .collect())
    }

    async fn guests(&self) -> Result<Vec<Guest>, PveError> {
        let resources = self.cluster_resources(Some(ResourceType::Vm)).await?;
        Ok(resources.into_iter().filter_map(guest).collect())
    }

    async fn next_vmid(&self) -> Result<u32, PveError> {
        self.next_id().await
    }

    async fn vmid_is_free(&self, vmid: u32) -> Result<bool, PveError> {
        self.is_vmid_free(vmid).await
    }

    async fn vm_config(&self, node: &str, vmid: u32) -> Result<Option<VmConfig>, PveError> {
        none_if_not_found(Client::vm_config(self, node, vmid).await)
    }

    async fn vm_pending(&self, node: &str, vmid: u32) -> Result<Option<PendingConfig>, PveError> {
        none_if_not_found(Client::vm_pending(self, node, vmid).await)
    }

    async fn clone_vm(&self, node: &str, source: u32, request: &CloneRequest) -> Result<Upid, PveError> {
        Client::clone_vm(self, node, source, request).await
    }

    async fn task(&self, upid: &Upid) -> Result<TaskOutcome, PveError> {
        Ok(self.task_status(upid).await?.outcome())
    }

    async fn update_config(
        &self,
        node: &str,
        vmid: u32,
        update: &ConfigUpdate,
    ) -> Result<Option<Upid>, PveError> {
        self.update_vm_config_async(node, vmid, update).await
    }

    async fn set_config(&self, node: &str, vmid: u32, update: &ConfigUpdate) -> Result<(), PveError> {
        self.update_vm_config(node, vmid, update).await
    }

    async fn resize_disk(
        &self,
        node: &str,
        vmid: u32,
        disk: &str,
        size: SizeChange,
    ) -> Result<Option<Upid>, PveError> {
        Client::resize_disk(self, node, vmid, disk, size).await
    }

    async fn upload_iso(
        &self,
        node: &str,
        storage: &str,
        file_name: &str,
        data: Vec<u8>,
    ) -> Result<Upid, PveError> {
        self.upload(node, storage, UploadContent::Iso, file_name, data)
            .await
    }

    async fn has_volume(&self, node: &str, storage: &str, volid: &str) -> Result<bool, PveError> {
        let content = self.storage_content(node, storage, None).await?;
        Ok(content.iter().any(|v| v.volid == volid))
    }

    async fn download_url(
        &self,
        node: &str,
        storage: &str,
        request: &DownloadUrlRequest,
    ) -> Result<Upid, PveError> {
        Client::download_url(self, node, storage, request).await
    }

    async fn create_vm(&self, node: &str, vmid: u32, config: &ConfigUpdate) -> Result<Upid, PveError> {
        Client::create_vm(self, node, vmid, config).await
    }

    async fn make_template(&self, node: &str, vmid: u32) -> Result<Upid, PveError> {
        Client::make_template(self, node, vmid).await
    }

    async fn delete_volume(&self, node: &str, volid: &str) -> Result<Option<Upid>, PveError> {
        let storage = volid.split_once(':').map_or(volid, |(s, _)| s);
        Client::delete_volume(self, node, storage, volid).await
    }

    async fn start_vm(&self, node: &str, vmid: u32) -> Result<Upid, PveError> {
        Client::start_vm(self, node, vmid).await
    }

    async fn stop_vm(&self, node: &str, vmid: u32) -> Result<Upid, PveError> {
        Client::stop_vm(self, node, vmid).await
    }

    async fn shutdown_vm(&self, node: &str, vmid: u32, timeout_secs: u32) -> Result<Upid, PveError> {
        Client::shutdown_vm(self, node, vmid, Some(timeout_secs), true).await
    }

    async fn delete_vm(&self, node: &str, vmid: u32) -> Result<Upid, PveError> {
        let opts = DeleteVmOptions {
            purge: true,
            destroy_unreferenced_disks: true,
        };
        Client::delete_vm(self, node, vmid, opts).await
    }

    async fn guest_addresses(&self, node: &str, vmid: u32) -> Result<Option<Vec<IpAddr>>, PveError> {
        match self.agent_network_interfaces(node, vmid).await {
            Ok(ifaces) => Ok(Some(
                ifaces
                    .iter()
                    .filter(|i| !is_container_interface(&i.name))
                    .flat_map(|i| i.ip_addresses.iter())
                    .filter_map(|a| a.ip_address.parse().ok())
                    .collect(),
            )),
            Err(e) if e.class() == ErrorClass::AgentNotRunning => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn cloud_init_result(&self, node: &str, vmid: u32) -> Result<Option<String>, PveError> {
        match self.agent_file_read(node, vmid, cloud_init::RESULT_FILE).await {
            Ok(content) => Ok(Some(content)),
            Err(e) if e.class() == ErrorClass::AgentNotRunning => Ok(None),
            // The agent's answer for a file that is not there (qemu-ga: "Failed to open file").
            Err(e)
                if e.message()
                    .is_some_and(|m| m.contains("No such file or directory")) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    async fn vm_run_state(&self, node: &str, vmid: u32) -> Result<Option<RunState>, PveError> {
        let status = none_if_not_found(self.vm_status(node, vmid).await)?;
        Ok(status.map(|s| RunState {
            running: s.is_running(),
            ha_managed: s.ha.managed,
        }))
    }

    async fn ha_resource(&self, vmid: u32) -> Result<Option<HaResource>, PveError> {
        none_if_not_found(Client::ha_resource(self, &vm_sid(vmid)).await)
    }

    async fn create_ha_resource(&self, vmid: u32, settings: &HaResourceSettings) -> Result<(), PveError> {
        Client::create_ha_resource(self, &vm_sid(vmid), settings).await
    }

    async fn update_ha_resource(&self, vmid: u32, settings: &HaResourceSettings) -> Result<(), PveError> {
        Client::update_ha_resource(self, &vm_sid(vmid), settings).await
    }

    async fn delete_ha_resource(&self, vmid: u32) -> Result<(), PveError> {
        Client::delete_ha_resource(self, &vm_sid(vmid)).await
    }

    async fn ha_rule(&self, rule: &str) -> Result<Option<HaRule>, PveError> {
        none_if_not_found(Client::ha_rule(self, rule).await)
    }

    async fn set_ha_rule_resources(&self, rule: &HaRule, resources: &[String]) -> Result<(), PveError> {
        Client::set_ha_rule_resources(self, rule, resources).await
    }
}
