//! An in-memory [`Hypervisor`] double for tests of the state machines and reconcilers, until
//! (and besides) the wire-level simulator `banlieue-pve-sim`.
//!
//! It models what the provisioning logic depends on, with PVE's semantics: a clone exists at
//! once with only `lock: clone` and gets its config (new MAC, new SMBIOS uuid, description,
//! name) when its task finishes; tasks finish after a configurable number of polls; a running
//! VM cannot be deleted; uploads land as volumes; errors can be injected per operation.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use banlieue_pve_client::config::normalize_tags;
use banlieue_pve_client::{
    CloneRequest, ConfigUpdate, DownloadUrlRequest, HaResource, HaResourceSettings, HaRule, PendingConfig,
    SizeChange, TaskOutcome, Upid, VmConfig, vm_sid,
};

use crate::hypervisor::{Guest, Hypervisor, Inventory, NodeLoad, PveError, RunState};

/// Hands out one shared [`FakePve`] whatever the settings (tests).
#[derive(Clone, Default)]
pub struct FakeConnector(pub FakePve);

impl crate::credentials::Connector for FakeConnector {
    type Hv = FakePve;

    fn connect(&self, _key: &str, _connection: &crate::credentials::Connection) -> Result<FakePve, String> {
        Ok(self.0.clone())
    }
}

/// A VM of the fake.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeVm {
    /// Node.
    pub node: String,
    /// Config, as `GET …/config` would return it.
    pub config: BTreeMap<String, String>,
    /// Running.
    pub running: bool,
    /// Addresses the guest agent reports once running (`None` = agent never answers).
    pub agent_ips: Option<Vec<IpAddr>>,
    /// cloud-init's report the guest agent reads once running (`None`: not written yet).
    pub cloud_init: Option<String>,
}

/// The report of a guest whose cloud-init finished without errors.
pub const CLOUD_INIT_DONE: &str = r#"{"v1": {"datasource": "DataSourceNoCloud", "errors": []}}"#;

#[derive(Debug)]
enum Effect {
    None,
    Clone {
        vmid: u32,
        source: BTreeMap<String, String>,
        request: CloneRequest,
    },
    Start(u32),
    Stop(u32),
    Delete(u32),
    Upload {
        node: String,
        volid: String,
        data: Vec<u8>,
    },
}

#[derive(Debug)]
struct Task {
    polls_left: u32,
    failure: Option<String>,
    effect: Option<Effect>,
}

#[derive(Debug, Default)]
struct State {
    /// Tells fakes apart (see [`Hypervisor::endpoint`]).
    id: u64,
    nodes: Vec<NodeLoad>,
    vms: BTreeMap<u32, FakeVm>,
    volumes: BTreeMap<(String, String), Vec<u8>>,
    tasks: HashMap<String, Task>,
    counter: u32,
    task_polls: u32,
    failures: HashMap<&'static str, Vec<PveError>>,
    task_failures: HashMap<&'static str, String>,
    calls: Vec<String>,
    uploads: Vec<(String, String, Vec<u8>)>,
    pending: Vec<(u32, String)>,
    yielding: bool,
    local_storages: Vec<String>,
    /// VMIDs the token lacks VM.Audit on: left out of listings, 403 when read.
    hidden: std::collections::BTreeSet<u32>,
    /// VMIDs held by LXC containers: not QEMU guests, but not free either.
    containers: std::collections::BTreeSet<u32>,
    /// Keys a running VM keeps pending until it restarts (see [`FakePve::keep_pending`]).
    keeps_pending: Vec<String>,
    /// Per VM, the keys pending until its next start.
    awaiting_restart: BTreeMap<u32, std::collections::BTreeSet<String>>,
    /// HA resources by VMID.
    ha_resources: BTreeMap<u32, HaResource>,
    /// HA rules by name.
    ha_rules: BTreeMap<String, HaRule>,
    /// Bumped on every change of the HA rules (their digest).
    ha_rules_version: u32,
}

/// The fake Proxmox VE cluster. Cheap to clone (shared state).
#[derive(Clone, Debug, Default)]
pub struct FakePve(Arc<Mutex<State>>);

/// A PVE API error as the client would report it.
pub fn api_error(status: u16, message: &str) -> PveError {
    PveError::Api {
        method: http::Method::POST,
        path: "/fake".into(),
        status,
        message: message.into(),
        errors: BTreeMap::new(),
    }
}

fn not_found(what: &str) -> PveError {
    api_error(500, &format!("{what} does not exist"))
}

impl FakePve {
    /// Nodes `pve1..pve{n}` online (pve1 with the least free memory), and template 9000
    /// `ubuntu-2404-template` on pve1 like the simulator's default.
    pub fn new(nodes: usize) -> Self {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let fake = Self::default();
        {
            let mut s = fake.lock();
            s.id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            s.nodes = (1..=nodes)
                .map(|i| NodeLoad {
                    name: format!("pve{i}"),
                    online: true,
                    free_memory: (i as u64) << 30,
                    cpus: Some(16),
                    memory_mib: Some(64 << 10),
                })
                .collect();
            let config = [
                ("name", "ubuntu-2404-template"),
                ("template", "1"),
                ("cores", "1"),
                ("memory", "2048"),
                ("scsi0", "local-lvm:base-9000-disk-0,size=8G"),
                ("net0", "virtio=BC:24:11:00:90:00,bridge=vmbr0"),
                ("ide2", "local-lvm:vm-9000-cloudinit,media=cdrom"),
                ("agent", "1"),
                ("tags", "template;ubuntu"),
                ("smbios1", "uuid=00000000-0000-0000-0000-000000009000"),
            ];
            s.vms.insert(
                9000,
                FakeVm {
                    node: "pve1".into(),
                    config: config
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    running: false,
                    agent_ips: None,
                    cloud_init: None,
                },
            );
        }
        fake
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cold config changes (cores, sockets, memory) written while the VM ran: real PVE would
    /// only apply them at the next boot. `(vmid, key)`.
    pub fn pending_changes(&self) -> Vec<(u32, String)> {
        self.lock().pending.clone()
    }

    /// Declares `storages` not shared between nodes (by default every storage is shared).
    pub fn set_local_storages(&self, storages: &[&str]) {
        self.lock().local_storages = storages.iter().map(|s| (*s).to_owned()).collect();
    }

    /// Tasks report `running` this many times before finishing (default 0: done at first poll).
    pub fn set_task_polls(&self, polls: u32) {
        self.lock().task_polls = polls;
    }

    /// The next call of `op` (method name of [`Hypervisor`]) fails with `err`.
    pub fn fail_next(&self, op: &'static str, err: PveError) {
        self.lock().failures.entry(op).or_default().push(err);
    }

    /// The next task started by `op` fails inside the worker with `exitstatus`.
    pub fn fail_next_task(&self, op: &'static str, exitstatus: &str) {
        self.lock().task_failures.insert(op, exitstatus.to_owned());
    }

    /// Changes of `keys` written while a VM runs stay pending until it starts again (as PVE
    /// does for a NIC change on a VM without network hotplug). By default every change applies.
    pub fn keep_pending(&self, keys: &[&str]) {
        self.lock().keeps_pending = keys.iter().map(|k| (*k).to_owned()).collect();
    }

    /// An LXC container holds `vmid` (left out of the QEMU guests, but the VMID is taken).
    pub fn add_container(&self, vmid: u32) {
        self.lock().containers.insert(vmid);
    }

    /// The token loses VM.Audit on `vmid`: Proxmox leaves it out of `/cluster/resources` and
    /// refuses to show its config (403).
    pub fn hide_from_listings(&self, vmid: u32) {
        self.lock().hidden.insert(vmid);
    }

    /// Adds a VM (e.g. one not created by banlieue).
    pub fn insert_vm(&self, vmid: u32, vm: FakeVm) {
        self.lock().vms.insert(vmid, vm);
    }

    /// Removes a VM behind the controller's back.
    pub fn remove_vm(&self, vmid: u32) -> Option<FakeVm> {
        self.lock().vms.remove(&vmid)
    }

    /// All VMs except templates.
    pub fn vms(&self) -> BTreeMap<u32, FakeVm> {
        self.lock()
            .vms
            .iter()
            .filter(|(_, vm)| vm.config.get("template").map(String::as_str) != Some("1"))
            .map(|(k, v)| (*k, v.clone()))
            .collect()
    }

    /// A VM by VMID.
    pub fn vm(&self, vmid: u32) -> Option<FakeVm> {
        self.lock().vms.get(&vmid).cloned()
    }

    /// The volumes, keyed by `(node, volid)`.
    pub fn volumes(&self) -> BTreeMap<(String, String), Vec<u8>> {
        self.lock().volumes.clone()
    }

    /// Every completed upload, `(node, volid, bytes)`, including since-deleted volumes.
    pub fn uploads(&self) -> Vec<(String, String, Vec<u8>)> {
        self.lock().uploads.clone()
    }

    /// The Hypervisor calls made so far (method names, in order).
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// Adds an HA rule of `kind` (`node-affinity`, `resource-affinity`) applying to `resources`.
    pub fn add_ha_rule(&self, rule: &str, kind: &str, resources: &[&str]) {
        let mut s = self.lock();
        s.ha_rules_version += 1;
        let digest = Some(s.ha_rules_version.to_string());
        s.ha_rules.insert(
            rule.to_owned(),
            HaRule {
                rule: rule.to_owned(),
                kind: kind.to_owned(),
                resources: Some(resources.join(",")),
                digest: None,
            },
        );
        for r in s.ha_rules.values_mut() {
            r.digest = digest.clone();
        }
    }

    /// The HA rule `rule`.
    pub fn ha_rule_now(&self, rule: &str) -> Option<HaRule> {
        self.lock().ha_rules.get(rule).cloned()
    }

    /// The HA resource of `vmid`.
    pub fn ha_resource_now(&self, vmid: u32) -> Option<HaResource> {
        self.lock().ha_resources.get(&vmid).cloned()
    }

    /// Sets what the guest agent of `vmid` reports.
    pub fn set_agent_ips(&self, vmid: u32, ips: Option<Vec<IpAddr>>) {
        if let Some(vm) = self.lock().vms.get_mut(&vmid) {
            vm.agent_ips = ips;
        }
    }

    /// Sets cloud-init's report in the guest of `vmid` (`None`: not written yet).
    pub fn set_cloud_init(&self, vmid: u32, report: Option<&str>) {
        if let Some(vm) = self.lock().vms.get_mut(&vmid) {
            vm.cloud_init = report.map(str::to_owned);
        }
    }

    /// Finishes every running task at once (applying its effect).
    pub fn finish_all_tasks(&self) {
        let mut s = self.lock();
        let ids: Vec<String> = s.tasks.keys().cloned().collect();
        for id in ids {
            if let Some(task) = s.tasks.get_mut(&id) {
                task.polls_left = 0;
            }
            finish(&mut s, &id);
        }
    }

    /// Makes VMID calls yield to the runtime first, like a network round-trip would, so that
    /// concurrent callers interleave.
    pub fn set_yielding(&self, yielding: bool) {
        self.lock().yielding = yielding;
    }

    async fn round_trip(&self) {
        let yielding = self.lock().yielding;
        if yielding {
            tokio::task::yield_now().await;
        }
    }

    fn enter(&self, op: &'static str) -> Result<MutexGuard<'_, State>, PveError> {
        let mut s = self.lock();
        s.calls.push(op.to_owned());
        if let Some(list) = s.failures.get_mut(op)
            && !list.is_empty()
        {
            return Err(list.remove(0));
        }
        Ok(s)
    }
}

/// Removes `vmid` from HA and from its rules, deleting a rule left without resources (PVE's
/// `purge`).
fn remove_ha_resource(s: &mut State, vmid: u32) {
    if s.ha_resources.remove(&vmid).is_none() {
        return;
    }
    let sid = vm_sid(vmid);
    s.ha_rules_version += 1;
    let digest = Some(s.ha_rules_version.to_string());
    s.ha_rules.retain(|_, rule| {
        let left = rule
            .resource_ids()
            .into_iter()
            .filter(|r| *r != sid)
            .collect::<Vec<_>>()
            .join(",");
        let keep = !left.is_empty();
        rule.resources = Some(left);
        rule.digest = digest.clone();
        keep
    });
}

fn new_task(s: &mut State, op: &'static str, node: &str, kind: &str, id: &str, effect: Effect) -> Upid {
    s.counter += 1;
    let raw = format!(
        "UPID:{node}:{:08X}:{:08X}:{:08X}:{kind}:{id}:root@pam!banlieue:",
        s.counter, s.counter, s.counter
    );
    let failure = s.task_failures.remove(op);
    let polls_left = s.task_polls;
    s.tasks.insert(
        raw.clone(),
        Task {
            polls_left,
            failure,
            effect: Some(effect),
        },
    );
    raw.parse().expect("fake UPIDs are valid")
}

fn finish(s: &mut State, upid: &str) {
    let Some(task) = s.tasks.get_mut(upid) else { return };
    let Some(effect) = task.effect.take() else { return };
    let failed = task.failure.is_some();
    match effect {
        Effect::Clone {
            vmid,
            source,
            request,
        } => {
            if failed {
                s.vms.remove(&vmid);
                return;
            }
            let mut config = source;
            config.remove("template");
            config.remove("lock");
            for (key, value) in config.iter_mut() {
                if key.strip_prefix("net").is_some_and(|r| r.parse::<u8>().is_ok()) {
                    let tail = value.split_once(',').map_or("", |(_, t)| t).to_owned();
                    let model = value.split(['=', ',']).next().unwrap_or("virtio").to_owned();
                    *value = format!(
                        "{model}=BC:24:11:{:02X}:{:02X}:{:02X},{tail}",
                        vmid >> 16 & 0xff,
                        vmid >> 8 & 0xff,
                        vmid & 0xff
                    );
                }
            }
            config.insert(
                "smbios1".into(),
                format!("uuid=0000AAAA-0000-0000-0000-{vmid:012}"),
            );
            if let Some(name) = request.name {
                config.insert("name".into(), name);
            }
            if let Some(d) = request.description {
                config.insert("description".into(), d);
            }
            if let Some(vm) = s.vms.get_mut(&vmid) {
                vm.config = config;
                if let Some(target) = request.target {
                    vm.node = target;
                }
            }
        }
        _ if failed => {}
        Effect::Start(vmid) => {
            if let Some(vm) = s.vms.get_mut(&vmid) {
                vm.running = true;
            }
            s.awaiting_restart.remove(&vmid);
        }
        Effect::Stop(vmid) => {
            if let Some(vm) = s.vms.get_mut(&vmid) {
                vm.running = false;
            }
        }
        Effect::Delete(vmid) => {
            // Destroyed with `purge`: out of HA and its rules.
            remove_ha_resource(s, vmid);
            s.vms.remove(&vmid);
        }
        Effect::Upload { node, volid, data } => {
            s.uploads.push((node.clone(), volid.clone(), data.clone()));
            s.volumes.insert((node, volid), data);
        }
        Effect::None => {}
    }
}

fn vm_on<'a>(s: &'a mut State, node: &str, vmid: u32) -> Result<&'a mut FakeVm, PveError> {
    s.vms.get_mut(&vmid).filter(|vm| vm.node == node).ok_or_else(|| {
        not_found(&format!(
            "Configuration file 'nodes/{node}/qemu-server/{vmid}.conf'"
        ))
    })
}

fn apply_update(vm: &mut FakeVm, update: &ConfigUpdate) -> Result<(), PveError> {
    for (k, v) in &update.set {
        let v = if k == "tags" {
            normalize_tags(v)
                .map_err(|e| api_error(400, &e.to_string()))?
                .join(";")
        } else {
            v.clone()
        };
        vm.config.insert(k.clone(), v);
    }
    for k in &update.delete {
        vm.config.remove(k);
    }
    Ok(())
}

/// A config change as PVE applies it: refused while the VM is locked; on a running VM, the
/// keys PVE keeps pending until a restart are recorded as such.
fn apply_config(s: &mut State, node: &str, vmid: u32, update: &ConfigUpdate) -> Result<(), PveError> {
    let vm = vm_on(s, node, vmid)?;
    if let Some(lock) = vm.config.get("lock") {
        return Err(api_error(500, &format!("VM is locked ({lock})")));
    }
    let running = vm.running;
    apply_update(vm, update)?;
    if running {
        let kept: Vec<String> = update
            .set
            .keys()
            .chain(update.delete.iter())
            .filter(|k| s.keeps_pending.contains(k))
            .cloned()
            .collect();
        s.awaiting_restart.entry(vmid).or_default().extend(kept);
        // Real PVE (without CPU/memory hotplug) only records these as pending changes.
        for key in ["cores", "sockets", "memory"] {
            if update.set.contains_key(key) {
                s.pending.push((vmid, key.to_owned()));
            }
        }
    }
    Ok(())
}

impl Hypervisor for FakePve {
    fn endpoint(&self) -> String {
        format!("fake-{}", self.lock().id)
    }

    async fn inventory(&self) -> Result<Inventory, PveError> {
        let nodes = self.nodes().await?;
        let guests = self.guests().await?;
        let local = self.enter("local_storages")?.local_storages.clone();
        let local_storages = nodes.iter().map(|n| (n.name.clone(), local.clone())).collect();
        Ok(Inventory {
            nodes,
            guests,
            local_storages,
        })
    }

    async fn version(&self) -> Result<String, PveError> {
        let _calls = self.enter("version")?;
        Ok("9.1.2".into())
    }

    async fn nodes(&self) -> Result<Vec<NodeLoad>, PveError> {
        Ok(self.enter("nodes")?.nodes.clone())
    }

    async fn guests(&self) -> Result<Vec<Guest>, PveError> {
        let s = self.enter("guests")?;
        Ok(s.vms
            .iter()
            .filter(|(vmid, _)| !s.hidden.contains(vmid))
            .map(|(vmid, vm)| Guest {
                node: vm.node.clone(),
                vmid: *vmid,
                name: vm.config.get("name").cloned(),
                template: vm.config.get("template").map(String::as_str) == Some("1"),
                tags: vm
                    .config
                    .get("tags")
                    .and_then(|t| normalize_tags(t).ok())
                    .unwrap_or_default(),
                memory: vm
                    .config
                    .get("memory")
                    .and_then(|m| m.parse::<u64>().ok())
                    .map_or(0, |mib| mib << 20),
                running: vm.running,
                reported: true,
            })
            .collect())
    }

    async fn next_vmid(&self) -> Result<u32, PveError> {
        self.round_trip().await;
        let s = self.enter("next_vmid")?;
        Ok((100..).find(|id| !s.vms.contains_key(id)).unwrap_or(100))
    }

    async fn vmid_is_free(&self, vmid: u32) -> Result<bool, PveError> {
        self.round_trip().await;
        let s = self.enter("vmid_is_free")?;
        Ok(!s.vms.contains_key(&vmid) && !s.containers.contains(&vmid))
    }

    async fn vm_config(&self, node: &str, vmid: u32) -> Result<Option<VmConfig>, PveError> {
        let mut s = self.enter("vm_config")?;
        if s.hidden.contains(&vmid) {
            return Err(api_error(
                403,
                &format!("Permission check failed (/vms/{vmid}, VM.Audit)"),
            ));
        }
        Ok(vm_on(&mut s, node, vmid)
            .ok()
            .map(|vm| VmConfig(vm.config.clone())))
    }

    async fn vm_pending(&self, node: &str, vmid: u32) -> Result<Option<PendingConfig>, PveError> {
        let mut s = self.enter("vm_pending")?;
        if s.hidden.contains(&vmid) {
            return Err(api_error(
                403,
                &format!("Permission check failed (/vms/{vmid}, VM.Audit)"),
            ));
        }
        let Ok(vm) = vm_on(&mut s, node, vmid) else {
            return Ok(None);
        };
        let config = VmConfig(vm.config.clone());
        let pending = s
            .awaiting_restart
            .get(&vmid)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default();
        Ok(Some(PendingConfig { config, pending }))
    }

    async fn clone_vm(&self, node: &str, source: u32, request: &CloneRequest) -> Result<Upid, PveError> {
        let mut s = self.enter("clone_vm")?;
        let template = vm_on(&mut s, node, source)?.config.clone();
        if s.vms.contains_key(&request.newid) {
            return Err(api_error(400, &format!("VM {} already exists", request.newid)));
        }
        if let Some(target) = &request.target
            && !s.nodes.iter().any(|n| n.name == *target)
        {
            return Err(api_error(400, &format!("no such cluster node '{target}'")));
        }
        s.vms.insert(
            request.newid,
            FakeVm {
                node: node.to_owned(),
                config: [("lock".to_owned(), "clone".to_owned())].into(),
                running: false,
                agent_ips: Some(vec![
                    "127.0.0.1".parse().expect("ip"),
                    format!("10.0.{}.{}", request.newid / 250, request.newid % 250)
                        .parse()
                        .expect("ip"),
                ]),
                cloud_init: Some(CLOUD_INIT_DONE.to_owned()),
            },
        );
        let effect = Effect::Clone {
            vmid: request.newid,
            source: template,
            request: request.clone(),
        };
        Ok(new_task(
            &mut s,
            "clone_vm",
            node,
            "qmclone",
            &source.to_string(),
            effect,
        ))
    }

    async fn task(&self, upid: &Upid) -> Result<TaskOutcome, PveError> {
        let mut s = self.enter("task")?;
        let Some(task) = s.tasks.get_mut(upid.as_str()) else {
            return Err(api_error(400, "no such task"));
        };
        if task.polls_left > 0 {
            task.polls_left -= 1;
            return Ok(TaskOutcome::Running);
        }
        let failure = task.failure.clone();
        finish(&mut s, upid.as_str());
        Ok(failure.map_or(TaskOutcome::Ok, TaskOutcome::Failed))
    }

    async fn update_config(
        &self,
        node: &str,
        vmid: u32,
        update: &ConfigUpdate,
    ) -> Result<Option<Upid>, PveError> {
        let mut s = self.enter("update_config")?;
        apply_config(&mut s, node, vmid, update)?;
        Ok(Some(new_task(
            &mut s,
            "update_config",
            node,
            "qmconfig",
            &vmid.to_string(),
            Effect::None,
        )))
    }

    async fn set_config(&self, node: &str, vmid: u32, update: &ConfigUpdate) -> Result<(), PveError> {
        let mut s = self.enter("set_config")?;
        apply_config(&mut s, node, vmid, update)
    }

    async fn resize_disk(
        &self,
        node: &str,
        vmid: u32,
        disk: &str,
        size: SizeChange,
    ) -> Result<Option<Upid>, PveError> {
        let mut s = self.enter("resize_disk")?;
        let vm = vm_on(&mut s, node, vmid)?;
        let value = vm
            .config
            .get(disk)
            .cloned()
            .ok_or_else(|| api_error(400, &format!("disk '{disk}' does not exist")))?;
        let SizeChange::To(size) = size else {
            return Err(api_error(400, "fake supports absolute sizes only"));
        };
        let base = value.split(",size=").next().unwrap_or(&value).to_owned();
        vm.config.insert(disk.to_owned(), format!("{base},size={size}"));
        Ok(Some(new_task(
            &mut s,
            "resize_disk",
            node,
            "resize",
            &vmid.to_string(),
            Effect::None,
        )))
    }

    async fn upload_iso(
        &self,
        node: &str,
        storage: &str,
        file_name: &str,
        data: Vec<u8>,
    ) -> Result<Upid, PveError> {
        let mut s = self.enter("upload_iso")?;
        let effect = Effect::Upload {
            node: node.to_owned(),
            volid: format!("{storage}:iso/{file_name}"),
            data,
        };
        Ok(new_task(&mut s, "upload_iso", node, "imgcopy", "", effect))
    }

    async fn has_volume(&self, node: &str, _storage: &str, volid: &str) -> Result<bool, PveError> {
        let s = self.enter("has_volume")?;
        Ok(s.volumes.contains_key(&(node.to_owned(), volid.to_owned())))
    }

    // Images from a URL are exercised on the wire-level simulator, which downloads them.
    async fn download_url(
        &self,
        _node: &str,
        _storage: &str,
        _request: &DownloadUrlRequest,
    ) -> Result<Upid, PveError> {
        let _s = self.enter("download_url")?;
        Err(api_error(
            501,
            "download-url is not modelled by the fake (use banlieue-pve-sim)",
        ))
    }

    async fn create_vm(&self, _node: &str, _vmid: u32, _config: &ConfigUpdate) -> Result<Upid, PveError> {
        let _s = self.enter("create_vm")?;
        Err(api_error(
            501,
            "VM creation is not modelled by the fake (use banlieue-pve-sim)",
        ))
    }

    async fn make_template(&self, _node: &str, _vmid: u32) -> Result<Upid, PveError> {
        let _s = self.enter("make_template")?;
        Err(api_error(
            501,
            "template conversion is not modelled by the fake (use banlieue-pve-sim)",
        ))
    }

    async fn delete_volume(&self, node: &str, volid: &str) -> Result<Option<Upid>, PveError> {
        let mut s = self.enter("delete_volume")?;
        if s.volumes.remove(&(node.to_owned(), volid.to_owned())).is_none() {
            return Err(not_found(&format!("volume '{volid}'")));
        }
        Ok(None)
    }

    async fn start_vm(&self, node: &str, vmid: u32) -> Result<Upid, PveError> {
        let mut s = self.enter("start_vm")?;
        vm_on(&mut s, node, vmid)?;
        Ok(new_task(
            &mut s,
            "start_vm",
            node,
            "qmstart",
            &vmid.to_string(),
            Effect::Start(vmid),
        ))
    }

    async fn stop_vm(&self, node: &str, vmid: u32) -> Result<Upid, PveError> {
        let mut s = self.enter("stop_vm")?;
        vm_on(&mut s, node, vmid)?;
        Ok(new_task(
            &mut s,
            "stop_vm",
            node,
            "qmstop",
            &vmid.to_string(),
            Effect::Stop(vmid),
        ))
    }

    async fn shutdown_vm(&self, node: &str, vmid: u32, _timeout_secs: u32) -> Result<Upid, PveError> {
        let mut s = self.enter("shutdown_vm")?;
        vm_on(&mut s, node, vmid)?;
        Ok(new_task(
            &mut s,
            "shutdown_vm",
            node,
            "qmshutdown",
            &vmid.to_string(),
            Effect::Stop(vmid),
        ))
    }

    async fn delete_vm(&self, node: &str, vmid: u32) -> Result<Upid, PveError> {
        let mut s = self.enter("delete_vm")?;
        if vm_on(&mut s, node, vmid)?.running {
            return Err(api_error(500, &format!("VM {vmid} is running - destroy failed")));
        }
        Ok(new_task(
            &mut s,
            "delete_vm",
            node,
            "qmdestroy",
            &vmid.to_string(),
            Effect::Delete(vmid),
        ))
    }

    async fn guest_addresses(&self, node: &str, vmid: u32) -> Result<Option<Vec<IpAddr>>, PveError> {
        let mut s = self.enter("guest_addresses")?;
        let vm = vm_on(&mut s, node, vmid)?;
        if !vm.running {
            return Err(api_error(500, "VM is not running"));
        }
        Ok(vm.agent_ips.clone())
    }

    async fn cloud_init_result(&self, node: &str, vmid: u32) -> Result<Option<String>, PveError> {
        let mut s = self.enter("cloud_init_result")?;
        let vm = vm_on(&mut s, node, vmid)?;
        if !vm.running {
            return Err(api_error(500, "VM is not running"));
        }
        Ok(vm.cloud_init.clone())
    }

    async fn vm_run_state(&self, node: &str, vmid: u32) -> Result<Option<RunState>, PveError> {
        let mut s = self.enter("vm_run_state")?;
        let ha_managed = s.ha_resources.contains_key(&vmid);
        Ok(vm_on(&mut s, node, vmid).ok().map(|vm| RunState {
            running: vm.running,
            ha_managed,
        }))
    }

    async fn ha_resource(&self, vmid: u32) -> Result<Option<HaResource>, PveError> {
        let s = self.enter("ha_resource")?;
        Ok(s.ha_resources.get(&vmid).cloned())
    }

    async fn create_ha_resource(&self, vmid: u32, settings: &HaResourceSettings) -> Result<(), PveError> {
        let mut s = self.enter("create_ha_resource")?;
        if s.ha_resources.contains_key(&vmid) {
            return Err(api_error(
                500,
                &format!("resource ID '{}' already defined", vm_sid(vmid)),
            ));
        }
        let resource = HaResource {
            sid: vm_sid(vmid),
            state: settings.state.clone(),
            comment: settings.comment.clone(),
            max_restart: settings.max_restart.map(u64::from),
            max_relocate: settings.max_relocate.map(u64::from),
            digest: None,
        };
        s.ha_resources.insert(vmid, resource);
        Ok(())
    }

    async fn update_ha_resource(&self, vmid: u32, settings: &HaResourceSettings) -> Result<(), PveError> {
        let mut s = self.enter("update_ha_resource")?;
        let Some(resource) = s.ha_resources.get_mut(&vmid) else {
            return Err(api_error(500, &format!("no such resource '{}'", vm_sid(vmid))));
        };
        if let Some(state) = &settings.state {
            resource.state = Some(state.clone());
        }
        if let Some(comment) = &settings.comment {
            resource.comment = Some(comment.clone());
        }
        if let Some(n) = settings.max_restart {
            resource.max_restart = Some(n.into());
        }
        if let Some(n) = settings.max_relocate {
            resource.max_relocate = Some(n.into());
        }
        Ok(())
    }

    async fn delete_ha_resource(&self, vmid: u32) -> Result<(), PveError> {
        let mut s = self.enter("delete_ha_resource")?;
        if !s.ha_resources.contains_key(&vmid) {
            return Err(api_error(500, &format!("no such resource '{}'", vm_sid(vmid))));
        }
        remove_ha_resource(&mut s, vmid);
        Ok(())
    }

    async fn ha_rule(&self, rule: &str) -> Result<Option<HaRule>, PveError> {
        let s = self.enter("ha_rule")?;
        Ok(s.ha_rules.get(rule).cloned())
    }

    async fn set_ha_rule_resources(&self, rule: &HaRule, resources: &[String]) -> Result<(), PveError> {
        let mut s = self.enter("set_ha_rule_resources")?;
        let version = s.ha_rules_version.to_string();
        let Some(current) = s.ha_rules.get_mut(&rule.rule) else {
            return Err(api_error(500, &format!("no such ha rule '{}'", rule.rule)));
        };
        if rule.digest.as_deref() != Some(version.as_str()) {
            return Err(api_error(
                500,
                "detected modified configuration - file changed by other user? Try again.",
            ));
        }
        current.resources = Some(resources.join(","));
        s.ha_rules_version += 1;
        let digest = Some(s.ha_rules_version.to_string());
        for r in s.ha_rules.values_mut() {
            r.digest = digest.clone();
        }
        Ok(())
    }
}
