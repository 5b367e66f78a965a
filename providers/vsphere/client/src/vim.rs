//! Typed vim25 calls: the ~15 a provider needs (inventory lookup, clone, reconfigure, power,
//! destroy, tasks and properties through the PropertyCollector, guest IPs, lookup by UUID and
//! by an extraConfig marker).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use crate::client::Client;
use crate::device::{self, DeviceChange, Hardware, NetworkBacking};
use crate::error::{Error, Result};
pub use crate::objects::{MoRef, ServiceContent};
use crate::xml::{self, Element};

/// State of a vSphere task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Waiting to run.
    Queued,
    /// Running.
    Running,
    /// Finished successfully.
    Success,
    /// Finished with an error.
    Error,
}

/// What `Task.info` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    /// The task.
    pub task: MoRef,
    /// Its state.
    pub state: TaskState,
    /// Percent done, when reported.
    pub progress: Option<u32>,
    /// The result when it is a managed object (the new VM of a clone).
    pub result: Option<MoRef>,
    /// Fault type and message when the task failed.
    pub error: Option<(String, String)>,
}

impl TaskInfo {
    /// Whether the task finished (either way).
    pub fn done(&self) -> bool {
        matches!(self.state, TaskState::Success | TaskState::Error)
    }

    /// `Ok(result)` on success, the task's fault on error, `Ok(None)` while it runs.
    pub fn outcome(&self) -> Result<Option<Option<MoRef>>> {
        match self.state {
            TaskState::Queued | TaskState::Running => Ok(None),
            TaskState::Success => Ok(Some(self.result.clone())),
            TaskState::Error => {
                let (fault, message) = self.error.clone().unwrap_or_default();
                Err(Error::TaskFailed {
                    task: self.task.value.clone(),
                    fault,
                    message,
                })
            }
        }
    }
}

/// Power state of a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmPowerState {
    /// Running.
    PoweredOn,
    /// Stopped.
    PoweredOff,
    /// Suspended.
    Suspended,
}

/// The VM facts a provider reads, fetched in one PropertyCollector call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmInfo {
    /// The VM.
    pub vm: MoRef,
    /// Display name.
    pub name: String,
    /// BIOS UUID (`config.uuid`): what `vsphere://` provider IDs and Nodes carry.
    pub bios_uuid: Option<String>,
    /// `config.instanceUuid`.
    pub instance_uuid: Option<String>,
    /// Whether the VM is a template.
    pub template: bool,
    /// `runtime.powerState`.
    pub power_state: Option<VmPowerState>,
    /// `config.hardware.numCPU`.
    pub num_cpu: Option<u32>,
    /// `config.hardware.numCoresPerSocket`.
    pub cores_per_socket: Option<u32>,
    /// `config.hardware.memoryMB`.
    pub memory_mb: Option<u64>,
    /// `config.extraConfig`.
    pub extra_config: BTreeMap<String, String>,
    /// `guest.ipAddress` (primary IP reported by VMware Tools).
    pub ip_address: Option<String>,
    /// Every IP of `guest.net`.
    pub guest_ips: Vec<String>,
    /// `runtime.host`.
    pub host: Option<MoRef>,
    /// Disks and NICs of `config.hardware.device`.
    pub hardware: Hardware,
    /// `config.firmware`: `bios` or `efi`.
    pub firmware: Option<String>,
    /// `config.bootOptions.efiSecureBootEnabled`.
    pub secure_boot: bool,
}

/// The properties [`Client::vm_info`] reads.
pub const VM_PROPERTIES: &[&str] = &[
    "name",
    "config.uuid",
    "config.instanceUuid",
    "config.template",
    "config.hardware.numCPU",
    "config.hardware.numCoresPerSocket",
    "config.hardware.memoryMB",
    "config.extraConfig",
    "config.hardware.device",
    "config.firmware",
    "config.bootOptions",
    "runtime.powerState",
    "runtime.host",
    "guest.ipAddress",
    "guest.net",
];

fn extra_config_of(val: &Element) -> BTreeMap<String, String> {
    val.children
        .iter()
        .filter_map(|o| {
            Some((
                o.child_text("key")?.to_owned(),
                o.child_text("value").unwrap_or("").to_owned(),
            ))
        })
        .collect()
}

fn guest_ips_of(val: &Element) -> Vec<String> {
    let mut out = Vec::new();
    for nic in &val.children {
        for ip in nic.children_named("ipAddress") {
            let ip = ip.text.trim();
            if !ip.is_empty() && !out.iter().any(|o| o == ip) {
                out.push(ip.to_owned());
            }
        }
    }
    out
}

impl VmInfo {
    fn from_props(vm: MoRef, props: &BTreeMap<String, Element>) -> Self {
        let text = |k: &str| {
            props
                .get(k)
                .map(|e| e.text.trim().to_owned())
                .filter(|t| !t.is_empty())
        };
        let num = |k: &str| text(k).and_then(|t| t.parse::<u64>().ok());
        let small = |k: &str| num(k).and_then(|n| u32::try_from(n).ok());
        Self {
            name: text("name").unwrap_or_default(),
            bios_uuid: text("config.uuid"),
            instance_uuid: text("config.instanceUuid"),
            template: text("config.template").as_deref() == Some("true"),
            power_state: text("runtime.powerState").and_then(|p| match p.as_str() {
                "poweredOn" => Some(VmPowerState::PoweredOn),
                "poweredOff" => Some(VmPowerState::PoweredOff),
                "suspended" => Some(VmPowerState::Suspended),
                _ => None,
            }),
            num_cpu: small("config.hardware.numCPU"),
            cores_per_socket: small("config.hardware.numCoresPerSocket"),
            memory_mb: num("config.hardware.memoryMB"),
            extra_config: props
                .get("config.extraConfig")
                .map(extra_config_of)
                .unwrap_or_default(),
            ip_address: text("guest.ipAddress"),
            guest_ips: props.get("guest.net").map(guest_ips_of).unwrap_or_default(),
            host: props.get("runtime.host").and_then(MoRef::from_xml),
            hardware: props
                .get("config.hardware.device")
                .map(device::hardware_of)
                .unwrap_or_default(),
            firmware: text("config.firmware"),
            secure_boot: props
                .get("config.bootOptions")
                .and_then(|o| o.child_text("efiSecureBootEnabled"))
                .is_some_and(|t| t.trim() == "true"),
            vm,
        }
    }
}

/// One `extraConfig` entry.
pub type OptionValue = (String, String);

/// CPU, memory, device and extraConfig changes (a `VirtualMachineConfigSpec` subset).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigSpec {
    /// `annotation` (the VM's notes).
    pub annotation: Option<String>,
    /// Total vCPUs.
    pub num_cpus: Option<u32>,
    /// Cores per socket.
    pub cores_per_socket: Option<u32>,
    /// Memory in MiB.
    pub memory_mb: Option<u64>,
    /// Device changes (disk growth, NICs).
    pub device_change: Vec<DeviceChange>,
    /// `extraConfig` entries to set (an empty value removes the key).
    pub extra_config: Vec<OptionValue>,
    /// `bootOptions.efiSecureBootEnabled`.
    pub secure_boot: Option<bool>,
    /// `firmware`: `bios` or `efi`.
    pub firmware: Option<String>,
    /// `memoryReservationLockedToMax` (PCI passthrough needs all memory reserved).
    pub memory_reservation_locked_to_max: Option<bool>,
}

impl ConfigSpec {
    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The spec's XML children, in the schema's sequence order.
    pub fn to_xml(&self, tag: &str) -> String {
        let mut s = format!("<{tag}>");
        if let Some(a) = &self.annotation {
            let _ = write!(s, "<annotation>{}</annotation>", xml::escape(a));
        }
        if let Some(n) = self.num_cpus {
            let _ = write!(s, "<numCPUs>{n}</numCPUs>");
        }
        if let Some(n) = self.cores_per_socket {
            let _ = write!(s, "<numCoresPerSocket>{n}</numCoresPerSocket>");
        }
        if let Some(m) = self.memory_mb {
            let _ = write!(s, "<memoryMB>{m}</memoryMB>");
        }
        for d in &self.device_change {
            s.push_str(&d.to_xml());
        }
        for (k, v) in &self.extra_config {
            let _ = write!(
                s,
                "<extraConfig xsi:type=\"OptionValue\"><key>{}</key><value xsi:type=\"xsd:string\">{}</value></extraConfig>",
                xml::escape(k),
                xml::escape(v)
            );
        }
        // The schema's sequence: extraConfig, swapPlacement, bootOptions, …, firmware.
        if let Some(on) = self.secure_boot {
            let _ = write!(
                s,
                "<bootOptions><efiSecureBootEnabled>{on}</efiSecureBootEnabled></bootOptions>"
            );
        }
        if let Some(f) = &self.firmware {
            let _ = write!(s, "<firmware>{}</firmware>", xml::escape(f));
        }
        if let Some(locked) = self.memory_reservation_locked_to_max {
            let _ = write!(
                s,
                "<memoryReservationLockedToMax>{locked}</memoryReservationLockedToMax>"
            );
        }
        let _ = write!(s, "</{tag}>");
        s
    }
}

/// Where and how to clone (a `VirtualMachineCloneSpec` subset).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneSpec {
    /// Folder of the new VM.
    pub folder: MoRef,
    /// Name of the new VM.
    pub name: String,
    /// Resource pool.
    pub pool: MoRef,
    /// Datastore; unset: the source's.
    pub datastore: Option<MoRef>,
    /// Host; unset: vCenter (DRS) chooses.
    pub host: Option<MoRef>,
    /// Linked clone from this snapshot of the source (`diskMoveType=createNewChildDiskBacking`).
    pub linked_snapshot: Option<MoRef>,
    /// Config applied during the clone (extraConfig; vcsim ignores CPU/memory here).
    pub config: ConfigSpec,
    /// Power on when done.
    pub power_on: bool,
}

impl CloneSpec {
    fn to_xml(&self) -> String {
        let mut s = String::from("<spec><location>");
        if let Some(ds) = &self.datastore {
            s.push_str(&ds.to_xml("datastore"));
        }
        if self.linked_snapshot.is_some() {
            s.push_str("<diskMoveType>createNewChildDiskBacking</diskMoveType>");
        }
        s.push_str(&self.pool.to_xml("pool"));
        if let Some(h) = &self.host {
            s.push_str(&h.to_xml("host"));
        }
        s.push_str("</location><template>false</template>");
        if !self.config.is_empty() {
            s.push_str(&self.config.to_xml("config"));
        }
        let _ = write!(s, "<powerOn>{}</powerOn>", self.power_on);
        if let Some(snap) = &self.linked_snapshot {
            s.push_str(&snap.to_xml("snapshot"));
        }
        s.push_str("</spec>");
        s
    }
}

fn decode(method: &str, message: impl Into<String>) -> Error {
    Error::Decode {
        method: method.into(),
        message: message.into(),
    }
}

fn returned_moref(method: &str, resp: &Element) -> Result<MoRef> {
    resp.child("returnval")
        .and_then(MoRef::from_xml)
        .ok_or_else(|| decode(method, "no managed object reference returned"))
}

/// Properties of one object: property path → `<val>` element.
pub type Props = BTreeMap<String, Element>;

impl Client {
    /// `about.fullName` and `apiVersion` of the server.
    pub async fn about(&self) -> Result<(String, String)> {
        let c = self.service_content().await?;
        Ok((c.full_name.clone(), c.api_version.clone()))
    }

    /// `SearchIndex.FindByInventoryPath`: `/dc/vm/folder/name`, `dc/host/cluster/Resources`, …
    pub async fn find_by_inventory_path(&self, path: &str) -> Result<Option<MoRef>> {
        let si = self.service_content().await?.search_index.clone();
        let body = format!(
            "{}<inventoryPath>{}</inventoryPath>",
            si.to_xml("_this"),
            xml::escape(path.trim_start_matches('/'))
        );
        let resp = self.call("FindByInventoryPath", &body).await?;
        Ok(resp.child("returnval").and_then(MoRef::from_xml))
    }

    /// `SearchIndex.FindByUuid` for a VM by BIOS UUID (in `datacenter`, or everywhere).
    pub async fn find_vm_by_bios_uuid(
        &self,
        datacenter: Option<&MoRef>,
        uuid: &str,
    ) -> Result<Option<MoRef>> {
        let si = self.service_content().await?.search_index.clone();
        let dc = datacenter.map(|d| d.to_xml("datacenter")).unwrap_or_default();
        let body = format!(
            "{}{dc}<uuid>{}</uuid><vmSearch>true</vmSearch><instanceUuid>false</instanceUuid>",
            si.to_xml("_this"),
            xml::escape(uuid)
        );
        let resp = self.call("FindByUuid", &body).await?;
        Ok(resp.child("returnval").and_then(MoRef::from_xml))
    }

    /// The NIC backing for a network found by inventory path (`Network` → standard port group,
    /// `DistributedVirtualPortgroup` → its key and switch UUID). `None` if the object is gone;
    /// an opaque or unknown network type is an error.
    pub async fn network_backing(&self, network: &MoRef) -> Result<Option<NetworkBacking>> {
        match network.kind.as_str() {
            "Network" => {
                Ok(self
                    .property_text(network, "name")
                    .await?
                    .map(|name| NetworkBacking::Standard {
                        name,
                        network: Some(network.clone()),
                    }))
            }
            "DistributedVirtualPortgroup" => {
                let Some(props) = self
                    .properties(network, &["key", "config.distributedVirtualSwitch"])
                    .await?
                else {
                    return Ok(None);
                };
                let key = props.get("key").map(|e| e.text.trim().to_owned());
                let dvs = props
                    .get("config.distributedVirtualSwitch")
                    .and_then(MoRef::from_xml);
                let (Some(portgroup_key), Some(dvs)) = (key, dvs) else {
                    return Err(decode(
                        "RetrievePropertiesEx",
                        format!("port group {network} without key or switch"),
                    ));
                };
                let switch_uuid = self
                    .property_text(&dvs, "uuid")
                    .await?
                    .ok_or_else(|| decode("RetrievePropertiesEx", format!("switch {dvs} without uuid")))?;
                Ok(Some(NetworkBacking::Distributed {
                    switch_uuid,
                    portgroup_key,
                }))
            }
            other => Err(Error::Config(format!(
                "network {network}: {other} networks are not supported (use a standard or distributed port group)"
            ))),
        }
    }

    /// `PropertyCollector.RetrievePropertiesEx` for one object. A property that is unset is
    /// absent from the map. `ManagedObjectNotFound` becomes `Ok(None)`.
    pub async fn properties(&self, obj: &MoRef, paths: &[&str]) -> Result<Option<Props>> {
        let pc = self.service_content().await?.property_collector.clone();
        let mut body = pc.to_xml("_this");
        let _ = write!(body, "<specSet><propSet><type>{}</type>", xml::escape(&obj.kind));
        for p in paths {
            let _ = write!(body, "<pathSet>{}</pathSet>", xml::escape(p));
        }
        let _ = write!(
            body,
            "</propSet><objectSet>{}<skip>false</skip></objectSet></specSet><options></options>",
            obj.to_xml("obj")
        );
        let resp = match self.call("RetrievePropertiesEx", &body).await {
            Ok(r) => r,
            Err(e) if e.fault() == Some("ManagedObjectNotFound") => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(objects) = resp.path(&["returnval", "objects"]) else {
            return Ok(None);
        };
        if objects
            .children_named("missingSet")
            .any(|m| m.path(&["fault", "fault"]).and_then(Element::xsi_type) == Some("ManagedObjectNotFound"))
        {
            return Ok(None);
        }
        Ok(Some(props_of(objects)))
    }

    /// One property as text (`None` when unset or the object is gone).
    pub async fn property_text(&self, obj: &MoRef, path: &str) -> Result<Option<String>> {
        Ok(self
            .properties(obj, &[path])
            .await?
            .and_then(|mut p| p.remove(path))
            .map(|e| e.text.trim().to_owned()))
    }

    /// The VM facts of [`VmInfo`]; `None` if the VM does not exist.
    pub async fn vm_info(&self, vm: &MoRef) -> Result<Option<VmInfo>> {
        Ok(self
            .properties(vm, VM_PROPERTIES)
            .await?
            .map(|p| VmInfo::from_props(vm.clone(), &p)))
    }

    /// `Task.info`.
    pub async fn task_info(&self, task: &MoRef) -> Result<Option<TaskInfo>> {
        let Some(props) = self.properties(task, &["info"]).await? else {
            return Ok(None);
        };
        let info = props
            .get("info")
            .ok_or_else(|| decode("RetrievePropertiesEx", "task without info"))?;
        let state = match info.child_text("state").map(str::trim) {
            Some("queued") => TaskState::Queued,
            Some("running") => TaskState::Running,
            Some("success") => TaskState::Success,
            Some("error") => TaskState::Error,
            other => return Err(decode("RetrievePropertiesEx", format!("task state {other:?}"))),
        };
        let error = info.child("error").map(|e| {
            let fault = e
                .child("fault")
                .and_then(Element::xsi_type)
                .unwrap_or("SystemError")
                .to_owned();
            let message = e.child_text("localizedMessage").unwrap_or("").trim().to_owned();
            (fault, message)
        });
        Ok(Some(TaskInfo {
            task: task.clone(),
            state,
            progress: info.child_text("progress").and_then(|p| p.trim().parse().ok()),
            result: info.child("result").and_then(MoRef::from_xml),
            error,
        }))
    }

    /// Polls a task until it finishes or `timeout` passes (for tools, tests and benchmarks;
    /// controllers record the task in status and poll on requeue instead).
    pub async fn wait_task(&self, task: &MoRef, poll: Duration, timeout: Duration) -> Result<Option<MoRef>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let info = self
                .task_info(task)
                .await?
                .ok_or_else(|| decode("RetrievePropertiesEx", format!("task {task} vanished")))?;
            if let Some(result) = info.outcome()? {
                return Ok(result);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Timeout {
                    method: format!("waiting for task {}", task.value),
                    timeout,
                });
            }
            tokio::time::sleep(poll).await;
        }
    }

    async fn task_call(&self, method: &str, body: &str) -> Result<MoRef> {
        let resp = self.call(method, body).await?;
        returned_moref(method, &resp)
    }

    /// `VirtualMachine.CloneVM_Task`; returns the task.
    pub async fn clone_vm(&self, source: &MoRef, spec: &CloneSpec) -> Result<MoRef> {
        let body = format!(
            "{}{}<name>{}</name>{}",
            source.to_xml("_this"),
            spec.folder.to_xml("folder"),
            xml::escape(&spec.name),
            spec.to_xml()
        );
        self.task_call("CloneVM_Task", &body).await
    }

    /// `VirtualMachine.ReconfigVM_Task`; returns the task.
    pub async fn reconfigure(&self, vm: &MoRef, spec: &ConfigSpec) -> Result<MoRef> {
        let body = format!("{}{}", vm.to_xml("_this"), spec.to_xml("spec"));
        self.task_call("ReconfigVM_Task", &body).await
    }

    /// `VirtualMachine.PowerOnVM_Task`.
    pub async fn power_on(&self, vm: &MoRef) -> Result<MoRef> {
        self.task_call("PowerOnVM_Task", &vm.to_xml("_this")).await
    }

    /// `VirtualMachine.PowerOffVM_Task` (hard power off).
    pub async fn power_off(&self, vm: &MoRef) -> Result<MoRef> {
        self.task_call("PowerOffVM_Task", &vm.to_xml("_this")).await
    }

    /// `VirtualMachine.ShutdownGuest`: asks the guest OS to shut down through VMware Tools (no
    /// task; the VM powers off when the guest is done). Fails with `ToolsUnavailable` when the
    /// Tools are not running.
    pub async fn shutdown_guest(&self, vm: &MoRef) -> Result<()> {
        self.call("ShutdownGuest", &vm.to_xml("_this")).await.map(|_| ())
    }

    /// `ManagedEntity.Destroy_Task`.
    pub async fn destroy(&self, obj: &MoRef) -> Result<MoRef> {
        self.task_call("Destroy_Task", &obj.to_xml("_this")).await
    }

    /// `ManagedEntity.Rename_Task`.
    pub async fn rename(&self, obj: &MoRef, new_name: &str) -> Result<MoRef> {
        let body = format!(
            "{}<newName>{}</newName>",
            obj.to_xml("_this"),
            xml::escape(new_name)
        );
        self.task_call("Rename_Task", &body).await
    }

    /// `VirtualMachine.MarkAsTemplate` (the VM must be powered off).
    pub async fn mark_as_template(&self, vm: &MoRef) -> Result<()> {
        self.call("MarkAsTemplate", &vm.to_xml("_this")).await.map(|_| ())
    }

    /// The VMs whose `extraConfig[key] == value`, searched through a ContainerView of the whole
    /// inventory (the crash-adoption lookup by owner UID).
    pub async fn find_vms_by_extra_config(&self, key: &str, value: &str) -> Result<Vec<MoRef>> {
        let all = self.all_vms(&["config.extraConfig"]).await?;
        Ok(all
            .into_iter()
            .filter(|(_, props)| {
                props
                    .get("config.extraConfig")
                    .map(extra_config_of)
                    .is_some_and(|ec| ec.get(key).map(String::as_str) == Some(value))
            })
            .map(|(vm, _)| vm)
            .collect())
    }

    /// Properties of every VM in the inventory (ContainerView + RetrievePropertiesEx, paged).
    pub async fn all_vms(&self, paths: &[&str]) -> Result<Vec<(MoRef, Props)>> {
        let content = self.service_content().await?.clone();
        let body = format!(
            "{}{}<type>VirtualMachine</type><recursive>true</recursive>",
            content.view_manager.to_xml("_this"),
            content.root_folder.to_xml("container")
        );
        let view = returned_moref(
            "CreateContainerView",
            &self.call("CreateContainerView", &body).await?,
        )?;
        let result = self.collect_view(&content.property_collector, &view, paths).await;
        // Always release the view, even when collecting failed.
        let _ = self.call("DestroyView", &view.to_xml("_this")).await;
        result
    }

    async fn collect_view(&self, pc: &MoRef, view: &MoRef, paths: &[&str]) -> Result<Vec<(MoRef, Props)>> {
        let mut body = pc.to_xml("_this");
        body.push_str("<specSet><propSet><type>VirtualMachine</type>");
        for p in paths {
            let _ = write!(body, "<pathSet>{}</pathSet>", xml::escape(p));
        }
        let _ = write!(
            body,
            "</propSet><objectSet>{}<skip>true</skip><selectSet xsi:type=\"TraversalSpec\"><name>view</name>\
<type>ContainerView</type><path>view</path><skip>false</skip></selectSet></objectSet></specSet><options></options>",
            view.to_xml("obj")
        );
        let mut out = Vec::new();
        let mut resp = self.call("RetrievePropertiesEx", &body).await?;
        while let Some(rv) = resp.child("returnval") {
            for obj in rv.children_named("objects") {
                if let Some(mo) = obj.child("obj").and_then(MoRef::from_xml) {
                    out.push((mo, props_of(obj)));
                }
            }
            let Some(token) = rv.child_text("token").map(str::to_owned) else {
                break;
            };
            let body = format!("{}<token>{}</token>", pc.to_xml("_this"), xml::escape(&token));
            resp = self.call("ContinueRetrievePropertiesEx", &body).await?;
        }
        Ok(out)
    }
}

fn props_of(objects: &Element) -> Props {
    objects
        .children_named("propSet")
        .filter_map(|ps| Some((ps.child_text("name")?.to_owned(), ps.child("val")?.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clone_spec_xml_follows_the_schema_order() {
        let spec = CloneSpec {
            folder: MoRef::new("Folder", "group-v3"),
            name: "m<1>".into(),
            pool: MoRef::new("ResourcePool", "resgroup-1"),
            datastore: Some(MoRef::new("Datastore", "datastore-1")),
            host: None,
            linked_snapshot: Some(MoRef::new("VirtualMachineSnapshot", "snapshot-1")),
            config: ConfigSpec {
                extra_config: vec![("guestinfo.userdata".into(), "a&b".into())],
                ..ConfigSpec::default()
            },
            power_on: false,
        };
        let x = spec.to_xml();
        let root = xml::parse(&x).unwrap();
        let order: Vec<&str> = root.children.iter().map(Element::local_name).collect();
        assert_eq!(order, ["location", "template", "config", "powerOn", "snapshot"]);
        let loc: Vec<&str> = root
            .child("location")
            .unwrap()
            .children
            .iter()
            .map(Element::local_name)
            .collect();
        assert_eq!(loc, ["datastore", "diskMoveType", "pool"]);
        let ec = root.path(&["config", "extraConfig"]).unwrap();
        assert_eq!(ec.child_text("value"), Some("a&b"));
    }

    #[test]
    fn config_spec_xml_order_and_emptiness() {
        assert!(ConfigSpec::default().is_empty());
        let spec = ConfigSpec {
            annotation: None,
            num_cpus: Some(4),
            cores_per_socket: Some(2),
            memory_mb: Some(4096),
            device_change: vec![DeviceChange::RemoveNic {
                nic: device::VirtualNic {
                    key: 4000,
                    kind: "VirtualE1000".into(),
                    backing: NetworkBacking::Other("x".into()),
                    mac: None,
                    address_type: None,
                    controller_key: None,
                    unit_number: None,
                },
            }],
            extra_config: vec![("k".into(), "v".into())],
            secure_boot: Some(true),
            firmware: Some("efi".into()),
            memory_reservation_locked_to_max: Some(true),
        };
        let root = xml::parse(&spec.to_xml("spec")).unwrap();
        let order: Vec<&str> = root.children.iter().map(Element::local_name).collect();
        assert_eq!(
            order,
            [
                "numCPUs",
                "numCoresPerSocket",
                "memoryMB",
                "deviceChange",
                "extraConfig",
                "bootOptions",
                "firmware",
                "memoryReservationLockedToMax"
            ]
        );
    }

    #[test]
    fn reads_vm_properties() {
        let doc = r#"<objects xmlns:xsi="x"><obj type="VirtualMachine">vm-1</obj>
<propSet><name>config.uuid</name><val xsi:type="xsd:string">4221a1b2-0000</val></propSet>
<propSet><name>runtime.powerState</name><val xsi:type="VirtualMachinePowerState">poweredOn</val></propSet>
<propSet><name>config.hardware.memoryMB</name><val xsi:type="xsd:int">2048</val></propSet>
<propSet><name>config.extraConfig</name><val xsi:type="ArrayOfOptionValue">
 <OptionValue xsi:type="OptionValue"><key>guestinfo.x</key><value xsi:type="xsd:string">y</value></OptionValue>
</val></propSet>
<propSet><name>guest.net</name><val xsi:type="ArrayOfGuestNicInfo"><GuestNicInfo><network>VM Network</network>
<ipAddress>10.0.0.5</ipAddress><ipAddress>fe80::1</ipAddress></GuestNicInfo></val></propSet>
<propSet><name>runtime.host</name><val type="HostSystem" xsi:type="ManagedObjectReference">host-7</val></propSet>
</objects>"#;
        let el = xml::parse(doc).unwrap();
        let info = VmInfo::from_props(MoRef::new("VirtualMachine", "vm-1"), &props_of(&el));
        assert_eq!(info.bios_uuid.as_deref(), Some("4221a1b2-0000"));
        assert_eq!(info.power_state, Some(VmPowerState::PoweredOn));
        assert_eq!(info.memory_mb, Some(2048));
        assert_eq!(
            info.extra_config.get("guestinfo.x").map(String::as_str),
            Some("y")
        );
        assert_eq!(info.guest_ips, ["10.0.0.5", "fe80::1"]);
        assert_eq!(info.host, Some(MoRef::new("HostSystem", "host-7")));
        assert_eq!(info.num_cpu, None);
    }
}
